//! OpenID Connect sign-in for administrators: authorization code flow with PKCE, against any
//! number of configured providers found by discovery from their issuer URL.
//!
//! Start: a random `state`, `nonce` and PKCE verifier are stored server-side (10 minutes, one
//! use) and the browser is sent to the provider. Callback: the state is taken (once), the code
//! is exchanged with the verifier, and the ID token is verified with the provider's published
//! keys: signature (an asymmetric algorithm only), issuer, audience = client id, time bounds,
//! and the nonce. The identity (provider, subject) resolves to one account; a first sign-in is
//! linked to the account that holds the same verified email. Then admission decides.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::session::{random_token, start_session};
use crate::config::OidcProvider;
use crate::error::{ApiError, ApiResult};
use crate::meta::OidcLogin;
use crate::{Service, now_ms};

/// How long discovered metadata and keys are reused.
const METADATA_TTL: Duration = Duration::from_secs(600);
/// How long a started sign-in may take.
const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;
/// The cookie that binds a started sign-in to the browser that started it.
const BROWSER_COOKIE: &str = "unicas_oidc";

/// The key a pending sign-in is stored under: its `state` bound to the browser's secret, so
/// only the browser that started it can finish it (a `state` lured into another browser finds
/// nothing).
fn login_key(state: &str, browser: &str) -> String {
    hex_of(&Sha256::digest(format!("{state}\0{browser}").as_bytes()))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
}

#[derive(Debug, Deserialize)]
struct TokenAnswer {
    id_token: String,
}

#[derive(Debug, Deserialize)]
struct IdClaims {
    sub: String,
    nonce: Option<String>,
    email: Option<String>,
    #[serde(default)]
    email_verified: Option<bool>,
    name: Option<String>,
}

/// Discovered metadata and keys per provider, with when they were fetched.
#[derive(Default)]
pub struct OidcCache {
    entries: Mutex<HashMap<String, (Instant, Discovery, JwkSet)>>,
}

impl std::fmt::Debug for OidcCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OidcCache")
    }
}

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

fn upstream(context: &str, e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "{context}");
    ApiError::new(
        axum::http::StatusCode::BAD_GATEWAY,
        "OIDC_PROVIDER_ERROR",
        format!("{context}; try again"),
    )
}

async fn fetch_json<T: for<'de> Deserialize<'de>>(
    http: &reqwest::Client,
    url: &str,
    context: &str,
) -> ApiResult<T> {
    let resp = http
        .get(url)
        .send()
        .await
        .map_err(|e| upstream(context, e))?;
    if !resp.status().is_success() {
        return Err(upstream(context, resp.status()));
    }
    let bytes = resp.bytes().await.map_err(|e| upstream(context, e))?;
    if bytes.len() > 1 << 20 {
        return Err(upstream(context, "answer too large"));
    }
    serde_json::from_slice(&bytes).map_err(|e| upstream(context, e))
}

impl Service {
    async fn oidc_metadata(
        &self,
        p: &OidcProvider,
        refresh: bool,
    ) -> ApiResult<(Discovery, JwkSet)> {
        if !refresh
            && let Some((at, d, k)) = self
                .oidc
                .entries
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&p.name)
            && at.elapsed() < METADATA_TTL
        {
            return Ok((d.clone(), k.clone()));
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            p.issuer.trim_end_matches('/')
        );
        let d: Discovery = fetch_json(&self.http, &url, "provider discovery failed").await?;
        if d.issuer.trim_end_matches('/') != p.issuer.trim_end_matches('/') {
            return Err(upstream(
                "provider discovery failed",
                "the issuer does not match the configuration",
            ));
        }
        let keys: JwkSet = fetch_json(
            &self.http,
            &d.jwks_uri,
            "fetching the provider's keys failed",
        )
        .await?;
        self.oidc
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.name.clone(), (Instant::now(), d.clone(), keys.clone()));
        Ok((d, keys))
    }

    /// `GET /admin/login/{provider}`: sends the browser to the provider, with a short-lived
    /// HttpOnly cookie that the callback must present.
    pub async fn oidc_start(&self, name: &str) -> ApiResult<Response> {
        let p = provider(self, name)?;
        let (d, _) = self.oidc_metadata(p, false).await?;
        let state = random_token();
        let browser = random_token();
        let login = OidcLogin {
            provider: p.name.clone(),
            nonce: random_token(),
            pkce_verifier: random_token(),
        };
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(login.pkce_verifier.as_bytes()));
        let now = now_ms();
        self.meta
            .create_oidc_login(
                &login_key(&state, &browser),
                &login,
                now,
                now + LOGIN_TTL_MS,
            )
            .await?;
        let scopes = p
            .scopes
            .clone()
            .unwrap_or_else(|| "openid email profile".into());
        let query = [
            ("response_type", "code"),
            ("client_id", p.client_id.as_str()),
            ("redirect_uri", redirect_uri(self).as_str()),
            ("scope", scopes.as_str()),
            ("state", state.as_str()),
            ("nonce", login.nonce.as_str()),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={}", urlencode(v)))
        .collect::<Vec<_>>()
        .join("&");
        let sep = if d.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        let mut response =
            Redirect::to(&format!("{}{sep}{query}", d.authorization_endpoint)).into_response();
        let secure = self.public_url().starts_with("https://");
        let cookie = format!(
            "{BROWSER_COOKIE}={browser}; Path=/admin/oidc; HttpOnly; SameSite=Lax; Max-Age={}{}",
            LOGIN_TTL_MS / 1000,
            if secure { "; Secure" } else { "" }
        );
        response.headers_mut().append(
            axum::http::header::SET_COOKIE,
            axum::http::HeaderValue::from_str(&cookie)
                .map_err(|e| ApiError::internal("building a cookie", e))?,
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
            return Err(ApiError::unauthorized(
                "OIDC_DENIED",
                format!("the provider refused the sign-in: {e}"),
            ));
        }
        let code = code.ok_or_else(|| ApiError::invalid("the callback carries no code"))?;
        let p = provider(self, &login.provider)?;
        let (d, _) = self.oidc_metadata(p, false).await?;
        let mut form = vec![
            ("grant_type", "authorization_code".to_string()),
            ("code", code.to_string()),
            ("redirect_uri", redirect_uri(self)),
            ("client_id", p.client_id.clone()),
            ("code_verifier", login.pkce_verifier.clone()),
        ];
        if let Some(secret) = &p.client_secret {
            form.push(("client_secret", secret.clone()));
        }
        let body = form
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let resp = self
            .http
            .post(&d.token_endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| upstream("the code exchange failed", e))?;
        if !resp.status().is_success() {
            return Err(ApiError::unauthorized(
                "OIDC_CODE_REJECTED",
                "the provider refused the authorization code",
            ));
        }
        let answer: TokenAnswer = resp
            .json()
            .await
            .map_err(|e| upstream("the code exchange failed", e))?;
        let claims = self.verify_id_token(p, &d, &answer.id_token).await?;
        if claims.nonce.as_deref() != Some(login.nonce.as_str()) {
            return Err(ApiError::unauthorized(
                "OIDC_NONCE_MISMATCH",
                "the ID token was not issued for this sign-in",
            ));
        }
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
            axum::http::HeaderValue::from_static(
                "unicas_oidc=; Path=/admin/oidc; HttpOnly; SameSite=Lax; Max-Age=0",
            ),
        );
        Ok(response)
    }

    async fn verify_id_token(
        &self,
        p: &OidcProvider,
        d: &Discovery,
        token: &str,
    ) -> ApiResult<IdClaims> {
        let invalid = |m: &str| {
            ApiError::unauthorized(
                "OIDC_TOKEN_INVALID",
                format!("the ID token is invalid: {m}"),
            )
        };
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("malformed"))?;
        if !matches!(
            header.alg,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::ES256
                | Algorithm::ES384
                | Algorithm::PS256
                | Algorithm::EdDSA
        ) {
            return Err(invalid("unsupported algorithm"));
        }
        let mut found = None;
        for refresh in [false, true] {
            let (_, keys) = self.oidc_metadata(p, refresh).await?;
            found = match &header.kid {
                Some(kid) => keys.find(kid).cloned(),
                None => keys.keys.first().cloned(),
            };
            if found.is_some() {
                break;
            }
        }
        let jwk = found.ok_or_else(|| invalid("signed with an unknown key"))?;
        let key = DecodingKey::from_jwk(&jwk).map_err(|_| invalid("unusable key"))?;
        let mut validation = Validation::new(header.alg);
        validation.set_audience(&[p.client_id.as_str()]);
        validation.set_issuer(&[d.issuer.as_str()]);
        validation.leeway = self.config.auth_leeway_s;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<IdClaims>(token, &key, &validation)
            .map(|t| t.claims)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => {
                    ApiError::unauthorized("OIDC_TOKEN_EXPIRED", "the ID token has expired")
                }
                jsonwebtoken::errors::ErrorKind::InvalidAudience => invalid("wrong audience"),
                jsonwebtoken::errors::ErrorKind::InvalidIssuer => invalid("wrong issuer"),
                jsonwebtoken::errors::ErrorKind::InvalidSignature => invalid("bad signature"),
                _ => invalid("cannot be verified"),
            })
    }
}

/// Percent-encodes a query or form value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
