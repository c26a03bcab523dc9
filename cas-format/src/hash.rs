//! `Hash`: the 32-byte SHA-256 digest that names a node, and its strict 64-character hex form.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// The SHA-256 digest of a node's canonical bytes.
///
/// Its text form is exactly 64 lowercase hex characters; parsing accepts nothing else
/// (no uppercase, no prefix, no whitespace), so one node has one spelling.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hash([u8; 32]);

/// Why a string is not a hash.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashParseError {
    #[error("a hash is 64 lowercase hex characters, got {0} characters")]
    Length(usize),
    #[error("a hash is 64 lowercase hex characters, found {found:?} at position {position}")]
    Character { position: usize, found: char },
}

impl Hash {
    /// Length of the digest in bytes.
    pub const LEN: usize = 32;

    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Hash(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// SHA-256 of `bytes`.
    pub fn digest(bytes: &[u8]) -> Self {
        Hash(Sha256::digest(bytes).into())
    }

    /// Builds a hash from exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(bytes).ok().map(Hash)
    }

    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(HEX[(b >> 4) as usize] as char);
            s.push(HEX[(b & 0xf) as usize] as char);
        }
        s
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl FromStr for Hash {
    type Err = HashParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(HashParseError::Length(s.chars().count()));
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = nibble(pair[0]);
            let lo = nibble(pair[1]);
            match (hi, lo) {
                (Some(hi), Some(lo)) => out[i] = (hi << 4) | lo,
                (None, _) => return Err(bad_char(s, 2 * i)),
                (_, None) => return Err(bad_char(s, 2 * i + 1)),
            }
        }
        Ok(Hash(out))
    }
}

fn bad_char(s: &str, byte_pos: usize) -> HashParseError {
    // The string is 64 bytes long but may hold multi-byte characters; report the character
    // that starts at or contains `byte_pos`.
    let (position, found) = s
        .char_indices()
        .enumerate()
        .take_while(|(_, (at, _))| *at <= byte_pos)
        .last()
        .map(|(n, (_, c))| (n, c))
        .unwrap_or((0, '?'));
    HashParseError::Character { position, found }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.to_hex())
    }
}

impl serde::Serialize for Hash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Hash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Hash;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a hash of 64 lowercase hex characters")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Hash, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Hash {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^[0-9a-f]{64}$"))
            .description(Some(
                "SHA-256 of the node's canonical bytes, 64 lowercase hex characters",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Hash {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_hex() {
        let h = Hash::digest(b"abc");
        assert_eq!(
            h.to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(h.to_string().parse::<Hash>().unwrap(), h);
    }

    #[test]
    fn rejects_anything_but_64_lowercase_hex() {
        let good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert!(good.to_uppercase().parse::<Hash>().is_err());
        assert_eq!(good[..63].parse::<Hash>(), Err(HashParseError::Length(63)));
        assert!(format!("{good}0").parse::<Hash>().is_err());
        assert!(format!(" {}", &good[1..]).parse::<Hash>().is_err());
        let mut bad = good.to_string();
        bad.replace_range(10..11, "g");
        assert_eq!(
            bad.parse::<Hash>(),
            Err(HashParseError::Character {
                position: 10,
                found: 'g'
            })
        );
        // 64 bytes but multi-byte characters: still rejected, never a panic.
        let s = "é".repeat(32);
        assert!(s.parse::<Hash>().is_err());
    }
}
