//! A notebook's history: versions newest first, one version with its listing and files,
//! and restoring one as a new revision.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use utoipa::ToSchema;

use super::envelope::{ErrorEnvelope, Page, PageQuery, envelope, page_of_fetched};
use super::extract::{Caller, P, Q, spawn};
use super::files::{stream_file, stream_workspace};
use super::workspace::{CommittedEnvelope, WorkspaceView};
use crate::Hub;
use crate::catalog::Role;
use crate::error::{HubError, HubResult, ok, ok_status};
use crate::ids::{NotebookId, ProjectId, VersionId};
use crate::versions::VersionView;

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// If given, the restore is refused unless the head is still this revision.
    #[serde(default)]
    pub expected_revision: Option<i64>,
}

envelope!(VersionPageEnvelope, Page<VersionView>);
envelope!(VersionEnvelope, WorkspaceView);
/// Versions newest first (viewer); pruned ones stay listed.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), PageQuery),
    responses((status = 200, body = VersionPageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn list_versions(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let before = match &q.cursor {
        Some(c) => Some(
            c.parse::<i64>()
                .map_err(|_| HubError::invalid("bad cursor"))?,
        ),
        None => None,
    };
    let limit = q.limit();
    let items = hub.versions(&nb, before, limit as u32 + 1).await?;
    Ok(ok(page_of_fetched(items, limit, |v: &VersionView| {
        v.revision.to_string()
    })))
}

/// Loads a version: its record and its workspace listing (viewer). 410 if pruned.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("vid" = String, Path)),
    responses((status = 200, body = VersionEnvelope), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn get_version(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, vid)): P<(ProjectId, NotebookId, VersionId)>,
) -> HubResult<Response> {
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let v = hub.version_by_id(&nb, &vid).await?;
    let version = hub.loadable(&nb, Some(v.revision)).await?;
    stream_workspace(&hub, &pid, version).await
}

/// One file of a version (viewer), streamed. 410 if the version was pruned.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/files/{*path}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("vid" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "The file", content_type = "application/octet-stream"), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn version_file(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, vid, path)): P<(ProjectId, NotebookId, VersionId, String)>,
    headers: HeaderMap,
) -> HubResult<Response> {
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let v = hub.version_by_id(&nb, &vid).await?;
    let v = hub.loadable(&nb, Some(v.revision)).await?;
    stream_file(&hub, &pid, &v, &path, true, &headers).await
}

/// Restores a version: writes a new revision with its files (editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/restore", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("vid" = String, Path)), request_body = RestoreRequest,
    responses((status = 201, body = CommittedEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn restore_version(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, vid)): P<(ProjectId, NotebookId, VersionId)>,
    body: axum::body::Bytes,
) -> HubResult<Response> {
    hub.notebook_for(&user, &pid, &nid, Role::Editor).await?;
    let req: RestoreRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RestoreRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HubError::invalid(format!("invalid body: {e}")))?
    };
    let expected = req.expected_revision;
    let h = hub.clone();
    let done = spawn(async move {
        h.restore_version(&pid, &nid, &vid, expected, &user.id)
            .await
    })
    .await?;
    Ok(ok_status(StatusCode::CREATED, done))
}
