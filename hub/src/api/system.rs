//! Health, readiness, the deployment's version, limits and features, and the whole catalog
//! in one read.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::Caller;
use crate::Hub;
use crate::catalog::NotebookEntry;
use crate::config::AuthMode;
use crate::error::{HubError, HubResult, ok};
use crate::projects::ProjectView;
use crate::store::sessions::Sharing;

#[derive(Serialize, ToSchema)]
pub struct CatalogProject {
    #[serde(flatten)]
    pub project: ProjectView,
    pub notebooks: Vec<NotebookEntry>,
}

#[derive(Serialize, ToSchema)]
pub struct CatalogView {
    pub snapshot_id: String,
    pub created_at: String,
    pub projects: Vec<CatalogProject>,
}

envelope!(CatalogEnvelope, CatalogView);

/// What this deployment is and allows.
#[derive(Serialize, ToSchema)]
pub struct SystemView {
    /// The hub's release.
    pub version: &'static str,
    /// The API version every route is under (`/api/v1`).
    pub api_version: &'static str,
    /// `token` (personal access tokens) or `none` (single-user).
    pub auth: &'static str,
    pub limits: SystemLimits,
    pub features: SystemFeatures,
}

/// The deployment's limits; `null` where there is none.
#[derive(Serialize, ToSchema)]
pub struct SystemLimits {
    /// Versions kept per notebook.
    pub max_versions: Option<u64>,
    pub max_projects: u64,
    pub max_projects_per_user: Option<u64>,
    /// Notebooks of one project, live or in the trash.
    pub max_notebooks_per_project: u64,
    /// Largest staged file upload, push-sync body and JSON body, in bytes.
    pub upload_max_bytes: u64,
    pub sync_max_bytes: u64,
    pub json_max_bytes: u64,
    /// Live sessions per user and in the deployment.
    pub sessions_per_user: Option<u64>,
    pub sessions_total: Option<u64>,
    pub session_idle_timeout_seconds: u64,
    pub session_max_lifetime_seconds: u64,
    /// How long a writer waits for a busy workspace before `workspace_busy`.
    pub workspace_wait_seconds: f64,
    /// Live personal access tokens per user.
    pub tokens_per_user: i64,
    /// App pools: visit slots per sandbox and sandboxes per notebook version (`null`:
    /// unlimited).
    pub app_max_visits_per_session: Option<u64>,
    pub app_max_sessions_per_version: Option<u64>,
    /// How long things are kept, in seconds (`null`: for ever): catalog snapshots, events,
    /// idempotency records, projects in the trash.
    pub catalog_retention_seconds: Option<u64>,
    pub event_retention_seconds: Option<u64>,
    pub idempotency_retention_seconds: Option<u64>,
    pub project_trash_retention_seconds: Option<u64>,
}

/// What the deployment offers.
#[derive(Serialize, ToSchema)]
pub struct SystemFeatures {
    /// Notebooks open in marimo sessions (edit mode).
    pub sessions: bool,
    /// The marimo release sessions run.
    pub marimo_version: String,
    /// `exclusive` or `shared` persistent editors.
    pub editor_mode: Sharing,
    /// Notebooks pushed from Git (`POST /api/sync/git/v1`).
    pub push_sync: bool,
    /// Notebooks served as apps to many visitors.
    pub app_pools: bool,
    /// `Idempotency-Key` on project and notebook creates.
    pub idempotent_creates: bool,
    /// Tokens limited to some projects and a role (credential version 2).
    pub scoped_tokens: bool,
    /// Members invited by email before they have an account.
    pub invitations: bool,
}

envelope!(SystemEnvelope, SystemView);

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "system", responses((status = 200, description = "alive")))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the hub database and the content store answer.
#[utoipa::path(get, path = "/readyz", tag = "system",
    responses((status = 200, description = "ready"), (status = 503, body = ErrorEnvelope)))]
pub async fn readyz(State(hub): State<Hub>) -> HubResult<&'static str> {
    if !hub.store.ping().await {
        return Err(HubError::unavailable("the hub database does not answer"));
    }
    hub.catalog().await?;
    Ok("ready")
}

/// The deployment's version, limits and features.
#[utoipa::path(get, path = "/api/v1/system", tag = "system",
    responses((status = 200, body = SystemEnvelope), (status = 401, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn get_system(State(hub): State<Hub>, Caller(_user): Caller) -> HubResult<Response> {
    let c = &hub.config;
    let s = &c.sessions;
    let unless_zero = |n: u64| (n > 0).then_some(n);
    Ok(ok(SystemView {
        version: env!("CARGO_PKG_VERSION"),
        api_version: "v1",
        auth: match c.auth {
            AuthMode::Token => "token",
            AuthMode::None => "none",
        },
        limits: SystemLimits {
            max_versions: unless_zero(c.max_versions),
            max_projects: c.max_projects,
            max_projects_per_user: unless_zero(c.max_projects_per_user),
            max_notebooks_per_project: c.max_notebooks_per_project,
            upload_max_bytes: c.upload_max_bytes,
            sync_max_bytes: c.sync_max_bytes,
            json_max_bytes: c.json_max_bytes,
            sessions_per_user: unless_zero(s.max_per_user),
            sessions_total: unless_zero(s.max_total),
            session_idle_timeout_seconds: s.idle_timeout_s,
            session_max_lifetime_seconds: s.max_lifetime_s,
            workspace_wait_seconds: c.workspace_wait_ms as f64 / 1000.0,
            tokens_per_user: crate::auth::MAX_LIVE_TOKENS,
            app_max_visits_per_session: s.app_max_visits,
            app_max_sessions_per_version: s.app_max_sessions,
            catalog_retention_seconds: unless_zero(c.retention.catalog_ms / 1000),
            event_retention_seconds: unless_zero(c.retention.events_ms / 1000),
            idempotency_retention_seconds: unless_zero(c.retention.idempotency_ms / 1000),
            project_trash_retention_seconds: unless_zero(c.retention.project_trash_ms / 1000),
        },
        features: SystemFeatures {
            sessions: true,
            marimo_version: s.marimo_version.clone(),
            editor_mode: s.editor_mode,
            push_sync: true,
            app_pools: true,
            idempotent_creates: true,
            scoped_tokens: true,
            invitations: true,
        },
    }))
}

/// Every project the caller can see with its notebooks, from one read of the current snapshot.
#[utoipa::path(get, path = "/api/v1/catalog", tag = "catalog",
    responses((status = 200, body = CatalogEnvelope), (status = 401, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn get_catalog(State(hub): State<Hub>, Caller(user): Caller) -> HubResult<Response> {
    let cat = hub.catalog().await?;
    let projects = cat
        .projects()
        .filter_map(|p| {
            hub.project_view(&user, p).map(|view| CatalogProject {
                project: view,
                notebooks: p.live_notebooks().cloned().collect(),
            })
        })
        .collect();
    Ok(ok(CatalogView {
        snapshot_id: cat.snapshot_id.clone(),
        created_at: cat.created_at.clone(),
        projects,
    }))
}
