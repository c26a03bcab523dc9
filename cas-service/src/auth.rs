//! Space capabilities: JWTs from registered App issuers, verified before any storage access.
//!
//! A token's header `kid` selects one of its App's keys (EdDSA, ES256 or RS256; never `none`
//! and never an HMAC algorithm); its `iss` maps to exactly one App, which must equal the
//! query's `appId`; `aud` must be the data-plane audience; `exp`, `nbf` and `iat` are checked
//! with a small leeway; one of its `grants` must select the query's `spaceId` and hold the exact
//! permission; a suspended App is refused. The issuer registry is cached and fails closed
//! when it cannot be refreshed for twice its cache time.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cas_format::{AppId, SpaceId};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::error::ApiError;
use crate::meta::MetaStore;

pub use cas_format::wire::permission;

/// The algorithms an App key may use.
pub fn parse_algorithm(alg: &str) -> Option<Algorithm> {
    match alg {
        "EdDSA" => Some(Algorithm::EdDSA),
        "ES256" => Some(Algorithm::ES256),
        "RS256" => Some(Algorithm::RS256),
        _ => None,
    }
}

/// Parses a public key PEM for `alg`; used when registering and when loading keys.
pub fn decoding_key(alg: Algorithm, pem: &str) -> Result<DecodingKey, String> {
    let key = match alg {
        Algorithm::EdDSA => DecodingKey::from_ed_pem(pem.as_bytes()),
        Algorithm::ES256 => DecodingKey::from_ec_pem(pem.as_bytes()),
        Algorithm::RS256 => DecodingKey::from_rsa_pem(pem.as_bytes()),
        other => return Err(format!("algorithm {other:?} is not accepted for App keys")),
    };
    key.map_err(|e| format!("not a valid {alg:?} public key PEM: {e}"))
}

/// What the registry knows of one App.
pub struct AppAuth {
    pub app_id: AppId,
    pub suspended: bool,
    keys: HashMap<String, (Algorithm, DecodingKey)>,
}

struct Snapshot {
    loaded_at: Instant,
    by_issuer: HashMap<String, Arc<AppAuth>>,
}

/// The cached issuer registry.
pub struct Registry {
    meta: MetaStore,
    ttl: Duration,
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    refresh: tokio::sync::Mutex<()>,
}

impl Registry {
    pub fn new(meta: MetaStore, ttl: Duration) -> Self {
        Registry {
            meta,
            ttl,
            snapshot: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Option<Arc<Snapshot>> {
        self.snapshot
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Forces the next lookup to reload (after a change made by this process).
    pub fn invalidate(&self) {
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = None;
    }

    async fn load(&self) -> Result<Snapshot, sqlx::Error> {
        let apps = self.meta.list_apps().await?;
        let keys = self.meta.list_keys(None).await?;
        let mut by_app: HashMap<AppId, HashMap<String, (Algorithm, DecodingKey)>> = HashMap::new();
        for k in keys.into_iter().filter(|k| k.revoked_at.is_none()) {
            let Some(alg) = parse_algorithm(&k.alg) else {
                tracing::warn!(app = %k.app_id, kid = %k.kid, alg = %k.alg, "skipping key with unsupported algorithm");
                continue;
            };
            match decoding_key(alg, &k.public_key_pem) {
                Ok(key) => {
                    by_app
                        .entry(k.app_id)
                        .or_default()
                        .insert(k.kid, (alg, key));
                }
                Err(e) => {
                    tracing::warn!(app = %k.app_id, kid = %k.kid, error = %e, "skipping unreadable key")
                }
            }
        }
        let by_issuer = apps
            .into_iter()
            .map(|a| {
                let keys = by_app.remove(&a.app_id).unwrap_or_default();
                (
                    a.issuer,
                    Arc::new(AppAuth {
                        app_id: a.app_id,
                        suspended: a.suspended,
                        keys,
                    }),
                )
            })
            .collect();
        Ok(Snapshot {
            loaded_at: Instant::now(),
            by_issuer,
        })
    }

    /// The App of an issuer, from a registry no older than the cache time if it can be
    /// refreshed, and never older than twice the cache time.
    pub async fn lookup(&self, issuer: &str) -> Result<Option<Arc<AppAuth>>, ApiError> {
        let fresh = |s: &Snapshot| s.loaded_at.elapsed() < self.ttl;
        let snap = match self.current() {
            Some(s) if fresh(&s) => s,
            stale => {
                let _guard = self.refresh.lock().await;
                match self.current() {
                    Some(s) if fresh(&s) => s,
                    _ => match self.load().await {
                        Ok(s) => {
                            let s = Arc::new(s);
                            *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) =
                                Some(s.clone());
                            s
                        }
                        Err(e) => match stale {
                            Some(s) if s.loaded_at.elapsed() < self.ttl * 2 => {
                                tracing::warn!(error = %e, "issuer registry refresh failed; using the cached copy");
                                s
                            }
                            _ => {
                                tracing::error!(error = %e, "issuer registry unavailable; refusing capabilities");
                                return Err(ApiError::unavailable(
                                    "the issuer registry is unavailable; retry",
                                ));
                            }
                        },
                    },
                }
            }
        };
        Ok(snap.by_issuer.get(issuer).cloned())
    }
}

#[derive(Debug, Deserialize)]
struct Grant {
    #[serde(rename = "spaceId")]
    space_id: String,
    permissions: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Claims {
    iss: String,
    exp: i64,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    iat: Option<i64>,
    #[serde(default)]
    grants: Vec<Grant>,
}

#[derive(Debug, Deserialize)]
struct PeekHeader {
    alg: Option<String>,
    kid: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PeekClaims {
    iss: Option<String>,
}

/// A verified capability for one (App, Space).
#[derive(Debug, Clone)]
pub struct Capability {
    pub app: AppId,
    pub space: SpaceId,
    /// Who acts: the token's `sub`, else its issuer.
    pub actor: String,
}

/// The one answer to every token that does not verify, whatever the reason (malformed, unknown
/// key, wrong algorithm, bad signature, expired, wrong audience, too long-lived): telling the
/// reasons apart would let anyone probe which keys an issuer has registered. The reason is
/// logged at debug level.
fn invalid(reason: &str) -> ApiError {
    tracing::debug!(reason, "capability refused");
    ApiError::unauthorized(
        "invalid_token",
        "the capability is invalid, expired or not for this service",
    )
}

fn peek<T: for<'de> Deserialize<'de>>(segment: &str) -> Result<T, ApiError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(segment.trim_end_matches('='))
        .map_err(|_| invalid("the token is not a JWT"))?;
    serde_json::from_slice(&bytes).map_err(|_| invalid("the token is not a JWT"))
}

/// Checks bounds and options that a capability must meet besides its signature.
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions<'a> {
    pub audience: &'a str,
    pub leeway_s: u64,
    /// Longest `exp − iat` accepted (`0` = no limit).
    pub max_lifetime_s: u64,
}

/// The bearer token of a request.
pub fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers.get(AUTHORIZATION).ok_or_else(|| {
        ApiError::unauthorized("AUTH_REQUIRED", "a bearer capability is required")
    })?;
    let value = value
        .to_str()
        .map_err(|_| invalid("the Authorization header is not ASCII"))?;
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(ApiError::unauthorized(
            "AUTH_REQUIRED",
            "the Authorization header must be `Bearer <capability>`",
        )),
    }
}

/// Verifies a capability for `permission` on (app, space).
pub async fn verify(
    registry: &Registry,
    headers: &HeaderMap,
    app: &AppId,
    space: &SpaceId,
    permission: &str,
    options: VerifyOptions<'_>,
) -> Result<Capability, ApiError> {
    let token = bearer(headers)?;
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(_sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid("the token is not a JWT"));
    };
    let header: PeekHeader = peek(h)?;
    let alg_name = header.alg.unwrap_or_default();
    let Some(alg) = parse_algorithm(&alg_name) else {
        return Err(invalid("the algorithm is not EdDSA, ES256 or RS256"));
    };
    let issuer = peek::<PeekClaims>(c)?
        .iss
        .ok_or_else(|| invalid("the token has no issuer"))?;
    let Some(app_auth) = registry.lookup(&issuer).await? else {
        return Err(ApiError::unauthorized(
            "unknown_issuer",
            "the token's issuer is not registered",
        ));
    };
    let kid = header.kid.ok_or_else(|| invalid("the token has no kid"))?;
    let Some((key_alg, key)) = app_auth.keys.get(&kid) else {
        return Err(invalid("the kid names no active key of its issuer"));
    };
    if *key_alg != alg {
        return Err(invalid("the algorithm does not match the key"));
    }
    let leeway_s = options.leeway_s;
    let mut validation = Validation::new(alg);
    validation.set_audience(&[options.audience]);
    validation.set_issuer(&[issuer.as_str()]);
    validation.leeway = leeway_s;
    validation.validate_nbf = true;
    validation.set_required_spec_claims(&["exp", "iss", "aud"]);
    let claims = jsonwebtoken::decode::<Claims>(token, key, &validation)
        .map_err(|e| match e.kind() {
            ErrorKind::ExpiredSignature => invalid("expired"),
            ErrorKind::ImmatureSignature => invalid("not valid yet"),
            ErrorKind::InvalidAudience => invalid("wrong audience"),
            ErrorKind::InvalidSignature => invalid("bad signature"),
            _ => invalid("cannot be verified"),
        })?
        .claims;
    let now = crate::now_ms() / 1000;
    if let Some(iat) = claims.iat
        && iat > now + leeway_s as i64
    {
        return Err(invalid("issued in the future"));
    }
    if options.max_lifetime_s > 0 {
        let from = claims.iat.unwrap_or(now).min(now);
        let lifetime = claims.exp.saturating_sub(from);
        if lifetime > (options.max_lifetime_s + leeway_s) as i64 {
            return Err(invalid("lives longer than the service accepts"));
        }
    }
    if app_auth.app_id != *app {
        return Err(ApiError::forbidden(
            "APP_MISMATCH",
            "the token's issuer belongs to another App",
        ));
    }
    if app_auth.suspended {
        return Err(ApiError::forbidden("APP_SUSPENDED", "the App is suspended"));
    }
    let Some(grant) = claims.grants.iter().find(|g| g.space_id == space.as_str()) else {
        return Err(ApiError::forbidden(
            "SPACE_NOT_GRANTED",
            "the token grants nothing in this Space",
        ));
    };
    if !grant.permissions.iter().any(|p| p == permission) {
        return Err(ApiError::forbidden(
            "PERMISSION_DENIED",
            format!("the token's grant lacks {permission}"),
        ));
    }
    Ok(Capability {
        app: app.clone(),
        space: space.clone(),
        actor: claims.sub.unwrap_or(claims.iss),
    })
}
