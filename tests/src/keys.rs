//! Keys and Apps of a test environment, and the capabilities they sign: this service's own
//! shape (through the client's `SigningKey`) and the public contract's version 2 shape.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::bail;
use cas_client::{AppCasClient, SigningKey};
use cas_format::{AppId, SpaceId};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

use crate::{Server, random_id};

/// The `typ` header of a version 2 capability.
pub const UPSTREAM_TYP: &str = "unidocs-cap+jwt";

/// Every permission of the data plane.
pub const ALL_PERMISSIONS: &[&str] = &[
    "cas:nodes:read",
    "cas:nodes:lease",
    "cas:usage:read",
    "cas:gc:execute",
    "cas:root-refs:read",
    "cas:root-refs:update",
];

/// A key pair made by `openssl genpkey`, as files.
#[derive(Debug, Clone)]
pub struct TestKey {
    pub alg: String,
    pub private_pem: String,
    pub public_pem: String,
    pub public_path: PathBuf,
    pub private_path: PathBuf,
}

impl TestKey {
    pub fn generate(dir: &Path, alg: &str) -> anyhow::Result<Self> {
        let args: &[&str] = match alg {
            "EdDSA" => &["-algorithm", "ed25519"],
            "ES256" => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            "RS256" => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            other => bail!("no key type for {other}"),
        };
        let id = random_id("key-");
        let private_path = dir.join(format!("{id}.pem"));
        let public_path = dir.join(format!("{id}.pub.pem"));
        let ok = Command::new("openssl")
            .arg("genpkey")
            .args(args)
            .arg("-out")
            .arg(&private_path)
            .stderr(Stdio::null())
            .status()?
            .success()
            && Command::new("openssl")
                .args(["pkey", "-pubout", "-in"])
                .arg(&private_path)
                .arg("-out")
                .arg(&public_path)
                .status()?
                .success();
        if !ok {
            bail!("openssl could not make a {alg} key");
        }
        Ok(TestKey {
            alg: alg.to_string(),
            private_pem: std::fs::read_to_string(&private_path)?,
            public_pem: std::fs::read_to_string(&public_path)?,
            public_path,
            private_path,
        })
    }
}

/// An App registered in a test environment, with its signing key.
#[derive(Debug, Clone)]
pub struct TestApp {
    pub app: AppId,
    pub issuer: String,
    pub kid: String,
    pub key: TestKey,
}

impl TestApp {
    pub fn signing_key(&self) -> SigningKey {
        SigningKey::from_pem(&self.key.private_pem, &self.kid, &self.issuer, "unicas")
            .expect("test key")
    }

    /// A client of `server` minting capabilities with this App's key.
    pub fn client(&self, server: &Server) -> AppCasClient {
        AppCasClient::new(&server.url, self.app.clone(), Arc::new(self.signing_key()))
            .expect("client")
    }

    /// A capability for `permissions` in `space`.
    pub fn token(&self, space: &SpaceId, permissions: &[&'static str]) -> String {
        self.signing_key().mint(space, permissions).expect("mint")
    }

    /// Version 2 claims granting `permissions` on `selector`, in root-ref domain `docs`.
    pub fn v2_claims(&self, selector: &str, permissions: &[&str]) -> Value {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        json!({
            "ver": 2, "iss": self.issuer, "sub": "user-7", "jti": format!("j-{now}"),
            "aud": "unicas", "iat": now, "exp": now + 300, "refDomain": "docs",
            "grants": [{"selector": selector, "permissions": permissions}],
        })
    }

    /// `claims` signed with this App's key (ES256 for a version 2 capability), with `typ`.
    pub fn sign(&self, typ: Option<&str>, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(self.kid.clone());
        h.typ = typ.map(str::to_string);
        let key = EncodingKey::from_ec_pem(self.key.private_pem.as_bytes()).expect("ES256 key");
        jsonwebtoken::encode(&h, claims, &key).expect("sign")
    }

    /// A version 2 capability on `selector` in root-ref domain `domain` (none when `None`).
    pub fn v2_token(&self, selector: &str, permissions: &[&str], domain: Option<&str>) -> String {
        let mut claims = self.v2_claims(selector, permissions);
        match domain {
            Some(d) => claims["refDomain"] = d.into(),
            None => {
                claims.as_object_mut().map(|c| c.remove("refDomain"));
            }
        }
        self.sign(Some(UPSTREAM_TYP), &claims)
    }
}
