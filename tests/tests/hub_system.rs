//! What a client asks the hub about itself and its people: `GET /api/v1/system` answers the
//! hub's version, its limits as configured (`null` where there is none) and its features;
//! `GET /api/v1/users?ids=` resolves user ids to display identities in one read.

use serde_json::Value;
use tests::hub::HubEnv;
use tests::*;

async fn system_describes_the_deployment(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_MAX_VERSIONS", 5)
        .set("UNICAS_HUB_SESSION_MAX_PER_USER", 0)
        .set("UNICAS_HUB_UPLOAD_MAX_BYTES", 1 << 20)
        .set("UNICAS_HUB_EDITOR_MODE", "shared");
    {
        let server = env.start()?;
        let token = server.admin_token().expect("an admin token on first start");
        let (status, v) = server.client(None).get("/api/v1/system").await?;
        assert_eq!(status, 401, "{v}");
        let (status, v) = server.client(Some(&token)).get("/api/v1/system").await?;
        assert_eq!(status, 200, "{v}");
        let d = &v["data"];
        assert_eq!(d["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(
            (&d["api_version"], &d["auth"]),
            (&"v1".into(), &"token".into())
        );
        let limits = &d["limits"];
        assert_eq!(limits["max_versions"], 5);
        assert_eq!(limits["upload_max_bytes"], 1 << 20);
        assert_eq!(limits["sessions_per_user"], Value::Null, "0 is no limit");
        assert!(limits["sessions_total"].as_u64().is_some_and(|n| n > 0));
        assert!(limits["workspace_wait_seconds"].as_f64().is_some());
        let features = &d["features"];
        assert_eq!(features["editor_mode"], "shared");
        assert_eq!(features["push_sync"], true);
        assert_eq!(features["app_pools"], true);
        assert_eq!(features["idempotent_creates"], true);
        assert_eq!(limits["tokens_per_user"], 20);
        assert_eq!(
            limits["app_max_visits_per_session"],
            Value::Null,
            "unset is unlimited"
        );
        assert!(
            features["marimo_version"]
                .as_str()
                .is_some_and(|v| !v.is_empty())
        );
    }
    // The single-user mode says so, and keeping every version is no limit.
    env.set("UNICAS_HUB_AUTH", "none")
        .set("UNICAS_HUB_MAX_VERSIONS", 0);
    let server = env.start()?;
    let (status, v) = server.client(None).get("/api/v1/system").await?;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"]["auth"], "none");
    assert_eq!(v["data"]["limits"]["max_versions"], Value::Null);
    Ok(())
}

async fn user_ids_resolve_to_identities(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let server = env.start()?;
    let token = server.admin_token().expect("an admin token on first start");
    let c = server.client(Some(&token));
    let (_, me) = c.get("/api/v1/auth/me").await?;
    let admin = me["data"]["id"].as_str().unwrap_or_default().to_string();
    env.cli(&[
        "user",
        "create",
        "ada",
        "--name",
        "Ada Lovelace",
        "--email",
        "ada@example.com",
    ])?;
    env.cli(&["user", "create", "bob", "--name", "Bob"])?;
    env.cli(&["user", "suspend", "bob"])?;
    let (status, v) = c
        .get(&format!("/api/v1/users?ids=ada,nobody,{admin},bob,ada"))
        .await?;
    assert_eq!(status, 200, "{v}");
    let people = v["data"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = people.iter().filter_map(|p| p["id"].as_str()).collect();
    let mut want = vec!["ada", "bob", admin.as_str()];
    want.sort();
    assert_eq!(
        ids, want,
        "each known id once, ordered; unknown ids left out"
    );
    let ada = people.iter().find(|p| p["id"] == "ada").unwrap();
    assert_eq!(
        (&ada["name"], &ada["email"]),
        (&"Ada Lovelace".into(), &"ada@example.com".into())
    );
    assert!(ada.get("suspended_at").is_none());
    let bob = people.iter().find(|p| p["id"] == "bob").unwrap();
    assert!(
        bob["suspended_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{bob}"
    );
    // Bounded, and only for callers the hub knows.
    let many: Vec<String> = (0..101).map(|i| format!("u{i}")).collect();
    let (status, v) = c
        .get(&format!("/api/v1/users?ids={}", many.join(",")))
        .await?;
    assert_eq!(status, 422, "{v}");
    let (status, _) = server.client(None).get("/api/v1/users?ids=ada").await?;
    assert_eq!(status, 401);
    Ok(())
}

e2e!(
    system_describes_the_deployment,
    user_ids_resolve_to_identities
);
