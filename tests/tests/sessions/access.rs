//! Who reaches a session: its user (by token, or in a browser by the session's open link and
//! the cookie it sets), shared editors; nobody else, and nothing of the caller's credentials
//! reaches marimo.

use std::time::Duration;

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

/// With `UNICAS_HUB_SESSION_LISTEN`, sessions are opened on an origin of their own: a
/// notebook's output never runs on the hub's origin, where it could act as whoever views it
/// with their browser session.
async fn sessions_on_their_own_origin(b: Backend) -> anyhow::Result<()> {
    let mut env = session_env(b).await?;
    env.set("UNICAS_HUB_SESSION_LISTEN", "127.0.0.1:0");
    let (alice, server, a, pid, nid) = alice_notebook(&env).await?;
    let origin = eventually(
        Duration::from_secs(10),
        "the sessions' listener",
        || async {
            Ok(server
                .stdout_lines()
                .iter()
                .find_map(|l| l.strip_prefix("sessions listening on ").map(str::to_string)))
        },
    )
    .await?;
    assert_ne!(origin, server.url);
    let sid = started(&a, &pid, &nid, "app").await?;
    let s = data(&a.get(&session_path(&pid, &nid, &sid)).await?, 200);
    let open = s["open_url"].as_str().unwrap_or_default().to_string();
    assert!(
        open.starts_with(&format!("{origin}/s/{sid}/?ticket=")),
        "{open}"
    );
    assert_eq!(s["sandbox_url"], format!("{origin}/s/{sid}/"));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;

    // The hub's own origin renders no session for a browser, whatever it carries.
    let here = http
        .get(format!("{}/s/{sid}/", server.url))
        .bearer_auth(&alice)
        .send()
        .await?;
    assert_eq!(here.status(), 404);
    assert!(here.text().await?.contains("sessions are served at"));
    // The session's origin opens it with its link, and serves nothing else.
    let r = http.get(&open).send().await?;
    assert_eq!(r.status(), 303);
    let pair = r.headers()["set-cookie"]
        .to_str()?
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    let page = http
        .get(format!("{origin}/s/{sid}/"))
        .header("cookie", &pair)
        .send()
        .await?;
    assert_eq!(page.status(), 200);
    let api = http
        .get(format!("{origin}/api/v1/projects"))
        .bearer_auth(&alice)
        .send()
        .await?;
    assert_eq!(
        api.status(),
        404,
        "the hub API answered on the sessions' origin"
    );
    // The hub's web UI cookie (sent to every port of the host) opens nothing there.
    let link = env.cli(&["user", "login-link", "alice"])?;
    let link = link.trim();
    let signed = http
        .post(format!(
            "{}{}",
            server.url,
            &link[link.find("/auth/link/").unwrap_or(0)..]
        ))
        .header("origin", &server.url)
        .send()
        .await?;
    let web = signed.headers()["set-cookie"]
        .to_str()?
        .split(';')
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(web.starts_with("unicas_hub="), "{web}");
    let with_web = http
        .get(format!("{origin}/s/{sid}/"))
        .header("cookie", &web)
        .send()
        .await?;
    assert_eq!(
        with_web.status(),
        401,
        "the web UI's cookie opened a session on its origin"
    );
    // A page on the sessions' origin cannot change anything through the hub API.
    let forged = http
        .post(format!("{}/api/v1/projects", server.url))
        .bearer_auth(&alice)
        .header("origin", &origin)
        .json(&serde_json::json!({"name": "from a notebook"}))
        .send()
        .await?;
    assert_eq!(forged.status(), 403);
    // Another hub process still reaches the session through the hub's own listener.
    let forwarded = http
        .get(format!("{}/s/{sid}/", server.url))
        .bearer_auth(&alice)
        .header("x-unicas-hub-forwarded", "another-process")
        .send()
        .await?;
    assert_eq!(forwarded.status(), 200);
    data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    Ok(())
}

hub_e2e!(
    only_the_sessions_user_gets_through,
    sessions_on_their_own_origin
);
