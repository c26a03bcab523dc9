//! The admin plane `/admin/*`: sign-in (OIDC, one-time login links), Apps, issuer keys, members,
//! usage, balances and events read at one revision, GC, reconciliation, and the web UI at
//! `/admin/ui/`. Every route needs an admin session (an HttpOnly cookie), never a Space
//! capability; every state-changing route also needs the session's CSRF token; every action
//! is audited.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use cas_format::{AppId, SpaceId};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::extract::{Q, bounded_bytes, parse_json};
use crate::auth::{decoding_key, parse_algorithm};
use crate::error::{ApiError, ApiResult};
use crate::meta::AppRecord;
use crate::{Service, now_ms};

mod oidc;
mod reconcile;
mod root_refs;
pub mod session;
mod ui;

pub use session::{Admin, login_link};

fn app_json(app: &AppRecord, usage: &cas_format::wire::Usage) -> Value {
    json!({
        "appId": app.app_id, "issuer": app.issuer, "suspended": app.suspended,
        "revision": app.revision, "createdAt": app.created_at, "usage": usage,
    })
}

async fn app_view(svc: &Service, app: &AppRecord) -> ApiResult<Value> {
    let usage = svc.meta.app_usage(&app.app_id, now_ms()).await?;
    Ok(app_json(app, &usage))
}

async fn session_info(State(svc): State<Service>, admin: Admin) -> ApiResult<Json<Value>> {
    let apps = svc.meta.apps_of(&admin.account.id).await?;
    let _ = &svc;
    Ok(Json(json!({
        "account": {
            "id": admin.account.id, "displayName": admin.account.display_name,
            "email": admin.account.email, "platformAdmin": admin.account.platform_admin,
        },
        "memberOf": apps,
        "csrfToken": admin.csrf_token,
    })))
}

async fn logout(State(svc): State<Service>, admin: Admin) -> ApiResult<Response> {
    admin.audit(&svc, "session.end", None, json!({})).await?;
    admin.logout(&svc).await?;
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, session::clear_cookie());
    Ok(r)
}

async fn providers(State(svc): State<Service>) -> Json<Value> {
    let items: Vec<Value> = svc
        .config
        .oidc_providers
        .iter()
        .map(|p| json!({"name": p.name, "displayName": p.display_name.clone().unwrap_or_else(|| p.name.clone())}))
        .collect();
    Json(json!({ "items": items }))
}

async fn login(State(svc): State<Service>, Path(provider): Path<String>) -> ApiResult<Response> {
    svc.oidc_start(&provider).await
}

#[derive(Debug, Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

async fn callback(
    State(svc): State<Service>,
    Q(q): Q<Callback>,
    headers: axum::http::HeaderMap,
) -> ApiResult<Response> {
    let browser = session::cookie(&headers, "unicas_oidc");
    svc.oidc_callback(
        q.code.as_deref(),
        q.state.as_deref(),
        q.error.as_deref(),
        browser.as_deref(),
    )
    .await
}

async fn login_link_page(Path(token): Path<String>) -> ApiResult<Response> {
    session::login_link_page(&token)
}

async fn login_with_link(
    State(svc): State<Service>,
    Path(token): Path<String>,
) -> ApiResult<Response> {
    session::use_login_link(&svc, &token).await
}

async fn list_apps(State(svc): State<Service>, admin: Admin) -> ApiResult<Json<Value>> {
    let member_of = svc.meta.apps_of(&admin.account.id).await?;
    let mut items = Vec::new();
    for app in svc.meta.list_apps().await? {
        if admin.account.platform_admin || member_of.contains(&app.app_id) {
            items.push(app_view(&svc, &app).await?);
        }
    }
    Ok(Json(json!({ "items": items })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewApp {
    app_id: AppId,
    issuer: String,
}

async fn create_app(State(svc): State<Service>, admin: Admin, body: Body) -> ApiResult<Response> {
    admin.require_platform_admin()?;
    let req: NewApp = parse_json(&bounded_bytes(body, 64 << 10).await?)?;
    if req.issuer.trim().is_empty() || req.issuer.len() > 1024 {
        return Err(ApiError::invalid("the issuer must be 1..=1024 characters"));
    }
    let app = svc
        .meta
        .create_app(&req.app_id, &req.issuer, now_ms())
        .await
        .map_err(registry_error)?;
    svc.registry.invalidate();
    admin
        .audit(
            &svc,
            "app.create",
            Some(&req.app_id),
            json!({"issuer": req.issuer}),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "app": app_view(&svc, &app).await? })).into_response(),
    )
        .into_response())
}

fn registry_error(e: crate::meta::RegistryError) -> ApiError {
    use crate::meta::RegistryError as R;
    match e {
        R::AppExists(_) | R::IssuerTaken(_) | R::KeyExists { .. } => {
            ApiError::conflict("ALREADY_EXISTS", e.to_string())
        }
        R::NoSuchApp(_) => ApiError::not_found("APP_NOT_FOUND", "no such App"),
        R::NoSuchKey { .. } => ApiError::not_found("KEY_NOT_FOUND", e.to_string()),
        R::Database(e) => ApiError::from(e),
    }
}

async fn get_app(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
) -> ApiResult<Json<Value>> {
    let record = admin.app(&svc, &app).await?;
    let keys: Vec<Value> = svc
        .meta
        .list_keys(Some(&app))
        .await?
        .into_iter()
        .map(|k| json!({"kid": k.kid, "alg": k.alg, "createdAt": k.created_at, "revokedAt": k.revoked_at}))
        .collect();
    let members: Vec<Value> = svc
        .meta
        .members(&app)
        .await?
        .into_iter()
        .map(|a| json!({"accountId": a.id, "email": a.email, "displayName": a.display_name}))
        .collect();
    Ok(Json(json!({
        "app": app_view(&svc, &record).await?,
        "spaces": svc.meta.spaces_in_balances(&app).await?,
        "keys": keys,
        "members": members,
    })))
}

async fn set_suspended(
    svc: &Service,
    admin: &Admin,
    app: &AppId,
    suspended: bool,
) -> ApiResult<Json<Value>> {
    admin.app(svc, app).await?;
    svc.meta
        .set_suspended(app, suspended, now_ms())
        .await
        .map_err(registry_error)?;
    svc.registry.invalidate();
    admin
        .audit(
            svc,
            if suspended {
                "app.suspend"
            } else {
                "app.resume"
            },
            Some(app),
            json!({}),
        )
        .await?;
    let record = admin.app(svc, app).await?;
    Ok(Json(json!({ "app": app_view(svc, &record).await? })))
}

async fn suspend(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
) -> ApiResult<Json<Value>> {
    set_suspended(&svc, &admin, &app, true).await
}

async fn resume(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
) -> ApiResult<Json<Value>> {
    set_suspended(&svc, &admin, &app, false).await
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewKey {
    kid: String,
    alg: String,
    public_key_pem: String,
}

async fn add_key(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    body: Body,
) -> ApiResult<Response> {
    admin.app(&svc, &app).await?;
    let req: NewKey = parse_json(&bounded_bytes(body, 64 << 10).await?)?;
    if req.kid.is_empty() || req.kid.len() > 256 {
        return Err(ApiError::invalid("kid must be 1..=256 characters"));
    }
    let alg = parse_algorithm(&req.alg)
        .ok_or_else(|| ApiError::invalid("alg must be EdDSA, ES256 or RS256"))?;
    decoding_key(alg, &req.public_key_pem).map_err(ApiError::invalid)?;
    let now = now_ms();
    svc.meta
        .add_key(&app, &req.kid, &req.alg, &req.public_key_pem, now)
        .await
        .map_err(registry_error)?;
    svc.registry.invalidate();
    admin
        .audit(
            &svc,
            "key.add",
            Some(&app),
            json!({"kid": req.kid, "alg": req.alg}),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"key": {"kid": req.kid, "alg": req.alg, "createdAt": now, "revokedAt": null}})),
    )
        .into_response())
}

async fn revoke_key(
    State(svc): State<Service>,
    admin: Admin,
    Path((app, kid)): Path<(AppId, String)>,
) -> ApiResult<Json<Value>> {
    admin.app(&svc, &app).await?;
    let now = now_ms();
    svc.meta
        .revoke_key(&app, &kid, now)
        .await
        .map_err(registry_error)?;
    svc.registry.invalidate();
    admin
        .audit(&svc, "key.revoke", Some(&app), json!({"kid": kid}))
        .await?;
    let key = svc
        .meta
        .list_keys(Some(&app))
        .await?
        .into_iter()
        .find(|k| k.kid == kid)
        .map(|k| json!({"kid": k.kid, "alg": k.alg, "createdAt": k.created_at, "revokedAt": k.revoked_at}));
    Ok(Json(json!({ "key": key })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewMember {
    email: String,
    #[serde(default)]
    display_name: Option<String>,
}

async fn add_member(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    body: Body,
) -> ApiResult<Response> {
    admin.app(&svc, &app).await?;
    let req: NewMember = parse_json(&bounded_bytes(body, 64 << 10).await?)?;
    let email = req.email.trim().to_ascii_lowercase();
    if !email.contains('@') || email.len() > 320 {
        return Err(ApiError::invalid("a member is given by a valid email"));
    }
    let now = now_ms();
    let account = match svc.meta.account_by_email(&email).await? {
        Some(a) => a,
        None => {
            let name = req.display_name.unwrap_or_else(|| email.clone());
            svc.meta
                .create_account(
                    &ulid::Ulid::generate().to_string(),
                    &name,
                    Some(&email),
                    false,
                    now,
                )
                .await?
        }
    };
    svc.meta.add_member(&app, &account.id, now).await?;
    admin
        .audit(
            &svc,
            "member.add",
            Some(&app),
            json!({"accountId": account.id, "email": email}),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"member": {"accountId": account.id, "email": account.email, "displayName": account.display_name}})),
    )
        .into_response())
}

async fn remove_member(
    State(svc): State<Service>,
    admin: Admin,
    Path((app, account)): Path<(AppId, String)>,
) -> ApiResult<StatusCode> {
    admin.app(&svc, &app).await?;
    if !svc.meta.remove_member(&app, &account).await? {
        return Err(ApiError::not_found("MEMBER_NOT_FOUND", "no such member"));
    }
    admin
        .audit(
            &svc,
            "member.remove",
            Some(&app),
            json!({"accountId": account}),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn app_usage(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
) -> ApiResult<Json<cas_format::wire::Usage>> {
    admin.app(&svc, &app).await?;
    Ok(Json(svc.meta.app_usage(&app, now_ms()).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GcBody {
    space_id: SpaceId,
    #[serde(default)]
    max_nodes: Option<u32>,
}

async fn gc(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    body: Body,
) -> ApiResult<Json<cas_format::wire::GcResponse>> {
    admin.app(&svc, &app).await?;
    let req: GcBody = parse_json(&bounded_bytes(body, 64 << 10).await?)?;
    let max = req.max_nodes.unwrap_or(1000);
    if !(1..=10_000).contains(&max) {
        return Err(ApiError::invalid("maxNodes must be 1..=10000"));
    }
    let r = svc.gc_pass(&app, &req.space_id, max).await?;
    admin
        .audit(
            &svc,
            "gc",
            Some(&app),
            json!({"spaceId": req.space_id, "result": r}),
        )
        .await?;
    Ok(Json(r))
}

#[derive(Debug, Deserialize)]
struct AuditQuery {
    before: Option<String>,
    limit: Option<u32>,
}

async fn audit(
    State(svc): State<Service>,
    admin: Admin,
    Path(app): Path<AppId>,
    Q(q): Q<AuditQuery>,
) -> ApiResult<Json<Value>> {
    admin.app(&svc, &app).await?;
    let limit = q.limit.unwrap_or(100).clamp(1, 200) as i64;
    let items = svc
        .meta
        .audit_page(&app, q.before.as_deref(), limit)
        .await?;
    let next = (items.len() as i64 == limit)
        .then(|| items.last().map(|e| e.id.clone()))
        .flatten();
    Ok(Json(json!({"items": items, "nextCursor": next})))
}

async fn not_found() -> ApiError {
    ApiError::not_found("NOT_FOUND", "no such admin route")
}

/// The admin router (state: the service).
pub fn router() -> Router<Service> {
    Router::new()
        .route("/admin", get(|| async { Redirect::to("/admin/ui/") }))
        .route("/admin/session", get(session_info))
        .route("/admin/logout", post(logout))
        .route("/admin/providers", get(providers))
        .route(
            "/admin/login/link/{token}",
            get(login_link_page).post(login_with_link),
        )
        .route("/admin/login/{provider}", get(login))
        .route("/admin/oidc/callback", get(callback))
        .route("/admin/apps", get(list_apps).post(create_app))
        .route("/admin/apps/{app}", get(get_app))
        .route("/admin/apps/{app}/suspend", post(suspend))
        .route("/admin/apps/{app}/resume", post(resume))
        .route("/admin/apps/{app}/keys", post(add_key))
        .route("/admin/apps/{app}/keys/{kid}/revoke", post(revoke_key))
        .route("/admin/apps/{app}/members", post(add_member))
        .route("/admin/apps/{app}/members/{account}", delete(remove_member))
        .route("/admin/apps/{app}/usage", get(app_usage))
        .route("/admin/apps/{app}/root-refs", get(root_refs::balances))
        .route("/admin/apps/{app}/root-ref-events", get(root_refs::events))
        .route("/admin/apps/{app}/gc", post(gc))
        .route("/admin/apps/{app}/reconcile", post(reconcile::compare))
        .route("/admin/apps/{app}/reconcile/apply", post(reconcile::apply))
        .route("/admin/apps/{app}/audit", get(audit))
        .merge(ui::router())
        .route(
            "/admin/{*rest}",
            get(not_found).post(not_found).delete(not_found),
        )
}
