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

/// The UI's files: address, body, content type.
const FILES: [(&str, &str, &str); 5] = [
    ("/admin/ui/", INDEX, "text/html; charset=utf-8"),
    ("/admin/ui/app.js", APP_JS, "text/javascript; charset=utf-8"),
    ("/admin/ui/app.css", APP_CSS, "text/css; charset=utf-8"),
    (
        "/admin/ui/common.js",
        COMMON_JS,
        "text/javascript; charset=utf-8",
    ),
    ("/admin/ui/base.css", BASE_CSS, "text/css; charset=utf-8"),
];

pub fn router() -> Router<Service> {
    FILES.into_iter().fold(
        Router::new().route(
            "/admin/ui",
            get(|| async { axum::response::Redirect::to("/admin/ui/") }),
        ),
        |router, (path, body, kind)| {
            router.route(path, get(move || async move { asset(body, kind) }))
        },
    )
}
