//! The hub in a browser: the pages (plain HTML, CSS and JavaScript from `hub-ui/`, embedded
//! in the binary, no build step) served at every address of the UI, and browser sign-in
//! (`/auth/…`: one-time login links, OpenID Connect, the session the page reads its CSRF token
//! from, sign-out). The pages speak only the public API under `/api/v1`, with the session
//! cookie ([`session`]) in place of a token.

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use crate::Hub;
use crate::auth::User;
use crate::config::AuthMode;
use crate::error::{HubError, HubResult, ok};

pub mod oidc;
pub mod session;

pub use session::WebConfig;

const INDEX: &str = include_str!("../../../hub-ui/index.html");

/// The pages' scripts (ES modules) and style sheet, by name under `/ui/`.
macro_rules! assets {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../hub-ui/", $name)))),*]
    };
}
/// What the hub's web UI shares with the CAS admin UI.
const SHARED: &[(&str, &str)] = &[
    ("common.js", include_str!("../../../web-common/common.js")),
    ("base.css", include_str!("../../../web-common/base.css")),
];
const ASSETS: &[(&str, &str)] = assets![
    "app.css",
    "app.js",
    "api.js",
    "diff.js",
    "dom.js",
    "files.js",
    "format.js",
    "nav.js",
    "notebook.js",
    "projects.js",
    "sessions.js",
    "settings.js",
    "state.js",
    "storage.js",
    "tokens.js",
    "trash.js",
];

/// What the pages may load: their own scripts and styles, frames of this origin or of the
/// sessions' own (the marimo editor), nothing from elsewhere; they are never framed.
fn page_policy(session_origin: Option<&str>) -> String {
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         frame-src 'self'{}; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
         form-action 'self'",
        session_origin.map(|o| format!(" {o}")).unwrap_or_default()
    )
}

/// The routes of the pages and of browser sign-in.
pub fn router() -> Router<Hub> {
    Router::new()
        .route("/", get(page))
        .route("/login", get(page))
        .route("/tokens", get(page))
        .route("/projects", get(page))
        .route("/projects/{*rest}", get(page))
        .route("/ui/{file}", get(asset_file))
        .route("/auth/session", get(current_session))
        .route("/auth/logout", post(logout))
        .route("/auth/link/{secret}", get(link_page).post(use_link))
        .route("/auth/oidc/callback", get(oidc_callback))
        .route("/auth/oidc/{provider}", get(oidc_start))
}

async fn page(State(hub): State<Hub>) -> HubResult<Response> {
    let mut r = server_kit::web_auth::static_asset(INDEX, "text/html; charset=utf-8");
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(&page_policy(hub.config.session_base()))
            .map_err(|e| HubError::internal("the page's policy", e))?,
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    Ok(r)
}

async fn asset_file(Path(file): Path<String>) -> HubResult<Response> {
    let (_, body) = ASSETS
        .iter()
        .chain(SHARED)
        .find(|(name, _)| *name == file)
        .ok_or_else(|| HubError::not_found("no such file of the web UI"))?;
    let kind = if file.ends_with(".css") {
        "text/css; charset=utf-8"
    } else {
        "text/javascript; charset=utf-8"
    };
    Ok(server_kit::web_auth::static_asset(body, kind))
}

#[derive(Serialize)]
struct Provider {
    name: String,
    display_name: String,
}

/// What the page needs to know about its browser.
#[derive(Serialize)]
struct WebSession {
    /// `null`: not signed in.
    user: Option<User>,
    /// Echoed in `X-CSRF-Token` on every change.
    csrf_token: Option<String>,
    auth_mode: &'static str,
    providers: Vec<Provider>,
    /// Where sessions are served when they have an origin of their own (`null`: under `/s/`
    /// of this one).
    session_origin: Option<String>,
}

async fn current_session(State(hub): State<Hub>, headers: HeaderMap) -> HubResult<Response> {
    let providers = hub
        .config
        .web
        .oidc_providers
        .iter()
        .map(|p| Provider {
            name: p.name.clone(),
            display_name: p.display_name.clone().unwrap_or_else(|| p.name.clone()),
        })
        .collect();
    let (user, csrf_token, auth_mode) = if hub.config.auth == AuthMode::None {
        let user = hub.authenticate(&Method::GET, &headers).await?;
        (Some(user), None, "none")
    } else {
        match hub.web_caller(&Method::GET, &headers).await? {
            Some((user, csrf)) => (Some(user), Some(csrf), "token"),
            None => (None, None, "token"),
        }
    };
    let mut r = ok(WebSession {
        user,
        csrf_token,
        auth_mode,
        providers,
        session_origin: hub.config.session_url.clone(),
    });
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

async fn logout(State(hub): State<Hub>, headers: HeaderMap) -> HubResult<Response> {
    // A sign-out is a change: it needs the session's CSRF token like any other.
    hub.web_caller(&Method::POST, &headers).await?;
    hub.end_web_session(&headers).await
}

async fn link_page(Path(secret): Path<String>) -> Response {
    if !server_kit::web_auth::token_shaped(&secret) {
        return link_failed();
    }
    server_kit::web_auth::login_link_page(
        "UniCAS hub",
        "This one-time link signs you in to the notebook hub. It stops working once used.",
        &format!("/auth/link/{secret}"),
    )
}

fn link_failed() -> Response {
    let mut r = axum::response::Redirect::to("/login?error=link_invalid").into_response();
    *r.status_mut() = StatusCode::SEE_OTHER;
    r
}

async fn use_link(State(hub): State<Hub>, Path(secret): Path<String>) -> HubResult<Response> {
    Ok(hub
        .use_login_link(&secret)
        .await?
        .unwrap_or_else(link_failed))
}

#[derive(Deserialize)]
struct Next {
    next: Option<String>,
}

async fn oidc_start(
    State(hub): State<Hub>,
    Path(provider): Path<String>,
    Query(q): Query<Next>,
) -> HubResult<Response> {
    hub.oidc_start(&provider, q.next.as_deref()).await
}

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

async fn oidc_callback(
    State(hub): State<Hub>,
    headers: HeaderMap,
    q: Result<Query<Callback>, axum::extract::rejection::QueryRejection>,
) -> HubResult<Response> {
    let Ok(Query(q)) = q else {
        return Err(HubError::invalid("the callback's query is malformed"));
    };
    hub.oidc_callback(
        q.code.as_deref(),
        q.state.as_deref(),
        q.error.as_deref(),
        &headers,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    #[test]
    fn every_file_of_the_ui_is_served_and_preloaded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hub-ui");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".js") || n.ends_with(".css"))
            .collect();
        files.sort();
        let mut served: Vec<String> = ASSETS.iter().map(|(n, _)| n.to_string()).collect();
        served.sort();
        assert_eq!(
            files, served,
            "hub/src/web/mod.rs must list every file of hub-ui/"
        );
        for name in files
            .iter()
            .filter(|n| n.ends_with(".js") && *n != "app.js")
        {
            assert!(
                super::INDEX.contains(&format!("href=\"/ui/{name}\"")),
                "index.html preloads {name}"
            );
        }
    }
}
