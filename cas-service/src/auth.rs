//! Space capabilities: JWTs from registered App issuers, verified before any storage access.
//!
//! A token's header `kid` selects one of its App's keys (EdDSA, ES256 or RS256; never `none`
//! and never an HMAC algorithm); its `iss` maps to exactly one App, which must equal the
//! query's `appId`; `aud` must be the data-plane audience; `exp`, `nbf` and `iat` are checked
//! with a small leeway; one of its `grants` must select the query's `spaceId` and hold the exact
//! permission (both claim shapes, this service's and the public contract's `ver: 2`, are in
//! `crate::capability`); a suspended App is refused. The issuer registry is cached and fails closed
//! when it cannot be refreshed for twice its cache time.
//!
//! Signature checks dominate the cost of a request that is otherwise a cached read, and a
//! client sends the same capability many times: a token whose signature verified is
//! remembered (by the SHA-256 of its text) together with the registry snapshot that verified
//! it, and is trusted again only while that snapshot is current. Its times (`exp`, `nbf`,
//! `iat`, lifetime) and its grants are checked on every request all the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cas_format::{AppId, SpaceId};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::capability::{Access, Claims, UPSTREAM_TYP};
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

/// How many verified tokens are remembered at most (the set is emptied when it is full).
const VERIFIED_TOKENS: usize = 4096;
/// Longer tokens are verified on every use instead: what is remembered stays within a few
/// MiB whatever clients send.
const MAX_REMEMBERED_TOKEN_BYTES: usize = 2048;

/// A token whose signature verified, and under which App record.
struct Verified {
    issuer: String,
    /// The registry's record of the App when the signature verified: the entry holds only
    /// while the registry still serves this very record.
    auth: Arc<AppAuth>,
    claims: Arc<Claims>,
}

/// The cached issuer registry.
pub struct Registry {
    meta: MetaStore,
    ttl: Duration,
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    refresh: tokio::sync::Mutex<()>,
    verified: Mutex<HashMap<[u8; 32], Verified>>,
}

impl Registry {
    pub fn new(meta: MetaStore, ttl: Duration) -> Self {
        Registry {
            meta,
            ttl,
            snapshot: RwLock::new(None),
            refresh: tokio::sync::Mutex::new(()),
            verified: Mutex::new(HashMap::new()),
        }
    }

    fn verified(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Verified>> {
        self.verified.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A token verified before under the record the registry serves now.
    async fn recall(
        &self,
        digest: &[u8; 32],
    ) -> Result<Option<(Arc<AppAuth>, Arc<Claims>)>, ApiError> {
        let Some((issuer, auth, claims)) = self
            .verified()
            .get(digest)
            .map(|v| (v.issuer.clone(), v.auth.clone(), v.claims.clone()))
        else {
            return Ok(None);
        };
        match self.lookup(&issuer).await? {
            Some(current) if Arc::ptr_eq(&current, &auth) => Ok(Some((auth, claims))),
            _ => {
                self.verified().remove(digest);
                Ok(None)
            }
        }
    }

    fn remember(&self, digest: [u8; 32], issuer: String, auth: Arc<AppAuth>, claims: Arc<Claims>) {
        let mut verified = self.verified();
        if verified.len() >= VERIFIED_TOKENS {
            verified.clear();
        }
        verified.insert(
            digest,
            Verified {
                issuer,
                auth,
                claims,
            },
        );
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
        self.verified().clear();
    }

    async fn load(&self) -> Result<Snapshot, sqlx::Error> {
        if crate::failpoint::hit("registry.load").await {
            return Err(sqlx::Error::Protocol("failpoint registry.load".into()));
        }
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
                                return Err(ApiError {
                                    retry_after: Some(1),
                                    ..ApiError::unauthorized(
                                        "registry_unavailable",
                                        "the issuer registry is unavailable; retry",
                                    )
                                });
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
struct PeekHeader {
    alg: Option<String>,
    kid: Option<String>,
    #[serde(default)]
    typ: Option<String>,
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
    /// Of the public contract's shape (`ver: 2`).
    pub upstream: bool,
    /// The domain its root-ref changes belong to, as its claims name it.
    pub ref_domain: crate::capability::DomainClaim,
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
        ApiError::unauthorized("missing_token", "a bearer capability is required")
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
            "missing_token",
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
    let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
    let (app_auth, claims) = match registry.recall(&digest).await? {
        Some(known) => known,
        None => {
            let (issuer, app_auth, claims) = verify_signature(registry, token, options).await?;
            let claims = Arc::new(claims);
            if token.len() <= MAX_REMEMBERED_TOKEN_BYTES {
                registry.remember(digest, issuer, app_auth.clone(), claims.clone());
            }
            (app_auth, claims)
        }
    };
    check_times(&claims, options)?;
    authorize(&app_auth, &claims, app, space, permission)
}

/// Checks a token's signature, issuer and audience; its times are checked by [`check_times`].
async fn verify_signature(
    registry: &Registry,
    token: &str,
    options: VerifyOptions<'_>,
) -> Result<(String, Arc<AppAuth>, Claims), ApiError> {
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(_sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid("the token is not a JWT"));
    };
    let header: PeekHeader = peek(h)?;
    let alg_name = header.alg.unwrap_or_default();
    let Some(alg) = parse_algorithm(&alg_name) else {
        return Err(ApiError::forbidden(
            "unsupported_algorithm",
            "the capability's algorithm is not EdDSA, ES256 or RS256",
        ));
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
    let mut validation = Validation::new(alg);
    validation.set_audience(&[options.audience]);
    validation.set_issuer(&[issuer.as_str()]);
    validation.leeway = options.leeway_s;
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
    // The subject is recorded as who acted; a database's text cannot hold a NUL.
    if claims.sub.as_deref().is_some_and(|s| s.contains('\0')) {
        return Err(invalid("the subject holds a NUL character"));
    }
    // The public contract's capabilities are ES256 and say what they are.
    if claims.upstream().map_err(invalid)? {
        if alg != Algorithm::ES256 {
            return Err(ApiError::forbidden(
                "unsupported_algorithm",
                "a version 2 capability is signed with ES256",
            ));
        }
        if header.typ.as_deref() != Some(UPSTREAM_TYP) {
            return Err(invalid("a version 2 capability has typ unidocs-cap+jwt"));
        }
    }
    Ok((issuer, app_auth, claims))
}

/// The time bounds of a capability, checked on every use: `exp` and `nbf` with the leeway,
/// no `iat` in the future, and no lifetime beyond the service's limit.
fn check_times(claims: &Claims, options: VerifyOptions<'_>) -> Result<(), ApiError> {
    let leeway_s = options.leeway_s as i64;
    let now = crate::now_ms() / 1000;
    if claims.exp.saturating_add(leeway_s) < now {
        return Err(invalid("expired"));
    }
    if let Some(nbf) = claims.nbf
        && nbf > now + leeway_s
    {
        return Err(invalid("not valid yet"));
    }
    if let Some(iat) = claims.iat
        && iat > now + leeway_s
    {
        return Err(invalid("issued in the future"));
    }
    if options.max_lifetime_s > 0 {
        let from = claims.iat.unwrap_or(now).min(now);
        let lifetime = claims.exp.saturating_sub(from);
        if lifetime > options.max_lifetime_s as i64 + leeway_s {
            return Err(invalid("lives longer than the service accepts"));
        }
    }
    Ok(())
}

/// Whether a verified capability allows `permission` on (app, space).
fn authorize(
    app_auth: &AppAuth,
    claims: &Claims,
    app: &AppId,
    space: &SpaceId,
    permission: &str,
) -> Result<Capability, ApiError> {
    if app_auth.app_id != *app {
        return Err(ApiError::forbidden(
            "resource_scope_mismatch",
            "the token's issuer belongs to another App",
        ));
    }
    if app_auth.suspended {
        return Err(ApiError::forbidden("APP_SUSPENDED", "the App is suspended"));
    }
    match claims.access(space, permission) {
        Access::Granted => {}
        Access::NotSelected => {
            return Err(ApiError::forbidden(
                "resource_scope_mismatch",
                "the token grants nothing in this Space",
            ));
        }
        Access::WithoutPermission => {
            return Err(ApiError::forbidden(
                "insufficient_permission",
                format!("the token's grant lacks {permission}"),
            ));
        }
    }
    Ok(Capability {
        app: app.clone(),
        space: space.clone(),
        actor: claims.sub.clone().unwrap_or_else(|| claims.iss.clone()),
        upstream: claims.is_upstream(),
        ref_domain: claims.ref_domain().clone(),
    })
}
