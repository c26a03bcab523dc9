//! A notebook's workspace: its listing at a revision, saves, and its files.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::{Caller, JsonBody, P, Q, spawn};
use super::files::{stream_file, stream_workspace};
use crate::Hub;
use crate::catalog::{Role, Source};
use crate::error::{HubError, HubResult, ok_status};
use crate::ids::{NotebookId, ProjectId};
use crate::store::VersionKind;
use crate::versions::VersionView;
use crate::workspace::{Committed, ListedEntry, SaveRequest};

#[derive(Serialize, ToSchema)]
pub struct WorkspaceView {
    pub version: VersionView,
    pub entries: Vec<ListedEntry>,
}

#[derive(Deserialize, IntoParams, Default)]
#[into_params(parameter_in = Query)]
pub struct RevisionQuery {
    /// Default: the head.
    pub revision: Option<i64>,
}

envelope!(WorkspaceEnvelope, WorkspaceView);
envelope!(CommittedEnvelope, Committed);
/// The workspace at a revision (default: the head): the version and every entry (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/workspace", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), RevisionQuery),
    responses((status = 200, body = WorkspaceEnvelope), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn get_workspace(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    Q(q): Q<RevisionQuery>,
) -> HubResult<Response> {
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let version = hub.loadable(&nb, q.revision).await?;
    stream_workspace(&hub, &pid, version).await
}

/// Saves the workspace (editor): changed and deleted files only, on top of `expected_revision`.
/// A stale or missing `expected_revision` over an existing workspace is 409
/// `workspace_conflict`; a writer that cannot take the workspace in time is 503
/// `workspace_busy` and writes nothing.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/workspace", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = SaveRequest,
    responses((status = 201, body = CommittedEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
        (status = 409, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn save(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    JsonBody(req): JsonBody<SaveRequest>,
) -> HubResult<Response> {
    let (entry, _) = hub.notebook_for(&user, &pid, &nid, Role::Editor).await?;
    if matches!(entry.source, Source::Git { .. }) {
        return Err(HubError::conflict(
            "this notebook is push-synced: it changes only by sync (fork it to edit)",
        ));
    }
    let h = hub.clone();
    let done =
        spawn(async move { h.save(&pid, &nid, &user.id, req, VersionKind::Save).await }).await?;
    Ok(ok_status(StatusCode::CREATED, done))
}

/// One file of the workspace at a revision (viewer), streamed.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/{*path}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("path" = String, Path), RevisionQuery),
    responses((status = 200, description = "The file", content_type = "application/octet-stream"), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn workspace_file(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, path)): P<(ProjectId, NotebookId, String)>,
    Q(q): Q<RevisionQuery>,
    headers: HeaderMap,
) -> HubResult<Response> {
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let v = hub.loadable(&nb, q.revision).await?;
    stream_file(&hub, &pid, &v, &path, q.revision.is_some(), &headers).await
}
