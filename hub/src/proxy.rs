//! The session proxy: `/s/{sid}/…` on the hub's listener forwards HTTP and WebSocket traffic
//! to the session's sandbox, for callers allowed to use that session only. The hub adds the
//! sandbox's secret itself and strips the caller's credentials (hub tokens and cookies never
//! reach notebook code); nothing else can reach a sandbox's port. A request that arrives at a
//! hub process that does not own the sandbox is forwarded to the owner's internal URL.
//!
//! Browsers cannot send a bearer token on a navigation, so a session's record carries an
//! `open_url` for its user: a short-lived signed ticket that the proxy exchanges for a cookie
//! scoped to `/s/{sid}/`.

use std::sync::Arc;

use aws_lc_rs::hmac;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Hub;
use crate::auth::User;
use crate::catalog::Role;
use crate::config::AuthMode;
use crate::error::{HubError, HubResult};
use crate::ids::{self, SessionId};
use crate::sessions::LiveSession;
use crate::sessions::lifecycle::Owner;
use crate::sessions::view::proxy_path;
use crate::store::sessions::{SessionMode, SessionRow, SessionStatus, Sharing};

/// Set on a request one hub process forwards to another (never forwarded twice).
const FORWARDED: &str = "x-unicas-hub-forwarded";
/// The cookie that signs a browser in to one session.
const COOKIE: &str = "uhub_s";
const TICKET_TTL_MS: i64 = 5 * 60_000;
const COOKIE_TTL_MS: i64 = 12 * 3_600_000;

/// What the proxy needs: the HTTP client and the key of tickets and cookies.
pub struct ProxyState {
    client: Client<HttpConnector, Body>,
    key: hmac::Key,
}

impl ProxyState {
    /// `secret` is shared by the hub's processes (derived from its signing key).
    pub fn new(secret: &[u8]) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        ProxyState {
            client: Client::builder(TokioExecutor::new()).build(connector),
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// A token that lets `user` into session `sid` until `exp_ms`.
    fn sign(&self, purpose: &str, sid: &SessionId, user: &str, exp_ms: i64) -> String {
        let body = format!("{purpose}\n{sid}\n{user}\n{exp_ms}");
        let tag = hmac::sign(&self.key, body.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(body),
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// The user a token names, if it is genuine, unexpired, for this purpose and session.
    fn verify(&self, purpose: &str, sid: &SessionId, token: &str) -> Option<String> {
        let (body, tag) = token.split_once('.')?;
        let body = URL_SAFE_NO_PAD.decode(body).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        hmac::verify(&self.key, &body, &tag).ok()?;
        let body = String::from_utf8(body).ok()?;
        let mut f = body.split('\n');
        let (p, s, u, exp) = (f.next()?, f.next()?, f.next()?, f.next()?);
        let live = exp.parse::<i64>().ok()? > ids::now_ms();
        (p == purpose && s == sid.as_str() && live && f.next().is_none()).then(|| u.to_string())
    }
}

impl Hub {
    /// A URL that opens session `row` in a browser for `user`.
    pub fn open_url(&self, row: &SessionRow, user: &str) -> String {
        let base = self.config.session_base().unwrap_or("");
        let path = proxy_path(&row.session_id);
        if self.config.auth == AuthMode::None {
            return format!("{base}{path}");
        }
        let t = self.proxy.sign(
            "ticket",
            &row.session_id,
            user,
            ids::now_ms() + TICKET_TTL_MS,
        );
        format!("{base}{path}?ticket={t}")
    }

    /// Whether `user` may use (open, heartbeat) session `row`: its user; for a shared editor,
    /// the project's editors.
    /// For an app sandbox: those with a visit slot on it (seed 003), whoever started it.
    pub async fn may_use_session(&self, user: &User, row: &SessionRow) -> HubResult<bool> {
        if row.mode == SessionMode::App {
            return Ok(self
                .store
                .has_visit(&row.session_id, &user.id, ids::now_ms())
                .await?);
        }
        if row.user_id == user.id {
            return Ok(true);
        }
        let shared = self
            .store
            .read_editor_claim(&row.notebook_id)
            .await?
            .is_some_and(|c| c.sharing == Sharing::Shared && c.session_id == row.session_id);
        Ok(shared
            && self
                .project_for(user, &row.project_id, Role::Editor)
                .await
                .is_ok())
    }

    /// The caller of a proxied request: a session cookie, else a hub token (or, on the hub's own
    /// origin, its web UI session; never on the sessions' own origin, where that cookie also
    /// arrives when only the port differs).
    async fn proxy_caller(
        &self,
        method: &axum::http::Method,
        headers: &HeaderMap,
        sid: &SessionId,
        on_session_origin: bool,
    ) -> HubResult<User> {
        if self.config.auth == AuthMode::Token {
            let from_cookie = headers
                .get_all(header::COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(';'))
                .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
                .find_map(|t| self.proxy.verify("cookie", sid, t));
            if let Some(id) = from_cookie {
                return self
                    .user_standing(&id)
                    .await?
                    .ok_or_else(|| HubError::unauthorized("this user is suspended or gone"));
            }
        }
        self.authenticate_as(method, headers, !on_session_origin)
            .await
    }
}

/// Marks the requests of the sessions' own listener.
#[derive(Clone, Copy)]
pub struct SessionOrigin;

/// `/s/…` on the hub's own listener when sessions have an origin of their own: only what
/// another hub process forwards (a browser's navigation cannot carry the header, and a page's
/// script cannot send it cross-origin without a preflight the hub never grants), so no
/// notebook is ever rendered on the hub's origin.
pub async fn forwarded_only(State(hub): State<Hub>, req: Request) -> Response {
    if req.headers().contains_key(FORWARDED) {
        return proxy(State(hub), req).await;
    }
    HubError::not_found(format!(
        "sessions are served at {}",
        hub.config.session_base().unwrap_or("their own origin")
    ))
    .into_response()
}

/// `/s/{sid}/…`: the session's marimo, for those who may use it.
pub async fn proxy(State(hub): State<Hub>, req: Request) -> Response {
    match proxy_request(&hub, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn proxy_request(hub: &Hub, req: Request) -> HubResult<Response> {
    let path = req.uri().path().to_string();
    let rest = path.strip_prefix("/s/").unwrap_or("");
    let (raw_sid, tail) = match rest.split_once('/') {
        Some((s, t)) => (s, Some(t)),
        None => (rest, None),
    };
    let not_found = || HubError::not_found("no such session");
    let sid: SessionId = raw_sid.parse().map_err(|_| not_found())?;
    let query = req.uri().query().map(str::to_string);
    if tail.is_none() {
        let q = query.map(|q| format!("?{q}")).unwrap_or_default();
        return Ok(Redirect::permanent(&format!("{}{q}", proxy_path(&sid))).into_response());
    }
    if let Some(t) = ticket_of(query.as_deref()) {
        return exchange_ticket(hub, &sid, &t, &path, query.as_deref());
    }
    let on_session_origin = req.extensions().get::<SessionOrigin>().is_some();
    let user = hub
        .proxy_caller(req.method(), req.headers(), &sid, on_session_origin)
        .await?;
    let row = hub.store.session(&sid).await?.ok_or_else(not_found)?;
    if !hub.may_use_session(&user, &row).await? {
        return Err(not_found());
    }
    if row.status.is_terminal() || row.status == SessionStatus::Terminating {
        return Err(HubError::new(
            StatusCode::GONE,
            "session_ended",
            format!("this session is {}", row.status.as_str()),
        ));
    }
    match hub.owner_of(&row) {
        Owner::Here(live) => {
            let Some(sb) = live.sandbox().cloned() else {
                return Err(HubError::busy("the session is starting", 1));
            };
            live.touch(ids::now_ms());
            let target = format!("http://{}", sb.addr);
            relay(hub, req, &target, Hop::Sandbox(&sb.secret), Some(live)).await
        }
        Owner::There(url) => forward_to_owner(hub, &url, req).await,
        Owner::Gone => Err(HubError::new(
            StatusCode::GONE,
            "session_ended",
            "this session ended",
        )),
    }
}

fn ticket_of(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("ticket="))
        .map(str::to_string)
}

/// A valid ticket becomes a cookie for this session's path, and the URL without the ticket.
fn exchange_ticket(
    hub: &Hub,
    sid: &SessionId,
    ticket: &str,
    path: &str,
    query: Option<&str>,
) -> HubResult<Response> {
    let user = hub
        .proxy
        .verify("ticket", sid, ticket)
        .ok_or_else(|| HubError::unauthorized("this link expired; open the session again"))?;
    let cookie = hub
        .proxy
        .sign("cookie", sid, &user, ids::now_ms() + COOKIE_TTL_MS);
    let secure = hub
        .config
        .session_base()
        .is_some_and(|u| u.starts_with("https://"));
    let set = format!(
        "{COOKIE}={cookie}; Path={}; Max-Age={}; HttpOnly; SameSite=Lax{}",
        proxy_path(sid),
        COOKIE_TTL_MS / 1000,
        if secure { "; Secure" } else { "" }
    );
    let rest: Vec<&str> = query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("ticket="))
        .collect();
    let to = if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", rest.join("&"))
    };
    let mut resp = Redirect::to(&to).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&set).map_err(|e| HubError::internal("a session cookie", e))?,
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// Forwards a request to the hub process at `owner` that owns the session it is about.
pub async fn forward_to_owner(hub: &Hub, owner: &str, req: Request) -> HubResult<Response> {
    if req.headers().contains_key(FORWARDED) {
        return Err(HubError::unavailable(
            "the session's hub process does not own it any more; retry",
        ));
    }
    match relay(hub, req, owner, Hop::Owner(&hub.sessions.instance), None).await {
        Err(e) if e.code == "session_owner_unreachable" => {
            // Its process may have died on this host: adopt what it left.
            hub.recover_orphans().await;
            Err(e)
        }
        other => other,
    }
}

/// Where a relayed request goes.
enum Hop<'a> {
    /// The sandbox: its secret replaces the caller's credentials.
    Sandbox(&'a str),
    /// Another hub process: the caller's credentials go along, for it to check again.
    Owner(&'a str),
}

const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn is_upgrade(h: &HeaderMap) -> bool {
    h.get(header::UPGRADE).is_some()
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
        })
}

fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    let upgrade = h.get(header::UPGRADE).cloned();
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove("keep-alive");
    if keep_upgrade && let Some(u) = upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, u);
    }
}

async fn relay(
    hub: &Hub,
    mut req: Request,
    target: &str,
    hop: Hop<'_>,
    live: Option<Arc<LiveSession>>,
) -> HubResult<Response> {
    let upgrade = is_upgrade(req.headers());
    let on_client = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{target}{pq}")
        .parse::<Uri>()
        .map_err(|e| HubError::internal("a proxied URI", e))?;
    strip_hop_by_hop(&mut parts.headers, upgrade);
    match hop {
        Hop::Sandbox(secret) => {
            parts.headers.remove(header::AUTHORIZATION);
            parts.headers.remove(header::COOKIE);
            parts.headers.remove(FORWARDED);
            let bearer = HeaderValue::from_str(&format!("Bearer {secret}"))
                .map_err(|e| HubError::internal("a sandbox secret", e))?;
            parts.headers.insert(header::AUTHORIZATION, bearer);
        }
        Hop::Owner(me) => {
            let v =
                HeaderValue::from_str(me).map_err(|e| HubError::internal("an instance id", e))?;
            parts.headers.insert(FORWARDED, v);
        }
    }
    let upstream = hub
        .proxy
        .client
        .request(Request::from_parts(parts, body))
        .await
        .map_err(|e| match hop {
            Hop::Owner(_) => {
                tracing::warn!(error = %e, %target, "the session's hub process is unreachable");
                HubError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "session_owner_unreachable",
                    "the hub process that runs this session does not answer; retry",
                )
            }
            Hop::Sandbox(_) => {
                tracing::warn!(error = %e, "the sandbox does not answer");
                HubError::unavailable("the session's sandbox does not answer")
            }
        })?;
    let mut upstream = upstream;
    let switching = upstream.status() == StatusCode::SWITCHING_PROTOCOLS;
    let on_upstream = switching.then(|| hyper::upgrade::on(&mut upstream));
    let (mut parts, body) = upstream.into_parts();
    if let (Some(on_upstream), Some(on_client)) = (on_upstream, on_client) {
        let guard = live.as_ref().map(|l| l.socket_opened());
        tokio::spawn(async move {
            let (Ok(client), Ok(upstream)) = (on_client.await, on_upstream.await) else {
                return;
            };
            pump(TokioIo::new(client), TokioIo::new(upstream), live).await;
            drop(guard);
        });
    }
    strip_hop_by_hop(&mut parts.headers, switching);
    if matches!(hop, Hop::Sandbox(_)) {
        parts.headers.remove(header::SET_COOKIE);
    }
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// Copies both ways until either side closes; what the client sends counts as activity.
async fn pump<C, U>(client: C, upstream: U, live: Option<Arc<LiveSession>>)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    U: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let up = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(l) = &live {
                l.touch(ids::now_ms());
            }
            if uw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = uw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_bound_to_purpose_session_and_time() {
        let p = ProxyState::new(b"k");
        let sid = SessionId::generate();
        let other = SessionId::generate();
        let t = p.sign("ticket", &sid, "ada", ids::now_ms() + 60_000);
        assert_eq!(p.verify("ticket", &sid, &t).as_deref(), Some("ada"));
        assert_eq!(
            p.verify("cookie", &sid, &t),
            None,
            "a ticket is not a cookie"
        );
        assert_eq!(
            p.verify("ticket", &other, &t),
            None,
            "nor another session's"
        );
        let expired = p.sign("ticket", &sid, "ada", ids::now_ms() - 1);
        assert_eq!(p.verify("ticket", &sid, &expired), None);
        assert_eq!(ProxyState::new(b"other").verify("ticket", &sid, &t), None);
        let (body, tag) = t.split_once('.').unwrap_or_default();
        let forged = format!(
            "{}.{tag}",
            URL_SAFE_NO_PAD.encode(format!("ticket\n{sid}\nroot\n9999999999999"))
        );
        assert_eq!(p.verify("ticket", &sid, &forged), None);
        assert!(!body.is_empty());
        for junk in ["", ".", "a.b", "%%.%%"] {
            assert_eq!(p.verify("ticket", &sid, junk), None);
        }
    }

    #[test]
    fn upgrades_are_recognised_and_hop_by_hop_headers_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        assert!(is_upgrade(&h));
        let mut kept = h.clone();
        strip_hop_by_hop(&mut kept, true);
        assert_eq!(kept[header::UPGRADE], "websocket");
        assert_eq!(kept[header::CONNECTION], "upgrade");
        assert!(!kept.contains_key(header::TE));
        strip_hop_by_hop(&mut h, false);
        assert!(!is_upgrade(&h));
        assert!(h.is_empty());
    }
}
