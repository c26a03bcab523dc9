//! Browser sign-in to the hub over HTTP, as a browser does it: one-time login links (a `GET`
//! only shows a button; the `POST` signs in, once), the HttpOnly session cookie accepted by the
//! API in place of a token, the CSRF token every change made with the cookie must carry (a
//! refused change changes nothing), sign-out, suspension ending sessions, OpenID Connect
//! against a real provider (users found by verified email or created, refusals shown on the
//! login page), and the pages served with their security headers.

use anyhow::Context;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tests::hub::{HubEnv, HubServer, data, refused};
use tests::oidc_mock::{Behaviour, MockOidc, sign_in_at};
use tests::*;

/// A browser: no redirects followed, cookies carried by hand (so the test sees each one).
struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: Option<String>,
    csrf: Option<String>,
}

impl Browser {
    fn new(server: &HubServer) -> Self {
        Browser {
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            base: server.url.clone(),
            cookie: None,
            csrf: None,
        }
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            r = r.header("cookie", c);
        }
        r
    }

    async fn json(r: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
        let resp = r.send().await?;
        let status = resp.status();
        Ok((status, resp.json().await.unwrap_or(Value::Null)))
    }

    /// Opens a login link: the page, then its button.
    async fn use_link(&mut self, link: &str) -> anyhow::Result<reqwest::Response> {
        let page = self.http.get(link).send().await?;
        anyhow::ensure!(page.status() == 200, "the link's page: {}", page.status());
        let html = page.text().await?;
        let path = link
            .find("/auth/link/")
            .map(|i| &link[i..])
            .context("a link path")?;
        anyhow::ensure!(
            html.contains(&format!("action=\"{path}\"")),
            "the page posts to its link: {html}"
        );
        let resp = self
            .http
            .post(link)
            .header("origin", &self.base)
            .send()
            .await?;
        self.take_cookie(&resp);
        Ok(resp)
    }

    fn take_cookie(&mut self, resp: &reqwest::Response) {
        if let Some(set) = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|c| c.starts_with("unicas_hub="))
        {
            let pair = set.split(';').next().unwrap_or_default();
            self.cookie = (pair != "unicas_hub=").then(|| pair.to_string());
        }
    }

    async fn session(&mut self) -> anyhow::Result<Value> {
        let s = data(
            &Self::json(self.req(reqwest::Method::GET, "/auth/session")).await?,
            200,
        );
        self.csrf = s["csrf_token"].as_str().map(str::to_string);
        Ok(s)
    }

    async fn post(
        &self,
        path: &str,
        body: &Value,
        csrf: bool,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut r = self
            .req(reqwest::Method::POST, path)
            .header("origin", &self.base)
            .json(body);
        if csrf && let Some(t) = &self.csrf {
            r = r.header("x-csrf-token", t);
        }
        Self::json(r).await
    }
}

fn set_cookie_of(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(str::to_string)
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn login_links_cookies_and_csrf(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let ada_token = env.user("ada")?;
    let server = env.start()?;
    let api = server.client(Some(&ada_token));
    let link = env.cli(&["user", "login-link", "ada"])?.trim().to_string();
    let link = format!(
        "{}{}",
        server.url,
        &link[link.find("/auth/link/").context("a link")?..]
    );

    // Not signed in: the page says so, the API refuses.
    let mut browser = Browser::new(&server);
    let anon = browser.session().await?;
    assert_eq!(anon["user"], Value::Null);
    assert_eq!(anon["auth_mode"], "token");
    refused(
        &Browser::json(browser.req(reqwest::Method::GET, "/api/v1/projects")).await?,
        401,
        "UNAUTHORIZED",
    );

    // The link signs in once: an HttpOnly cookie and a redirect home.
    let signed = browser.use_link(&link).await?;
    assert_eq!(signed.status(), 303);
    assert_eq!(location(&signed), "/");
    let set = set_cookie_of(&signed, "unicas_hub").context("a session cookie")?;
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Lax"),
        "{set}"
    );
    let again = Browser::new(&server).use_link(&link).await?;
    assert_eq!(
        location(&again),
        "/login?error=link_invalid",
        "a link works once"
    );
    assert!(set_cookie_of(&again, "unicas_hub").is_none());
    let bogus = Browser::new(&server)
        .http
        .get(format!("{}/auth/link/not%2Fa%2Ftoken", server.url))
        .send()
        .await?;
    assert_eq!(location(&bogus), "/login?error=link_invalid");

    let me = browser.session().await?;
    assert_eq!(me["user"]["id"], "ada");
    let csrf = browser.csrf.clone().context("a CSRF token")?;
    assert!(csrf.len() >= 32);

    // The cookie reads the API; a change without the CSRF token is refused and changes nothing.
    let list = data(
        &Browser::json(browser.req(reqwest::Method::GET, "/api/v1/projects")).await?,
        200,
    );
    assert_eq!(list["items"], json!([]));
    refused(
        &browser
            .post("/api/v1/projects", &json!({"name": "Forged"}), false)
            .await?,
        403,
        "CSRF_TOKEN_INVALID",
    );
    browser.csrf = Some("x".repeat(csrf.len()));
    refused(
        &browser
            .post("/api/v1/projects", &json!({"name": "Forged"}), true)
            .await?,
        403,
        "CSRF_TOKEN_INVALID",
    );
    assert_eq!(
        data(&api.get("/api/v1/projects").await?, 200)["items"],
        json!([]),
        "nothing was created"
    );
    browser.csrf = Some(csrf.clone());
    let made = data(
        &browser
            .post(
                "/api/v1/projects",
                &json!({"name": "From the browser"}),
                true,
            )
            .await?,
        201,
    );
    assert_eq!(made["owner"], "ada");
    // Another site's page cannot make the change even with the cookie.
    let cross = Browser::json(
        browser
            .req(reqwest::Method::POST, "/api/v1/projects")
            .header("origin", "https://evil.example")
            .header("x-csrf-token", &csrf)
            .json(&json!({"name": "Cross"})),
    )
    .await?;
    assert_eq!(cross.0, 403, "{cross:?}");
    // A token still works alone, without CSRF (API clients).
    data(
        &api.post("/api/v1/projects", &json!({"name": "By token"}))
            .await?,
        201,
    );

    // Sign-out needs the CSRF token; afterwards the cookie is worth nothing.
    refused(
        &browser.post("/auth/logout", &json!({}), false).await?,
        403,
        "CSRF_TOKEN_INVALID",
    );
    let kept_cookie = browser.cookie.clone();
    let out = browser
        .req(reqwest::Method::POST, "/auth/logout")
        .header("origin", &server.url)
        .header("x-csrf-token", &csrf)
        .send()
        .await?;
    assert_eq!(out.status(), 200);
    assert!(
        set_cookie_of(&out, "unicas_hub").is_some_and(|c| c.contains("Max-Age=0")),
        "sign-out clears the cookie"
    );
    browser.cookie = kept_cookie;
    assert_eq!(browser.session().await?["user"], Value::Null);
    refused(
        &Browser::json(browser.req(reqwest::Method::GET, "/api/v1/auth/me")).await?,
        401,
        "UNAUTHORIZED",
    );

    // Suspending a user ends their browser sessions.
    let mut second = Browser::new(&server);
    let link = env.cli(&["user", "login-link", "ada"])?.trim().to_string();
    second
        .use_link(&format!(
            "{}{}",
            server.url,
            &link[link.find("/auth/link/").context("a link")?..]
        ))
        .await?;
    assert_eq!(second.session().await?["user"]["id"], "ada");
    env.cli(&["user", "suspend", "ada"])?;
    assert_eq!(second.session().await?["user"], Value::Null);
    env.cli(&["user", "resume", "ada"])?;
    assert_eq!(
        second.session().await?["user"],
        Value::Null,
        "it stays ended"
    );
    assert!(env.cli(&["user", "login-link", "nobody"]).is_err());
    Ok(())
}

async fn oidc_sign_in_and_pages(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    let mock = MockOidc::start(env.env.dir.path()).await?;
    env.set("UNICAS_HUB_OIDC_PROVIDERS", mock.provider_config("mock"));
    env.cli(&["user", "create", "bo", "--email", "Bo@Example.test"])?;
    let server = env.start()?;
    let start = |next: &str| format!("{}/auth/oidc/mock?next={next}", server.url);

    // A verified email that a user holds signs that user in, and returns where asked.
    mock.set(Behaviour {
        subject: "sub-bo".into(),
        email: Some("bo@example.test".into()),
        ..Behaviour::default()
    });
    let done = sign_in_at(&start("%2Fprojects%2Fp1"), "unicas_hub_oidc", |u| u, true).await?;
    assert_eq!(done.status(), 303, "{:?}", done.text().await);
    assert_eq!(location(&done), "/projects/p1");
    let cookie = set_cookie_of(&done, "unicas_hub").context("a session cookie")?;
    let mut browser = Browser::new(&server);
    browser.cookie = cookie.split(';').next().map(str::to_string);
    assert_eq!(browser.session().await?["user"]["id"], "bo");
    // An open redirect is not followed.
    let elsewhere = sign_in_at(
        &start("https%3A%2F%2Fevil.example%2F"),
        "unicas_hub_oidc",
        |u| u,
        true,
    )
    .await?;
    assert_eq!(location(&elsewhere), "/");

    // An unknown verified email becomes a user of its own; the same subject stays that user.
    mock.set(Behaviour {
        subject: "sub-new".into(),
        email: Some("new@example.test".into()),
        ..Behaviour::default()
    });
    for _ in 0..2 {
        let r = sign_in_at(&start("%2F"), "unicas_hub_oidc", |u| u, true).await?;
        let mut b = Browser::new(&server);
        b.cookie =
            set_cookie_of(&r, "unicas_hub").and_then(|c| c.split(';').next().map(str::to_string));
        assert_eq!(b.session().await?["user"]["id"], "new@example.test");
    }

    // Refusals land on the login page with the reason, and sign nobody in.
    mock.set(Behaviour {
        subject: "sub-unverified".into(),
        email: Some("x@example.test".into()),
        email_verified: false,
        ..Behaviour::default()
    });
    let r = sign_in_at(&start("%2F"), "unicas_hub_oidc", |u| u, true).await?;
    assert!(
        location(&r).starts_with("/login?error=oidc_failed&message="),
        "{}",
        location(&r)
    );
    assert!(set_cookie_of(&r, "unicas_hub").is_none());
    mock.set(Behaviour {
        subject: "sub-bo".into(),
        nonce_override: Some("another".into()),
        ..Behaviour::default()
    });
    let r = sign_in_at(&start("%2F"), "unicas_hub_oidc", |u| u, true).await?;
    assert!(
        location(&r).contains("not%20issued%20for%20this%20sign-in"),
        "{}",
        location(&r)
    );
    mock.set(Behaviour {
        subject: "sub-bo".into(),
        ..Behaviour::default()
    });
    let r = sign_in_at(&start("%2F"), "unicas_hub_oidc", |u| u, false).await?;
    assert!(
        location(&r).starts_with("/login?error=oidc_failed"),
        "another browser cannot finish it"
    );
    let unknown = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?
        .get(format!("{}/auth/oidc/nope", server.url))
        .send()
        .await?;
    assert!(location(&unknown).starts_with("/login?error=oidc_failed"));

    // The session answer lists the provider for the login page.
    let anon = Browser::new(&server).session().await?;
    assert_eq!(
        anon["providers"],
        json!([{"name": "mock", "display_name": "Mock provider"}])
    );

    // Every address of the UI is the page, with its policy; the assets are served.
    let http = reqwest::Client::new();
    for path in [
        "/",
        "/login",
        "/tokens",
        "/projects/p1",
        "/projects/p1/notebooks/n1/diff",
    ] {
        let r = http.get(format!("{}{path}", server.url)).send().await?;
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.headers()["content-security-policy"].to_str()?.to_string();
        assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
        assert!(r.text().await?.contains("/ui/app.js"));
    }
    for (path, kind) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let r = http.get(format!("{}{path}", server.url)).send().await?;
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"].to_str()?.starts_with(kind));
    }
    Ok(())
}

hub_e2e!(login_links_cookies_and_csrf, oidc_sign_in_and_pages);
