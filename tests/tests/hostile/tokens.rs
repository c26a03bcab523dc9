//! Class 9: token hygiene. Every capability that does not verify gets the same code and the
//! same message (an unknown key id must not be told apart from a bad signature, or anyone could
//! list an App's keys; a subject that no database could record as who acted is refused the
//! same way); a capability may not live longer than the configured maximum; and
//! `/metrics` can be moved to its own listener or turned off.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use tests::{Backend, TestEnv, TestKey, e2e};

e2e!(every_bad_token_looks_the_same, metrics_can_move_or_go);

fn now() -> i64 {
    cas_service::now_ms() / 1000
}

async fn every_bad_token_looks_the_same(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    env.set("UNICAS_MAX_CAPABILITY_LIFETIME_S", 600);
    let app = env.create_app("a")?;
    let stranger = TestKey::generate(env.dir.path(), "EdDSA")?;
    let server = env.start()?;
    let key = EncodingKey::from_ed_pem(app.key.private_pem.as_bytes())?;
    let other = EncodingKey::from_ed_pem(stranger.private_pem.as_bytes())?;
    let claims = |exp: i64, iat: i64, aud: &str| {
        json!({"iss": app.issuer, "aud": aud, "exp": exp, "iat": iat,
               "grants": [{"spaceId": "s", "permissions": ["cas:usage:read"]}]})
    };
    let sign = |kid: &str, key: &EncodingKey, claims: &Value| {
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(kid.to_string());
        jsonwebtoken::encode(&h, claims, key).expect("sign")
    };
    let good = claims(now() + 300, now(), "unicas");
    let send = |token: String| {
        let url = format!("{}/v1/cas/usage", server.url);
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .query(&[("appId", "a"), ("spaceId", "s")])
                .bearer_auth(token)
                .send()
                .await?;
            Ok::<_, anyhow::Error>((r.status().as_u16(), r.json::<Value>().await?))
        }
    };
    assert_eq!(send(sign(&app.kid, &key, &good)).await?.0, 200);
    let refused = [
        ("unknown kid", sign("no-such-key", &key, &good)),
        ("bad signature", sign(&app.kid, &other, &good)),
        (
            "expired",
            sign(
                &app.kid,
                &key,
                &claims(now() - 3600, now() - 4000, "unicas"),
            ),
        ),
        (
            "wrong audience",
            sign(&app.kid, &key, &claims(now() + 300, now(), "elsewhere")),
        ),
        (
            "lives too long",
            sign(&app.kid, &key, &claims(now() + 3600, now(), "unicas")),
        ),
        ("lives too long, no iat", {
            let mut c = claims(now() + 3600, 0, "unicas");
            c.as_object_mut().map(|o| o.remove("iat"));
            sign(&app.kid, &key, &c)
        }),
        ("not a JWT", "abc.def.ghi".to_string()),
        ("a subject holding a NUL character", {
            let mut c = good.clone();
            c["sub"] = "user\u{0}7".into();
            sign(&app.kid, &key, &c)
        }),
    ];
    let mut bodies = Vec::new();
    for (what, token) in refused {
        let (status, body) = send(token).await?;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(body["error"], "invalid_token", "{what}: {body}");
        bodies.push(body);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "the answers differ: {bodies:?}"
    );
    Ok(())
}

async fn metrics_can_move_or_go(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let http = reqwest::Client::new();
    let off = env.start_with(&[("UNICAS_METRICS_LISTEN", "off")])?;
    assert_eq!(
        http.get(format!("{}/metrics", off.url))
            .send()
            .await?
            .status(),
        404
    );
    drop(off);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let addr = format!("127.0.0.1:{port}");
    let own = env.start_with(&[("UNICAS_METRICS_LISTEN", addr.as_str())])?;
    assert_eq!(
        http.get(format!("{}/metrics", own.url))
            .send()
            .await?
            .status(),
        404
    );
    let mut text = String::new();
    for _ in 0..50 {
        if let Ok(r) = http.get(format!("http://{addr}/metrics")).send().await {
            text = r.text().await?;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        text.contains("# TYPE"),
        "no metrics on their own listener: {text:?}"
    );
    Ok(())
}
