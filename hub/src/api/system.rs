//! Health, readiness, and the whole catalog in one read.

use axum::extract::State;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::Caller;
use crate::Hub;
use crate::catalog::NotebookEntry;
use crate::error::{HubError, HubResult, ok};
use crate::projects::ProjectView;

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
