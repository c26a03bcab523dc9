//! Notebooks: the list, one notebook, creation, metadata, the trash, forks, refused-edit
//! branches and sync tokens.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::envelope::{ErrorEnvelope, Page, PageQuery, envelope, page_of_fetched};
use super::extract::{Caller, CreateBody, JsonBody, P, Q, spawn};
use crate::Hub;
use crate::catalog::{NotebookEntry, Role};
use crate::error::{HubError, HubResult, ok, ok_status};
use crate::forks::{BranchRequest, ForkRequest};
use crate::ids::{NotebookId, ProjectId};
use crate::notebooks::{CreateNotebook, CreatedNotebook, NotebookView, Trashed, UpdateNotebook};

#[derive(Serialize, ToSchema)]
pub struct SyncTokenView {
    pub sync_token: String,
}

envelope!(NotebookPageEnvelope, Page<NotebookView>);
envelope!(CreatedNotebookEnvelope, CreatedNotebook);
envelope!(TrashedEnvelope, Trashed);
envelope!(SyncTokenEnvelope, SyncTokenView);
pub use super::projects::NotebookEnvelope;

/// Live notebooks of a project, oldest first (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks", tag = "notebooks", params(("pid" = String, Path), PageQuery),
    responses((status = 200, body = NotebookPageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn list_notebooks(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    let (cat, _) = hub.project_for(&user, &pid, Role::Viewer).await?;
    let p = cat
        .project(&pid)
        .ok_or_else(|| HubError::not_found("project not found"))?;
    let live: Vec<&NotebookEntry> = p.live_notebooks().collect();
    let start = match &q.cursor {
        Some(c) => live
            .iter()
            .position(|n| n.id == *c.as_str())
            .map_or(live.len(), |i| i + 1),
        None => 0,
    };
    let limit = q.limit();
    let slice: Vec<&NotebookEntry> = live.iter().skip(start).take(limit + 1).copied().collect();
    let mut items = Vec::with_capacity(slice.len());
    for n in &slice {
        let row = hub.store.notebook(&n.id).await?;
        items.push(hub.notebook_view(&pid, n, row.as_ref()));
    }
    Ok(ok(page_of_fetched(items, limit, |n: &NotebookView| {
        n.id.to_string()
    })))
}

/// Creates a notebook (editor). A `git` source with `sync_mode: push` answers its sync token
/// once, as `sync_token`; `files` make the first revision of a local notebook. With an
/// `Idempotency-Key`, a retry (same key, same body, within 24 hours) answers what the first
/// create answered (without the sync token, which is never stored: rotate it if it was lost),
/// marked `Idempotency-Replayed: true`, and creates nothing; the same key with another body is
/// 422 `idempotency_key_reused`.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks", tag = "notebooks",
    params(("pid" = String, Path),
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 printable ASCII characters; a retry with the same key and body answers the first create's answer")),
    request_body = CreateNotebook,
    responses((status = 201, body = CreatedNotebookEnvelope, headers(("idempotency-replayed" = String, description = "`true` when the answer is a replay"))),
        (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
        (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn create_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    CreateBody { body, key }: CreateBody<CreateNotebook>,
) -> HubResult<Response> {
    let key = key.map(|k| k.bind(&user.id, format!("POST /api/v1/projects/{pid}/notebooks")));
    let h = hub.clone();
    spawn(async move { h.create_notebook(&user, &pid, body, key.as_ref()).await })
        .await?
        .into_response()
}

/// One notebook (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = NotebookEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn get_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
) -> HubResult<Response> {
    let (entry, row) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    Ok(ok(hub.notebook_view(&pid, &entry, Some(&row))))
}

/// Updates a notebook's metadata (editor); a title is refused if a live notebook has it.
#[utoipa::path(patch, path = "/api/v1/projects/{pid}/notebooks/{nid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = UpdateNotebook,
    responses((status = 200, body = NotebookEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn update_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    JsonBody(req): JsonBody<UpdateNotebook>,
) -> HubResult<Response> {
    Ok(ok(hub.update_notebook(&user, &pid, &nid, req).await?))
}

/// Moves a notebook with its whole history to the trash (manager); answers the restore token.
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/notebooks/{nid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = TrashedEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn trash_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
) -> HubResult<Response> {
    let h = hub.clone();
    Ok(ok(spawn(async move {
        h.trash_notebook(&user, &pid, &nid).await
    })
    .await?))
}

/// Copies one revision (default: the head) into a new notebook at revision 1 (editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/fork", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = ForkRequest,
    responses((status = 201, body = CreatedNotebookEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn fork(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    JsonBody(req): JsonBody<ForkRequest>,
) -> HubResult<Response> {
    let h = hub.clone();
    let done = spawn(async move { h.fork(&user, &pid, &nid, req).await }).await?;
    Ok(ok_status(StatusCode::CREATED, done))
}

/// Keeps a refused edit as the first revision of its own notebook, named for what it diverged
/// from (editor). Never overwrites a notebook.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/branch-refused-edit", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = BranchRequest,
    responses((status = 201, body = CreatedNotebookEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn branch(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    JsonBody(req): JsonBody<BranchRequest>,
) -> HubResult<Response> {
    let h = hub.clone();
    let done = spawn(async move { h.branch_refused_edit(&user, &pid, &nid, req).await }).await?;
    Ok(ok_status(StatusCode::CREATED, done))
}

/// A new sync token for a push-synced notebook (manager); the old one stops working.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/sync-token", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = SyncTokenEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn rotate_sync_token(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
) -> HubResult<Response> {
    Ok(ok(SyncTokenView {
        sync_token: hub.rotate_sync_token(&user, &pid, &nid).await?,
    }))
}
