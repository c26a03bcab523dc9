//! The admin UI's static assets, embedded in the binary and served at `/admin/ui/`.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::get;

use crate::Service;

const INDEX: &str = include_str!("../../../admin-ui/index.html");
const APP_JS: &str = include_str!("../../../admin-ui/app.js");
const APP_CSS: &str = include_str!("../../../admin-ui/app.css");
/// What the admin UI shares with the hub's web UI.
const COMMON_JS: &str = include_str!("../../../web-common/common.js");
const BASE_CSS: &str = include_str!("../../../web-common/base.css");

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = server_kit::web_auth::static_asset(body, content_type);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

pub fn router() -> Router<Service> {
    Router::new()
        .route(
            "/admin/ui",
            get(|| async { axum::response::Redirect::to("/admin/ui/") }),
        )
        .route(
            "/admin/ui/",
            get(|| async { asset(INDEX, "text/html; charset=utf-8") }),
        )
        .route(
            "/admin/ui/app.js",
            get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/admin/ui/app.css",
            get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }),
        )
        .route(
            "/admin/ui/common.js",
            get(|| async { asset(COMMON_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/admin/ui/base.css",
            get(|| async { asset(BASE_CSS, "text/css; charset=utf-8") }),
        )
}
