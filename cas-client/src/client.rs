//! `AppCasClient`: the thin transport of the data plane for one App and any of its Spaces, with
//! bounded retries of transient failures, cancellation, and an optional bounded cache of
//! immutable node content.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cas_format::wire::{
    ErrorBody, GcRequest, GcResponse, LeaseRequest, LeaseResponse, NodeMetadataResponse,
    RefChanges, RootRefPage, RootRefUpdate, RootRefUpdateResponse, UploadTarget, Usage,
};
use cas_format::{AppId, Hash, RequestId, SpaceId};
use futures_util::{Stream, StreamExt};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::capability::CapabilityProvider;
use crate::error::ClientError;

/// How transient failures are retried.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// A bounded cache of immutable node content, keyed by (Space, hash); oldest entries go first.
#[derive(Debug)]
struct NodeCache {
    max_bytes: usize,
    bytes: usize,
    entries: HashMap<(SpaceId, Hash), Bytes>,
    order: VecDeque<(SpaceId, Hash)>,
}

impl NodeCache {
    fn get(&self, space: &SpaceId, hash: &Hash) -> Option<Bytes> {
        self.entries.get(&(space.clone(), *hash)).cloned()
    }

    fn put(&mut self, space: &SpaceId, hash: Hash, content: Bytes) {
        if content.len() > self.max_bytes / 4 {
            return;
        }
        let key = (space.clone(), hash);
        if self.entries.contains_key(&key) {
            return;
        }
        self.bytes += content.len();
        self.entries.insert(key.clone(), content);
        self.order.push_back(key);
        while self.bytes > self.max_bytes {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(b) = self.entries.remove(&old) {
                self.bytes -= b.len();
            }
        }
    }
}

/// A client of one App's data plane.
#[derive(Clone)]
pub struct AppCasClient {
    http: reqwest::Client,
    base: String,
    app: AppId,
    capabilities: Arc<dyn CapabilityProvider>,
    retry: RetryPolicy,
    cancel: CancellationToken,
    cache: Option<Arc<Mutex<NodeCache>>>,
}

impl std::fmt::Debug for AppCasClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppCasClient")
            .field("base", &self.base)
            .field("app", &self.app)
            .finish_non_exhaustive()
    }
}

/// One request of the data plane.
pub(crate) struct Call<'a> {
    method: Method,
    path: &'a str,
    space: &'a SpaceId,
    permissions: &'static [&'static str],
    query: &'a [(&'static str, String)],
    /// The body, in parts sent one after the other, and its media type (a clone of `Bytes`
    /// per attempt copies nothing).
    body: Option<(Vec<Bytes>, &'static str)>,
    headers: &'a [(reqwest::header::HeaderName, String)],
}

impl<'a> Call<'a> {
    pub(crate) fn new(
        method: Method,
        path: &'a str,
        space: &'a SpaceId,
        permissions: &'static [&'static str],
    ) -> Self {
        Call {
            method,
            path,
            space,
            permissions,
            query: &[],
            body: None,
            headers: &[],
        }
    }

    fn query(mut self, query: &'a [(&'static str, String)]) -> Self {
        self.query = query;
        self
    }

    fn body(self, body: Vec<u8>) -> Self {
        self.typed_body(body, "application/json")
    }

    pub(crate) fn typed_body(self, body: Vec<u8>, media_type: &'static str) -> Self {
        self.body_parts(vec![Bytes::from(body)], media_type)
    }

    /// A body sent in `parts`, one after the other, never joined in memory.
    pub(crate) fn body_parts(mut self, parts: Vec<Bytes>, media_type: &'static str) -> Self {
        self.body = Some((parts, media_type));
        self
    }

    fn headers(mut self, headers: &'a [(reqwest::header::HeaderName, String)]) -> Self {
        self.headers = headers;
        self
    }
}

/// Permissions of each call.
pub(crate) mod perm {
    use cas_format::wire::permission as p;
    pub const READ: &[&str] = &[p::NODES_READ];
    pub const LEASE: &[&str] = &[p::NODES_LEASE];
    pub const USAGE: &[&str] = &[p::USAGE_READ];
    pub const GC: &[&str] = &[p::GC_EXECUTE];
    pub const REFS_UPDATE: &[&str] = &[p::ROOT_REFS_UPDATE];
    pub const REFS_READ: &[&str] = &[p::ROOT_REFS_READ];
}

async fn error_of(resp: reqwest::Response) -> ClientError {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    // Error bodies are small; read at most 64 KiB of one.
    let body = read_limited(resp, 64 << 10).await.unwrap_or_default();
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(e) => ClientError::Api {
            status,
            code: e.error,
            message: e.message,
            retry_after,
        },
        Err(_) => ClientError::Api {
            status,
            code: format!("HTTP_{status}"),
            message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            retry_after,
        },
    }
}

/// Reads a response body, refusing more than `limit` bytes.
async fn read_limited(resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if out.len() + chunk.len() > limit {
            return Err(ClientError::Protocol(format!(
                "the answer is larger than {limit} bytes"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Largest JSON answer read.
const MAX_JSON_ANSWER: usize = 16 << 20;
/// Largest node content read into memory.
pub const MAX_NODE_BYTES: usize = 64 << 20;

impl AppCasClient {
    /// A client of `base` (e.g. `http://127.0.0.1:8080`) for `app`.
    pub fn new(
        base: impl Into<String>,
        app: AppId,
        capabilities: Arc<dyn CapabilityProvider>,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| ClientError::Invalid(format!("cannot build the HTTP client: {e}")))?;
        Ok(AppCasClient {
            http,
            base: base.into().trim_end_matches('/').to_string(),
            app,
            capabilities,
            retry: RetryPolicy::default(),
            cancel: CancellationToken::new(),
            cache: None,
        })
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Calls fail with `Cancelled` once `token` is cancelled.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Keeps up to `max_bytes` of read node content in memory (never shared with another
    /// client, so never across Apps).
    pub fn with_cache(mut self, max_bytes: usize) -> Self {
        self.cache = Some(Arc::new(Mutex::new(NodeCache {
            max_bytes,
            bytes: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
        })));
        self
    }

    pub fn app(&self) -> &AppId {
        &self.app
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The cancellation token of this client.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn partition(&self, space: &SpaceId) -> Vec<(&'static str, String)> {
        vec![
            ("appId", self.app.to_string()),
            ("spaceId", space.to_string()),
        ]
    }

    /// Runs `attempt` with retries of transient failures and backoff, until cancelled.
    async fn retrying<T, F, Fut>(&self, mut attempt: F) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let mut backoff = self.retry.initial_backoff;
        let mut tries = 0;
        loop {
            tries += 1;
            let result = tokio::select! {
                _ = self.cancel.cancelled() => return Err(ClientError::Cancelled),
                r = attempt() => r,
            };
            match result {
                Err(e) if e.is_transient() && tries < self.retry.attempts => {
                    let wait = match &e {
                        ClientError::Api {
                            retry_after: Some(s),
                            ..
                        } => Duration::from_secs(*s).min(self.retry.max_backoff * 4),
                        _ => backoff,
                    };
                    // Up to a quarter of jitter, so that clients do not retry in lockstep.
                    let jitter = wait.mul_f64(rand::random::<f64>() * 0.25);
                    tokio::select! {
                        _ = self.cancel.cancelled() => return Err(ClientError::Cancelled),
                        _ = tokio::time::sleep(wait + jitter) => {}
                    }
                    backoff = (backoff * 2).min(self.retry.max_backoff);
                }
                other => return other,
            }
        }
    }

    async fn send(&self, call: &Call<'_>) -> Result<reqwest::Response, ClientError> {
        let token = self
            .capabilities
            .capability(call.space, call.permissions)
            .await?;
        let mut q = self.partition(call.space);
        q.extend(call.query.iter().cloned());
        let mut req = self
            .http
            .request(call.method.clone(), self.url(call.path))
            .query(&q)
            .bearer_auth(token);
        for (k, v) in call.headers {
            req = req.header(k, v);
        }
        if let Some((parts, media_type)) = &call.body {
            req = req.header(reqwest::header::CONTENT_TYPE, *media_type);
            req = match parts.as_slice() {
                [one] => req.body(one.clone()),
                _ => {
                    // Sent with its length: the parts are written as they are (vectored),
                    // not copied into one buffer.
                    let len: usize = parts.iter().map(Bytes::len).sum();
                    let parts = parts.clone().into_iter().map(Ok::<_, std::io::Error>);
                    req.header(reqwest::header::CONTENT_LENGTH, len).body(
                        reqwest::Body::wrap_stream(futures_util::stream::iter(parts)),
                    )
                }
            };
        }
        let resp = req.send().await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(error_of(resp).await)
        }
    }

    pub(crate) async fn json<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, ClientError> {
        self.retrying(|| async {
            let resp = self.send(&call).await?;
            let bytes = read_limited(resp, MAX_JSON_ANSWER).await?;
            serde_json::from_slice(&bytes).map_err(|e| {
                ClientError::Protocol(format!("invalid JSON answer to {}: {e}", call.path))
            })
        })
        .await
    }

    /// A node's whole own content (from the cache when it is there).
    pub async fn read_node(&self, space: &SpaceId, hash: &Hash) -> Result<Bytes, ClientError> {
        if let Some(cache) = &self.cache
            && let Some(b) = cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(space, hash)
        {
            return Ok(b);
        }
        let bytes = self.read_content(space, hash, None).await?;
        if let Some(cache) = &self.cache {
            cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .put(space, *hash, bytes.clone());
        }
        Ok(bytes)
    }

    /// A node's own content, or the byte range `range` of it, in memory (at most
    /// [`MAX_NODE_BYTES`]).
    pub async fn read_content(
        &self,
        space: &SpaceId,
        hash: &Hash,
        range: Option<Range<u64>>,
    ) -> Result<Bytes, ClientError> {
        let path = format!("/v1/cas/nodes/{hash}");
        let extra: Vec<_> = match &range {
            Some(r) if r.end > r.start => vec![(
                reqwest::header::RANGE,
                format!("bytes={}-{}", r.start, r.end - 1),
            )],
            Some(_) => return Ok(Bytes::new()),
            None => vec![],
        };
        self.retrying(|| async {
            let resp = self
                .send(&Call::new(Method::GET, &path, space, perm::READ).headers(&extra))
                .await?;
            Ok(Bytes::from(read_limited(resp, MAX_NODE_BYTES).await?))
        })
        .await
    }

    /// A node's own content as a stream, never held whole in memory.
    pub async fn read_stream(
        &self,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<impl Stream<Item = Result<Bytes, ClientError>> + use<>, ClientError> {
        let path = format!("/v1/cas/nodes/{hash}");
        let resp = self
            .retrying(|| async {
                self.send(&Call::new(Method::GET, &path, space, perm::READ))
                    .await
            })
            .await?;
        Ok(resp.bytes_stream().map(|r| r.map_err(ClientError::from)))
    }

    /// A node's own content as a stream, with the content type and size the service sent.
    pub async fn read_stream_typed(
        &self,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<
        (
            String,
            u64,
            impl Stream<Item = Result<Bytes, ClientError>> + use<>,
        ),
        ClientError,
    > {
        let path = format!("/v1/cas/nodes/{hash}");
        let resp = self
            .retrying(|| async {
                self.send(&Call::new(Method::GET, &path, space, perm::READ))
                    .await
            })
            .await?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_type = header("x-unicas-content-type").ok_or_else(|| {
            ClientError::Protocol("the answer has no x-unicas-content-type".into())
        })?;
        let size = header("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ClientError::Protocol("the answer has no content-length".into()))?;
        Ok((
            content_type,
            size,
            resp.bytes_stream().map(|r| r.map_err(ClientError::from)),
        ))
    }

    pub async fn read_metadata(
        &self,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<NodeMetadataResponse, ClientError> {
        let path = format!("/v1/cas/nodes/{hash}/metadata");
        self.json(Call::new(Method::GET, &path, space, perm::READ))
            .await
    }

    /// One lease call. `upload_bytes` (the portable node's size, if known) lets the service
    /// choose the cheapest upload target.
    pub async fn lease_node(
        &self,
        space: &SpaceId,
        hash: &Hash,
        duration_ms: u64,
        upload_bytes: Option<u64>,
    ) -> Result<LeaseResponse, ClientError> {
        self.lease_node_based(space, hash, duration_ms, upload_bytes, None)
            .await
    }

    /// One lease call naming `delta_base`, a node of the Space this one probably resembles:
    /// if the lease publishes the node, the service may store it as a delta against that one.
    pub async fn lease_node_based(
        &self,
        space: &SpaceId,
        hash: &Hash,
        duration_ms: u64,
        upload_bytes: Option<u64>,
        delta_base: Option<Hash>,
    ) -> Result<LeaseResponse, ClientError> {
        let body = serde_json::to_vec(&LeaseRequest {
            lease_duration_ms: duration_ms,
            delta_base,
        })
        .map_err(|e| ClientError::Invalid(e.to_string()))?;
        let query: Vec<(&'static str, String)> = upload_bytes
            .map(|n| vec![("uploadBytes", n.to_string())])
            .unwrap_or_default();
        let path = format!("/v1/cas/nodes/{hash}/lease");
        self.json(
            Call::new(Method::POST, &path, space, perm::LEASE)
                .query(&query)
                .body(body),
        )
        .await
    }

    /// PUTs a portable node to an upload target. A 412 (the target already holds an upload,
    /// e.g. from a retried request) is not an error: the next lease validates what is there.
    pub async fn upload(&self, target: &UploadTarget, portable: Bytes) -> Result<(), ClientError> {
        if target.method != "PUT" {
            return Err(ClientError::Protocol(format!(
                "unsupported upload method {}",
                target.method
            )));
        }
        self.retrying(|| async {
            let mut req = self.http.put(&target.url).body(portable.clone());
            for (k, v) in &target.headers {
                req = req.header(k.as_str(), v.as_str());
            }
            let resp = req.send().await?;
            match resp.status() {
                s if s.is_success() => Ok(()),
                StatusCode::PRECONDITION_FAILED => Ok(()),
                _ => Err(error_of(resp).await),
            }
        })
        .await
    }

    /// Applies signed root-ref deltas, idempotently by `request_id`.
    pub async fn update_root_refs(
        &self,
        space: &SpaceId,
        request_id: &RequestId,
        changes: BTreeMap<Hash, i64>,
    ) -> Result<RootRefUpdateResponse, ClientError> {
        let body = serde_json::to_vec(&RootRefUpdate {
            request_id: request_id.clone(),
            changes: RefChanges(changes),
        })
        .map_err(|e| ClientError::Invalid(e.to_string()))?;
        self.json(Call::new(Method::POST, "/v1/cas/root-refs", space, perm::REFS_UPDATE).body(body))
            .await
    }

    /// One page of root-ref balances.
    pub async fn list_root_refs(
        &self,
        space: &SpaceId,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<RootRefPage, ClientError> {
        let mut q = vec![("limit", limit.to_string())];
        if let Some(c) = cursor {
            q.push(("cursor", c.to_string()));
        }
        self.json(Call::new(Method::GET, "/v1/cas/root-refs", space, perm::REFS_READ).query(&q))
            .await
    }

    pub async fn usage(&self, space: &SpaceId) -> Result<Usage, ClientError> {
        self.json(Call::new(Method::GET, "/v1/cas/usage", space, perm::USAGE))
            .await
    }

    /// One bounded GC pass.
    pub async fn gc(
        &self,
        space: &SpaceId,
        max_nodes: Option<u32>,
    ) -> Result<GcResponse, ClientError> {
        let body = serde_json::to_vec(&GcRequest { max_nodes })
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        self.json(Call::new(Method::POST, "/v1/cas/gc", space, perm::GC).body(body))
            .await
    }
}
