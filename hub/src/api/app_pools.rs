//! App pools (seed 003): admission rides on `POST …/sessions` with `mode: app`; here are a
//! visit's heartbeat and departure, the pool's members, and stopping or restarting one.

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::envelope::{Empty, EmptyEnvelope, ErrorEnvelope, envelope};
use super::extract::{Caller, P};
use crate::Hub;
use crate::app_pools::{Admitted, AppAssignment, PoolView, Routed};
use crate::auth::User;
use crate::error::{HubResult, ok, ok_status};
use crate::ids::{NotebookId, ProjectId, SessionId};
use crate::proxy;
use crate::sessions::lifecycle::Owner;
use crate::sessions::view::SessionView;
use crate::store::sessions::SessionStatus;

/// A session as a create answers it: for `mode: app`, with the visit's slot and the pool's
/// occupancy (`users`, `max_users` and `max_users_per_session` count visit slots).
#[derive(Serialize, ToSchema)]
pub struct OpenedSession {
    #[serde(flatten)]
    pub session: SessionView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_assignment: Option<AppAssignment>,
    /// Slots in use on the assigned sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub users: Option<usize>,
    /// Slots of the notebook's current version (absent: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_users: Option<u64>,
    /// Slots per sandbox (absent: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_users_per_session: Option<u64>,
}

envelope!(OpenedSessionEnvelope, OpenedSession);
envelope!(AssignmentEnvelope, AppAssignment);
envelope!(PoolEnvelope, PoolView);
envelope!(ReplacementEnvelope, SessionId);

impl Hub {
    /// The answer of an app admission: 202 while the sandbox starts, 201 when this visit
    /// reserved it, else 200.
    pub(crate) fn admitted(&self, a: Admitted, session: SessionView) -> Response {
        let s = &self.config.sessions;
        let status = match (a.session.status, a.assignment.routed) {
            (SessionStatus::Starting, _) => StatusCode::ACCEPTED,
            (_, Routed::Started) => StatusCode::CREATED,
            _ => StatusCode::OK,
        };
        ok_status(
            status,
            OpenedSession {
                session,
                app_assignment: Some(a.assignment),
                users: Some(a.users),
                max_users: s.app_max_visits.zip(s.app_max_sessions).map(|(v, n)| v * n),
                max_users_per_session: s.app_max_visits,
            },
        )
    }
}

/// The pool of a notebook's app (viewer): each sandbox with its revision, state and visits.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/app-pool", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = PoolEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn get_pool(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid)): P<(ProjectId, NotebookId)>,
) -> HubResult<Response> {
    Ok(ok(hub.app_pool(&user, &pid, &nid).await?))
}

/// Keeps the caller's visit slot (every 30 seconds while the page is open): renews its lease
/// once half of it has passed, and ends a departure's grace. 404 once the slot is released:
/// admit the visit again.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/app-pool/visits/{visit_id}/heartbeat", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("visit_id" = String, Path)),
    responses((status = 200, body = AssignmentEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn visit_heartbeat(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, visit)): P<(ProjectId, NotebookId, String)>,
) -> HubResult<Response> {
    Ok(ok(hub.visit_heartbeat(&user, &pid, &nid, &visit).await?))
}

/// The caller's page left: its slot is kept for a reconnect grace (15 seconds), then released.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/app-pool/visits/{visit_id}/departure", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("visit_id" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn visit_departure(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, visit)): P<(ProjectId, NotebookId, String)>,
) -> HubResult<Response> {
    hub.depart(&user, &pid, &nid, &visit).await?;
    Ok(ok(Empty {}))
}

/// Checks that the caller is an editor, then sends a request about `sandbox` to the hub
/// process that runs it if another does (its answer), else hands it back.
async fn here_or_owner(
    hub: &Hub,
    user: &User,
    (pid, nid, sandbox): (&ProjectId, &NotebookId, &SessionId),
    req: Request,
) -> HubResult<Option<Response>> {
    hub.notebook_for(user, pid, nid, crate::catalog::Role::Editor)
        .await?;
    if let Some(row) = hub.store.session(sandbox).await?
        && let Owner::There(url) = hub.owner_of(&row)
    {
        return Ok(Some(proxy::forward_to_owner(hub, &url, req).await?));
    }
    Ok(None)
}

/// Stops one sandbox of the pool (editor); its visits must be admitted again.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/app-pool/members/{sandbox_id}/stop", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("sandbox_id" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn stop_member(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, sandbox)): P<(ProjectId, NotebookId, SessionId)>,
    req: Request,
) -> HubResult<Response> {
    if let Some(forwarded) = here_or_owner(&hub, &user, (&pid, &nid, &sandbox), req).await? {
        return Ok(forwarded);
    }
    hub.stop_member(&user, &pid, &nid, &sandbox).await?;
    Ok(ok(Empty {}))
}

/// Restarts one sandbox of the pool (editor): a replacement is reserved on the current
/// revision, the old sandbox reclaimed, then the replacement started; repeating it answers the
/// same replacement. Its visits must be admitted again.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/app-pool/members/{sandbox_id}/restart", tag = "sessions",
    params(("pid" = String, Path), ("nid" = String, Path), ("sandbox_id" = String, Path)),
    responses((status = 200, body = ReplacementEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
        (status = 429, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn restart_member(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, nid, sandbox)): P<(ProjectId, NotebookId, SessionId)>,
    req: Request,
) -> HubResult<Response> {
    if let Some(forwarded) = here_or_owner(&hub, &user, (&pid, &nid, &sandbox), req).await? {
        return Ok(forwarded);
    }
    Ok(ok(hub.restart_member(&user, &pid, &nid, &sandbox).await?))
}
