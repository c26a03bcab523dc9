//! Identifiers that validate themselves when parsed: an invalid one cannot exist past the edge.
//!
//! - `AppId`: 1–128 characters of `[A-Za-z0-9._-]`.
//! - `SpaceId`: the same, or a path as the public UniCAS contract has Spaces: `/seg(/seg)*`,
//!   each segment `[A-Za-z0-9_-]+`, at most 256 characters (`/team/notes`).
//! - `RequestId`: 1–256 bytes of printable ASCII without spaces (`0x21..=0x7e`), so colons are
//!   welcome: `doc:42:version:7:add-refs`.
//! - `RefDomain`: the namespace a root ref belongs to, as the public UniCAS contract has it:
//!   `^[a-z][a-z0-9]*(?::[a-z0-9]+)*$`, at most 64 characters (`docs`, `billing:v2`).

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
    #[error("a path Space is /segment(/segment)* with segments of [A-Za-z0-9_-]: {0}")]
    Path(&'static str),
    #[error("a refDomain is [a-z][a-z0-9]* parts joined by ':' (e.g. docs:v2): {0}")]
    Domain(&'static str),
}

/// Checks that `s` is 1..=`max` characters, each allowed by `ok`.
fn check_chars(
    s: &str,
    what: &'static str,
    max: usize,
    allowed: &'static str,
    ok: fn(char) -> bool,
) -> Result<(), IdError> {
    if let Some((position, found)) = s.chars().enumerate().find(|(_, c)| !ok(*c)) {
        return Err(IdError::Character {
            what,
            allowed,
            found,
            position,
        });
    }
    if s.is_empty() || s.len() > max {
        return Err(IdError::Length {
            what,
            min: 1,
            max,
            len: s.len(),
        });
    }
    Ok(())
}

macro_rules! identifier {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:literal, $allowed:literal, $check:expr) => {
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
                let check: fn(&str) -> Result<(), IdError> = $check;
                check(s)?;
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

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-')
}

/// A path Space: `/seg(/seg)*`, segments of [`path_char`], at most 256 characters.
fn check_path(s: &str) -> Result<(), IdError> {
    if s.len() > SpaceId::MAX_LEN {
        return Err(IdError::Length {
            what: "spaceId",
            min: 2,
            max: SpaceId::MAX_LEN,
            len: s.len(),
        });
    }
    let rest = s
        .strip_prefix('/')
        .ok_or(IdError::Path("it starts with /"))?;
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err(IdError::Path("a segment is empty"));
        }
        check_chars(
            segment,
            "a Space path segment",
            256,
            "[A-Za-z0-9_-]",
            path_char,
        )?;
    }
    Ok(())
}

identifier!(
    /// An App: the top-level trust and storage namespace.
    AppId, "appId", 128, "[A-Za-z0-9._-]",
    |s| check_chars(s, "appId", 128, "[A-Za-z0-9._-]", id_char)
);
identifier!(
    /// A Space: a data-ownership partition inside an App: a plain id, or a path.
    SpaceId, "spaceId", 256, "[A-Za-z0-9._-]{1,128}, or a path /seg(/seg)* of [A-Za-z0-9_-] segments",
    |s| if s.starts_with('/') {
        check_path(s)
    } else {
        check_chars(s, "spaceId", 128, "[A-Za-z0-9._-]", id_char)
    }
);
identifier!(
    /// The idempotency key of a root-ref update.
    RequestId, "requestId", 256, "printable ASCII without spaces",
    |s| check_chars(s, "requestId", 256, "printable ASCII without spaces", |c| ('!'..='~').contains(&c))
);

/// A root-ref domain: parts of `[a-z0-9]` joined by `:`, the first starting with a letter.
fn check_domain(s: &str) -> Result<(), IdError> {
    check_chars(s, "refDomain", RefDomain::MAX_LEN, "[a-z0-9:]", |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == ':'
    })?;
    if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(IdError::Domain("it starts with a lowercase letter"));
    }
    if s.split(':').any(str::is_empty) {
        return Err(IdError::Domain("a part is empty"));
    }
    Ok(())
}

identifier!(
    /// The domain a root ref belongs to: balances are kept per (Space, domain, hash), and a
    /// node's root ref count is their sum over domains.
    RefDomain, "refDomain", 64, "[a-z][a-z0-9]* parts joined by ':'",
    check_domain
);

impl RefDomain {
    /// The domain of root refs whose capability names none (this service's own shape).
    pub const DEFAULT: &'static str = "default";
}

impl Default for RefDomain {
    fn default() -> Self {
        RefDomain(Self::DEFAULT.to_string())
    }
}

impl SpaceId {
    /// Whether this is a path Space (`/team/notes`).
    pub fn is_path(&self) -> bool {
        self.0.starts_with('/')
    }

    /// The Space as one component of a storage key or file name: a plain id as it is; a path
    /// with `/` written as `~` (which no plain id holds), so `/team/notes` is `~team~notes`.
    pub fn key_component(&self) -> std::borrow::Cow<'_, str> {
        if self.is_path() {
            self.0.replace('/', "~").into()
        } else {
            self.0.as_str().into()
        }
    }

    /// The Space of a [`SpaceId::key_component`].
    pub fn from_key_component(s: &str) -> Result<Self, IdError> {
        if s.starts_with('~') {
            s.replace('~', "/").parse()
        } else {
            s.parse()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_domains_follow_the_contract() {
        for ok in [
            "docs",
            "a",
            "billing:v2",
            "a1:b2:c3",
            RefDomain::DEFAULT,
            &"x".repeat(64),
        ] {
            assert!(ok.parse::<RefDomain>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Docs",
            "1docs",
            ":docs",
            "docs:",
            "docs::v2",
            "docs-v2",
            "do cs",
            "docs.v2",
            "é",
            &"x".repeat(65),
        ] {
            assert!(bad.parse::<RefDomain>().is_err(), "{bad}");
        }
        assert_eq!(RefDomain::default().as_str(), "default");
    }

    #[test]
    fn identifiers_validate() {
        assert!("app-1.x_Y".parse::<AppId>().is_ok());
        assert!("".parse::<AppId>().is_err());
        assert!("a b".parse::<SpaceId>().is_err());
        assert!("a/b".parse::<SpaceId>().is_err());
        assert!("é".parse::<SpaceId>().is_err());
        assert!("x".repeat(128).parse::<SpaceId>().is_ok());
        assert!("x".repeat(129).parse::<SpaceId>().is_err());
        // Paths, as the public contract has Spaces.
        for ok in [
            "/team",
            "/team/notes",
            "/a_b/c-d/E9",
            &format!("/{}", "x".repeat(255)),
        ] {
            let sp: SpaceId = ok.parse().unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(sp.is_path());
            let key = sp.key_component();
            assert!(!key.contains('/'), "{key}");
            assert_eq!(SpaceId::from_key_component(&key).unwrap(), sp);
        }
        for bad in [
            "/",
            "//",
            "/a//b",
            "/a/",
            "/a.b",
            "/a/b c",
            "/é",
            "/a/~",
            "~a",
            &format!("/{}", "x".repeat(256)),
        ] {
            assert!(bad.parse::<SpaceId>().is_err(), "{bad}");
        }
        let plain: SpaceId = "a.b".parse().unwrap();
        assert!(!plain.is_path());
        assert_eq!(plain.key_component(), "a.b");
        assert_eq!(SpaceId::from_key_component("a.b").unwrap(), plain);
        assert!("doc:42:version:7:add-refs".parse::<RequestId>().is_ok());
        assert!("has space".parse::<RequestId>().is_err());
        assert!("tab\t".parse::<RequestId>().is_err());
        assert!("x".repeat(256).parse::<RequestId>().is_ok());
        assert!("x".repeat(257).parse::<RequestId>().is_err());
        let e: Result<AppId, _> = serde_json::from_str("\"no/slash\"");
        assert!(e.is_err());
    }
}
