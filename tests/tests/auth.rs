//! Capability auth end to end: every refusal answers its code and touches no storage.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cas_client::Ensured;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sqlx::Row;
use tests::*;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(app: &TestApp, space: &str, perms: &[&str]) -> Value {
    json!({
        "iss": app.issuer, "aud": "unicas", "iat": now(), "exp": now() + 300,
        "grants": [{"spaceId": space, "permissions": perms}],
    })
}

fn sign(alg: Algorithm, kid: &str, key: &EncodingKey, claims: &Value) -> String {
    let mut h = Header::new(alg);
    h.kid = Some(kid.to_string());
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

fn ed_key(pem: &str) -> EncodingKey {
    EncodingKey::from_ed_pem(pem.as_bytes()).unwrap()
}

/// Counts of everything a lease could have written.
async fn storage_touched(env: &TestEnv) -> anyhow::Result<(i64, i64, i64)> {
    let db = env.database().await?;
    let count = |table: &'static str| {
        let db = db.clone();
        async move {
            let sql = format!("SELECT COUNT(*) AS n FROM {table}");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(&db).await?;
            anyhow::Ok(row.try_get::<i64, _>("n")?)
        }
    };
    Ok((
        count("nodes").await?,
        count("upload_generations").await?,
        count("space_usage").await?,
    ))
}

async fn every_auth_failure_has_its_code(b: Backend) -> anyhow::Result<()> {
    let mut env = TestEnv::new(b).await?;
    // No leeway, so that a token's expiry can be waited for.
    env.set("UNICAS_AUTH_LEEWAY_S", 0);
    let hub = env.create_app("hub")?;
    let other = env.create_app("other")?;
    let server = env.start()?;
    let (h, _) = leaf(b"x");
    let lease_url = format!("{}/v1/cas/nodes/{h}/lease", server.url);
    let send = |token: Option<String>, app: &'static str, space: &'static str| {
        let mut req = reqwest::Client::new()
            .post(&lease_url)
            .query(&[("appId", app), ("spaceId", space)])
            .json(&json!({"leaseDurationMs": 60000}));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let key = ed_key(&hub.key.private_pem);
    let lease = &["cas:nodes:lease"];
    let stranger = TestKey::generate(env.dir.path(), "EdDSA")?;
    let header_none = URL_SAFE_NO_PAD.encode(json!({"alg": "none", "kid": hub.kid}).to_string());
    let body = URL_SAFE_NO_PAD.encode(claims(&hub, "s", lease).to_string());
    let mut expired = claims(&hub, "s", lease);
    expired["exp"] = json!(now() - 3600);
    expired["iat"] = json!(now() - 7200);
    let mut future = claims(&hub, "s", lease);
    future["nbf"] = json!(now() + 3600);
    let mut wrong_aud = claims(&hub, "s", lease);
    wrong_aud["aud"] = json!("somebody-else");
    let mut unknown_iss = claims(&hub, "s", lease);
    unknown_iss["iss"] = json!("https://nobody.test");
    let mut no_exp = claims(&hub, "s", lease);
    no_exp.as_object_mut().unwrap().remove("exp");

    let cases: Vec<(&str, Option<String>, &'static str, u16, &str)> = vec![
        ("no token", None, "hub", 401, "missing_token"),
        (
            "not a JWT",
            Some("abc.def".into()),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "bad signature",
            Some(sign(
                Algorithm::EdDSA,
                &hub.kid,
                &ed_key(&stranger.private_pem),
                &claims(&hub, "s", lease),
            )),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "unknown kid",
            Some(sign(
                Algorithm::EdDSA,
                "nope",
                &key,
                &claims(&hub, "s", lease),
            )),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "alg none",
            Some(format!("{header_none}.{body}.")),
            "hub",
            403,
            "unsupported_algorithm",
        ),
        (
            "HS256 with the public key as secret",
            Some(sign(
                Algorithm::HS256,
                &hub.kid,
                &EncodingKey::from_secret(hub.key.public_pem.as_bytes()).unwrap(),
                &claims(&hub, "s", lease),
            )),
            "hub",
            403,
            "unsupported_algorithm",
        ),
        (
            "expired",
            Some(sign(Algorithm::EdDSA, &hub.kid, &key, &expired)),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "not yet valid",
            Some(sign(Algorithm::EdDSA, &hub.kid, &key, &future)),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "no exp",
            Some(sign(Algorithm::EdDSA, &hub.kid, &key, &no_exp)),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "wrong audience",
            Some(sign(Algorithm::EdDSA, &hub.kid, &key, &wrong_aud)),
            "hub",
            401,
            "invalid_token",
        ),
        (
            "unknown issuer",
            Some(sign(Algorithm::EdDSA, &hub.kid, &key, &unknown_iss)),
            "hub",
            401,
            "unknown_issuer",
        ),
        (
            "App mismatch",
            Some(other.token(&space("s"), lease)),
            "hub",
            403,
            "resource_scope_mismatch",
        ),
        (
            "Space not granted",
            Some(hub.token(&space("elsewhere"), lease)),
            "hub",
            403,
            "resource_scope_mismatch",
        ),
        (
            "permission missing",
            Some(hub.token(&space("s"), &["cas:nodes:read"])),
            "hub",
            403,
            "insufficient_permission",
        ),
        (
            "bad appId",
            Some(hub.token(&space("s"), lease)),
            "hub/x",
            400,
            "INVALID_REQUEST",
        ),
    ];
    for (what, token, app, status, code) in cases {
        let r = send(token, app, "s").await?;
        assert_eq!(r.status().as_u16(), status, "{what}");
        let body: Value = r.json().await?;
        assert_eq!(body["error"], code, "{what}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}"
        );
    }
    assert_eq!(
        storage_touched(&env).await?,
        (0, 0, 0),
        "no refused request touched storage"
    );

    // One token used before and after each change: a capability the server verified once is
    // remembered, and must stop working all the same.
    let kept = hub.token(&space("s"), lease);
    assert_eq!(send(Some(kept.clone()), "hub", "s").await?.status(), 200);
    let touched = storage_touched(&env).await?;
    // Suspension, through the operator command; the registry cache picks it up.
    env.cli(&["app", "suspend", "hub"])?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = send(Some(kept.clone()), "hub", "s").await?;
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await?["error"], "APP_SUSPENDED");
    let read = reqwest::Client::new()
        .get(format!("{}/v1/cas/usage", server.url))
        .query(&[("appId", "hub"), ("spaceId", "s")])
        .bearer_auth(hub.token(&space("s"), &["cas:usage:read"]))
        .send()
        .await?;
    assert_eq!(read.status(), 403, "every data-plane call is denied");
    assert_eq!(storage_touched(&env).await?, touched);
    env.cli(&["app", "resume", "hub"])?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = send(Some(kept.clone()), "hub", "s").await?;
    assert_eq!(r.status(), 200);

    // A remembered token expires on time: `exp` one second ahead (no leeway here).
    let mut brief = claims(&hub, "s", lease);
    brief["exp"] = json!(now() + 1);
    let brief = sign(Algorithm::EdDSA, &hub.kid, &key, &brief);
    assert_eq!(send(Some(brief.clone()), "hub", "s").await?.status(), 200);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = send(Some(brief), "hub", "s").await?;
    assert_eq!(
        r.status(),
        401,
        "an expired token the server verified before"
    );
    assert_eq!(r.json::<Value>().await?["error"], "invalid_token");

    // A revoked key stops working, for a token verified with it before too.
    env.cli(&["app", "revoke-key", "hub", "--kid", &hub.kid])?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let r = send(Some(kept), "hub", "s").await?;
    assert_eq!(r.json::<Value>().await?["error"], "invalid_token");
    Ok(())
}

async fn es256_and_rs256_keys_work(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let es = env.create_app_with("es-app", "ES256")?;
    let rs = env.create_app_with("rs-app", "RS256")?;
    let server = env.start()?;
    for app in [&es, &rs] {
        let client = app.client(&server);
        assert_eq!(
            app.signing_key().algorithm(),
            if app.key.alg == "ES256" {
                Algorithm::ES256
            } else {
                Algorithm::RS256
            }
        );
        let (h, bytes) = leaf(app.key.alg.as_bytes());
        let r = client.ensure_node(&space("s"), &h, &bytes, 60_000).await?;
        assert!(matches!(r.state, Ensured::Ready { .. }), "{}", app.key.alg);
    }
    // A key registered as ES256 does not verify an RS256 token claiming its kid.
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some(es.kid.clone());
    let token = jsonwebtoken::encode(
        &h,
        &claims(&es, "s", &["cas:usage:read"]),
        &EncodingKey::from_rsa_pem(rs.key.private_pem.as_bytes())?,
    )?;
    let r = reqwest::Client::new()
        .get(format!("{}/v1/cas/usage", server.url))
        .query(&[("appId", "es-app"), ("spaceId", "s")])
        .bearer_auth(token)
        .send()
        .await?;
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().await?["error"], "invalid_token");
    // Registering a key that does not parse is refused.
    let bad = env.dir.path().join("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
    )?;
    assert!(
        env.cli(&[
            "app",
            "add-key",
            "es-app",
            "--kid",
            "k2",
            "--alg",
            "ES256",
            "--public-key",
            bad.to_str().unwrap()
        ])
        .is_err()
    );
    assert!(
        env.cli(&[
            "app",
            "add-key",
            "es-app",
            "--kid",
            "k3",
            "--alg",
            "HS256",
            "--public-key",
            es.key.public_path.to_str().unwrap()
        ])
        .is_err()
    );
    Ok(())
}

e2e!(every_auth_failure_has_its_code, es256_and_rs256_keys_work);
