//! The HTTP API under `/api/v1` (and push sync at `/api/sync/git/v1`), with its OpenAPI
//! document at `/api/v1/doc`. Every JSON answer is the seed-000 envelope. One module per
//! resource holds its handlers, bodies and OpenAPI annotations; this one assembles the router.

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::Hub;
use crate::error::HubError;

pub mod app_pools;
pub mod auth;
pub mod envelope;
pub mod events;
pub mod extract;
pub mod files;
pub mod invitations;
pub mod notebooks;
pub mod projects;
pub mod sessions;
pub mod storage;
pub mod sync;
pub mod system;
pub mod transfer;
pub mod users;
pub mod versions;
pub mod workspace;

#[cfg(test)]
mod tests;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "UniCAS notebook hub",
        description = "Projects, notebooks, workspaces and versions, stored as content-addressed nodes. \
            Every JSON answer is an envelope: `{\"success\": true, \"data\": …}` or \
            `{\"success\": false, \"error\": {\"code\", \"message\", …}}`."
    ),
    modifiers(&TokenScheme),
    tags(
        (name = "catalog", description = "The whole project and notebook index in one read"),
        (name = "projects", description = "Projects, members, events, storage, trash"),
        (name = "notebooks", description = "Notebooks, workspaces, versions, forks, export and import"),
        (name = "sessions", description = "Notebooks opened in marimo, the persistent editor, and its takeover"),
        (name = "sync", description = "Push sync from an external workflow"),
        (name = "auth", description = "The caller and personal access tokens"),
        (name = "users", description = "User ids resolved to display identities"),
        (name = "system", description = "Health, and the deployment's version, limits and features"),
    )
)]
struct ApiDoc;

struct TokenScheme;

impl utoipa::Modify for TokenScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let bearer = |description: &str| {
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(description))
                    .build(),
            )
        };
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme("token", bearer("A personal access token, `uhub_pat_…`"));
        c.add_security_scheme(
            "sync_token",
            bearer("A notebook's sync token, `uhub_sync_…`"),
        );
    }
}

/// The OpenAPI document of the hub.
async fn openapi(
    State(doc): State<std::sync::Arc<utoipa::openapi::OpenApi>>,
) -> Json<utoipa::openapi::OpenApi> {
    Json((*doc).clone())
}

/// The router with every route, and the OpenAPI document built from it.
pub fn router(hub: Hub) -> Router {
    let json_limit = usize::try_from(hub.config.json_max_bytes).unwrap_or(usize::MAX);
    let (json_routes, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(system::get_catalog))
        .routes(routes!(system::get_system))
        .routes(routes!(users::list_users))
        .routes(routes!(auth::me))
        .routes(routes!(auth::list_tokens, auth::create_token))
        .routes(routes!(auth::revoke_token))
        .routes(routes!(projects::list_projects, projects::create_project))
        .routes(routes!(projects::list_trashed_projects))
        .routes(routes!(projects::restore_project))
        .routes(routes!(projects::purge_project))
        .routes(routes!(invitations::invite, invitations::list_invitations))
        .routes(routes!(invitations::withdraw_invitation))
        .routes(routes!(
            projects::get_project,
            projects::update_project,
            projects::delete_project
        ))
        .routes(routes!(projects::put_member))
        .routes(routes!(projects::remove_member))
        .routes(routes!(events::list_events))
        .routes(routes!(events::list_all_events))
        .routes(routes!(storage::storage))
        .routes(routes!(storage::gc))
        .routes(routes!(projects::list_trash))
        .routes(routes!(projects::restore_trash))
        .routes(routes!(projects::purge_trash))
        .routes(routes!(
            notebooks::list_notebooks,
            notebooks::create_notebook
        ))
        .routes(routes!(
            notebooks::get_notebook,
            notebooks::update_notebook,
            notebooks::trash_notebook
        ))
        .routes(routes!(workspace::get_workspace, workspace::save))
        .routes(routes!(workspace::workspace_file))
        .routes(routes!(versions::list_versions))
        .routes(routes!(versions::get_version))
        .routes(routes!(versions::version_file))
        .routes(routes!(versions::restore_version))
        .routes(routes!(notebooks::fork))
        .routes(routes!(notebooks::branch))
        .routes(routes!(transfer::export))
        .routes(routes!(notebooks::rotate_sync_token))
        .routes(routes!(sessions::list_sessions))
        .routes(routes!(sessions::create_session))
        .routes(routes!(app_pools::get_pool))
        .routes(routes!(app_pools::visit_heartbeat))
        .routes(routes!(app_pools::visit_departure))
        .routes(routes!(app_pools::stop_member))
        .routes(routes!(app_pools::restart_member))
        .routes(routes!(sessions::get_session, sessions::delete_session))
        .routes(routes!(sessions::heartbeat))
        .routes(routes!(sessions::editor_session))
        .routes(routes!(sessions::takeover))
        .routes(routes!(sessions::version_html))
        .routes(routes!(system::healthz))
        .routes(routes!(system::readyz))
        .layer(DefaultBodyLimit::max(json_limit))
        .split_for_parts();
    // Streamed bodies carry their own limits.
    let (stream_routes, stream_doc) = OpenApiRouter::new()
        .routes(routes!(storage::upload))
        .routes(routes!(transfer::import))
        .routes(routes!(sync::push_sync))
        .layer(DefaultBodyLimit::disable())
        .split_for_parts();
    doc.merge(stream_doc);
    // Routing needs `{*path}` for paths with slashes; OpenAPI spells it `{path}`.
    let paths = std::mem::take(&mut doc.paths.paths);
    doc.paths.paths = paths
        .into_iter()
        .map(|(k, v)| (k.replace("{*", "{"), v))
        .collect();
    let doc = std::sync::Arc::new(doc);
    let docs = Router::new()
        .route("/api/v1/doc", get(openapi))
        .route("/api/v1/openapi.json", get(openapi))
        .with_state(doc);
    // Sessions are served under `/s/{sid}/`, not under the API, and stream both ways; with an
    // origin of their own, here only to other hub processes.
    let session_proxy = Router::new()
        .route(
            "/s/{*rest}",
            if hub.config.session_listen.is_empty() {
                axum::routing::any(crate::proxy::proxy)
            } else {
                axum::routing::any(crate::proxy::forwarded_only)
            },
        )
        .layer(DefaultBodyLimit::disable());
    let mut app = json_routes
        .merge(stream_routes)
        .merge(session_proxy)
        .merge(crate::web::router())
        .fallback(|| async { HubError::not_found("no such route") })
        .with_state(hub.clone())
        .merge(docs);
    if matches!(
        hub.config.metrics_addr(),
        Ok(server_kit::listen::MetricsListen::Main)
    ) {
        app = app.merge(metrics_router(hub.clone()));
    }
    app.layer(axum::middleware::from_fn_with_state(
        hub.clone(),
        count_requests,
    ))
    .layer(axum::middleware::from_fn_with_state(hub, guard_browser))
    .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// Sessions on an origin of their own (`UNICAS_HUB_SESSION_LISTEN`): `/s/{sid}/…` and nothing
/// else, with the same host and cross-origin checks, the session origin being its own.
pub fn session_router(hub: Hub) -> Router {
    Router::new()
        .route("/s/{*rest}", axum::routing::any(crate::proxy::proxy))
        .fallback(|| async { HubError::not_found("only sessions are served here") })
        .layer(DefaultBodyLimit::disable())
        .layer(axum::Extension(crate::proxy::SessionOrigin))
        .with_state(hub.clone())
        .layer(axum::middleware::from_fn_with_state(
            hub.clone(),
            count_requests,
        ))
        .layer(axum::middleware::from_fn_with_state(hub, guard_sessions))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// `/metrics` alone (see [`crate::metrics`]), for the main listener or one of its own.
pub fn metrics_router(hub: Hub) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(hub)
}

async fn metrics(State(hub): State<Hub>) -> Response {
    server_kit::http_metrics::exposition(hub.render_metrics().await)
}

/// Counts and times every answer by method, matched route and status.
async fn count_requests(
    State(hub): State<Hub>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    hub.metrics.requests.track(req, next).await
}

/// Refuses requests to a host the hub does not answer to, and changes requested by pages of
/// another origin (see [`server_kit::web_guard`]).
async fn guard_browser(
    State(hub): State<Hub>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let origin = hub.config.public_url.clone();
    guard(&hub, origin.as_deref(), req, next).await
}

/// [`guard_browser`] for the sessions' own listener.
async fn guard_sessions(
    State(hub): State<Hub>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let origin = hub.config.session_url.clone();
    guard(&hub, origin.as_deref(), req, next).await
}

async fn guard(
    hub: &Hub,
    origin: Option<&str>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    match server_kit::web_guard::check(&hub.allowed_hosts, origin, req.method(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            let (code, message) = refusal.code_and_message();
            let status = match refusal {
                server_kit::web_guard::Refusal::Host(_) => StatusCode::MISDIRECTED_REQUEST,
                server_kit::web_guard::Refusal::Origin(_) => StatusCode::FORBIDDEN,
            };
            HubError::new(status, code, message).into_response()
        }
    }
}
