//! Identifiers, secrets and timestamps.
//!
//! Projects and notebooks are a prefix plus 16 random lowercase base32 characters (unguessable,
//! not time-sortable); versions are `ver_` plus an uppercase ULID (time-sortable on purpose);
//! events are ULIDs.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

fn random_body() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes
        .iter()
        .map(|b| BASE32[(b & 31) as usize] as char)
        .collect()
}

pub fn project_id() -> String {
    format!("proj-{}", random_body())
}

pub fn notebook_id() -> String {
    format!("nb-{}", random_body())
}

pub fn snapshot_id() -> String {
    format!("snap-{}", random_body())
}

pub fn version_id() -> String {
    format!("ver_{}", ulid::Ulid::generate())
}

pub fn event_id() -> String {
    ulid::Ulid::generate().to_string()
}

/// Whether `s` looks like an id with `prefix` (checked before any lookup).
pub fn valid(prefix: &str, s: &str) -> bool {
    s.len() == prefix.len() + 16
        && s.starts_with(prefix)
        && s[prefix.len()..].bytes().all(|b| BASE32.contains(&b))
}

pub fn valid_version_id(s: &str) -> bool {
    s.strip_prefix("ver_")
        .is_some_and(|u| u.len() == 26 && ulid::Ulid::from_string(u).is_ok())
}

/// A secret for tokens: 32 random bytes, URL-safe base64.
pub fn secret() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// SHA-256 of `s`, lowercase hex.
pub fn sha256_hex(s: &str) -> String {
    cas_format::Hash::digest(s.as_bytes()).to_string()
}

pub fn now_ms() -> i64 {
    cas_service::now_ms()
}

/// RFC 3339 in UTC with millisecond precision.
pub fn rfc3339(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let t = t
        .replace_nanosecond((ms.rem_euclid(1000) as u32) * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_their_shape() {
        let p = project_id();
        assert!(valid("proj-", &p), "{p}");
        assert!(valid("nb-", &notebook_id()));
        assert!(!valid("nb-", "nb-UPPERCASE000000"));
        assert!(!valid("nb-", "nb-short"));
        assert!(valid_version_id(&version_id()));
        assert!(!valid_version_id("ver_x"));
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_741_184_520_123), "2025-03-05T14:22:00.123Z");
    }
}
