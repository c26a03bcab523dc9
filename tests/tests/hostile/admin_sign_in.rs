//! Class 8: admin sign-in. A one-time login link survives being fetched (a link previewer, a
//! mail scanner) and is used only by the click on its page; an OpenID Connect sign-in can be
//! finished only by the browser that started it.

use tests::oidc_mock::{MockOidc, sign_in};
use tests::{Backend, TestEnv, e2e};

e2e!(sign_in_is_bound_to_the_browser);

async fn sign_in_is_bound_to_the_browser(b: Backend) -> anyhow::Result<()> {
    let mock = MockOidc::start(&std::env::temp_dir()).await?;
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_OIDC_PROVIDERS", mock.provider_config("mock"));
    env.create_app("hub")?;
    env.cli(&[
        "admin",
        "add-account",
        "--email",
        "admin@example.test",
        "--app",
        "hub",
    ])?;
    let server = env.start()?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;

    // A login link fetched by a previewer three times still signs in, once.
    let printed = env.cli(&["admin", "login-link"])?;
    let line = printed.lines().last().unwrap_or_default();
    let link = format!(
        "{}{}",
        server.url,
        &line[line.find("/admin/login/link/").unwrap_or(0)..]
    );
    for _ in 0..3 {
        let page = http.get(&link).send().await?;
        assert_eq!(page.status(), 200);
        assert_eq!(page.headers()["cache-control"], "no-store");
    }
    let signed_in = http.post(&link).send().await?;
    assert_eq!(signed_in.status(), 303);
    assert!(
        signed_in.headers()["set-cookie"]
            .to_str()?
            .starts_with("unicas_admin=")
    );
    assert_eq!(http.post(&link).send().await?.status(), 401);

    // A sign-in finished in another browser (its state lured there) is refused...
    let lured = sign_in(&server.url, "mock", |u| u, false).await?;
    assert_eq!(lured.status(), 401);
    assert_eq!(
        lured.json::<serde_json::Value>().await?["error"],
        "OIDC_STATE_INVALID"
    );
    // ...and the browser that started one finishes it.
    let ok = sign_in(&server.url, "mock", |u| u, true).await?;
    assert_eq!(ok.status(), 303, "{:?}", ok.text().await);
    Ok(())
}
