//! A project's invitations by email (managers).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::envelope::{Empty, EmptyEnvelope, ErrorEnvelope, envelope};
use super::extract::{Caller, JsonBody, P, spawn};
use crate::Hub;
use crate::error::{HubResult, ok, ok_status};
use crate::ids::ProjectId;
use crate::invitations::{InvitationView, Invite, InviteStatus, Invited};

envelope!(InvitedEnvelope, Invited);
envelope!(InvitationsEnvelope, Vec<InvitationView>);

/// Invites an email to a project with a role (manager). If a user has that email they become a
/// member now (200, `status: member`); else the invitation waits until a user with that email
/// is created or first signs in (201, `status: invited`). Inviting an email again replaces its
/// role.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/invitations", tag = "projects",
    params(("pid" = String, Path)), request_body = Invite,
    responses((status = 200, body = InvitedEnvelope), (status = 201, body = InvitedEnvelope), (status = 403, body = ErrorEnvelope),
        (status = 404, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn invite(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    JsonBody(req): JsonBody<Invite>,
) -> HubResult<Response> {
    let h = hub.clone();
    let done = spawn(async move { h.invite(&user, &pid, req).await }).await?;
    Ok(match done.status {
        InviteStatus::Member => ok(done),
        InviteStatus::Invited => ok_status(StatusCode::CREATED, done),
    })
}

/// A project's open invitations, by email (manager).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/invitations", tag = "projects",
    params(("pid" = String, Path)),
    responses((status = 200, body = InvitationsEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn list_invitations(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    Ok(ok(hub.invitations(&user, &pid).await?))
}

/// Withdraws an open invitation (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/invitations/{email}", tag = "projects",
    params(("pid" = String, Path), ("email" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn withdraw_invitation(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, email)): P<(ProjectId, String)>,
) -> HubResult<Response> {
    hub.withdraw_invitation(&user, &pid, &email).await?;
    Ok(ok(Empty {}))
}
