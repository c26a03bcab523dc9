//! What a Space capability's claims grant, in either of its two shapes:
//!
//! - this service's own: no `ver`, `grants[{spaceId, permissions}]`, each naming one Space
//!   exactly;
//! - the public UniCAS contract's (`ver: 2`, header `typ: unidocs-cap+jwt`, ES256): `sub`,
//!   `jti`, an optional `refDomain` (the domain its root-ref changes belong to), and
//!   `grants[{selector, permissions}]`, where a selector is a path Space (`/team/notes`,
//!   exactly that Space), a terminal segment prefix (`/shared/report-*`: a Space beside it whose
//!   last segment starts with `report-`, nothing deeper) or a terminal recursive prefix
//!   (`/team/**`: any Space strictly below `/team`).
//!
//! Any other `ver` is refused, as is a `ver: 2` token with a malformed grant.

use cas_format::{RefDomain, SpaceId};
use serde::Deserialize;

/// The `typ` header of a capability in the public contract's shape.
pub const UPSTREAM_TYP: &str = "unidocs-cap+jwt";

#[derive(Debug, Deserialize)]
struct RawGrant {
    #[serde(default, rename = "spaceId")]
    space_id: Option<String>,
    #[serde(default)]
    selector: Option<ParsedSelector>,
    #[serde(default)]
    permissions: Vec<String>,
}

/// A grant's selector, parsed once when the token's claims are read (they are cached with the
/// token); `None` inside when the text is not a selector.
#[derive(Debug)]
struct ParsedSelector(Option<Selector>);

impl<'de> Deserialize<'de> for ParsedSelector {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(ParsedSelector(Selector::parse(&text)))
    }
}

impl RawGrant {
    fn selector(&self) -> Option<&Selector> {
        self.selector.as_ref().and_then(|s| s.0.as_ref())
    }
}

/// The claims of a capability whose signature verified.
#[derive(Debug, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub exp: i64,
    #[serde(default)]
    pub sub: Option<String>,
    #[serde(default)]
    pub iat: Option<i64>,
    #[serde(default)]
    pub nbf: Option<i64>,
    #[serde(default)]
    ver: Option<serde_json::Value>,
    #[serde(default)]
    jti: Option<String>,
    /// Parsed once, when the token's claims are read (they are cached with the token).
    #[serde(default, rename = "refDomain")]
    ref_domain: DomainClaim,
    #[serde(default)]
    grants: Vec<RawGrant>,
}

/// Which Spaces one grant covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Exactly this Space (either form).
    Exact(String),
    /// A Space in `parent` (`""` for the root) whose last segment starts with `prefix`.
    LastSegmentPrefix { parent: String, prefix: String },
    /// Any Space strictly below `base` (`""` for the root).
    Below(String),
}

impl Selector {
    /// Parses a selector of the public contract; `None` if it is not one.
    pub fn parse(s: &str) -> Option<Selector> {
        if s.len() > SpaceId::MAX_LEN {
            return None;
        }
        if let Some(base) = s.strip_suffix("/**") {
            return (base.is_empty() || is_path(base)).then(|| Selector::Below(base.into()));
        }
        if let Some(head) = s.strip_suffix('*') {
            let (parent, prefix) = head.rsplit_once('/')?;
            let ok_prefix = prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-".contains(c));
            return ((parent.is_empty() || is_path(parent)) && ok_prefix).then(|| {
                Selector::LastSegmentPrefix {
                    parent: parent.into(),
                    prefix: prefix.into(),
                }
            });
        }
        is_path(s).then(|| Selector::Exact(s.into()))
    }

    /// Whether this selector covers `space`.
    pub fn selects(&self, space: &SpaceId) -> bool {
        let space = space.as_str();
        match self {
            Selector::Exact(s) => s == space,
            Selector::Below(base) => space
                .strip_prefix(base.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/')),
            Selector::LastSegmentPrefix { parent, prefix } => space
                .strip_prefix(parent.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .is_some_and(|last| !last.contains('/') && last.starts_with(prefix.as_str())),
        }
    }
}

fn is_path(s: &str) -> bool {
    s.starts_with('/') && s.parse::<SpaceId>().is_ok()
}

/// What a capability says about the domain of its root-ref changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DomainClaim {
    /// No `refDomain` claim.
    #[default]
    Absent,
    Valid(RefDomain),
    /// A `refDomain` claim that is not a domain (kept for the error message).
    Invalid(String),
}

impl<'de> Deserialize<'de> for DomainClaim {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let Some(text) = <Option<std::borrow::Cow<'de, str>>>::deserialize(d)? else {
            return Ok(DomainClaim::Absent);
        };
        Ok(text.parse().map_or_else(
            |_| DomainClaim::Invalid(text.into_owned()),
            DomainClaim::Valid,
        ))
    }
}

/// What a capability allows on one Space.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    Granted,
    /// A grant selects the Space but none holds the permission.
    WithoutPermission,
    /// No grant selects the Space.
    NotSelected,
}

impl Claims {
    /// Whether the claims are of the public contract's shape (`ver: 2`); an error names what
    /// is wrong with them (any other `ver`, a `ver: 2` token without `sub`/`jti` or with a
    /// grant that is not a selector).
    pub fn upstream(&self) -> Result<bool, &'static str> {
        match &self.ver {
            None => Ok(false),
            Some(v) if v.as_u64() == Some(2) => {
                let present = |c: &Option<String>| c.as_deref().is_some_and(|s| !s.is_empty());
                if !present(&self.sub) || !present(&self.jti) {
                    return Err("a version 2 capability carries sub and jti");
                }
                if self.grants.iter().any(|g| g.selector().is_none()) {
                    return Err("a version 2 grant has no valid selector");
                }
                Ok(true)
            }
            Some(_) => Err("unknown capability version"),
        }
    }

    /// Whether the claims carry a version (after [`Claims::upstream`] accepted them: `ver: 2`).
    pub fn is_upstream(&self) -> bool {
        self.ver.is_some()
    }

    /// Whether one grant selects `space` and holds `permission`.
    pub fn access(&self, space: &SpaceId, permission: &str) -> Access {
        let mut selected = false;
        for g in &self.grants {
            let selects = if self.is_upstream() {
                g.selector().is_some_and(|s| s.selects(space))
            } else {
                g.space_id.as_deref() == Some(space.as_str())
            };
            if selects {
                if g.permissions.iter().any(|p| p == permission) {
                    return Access::Granted;
                }
                selected = true;
            }
        }
        if selected {
            Access::WithoutPermission
        } else {
            Access::NotSelected
        }
    }

    /// The root-ref domain the capability names.
    pub fn ref_domain(&self) -> &DomainClaim {
        &self.ref_domain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(s: &str) -> SpaceId {
        s.parse().expect("space")
    }

    #[test]
    fn selectors_cover_what_the_contract_says() {
        let exact = Selector::parse("/team/notes").unwrap();
        assert!(exact.selects(&sp("/team/notes")));
        assert!(!exact.selects(&sp("/team/notes/x")));
        assert!(!exact.selects(&sp("/team")));

        let prefix = Selector::parse("/shared/report-*").unwrap();
        assert!(prefix.selects(&sp("/shared/report-2026")));
        assert!(prefix.selects(&sp("/shared/report-")));
        assert!(!prefix.selects(&sp("/shared/report-2026/deeper")));
        assert!(!prefix.selects(&sp("/shared/other")));
        assert!(!prefix.selects(&sp("/shared")));
        assert!(!prefix.selects(&sp("/sharedx/report-1")));

        let below = Selector::parse("/team/**").unwrap();
        assert!(below.selects(&sp("/team/a")));
        assert!(below.selects(&sp("/team/a/b")));
        assert!(!below.selects(&sp("/team")), "not the base itself");
        assert!(!below.selects(&sp("/teammate/a")));

        let all = Selector::parse("/**").unwrap();
        assert!(all.selects(&sp("/x")));
        assert!(!all.selects(&sp("plain")));
        assert!(Selector::parse("/*").unwrap().selects(&sp("/anything")));

        for bad in [
            "", "team", "/team/", "/a//b", "/a/**/b", "/a*/b", "/a/b.*", "/a/***", "**",
        ] {
            assert_eq!(Selector::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn claims_of_both_shapes() {
        let claims = |v: serde_json::Value| serde_json::from_value::<Claims>(v).unwrap();
        let base = serde_json::json!({"iss": "i", "exp": 1});
        let mut plain = base.clone();
        plain["grants"] = serde_json::json!([{"spaceId": "s", "permissions": ["cas:nodes:read"]}]);
        let plain = claims(plain);
        assert_eq!(plain.upstream(), Ok(false));
        let mut v2 = base.clone();
        v2["ver"] = 2.into();
        v2["sub"] = "user".into();
        v2["jti"] = "j1".into();
        v2["refDomain"] = "docs".into();
        v2["grants"] = serde_json::json!([
            {"selector": "/team/**", "permissions": ["cas:nodes:read"]},
            {"selector": "/team/notes", "permissions": ["cas:gc:execute"]},
        ]);
        let upstream = claims(v2.clone());
        assert_eq!(upstream.upstream(), Ok(true));
        assert_eq!(
            upstream.ref_domain(),
            &DomainClaim::Valid("docs".parse().unwrap())
        );
        assert_eq!(plain.ref_domain(), &DomainClaim::Absent);
        let mut null_domain = v2.clone();
        null_domain["refDomain"] = serde_json::Value::Null;
        assert_eq!(claims(null_domain).ref_domain(), &DomainClaim::Absent);
        let (read, gc) = ("cas:nodes:read", "cas:gc:execute");
        for (c, space, permission, want) in [
            (&plain, "s", read, Access::Granted),
            (&plain, "s", gc, Access::WithoutPermission),
            (&plain, "t", read, Access::NotSelected),
            (&upstream, "/team/notes", gc, Access::Granted),
            (&upstream, "/team/x", read, Access::Granted),
            (&upstream, "/team/x", gc, Access::WithoutPermission),
            (&upstream, "/team", read, Access::NotSelected),
        ] {
            assert_eq!(
                c.access(&sp(space), permission),
                want,
                "{space} {permission}"
            );
        }

        let mut no_jti = v2.clone();
        no_jti.as_object_mut().unwrap().remove("jti");
        assert!(claims(no_jti).upstream().is_err());
        let mut bad_selector = v2.clone();
        bad_selector["grants"] = serde_json::json!([{"selector": "team", "permissions": []}]);
        assert!(claims(bad_selector).upstream().is_err());
        let mut v3 = v2.clone();
        v3["ver"] = 3.into();
        assert!(claims(v3).upstream().is_err());
        let mut bad_domain = v2;
        bad_domain["refDomain"] = "Not-Valid".into();
        assert_eq!(
            claims(bad_domain).ref_domain(),
            &DomainClaim::Invalid("Not-Valid".into())
        );
    }
}
