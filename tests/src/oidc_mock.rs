//! A small OpenID Connect provider for tests: discovery, an authorize endpoint that approves at
//! once as a configurable user, a token endpoint that checks the PKCE verifier and signs ID
//! tokens (RS256) with a real key, and the key set. Misbehaviour (another nonce, an expired
//! token) is switched on per test.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Who signs in, and how the provider misbehaves.
#[derive(Debug, Clone)]
pub struct Behaviour {
    pub subject: String,
    pub email: Option<String>,
    pub email_verified: bool,
    /// Put this nonce in ID tokens instead of the one asked for.
    pub nonce_override: Option<String>,
    /// Seconds from now to the ID token's `exp` (negative: already expired).
    pub expires_in: i64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            subject: "user-1".into(),
            email: Some("admin@example.test".into()),
            email_verified: true,
            nonce_override: None,
            expires_in: 300,
        }
    }
}

struct Pending {
    nonce: String,
    challenge: String,
    client_id: String,
}

struct MockState {
    issuer: String,
    key: EncodingKey,
    jwks: Value,
    behaviour: Mutex<Behaviour>,
    codes: Mutex<HashMap<String, Pending>>,
}

/// A running mock provider.
pub struct MockOidc {
    pub issuer: String,
    state: Arc<MockState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockOidc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn rsa_key(dir: &std::path::Path) -> anyhow::Result<(String, String)> {
    // A file of its own: mocks of tests running at once in the same directory must not read
    // each other's half-written keys. Removed when this returns.
    let file = tempfile::Builder::new()
        .prefix("oidc-rsa-")
        .suffix(".pem")
        .tempfile_in(dir)?;
    let path = file.path().to_path_buf();
    let ok = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&path)
        .stderr(std::process::Stdio::null())
        .status()?
        .success();
    if !ok {
        bail!("openssl could not make an RSA key");
    }
    let modulus = Command::new("openssl")
        .args(["rsa", "-noout", "-modulus", "-in"])
        .arg(&path)
        .output()?;
    let text = String::from_utf8(modulus.stdout)?;
    let hex = text.trim().strip_prefix("Modulus=").with_context(|| {
        format!(
            "openssl printed no modulus ({}): {}",
            modulus.status,
            String::from_utf8_lossy(&modulus.stderr).trim()
        )
    })?;
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<_, _>>()?;
    Ok((
        std::fs::read_to_string(&path)?,
        URL_SAFE_NO_PAD.encode(bytes),
    ))
}

fn decode_form(body: &str) -> HashMap<String, String> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%'
                && i + 2 < b.len()
                && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    body.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

impl MockOidc {
    pub async fn start(dir: &std::path::Path) -> anyhow::Result<Self> {
        let (pem, modulus) = rsa_key(dir)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let issuer = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(MockState {
            issuer: issuer.clone(),
            key: EncodingKey::from_rsa_pem(pem.as_bytes())?,
            jwks: json!({"keys": [{"kty": "RSA", "kid": "mock-1", "use": "sig", "alg": "RS256", "n": modulus, "e": "AQAB"}]}),
            behaviour: Mutex::new(Behaviour::default()),
            codes: Mutex::new(HashMap::new()),
        });
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route(
                "/jwks",
                get(|State(s): State<Arc<MockState>>| async move { Json(s.jwks.clone()) }),
            )
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(MockOidc {
            issuer,
            state,
            task,
        })
    }

    /// Sets who signs in next and how.
    pub fn set(&self, b: Behaviour) {
        *self
            .state
            .behaviour
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = b;
    }

    /// The provider entry of the service configuration (`UNICAS_OIDC_PROVIDERS`).
    pub fn provider_config(&self, name: &str) -> String {
        json!([{"name": name, "display_name": "Mock provider", "issuer": self.issuer,
                "client_id": "unicas-admin", "client_secret": "mock-secret"}])
        .to_string()
    }
}

async fn discovery(State(s): State<Arc<MockState>>) -> Json<Value> {
    Json(json!({
        "issuer": s.issuer,
        "authorization_endpoint": format!("{}/authorize", s.issuer),
        "token_endpoint": format!("{}/token", s.issuer),
        "jwks_uri": format!("{}/jwks", s.issuer),
        "response_types_supported": ["code"],
        "id_token_signing_alg_values_supported": ["RS256"],
    }))
}

async fn authorize(
    State(s): State<Arc<MockState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (Some(redirect), Some(state), Some(nonce), Some(challenge), Some(client_id)) = (
        q.get("redirect_uri"),
        q.get("state"),
        q.get("nonce"),
        q.get("code_challenge"),
        q.get("client_id"),
    ) else {
        return (StatusCode::BAD_REQUEST, "missing parameters").into_response();
    };
    if q.get("code_challenge_method").map(String::as_str) != Some("S256")
        || q.get("response_type").map(String::as_str) != Some("code")
    {
        return (
            StatusCode::BAD_REQUEST,
            "PKCE S256 and the code flow are required",
        )
            .into_response();
    }
    let code = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>());
    s.codes.lock().unwrap_or_else(|p| p.into_inner()).insert(
        code.clone(),
        Pending {
            nonce: nonce.clone(),
            challenge: challenge.clone(),
            client_id: client_id.clone(),
        },
    );
    Redirect::to(&format!("{redirect}?code={code}&state={state}")).into_response()
}

async fn token(State(s): State<Arc<MockState>>, body: String) -> Response {
    let form = decode_form(&body);
    let Some(pending) = form
        .get("code")
        .and_then(|c| s.codes.lock().unwrap_or_else(|p| p.into_inner()).remove(c))
    else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    };
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    if URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes())) != pending.challenge
        || form.get("client_id") != Some(&pending.client_id)
        || form.get("client_secret").map(String::as_str) != Some("mock-secret")
    {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    }
    let b = s
        .behaviour
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let claims = json!({
        "iss": s.issuer, "aud": pending.client_id, "sub": b.subject, "email": b.email,
        "email_verified": b.email_verified, "name": "Test Admin",
        "nonce": b.nonce_override.unwrap_or(pending.nonce),
        "iat": now - 10, "exp": now + b.expires_in,
    });
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("mock-1".into());
    match jsonwebtoken::encode(&header, &claims, &s.key) {
        Ok(id_token) => {
            Json(json!({"access_token": "unused", "token_type": "Bearer", "id_token": id_token}))
                .into_response()
        }
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// A sign-in at the admin plane of `base` through `provider`, as a browser does it: the start
/// sets a cookie that the callback carries back (unless `same_browser` is false: the callback
/// is then finished by another browser). `tamper` may change the callback URL. Answers the
/// callback's response; redirects are not followed.
pub async fn sign_in(
    base: &str,
    provider: &str,
    tamper: impl FnOnce(String) -> String,
    same_browser: bool,
) -> anyhow::Result<reqwest::Response> {
    sign_in_at(
        &format!("{base}/admin/login/{provider}"),
        "unicas_oidc",
        tamper,
        same_browser,
    )
    .await
}

/// A sign-in that starts at `start_url`, whose binding cookie is `cookie_name` (every other
/// cookie the start sets is carried back too), as [`sign_in`] describes.
pub async fn sign_in_at(
    start_url: &str,
    cookie_name: &str,
    tamper: impl FnOnce(String) -> String,
    same_browser: bool,
) -> anyhow::Result<reqwest::Response> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let start = http.get(start_url).send().await?;
    if !start.status().is_redirection() {
        return Ok(start);
    }
    let all: Vec<String> = start
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let set = all
        .iter()
        .find(|c| c.starts_with(&format!("{cookie_name}=")))
        .context("the start sets the sign-in cookie")?;
    anyhow::ensure!(
        set.contains("HttpOnly"),
        "the sign-in cookie is not HttpOnly: {set}"
    );
    let cookie = all
        .iter()
        .map(|c| c.split(';').next().unwrap_or_default())
        .filter(|c| same_browser || !c.starts_with(&format!("{cookie_name}=")))
        .collect::<Vec<_>>()
        .join("; ");
    let authorize = start.headers()["location"].to_str()?.to_string();
    anyhow::ensure!(
        authorize.contains("code_challenge="),
        "no PKCE: {authorize}"
    );
    let approved = http.get(&authorize).send().await?;
    anyhow::ensure!(
        approved.status().is_redirection(),
        "the provider did not approve: {:?}",
        approved.text().await
    );
    let callback = tamper(approved.headers()["location"].to_str()?.to_string());
    let mut req = http.get(callback);
    if !cookie.is_empty() {
        req = req.header("cookie", cookie);
    }
    Ok(req.send().await?)
}
