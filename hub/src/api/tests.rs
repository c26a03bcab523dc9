//! The router without sockets: a hub on a temporary SQLite database and no content store,
//! driven through `tower::ServiceExt::oneshot`. What needs the store answers 503; everything
//! decided before it (routing, ids, authentication, the browser guard, body parsing) is
//! checked here.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use crate::Hub;
use crate::config::HubConfig;

struct Fixture {
    router: Router,
    token: String,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = HubConfig::defaults(dir.path().to_path_buf());
    config.validate().expect("the defaults are valid");
    let hub = Hub::open(config, None).await.expect("hub without a store");
    hub.create_user("ada", "Ada", None, false)
        .await
        .expect("user");
    let (token, _) = hub
        .create_token("ada", "tests", None, None)
        .await
        .expect("token");
    Fixture {
        router: super::router(hub),
        token,
        _dir: dir,
    }
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `error.code` of an envelope, after checking it is a failure envelope.
    fn error_code(&self) -> String {
        let v = self.json();
        assert_eq!(v["success"], false, "{v}");
        v["error"]["code"].as_str().expect("error code").to_string()
    }
}

impl Fixture {
    fn request(&self, method: Method, uri: &str) -> axum::http::request::Builder {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, "127.0.0.1:8090")
    }

    fn authed(&self, method: Method, uri: &str) -> axum::http::request::Builder {
        self.request(method, uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
    }

    async fn send(&self, req: axum::http::request::Builder, body: Body) -> Answer {
        let resp = self
            .router
            .clone()
            .oneshot(req.body(body).expect("request"))
            .await
            .expect("infallible");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec();
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, uri: &str) -> Answer {
        self.send(self.authed(Method::GET, uri), Body::empty())
            .await
    }
}

#[tokio::test]
async fn liveness_answers_without_a_store_and_readiness_says_why_not() {
    let f = fixture().await;
    let a = f
        .send(f.request(Method::GET, "/healthz"), Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body, b"ok");
    let a = f
        .send(f.request(Method::GET, "/readyz"), Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.error_code(), "UNAVAILABLE");
    assert!(a.headers.contains_key(header::RETRY_AFTER));
}

#[tokio::test]
async fn unknown_routes_are_a_not_found_envelope() {
    let f = fixture().await;
    let a = f.get("/api/v1/no-such-thing").await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    assert_eq!(a.error_code(), "NOT_FOUND");
}

#[tokio::test]
async fn ids_that_do_not_parse_name_nothing() {
    let f = fixture().await;
    for uri in [
        "/api/v1/projects/not-a-project",
        "/api/v1/projects/proj-AAAAAAAAAAAAAAAA",
        "/api/v1/projects/proj-aaaaaaaaaaaaaaa1/notebooks",
        "/api/v1/projects/proj-aaaaaaaaaaaaaaaa/notebooks/nb-%2E%2E",
        "/api/v1/projects/proj-aaaaaaaaaaaaaaaa/notebooks/nb-aaaaaaaaaaaaaaaa/versions/v1",
    ] {
        let a = f.get(uri).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(a.error_code(), "NOT_FOUND", "{uri}");
    }
}

#[tokio::test]
async fn well_formed_ids_reach_the_handler() {
    // A valid id passes the extractor; the handler then needs the store, which is absent.
    let f = fixture().await;
    let a = f.get("/api/v1/projects/proj-aaaaaaaaaaaaaaaa").await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", a.json());
    assert_eq!(a.error_code(), "UNAVAILABLE");
}

#[tokio::test]
async fn callers_without_a_valid_token_are_refused() {
    let f = fixture().await;
    let a = f
        .send(f.request(Method::GET, "/api/v1/auth/me"), Body::empty())
        .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(a.error_code(), "UNAUTHORIZED");
    let forged = f
        .request(Method::GET, "/api/v1/auth/me")
        .header(header::AUTHORIZATION, "Bearer uhub_pat_forged");
    let a = f.send(forged, Body::empty()).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let a = f.get("/api/v1/auth/me").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["data"]["id"], "ada");
}

#[tokio::test]
async fn foreign_hosts_and_cross_site_changes_are_refused() {
    let f = fixture().await;
    let other_host = Request::builder()
        .uri("/healthz")
        .header(header::HOST, "attacker.example");
    let a = f.send(other_host, Body::empty()).await;
    assert_eq!(a.status, StatusCode::MISDIRECTED_REQUEST);
    let cross_site = f
        .authed(Method::POST, "/api/v1/projects")
        .header(header::ORIGIN, "https://attacker.example")
        .header(header::CONTENT_TYPE, "application/json");
    let a = f.send(cross_site, Body::from(r#"{"name":"x"}"#)).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    let same_site = f
        .authed(Method::POST, "/api/v1/auth/tokens")
        .header(header::ORIGIN, "http://127.0.0.1:8090")
        .header(header::CONTENT_TYPE, "application/json");
    let a = f.send(same_site, Body::from(r#"{"name":"cli"}"#)).await;
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.json());
}

#[tokio::test]
async fn bad_json_bodies_are_unprocessable() {
    let f = fixture().await;
    for body in ["{", r#"{"name": 7}"#, "[]"] {
        let req = f
            .authed(Method::POST, "/api/v1/auth/tokens")
            .header(header::CONTENT_TYPE, "application/json");
        let a = f.send(req, Body::from(body)).await;
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(a.error_code(), "VALIDATION_ERROR", "{body}");
    }
}

#[tokio::test]
async fn the_openapi_document_lists_the_routes_it_serves() {
    let f = fixture().await;
    let a = f
        .send(
            f.request(Method::GET, "/api/v1/openapi.json"),
            Body::empty(),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    let doc = a.json();
    let paths = doc["paths"].as_object().expect("paths");
    for p in [
        "/api/v1/projects",
        "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/{path}",
        "/api/sync/git/v1",
        "/healthz",
    ] {
        assert!(paths.contains_key(p), "{p} missing from {:?}", paths.keys());
    }
    assert!(
        !paths.keys().any(|p| p.contains("{*")),
        "routing wildcards leak into the document"
    );
}
