//! What both servers measure of every HTTP answer: a counter and a latency histogram by
//! method, matched route (the template, never the ids in it) and status.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

/// Latency buckets from 250 µs to about 4 s.
pub fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 15))
}

/// `http_requests_total` and `http_request_duration_seconds`.
#[derive(Clone)]
pub struct RequestMetrics {
    requests: Family<RequestLabels, Counter>,
    seconds: Family<RequestLabels, Histogram>,
}

impl RequestMetrics {
    /// The two families, registered in `registry`.
    pub fn registered(registry: &mut Registry) -> Self {
        let m = RequestMetrics {
            requests: Family::default(),
            seconds: Family::new_with_constructor(latency),
        };
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            m.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time to answer, by route and status",
            m.seconds.clone(),
        );
        m
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, took: Duration) {
        let labels = RequestLabels {
            method: method.to_string(),
            route: route.to_string(),
            status,
        };
        self.seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.requests.get_or_create(&labels).inc();
    }

    /// Runs `next` on `req`, counting and timing the answer (for a `from_fn` middleware).
    pub async fn track(&self, req: Request, next: Next) -> Response {
        let method = req.method().to_string();
        let route = req
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
        let started = Instant::now();
        let response = next.run(req).await;
        self.observe(
            &method,
            &route,
            response.status().as_u16(),
            started.elapsed(),
        );
        response
    }
}

/// A scrape's text as the answer of `/metrics` (the OpenMetrics text format).
pub fn exposition(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}
