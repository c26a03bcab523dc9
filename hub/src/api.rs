//! The HTTP API under `/api/v1` (and push sync at `/api/sync/git/v1`), with its OpenAPI
//! document at `/api/v1/doc`. Every JSON answer is the seed-000 envelope.

use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sqlx::Row;
use tokio_util::io::{ReaderStream, StreamReader};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::Hub;
use crate::auth::{TokenView, User, bearer};
use crate::catalog::{Member, NotebookEntry, Role};
use crate::error::{HubError, HubResult, ok, ok_status};
use crate::ids;
use crate::notebooks::{
    BranchRequest, CreateNotebook, CreateProject, CreatedNotebook, ForkRequest, NotebookView,
    ProjectView, PutMember, TrashEntry, Trashed, UpdateNotebook, UpdateProject,
};
use crate::sync::Synced;
use crate::workspace::{
    Committed, ListedEntry, SaveRequest, StagedFile, VersionView, project_space,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "UniCAS notebook hub",
        description = "Projects, notebooks, workspaces and versions, stored as content-addressed nodes. \
            Every JSON answer is an envelope: `{\"success\": true, \"data\": …}` or \
            `{\"success\": false, \"error\": {\"code\", \"message\", …}}`."
    ),
    modifiers(&TokenScheme),
    tags(
        (name = "catalog", description = "The whole project and notebook index in one read"),
        (name = "projects", description = "Projects, members, events, storage, trash"),
        (name = "notebooks", description = "Notebooks, workspaces, versions, forks, export and import"),
        (name = "sync", description = "Push sync from an external workflow"),
        (name = "auth", description = "The caller and personal access tokens"),
        (name = "system", description = "Health"),
    )
)]
struct ApiDoc;

struct TokenScheme;

impl utoipa::Modify for TokenScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("A personal access token, `uhub_pat_…`"))
                    .build(),
            ),
        );
        c.add_security_scheme(
            "sync_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("A notebook's sync token, `uhub_sync_…`"))
                    .build(),
            ),
        );
    }
}

/// The error envelope.
#[derive(Serialize, ToSchema)]
pub struct ErrorEnvelope {
    pub success: bool,
    pub error: ErrorInfo,
}

/// `code` is stable: `UNAUTHORIZED`, `FORBIDDEN`, `NOT_FOUND`, `CONFLICT`, `VALIDATION_ERROR`,
/// `PAYLOAD_TOO_LARGE`, `INTERNAL_ERROR`, `UNAVAILABLE`, `workspace_conflict` (with
/// `actual_revision`, `expected_revision`, `reason`), `workspace_busy` (with `name`,
/// `timeout_seconds`), `revision_pruned` (with `revision`), `name_taken` (with `title`).
#[derive(Serialize, ToSchema)]
pub struct ErrorInfo {
    pub code: String,
    pub message: String,
}

macro_rules! envelope {
    ($name:ident, $t:ty) => {
        #[derive(Serialize, ToSchema)]
        #[allow(dead_code)]
        pub struct $name {
            pub success: bool,
            pub data: $t,
        }
    };
}

envelope!(CatalogEnvelope, CatalogView);
envelope!(ProjectEnvelope, ProjectView);
envelope!(ProjectPageEnvelope, Page<ProjectView>);
envelope!(NotebookEnvelope, NotebookView);
envelope!(NotebookPageEnvelope, Page<NotebookView>);
envelope!(CreatedNotebookEnvelope, CreatedNotebook);
envelope!(CommittedEnvelope, Committed);
envelope!(WorkspaceEnvelope, WorkspaceView);
envelope!(VersionPageEnvelope, Page<VersionView>);
envelope!(VersionEnvelope, WorkspaceView);
envelope!(TrashedEnvelope, Trashed);
envelope!(TrashEnvelope, Vec<TrashEntry>);
envelope!(MembersEnvelope, Vec<Member>);
envelope!(EventPageEnvelope, Page<EventView>);
envelope!(StorageEnvelope, StorageView);
envelope!(StagedEnvelope, StagedFile);
envelope!(SyncedEnvelope, Synced);
envelope!(SyncTokenEnvelope, SyncTokenView);
envelope!(MeEnvelope, User);
envelope!(TokensEnvelope, Vec<TokenView>);
envelope!(NewTokenEnvelope, NewToken);
envelope!(GcEnvelope, GcView);
envelope!(EmptyEnvelope, Empty);

#[derive(Serialize, ToSchema)]
pub struct Empty {}

/// A page of a list, newest or first by the route's order.
#[derive(Serialize, ToSchema)]
pub struct Page<T: ToSchema> {
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; `null` at the end.
    pub next_cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub struct CatalogProject {
    #[serde(flatten)]
    pub project: ProjectView,
    pub notebooks: Vec<NotebookEntry>,
}

#[derive(Serialize, ToSchema)]
pub struct CatalogView {
    pub snapshot_id: String,
    pub created_at: String,
    pub projects: Vec<CatalogProject>,
}

#[derive(Serialize, ToSchema)]
pub struct WorkspaceView {
    pub version: VersionView,
    pub entries: Vec<ListedEntry>,
}

#[derive(Serialize, ToSchema)]
pub struct EventView {
    pub id: String,
    pub ts: String,
    pub event: String,
    pub actor: String,
    pub project_id: Option<String>,
    pub notebook_id: Option<String>,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// CAS usage of the project's Space beside the logical bytes of what it retains.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageView {
    pub project_id: String,
    pub node_count: i64,
    pub ready_content_bytes: i64,
    pub ready_stored_bytes: i64,
    /// Sum of the file sizes of every kept version, as full copies would store them.
    pub logical_bytes: i64,
    pub kept_versions: i64,
    pub pruned_versions: i64,
    /// `logicalBytes / readyStoredBytes`.
    pub dedup_ratio: f64,
}

#[derive(Serialize, ToSchema)]
pub struct SyncTokenView {
    pub sync_token: String,
}

#[derive(Serialize, ToSchema)]
pub struct NewToken {
    /// Shown this once.
    pub token: String,
    #[serde(flatten)]
    pub info: TokenView,
}

#[derive(Serialize, ToSchema)]
pub struct GcView {
    pub examined: u64,
    pub deleted: u64,
    pub reclaimed_content_bytes: u64,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenRequest {
    pub name: String,
    /// Lifetime in days (default: no expiry).
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// If given, the restore is refused unless the head is still this revision.
    #[serde(default)]
    pub expected_revision: Option<i64>,
}

#[derive(Deserialize, IntoParams, Default)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// At most 1000; default 100.
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

#[derive(Deserialize, IntoParams, Default)]
#[into_params(parameter_in = Query)]
pub struct RevisionQuery {
    /// Default: the head.
    pub revision: Option<i64>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// The new notebook's title.
    pub title: String,
}

/// The authenticated caller.
pub struct Caller(pub User);

impl FromRequestParts<Hub> for Caller {
    type Rejection = HubError;
    async fn from_request_parts(parts: &mut Parts, hub: &Hub) -> Result<Self, HubError> {
        hub.authenticate(&parts.headers).await.map(Caller)
    }
}

/// A JSON body; a bad one is a 422 envelope.
pub struct JsonBody<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<Hub> for JsonBody<T> {
    type Rejection = HubError;
    async fn from_request(req: Request, hub: &Hub) -> Result<Self, HubError> {
        match Json::<T>::from_request(req, hub).await {
            Ok(Json(v)) => Ok(JsonBody(v)),
            Err(JsonRejection::BytesRejection(e))
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(HubError::too_large(
                    "the JSON body is too large; stage large files with an upload",
                ))
            }
            Err(e) => Err(HubError::invalid(e.body_text())),
        }
    }
}

/// Query parameters; bad ones are a 422 envelope.
pub struct Q<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send> FromRequestParts<Hub> for Q<T> {
    type Rejection = HubError;
    async fn from_request_parts(parts: &mut Parts, hub: &Hub) -> Result<Self, HubError> {
        match axum::extract::Query::<T>::from_request_parts(parts, hub).await {
            Ok(axum::extract::Query(v)) => Ok(Q(v)),
            Err(e @ QueryRejection::FailedToDeserializeQueryString(_)) => {
                Err(HubError::invalid(e.body_text()))
            }
            Err(e) => Err(HubError::invalid(e.body_text())),
        }
    }
}

fn check_pid(pid: &str) -> HubResult<()> {
    if ids::valid("proj-", pid) {
        Ok(())
    } else {
        Err(HubError::not_found(format!("project {pid} not found")))
    }
}

fn check_nid(nid: &str) -> HubResult<()> {
    if ids::valid("nb-", nid) {
        Ok(())
    } else {
        Err(HubError::not_found(format!("notebook {nid} not found")))
    }
}

fn limit_of(q: &PageQuery) -> usize {
    q.limit.unwrap_or(100).clamp(1, 1000) as usize
}

fn body_reader(body: Body) -> impl tokio::io::AsyncRead + Unpin + Send + 'static {
    StreamReader::new(body.into_data_stream().map_err(std::io::Error::other))
}

fn content_type_of(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("py") => "text/x-python; charset=utf-8",
        Some("md") => "text/markdown; charset=utf-8",
        Some("txt") | Some("toml") | Some("cfg") | Some("ini") | Some("lock") => {
            "text/plain; charset=utf-8"
        }
        Some("json") | Some("ipynb") => "application/json",
        Some("html") | Some("htm") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("csv") => "text/csv; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg") | Some("jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("yaml") | Some("yml") => "application/yaml",
        _ => "application/octet-stream",
    }
}

/// Streams the file at `path` of version `v`. A URL that names a revision or version is
/// immutable; the head (`immutable` false) is revalidated with its ETag. Files are the users'
/// data: never sniffed, always sandboxed, and active types (HTML, SVG, scripts, XML) are
/// served as attachments, so nothing stored can run with the API's origin.
async fn stream_file(
    hub: &Hub,
    pid: &str,
    v: &VersionView,
    path: &str,
    immutable: bool,
    headers: &HeaderMap,
) -> HubResult<Response> {
    let file = hub.file_at(pid, v, path).await?;
    let etag = format!("\"{}\"", file.node);
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if matches {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let space = project_space(pid)?;
        let (mut writer, reader) = tokio::io::duplex(256 << 10);
        let cas = hub.cas.clone();
        tokio::spawn(async move {
            if let Err(e) = cas.read_file_ref(&space, &file, &mut writer).await {
                tracing::warn!(error = %e, "streaming a file failed");
            }
        });
        let mut r =
            Body::from_stream(ReaderStream::with_capacity(reader, 256 << 10)).into_response();
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(file.size));
        r
    };
    let content_type = content_type_of(path);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if immutable {
            "private, max-age=31536000, immutable"
        } else {
            "private, no-cache"
        }),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
    if cas_service::web_guard::is_active_type(content_type) {
        let name: String = path
            .rsplit('/')
            .next()
            .unwrap_or("file")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    Ok(resp)
}

/// Answers a version and its workspace listing as the envelope, streaming the entries as the
/// tree is walked: the answer's memory does not grow with the tree.
async fn stream_workspace(hub: &Hub, pid: &str, version: VersionView) -> HubResult<Response> {
    let space = project_space(pid)?;
    let tree: cas_format::Hash = version
        .tree
        .parse()
        .map_err(|e| HubError::internal("a stored hash is invalid", e))?;
    let head = serde_json::to_vec(&version)
        .map_err(|e| HubError::internal("cannot encode a version", e))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(8);
    let (started_tx, started) = tokio::sync::oneshot::channel::<HubResult<()>>();
    let cas = hub.cas.clone();
    tokio::spawn(async move {
        let mut walk = match cas
            .walk(&space, &tree, cas_client::TreeLimits::default())
            .await
        {
            Ok(w) => {
                let _ = started_tx.send(Ok(()));
                w
            }
            Err(e) => {
                let _ = started_tx.send(Err(crate::workspace::edit_error(e)));
                return;
            }
        };
        let mut buf = b"{\"success\":true,\"data\":{\"version\":".to_vec();
        buf.extend_from_slice(&head);
        buf.extend_from_slice(b",\"entries\":[");
        let mut first = true;
        loop {
            match walk.next().await {
                Ok(Some(w)) => {
                    if !first {
                        buf.push(b',');
                    }
                    first = false;
                    if serde_json::to_writer(&mut buf, &ListedEntry::from(w)).is_err() {
                        return;
                    }
                    if buf.len() >= 64 << 10
                        && tx.send(Ok(std::mem::take(&mut buf).into())).await.is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "a workspace listing stopped half way");
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            }
        }
        buf.extend_from_slice(b"]}}");
        let _ = tx.send(Ok(buf.into())).await;
    });
    started
        .await
        .map_err(|e| HubError::internal("the listing task failed", e))??;
    let mut resp = Body::from_stream(tokio_stream_of(rx)).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// A stream of what a channel receives.
fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

// ---------- system ----------

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "system", responses((status = 200, description = "alive")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the hub database and the content store answer.
#[utoipa::path(get, path = "/readyz", tag = "system",
    responses((status = 200, description = "ready"), (status = 503, body = ErrorEnvelope)))]
async fn readyz(State(hub): State<Hub>) -> HubResult<&'static str> {
    sqlx::query("SELECT 1").execute(&hub.db.pool).await?;
    hub.catalog().await?;
    Ok("ready")
}

// ---------- catalog ----------

/// Every project the caller can see with its notebooks, from one read of the current snapshot.
#[utoipa::path(get, path = "/api/v1/catalog", tag = "catalog",
    responses((status = 200, body = CatalogEnvelope), (status = 401, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn get_catalog(State(hub): State<Hub>, Caller(user): Caller) -> HubResult<Response> {
    let cat = hub.catalog().await?;
    let projects = cat
        .projects()
        .filter_map(|p| {
            hub.project_view(&user, p).map(|view| CatalogProject {
                project: view,
                notebooks: p
                    .notebooks
                    .iter()
                    .filter(|n| n.status != "deleted")
                    .cloned()
                    .collect(),
            })
        })
        .collect();
    Ok(ok(CatalogView {
        snapshot_id: cat.snapshot_id.clone(),
        created_at: cat.created_at.clone(),
        projects,
    }))
}

// ---------- auth ----------

/// The caller.
#[utoipa::path(get, path = "/api/v1/auth/me", tag = "auth",
    responses((status = 200, body = MeEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
async fn me(Caller(user): Caller) -> HubResult<Response> {
    Ok(ok(user))
}

/// The caller's live personal access tokens.
#[utoipa::path(get, path = "/api/v1/auth/tokens", tag = "auth",
    responses((status = 200, body = TokensEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
async fn list_tokens(State(hub): State<Hub>, Caller(user): Caller) -> HubResult<Response> {
    Ok(ok(hub.list_tokens(&user.id).await?))
}

/// Creates a personal access token for the caller; the token is in this answer only.
#[utoipa::path(post, path = "/api/v1/auth/tokens", tag = "auth", request_body = NewTokenRequest,
    responses((status = 201, body = NewTokenEnvelope), (status = 401, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn create_token(
    State(hub): State<Hub>,
    Caller(user): Caller,
    JsonBody(req): JsonBody<NewTokenRequest>,
) -> HubResult<Response> {
    let ttl = req.expires_in_days.map(|d| i64::from(d) * 86_400_000);
    let (token, info) = hub.create_token(&user.id, &req.name, ttl).await?;
    Ok(ok_status(StatusCode::CREATED, NewToken { token, info }))
}

/// Revokes one of the caller's tokens.
#[utoipa::path(delete, path = "/api/v1/auth/tokens/{token_id}", tag = "auth",
    params(("token_id" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn revoke_token(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(token_id): Path<String>,
) -> HubResult<Response> {
    hub.revoke_token(&user.id, &token_id).await?;
    Ok(ok(Empty {}))
}

// ---------- projects ----------

/// Projects the caller can see, oldest first.
#[utoipa::path(get, path = "/api/v1/projects", tag = "projects", params(PageQuery),
    responses((status = 200, body = ProjectPageEnvelope), (status = 401, body = ErrorEnvelope)), security(("token" = [])))]
async fn list_projects(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    let cat = hub.catalog().await?;
    let visible: Vec<ProjectView> = cat
        .projects()
        .filter_map(|p| hub.project_view(&user, p))
        .collect();
    Ok(ok(page(visible, &q, |p| p.id.clone())))
}

/// Pages a list in its order by the id of the last item seen.
fn page<T: ToSchema>(items: Vec<T>, q: &PageQuery, id: impl Fn(&T) -> String) -> Page<T> {
    let start = match &q.cursor {
        Some(c) => items
            .iter()
            .position(|i| id(i) == *c)
            .map_or(items.len(), |p| p + 1),
        None => 0,
    };
    let limit = limit_of(q);
    let mut rest: Vec<T> = items.into_iter().skip(start).collect();
    let more = rest.len() > limit;
    rest.truncate(limit);
    let next_cursor = if more { rest.last().map(&id) } else { None };
    Page {
        items: rest,
        next_cursor,
    }
}

/// Creates a project; the caller becomes its owner.
#[utoipa::path(post, path = "/api/v1/projects", tag = "projects", request_body = CreateProject,
    responses((status = 201, body = ProjectEnvelope), (status = 401, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn create_project(
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
async fn get_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    let (cat, _) = hub.project_for(&user, &pid, Role::Viewer).await?;
    let p = cat.project(&pid).and_then(|p| hub.project_view(&user, p));
    p.map(ok)
        .ok_or_else(|| HubError::not_found(format!("project {pid} not found")))
}

/// Updates a project (manager).
#[utoipa::path(patch, path = "/api/v1/projects/{pid}", tag = "projects", params(("pid" = String, Path)), request_body = UpdateProject,
    responses((status = 200, body = ProjectEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn update_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    JsonBody(req): JsonBody<UpdateProject>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    Ok(ok(hub.update_project(&user, &pid, req).await?))
}

/// Deletes an empty project (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn delete_project(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    hub.delete_project(&user, &pid).await?;
    Ok(ok(Empty {}))
}

/// Adds a member or changes their role (manager).
#[utoipa::path(put, path = "/api/v1/projects/{pid}/members", tag = "projects", params(("pid" = String, Path)), request_body = PutMember,
    responses((status = 200, body = ProjectEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn put_member(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    JsonBody(req): JsonBody<PutMember>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    Ok(ok(hub.put_member(&user, &pid, req).await?))
}

/// Removes a member (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/members/{user_id}", tag = "projects",
    params(("pid" = String, Path), ("user_id" = String, Path)),
    responses((status = 200, body = MembersEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn remove_member(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, member)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    Ok(ok(hub.remove_member(&user, &pid, &member).await?))
}

/// The project's audit events, newest first (manager).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/events", tag = "projects", params(("pid" = String, Path), PageQuery),
    responses((status = 200, body = EventPageEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn list_events(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    hub.project_for(&user, &pid, Role::Manager).await?;
    let limit = limit_of(&q);
    let rows = sqlx::query(
        "SELECT id, project_id, notebook_id, ts_ms, event, actor, detail FROM hub_events \
         WHERE project_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
    )
    .bind(&pid)
    .bind(q.cursor.as_deref().unwrap_or("~"))
    .bind(limit as i64 + 1)
    .fetch_all(&hub.db.pool)
    .await?;
    let mut items = rows
        .iter()
        .map(|r| {
            let detail: String = r.try_get("detail")?;
            Ok(EventView {
                id: r.try_get("id")?,
                ts: ids::rfc3339(r.try_get("ts_ms")?),
                event: r.try_get("event")?,
                actor: r.try_get("actor")?,
                project_id: r.try_get("project_id")?,
                notebook_id: r.try_get("notebook_id")?,
                detail: serde_json::from_str(&detail).unwrap_or(serde_json::Value::Null),
            })
        })
        .collect::<HubResult<Vec<_>>>()?;
    let more = items.len() > limit;
    items.truncate(limit);
    let next_cursor = if more {
        items.last().map(|e| e.id.clone())
    } else {
        None
    };
    Ok(ok(Page { items, next_cursor }))
}

/// CAS usage of the project's Space beside the logical bytes of every kept version (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/storage", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = StorageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn storage(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    hub.project_for(&user, &pid, Role::Viewer).await?;
    let usage = hub.cas.usage(&project_space(&pid)?).await?;
    let row = sqlx::query(
        // Summed as floating point (an imported or legacy row can be huge; an integer SUM
        // would overflow with an error), and clamped below.
        "SELECT CAST(COALESCE(SUM(CASE WHEN state = 'kept' THEN CAST(logical_bytes AS DOUBLE PRECISION) ELSE 0 END), 0) AS DOUBLE PRECISION) AS logical, \
         CAST(COALESCE(SUM(CASE WHEN state = 'kept' THEN 1 ELSE 0 END), 0) AS BIGINT) AS kept, \
         CAST(COALESCE(SUM(CASE WHEN state = 'pruned' THEN 1 ELSE 0 END), 0) AS BIGINT) AS pruned \
         FROM hub_versions WHERE project_id = $1",
    )
    .bind(&pid)
    .fetch_one(&hub.db.pool)
    .await?;
    let logical_f: f64 = row.try_get("logical")?;
    let logical = if logical_f >= i64::MAX as f64 {
        i64::MAX
    } else {
        logical_f.max(0.0) as i64
    };
    Ok(ok(StorageView {
        project_id: pid,
        node_count: usage.node_count,
        ready_content_bytes: usage.ready_content_bytes,
        ready_stored_bytes: usage.ready_stored_bytes,
        logical_bytes: logical,
        kept_versions: row.try_get("kept")?,
        pruned_versions: row.try_get("pruned")?,
        dedup_ratio: if usage.ready_stored_bytes > 0 {
            logical as f64 / usage.ready_stored_bytes as f64
        } else {
            0.0
        },
    }))
}

/// Runs bounded garbage-collection passes on the project's Space in the CAS (manager).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/gc", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = GcEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn gc(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    hub.project_for(&user, &pid, Role::Manager).await?;
    let space = project_space(&pid)?;
    let mut view = GcView {
        examined: 0,
        deleted: 0,
        reclaimed_content_bytes: 0,
    };
    for _ in 0..1000 {
        let pass = hub.cas.gc(&space, Some(1000)).await?;
        view.examined += pass.examined;
        view.deleted += pass.deleted;
        view.reclaimed_content_bytes += pass.reclaimed_content_bytes;
        if pass.deleted == 0 {
            break;
        }
    }
    Ok(ok(view))
}

/// Notebooks in the trash, newest first (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/trash", tag = "projects", params(("pid" = String, Path)),
    responses((status = 200, body = TrashEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn list_trash(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    Ok(ok(hub.list_trash(&user, &pid).await?))
}

/// Restores a trashed notebook under its title with every revision (manager); refused if a live
/// notebook has the title.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/trash/{token}/restore", tag = "projects",
    params(("pid" = String, Path), ("token" = String, Path)),
    responses((status = 200, body = NotebookEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn restore_trash(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, token)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    Ok(ok(hub.restore_trash(&user, &pid, &token).await?))
}

/// Purges a trashed notebook: releases every root of its history (manager).
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/trash/{token}", tag = "projects",
    params(("pid" = String, Path), ("token" = String, Path)),
    responses((status = 200, body = EmptyEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn purge_trash(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, token)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    hub.purge_trash(&user, &pid, &token).await?;
    Ok(ok(Empty {}))
}

/// Stores one file (streamed, chunked when large) for a following save (editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/uploads", tag = "projects", params(("pid" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = StagedEnvelope), (status = 403, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn upload(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    body: Body,
) -> HubResult<Response> {
    check_pid(&pid)?;
    Ok(ok_status(
        StatusCode::CREATED,
        hub.stage_upload(&user, &pid, body_reader(body)).await?,
    ))
}

// ---------- notebooks ----------

/// Live notebooks of a project, oldest first (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks", tag = "notebooks", params(("pid" = String, Path), PageQuery),
    responses((status = 200, body = NotebookPageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn list_notebooks(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    let (cat, _) = hub.project_for(&user, &pid, Role::Viewer).await?;
    let p = cat
        .project(&pid)
        .ok_or_else(|| HubError::not_found("project not found"))?;
    let live: Vec<&NotebookEntry> = p
        .notebooks
        .iter()
        .filter(|n| n.status != "deleted")
        .collect();
    let start = match &q.cursor {
        Some(c) => live
            .iter()
            .position(|n| n.id == *c)
            .map_or(live.len(), |i| i + 1),
        None => 0,
    };
    let limit = limit_of(&q);
    let slice: Vec<&NotebookEntry> = live.iter().skip(start).take(limit + 1).copied().collect();
    let mut items = Vec::with_capacity(slice.len().min(limit));
    for n in slice.iter().take(limit) {
        let row = hub.notebook_row(&n.id).await?;
        items.push(hub.notebook_view(&pid, n, row.as_ref()));
    }
    let next_cursor = (slice.len() > limit)
        .then(|| items.last().map(|n: &NotebookView| n.id.clone()))
        .flatten();
    Ok(ok(Page { items, next_cursor }))
}

/// Creates a notebook (editor). A `git` source with `sync_mode: push` answers its sync token
/// once, as `sync_token`; `files` make the first revision of a local notebook.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks", tag = "notebooks", params(("pid" = String, Path)),
    request_body = CreateNotebook,
    responses((status = 201, body = CreatedNotebookEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
        (status = 409, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn create_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    JsonBody(req): JsonBody<CreateNotebook>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    let h = hub.clone();
    let created = spawn(async move { h.create_notebook(&user, &pid, req).await }).await?;
    Ok(ok_status(StatusCode::CREATED, created))
}

/// Runs a write to its end even if the client goes away, so it never stops half way.
async fn spawn<T: Send + 'static>(
    f: impl std::future::Future<Output = HubResult<T>> + Send + 'static,
) -> HubResult<T> {
    tokio::spawn(f)
        .await
        .map_err(|e| HubError::internal("a write task failed", e))?
}

/// One notebook (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = NotebookEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn get_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    let (entry, row) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    Ok(ok(hub.notebook_view(&pid, &entry, Some(&row))))
}

/// Updates a notebook's metadata (editor); a title is refused if a live notebook has it.
#[utoipa::path(patch, path = "/api/v1/projects/{pid}/notebooks/{nid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = UpdateNotebook,
    responses((status = 200, body = NotebookEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn update_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
    JsonBody(req): JsonBody<UpdateNotebook>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    Ok(ok(hub.update_notebook(&user, &pid, &nid, req).await?))
}

/// Moves a notebook with its whole history to the trash (manager); answers the restore token.
#[utoipa::path(delete, path = "/api/v1/projects/{pid}/notebooks/{nid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = TrashedEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn trash_notebook(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    let h = hub.clone();
    Ok(ok(spawn(async move {
        h.trash_notebook(&user, &pid, &nid).await
    })
    .await?))
}

/// The workspace at a revision (default: the head): the version and every entry (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/workspace", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), RevisionQuery),
    responses((status = 200, body = WorkspaceEnvelope), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn get_workspace(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
    Q(q): Q<RevisionQuery>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
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
async fn save(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
    JsonBody(req): JsonBody<SaveRequest>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    let (entry, _) = hub.notebook_for(&user, &pid, &nid, Role::Editor).await?;
    if matches!(entry.source, crate::catalog::Source::Git { .. }) {
        return Err(HubError::conflict(
            "this notebook is push-synced: it changes only by sync (fork it to edit)",
        ));
    }
    let h = hub.clone();
    let done = spawn(async move { h.save(&pid, &nid, &user.id, req, "save").await }).await?;
    Ok(ok_status(StatusCode::CREATED, done))
}

/// One file of the workspace at a revision (viewer), streamed.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/{*path}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("path" = String, Path), RevisionQuery),
    responses((status = 200, description = "The file", content_type = "application/octet-stream"), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn workspace_file(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid, path)): Path<(String, String, String)>,
    Q(q): Q<RevisionQuery>,
    headers: HeaderMap,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let v = hub.loadable(&nb, q.revision).await?;
    stream_file(&hub, &pid, &v, &path, q.revision.is_some(), &headers).await
}

/// Versions newest first (viewer); pruned ones stay listed.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), PageQuery),
    responses((status = 200, body = VersionPageEnvelope), (status = 404, body = ErrorEnvelope)), security(("token" = [])))]
async fn list_versions(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
    Q(q): Q<PageQuery>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    let (_, nb) = hub.notebook_for(&user, &pid, &nid, Role::Viewer).await?;
    let before = match &q.cursor {
        Some(c) => Some(
            c.parse::<i64>()
                .map_err(|_| HubError::invalid("bad cursor"))?,
        ),
        None => None,
    };
    let limit = limit_of(&q);
    let mut items = hub.versions(&nb, before, limit as u32 + 1).await?;
    let more = items.len() > limit;
    items.truncate(limit);
    let next_cursor = if more {
        items.last().map(|v| v.revision.to_string())
    } else {
        None
    };
    Ok(ok(Page { items, next_cursor }))
}

/// Loads a version: its record and its workspace listing (viewer). 410 if pruned.
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path), ("vid" = String, Path)),
    responses((status = 200, body = VersionEnvelope), (status = 404, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn get_version(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid, vid)): Path<(String, String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
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
async fn version_file(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid, vid, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
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
async fn restore_version(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid, vid)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
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

/// Copies one revision (default: the head) into a new notebook at revision 1 (editor).
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/fork", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)), request_body = ForkRequest,
    responses((status = 201, body = CreatedNotebookEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope), (status = 410, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn fork(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
    JsonBody(req): JsonBody<ForkRequest>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
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
async fn branch(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
    JsonBody(req): JsonBody<BranchRequest>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    let h = hub.clone();
    let done = spawn(async move { h.branch_refused_edit(&user, &pid, &nid, req).await }).await?;
    Ok(ok_status(StatusCode::CREATED, done))
}

/// A CAS archive of every kept version of the notebook and all they reference (viewer).
#[utoipa::path(get, path = "/api/v1/projects/{pid}/notebooks/{nid}/export", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, description = "The archive", content_type = "application/vnd.unicas.archive"), (status = 404, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn export(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
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
async fn import(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path(pid): Path<String>,
    Q(q): Q<ImportQuery>,
    headers: HeaderMap,
    body: Body,
) -> HubResult<Response> {
    check_pid(&pid)?;
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

/// A new sync token for a push-synced notebook (manager); the old one stops working.
#[utoipa::path(post, path = "/api/v1/projects/{pid}/notebooks/{nid}/sync-token", tag = "notebooks",
    params(("pid" = String, Path), ("nid" = String, Path)),
    responses((status = 200, body = SyncTokenEnvelope), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope)),
    security(("token" = [])))]
async fn rotate_sync_token(
    State(hub): State<Hub>,
    Caller(user): Caller,
    Path((pid, nid)): Path<(String, String)>,
) -> HubResult<Response> {
    check_pid(&pid)?;
    check_nid(&nid)?;
    Ok(ok(SyncTokenView {
        sync_token: hub.rotate_sync_token(&user, &pid, &nid).await?,
    }))
}

// ---------- sync ----------

/// Push sync: the complete workspace tree as a tar archive becomes a new immutable version.
/// Optional headers: `X-Sync-Commit` (the Git commit id), `X-Sync-Message`.
#[utoipa::path(post, path = "/api/sync/git/v1", tag = "sync",
    request_body(content = Vec<u8>, content_type = "application/x-tar"),
    responses((status = 200, body = SyncedEnvelope), (status = 401, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope),
        (status = 415, body = ErrorEnvelope), (status = 422, body = ErrorEnvelope), (status = 503, body = ErrorEnvelope)),
    security(("sync_token" = [])))]
async fn push_sync(State(hub): State<Hub>, headers: HeaderMap, body: Body) -> HubResult<Response> {
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

/// The OpenAPI document of the hub.
async fn openapi(
    State(doc): State<std::sync::Arc<utoipa::openapi::OpenApi>>,
) -> Json<utoipa::openapi::OpenApi> {
    Json((*doc).clone())
}

/// The router with every route, and the OpenAPI document built from it.
pub fn router(hub: Hub) -> Router {
    let json_limit = usize::try_from(hub.config.json_max_bytes).unwrap_or(usize::MAX);
    let (json_routes, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(get_catalog))
        .routes(routes!(me))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(list_projects, create_project))
        .routes(routes!(get_project, update_project, delete_project))
        .routes(routes!(put_member))
        .routes(routes!(remove_member))
        .routes(routes!(list_events))
        .routes(routes!(storage))
        .routes(routes!(gc))
        .routes(routes!(list_trash))
        .routes(routes!(restore_trash))
        .routes(routes!(purge_trash))
        .routes(routes!(list_notebooks, create_notebook))
        .routes(routes!(get_notebook, update_notebook, trash_notebook))
        .routes(routes!(get_workspace, save))
        .routes(routes!(workspace_file))
        .routes(routes!(list_versions))
        .routes(routes!(get_version))
        .routes(routes!(version_file))
        .routes(routes!(restore_version))
        .routes(routes!(fork))
        .routes(routes!(branch))
        .routes(routes!(export))
        .routes(routes!(rotate_sync_token))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .layer(DefaultBodyLimit::max(json_limit))
        .split_for_parts();
    // Streamed bodies carry their own limits.
    let (stream_routes, stream_doc) = OpenApiRouter::new()
        .routes(routes!(upload))
        .routes(routes!(import))
        .routes(routes!(push_sync))
        .layer(DefaultBodyLimit::disable())
        .split_for_parts();
    doc.merge(stream_doc);
    // Routing needs `{*path}` for paths with slashes; OpenAPI spells it `{path}`.
    let paths = std::mem::take(&mut doc.paths.paths);
    doc.paths.paths = paths
        .into_iter()
        .map(|(k, v)| (k.replace("{*", "{"), v))
        .collect();
    let doc = std::sync::Arc::new(doc);
    let docs = Router::new()
        .route("/api/v1/doc", get(openapi))
        .route("/api/v1/openapi.json", get(openapi))
        .with_state(doc);
    json_routes
        .merge(stream_routes)
        .fallback(|| async { HubError::not_found("no such route") })
        .with_state(hub.clone())
        .merge(docs)
        .layer(axum::middleware::from_fn_with_state(hub, guard_browser))
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

/// Refuses requests to a host the hub does not answer to, and changes requested by pages of
/// another origin (see [`cas_service::web_guard`]).
async fn guard_browser(
    State(hub): State<Hub>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    match cas_service::web_guard::check(
        &hub.allowed_hosts,
        hub.config.public_url.as_deref(),
        req.method(),
        req.headers(),
    ) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            let (code, message) = refusal.code_and_message();
            let status = match refusal {
                cas_service::web_guard::Refusal::Host(_) => StatusCode::MISDIRECTED_REQUEST,
                cas_service::web_guard::Refusal::Origin(_) => StatusCode::FORBIDDEN,
            };
            HubError::new(status, code, message).into_response()
        }
    }
}
