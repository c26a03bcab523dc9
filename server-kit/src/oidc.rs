//! OpenID Connect sign-in, the protocol half: authorization code flow with PKCE against any
//! number of configured providers found by discovery from their issuer URL. Where a pending
//! sign-in is kept, and which account an identity is, belong to the program that signs in.
//!
//! Start: a random `state`, `nonce` and PKCE verifier, and a browser secret (for a short-lived
//! HttpOnly cookie); the caller stores the pending sign-in under [`login_key`] of state and
//! browser, so only the browser that started it can finish it. Finish: the code is exchanged
//! with the verifier, and the ID token is verified with the provider's published keys:
//! signature (an asymmetric algorithm only), issuer, audience = client id, time bounds, nonce.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::web_auth::{random_token, url_safe};

/// How long discovered metadata and keys are reused.
const METADATA_TTL: Duration = Duration::from_secs(600);
/// How long a started sign-in may take, in milliseconds.
pub const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;
/// Largest discovery or key document read.
const MAX_DOCUMENT: usize = 1 << 20;

/// An OpenID Connect provider (Google, Microsoft, Keycloak, Dex, …), found by discovery from
/// its issuer URL.
#[derive(Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct OidcProvider {
    /// Short name used in URLs.
    pub name: String,
    /// Shown on the sign-in page.
    #[serde(default)]
    pub display_name: Option<String>,
    pub issuer: String,
    pub client_id: String,
    #[serde(default)]
    pub client_secret: Option<String>,
    /// Default `openid email profile`.
    #[serde(default)]
    pub scopes: Option<String>,
}

impl std::fmt::Debug for OidcProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OidcProvider")
            .field("name", &self.name)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// A started sign-in, kept by the caller until its callback.
#[derive(Debug, Clone)]
pub struct PendingLogin {
    pub provider: String,
    pub nonce: String,
    pub pkce_verifier: String,
}

/// What [`OidcClient::start`] hands back: where to send the browser, and what to keep.
#[derive(Debug)]
pub struct Started {
    /// The provider's authorization URL with every parameter.
    pub redirect: String,
    /// The key to store `login` under (state bound to `browser`).
    pub key: String,
    /// The secret for the browser's sign-in cookie.
    pub browser: String,
    pub login: PendingLogin,
}

/// A verified identity.
#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    pub sub: String,
    nonce: Option<String>,
    pub email: Option<String>,
    #[serde(default)]
    pub email_verified: Option<bool>,
    pub name: Option<String>,
}

/// Why a sign-in failed.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The provider could not be reached or answered nonsense (502: try again).
    #[error("{0}; try again")]
    Upstream(String),
    #[error("the provider refused the sign-in: {0}")]
    Denied(String),
    #[error("the provider refused the authorization code")]
    CodeRejected,
    #[error("the ID token is invalid: {0}")]
    TokenInvalid(&'static str),
    #[error("the ID token has expired")]
    TokenExpired,
    #[error("the ID token was not issued for this sign-in")]
    NonceMismatch,
}

impl OidcError {
    /// A stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            OidcError::Upstream(_) => "OIDC_PROVIDER_ERROR",
            OidcError::Denied(_) => "OIDC_DENIED",
            OidcError::CodeRejected => "OIDC_CODE_REJECTED",
            OidcError::TokenInvalid(_) => "OIDC_TOKEN_INVALID",
            OidcError::TokenExpired => "OIDC_TOKEN_EXPIRED",
            OidcError::NonceMismatch => "OIDC_NONCE_MISMATCH",
        }
    }
}

/// The key a pending sign-in is stored under: its `state` bound to the browser's secret, so
/// only the browser that started it can finish it (a `state` lured into another browser finds
/// nothing).
pub fn login_key(state: &str, browser: &str) -> String {
    hex(&Sha256::digest(format!("{state}\0{browser}").as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
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

/// Discovers providers (metadata and keys cached for a while) and runs sign-ins.
pub struct OidcClient {
    http: reqwest::Client,
    entries: Mutex<HashMap<String, (Instant, Discovery, JwkSet)>>,
}

impl std::fmt::Debug for OidcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OidcClient")
    }
}

fn upstream(context: &str, e: impl std::fmt::Display) -> OidcError {
    tracing::warn!(error = %e, "{context}");
    OidcError::Upstream(context.to_string())
}

impl OidcClient {
    pub fn new(http: reqwest::Client) -> Self {
        OidcClient {
            http,
            entries: Mutex::default(),
        }
    }

    /// With an HTTP client of its own (10 s per request, no redirects).
    pub fn standalone() -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        OidcClient::new(http)
    }

    async fn fetch_json<T: for<'de> Deserialize<'de>>(
        &self,
        url: &str,
        context: &str,
    ) -> Result<T, OidcError> {
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| upstream(context, e))?;
        if !resp.status().is_success() {
            return Err(upstream(context, resp.status()));
        }
        let bytes = resp.bytes().await.map_err(|e| upstream(context, e))?;
        if bytes.len() > MAX_DOCUMENT {
            return Err(upstream(context, "answer too large"));
        }
        serde_json::from_slice(&bytes).map_err(|e| upstream(context, e))
    }

    async fn metadata(
        &self,
        p: &OidcProvider,
        refresh: bool,
    ) -> Result<(Discovery, JwkSet), OidcError> {
        if !refresh
            && let Some((at, d, k)) = self
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
        let d: Discovery = self.fetch_json(&url, "provider discovery failed").await?;
        if d.issuer.trim_end_matches('/') != p.issuer.trim_end_matches('/') {
            return Err(upstream(
                "provider discovery failed",
                "the issuer does not match the configuration",
            ));
        }
        let keys: JwkSet = self
            .fetch_json(&d.jwks_uri, "fetching the provider's keys failed")
            .await?;
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p.name.clone(), (Instant::now(), d.clone(), keys.clone()));
        Ok((d, keys))
    }

    /// Starts a sign-in with `p`, whose callback is `redirect_uri`.
    pub async fn start(&self, p: &OidcProvider, redirect_uri: &str) -> Result<Started, OidcError> {
        let (d, _) = self.metadata(p, false).await?;
        let state = random_token();
        let browser = random_token();
        let login = PendingLogin {
            provider: p.name.clone(),
            nonce: random_token(),
            pkce_verifier: random_token(),
        };
        let challenge = url_safe(&Sha256::digest(login.pkce_verifier.as_bytes()));
        let scopes = p.scopes.as_deref().unwrap_or("openid email profile");
        let query = form(&[
            ("response_type", "code"),
            ("client_id", &p.client_id),
            ("redirect_uri", redirect_uri),
            ("scope", scopes),
            ("state", &state),
            ("nonce", &login.nonce),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
        ]);
        let sep = if d.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        Ok(Started {
            redirect: format!("{}{sep}{query}", d.authorization_endpoint),
            key: login_key(&state, &browser),
            browser,
            login,
        })
    }

    /// Finishes a sign-in: exchanges `code` and verifies the ID token against `login`.
    pub async fn finish(
        &self,
        p: &OidcProvider,
        login: &PendingLogin,
        code: &str,
        redirect_uri: &str,
        leeway_s: u64,
    ) -> Result<Claims, OidcError> {
        let (d, _) = self.metadata(p, false).await?;
        let mut fields = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("client_id", p.client_id.as_str()),
            ("code_verifier", login.pkce_verifier.as_str()),
        ];
        if let Some(secret) = &p.client_secret {
            fields.push(("client_secret", secret));
        }
        let resp = self
            .http
            .post(&d.token_endpoint)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&fields))
            .send()
            .await
            .map_err(|e| upstream("the code exchange failed", e))?;
        if !resp.status().is_success() {
            return Err(OidcError::CodeRejected);
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| upstream("the code exchange failed", e))?;
        if bytes.len() > MAX_DOCUMENT {
            return Err(upstream("the code exchange failed", "answer too large"));
        }
        let answer: TokenAnswer =
            serde_json::from_slice(&bytes).map_err(|e| upstream("the code exchange failed", e))?;
        let claims = self
            .verify_id_token(p, &d, &answer.id_token, leeway_s)
            .await?;
        if claims.nonce.as_deref() != Some(login.nonce.as_str()) {
            return Err(OidcError::NonceMismatch);
        }
        Ok(claims)
    }

    async fn verify_id_token(
        &self,
        p: &OidcProvider,
        d: &Discovery,
        token: &str,
        leeway_s: u64,
    ) -> Result<Claims, OidcError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| OidcError::TokenInvalid("malformed"))?;
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
            return Err(OidcError::TokenInvalid("unsupported algorithm"));
        }
        let mut found = None;
        for refresh in [false, true] {
            let (_, keys) = self.metadata(p, refresh).await?;
            found = match &header.kid {
                Some(kid) => keys.find(kid).cloned(),
                None => keys.keys.first().cloned(),
            };
            if found.is_some() {
                break;
            }
        }
        let jwk = found.ok_or(OidcError::TokenInvalid("signed with an unknown key"))?;
        let key =
            DecodingKey::from_jwk(&jwk).map_err(|_| OidcError::TokenInvalid("unusable key"))?;
        let mut validation = Validation::new(header.alg);
        validation.set_audience(&[p.client_id.as_str()]);
        validation.set_issuer(&[d.issuer.as_str()]);
        validation.leeway = leeway_s;
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map(|t| t.claims)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => OidcError::TokenExpired,
                jsonwebtoken::errors::ErrorKind::InvalidAudience => {
                    OidcError::TokenInvalid("wrong audience")
                }
                jsonwebtoken::errors::ErrorKind::InvalidIssuer => {
                    OidcError::TokenInvalid("wrong issuer")
                }
                jsonwebtoken::errors::ErrorKind::InvalidSignature => {
                    OidcError::TokenInvalid("bad signature")
                }
                _ => OidcError::TokenInvalid("cannot be verified"),
            })
    }
}

/// `k=v&…` with every value percent-encoded.
fn form(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{k}={}", crate::web_auth::urlencode(v)))
        .collect::<Vec<_>>()
        .join("&")
}
