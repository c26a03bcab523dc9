//! Browsers signed in to the hub: a server-side row per session keyed by the hash of a random
//! secret held in the HttpOnly cookie `unicas_hub`, with idle and absolute expiry, and a CSRF
//! token that every change must echo in `X-CSRF-Token` (on top of the cross-origin refusal of
//! [`server_kit::web_guard`]). One-time login links (15 minutes by default) are how a
//! deployment without an identity provider signs people in.

use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use server_kit::web_auth::{cookie, random_token, same, set_cookie, token_hash, token_shaped};

use crate::Hub;
use crate::auth::User;
use crate::error::{HubError, HubResult};
use crate::ids::now_ms;
use crate::maintenance::{DAY_MS, HOUR_MS, parse_duration_ms};

/// The session cookie.
pub const COOKIE: &str = "unicas_hub";
/// The header a change made with the cookie must carry.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// A session's last use is written at most this often.
const TOUCH_EVERY_MS: i64 = 60_000;

/// Browser sign-in settings.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// `UNICAS_HUB_OIDC_PROVIDERS`: a JSON array of OpenID Connect providers (`name`,
    /// `issuer`, `client_id`, optional `client_secret`, `display_name`, `scopes`); their
    /// redirect URI is `<public URL>/auth/oidc/callback`.
    pub oidc_providers: Vec<server_kit::oidc::OidcProvider>,
    /// `UNICAS_HUB_WEB_SESSION_MAX`, default `7d`: a session's whole life.
    pub session_max_ms: u64,
    /// `UNICAS_HUB_WEB_SESSION_IDLE`, default `12h`: a session unused this long ends.
    pub session_idle_ms: u64,
    /// `UNICAS_HUB_LOGIN_LINK_TTL`, default `15m`.
    pub login_link_ttl_ms: u64,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            oidc_providers: Vec::new(),
            session_max_ms: 7 * DAY_MS,
            session_idle_ms: 12 * HOUR_MS,
            login_link_ttl_ms: 15 * 60_000,
        }
    }
}

impl WebConfig {
    pub fn from_env() -> anyhow::Result<Self> {
        let mut c = WebConfig::default();
        if let Some(v) = crate::config::env("UNICAS_HUB_OIDC_PROVIDERS") {
            c.oidc_providers = serde_json::from_str(&v).map_err(|e| {
                anyhow::anyhow!("UNICAS_HUB_OIDC_PROVIDERS is not a JSON array of providers: {e}")
            })?;
        }
        for (name, slot) in [
            ("UNICAS_HUB_WEB_SESSION_MAX", &mut c.session_max_ms),
            ("UNICAS_HUB_WEB_SESSION_IDLE", &mut c.session_idle_ms),
            ("UNICAS_HUB_LOGIN_LINK_TTL", &mut c.login_link_ttl_ms),
        ] {
            if let Some(v) = crate::config::env(name) {
                *slot = parse_duration_ms(&v).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
                if *slot == 0 {
                    anyhow::bail!("{name} must be longer than zero");
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for p in &c.oidc_providers {
            if !token_shaped(&p.name) || !names.insert(p.name.as_str()) {
                anyhow::bail!(
                    "UNICAS_HUB_OIDC_PROVIDERS: {:?} is not a unique name of letters, digits, - and _",
                    p.name
                );
            }
        }
        Ok(c)
    }
}

fn hex_hash(secret: &str) -> String {
    hex::encode(token_hash(secret))
}

impl Hub {
    /// The origin links printed for people point at.
    pub fn public_base(&self) -> String {
        self.config
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", self.config.listen))
    }

    pub(crate) fn secure_cookies(&self) -> bool {
        self.public_base().starts_with("https://")
    }

    /// A one-time link that signs `user_id` in (the user must exist and not be suspended).
    pub async fn login_link(&self, user_id: &str) -> HubResult<String> {
        if self.user_standing(user_id).await?.is_none() {
            return Err(HubError::not_found(format!(
                "no user {user_id:?} (or it is suspended)"
            )));
        }
        let secret = random_token();
        let now = now_ms();
        let ttl = i64::try_from(self.config.web.login_link_ttl_ms).unwrap_or(i64::MAX);
        self.store
            .create_login_link(&hex_hash(&secret), user_id, now, now.saturating_add(ttl))
            .await?;
        Ok(format!("{}/auth/link/{secret}", self.public_base()))
    }

    /// Uses a login link: a session for its user, or `None` if it is unknown, used or expired.
    pub async fn use_login_link(&self, secret: &str) -> HubResult<Option<Response>> {
        if !token_shaped(secret) {
            return Ok(None);
        }
        let Some(user_id) = self
            .store
            .consume_login_link(&hex_hash(secret), now_ms())
            .await?
        else {
            return Ok(None);
        };
        let Some(user) = self.user_standing(&user_id).await? else {
            return Ok(None);
        };
        self.start_web_session(&user, "/").await.map(Some)
    }

    /// Signs `user` in: a new session, its cookie, and a redirect to `next`.
    pub async fn start_web_session(&self, user: &User, next: &str) -> HubResult<Response> {
        let secret = random_token();
        let now = now_ms();
        let max = i64::try_from(self.config.web.session_max_ms).unwrap_or(i64::MAX);
        self.store
            .create_web_session(
                &hex_hash(&secret),
                &user.id,
                &random_token(),
                now,
                now.saturating_add(max),
            )
            .await?;
        if let Err(e) = self.claim_invitations(user).await {
            tracing::warn!(user = %user.id, error = %e, "cannot claim invitations yet");
        }
        tracing::info!(user = %user.id, "browser sign-in");
        let mut response = Redirect::to(local_path(next)).into_response();
        *response.status_mut() = StatusCode::SEE_OTHER;
        response.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(COOKIE, &secret, "/", max / 1000, self.secure_cookies()),
        );
        Ok(response)
    }

    /// The signed-in user of a browser request and its CSRF token; `None` without a cookie
    /// (or with one that names no live session). A change without the session's CSRF token
    /// is refused.
    pub async fn web_caller(
        &self,
        method: &Method,
        headers: &HeaderMap,
    ) -> HubResult<Option<(User, String)>> {
        let Some(secret) = cookie(headers, COOKIE).filter(|s| token_shaped(s)) else {
            return Ok(None);
        };
        let hash = hex_hash(&secret);
        let Some(row) = self.store.web_session(&hash).await? else {
            return Ok(None);
        };
        let now = now_ms();
        let idle = i64::try_from(self.config.web.session_idle_ms).unwrap_or(i64::MAX);
        if now >= row.expires_at_ms || now - row.last_seen_at_ms > idle {
            self.store.delete_web_session(&hash).await?;
            return Ok(None);
        }
        let Some(user) = self.user_standing(&row.user_id).await? else {
            self.store.delete_web_session(&hash).await?;
            return Ok(None);
        };
        if !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            let given = headers
                .get(CSRF_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !same(given, &row.csrf_token) {
                return Err(HubError::new(
                    StatusCode::FORBIDDEN,
                    "CSRF_TOKEN_INVALID",
                    "a change made from a signed-in browser must carry the session's X-CSRF-Token",
                ));
            }
        }
        if now - row.last_seen_at_ms > TOUCH_EVERY_MS
            && let Err(e) = self.store.touch_web_session(&hash, now).await
        {
            tracing::warn!(error = %e, "cannot record a web session's use");
        }
        Ok(Some((user, row.csrf_token)))
    }

    /// Ends the browser's session (if any) and answers with a cookie that clears it.
    pub async fn end_web_session(&self, headers: &HeaderMap) -> HubResult<Response> {
        if let Some(secret) = cookie(headers, COOKIE).filter(|s| token_shaped(s)) {
            self.store.delete_web_session(&hex_hash(&secret)).await?;
        }
        let mut response = crate::error::ok(crate::api::envelope::Empty {});
        response.headers_mut().append(
            header::SET_COOKIE,
            set_cookie(COOKIE, "", "/", 0, self.secure_cookies()),
        );
        Ok(response)
    }
}

/// `next` if it is a path of this site, else `/` (never an open redirect).
pub fn local_path(next: &str) -> &str {
    let ok = next.starts_with('/')
        && !next.starts_with("//")
        && !next.starts_with("/\\")
        && next.len() <= 2048
        && !next.chars().any(char::is_control);
    if ok { next } else { "/" }
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn only_local_paths_are_followed() {
        assert_eq!(local_path("/projects/p1?x=1"), "/projects/p1?x=1");
        for bad in [
            "https://evil.example/",
            "//evil.example",
            "/\\evil",
            "",
            "x",
            "/a\nb",
        ] {
            assert_eq!(local_path(bad), "/", "{bad:?}");
        }
    }
}
