//! Moving a notebook's history out and in: export as a CAS archive, import from one.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio_util::io::ReaderStream;
use utoipa::IntoParams;

use super::envelope::ErrorEnvelope;
use super::extract::{Caller, P, Q, body_reader, spawn};
use super::notebooks::CreatedNotebookEnvelope;
use crate::Hub;
use crate::catalog::Role;
use crate::error::{HubError, HubResult, ok_status};
use crate::ids::{NotebookId, ProjectId};

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The new notebook's title.
    pub title: String,
}
/// A CAS archive of every kept version of the notebook and all they reference (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/export", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, description = "The archive", content_type = "application/vnd.unicas.archive"), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn export(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
) -> HubResult<Response> {
    let (entry, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let (file, len) = hub.export_notebook(&nb).await?;
    let mut resp = Body::from_stream(ReaderStream::with_capacity(file, 256 << 10)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/vnd.unicas.archive"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let name: String = entry
        .title
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}.unicas\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(resp)
}

/// Creates a notebook from an exported archive (editor); refused if a live notebook has the title.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/import", tag = "notebooks",
    params(("pid" = String, Path), ImportQuery),
    request_body(content = Vec<u8>, content_type = "application/vnd.unicas.archive"),
    responses((status = 201, body = CreatedNotebookEnvelope), (status = 409, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn import(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    Q(q): Q<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> HubResult<Response> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !(ct.starts_with("application/vnd.unicas.archive")
        || ct.starts_with("application/octet-stream"))
    {
        return Err(HubError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "the body must be an archive (Content-Type: application/vnd.unicas.archive)",
        ));
    }
    let reader = body_reader(body);
    let h = hub.clone();
    let done = spawn(async move { h.import_notebook(&user, &pid, &q.title, reader).await }).await?;
    Ok(ok_status(StatusCode::CREATED, done))
}
