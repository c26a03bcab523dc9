//! The hub's signing key: an App issuer key of the CAS. Created (Ed25519) on first start when
//! none is configured; its public half is what the CAS registers.

use std::path::Path;

use anyhow::{Context, bail};
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn der_of(pem_text: &str) -> anyhow::Result<Vec<u8>> {
    let body: String = pem_text
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::trim)
        .collect();
    STANDARD.decode(body).context("the key file is not PEM")
}

/// The private key PEM at `path`, creating an Ed25519 key there (mode 0600) if `create` and it
/// does not exist.
pub fn load_or_create(path: &Path, create: bool) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            let rng = aws_lc_rs::rand::SystemRandom::new();
            let doc = Ed25519KeyPair::generate_pkcs8v1(&rng)
                .map_err(|_| anyhow::anyhow!("cannot generate a signing key"))?;
            let text = pem("PRIVATE KEY", doc.as_ref());
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            f.write_all(text.as_bytes())
                .and_then(|()| f.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            tracing::info!(path = %path.display(), "created the hub's signing key");
            Ok(text)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read the signing key {}", path.display())),
    }
}

/// The SPKI PEM public key of an Ed25519 PKCS#8 private key.
pub fn ed25519_public_pem(private_pem: &str) -> anyhow::Result<String> {
    let der = der_of(private_pem)?;
    let Ok(pair) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der) else {
        bail!(
            "the hub's signing key is not Ed25519: register its public key with `unicas-server app add-key` yourself"
        );
    };
    // SubjectPublicKeyInfo: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING key }.
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(pair.public_key().as_ref());
    Ok(pem("PUBLIC KEY", &spki))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_key_signs_and_its_public_half_verifies() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("k.pem");
        let private = load_or_create(&path, true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            load_or_create(&path, true).ok().as_deref(),
            Some(private.as_str())
        );
        let public = ed25519_public_pem(&private).unwrap_or_else(|e| panic!("{e}"));
        let key = jsonwebtoken::EncodingKey::from_ed_pem(private.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA),
            &serde_json::json!({"sub": "x", "exp": 4_000_000_000u64}),
            &key,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let dec = jsonwebtoken::DecodingKey::from_ed_pem(public.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
        v.required_spec_claims.clear();
        assert!(jsonwebtoken::decode::<serde_json::Value>(&token, &dec, &v).is_ok());
    }
}
