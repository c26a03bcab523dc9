//! Who reaches a session: its user (by token, or in a browser by the session's open link and
//! the cookie it sets), shared editors; nobody else, and nothing of the caller's credentials
//! reaches marimo.

use tests::hub::data;
use tests::sessions::*;
use tests::*;

async fn only_the_sessions_user_gets_through(b: Backend) -> anyhow::Result<()> {
    let env = session_env(b).await?;
    let bob = env.user("bob")?;
    let (alice, server, a, pid, nid) = alice_notebook(&env).await?;
    add_member(&a, &pid, "bob", "editor").await?;
    let sid = started(&a, &pid, &nid, "app").await?;
    let s = data(&a.get(&session_path(&pid, &nid, &sid)).await?, 200);
    let page = format!("{}/s/{sid}/", server.url);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;

    // Nobody without credentials, nobody else, no forged or foreign cookie.
    assert_eq!(http.get(&page).send().await?.status(), 401);
    let as_bob = http.get(&page).bearer_auth(&bob).send().await?;
    assert_eq!(as_bob.status(), 404, "another user reached the session");
    assert_eq!(
        http.get(&page)
            .header("cookie", "uhub_s=forged.value")
            .send()
            .await?
            .status(),
        401
    );
    assert_eq!(
        http.get(format!("{}/s/sess-aaaaaaaaaaaaaaaa/", server.url))
            .bearer_auth(&alice)
            .send()
            .await?
            .status(),
        404
    );
    assert_eq!(
        http.get(format!("{}/s/not-a-session/", server.url))
            .bearer_auth(&alice)
            .send()
            .await?
            .status(),
        404
    );
    // Bob sees the record (a viewer of the project may) but gets no link to open it.
    let seen = data(
        &server
            .client(Some(&bob))
            .get(&session_path(&pid, &nid, &sid))
            .await?,
        200,
    );
    assert_eq!(seen["open_url"], serde_json::Value::Null);

    // The open link signs a browser in to this session only, once exchanged for a cookie.
    let open = s["open_url"].as_str().unwrap_or_default().to_string();
    assert!(open.starts_with(&format!("/s/{sid}/?ticket=")), "{open}");
    let r = http.get(format!("{}{open}", server.url)).send().await?;
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], format!("/s/{sid}/"));
    let cookie = r.headers()["set-cookie"].to_str()?.to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains(&format!("Path=/s/{sid}/")),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap_or_default().to_string();
    let with_cookie = http.get(&page).header("cookie", &pair).send().await?;
    assert_eq!(with_cookie.status(), 200);
    assert!(
        with_cookie.headers().get("set-cookie").is_none(),
        "marimo's own cookie leaked through"
    );
    // A tampered ticket is refused.
    let tampered = format!("{}{}x", server.url, open);
    assert_eq!(http.get(tampered).send().await?.status(), 401);
    // The cookie of this session opens no other.
    let other = started(&a, &pid, &nid, "edit").await?;
    let cross = http
        .get(format!("{}/s/{other}/", server.url))
        .header("cookie", &pair)
        .send()
        .await?;
    assert_eq!(cross.status(), 401, "one session's cookie opened another");
    // A page of another site cannot drive the session.
    let csrf = http
        .post(format!("{}/s/{sid}/api/kernel/run", server.url))
        .header("cookie", &pair)
        .header("origin", "https://attacker.example")
        .body("{}")
        .send()
        .await?;
    assert_eq!(csrf.status(), 403);
    for s in [&sid, &other] {
        data(&a.delete(&session_path(&pid, &nid, s)).await?, 200);
    }
    Ok(())
}

hub_e2e!(only_the_sessions_user_gets_through);
