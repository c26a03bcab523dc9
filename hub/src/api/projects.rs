//! Projects: the list, one project, its changes, members and trash.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::envelope::{Empty, EmptyEnvelope, ErrorEnvelope, Page, PageQuery, envelope, page};
use super::extract::{Caller, JsonBody, P, Q};
use crate::Hub;
use crate::catalog::{Member, Role};
use crate::error::{HubError, HubResult, ok, ok_status};
use crate::ids::ProjectId;
use crate::notebooks::{NotebookView, TrashEntry};
use crate::projects::{CreateProject, ProjectView, PutMember, UpdateProject};

envelope!(ProjectEnvelope, ProjectView);
envelope!(ProjectPageEnvelope, Page<ProjectView>);
envelope!(MembersEnvelope, Vec<Member>);
envelope!(TrashEnvelope, Vec<TrashEntry>);
envelope!(NotebookEnvelope, NotebookView);

/// Projects the caller can see, oldest first.
#[utoipa::path(get, path = "/api/v1/projects", tag = "projects", params(PageQuery),
    responses((status = 200, body = ProjectPageEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn list_projects(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    let cat = hub.catalog().await?;
    let visible: Vec<ProjectView> = cat
        .projects()
        .filter_map(|p| hub.project_view(&user, p))
        .collect();
    Ok(ok(page(visible, &q, |p| p.id.to_string())))
}

/// Creates a project; the caller becomes its owner.
#[utoipa::path(post, path = "/api/v1/projects", tag = "projects", request_body = CreateProject,
    responses((status = 201, body = ProjectEnvelope), (status = 401, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn create_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    JsonBody(req): JsonBody<CreateProject>,
) -> HubResult<Response> {
    Ok(ok_status(
        StatusCode::CREATED,
        hub.create_project(&user, req).await?,
    ))
}

/// One project (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = ProjectEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn get_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    let (cat, _) = hub.project_for(&user, &pid, Role::Viewer).await?;
    let p = cat.project(&pid).and_then(|p| hub.project_view(&user, p));
    p.map(ok)
        .ok_or_else(|| HubError::not_found(format!("project {pid} not found")))
}

/// Updates a project (manager).
#[utoipa::path(patch, path = "/api/v1/projects/{pid}", tag = "projects", params(("pid" = String, Path)), request_body = UpdateProject,
    responses((status = 200, body = ProjectEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn update_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    JsonBody(req): JsonBody<UpdateProject>,
) -> HubResult<Response> {
    Ok(ok(hub.update_project(&user, &pid, req).await?))
}

/// Deletes an empty project (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn delete_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    hub.delete_project(&user, &pid).await?;
    Ok(ok(Empty {}))
}

/// Adds a member or changes their role (manager).
#[utoipa::path(put, path = "/api/v1/projects/{pid}/members", tag = "projects", params(("pid" = String, Path)), request_body = PutMember,
    responses((status = 200, body = ProjectEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn put_member(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
    JsonBody(req): JsonBody<PutMember>,
) -> HubResult<Response> {
    Ok(ok(hub.put_member(&user, &pid, req).await?))
}

/// Removes a member (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/members/{user_id}", tag = "projects",
    params(("pid" = String, Path), ("user_id" = String, Path)),
    responses((status = 200, body = MembersEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn remove_member(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, member)): P<(ProjectId, String)>,
) -> HubResult<Response> {
    Ok(ok(hub.remove_member(&user, &pid, &member).await?))
}

/// Notebooks in the trash, newest first (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/trash", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = TrashEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn list_trash(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    Ok(ok(hub.list_trash(&user, &pid).await?))
}

/// Restores a trashed notebook under its title with every revision (manager); refused if a live
/// notebook has the title.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/trash/{token}/restore", tag = "projects",
    params(("pid" = String, Path), ("token" = String, Path)),
    responses((status = 200, body = NotebookEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn restore_trash(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, token)): P<(ProjectId, String)>,
) -> HubResult<Response> {
    Ok(ok(hub.restore_trash(&user, &pid, &token).await?))
}

/// Purges a trashed notebook: releases every root of its history (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/trash/{token}", tag = "projects",
    params(("pid" = String, Path), ("token" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn purge_trash(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P((pid, token)): P<(ProjectId, String)>,
) -> HubResult<Response> {
    hub.purge_trash(&user, &pid, &token).await?;
    Ok(ok(Empty {}))
}
