//! An administrator's browser session on the admin plane, as tests sign in and call it.

use reqwest::StatusCode;
use reqwest::redirect::Policy;
use serde_json::Value;

use crate::Server;

/// An HTTP client that does not follow redirects (sign-in answers with one).
pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

/// A signed-in administrator: the session cookie and its CSRF token.
pub struct AdminSession {
    pub base: String,
    pub cookie: String,
    pub csrf: String,
}

impl AdminSession {
    pub async fn from_set_cookie(base: &str, resp: reqwest::Response) -> anyhow::Result<Self> {
        assert_eq!(
            resp.status(),
            StatusCode::SEE_OTHER,
            "{:?}",
            resp.text().await
        );
        assert_eq!(resp.headers()["location"], "/admin/ui/");
        let set = resp.headers()["set-cookie"].to_str()?.to_string();
        for attr in ["HttpOnly", "SameSite=Lax", "Path=/admin"] {
            assert!(set.contains(attr), "{set}");
        }
        let cookie = set.split(';').next().unwrap().to_string();
        let info: Value = http()
            .get(format!("{base}/admin/session"))
            .header("cookie", &cookie)
            .send()
            .await?
            .json()
            .await?;
        Ok(AdminSession {
            base: base.to_string(),
            csrf: info["csrfToken"].as_str().expect("csrf token").to_string(),
            cookie,
        })
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        http()
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap()
    }

    pub async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        http()
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("x-csrf-token", &self.csrf)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn json(&self, path: &str) -> Value {
        let r = self.get(path).await;
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }
}

/// Signs in as a browser does: the link's page, then its button (a POST).
pub async fn sign_in_with_link(server: &Server, link: &str) -> anyhow::Result<AdminSession> {
    let page = http().get(link).send().await?;
    assert_eq!(page.status(), 200);
    assert!(page.text().await?.contains("method=\"post\""));
    let resp = http().post(link).send().await?;
    AdminSession::from_set_cookie(&server.url, resp).await
}

/// The login link printed by `unicas-server admin login-link`, aimed at `server` (the command
/// does not know which port a test server bound).
pub fn link(server: &Server, printed: &str) -> String {
    let line = printed.lines().last().unwrap_or_default();
    let path = &line[line.find("/admin/login/link/").expect("a login link")..];
    format!("{}{path}", server.url)
}
