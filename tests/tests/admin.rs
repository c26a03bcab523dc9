//! The admin plane end to end: the bootstrap login link, sessions, CSRF, the separation of the
//! admin and data planes, the admin API, reconciliation, and OpenID Connect sign-in against a
//! mock provider.

use std::collections::BTreeMap;
use std::time::Duration;

use cas_format::Hash;
use serde_json::{Value, json};
use tests::admin_session::{AdminSession, http, link, sign_in_with_link};
use tests::oidc_mock::{Behaviour, MockOidc};
use tests::*;

async fn bootstrap_sessions_and_plane_separation(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_ADMIN_SESSION_IDLE_MS", 1500);
    let app = env.create_app("hub")?;
    let server = env.start()?;
    // The first start printed a login link as its last line (it may come just after the server
    // answers: wait for it, briefly).
    let prefix = format!("{}/admin/login/link/", server.url);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        let printed = server.stdout_lines();
        match printed.last() {
            Some(l) if l.starts_with(&prefix) => break l.clone(),
            _ if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            _ => panic!("no login link as the last line: {printed:?}"),
        }
    };
    // Fetching the link (as a link previewer does) does not use it.
    for _ in 0..2 {
        assert_eq!(http().get(&first).send().await?.status(), 200);
    }
    let admin = sign_in_with_link(&server, &first).await?;
    // One use only.
    let again = http().post(&first).send().await?;
    assert_eq!(again.status(), 401);
    assert_eq!(again.json::<Value>().await?["error"], "LOGIN_LINK_INVALID");
    let session = admin.json("/admin/session").await;
    assert_eq!(session["account"]["id"], "local-operator");
    assert_eq!(session["account"]["platformAdmin"], true);

    // No session: 401 with the JSON error body.
    let r = http()
        .get(format!("{}/admin/apps", server.url))
        .send()
        .await?;
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await?["error"], "ADMIN_SESSION_REQUIRED");
    // A Space capability is no admin session.
    let jwt = app.token(&space("s"), &["cas:usage:read", "cas:root-refs:read"]);
    let r = http()
        .get(format!("{}/admin/apps", server.url))
        .bearer_auth(&jwt)
        .send()
        .await?;
    assert_eq!(r.status(), 401);
    // An admin cookie is no Space capability.
    let r = http()
        .get(format!("{}/v1/cas/usage?appId=hub&spaceId=s", server.url))
        .header("cookie", &admin.cookie)
        .send()
        .await?;
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await?["error"], "missing_token");
    // A state-changing request without the CSRF token: 403, and nothing changed.
    let r = http()
        .post(format!("{}/admin/apps/hub/suspend", server.url))
        .header("cookie", &admin.cookie)
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await?["error"], "CSRF_TOKEN_INVALID");
    let r = http()
        .post(format!("{}/admin/apps/hub/suspend", server.url))
        .header("cookie", &admin.cookie)
        .header("x-csrf-token", "not-the-token")
        .send()
        .await?;
    assert_eq!(r.status(), 403);
    assert_eq!(
        admin.json("/admin/apps/hub").await["app"]["suspended"],
        false
    );

    // A link from the command line works the same way.
    let second =
        sign_in_with_link(&server, &link(&server, &env.cli(&["admin", "login-link"])?)).await?;
    // Idle expiry.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let r = second.get("/admin/session").await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await?["error"], "ADMIN_SESSION_EXPIRED");
    // Logout ends a session.
    let third =
        sign_in_with_link(&server, &link(&server, &env.cli(&["admin", "login-link"])?)).await?;
    assert_eq!(third.post("/admin/logout", json!({})).await.status(), 204);
    assert_eq!(third.get("/admin/session").await.status(), 401);
    Ok(())
}

/// Admin actions, each checked against the data plane and against the invariant that balances
/// equal the sum of events (the projection is never edited directly).
async fn admin_api_and_reconciliation(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app("hub")?;
    let server = env.start()?;
    let meta = env.meta().await?;
    let admin =
        sign_in_with_link(&server, &link(&server, &env.cli(&["admin", "login-link"])?)).await?;
    let client = app.client(&server);
    let (s1, s2) = (space("s1"), space("s2"));
    let mut hashes = Vec::new();
    for i in 0..5u8 {
        let (h, bytes) = leaf(&[i; 9]);
        client.ensure_node(&s1, &h, &bytes, 60_000).await?;
        client.ensure_node(&s2, &h, &bytes, 60_000).await?;
        hashes.push(h);
    }
    let rid = |s: &str| s.parse::<cas_format::RequestId>().unwrap();
    client
        .update_root_refs(&s1, &rid("biz:1"), hashes.iter().map(|h| (*h, 2)).collect())
        .await?;
    client
        .update_root_refs(&s2, &rid("biz:2"), BTreeMap::from([(hashes[0], 1)]))
        .await?;
    client
        .update_root_refs(&s1, &rid("biz:3"), BTreeMap::from([(hashes[1], -1)]))
        .await?;

    let apps = admin.json("/admin/apps").await;
    assert_eq!(apps["items"][0]["appId"], "hub");
    assert_eq!(
        apps["items"][0]["usage"]["nodeCount"], 10,
        "the App total sums its Spaces"
    );
    let detail = admin.json("/admin/apps/hub").await;
    assert_eq!(detail["spaces"], json!(["s1", "s2"]));
    assert_eq!(detail["keys"][0]["kid"], "hub-key-1");
    assert_eq!(admin.json("/admin/apps/hub/usage").await["nodeCount"], 10);

    // Balances: every row carries its Space; pages are read at one revision.
    let page = admin.json("/admin/apps/hub/root-refs?limit=2").await;
    assert_eq!(page["revision"], 3);
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let cursor = page["nextCursor"].as_str().unwrap().to_string();
    client
        .update_root_refs(&s1, &rid("biz:4"), BTreeMap::from([(hashes[2], 5)]))
        .await?;
    let mut all = page["items"].as_array().unwrap().clone();
    let mut next = Some(cursor);
    while let Some(c) = next {
        let p = admin
            .json(&format!("/admin/apps/hub/root-refs?limit=2&cursor={c}"))
            .await;
        assert_eq!(p["revision"], 3);
        all.extend(p["items"].as_array().unwrap().iter().cloned());
        next = p["nextCursor"].as_str().map(str::to_string);
    }
    assert_eq!(all.len(), 6, "5 in s1 and 1 in s2 at revision 3: {all:?}");
    assert!(all.iter().all(|i| i["spaceId"].is_string()));
    let one = admin
        .json(&format!(
            "/admin/apps/hub/root-refs?spaceId=s1&hash={}",
            hashes[1]
        ))
        .await;
    assert_eq!(
        one["items"],
        json!([{"spaceId": "s1", "refDomain": "default", "hash": hashes[1], "refCount": 1}])
    );
    // Events: ascending, filterable, paginated at one revision.
    let events = admin.json("/admin/apps/hub/root-ref-events?limit=3").await;
    let revs: Vec<i64> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["revision"].as_i64().unwrap())
        .collect();
    assert_eq!(revs, vec![1, 2, 3]);
    let rest = admin
        .json(&format!(
            "/admin/apps/hub/root-ref-events?cursor={}",
            events["nextCursor"].as_str().unwrap()
        ))
        .await;
    assert_eq!(rest["items"][0]["revision"], 4);
    let s2_events = admin
        .json("/admin/apps/hub/root-ref-events?spaceId=s2")
        .await;
    assert_eq!(s2_events["items"].as_array().unwrap().len(), 1);
    assert_eq!(s2_events["items"][0]["requestId"], "biz:2");

    // Reconciliation: the business believes hashes[0] has 3 in s1 (CAS: 2) and that hashes[4]
    // is not held in s1 at all (CAS: 2). Everything else agrees.
    let mut intended = vec![
        json!({"spaceId": "s1", "hash": hashes[0], "count": 3}),
        json!({"spaceId": "s1", "hash": hashes[1], "count": 1}),
        json!({"spaceId": "s1", "hash": hashes[2], "count": 7}),
        json!({"spaceId": "s1", "hash": hashes[3], "count": 2}),
    ];
    let diff: Value = admin
        .post(
            "/admin/apps/hub/reconcile",
            json!({"watermark": "erp:2026-11-30T00:00", "balances": intended}),
        )
        .await
        .json()
        .await?;
    let differences = diff["differences"].as_array().unwrap();
    assert_eq!(differences.len(), 2, "{diff:#}");
    assert_eq!(
        differences[0]["delta"].as_i64().unwrap() + differences[1]["delta"].as_i64().unwrap(),
        1 - 2
    );
    let d0 = differences
        .iter()
        .find(|d| d["hash"] == json!(hashes[0]))
        .unwrap();
    assert_eq!(
        (
            d0["intended"].as_i64(),
            d0["actual"].as_i64(),
            d0["delta"].as_i64()
        ),
        (Some(3), Some(2), Some(1))
    );
    assert_eq!(
        d0["events"][0]["requestId"], "biz:1",
        "the events that explain it"
    );
    let d4 = differences
        .iter()
        .find(|d| d["hash"] == json!(hashes[4]))
        .unwrap();
    assert_eq!(d4["delta"], -2);
    // The same comparison as CSV.
    let csv: String = std::iter::once("spaceId,hash,count".to_string())
        .chain(intended.iter_mut().map(|i| {
            format!(
                "{},{},{}",
                i["spaceId"].as_str().unwrap(),
                i["hash"].as_str().unwrap(),
                i["count"]
            )
        }))
        .collect::<Vec<_>>()
        .join("\n");
    let r = http()
        .post(format!(
            "{}/admin/apps/hub/reconcile?watermark=erp:csv",
            server.url
        ))
        .header("cookie", &admin.cookie)
        .header("x-csrf-token", &admin.csrf)
        .header("content-type", "text/csv")
        .body(csv)
        .send()
        .await?;
    assert_eq!(
        r.json::<Value>().await?["differences"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // Bad input changes nothing.
    for bad in [
        json!({"watermark": "", "balances": []}),
        json!({"watermark": "w", "balances": [{"spaceId": "s1", "hash": "nothex", "count": 1}]}),
        json!({"watermark": "w", "balances": [{"spaceId": "s1", "hash": hashes[0], "count": -(1i64 << 53)}]}),
        json!({"watermark": "w", "refDomain": "Docs", "balances": []}),
    ] {
        assert_eq!(
            admin.post("/admin/apps/hub/reconcile", bad).await.status(),
            400
        );
    }
    // Apply the repairs: a normal signed delta with the admin as actor, then a read at the new
    // revision.
    let repairs = json!({"watermark": "erp:2026-11-30T00:00", "repairs": [
        {"spaceId": "s1", "hash": hashes[0], "delta": 1},
        {"spaceId": "s1", "hash": hashes[4], "delta": -2},
    ]});
    let applied: Value = admin
        .post("/admin/apps/hub/reconcile/apply", repairs.clone())
        .await
        .json()
        .await?;
    assert_eq!(applied["revision"], 5, "{applied:#}");
    assert_eq!(applied["updates"][0]["idempotent"], false);
    let balances: BTreeMap<String, i64> = applied["balances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["hash"].as_str().unwrap().to_string(),
                b["refCount"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(balances[&hashes[0].to_string()], 3);
    assert_eq!(balances[&hashes[4].to_string()], 0);
    let event = admin
        .json("/admin/apps/hub/root-ref-events?spaceId=s1")
        .await;
    let last = event["items"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["actor"], "admin:local-operator");
    assert!(
        last["requestId"]
            .as_str()
            .unwrap()
            .starts_with("admin-repair:")
    );
    // Applying again replays: no new revision.
    let again: Value = admin
        .post("/admin/apps/hub/reconcile/apply", repairs)
        .await
        .json()
        .await?;
    assert_eq!(
        (
            again["revision"].as_i64(),
            again["updates"][0]["idempotent"].as_bool()
        ),
        (Some(5), Some(true))
    );
    let after: Value = admin
        .post(
            "/admin/apps/hub/reconcile",
            json!({"watermark": "erp:after", "balances": intended}),
        )
        .await
        .json()
        .await?;
    assert_eq!(
        after["differences"],
        json!([]),
        "the verified result matches"
    );

    env.check_invariants(&meta, &app.app).await?;

    // Keys: a revoked key stops working at once on this replica; an added one works.
    let key = TestKey::generate(env.dir.path(), "ES256")?;
    let r = admin
        .post(
            "/admin/apps/hub/keys",
            json!({"kid": "es-2", "alg": "ES256", "publicKeyPem": key.public_pem}),
        )
        .await;
    assert_eq!(r.status(), 201);
    assert_eq!(
        admin
            .post(
                "/admin/apps/hub/keys",
                json!({"kid": "x", "alg": "HS256", "publicKeyPem": "x"})
            )
            .await
            .status(),
        400
    );
    assert_eq!(
        admin
            .post("/admin/apps/hub/keys/hub-key-1/revoke", json!({}))
            .await
            .status(),
        200
    );
    let e = client.usage(&s1).await.unwrap_err();
    assert_eq!(e.code(), Some("invalid_token"));
    let es = cas_client::SigningKey::from_pem(&key.private_pem, "es-2", &app.issuer, "unicas")?;
    let es_client =
        cas_client::AppCasClient::new(&server.url, app.app.clone(), std::sync::Arc::new(es))?;
    assert_eq!(es_client.usage(&s1).await?.node_count, 5);
    // Suspension and resumption.
    assert_eq!(
        admin
            .post("/admin/apps/hub/suspend", json!({}))
            .await
            .json::<Value>()
            .await?["app"]["suspended"],
        true
    );
    assert_eq!(
        es_client.usage(&s1).await.unwrap_err().code(),
        Some("APP_SUSPENDED")
    );
    assert_eq!(
        admin.json("/admin/apps/hub/usage").await["nodeCount"],
        10,
        "admin reads keep working"
    );
    admin.post("/admin/apps/hub/resume", json!({})).await;
    assert_eq!(es_client.usage(&s1).await?.node_count, 5);
    // GC of a Space.
    let gc: Value = admin
        .post("/admin/apps/hub/gc", json!({"spaceId": "s2"}))
        .await
        .json()
        .await?;
    assert!(gc["examined"].is_number());
    // Members.
    let m: Value = admin
        .post(
            "/admin/apps/hub/members",
            json!({"email": "Ops@Example.test"}),
        )
        .await
        .json()
        .await?;
    assert_eq!(m["member"]["email"], "ops@example.test");
    let id = m["member"]["accountId"].as_str().unwrap().to_string();
    assert_eq!(
        admin.json("/admin/apps/hub").await["members"][0]["accountId"],
        json!(id)
    );
    let r = http()
        .delete(format!("{}/admin/apps/hub/members/{id}", server.url))
        .header("cookie", &admin.cookie)
        .header("x-csrf-token", &admin.csrf)
        .send()
        .await?;
    assert_eq!(r.status(), 204);
    // Every action is audited.
    let audit = admin.json("/admin/apps/hub/audit").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for a in [
        "reconcile.compare",
        "reconcile.apply",
        "key.add",
        "key.revoke",
        "app.suspend",
        "app.resume",
        "gc",
        "member.add",
        "member.remove",
    ] {
        assert!(actions.contains(&a), "{a} not audited: {actions:?}");
    }
    env.check_invariants(&meta, &app.app).await?;
    // Unknown App.
    assert_eq!(admin.get("/admin/apps/nope").await.status(), 404);
    Ok(())
}

/// Runs the sign-in dance through the mock provider; `tamper` may change the callback URL.
/// A sign-in through the provider, as a browser does it (see [`oidc_mock::sign_in`]).
async fn oidc_login(
    server: &Server,
    provider: &str,
    tamper: impl FnOnce(String) -> String,
) -> anyhow::Result<reqwest::Response> {
    tests::oidc_mock::sign_in(&server.url, provider, tamper, true).await
}

async fn oidc_login_as(
    server: &Server,
    provider: &str,
    tamper: impl FnOnce(String) -> String,
    same_browser: bool,
) -> anyhow::Result<reqwest::Response> {
    tests::oidc_mock::sign_in(&server.url, provider, tamper, same_browser).await
}

async fn code(r: reqwest::Response) -> (u16, String) {
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, body["error"].as_str().unwrap_or("").to_string())
}

async fn oidc_sign_in(b: Backend) -> anyhow::Result<()> {
    let mock = MockOidc::start(&std::env::temp_dir()).await?;
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_OIDC_PROVIDERS", mock.provider_config("mock"));
    env.create_app("hub")?;
    env.create_app("other")?;
    env.cli(&[
        "admin",
        "add-account",
        "--email",
        "admin@example.test",
        "--app",
        "hub",
    ])?;
    env.cli(&[
        "admin",
        "add-account",
        "--email",
        "blocked@example.test",
        "--app",
        "hub",
    ])?;
    env.cli(&["admin", "block", "blocked@example.test"])?;
    env.cli(&[
        "admin",
        "add-account",
        "--email",
        "otherteam@example.test",
        "--app",
        "other",
    ])?;
    let server = env.start()?;
    let providers: Value = http()
        .get(format!("{}/admin/providers", server.url))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(providers["items"][0]["name"], "mock");

    // A member signs in; the identity is linked to the account with its verified email.
    let ok = oidc_login(&server, "mock", |u| u).await?;
    let admin = AdminSession::from_set_cookie(&server.url, ok).await?;
    assert_eq!(
        admin.json("/admin/session").await["account"]["email"],
        "admin@example.test"
    );
    let apps = admin.json("/admin/apps").await;
    assert_eq!(
        apps["items"].as_array().unwrap().len(),
        1,
        "a member sees its App only"
    );
    assert_eq!(admin.get("/admin/apps/other").await.status(), 404);
    // The next sign-in resolves by identity, even with another email.
    mock.set(Behaviour {
        email: Some("renamed@example.test".into()),
        ..Behaviour::default()
    });
    assert_eq!(oidc_login(&server, "mock", |u| u).await?.status(), 303);

    // Wrong state.
    mock.set(Behaviour::default());
    let r = oidc_login(&server, "mock", |u| u.replace("state=", "state=x")).await?;
    assert_eq!(code(r).await, (401, "OIDC_STATE_INVALID".into()));
    // A callback finished by another browser (a state lured into a victim's browser, or a
    // stolen callback URL): without the cookie of the browser that started it, refused.
    let r = oidc_login_as(&server, "mock", |u| u, false).await?;
    assert_eq!(code(r).await, (401, "OIDC_STATE_INVALID".into()));
    // Wrong nonce.
    mock.set(Behaviour {
        nonce_override: Some("forged".into()),
        ..Behaviour::default()
    });
    assert_eq!(
        code(oidc_login(&server, "mock", |u| u).await?).await,
        (401, "OIDC_NONCE_MISMATCH".into())
    );
    // Expired ID token.
    mock.set(Behaviour {
        expires_in: -600,
        ..Behaviour::default()
    });
    assert_eq!(
        code(oidc_login(&server, "mock", |u| u).await?).await,
        (401, "OIDC_TOKEN_EXPIRED".into())
    );
    // Unknown provider.
    assert_eq!(
        code(oidc_login(&server, "nope", |u| u).await?).await,
        (404, "OIDC_PROVIDER_UNKNOWN".into())
    );
    // A blocked account.
    mock.set(Behaviour {
        subject: "blocked".into(),
        email: Some("blocked@example.test".into()),
        ..Behaviour::default()
    });
    assert_eq!(
        code(oidc_login(&server, "mock", |u| u).await?).await,
        (403, "ACCOUNT_BLOCKED".into())
    );
    // Nobody knows this identity, or the email is not verified.
    mock.set(Behaviour {
        subject: "stranger".into(),
        email: Some("stranger@example.test".into()),
        ..Behaviour::default()
    });
    assert_eq!(
        code(oidc_login(&server, "mock", |u| u).await?).await,
        (403, "NOT_ADMITTED".into())
    );
    mock.set(Behaviour {
        subject: "unverified".into(),
        email: Some("otherteam@example.test".into()),
        email_verified: false,
        ..Behaviour::default()
    });
    assert_eq!(
        code(oidc_login(&server, "mock", |u| u).await?).await,
        (403, "NOT_ADMITTED".into())
    );
    // A member of another App only: signed in, and sees only that App.
    mock.set(Behaviour {
        subject: "other".into(),
        email: Some("otherteam@example.test".into()),
        ..Behaviour::default()
    });
    let other =
        AdminSession::from_set_cookie(&server.url, oidc_login(&server, "mock", |u| u).await?)
            .await?;
    assert_eq!(
        other.json("/admin/apps").await["items"][0]["appId"],
        "other"
    );
    assert_eq!(other.get("/admin/apps/hub").await.status(), 404);
    assert_eq!(other.get("/admin/apps/hub/root-refs").await.status(), 404);
    assert_eq!(
        other
            .post("/admin/apps/hub/suspend", json!({}))
            .await
            .status(),
        404
    );
    assert_eq!(
        other
            .post("/admin/apps", json!({"appId": "x", "issuer": "y"}))
            .await
            .status(),
        403,
        "members cannot create Apps"
    );
    // Blocking ends existing sessions.
    env.cli(&["admin", "block", "otherteam@example.test"])?;
    assert_eq!(other.get("/admin/apps").await.status(), 403);
    let _ = Hash::digest(b"");
    Ok(())
}

e2e!(
    bootstrap_sessions_and_plane_separation,
    admin_api_and_reconciliation,
    oidc_sign_in
);
