//! What a project costs in the CAS, its garbage collection, and files staged for saves.

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::{Caller, P, body_reader};
use crate::Hub;
use crate::catalog::Role;
use crate::error::{HubResult, ok, ok_status};
use crate::ids::ProjectId;
use crate::workspace::StagedFile;

/// CAS usage of the project's Space beside the logical bytes of what it retains.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageView {
    pub project_id: ProjectId,
    pub node_count: i64,
    pub ready_content_bytes: i64,
    pub ready_stored_bytes: i64,
    /// Sum of the file sizes of every kept version, as full copies would store them.
    pub logical_bytes: i64,
    pub kept_versions: i64,
    pub pruned_versions: i64,
    /// `logicalBytes / readyStoredBytes`.
    pub dedup_ratio: f64,
}

#[derive(Serialize, ToSchema)]
pub struct GcView {
    pub examined: u64,
    pub deleted: u64,
    pub reclaimed_content_bytes: u64,
}

envelope!(StorageEnvelope, StorageView);
envelope!(GcEnvelope, GcView);
envelope!(StagedEnvelope, StagedFile);
/// CAS usage of the project's Space beside the logical bytes of every kept version (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/storage", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = StorageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn storage(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    hub.project_for(&user, &pid, Role::Viewer).await?;
    let usage = hub.cas()?.usage(&pid.space()).await?;
    let sums = hub.store.version_sums(&pid).await?;
    Ok(ok(StorageView {
        project_id: pid,
        node_count: usage.node_count,
        ready_content_bytes: usage.ready_content_bytes,
        ready_stored_bytes: usage.ready_stored_bytes,
        logical_bytes: sums.logical_bytes,
        kept_versions: sums.kept,
        pruned_versions: sums.pruned,
        dedup_ratio: if usage.ready_stored_bytes > 0 {
            sums.logical_bytes as f64 / usage.ready_stored_bytes as f64
        } else {
            0.0
        },
    }))
}

/// Runs bounded garbage-collection passes on the project's Space in the CAS (manager).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/gc", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = GcEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn gc(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    hub.project_for(&user, &pid, Role::Manager).await?;
    let space = pid.space();
    let cas = hub.cas()?;
    let mut view = GcView {
        examined: 0,
        deleted: 0,
        reclaimed_content_bytes: 0,
    };
    for _ in 0..1000 {
        let pass = cas.gc(&space, Some(1000)).await?;
        view.examined += pass.examined;
        view.deleted += pass.deleted;
        view.reclaimed_content_bytes += pass.reclaimed_content_bytes;
        if pass.deleted == 0 {
            break;
        }
    }
    let ev = crate::store::EventRow::new(
        "project.gc",
        &user.id,
        Some(&pid),
        None,
        serde_json::json!({"deleted": view.deleted, "reclaimed_content_bytes": view.reclaimed_content_bytes}),
    );
    hub.store.record_event(&ev).await?;
    Ok(ok(view))
}

/// Stores one file (streamed, chunked when large) for a following save (editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/uploads", tag = "projects", params(("pid" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = StagedEnvelope), (status = 403, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn upload(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    body: Body,
) -> HubResult<Response> {
    Ok(ok_status(
        StatusCode::CREATED,
        hub.stage_upload(&user, &pid, body_reader(body)).await?,
    ))
}
