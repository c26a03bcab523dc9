//! The HTTP surface: routes, the OpenAPI document generated from them, and the layers every
//! route passes (a tracing span, metrics, per-address rate limiting, body limits, and CORS for
//! the data plane).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::Service;
use crate::config::Cors;
use crate::error::ApiError;

pub mod data_plane;
pub mod extract;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "UniCAS",
        description = "Content-addressed storage: immutable nodes named by SHA-256, leases, root references and garbage collection per (App, Space)."
    ),
    modifiers(&CapabilityScheme),
    tags(
        (name = "nodes", description = "Reading, leasing and uploading nodes"),
        (name = "space", description = "Usage and garbage collection of a Space"),
        (name = "root-refs", description = "Root references: signed deltas and balances"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
struct ApiDoc;

struct CapabilityScheme;

impl utoipa::Modify for CapabilityScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "capability",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A Space capability signed by a registered App issuer, of either shape: \
                         this service's own (EdDSA, ES256 or RS256; `grants[{spaceId, permissions}]` \
                         naming Spaces exactly; an optional `refDomain`), or the public UniCAS \
                         contract's (`ver: 2`, ES256, header `typ: unidocs-cap+jwt`, `sub`, `jti`, \
                         `grants[{selector, permissions}]` with exact, `/a/b-*` and `/a/**` \
                         selectors, and the `refDomain` its root refs belong to). Root refs of a \
                         capability without `refDomain` belong to the domain `default`.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "alive")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the database and the object store answer.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "ready"), (status = 503, body = cas_format::wire::ErrorBody)))]
async fn readyz(State(svc): State<Service>) -> Result<&'static str, ApiError> {
    if !svc.meta.ping().await {
        return Err(ApiError::unavailable("the database does not answer"));
    }
    if !svc.blobs.ping().await {
        return Err(ApiError::unavailable("the object store does not answer"));
    }
    Ok("ready")
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, content_type = "text/plain")))]
async fn metrics(State(svc): State<Service>) -> Response {
    if svc.metrics.backlog_due() {
        let now = crate::now_ms();
        match svc.meta.backlog(now).await {
            Ok(b) => svc.metrics.set_backlog(&b, now),
            Err(e) => tracing::warn!(error = %e, "counting the backlog for /metrics failed"),
        }
    }
    server_kit::http_metrics::exposition(svc.metrics.render())
}

/// Counts and times every answer by method, matched route and status.
async fn count_requests(State(svc): State<Service>, req: Request, next: Next) -> Response {
    svc.metrics.requests.track(req, next).await
}

/// A span per request carrying method, route, App, Space and hash.
fn request_span(req: &Request) -> tracing::Span {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("", |p| p.as_str());
    let query = req.uri().query().unwrap_or("");
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .map_or("", |(_, v)| v)
            .to_string()
    };
    let hash = req
        .uri()
        .path()
        .strip_prefix("/v1/cas/nodes/")
        .map_or("", |rest| rest.split('/').next().unwrap_or(""))
        .to_string();
    tracing::info_span!(
        "request",
        method = %req.method(),
        route,
        app = %param("appId"),
        space = %param("spaceId"),
        hash = %hash,
    )
}

async fn not_found() -> ApiError {
    ApiError::not_found("NOT_FOUND", "no such route")
}

/// Refuses admin-plane requests to a host the deployment does not answer to, and changes
/// requested by pages of another origin (see [`crate::web_guard`]).
async fn guard_browser(State(svc): State<Service>, req: Request, next: Next) -> Response {
    match crate::web_guard::check(
        &svc.allowed_hosts,
        Some(svc.public_url()),
        req.method(),
        req.headers(),
    ) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            let (code, message) = refusal.code_and_message();
            let status = match refusal {
                crate::web_guard::Refusal::Host(_) => axum::http::StatusCode::MISDIRECTED_REQUEST,
                crate::web_guard::Refusal::Origin(_) => axum::http::StatusCode::FORBIDDEN,
            };
            ApiError::new(status, code, message).into_response()
        }
    }
}

/// `/metrics` alone, for a listener of its own.
pub fn metrics_router(svc: Service) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(svc)
}

/// The router of the service: data plane, operations and the OpenAPI document.
pub fn router(svc: Service) -> Router {
    let serve_metrics = matches!(
        svc.config.metrics_addr(),
        Ok(crate::config::MetricsListen::Main)
    );
    let mut data_plane_routes = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(data_plane::get_node))
        .routes(routes!(data_plane::get_metadata))
        .routes(routes!(data_plane::lease))
        .routes(routes!(data_plane::lease_batch))
        .routes(routes!(data_plane::usage))
        .routes(routes!(data_plane::gc))
        .routes(routes!(
            data_plane::update_root_refs,
            data_plane::list_root_refs
        ))
        .routes(routes!(data_plane::upload));
    // Only the data plane answers cross-origin: it needs a capability. Operations routes
    // (health, metrics) need none, and a page in an operator's browser must not read them.
    if let Some(cors) = cors_layer(&svc.config) {
        data_plane_routes = data_plane_routes.layer(cors);
    }
    let mut routes = data_plane_routes
        .routes(routes!(healthz))
        .routes(routes!(readyz));
    if serve_metrics {
        routes = routes.routes(routes!(metrics));
    }
    let (data_plane, mut openapi) = routes.split_for_parts();
    openapi.info.version = env!("CARGO_PKG_VERSION").to_string();
    let openapi = Arc::new(openapi);
    let json_limit = match svc.config.json_body_limit {
        0 => usize::MAX,
        n => n as usize,
    };
    let mut app = Router::new()
        .merge(data_plane)
        .route(
            "/openapi.json",
            get(move || {
                let doc = openapi.clone();
                async move { Json(doc.as_ref().clone()) }
            }),
        )
        .merge(
            crate::admin::router()
                .layer(middleware::from_fn_with_state(svc.clone(), guard_browser)),
        )
        .fallback(not_found)
        .layer(Extension(extract::JsonLimit(json_limit)))
        .layer(middleware::from_fn_with_state(svc.clone(), count_requests))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(svc.clone());
    if svc.config.rate_limit_per_ip > 0 {
        app = app.layer(ip_rate_limit(svc.config.rate_limit_per_ip));
    }
    app
}

/// Cross-origin access to the data plane for browser clients (`cors_origins`): preflights
/// are answered, and the headers a client reads (children, ranges, retry hints) are exposed.
/// Credentials are never allowed: the data plane is authorized by the bearer capability.
fn cors_layer(config: &crate::config::Config) -> Option<CorsLayer> {
    use axum::http::{HeaderName, HeaderValue, Method, header};
    let origins = match config.cors().ok()? {
        Cors::Off => return None,
        Cors::AnyOrigin => AllowOrigin::any(),
        Cors::Origins(list) => AllowOrigin::list(
            list.iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect::<Vec<_>>(),
        ),
    };
    Some(
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::GET, Method::POST, Method::PUT])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::RANGE,
                header::IF_NONE_MATCH,
                HeaderName::from_static("idempotency-key"),
            ])
            .expose_headers([
                HeaderName::from_static("x-cas-refs"),
                HeaderName::from_static("x-unicas-content-type"),
                header::CONTENT_RANGE,
                header::CONTENT_LENGTH,
                header::ACCEPT_RANGES,
                header::ETAG,
                header::RETRY_AFTER,
            ])
            .max_age(std::time::Duration::from_secs(600)),
    )
}

/// Per-address rate limiting: `per_second` requests per second with bursts of twice that.
fn ip_rate_limit(
    per_second: u64,
) -> GovernorLayer<PeerIpKeyExtractor, governor::middleware::NoOpMiddleware, axum::body::Body> {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond((1_000_000_000 / per_second).max(1))
        .burst_size(per_second.saturating_mul(2).min(u32::MAX as u64) as u32)
        .finish()
        .unwrap_or_default();
    GovernorLayer::new(config).error_handler(|e| {
        let wait = match &e {
            tower_governor::GovernorError::TooManyRequests { wait_time, .. } => *wait_time,
            _ => 1,
        };
        ApiError::too_many("RATE_LIMITED", "too many requests from this address", wait)
            .into_response()
    })
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then drains.
pub async fn serve(
    router: Router,
    listener: tokio::net::TcpListener,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let listener = server_kit::runtime::nodelay(listener);
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await
}
