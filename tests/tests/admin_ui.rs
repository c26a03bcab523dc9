//! The admin UI in a real headless browser (Debian's Chromium driven by Playwright): sign in with
//! the bootstrap link, open an App, find a hash's balance, reconcile a planted discrepancy, apply
//! the repair and see the balance match, suspend and resume the App. The script is
//! `tests/browser/admin-ui.mjs`; screenshots of the main pages go to `docs/screenshots/`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_ui_in_a_browser() -> anyhow::Result<()> {
    let browser_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    anyhow::ensure!(
        browser_dir.join("node_modules/playwright-core").is_dir()
            && Path::new("/usr/bin/chromium").exists(),
        "the browser test needs Chromium and `npm ci` in tests/browser: run scripts/test"
    );
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let app = env.create_app("demo")?;
    let server = env.start()?;
    let client = app.client(&server);
    let sp = space("space-1");
    let (a, a_bytes) = leaf(b"first document");
    let (b, b_bytes) = leaf(b"second document");
    client.ensure_node(&sp, &a, &a_bytes, 600_000).await?;
    client.ensure_node(&sp, &b, &b_bytes, 600_000).await?;
    client
        .update_root_refs(&sp, &"doc:1:add".parse()?, BTreeMap::from([(a, 2), (b, 1)]))
        .await?;
    // Another Space, so the App's pages have more than one.
    let (c, c_bytes) = leaf(b"elsewhere");
    client
        .ensure_node(&space("space-2"), &c, &c_bytes, 600_000)
        .await?;
    client
        .update_root_refs(
            &space("space-2"),
            &"doc:2:add".parse()?,
            BTreeMap::from([(c, 1)]),
        )
        .await?;

    let printed = env.cli(&["admin", "login-link"])?;
    let line = printed.lines().last().unwrap_or_default();
    let link = format!(
        "{}{}",
        server.url,
        &line[line.find("/admin/login/link/").unwrap_or(0)..]
    );
    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
    std::fs::create_dir_all(&screenshots)?;
    let out = Command::new("node")
        .arg("admin-ui.mjs")
        .current_dir(&browser_dir)
        .env("ADMIN_LOGIN_LINK", &link)
        .env("ADMIN_BASE", &server.url)
        .env("APP_ID", "demo")
        .env("SPACE_ID", sp.as_str())
        .env("HASH_A", a.to_string())
        .env("HASH_B", b.to_string())
        .env("SCREENSHOT_DIR", &screenshots)
        .env("CHROMIUM", "/usr/bin/chromium")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{}\n--- server log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    // The repair went through the normal signed-delta path and the projection agrees.
    assert_eq!(client.read_metadata(&sp, &b).await?.state.root_ref_count, 3);
    env.check_invariants(&env.meta().await?, &app.app).await?;
    Ok(())
}
