//! Admin sessions: server-side rows keyed by the hash of a random secret held in an HttpOnly
//! cookie, with idle and absolute expiry; a CSRF token per session that every state-changing
//! request must echo in `X-CSRF-Token`; and one-time login links for the local operator.
//!
//! Only the `unicas_admin` cookie is read here: a Space capability in `Authorization` is never
//! looked at, so it admits nothing on `/admin`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use cas_format::AppId;

use crate::error::{ApiError, ApiResult};
use crate::meta::{Account, AppRecord, LOCAL_OPERATOR};
use crate::{Service, now_ms};

/// Name of the session cookie.
pub const COOKIE: &str = "unicas_admin";
/// Header carrying the CSRF token on state-changing requests.
pub const CSRF_HEADER: &str = "x-csrf-token";

use server_kit::web_auth::same;
pub use server_kit::web_auth::{cookie, random_token, token_hash};

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    cookie(headers, COOKIE)
}

/// A signed-in, admitted administrator.
#[derive(Debug, Clone)]
pub struct Admin {
    pub account: Account,
    pub csrf_token: String,
    session_hash: Vec<u8>,
}

impl Admin {
    /// The App if this administrator may see it; otherwise 404, as for a missing App.
    pub async fn app(&self, svc: &Service, app: &AppId) -> ApiResult<AppRecord> {
        let not_found = || ApiError::not_found("APP_NOT_FOUND", "no such App");
        let record = svc.meta.get_app(app).await?.ok_or_else(not_found)?;
        if self.account.platform_admin || svc.meta.apps_of(&self.account.id).await?.contains(app) {
            Ok(record)
        } else {
            Err(not_found())
        }
    }

    pub fn require_platform_admin(&self) -> ApiResult<()> {
        if self.account.platform_admin {
            Ok(())
        } else {
            Err(ApiError::forbidden(
                "PLATFORM_ADMIN_REQUIRED",
                "only platform administrators may do this",
            ))
        }
    }

    /// Records an admin action.
    pub async fn audit(
        &self,
        svc: &Service,
        action: &str,
        app: Option<&AppId>,
        detail: serde_json::Value,
    ) -> ApiResult<()> {
        svc.meta
            .audit(&self.account.id, action, app, &detail, now_ms())
            .await?;
        Ok(())
    }

    pub async fn logout(&self, svc: &Service) -> ApiResult<()> {
        svc.meta
            .delete_session(&self.session_hash, now_ms())
            .await?;
        Ok(())
    }
}

/// Whether an account may use the admin plane: platform admins and App members, never a
/// blocked account.
pub async fn admitted(svc: &Service, account: &Account) -> ApiResult<()> {
    if account.blocked {
        return Err(ApiError::forbidden(
            "ACCOUNT_BLOCKED",
            "this account is blocked",
        ));
    }
    if account.platform_admin || !svc.meta.apps_of(&account.id).await?.is_empty() {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "NOT_ADMITTED",
            "this account is neither a platform administrator nor a member of an App",
        ))
    }
}

impl FromRequestParts<Service> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, svc: &Service) -> Result<Self, ApiError> {
        let Some(secret) = cookie_value(&parts.headers) else {
            return Err(ApiError::unauthorized(
                "ADMIN_SESSION_REQUIRED",
                "sign in to the admin plane",
            ));
        };
        let hash = token_hash(&secret);
        let now = now_ms();
        let Some(session) = svc.meta.session(&hash).await? else {
            return Err(ApiError::unauthorized(
                "ADMIN_SESSION_REQUIRED",
                "sign in to the admin plane",
            ));
        };
        let idle = svc.config.admin_session_idle_ms as i64;
        if now >= session.expires_at || now - session.last_seen_at > idle {
            svc.meta.delete_session(&hash, now).await?;
            return Err(ApiError::unauthorized(
                "ADMIN_SESSION_EXPIRED",
                "the session has expired; sign in again",
            ));
        }
        if let Err(e) = admitted(svc, &session.account).await {
            svc.meta.delete_session(&hash, now).await?;
            return Err(e);
        }
        if !matches!(parts.method, Method::GET | Method::HEAD) {
            let given = parts
                .headers
                .get(CSRF_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !same(given, &session.csrf_token) {
                return Err(ApiError::forbidden(
                    "CSRF_TOKEN_INVALID",
                    "a state-changing request must carry the session's X-CSRF-Token",
                ));
            }
        }
        // Throttled: at most one write a minute per session.
        if now - session.last_seen_at > 60_000 {
            svc.meta.touch_session(&hash, now).await?;
        }
        Ok(Admin {
            account: session.account,
            csrf_token: session.csrf_token,
            session_hash: hash,
        })
    }
}

/// Starts a session for `account` and answers a redirect to the UI that sets its cookie.
pub async fn start_session(svc: &Service, account: &Account) -> ApiResult<Response> {
    admitted(svc, account).await?;
    let secret = random_token();
    let now = now_ms();
    let expires = now + svc.config.admin_session_max_ms as i64;
    svc.meta
        .create_session(
            &token_hash(&secret),
            &account.id,
            &random_token(),
            now,
            expires,
        )
        .await?;
    svc.meta
        .audit(
            &account.id,
            "session.start",
            None,
            &serde_json::json!({}),
            now,
        )
        .await?;
    let secure = svc.public_url().starts_with("https://");
    let cookie = format!(
        "{COOKIE}={secret}; Path=/admin; HttpOnly; SameSite=Lax; Max-Age={}{}",
        svc.config.admin_session_max_ms / 1000,
        if secure { "; Secure" } else { "" }
    );
    let mut response = Redirect::to("/admin/ui/").into_response();
    *response.status_mut() = StatusCode::SEE_OTHER;
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|e| ApiError::internal("building a cookie", e))?,
    );
    Ok(response)
}

/// A cookie that clears the session cookie.
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("unicas_admin=; Path=/admin; HttpOnly; SameSite=Lax; Max-Age=0")
}

/// Creates a one-time login link for the local operator (a platform administrator, created on
/// first use) and returns its full URL.
pub async fn login_link(svc: &Service) -> anyhow::Result<String> {
    let now = now_ms();
    svc.meta
        .create_account(LOCAL_OPERATOR, "Local operator", None, true, now)
        .await?;
    let token = random_token();
    svc.meta
        .create_login_link(
            &token_hash(&token),
            LOCAL_OPERATOR,
            now,
            now + svc.config.admin_login_link_ttl_ms as i64,
        )
        .await?;
    Ok(format!("{}/admin/login/link/{token}", svc.public_url()))
}

/// `GET` of a login link: a page with a button that signs in. Only the `POST` it sends uses
/// the link, so a link previewer or scanner that fetches the URL cannot burn it.
pub fn login_link_page(token: &str) -> ApiResult<Response> {
    if !server_kit::web_auth::token_shaped(token) {
        return Err(ApiError::unauthorized(
            "LOGIN_LINK_INVALID",
            "this login link is unknown, used or expired",
        ));
    }
    Ok(server_kit::web_auth::login_link_page(
        "UniCAS admin",
        "This one-time link signs you in as the local operator. It stops working once used.",
        &format!("/admin/login/link/{token}"),
    ))
}

/// Signs in with a login link (once): the `POST` of its page.
pub async fn use_login_link(svc: &Service, token: &str) -> ApiResult<Response> {
    let invalid = || {
        ApiError::unauthorized(
            "LOGIN_LINK_INVALID",
            "this login link is unknown, used or expired",
        )
    };
    let account_id = svc
        .meta
        .consume_login_link(&token_hash(token), now_ms())
        .await?
        .ok_or_else(invalid)?;
    let account = svc.meta.account(&account_id).await?.ok_or_else(invalid)?;
    start_session(svc, &account).await
}
