//! Projects: the list, one project, its changes, members and trash.

use axum::extract::State;
use axum::response::Response;

use super::envelope::{Empty, EmptyEnvelope, ErrorEnvelope, Page, PageQuery, envelope, page};
use super::extract::{Caller, CreateBody, JsonBody, P, Q, spawn};
use crate::Hub;
use crate::catalog::{Member, Role};
use crate::error::{HubError, HubResult, ok};
use crate::ids::ProjectId;
use crate::notebooks::{NotebookView, TrashEntry};
use crate::project_trash::TrashedProject;
use crate::projects::{CreateProject, ProjectView, PutMember, UpdateProject};

envelope!(ProjectEnvelope, ProjectView);
envelope!(ProjectPageEnvelope, Page<ProjectView>);
envelope!(MembersEnvelope, Vec<Member>);
envelope!(TrashEnvelope, Vec<TrashEntry>);
envelope!(NotebookEnvelope, NotebookView);
envelope!(TrashedProjectsEnvelope, Vec<TrashedProject>);

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

/// Creates a project; the caller becomes its owner. With an `Idempotency-Key`, a retry (same
/// key, same body, within 24 hours) answers what the first create answered, marked
/// `Idempotency-Replayed: true`, and creates nothing; the same key with another body is 422
/// `idempotency_key_reused`.
#[utoipa::path(post, path = "/api/v1/projects", tag = "projects", request_body = CreateProject,
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 printable ASCII characters; a retry with the same key and body answers the first create's answer")),
    responses((status = 201, body = ProjectEnvelope, headers(("idempotency-replayed" = String, description = "`true` when the answer is a replay"))),
        (status = 401, body = ErrorEnvelope), (status = 403, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn create_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    CreateBody { body, key }: CreateBody<CreateProject>,
) -> HubResult<Response> {
    let key = key.map(|k| k.bind(&user.id, "POST /api/v1/projects".to_string()));
    let h = hub.clone();
    spawn(async move { h.create_project(&user, body, key.as_ref()).await })
        .await?
        .into_response()
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

/// Moves a project, with every notebook and version it holds, to the trash (manager): it is
/// restorable until the maintenance pass purges it (`UNICAS_HUB_PROJECT_TRASH_RETENTION`,
/// default 30 days); 409 while sessions run on its notebooks.
#[utoipa::path(delete, path = "/api/v1/projects/{pid}", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
pub async fn delete_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    let h = hub.clone();
    spawn(async move { h.trash_project(&user, &pid).await }).await?;
    Ok(ok(Empty {}))
}

/// Projects in the trash that the caller manages, most recently deleted first.
#[utoipa::path(get, path = "/api/v1/projects/trash", tag = "projects",
    responses((status = 200, body = TrashedProjectsEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn list_trashed_projects(
    State(hub): State<Hub>,
    Caller(user): Caller,
) -> HubResult<Response> {
    Ok(ok(hub.trashed_projects(&user).await?))
}

/// Brings a project back from the trash with everything it held (manager).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/restore", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = ProjectEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn restore_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    let h = hub.clone();
    Ok(ok(spawn(
        async move { h.restore_project(&user, &pid).await },
    )
    .await?))
}

/// Purges a project in the trash now (manager): every root of its notebooks' histories is
/// released; CAS garbage collection frees what nothing else references.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/purge", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
pub async fn purge_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    P(pid): P<ProjectId>,
) -> HubResult<Response> {
    let h = hub.clone();
    spawn(async move { h.purge_project_now(&user, &pid).await }).await?;
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
