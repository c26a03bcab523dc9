//! OpenID Connect sign-in to the hub's web UI: the protocol is [`server_kit::oidc`] (shared
//! with the CAS admin plane); here the pending sign-ins live in the hub database and an
//! identity becomes a hub user: the one it was linked to, else the one with the same verified
//! email (then linked), else a new user named by that email (whose invitations it claims).
//! An identity without a verified email is refused.

use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Redirect, Response};
use server_kit::oidc::{LOGIN_TTL_MS, OidcError, OidcProvider, login_key};
use server_kit::web_auth::{cookie, set_cookie, token_shaped, urldecode, urlencode};

use super::session::local_path;
use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids::now_ms;

/// Binds a started sign-in to the browser that started it.
const BROWSER_COOKIE: &str = "unicas_hub_oidc";
/// Where the browser goes once signed in.
const NEXT_COOKIE: &str = "unicas_hub_next";
const COOKIE_PATH: &str = "/auth/oidc";

/// Where the login page shows a failed sign-in.
fn failed(message: &str) -> Response {
    Redirect::to(&format!(
        "/login?error=oidc_failed&message={}",
        urlencode(message)
    ))
    .into_response()
}

impl Hub {
    fn oidc_provider(&self, name: &str) -> Option<&OidcProvider> {
        self.config
            .web
            .oidc_providers
            .iter()
            .find(|p| p.name == name)
    }

    fn oidc_redirect_uri(&self) -> String {
        format!("{}/auth/oidc/callback", self.public_base())
    }

    /// `GET /auth/oidc/{provider}`: sends the browser to the provider.
    pub async fn oidc_start(&self, name: &str, next: Option<&str>) -> HubResult<Response> {
        let Some(p) = self.oidc_provider(name) else {
            return Ok(failed("no such sign-in provider"));
        };
        let started = match self.oidc.start(p, &self.oidc_redirect_uri()).await {
            Ok(s) => s,
            Err(e) => return Ok(failed(&e.to_string())),
        };
        let now = now_ms();
        self.store
            .create_oidc_login(&started.key, &started.login, now, now + LOGIN_TTL_MS)
            .await?;
        let secure = self.secure_cookies();
        let mut response = Redirect::to(&started.redirect).into_response();
        let h = response.headers_mut();
        let age = LOGIN_TTL_MS / 1000;
        h.append(
            header::SET_COOKIE,
            set_cookie(BROWSER_COOKIE, &started.browser, COOKIE_PATH, age, secure),
        );
        let next = urlencode(local_path(next.unwrap_or("/")));
        h.append(
            header::SET_COOKIE,
            set_cookie(NEXT_COOKIE, &next, COOKIE_PATH, age, secure),
        );
        Ok(response)
    }

    /// `GET /auth/oidc/callback`: finishes a sign-in this browser started. Failures go to the
    /// login page with the reason in words.
    pub async fn oidc_callback(
        &self,
        code: Option<&str>,
        state: Option<&str>,
        error: Option<&str>,
        headers: &HeaderMap,
    ) -> HubResult<Response> {
        let mut response = match self.oidc_finish(code, state, error, headers).await {
            Ok(r) => r,
            Err(e) if e.status == axum::http::StatusCode::INTERNAL_SERVER_ERROR => return Err(e),
            Err(e) => failed(&e.message),
        };
        for name in [BROWSER_COOKIE, NEXT_COOKIE] {
            response.headers_mut().append(
                header::SET_COOKIE,
                set_cookie(name, "", COOKIE_PATH, 0, false),
            );
        }
        Ok(response)
    }

    async fn oidc_finish(
        &self,
        code: Option<&str>,
        state: Option<&str>,
        error: Option<&str>,
        headers: &HeaderMap,
    ) -> HubResult<Response> {
        let bad_state =
            || HubError::unauthorized("this sign-in is unknown, used or expired; start again");
        let state = state.filter(|s| token_shaped(s)).ok_or_else(bad_state)?;
        let browser = cookie(headers, BROWSER_COOKIE).ok_or_else(bad_state)?;
        let login = self
            .store
            .take_oidc_login(&login_key(state, &browser), now_ms())
            .await?
            .ok_or_else(bad_state)?;
        if let Some(e) = error {
            return Err(oidc_error(OidcError::Denied(e.chars().take(200).collect())));
        }
        let code = code.ok_or_else(|| HubError::invalid("the callback carries no code"))?;
        let p = self.oidc_provider(&login.provider).ok_or_else(|| {
            HubError::unauthorized("the sign-in provider is no longer configured")
        })?;
        let claims = self
            .oidc
            .finish(p, &login, code, &self.oidc_redirect_uri(), 30)
            .await
            .map_err(oidc_error)?;
        let user = self.user_of_identity(p, &claims).await?;
        let next = cookie(headers, NEXT_COOKIE)
            .and_then(|n| urldecode(&n))
            .unwrap_or_else(|| "/".into());
        self.start_web_session(&user, &next).await
    }

    /// The hub user an identity is; see the module's doc.
    async fn user_of_identity(
        &self,
        p: &OidcProvider,
        claims: &server_kit::oidc::Claims,
    ) -> HubResult<crate::auth::User> {
        let refused = || {
            HubError::forbidden(
                "this identity has no verified email; ask an administrator to create your user",
            )
        };
        if let Some(id) = self.store.user_of_identity(&p.name, &claims.sub).await? {
            return self
                .user_standing(&id)
                .await?
                .ok_or_else(|| HubError::forbidden("this user is suspended"));
        }
        let email = match (&claims.email, claims.email_verified) {
            (Some(e), Some(true)) => e.trim().to_lowercase(),
            _ => return Err(refused()),
        };
        let user = match self.store.user_by_email(&email).await? {
            Some(u) => u,
            None => {
                let name = claims.name.clone().unwrap_or_else(|| email.clone());
                self.create_user(&email, &name, Some(&email), false).await?;
                self.user(&email).await?.ok_or_else(refused)?
            }
        };
        if self.user_standing(&user.id).await?.is_none() {
            return Err(HubError::forbidden("this user is suspended"));
        }
        self.store
            .link_identity(&p.name, &claims.sub, &user.id, now_ms())
            .await?;
        tracing::info!(user = %user.id, provider = %p.name, "identity linked");
        Ok(user)
    }
}

fn oidc_error(e: OidcError) -> HubError {
    let status = match e {
        OidcError::Upstream(_) => axum::http::StatusCode::BAD_GATEWAY,
        _ => axum::http::StatusCode::UNAUTHORIZED,
    };
    HubError::new(status, e.code(), e.to_string())
}
