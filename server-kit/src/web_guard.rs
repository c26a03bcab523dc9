//! What a browser-facing listener checks before anything else: the `Host` a request names must
//! be one the deployment answers to (so a page on another site cannot reach it by DNS
//! rebinding), and a state-changing request sent by a browser from another origin is refused
//! (so a cross-site form or `fetch` cannot act with the user's cookie or on a single-user
//! deployment). Requests without `Origin` (curl, API clients, same-origin GETs) pass the second
//! check.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Method, header};

/// The host names a listener answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any `Host`.
    Any,
    /// These names, each with an optional port (`None`: any port).
    Only(Vec<(String, Option<u16>)>),
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` is not one the deployment answers to.
    Host(String),
    /// A state-changing request from another origin.
    Origin(String),
}

impl Refusal {
    /// A stable code and a message for the error body.
    pub fn code_and_message(&self) -> (&'static str, String) {
        match self {
            Refusal::Host(h) => (
                "host_not_allowed",
                format!(
                    "this server does not answer to the host {h:?}; add it to the allowed hosts"
                ),
            ),
            Refusal::Origin(o) => (
                "origin_not_allowed",
                format!("a change requested by a page of {o:?} is refused: it is another origin"),
            ),
        }
    }
}

/// Splits `host[:port]` (or `[v6]:port`) into a lowercase name and a port.
fn split_host(s: &str) -> Option<(String, Option<u16>)> {
    let s = s.trim().to_ascii_lowercase();
    if s.is_empty() {
        return None;
    }
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((format!("[{addr}]"), port));
    }
    match s.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') => {
            Some((name.to_string(), Some(port.parse().ok()?)))
        }
        Some(_) => None,
        None => Some((s, None)),
    }
}

impl AllowedHosts {
    /// From a comma-separated list (`*` for any); an empty list means the loopback names
    /// (`localhost`, `127.0.0.1`, `[::1]`, any port) when `listen` is a loopback address, and
    /// any host otherwise.
    pub fn parse(list: &str, listen: SocketAddr) -> anyhow::Result<AllowedHosts> {
        let items: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if items.is_empty() {
            return Ok(if listen.ip().is_loopback() {
                AllowedHosts::loopback()
            } else {
                AllowedHosts::Any
            });
        }
        if items.contains(&"*") {
            return Ok(AllowedHosts::Any);
        }
        items
            .into_iter()
            .map(|i| split_host(i).ok_or_else(|| anyhow::anyhow!("{i:?} is not host or host:port")))
            .collect::<anyhow::Result<Vec<_>>>()
            .map(AllowedHosts::Only)
    }

    pub fn loopback() -> AllowedHosts {
        AllowedHosts::Only(
            ["localhost", "127.0.0.1", "[::1]"]
                .into_iter()
                .map(|h| (h.to_string(), None))
                .collect(),
        )
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            AllowedHosts::Any => true,
            AllowedHosts::Only(list) => match split_host(host) {
                Some((name, port)) => list
                    .iter()
                    .any(|(n, p)| *n == name && (p.is_none() || *p == port)),
                None => false,
            },
        }
    }
}

/// Whether the request may proceed. `public_origin` (`scheme://host[:port]`, as browsers
/// reach the deployment through a proxy that rewrites `Host`) is accepted as the deployment's
/// own origin too.
pub fn check(
    allowed: &AllowedHosts,
    public_origin: Option<&str>,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !allowed.allows(host) {
        return Err(Refusal::Host(host.to_string()));
    }
    let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !changes {
        return Ok(());
    }
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("cross-site"))
    {
        return Err(Refusal::Origin("a cross-site page".into()));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("").trim();
    if public_origin.is_some_and(|p| p.trim_end_matches('/').eq_ignore_ascii_case(origin)) {
        return Ok(());
    }
    // Same origin: the Origin's authority is the Host this request was sent to.
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match (authority.and_then(split_host), split_host(host)) {
        (Some(a), Some(h)) if a == h => Ok(()),
        _ => Err(Refusal::Origin(origin.to_string())),
    }
}

/// Whether a browser would run something served with this media type (scripts, markup, SVG,
/// XML): such content is only ever served sandboxed (`Content-Security-Policy: sandbox`) or as
/// an attachment.
pub fn is_active_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "text/html"
            | "application/xhtml+xml"
            | "image/svg+xml"
            | "text/xml"
            | "application/xml"
            | "text/xsl"
            | "text/javascript"
            | "application/javascript"
            | "application/ecmascript"
            | "text/ecmascript"
            | "application/x-javascript"
            | "text/x-javascript"
            | "application/wasm"
            | "application/pdf"
            | "text/vtt"
            | "multipart/x-mixed-replace"
    ) || essence.ends_with("+xml")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn active_types() {
        assert!(is_active_type("text/html; charset=utf-8"));
        assert!(is_active_type("IMAGE/SVG+XML"));
        assert!(is_active_type("application/atom+xml"));
        assert!(!is_active_type("text/plain; charset=utf-8"));
        assert!(!is_active_type("image/png"));
        assert!(!is_active_type("application/octet-stream"));
    }

    /// What `check` answers for `method` with these headers, as `Ok`, `"host"` or `"origin"`.
    fn verdict(
        hosts: &AllowedHosts,
        method: Method,
        pairs: &[(&'static str, &str)],
    ) -> &'static str {
        match check(hosts, None, &method, &headers(pairs)) {
            Ok(()) => "ok",
            Err(Refusal::Host(_)) => "host",
            Err(Refusal::Origin(_)) => "origin",
        }
    }

    #[test]
    fn hosts_and_origins() {
        let lo: SocketAddr = "127.0.0.1:8090".parse().expect("addr");
        let any: SocketAddr = "0.0.0.0:8090".parse().expect("addr");
        let loopback = AllowedHosts::parse("", lo).expect("parse");
        assert_eq!(
            AllowedHosts::parse("", any).expect("parse"),
            AllowedHosts::Any
        );
        for (host, expected) in [
            ("localhost:8090", "ok"),
            ("[::1]:1", "ok"),
            ("127.0.0.1", "ok"),
            ("evil.example:8090", "host"),
        ] {
            assert_eq!(
                verdict(&loopback, Method::GET, &[("host", host)]),
                expected,
                "{host}"
            );
        }
        assert_eq!(verdict(&loopback, Method::GET, &[]), "host");
        // Same origin, no origin, other origins; reads from another origin are not refused by
        // this check (CORS governs them).
        let host = ("host", "localhost:8090");
        for (method, extra, expected) in [
            (
                Method::POST,
                Some(("origin", "http://localhost:8090")),
                "ok",
            ),
            (Method::POST, None, "ok"),
            (
                Method::POST,
                Some(("origin", "http://evil.example")),
                "origin",
            ),
            (Method::POST, Some(("origin", "null")), "origin"),
            (
                Method::POST,
                Some(("origin", "http://localhost:9999")),
                "origin",
            ),
            (
                Method::POST,
                Some(("sec-fetch-site", "cross-site")),
                "origin",
            ),
            (Method::GET, Some(("origin", "http://evil.example")), "ok"),
        ] {
            let pairs: Vec<_> = std::iter::once(host).chain(extra).collect();
            assert_eq!(verdict(&loopback, method, &pairs), expected, "{extra:?}");
        }
        let listed = AllowedHosts::parse("hub.example.com, 10.0.0.5:8090", any).expect("parse");
        for (host, expected) in [
            ("HUB.example.com:443", "ok"),
            ("10.0.0.5:8090", "ok"),
            ("10.0.0.5:80", "host"),
        ] {
            assert_eq!(
                verdict(&listed, Method::GET, &[("host", host)]),
                expected,
                "{host}"
            );
        }
    }
}
