//! What browser sign-in needs on both programs: random secrets and their stored hashes,
//! cookies in and out, comparisons that take the same time wherever strings differ, and the
//! page a one-time login link shows (only its `POST` uses the link, so a previewer or scanner
//! that fetches the URL cannot burn it).

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// Base64url without padding.
pub fn url_safe(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A random secret of 256 bits, URL-safe.
pub fn random_token() -> String {
    url_safe(&rand::random::<[u8; 32]>())
}

/// What is stored of a secret.
pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Whether `token` has the shape of a [`random_token`] (or a shorter URL-safe secret).
pub fn token_shaped(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 128
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The value of the cookie `name`, if the request carries it.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// A `Set-Cookie` value: HttpOnly, `SameSite=Lax`, `Secure` when the public URL is https;
/// `max_age_s == 0` clears it.
pub fn set_cookie(
    name: &str,
    value: &str,
    path: &str,
    max_age_s: i64,
    secure: bool,
) -> HeaderValue {
    let v = format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite=Lax; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    );
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("invalid=; Max-Age=0"))
}

/// Equal strings, in time independent of where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Percent-encodes a query or form value.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Undoes [`urlencode`]; `None` for a malformed escape or bytes that are not UTF-8.
pub fn urldecode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// An embedded file of a web UI: its type, revalidated on every use, never sniffed.
pub fn static_asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// Text safe inside HTML.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page of a one-time login link: a button whose `POST` to `action` signs in.
pub fn login_link_page(product: &str, explanation: &str, action: &str) -> Response {
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Sign in to {product}</title>\
         <style>body{{font:16px system-ui,sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}}\
         button{{font:inherit;padding:.6rem 1.2rem;border-radius:6px;border:1px solid #245;background:#2a5d9f;color:#fff;cursor:pointer}}</style>\
         </head><body><h1>{product}</h1>\
         <p>{explanation}</p>\
         <form method=\"post\" action=\"{action}\">\
         <button type=\"submit\" id=\"sign-in\">Sign in</button></form></body></html>",
        product = escape(product),
        explanation = escape(explanation),
        action = escape(action),
    );
    let mut response = Html(page).into_response();
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // `same-origin`, not `no-referrer`: the link never leaves in a referrer to another site,
    // and the form's POST keeps its real `Origin` (under `no-referrer` browsers send
    // `Origin: null`, which the cross-origin guard refuses).
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
        ),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a_b=1; a=2;  c=x=y"),
        );
        assert_eq!(cookie(&h, "a").as_deref(), Some("2"));
        assert_eq!(cookie(&h, "a_b").as_deref(), Some("1"));
        assert_eq!(cookie(&h, "c").as_deref(), Some("x=y"));
        assert_eq!(cookie(&h, "b"), None);
    }

    #[test]
    fn secrets_and_pages() {
        let t = random_token();
        assert!(token_shaped(&t) && t.len() == 43);
        assert!(!token_shaped("") && !token_shaped("a/b") && !token_shaped(&"a".repeat(129)));
        assert!(same(&t, &t.clone()) && !same(&t, "x"));
        assert_eq!(urlencode("a b&c"), "a%20b%26c");
        let next = "/projects/p 1?q=ä&x=/y";
        assert_eq!(urldecode(&urlencode(next)).as_deref(), Some(next));
        assert_eq!(urldecode("%zz"), None);
        assert_eq!(urldecode("%4"), None);
        let page = login_link_page("P<x>", "e", "/l/\"x");
        assert_eq!(page.status(), 200);
    }
}
