//! Identifiers, secrets and timestamps.
//!
//! Projects, notebooks and sessions are a prefix plus 16 random lowercase base32 characters
//! (unguessable, not time-sortable); versions are `ver_` plus an uppercase ULID (time-sortable
//! on purpose); events are ULIDs. Each kind of identifier is a type that parses (and refuses)
//! once, where it enters: an invalid one cannot exist past the edge.

use std::fmt;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cas_format::SpaceId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
/// The alphabet of a ULID as the hub writes it (uppercase Crockford base32).
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

fn random_body() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes
        .iter()
        .map(|b| BASE32[(b & 31) as usize] as char)
        .collect()
}

/// Whether `s` is `prefix` plus 16 characters of our base32.
fn has_shape(prefix: &str, s: &str) -> bool {
    s.len() == prefix.len() + 16
        && s.starts_with(prefix)
        && s[prefix.len()..].bytes().all(|b| BASE32.contains(&b))
}

/// An identifier that is not of its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a {kind} id")]
pub struct BadId {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $pattern:literal, $valid:expr, $new:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// A new, random one.
            pub fn generate() -> Self {
                $name($new())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = BadId;
            fn from_str(s: &str) -> Result<Self, BadId> {
                let valid: fn(&str) -> bool = $valid;
                if valid(s) {
                    Ok($name(s.to_string()))
                } else {
                    Err(BadId {
                        kind: $kind,
                        value: s.chars().take(64).collect(),
                    })
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?
                    .parse()
                    .map_err(serde::de::Error::custom)
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .pattern(Some($pattern))
                    .description(Some(concat!("A ", $kind, " id.")))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

id_type!(
    /// A project: `proj-` and 16 base32 characters. Its Space in the CAS has the same name.
    ProjectId,
    "project",
    "^proj-[a-z2-7]{16}$",
    |s| has_shape("proj-", s),
    || format!("proj-{}", random_body())
);
id_type!(
    /// A notebook: `nb-` and 16 base32 characters.
    NotebookId,
    "notebook",
    "^nb-[a-z2-7]{16}$",
    |s| has_shape("nb-", s),
    || format!("nb-{}", random_body())
);
id_type!(
    /// A version: `ver_` and an uppercase ULID.
    VersionId,
    "version",
    "^ver_[0-7][0-9A-HJKMNP-TV-Z]{25}$",
    |s| s.strip_prefix("ver_").is_some_and(|u| {
        // 26 characters hold 130 bits: a first digit above 7 overflows 128.
        u.len() == 26
            && u.as_bytes()[0] <= b'7'
            && u.bytes().all(|b| CROCKFORD.contains(&b))
            && ulid::Ulid::from_string(u).is_ok()
    }),
    || format!("ver_{}", ulid::Ulid::generate())
);
id_type!(
    /// A session: `sess-` and 16 base32 characters.
    SessionId,
    "session",
    "^sess-[a-z2-7]{16}$",
    |s| has_shape("sess-", s),
    || format!("sess-{}", random_body())
);

impl ProjectId {
    /// The project's Space in the CAS.
    pub fn space(&self) -> SpaceId {
        self.0
            .parse()
            .unwrap_or_else(|_| unreachable!("a project id is a valid Space id"))
    }
}

/// A sandbox: `sb-` and 16 base32 characters.
pub fn sandbox_id() -> String {
    format!("sb-{}", random_body())
}

pub fn snapshot_id() -> String {
    format!("snap-{}", random_body())
}

pub fn event_id() -> String {
    ulid::Ulid::generate().to_string()
}

/// The smallest event id of the millisecond `ms`: every event before it sorts below.
pub fn first_event_id_at(ms: i64) -> String {
    ulid::Ulid::from_parts(u64::try_from(ms).unwrap_or(0), 0).to_string()
}

/// A secret for tokens: 32 random bytes, URL-safe base64.
pub fn secret() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

/// SHA-256 of `s`, lowercase hex.
pub fn sha256_hex(s: &str) -> String {
    sha256_bytes_hex(s.as_bytes())
}

/// SHA-256 of `b`, lowercase hex.
pub fn sha256_bytes_hex(b: &[u8]) -> String {
    cas_format::Hash::digest(b).to_string()
}

pub fn now_ms() -> i64 {
    server_kit::now_ms()
}

/// One UTC day, written `YYYY-MM-DD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct UtcDay(time::Date);

impl FromStr for UtcDay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a day (YYYY-MM-DD)");
        let mut parts = s.split('-');
        let (Some(y), Some(m), Some(d), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        if (y.len(), m.len(), d.len()) != (4, 2, 2) {
            return Err(bad());
        }
        let (y, m, d): (i32, u8, u8) = (
            y.parse().map_err(|_| bad())?,
            m.parse().map_err(|_| bad())?,
            d.parse().map_err(|_| bad())?,
        );
        let month = time::Month::try_from(m).map_err(|_| bad())?;
        time::Date::from_calendar_date(y, month, d)
            .map(UtcDay)
            .map_err(|_| bad())
    }
}

impl<'de> Deserialize<'de> for UtcDay {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl UtcDay {
    /// Its first millisecond.
    pub fn start_ms(self) -> i64 {
        self.0.midnight().assume_utc().unix_timestamp() * 1000
    }

    /// The first millisecond after it.
    pub fn end_ms(self) -> i64 {
        self.start_ms() + 86_400_000
    }

    /// How many days `later` is after this one.
    pub fn days_to(self, later: UtcDay) -> i64 {
        (later.0 - self.0).whole_days()
    }
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

/// The instant an RFC 3339 time names, in milliseconds since the epoch.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_to_the_millisecond() {
        for ms in [0, 1_700_000_000_123, 1_800_000_000_000] {
            assert_eq!(parse_rfc3339_ms(&rfc3339(ms)), Some(ms));
        }
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
    }

    #[test]
    fn utc_days_parse_and_span_a_day() {
        let d: UtcDay = "2026-12-02".parse().unwrap();
        assert_eq!(d.start_ms(), 1_796_169_600_000);
        assert_eq!(d.end_ms() - d.start_ms(), 86_400_000);
        assert_eq!(
            d.end_ms(),
            "2026-12-03".parse::<UtcDay>().unwrap().start_ms()
        );
        assert_eq!(d.days_to("2027-01-01".parse().unwrap()), 30);
        for bad in [
            "2026-13-01",
            "2026-02-30",
            "2026-1-01",
            "26-01-01",
            "2026-01-01x",
            "",
        ] {
            assert!(bad.parse::<UtcDay>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_parse_and_refuse_once() {
        let p = ProjectId::generate();
        assert_eq!(p.as_str().parse::<ProjectId>(), Ok(p.clone()));
        assert_eq!(p.space().as_str(), p.as_str());
        assert!(
            NotebookId::generate()
                .as_str()
                .parse::<NotebookId>()
                .is_ok()
        );
        assert!(SessionId::generate().as_str().starts_with("sess-"));
        assert!(VersionId::generate().as_str().parse::<VersionId>().is_ok());
        for bad in [
            "nb-UPPERCASE000000",
            "nb-short",
            "proj-aaaaaaaaaaaaaaaa",
            "",
            "nb-../../etc/pass",
        ] {
            assert!(bad.parse::<NotebookId>().is_err(), "{bad}");
        }
        assert!("nb-aaaaaaaaaaaaaaaa".parse::<ProjectId>().is_err());
        assert!("ver_x".parse::<VersionId>().is_err());
        let v = VersionId::generate();
        let lower = v.as_str().to_lowercase();
        assert!(
            lower.parse::<VersionId>().is_err(),
            "one spelling per version: {lower}"
        );
        assert!(
            "ver_8ZZZZZZZZZZZZZZZZZZZZZZZZZ"
                .parse::<VersionId>()
                .is_err()
        );
        let e = "x".repeat(1000).parse::<ProjectId>().unwrap_err();
        assert_eq!(
            e.value.len(),
            64,
            "a refusal does not carry the whole input"
        );
        let json = serde_json::to_string(&p).unwrap_or_default();
        assert_eq!(serde_json::from_str::<ProjectId>(&json).ok(), Some(p));
        assert!(serde_json::from_str::<ProjectId>("\"proj-nope\"").is_err());
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_741_184_520_123), "2025-03-05T14:22:00.123Z");
    }
}
