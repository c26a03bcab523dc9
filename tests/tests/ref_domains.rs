//! Root refs per domain, as the public contract keeps them: a version 2 capability's changes
//! and pages belong to its `refDomain`, a capability of this service's own shape uses the
//! domain `default`; request ids are scoped to their domain; a node counts the sum over
//! domains, which must stay at or above zero while one domain's balance may go below it; pages
//! stay stable at their revision; fsck and the invariants hold per domain.

use std::collections::BTreeMap;

use cas_format::{Hash, RequestId};
use serde_json::{Value, json};
use tests::admin_session::{link, sign_in_with_link};
use tests::*;

/// The items of a balance page as hash → count.
fn items(page: &Value) -> BTreeMap<String, i64> {
    page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["hash"].as_str().unwrap_or_default().to_string(),
                i["refCount"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

async fn root_refs_are_kept_per_domain(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app_with("up", "ES256")?;
    let server = env.start()?;
    let meta = env.meta().await?;
    let own = app.client(&server);
    let sp = space("/team/notes");
    let (h, bytes) = leaf(b"a root of two domains");
    // The shortest leases the test servers grant: only root refs hold the nodes after it.
    own.ensure_node(&sp, &h, &bytes, 1000).await?;
    let (g, bytes) = leaf(b"a root of one domain");
    own.ensure_node(&sp, &g, &bytes, 1000).await?;
    let (hx, gx) = (h.to_hex(), g.to_hex());

    let web = reqwest::Client::new();
    let docs = app.v2_token("/team/**", ALL_PERMISSIONS, Some("docs"));
    let billing = app.v2_token("/team/**", ALL_PERMISSIONS, Some("billing:v2"));
    let url = format!("{}/v1/cas/root-refs", server.url);
    let query = [("appId", "up"), ("spaceId", "/team/notes")];
    let update = |token: &str, request_id: &str, changes: Value| {
        web.post(&url)
            .query(&query)
            .bearer_auth(token)
            .json(&json!({"requestId": request_id, "changes": changes}))
            .send()
    };
    let list = |token: &str, extra: Vec<(&'static str, String)>| {
        web.get(&url)
            .query(&query)
            .query(&extra)
            .bearer_auth(token)
            .send()
    };
    let ok = |r: reqwest::Response| async move {
        let status = r.status();
        let body: Value = r.json().await?;
        anyhow::ensure!(status == 200, "{status}: {body}");
        anyhow::Ok(body)
    };

    // The same request id in two domains is two requests; in one domain it replays.
    let first = ok(update(&docs, "r1", json!({ &hx: 2 })).await?).await?;
    assert_eq!(first["idempotent"], false);
    let other = ok(update(&billing, "r1", json!({ &hx: 1, &gx: 1 })).await?).await?;
    assert_eq!(other["idempotent"], false, "another domain's r1");
    assert_eq!(
        other["revision"].as_u64(),
        first["revision"].as_u64().map(|r| r + 1)
    );
    let replay = ok(update(&docs, "r1", json!({ &hx: 2 })).await?).await?;
    assert_eq!(replay["idempotent"], true);
    assert_eq!(replay["revision"], first["revision"]);
    let r = update(&docs, "r1", json!({ &hx: 3 })).await?;
    assert_eq!(r.status(), 409);
    assert_eq!(r.json::<Value>().await?["error"], "IDEMPOTENCY_CONFLICT");
    let rid = |s: &str| s.parse::<RequestId>().unwrap();
    let default = own
        .update_root_refs(&sp, &rid("r1"), BTreeMap::from([(h, 1)]))
        .await?;
    assert!(!default.idempotent, "the default domain's r1");

    // Each domain lists its own balances; the node counts their sum.
    let page = ok(list(&docs, vec![]).await?).await?;
    assert_eq!(page["refDomain"], "docs");
    assert_eq!(items(&page), BTreeMap::from([(hx.clone(), 2)]));
    let page = ok(list(&billing, vec![]).await?).await?;
    assert_eq!(page["refDomain"], "billing:v2");
    assert_eq!(
        items(&page),
        BTreeMap::from([(hx.clone(), 1), (gx.clone(), 1)])
    );
    let page = own.list_root_refs(&sp, 100, None).await?;
    assert_eq!(page.ref_domain.as_str(), "default");
    assert_eq!(page.items.len(), 1);
    assert_eq!((page.items[0].hash, page.items[0].ref_count), (h, 1));
    let count = |hash: Hash| {
        let (web, server, docs) = (web.clone(), server.url.clone(), docs.clone());
        async move {
            let m: Value = web
                .get(format!("{server}/v1/cas/nodes/{hash}/metadata"))
                .query(&query)
                .bearer_auth(docs)
                .send()
                .await?
                .json()
                .await?;
            anyhow::ensure!(m["state"]["rootRefCount"].is_i64(), "{hash}: {m}");
            anyhow::Ok(m["state"]["rootRefCount"].as_i64())
        }
    };
    assert_eq!(count(h).await?, Some(4));
    assert_eq!(count(g).await?, Some(1));

    // One domain may release what another took (its balance goes below zero); the sum may not
    // go below zero, and a refused update changes nothing.
    ok(update(&billing, "r2", json!({ &hx: -3 })).await?).await?;
    let page = ok(list(&billing, vec![]).await?).await?;
    assert_eq!(
        items(&page),
        BTreeMap::from([(hx.clone(), -2), (gx.clone(), 1)])
    );
    assert_eq!(count(h).await?, Some(1));
    let r = update(&docs, "r3", json!({ &hx: -2 })).await?;
    assert_eq!(r.status(), 409);
    assert_eq!(r.json::<Value>().await?["error"], "NEGATIVE_AGGREGATE");
    let page = ok(list(&docs, vec![]).await?).await?;
    assert_eq!(items(&page), BTreeMap::from([(hx.clone(), 2)]));
    assert_eq!(count(h).await?, Some(1));

    // Pages of a domain stay at the revision of their first page.
    let at = ok(list(&billing, vec![("limit", "1".into())]).await?).await?;
    let cursor = at["nextCursor"].as_str().unwrap_or_default().to_string();
    assert!(!cursor.is_empty(), "{at}");
    ok(update(&billing, "r4", json!({ &gx: -1, &hx: 2 })).await?).await?;
    let rest = ok(list(&billing, vec![("limit", "1".into()), ("cursor", cursor)]).await?).await?;
    assert_eq!(rest["revision"], at["revision"]);
    let mut seen = items(&at);
    seen.extend(items(&rest));
    assert_eq!(seen, BTreeMap::from([(hx.clone(), -2), (gx.clone(), 1)]));
    let now = ok(list(&billing, vec![]).await?).await?;
    assert_eq!(
        items(&now),
        BTreeMap::from([]),
        "zero balances are not listed"
    );
    assert_eq!(count(g).await?, Some(0));

    // A GC pass collects what no domain holds any more, and only that.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let r = web
        .post(format!("{}/v1/cas/gc", server.url))
        .query(&query)
        .bearer_auth(&docs)
        .json(&json!({"maxNodes": 100}))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await?["deleted"], 1);
    assert_eq!(count(h).await?, Some(3));
    let r = web
        .get(format!("{}/v1/cas/nodes/{g}/metadata", server.url))
        .query(&query)
        .bearer_auth(&docs)
        .send()
        .await?;
    assert_eq!(r.status(), 404, "g was collected");

    env.check_invariants(&meta, &"up".parse()?).await?;
    drop(server);
    env.assert_consistent("up")?;
    Ok(())
}

/// The admin plane: balances, events and comparisons show and filter by domain; a repair
/// applies in the domain it names and is what that domain's capabilities then read.
async fn the_admin_plane_shows_domains(b: Backend) -> anyhow::Result<()> {
    let env = TestEnv::new(b).await?;
    let app = env.create_app_with("hub", "ES256")?;
    let server = env.start()?;
    let meta = env.meta().await?;
    let admin =
        sign_in_with_link(&server, &link(&server, &env.cli(&["admin", "login-link"])?)).await?;
    let client = app.client(&server);
    let s1 = space("s1");
    let (h, bytes) = leaf(b"held by two domains");
    client.ensure_node(&s1, &h, &bytes, 60_000).await?;
    let rid = |s: &str| s.parse::<RequestId>().unwrap();
    client
        .update_root_refs(&s1, &rid("biz:1"), BTreeMap::from([(h, 3)]))
        .await?;

    // Domains: a repair in another domain is kept apart from the default one's balances, and
    // balances, events and comparisons filter by domain.
    let docs = json!({"watermark": "docs:1", "refDomain": "docs", "repairs": [
        {"spaceId": "s1", "hash": h, "delta": 2},
    ]});
    let applied: Value = admin
        .post("/admin/apps/hub/reconcile/apply", docs)
        .await
        .json()
        .await?;
    assert_eq!(applied["refDomain"], "docs", "{applied:#}");
    assert_eq!(applied["balances"][0]["refCount"], 2);
    let page = admin.json("/admin/apps/hub/root-refs?refDomain=docs").await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page:#}");
    assert_eq!(page["items"][0]["refDomain"], "docs");
    assert_eq!(page["items"][0]["hash"], json!(h));
    let page = admin
        .json(&format!("/admin/apps/hub/root-refs?spaceId=s1&hash={}", h))
        .await;
    let by_domain: BTreeMap<String, i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["refDomain"].as_str().unwrap().to_string(),
                b["refCount"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by_domain,
        BTreeMap::from([("default".into(), 3), ("docs".into(), 2)])
    );
    let page = client.list_root_refs(&s1, 100, None).await?;
    assert_eq!(page.ref_domain.as_str(), "default");
    assert!(page.items.iter().any(|i| i.hash == h && i.ref_count == 3));
    let events = admin
        .json("/admin/apps/hub/root-ref-events?refDomain=docs")
        .await;
    assert_eq!(
        events["items"].as_array().map(Vec::len),
        Some(1),
        "{events:#}"
    );
    assert_eq!(events["items"][0]["refDomain"], "docs");
    let compared: Value = admin
        .post(
            "/admin/apps/hub/reconcile",
            json!({"watermark": "docs:2", "refDomain": "docs", "balances": [
                {"spaceId": "s1", "hash": h, "count": 2},
            ]}),
        )
        .await
        .json()
        .await?;
    assert_eq!(compared["refDomain"], "docs");
    assert_eq!(compared["differences"], json!([]), "{compared:#}");
    assert_eq!(
        admin
            .get("/admin/apps/hub/root-refs?refDomain=Docs")
            .await
            .status(),
        400,
        "a domain is lowercase"
    );
    // A capability of this service's own shape may name a domain too.
    let mut claims = app.v2_claims("/unused", &[]);
    claims["grants"] = json!([{"spaceId": "s1", "permissions": ["cas:root-refs:read"]}]);
    claims.as_object_mut().map(|c| c.remove("ver"));
    let own_shape_in_docs = app.sign(None, &claims);
    let docs: Value = reqwest::Client::new()
        .get(format!("{}/v1/cas/root-refs", server.url))
        .query(&[("appId", "hub"), ("spaceId", "s1")])
        .bearer_auth(&own_shape_in_docs)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(items(&docs), BTreeMap::from([(h.to_hex(), 2)]), "{docs}");
    env.check_invariants(&meta, &app.app).await?;
    drop(server);
    env.assert_consistent("hub")?;
    Ok(())
}

e2e!(root_refs_are_kept_per_domain, the_admin_plane_shows_domains);
