//! Capability providers: where a client gets the bearer token for a call. Either a fixed token,
//! or an App signing key that mints short-lived capabilities with exactly the grant needed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use cas_format::SpaceId;
use futures_util::future::BoxFuture;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::error::ClientError;

/// Supplies bearer capabilities. Implementations may mint, cache or fetch them.
pub trait CapabilityProvider: Send + Sync {
    /// A capability for `permissions` in `space`.
    fn capability<'a>(
        &'a self,
        space: &'a SpaceId,
        permissions: &'a [&'static str],
    ) -> BoxFuture<'a, Result<String, ClientError>>;
}

/// Always the same token (e.g. one handed out by an App's backend).
#[derive(Clone)]
pub struct FixedToken(pub String);

impl std::fmt::Debug for FixedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FixedToken(***)")
    }
}

impl CapabilityProvider for FixedToken {
    fn capability<'a>(
        &'a self,
        _space: &'a SpaceId,
        _permissions: &'a [&'static str],
    ) -> BoxFuture<'a, Result<String, ClientError>> {
        Box::pin(async move { Ok(self.0.clone()) })
    }
}

/// Every data-plane permission; a signing key grants them all unless told otherwise.
pub const ALL_PERMISSIONS: &[&str] = cas_format::wire::permission::ALL;

/// Mints capabilities with an App issuer's private key (PKCS#8 PEM: Ed25519, P-256 or RSA; the
/// JWT algorithm follows from the key). Tokens live `ttl` and are reused until a fifth of it
/// remains.
pub struct SigningKey {
    key: EncodingKey,
    alg: Algorithm,
    kid: String,
    issuer: String,
    audience: String,
    ttl: Duration,
    cache: Mutex<HashMap<String, (String, u64)>>,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("alg", &self.alg)
            .field("kid", &self.kid)
            .field("issuer", &self.issuer)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Grant<'a> {
    #[serde(rename = "spaceId")]
    space_id: &'a str,
    permissions: &'a [&'static str],
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    aud: &'a str,
    iat: u64,
    nbf: u64,
    exp: u64,
    grants: [Grant<'a>; 1],
}

/// The algorithm of a PKCS#8 PEM private key, from the key's algorithm identifier.
pub fn algorithm_of_pem(pem: &str) -> Result<Algorithm, ClientError> {
    if pem.contains("BEGIN RSA PRIVATE KEY") {
        return Ok(Algorithm::RS256);
    }
    let body: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::trim)
        .collect();
    let der = STANDARD
        .decode(body)
        .map_err(|_| ClientError::Invalid("the signing key is not a PEM file".into()))?;
    let has = |oid: &[u8]| der.windows(oid.len()).take(64).any(|w| w == oid);
    const ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
    const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    const RSA: &[u8] = &[
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
    ];
    if has(ED25519) {
        Ok(Algorithm::EdDSA)
    } else if has(EC_PUBLIC_KEY) && has(P256) {
        Ok(Algorithm::ES256)
    } else if has(RSA) {
        Ok(Algorithm::RS256)
    } else {
        Err(ClientError::Invalid(
            "the signing key must be a PKCS#8 PEM Ed25519, P-256 or RSA private key".into(),
        ))
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl SigningKey {
    /// A key from its PKCS#8 PEM text.
    pub fn from_pem(
        pem: &str,
        kid: impl Into<String>,
        issuer: impl Into<String>,
        audience: impl Into<String>,
    ) -> Result<Self, ClientError> {
        let alg = algorithm_of_pem(pem)?;
        let key = match alg {
            Algorithm::EdDSA => EncodingKey::from_ed_pem(pem.as_bytes()),
            Algorithm::ES256 => EncodingKey::from_ec_pem(pem.as_bytes()),
            _ => EncodingKey::from_rsa_pem(pem.as_bytes()),
        }
        .map_err(|e| ClientError::Invalid(format!("unreadable signing key: {e}")))?;
        Ok(SigningKey {
            key,
            alg,
            kid: kid.into(),
            issuer: issuer.into(),
            audience: audience.into(),
            ttl: Duration::from_secs(300),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The JWT algorithm of this key.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// Sets how long minted capabilities live (at least 10 s).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_secs(10));
        self
    }

    /// Mints a capability now, bypassing the cache.
    pub fn mint(
        &self,
        space: &SpaceId,
        permissions: &[&'static str],
    ) -> Result<String, ClientError> {
        let now = now_secs();
        let claims = Claims {
            iss: &self.issuer,
            aud: &self.audience,
            iat: now,
            nbf: now,
            exp: now + self.ttl.as_secs(),
            grants: [Grant {
                space_id: space.as_str(),
                permissions,
            }],
        };
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| ClientError::Invalid(format!("cannot sign a capability: {e}")))
    }
}

impl CapabilityProvider for SigningKey {
    fn capability<'a>(
        &'a self,
        space: &'a SpaceId,
        permissions: &'a [&'static str],
    ) -> BoxFuture<'a, Result<String, ClientError>> {
        Box::pin(async move {
            let key = format!("{space}\n{}", permissions.join(" "));
            let now = now_secs();
            let margin = self.ttl.as_secs() / 5;
            {
                let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((token, exp)) = cache.get(&key)
                    && *exp > now + margin
                {
                    return Ok(token.clone());
                }
            }
            let token = self.mint(space, permissions)?;
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() > 4096 {
                cache.clear();
            }
            cache.insert(key, (token.clone(), now + self.ttl.as_secs()));
            Ok(token)
        })
    }
}
