//! An HTTP proxy between the service and its object store that injects faults: errors without
//! forwarding, answers lost after the request was applied, and delays.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::TryStreamExt;
use tokio::sync::RwLock;

/// What fraction of requests meets which fault.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Answered 503 SlowDown without reaching the store.
    pub error: f64,
    /// Forwarded (the store applies them) but answered 500: the caller cannot tell.
    pub lost_answer: f64,
    /// Delayed by up to `max_delay` before forwarding.
    pub delay: f64,
    pub max_delay: Duration,
}

/// Counts of what the proxy did.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub forwarded: AtomicU64,
    pub errors: AtomicU64,
    pub lost: AtomicU64,
    pub delayed: AtomicU64,
    /// Forwarded requests by kind: the method, or `LIST` for a bucket listing.
    pub by_kind: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl FaultCounts {
    /// A copy of the forwarded requests by kind.
    pub fn kinds(&self) -> std::collections::BTreeMap<String, u64> {
        self.by_kind
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

struct ProxyState {
    upstream: String,
    http: reqwest::Client,
    faults: RwLock<Faults>,
    counts: FaultCounts,
}

/// A running fault proxy.
pub struct FaultProxy {
    pub url: String,
    state: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let state = Arc::new(ProxyState {
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::new(),
            faults: RwLock::new(Faults::default()),
            counts: FaultCounts::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FaultProxy { url, state, task })
    }

    pub async fn set(&self, faults: Faults) {
        *self.state.faults.write().await = faults;
    }

    pub fn counts(&self) -> &FaultCounts {
        &self.state.counts
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn s3_error(status: StatusCode, code: &str) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/xml")
        .body(Body::from(format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected</Message></Error>"
        )))
        .unwrap_or_default()
}

async fn forward(State(state): State<Arc<ProxyState>>, req: Request) -> Response {
    let faults = *state.faults.read().await;
    let roll: f64 = rand::random();
    if roll < faults.error {
        state.counts.errors.fetch_add(1, Ordering::Relaxed);
        return s3_error(StatusCode::SERVICE_UNAVAILABLE, "SlowDown");
    }
    let lose = roll < faults.error + faults.lost_answer;
    if !lose && roll < faults.error + faults.lost_answer + faults.delay {
        state.counts.delayed.fetch_add(1, Ordering::Relaxed);
        let ms = (rand::random::<f64>() * faults.max_delay.as_millis() as f64) as u64;
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let kind = if parts.method == axum::http::Method::GET
        && parts.uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| kv.starts_with("list-type") || kv.starts_with("prefix"))
        }) {
        "LIST".to_string()
    } else {
        parts.method.to_string()
    };
    let mut out = state
        .http
        .request(parts.method.clone(), format!("{}{path}", state.upstream))
        .body(reqwest::Body::wrap_stream(body.into_data_stream()));
    for (k, v) in &parts.headers {
        if k != "host" {
            out = out.header(k, v);
        }
    }
    let resp = match out.send().await {
        Ok(r) => r,
        Err(_) => return s3_error(StatusCode::BAD_GATEWAY, "BadGateway"),
    };
    if lose {
        // The store has applied it; the caller only learns that something failed.
        let _ = resp.bytes().await;
        state.counts.lost.fetch_add(1, Ordering::Relaxed);
        return s3_error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError");
    }
    state.counts.forwarded.fetch_add(1, Ordering::Relaxed);
    *state
        .counts
        .by_kind
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(kind)
        .or_default() += 1;
    let mut builder = Response::builder().status(resp.status().as_u16());
    for (k, v) in resp.headers() {
        builder = builder.header(k.as_str(), v.as_bytes());
    }
    builder
        .body(Body::from_stream(
            resp.bytes_stream().map_err(std::io::Error::other),
        ))
        .unwrap_or_default()
}
