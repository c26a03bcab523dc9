//! Push sync: an external workflow posts the complete tree as a tar archive.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::envelope::{ErrorEnvelope, envelope};
use super::extract::{body_reader, spawn};
use crate::Hub;
use crate::auth::bearer;
use crate::error::{HubError, HubResult, ok};
use crate::sync::Synced;

envelope!(SyncedEnvelope, Synced);

/// Push sync: the complete workspace tree as a tar archive becomes a new immutable version.
/// Optional headers: `X-Sync-Commit` (the Git commit id), `X-Sync-Message`.
#[utoipa::path(post, path = "/api/sync/git/v1", tag = "sync",
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, body = SyncedEnvelope), (status = 401, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope),
        (status = 415, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("sync_token" = [])))]
pub async fn push_sync(
    State(hub): State<Hub>,
    headers: HeaderMap,
    body: Body,
) -> HubResult<Response> {
    let token = bearer(&headers).map(str::to_string);
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.starts_with("application/x-tar") {
        return Err(HubError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "the body must be a tar archive (Content-Type: application/x-tar)",
        ));
    }
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let commit = text("x-sync-commit");
    let message = text("x-sync-message");
    let reader = body_reader(body);
    let h = hub.clone();
    let done =
        spawn(async move { h.push_sync(token.as_deref(), reader, commit, message).await }).await?;
    Ok(ok(done))
}
