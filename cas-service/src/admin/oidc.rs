//! OpenID Connect sign-in for administrators: the protocol is [`server_kit::oidc`]; here the
//! pending sign-ins are kept in the metadata store, and an identity (provider, subject)
//! resolves to one account; a first sign-in is linked to the account that holds the same
//! verified email. Then admission decides.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use server_kit::oidc::{LOGIN_TTL_MS, OidcError, login_key};
use server_kit::web_auth::set_cookie;

use super::session::start_session;
use crate::config::OidcProvider;
use crate::error::{ApiError, ApiResult};
use crate::{Service, now_ms};

/// The cookie that binds a started sign-in to the browser that started it.
const BROWSER_COOKIE: &str = "unicas_oidc";
const BROWSER_COOKIE_PATH: &str = "/admin/oidc";

fn provider<'a>(svc: &'a Service, name: &str) -> ApiResult<&'a OidcProvider> {
    svc.config
        .oidc_providers
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| ApiError::not_found("OIDC_PROVIDER_UNKNOWN", "no such sign-in provider"))
}

fn redirect_uri(svc: &Service) -> String {
    format!("{}/admin/oidc/callback", svc.public_url())
}

impl From<OidcError> for ApiError {
    fn from(e: OidcError) -> Self {
        let status = match e {
            OidcError::Upstream(_) => StatusCode::BAD_GATEWAY,
            _ => StatusCode::UNAUTHORIZED,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl Service {
    /// `GET /admin/login/{provider}`: sends the browser to the provider, with a short-lived
    /// HttpOnly cookie that the callback must present.
    pub async fn oidc_start(&self, name: &str) -> ApiResult<Response> {
        let p = provider(self, name)?;
        let started = self.oidc.start(p, &redirect_uri(self)).await?;
        let now = now_ms();
        self.meta
            .create_oidc_login(&started.key, &started.login, now, now + LOGIN_TTL_MS)
            .await?;
        let mut response = Redirect::to(&started.redirect).into_response();
        response.headers_mut().append(
            axum::http::header::SET_COOKIE,
            set_cookie(
                BROWSER_COOKIE,
                &started.browser,
                BROWSER_COOKIE_PATH,
                LOGIN_TTL_MS / 1000,
                self.public_url().starts_with("https://"),
            ),
        );
        Ok(response)
    }

    /// `GET /admin/oidc/callback`: finishes a sign-in started by this browser (`browser`, the
    /// value of its sign-in cookie).
    pub async fn oidc_callback(
        &self,
        code: Option<&str>,
        state: Option<&str>,
        error: Option<&str>,
        browser: Option<&str>,
    ) -> ApiResult<Response> {
        let bad_state = || {
            ApiError::unauthorized(
                "OIDC_STATE_INVALID",
                "this sign-in is unknown, used or expired; start again",
            )
        };
        let state = state.ok_or_else(bad_state)?;
        let browser = browser.ok_or_else(bad_state)?;
        let login = self
            .meta
            .take_oidc_login(&login_key(state, browser), now_ms())
            .await?
            .ok_or_else(bad_state)?;
        if let Some(e) = error {
            return Err(OidcError::Denied(e.to_string()).into());
        }
        let code = code.ok_or_else(|| ApiError::invalid("the callback carries no code"))?;
        let p = provider(self, &login.provider)?;
        let claims = self
            .oidc
            .finish(
                p,
                &login,
                code,
                &redirect_uri(self),
                self.config.auth_leeway_s,
            )
            .await?;
        let now = now_ms();
        let account = match self.meta.account_by_identity(&p.name, &claims.sub).await? {
            Some(a) => a,
            None => {
                let by_email = match (&claims.email, claims.email_verified) {
                    (Some(email), Some(true)) => self.meta.account_by_email(email).await?,
                    _ => None,
                };
                let Some(a) = by_email else {
                    return Err(ApiError::forbidden(
                        "NOT_ADMITTED",
                        "no account knows this identity; ask an administrator to add your email",
                    ));
                };
                self.meta
                    .link_identity(&p.name, &claims.sub, &a.id, now)
                    .await?;
                a
            }
        };
        tracing::info!(account = %account.id, provider = %p.name, name = ?claims.name, "admin sign-in");
        let mut response = start_session(self, &account).await?;
        response.headers_mut().append(
            axum::http::header::SET_COOKIE,
            set_cookie(BROWSER_COOKIE, "", BROWSER_COOKIE_PATH, 0, false),
        );
        Ok(response)
    }
}
