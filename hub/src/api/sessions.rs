//! Sessions (seed 000 §8): create or reuse, read, heartbeat, end; the editor claim and its
//! takeover; a version's HTML snapshot. Each session route answers the record itself as the
//! envelope's `data`. Ending a session and taking over an editor run on the hub process that
//! owns the sandbox: another process forwards the request there.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use utoipa::ToSchema;

use super::app_pools::OpenedSessionEnvelope;
use super::envelope::{ErrorEnvelope, Page, PageQuery, envelope, page_of_fetched};
use super::extract::{Caller, P, Q};
use super::files::stream_snapshot;
use crate::Hub;
use crate::auth::User;
use crate::catalog::Role;
use crate::error::{HubError, HubResult, ok, ok_status};
use crate::ids::{NotebookId, ProjectId, SessionId, VersionId};
use crate::proxy;
use crate::sessions::lifecycle::{End, Opened, Owner};
use crate::sessions::view::{EditorClaimView, SessionView};
use crate::store::sessions::{SessionMode, SessionRow, SessionStatus};

/// The body of a session create.
#[derive(Debug, Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// `edit` (default): the editor, whose changes are saved; `app`: the notebook as a
    /// read-only application.
    #[serde(default)]
    pub mode: Option<SessionMode>,
    /// For `app`: the visit (one per browser tab; retries reuse it). Absent: the caller's
    /// shared `api` visit.
    #[serde(default)]
    pub app_visit_id: Option<String>,
}

envelope!(SessionEnvelope, SessionView);
envelope!(SessionPageEnvelope, Page<SessionView>);
envelope!(EditorClaimEnvelope, EditorClaimView);

impl Hub {
    /// The record as `user` sees it: with an `open_url` for those who may open it.
    pub(crate) async fn session_view(&self, user: &User, row: &SessionRow) -> SessionView {
        let open = match self.may_use_session(user, row).await {
            Ok(true) => Some(self.open_url(row, &user.id)),
            _ => None,
        };
        SessionView::of(row, self.config.session_base(), open)
    }

    /// A session of `nid` in `pid` that `user` may see (viewers see a project's sessions).
    async fn visible_session(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        sid: &SessionId,
    ) -> HubResult<SessionRow> {
        self.notebook_for(user, pid, nid, Role::Viewer).await?;
        self.store
            .session(sid)
            .await?
            .filter(|r| r.project_id == *pid && r.notebook_id == *nid)
            .ok_or_else(|| HubError::not_found(format!("session {sid} not found")))
    }
}

/// Live sessions of a project (viewer), oldest id first.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/sessions", tag = "sessions",
    params(("pid" = String, Path), PageQuery),
    responses((status = 200, body = SessionPageEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn list_sessions(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    hub.project_for(&user, &pid, Role::Viewer).await?;
    let after = match &q.cursor {
        Some(c) => Some(
            c.parse::<SessionId>()
                .map_err(|_| HubError::invalid("bad cursor"))?,
        ),
        None => None,
    };
    let limit = q.limit();
    let live = [
        SessionStatus::Starting,
        SessionStatus::Running,
        SessionStatus::Terminating,
    ];
    let rows = hub
        .store
        .project_sessions(&pid, &live, after.as_ref(), limit as u32 + 1)
        .await?;
    let mut items = Vec::with_capacity(rows.len());
    for r in &rows {
        items.push(hub.session_view(&user, r).await);
    }
    Ok(ok(page_of_fetched(items, limit, |s: &SessionView| {
        s.session_id.to_string()
    })))
}

/// Creates a session, or returns the caller's live one on this notebook (edit: editor). 202
/// while it starts; 200 for a session that already ran. Under an exclusive editor held by
/// someone else: 409 `editor_claimed`. `mode: app` (viewer) admits one visit to the
/// notebook's app pool (seed 003): the answer's `app_assignment` names its sandbox and slot;
/// a full pool answers 429 `app_pool_full` with `Retry-After`.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/sessions", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = CreateSession,
    responses((status = 200, body = OpenedSessionEnvelope), (status = 201, body = OpenedSessionEnvelope), (status = 202, body = OpenedSessionEnvelope),
        (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope), (status = 429, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn create_session(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    body: axum::body::Bytes,
) -> HubResult<Response> {
    let req: CreateSession = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSession::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HubError::invalid(format!("invalid body: {e}")))?
    };
    let mode = req.mode.unwrap_or(SessionMode::Edit);
    if mode == SessionMode::App {
        let admitted = hub
            .admit_visit(&user, &pid, &nid, req.app_visit_id.as_deref())
            .await?;
        let view = hub.session_view(&user, &admitted.session).await;
        return Ok(hub.admitted(admitted, view));
    }
    if req.app_visit_id.is_some() {
        return Err(HubError::invalid("app_visit_id belongs to mode app"));
    }
    let (row, how) = hub.open_session(&user, &pid, &nid, mode).await?;
    let status = match (how, row.status) {
        (_, SessionStatus::Starting) => StatusCode::ACCEPTED,
        (Opened::Created, _) => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok(ok_status(status, hub.session_view(&user, &row).await))
}

/// One session (viewer of the project).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/sessions/{sid}", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = SessionEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn get_session(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, sid)): P<(ProjectId, NotebookId, SessionId)>,
) -> HubResult<Response> {
    let row = hub.visible_session(&user, &pid, &nid, &sid).await?;
    Ok(ok(hub.session_view(&user, &row).await))
}

/// Keeps a session alive (its user, or a shared editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/sessions/{sid}/heartbeat", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = SessionEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn heartbeat(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, sid)): P<(ProjectId, NotebookId, SessionId)>,
) -> HubResult<Response> {
    let row = hub.visible_session(&user, &pid, &nid, &sid).await?;
    if !hub.may_use_session(&user, &row).await? {
        return Err(HubError::forbidden(
            "only the session's user keeps it alive",
        ));
    }
    hub.heartbeat(&row).await?;
    if row.mode == SessionMode::App {
        hub.renew_visits_on(&user, &row).await?;
    }
    let row = hub.store.session(&sid).await?.unwrap_or(row);
    Ok(ok(hub.session_view(&user, &row).await))
}

/// Ends a session: saves its changes (edit sessions of local notebooks), stops the sandbox
/// and retires the record (its user, or a manager of the project). 503 if the save failed:
/// the session keeps running; retry.
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/notebooks/{nid}/sessions/{sid}", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("sid" = String, Path)),
    responses((status = 200, body = SessionEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn delete_session(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, sid)): P<(ProjectId, NotebookId, SessionId)>,
    req: Request,
) -> HubResult<Response> {
    let row = hub.visible_session(&user, &pid, &nid, &sid).await?;
    if row.user_id != user.id {
        hub.project_for(&user, &pid, Role::Manager).await?;
    }
    match hub.owner_of(&row) {
        Owner::Here(live) => hub.end_session(&live, End::Deleted).await?,
        Owner::There(url) => return proxy::forward_to_owner(&hub, &url, req).await,
        Owner::Gone => hub.retire_unowned(&row).await?,
    }
    let row = hub.store.session(&sid).await?.unwrap_or(row);
    Ok(ok(hub.session_view(&user, &row).await))
}

/// Who holds the notebook's persistent editor (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/editor-session", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = EditorClaimEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn editor_session(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
) -> HubResult<Response> {
    Ok(ok(hub.editor_claim(&user, &pid, &nid).await?))
}

/// Takes over the notebook's editor (editor): the holder's changes are saved and its sandbox
/// stopped; then the editor is `ready` for the caller, who creates their session next.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/editor-session/takeover", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = EditorClaimEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
        (status = 409, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn takeover(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
    req: Request,
) -> HubResult<Response> {
    hub.notebook_for(&user, &pid, &nid, Role::Editor).await?;
    if let Some(holder) = hub.takeover_target(&nid).await? {
        match hub.owner_of(&holder) {
            Owner::There(url) => return proxy::forward_to_owner(&hub, &url, req).await,
            Owner::Gone => hub.retire_unowned(&holder).await?,
            Owner::Here(_) => {}
        }
    }
    Ok(ok(hub.take_over_editor(&user, &pid, &nid).await?))
}

/// The rendered notebook a session's teardown attached to a version (viewer), sandboxed.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/html", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("vid" = String, Path)),
    responses((status = 200, description = "The HTML snapshot", content_type = "text/html"), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn version_html(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, vid)): P<(ProjectId, NotebookId, VersionId)>,
) -> HubResult<Response> {
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let v = hub.version_by_id(&nb, &vid).await?;
    hub.loadable(&nb, Some(v.revision)).await?;
    let snap = hub
        .store
        .version_by_id(&nid, &vid)
        .await?
        .and_then(|v| v.row.snapshots.html)
        .ok_or_else(|| HubError::not_found("this version has no HTML snapshot"))?;
    stream_snapshot(
        &hub,
        &pid,
        snap.node,
        u64::try_from(snap.bytes).unwrap_or(0),
    )
}
