//! Identifiers that validate themselves when parsed: an invalid one cannot exist past the edge.
//!
//! - `AppId`, `SpaceId`: 1–128 characters of `[A-Za-z0-9._-]`.
//! - `RequestId`: 1–256 bytes of printable ASCII without spaces (`0x21..=0x7e`), so colons are
//!   welcome: `doc:42:version:7:add-refs`.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a valid identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{what} must be {min}..={max} characters long, got {len}")]
    Length {
        what: &'static str,
        min: usize,
        max: usize,
        len: usize,
    },
    #[error("{what} may contain only {allowed}; found {found:?} at position {position}")]
    Character {
        what: &'static str,
        allowed: &'static str,
        found: char,
        position: usize,
    },
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:literal, $allowed:literal, $ok:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Longest valid identifier, in bytes.
            pub const MAX_LEN: usize = $max;

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, IdError> {
                let ok: fn(char) -> bool = $ok;
                if let Some((position, found)) = s.chars().enumerate().find(|(_, c)| !ok(*c)) {
                    return Err(IdError::Character {
                        what: $what,
                        allowed: $allowed,
                        found,
                        position,
                    });
                }
                if s.is_empty() || s.len() > $max {
                    return Err(IdError::Length {
                        what: $what,
                        min: 1,
                        max: $max,
                        len: s.len(),
                    });
                }
                Ok($name(s.to_string()))
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                s.parse()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .min_length(Some(1))
                    .max_length(Some($max))
                    .description(Some(concat!($what, ": ", $allowed)))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}
    };
}

fn id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

identifier!(
    /// An App: the top-level trust and storage namespace.
    AppId, "appId", 128, "[A-Za-z0-9._-]", id_char
);
identifier!(
    /// A Space: a data-ownership partition inside an App.
    SpaceId, "spaceId", 128, "[A-Za-z0-9._-]", id_char
);
identifier!(
    /// The idempotency key of a root-ref update.
    RequestId, "requestId", 256, "printable ASCII without spaces", |c| ('!'..='~').contains(&c)
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_validate() {
        assert!("app-1.x_Y".parse::<AppId>().is_ok());
        assert!("".parse::<AppId>().is_err());
        assert!("a b".parse::<SpaceId>().is_err());
        assert!("a/b".parse::<SpaceId>().is_err());
        assert!("é".parse::<SpaceId>().is_err());
        assert!("x".repeat(128).parse::<SpaceId>().is_ok());
        assert!("x".repeat(129).parse::<SpaceId>().is_err());
        assert!("doc:42:version:7:add-refs".parse::<RequestId>().is_ok());
        assert!("has space".parse::<RequestId>().is_err());
        assert!("tab\t".parse::<RequestId>().is_err());
        assert!("x".repeat(256).parse::<RequestId>().is_ok());
        assert!("x".repeat(257).parse::<RequestId>().is_err());
        let e: Result<AppId, _> = serde_json::from_str("\"no/slash\"");
        assert!(e.is_err());
    }
}
