//! The hub's web UI in a real headless browser (Debian's Chromium driven by Playwright), on a
//! hub that runs real marimo: sign in with a login link; create a project and a notebook; see
//! two saves made through the API in the history; the diff's changed line; a restore making a
//! new head; the trash; the storage page's dedup ratio against `GET …/storage`; an edit
//! session's editor; a viewer without edit controls and a non-member's not-found page; the
//! pages at 360 px. Sessions are served on an origin of their own, as a deployment with several
//! users runs them; the editor's frame is checked to be there. The script is `tests/browser/hub-ui.mjs`; screenshots of each page go to
//! `docs/screenshots/hub-*.png`.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use tests::hub::HubEnv;
use tests::sessions::*;
use tests::*;

/// A login link for `user`, absolute on `base`.
fn link(env: &HubEnv, base: &str, user: &str) -> anyhow::Result<String> {
    let printed = env.cli(&["user", "login-link", user])?;
    let line = printed.trim();
    Ok(format!(
        "{base}{}",
        &line[line.find("/auth/link/").context("a login link")?..]
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_ui_in_a_browser() -> anyhow::Result<()> {
    let browser_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    anyhow::ensure!(
        browser_dir.join("node_modules/playwright-core").is_dir()
            && Path::new("/usr/bin/chromium").exists(),
        "the browser test needs Chromium and `npm ci` in tests/browser: run scripts/test"
    );
    let env = session_env(Backend::SQLITE_FS).await?;
    let owner_token = env.user("ada")?;
    env.cli(&["user", "create", "vic", "--name", "Vic Viewer"])?;
    env.cli(&["user", "create", "olga", "--name", "Olga Outsider"])?;
    // Sessions on an origin of their own, as a deployment with several users runs them.
    let server = env.start_with(&[("UNICAS_HUB_SESSION_LISTEN", "127.0.0.1:0")])?;
    let session_origin = server
        .stdout_lines()
        .iter()
        .find_map(|l| l.strip_prefix("sessions listening on ").map(str::to_string))
        .context("the sessions' listener")?;
    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
    std::fs::create_dir_all(&screenshots)?;
    let out = Command::new("node")
        .arg("hub-ui.mjs")
        .current_dir(&browser_dir)
        .env("HUB_BASE", &server.url)
        .env("OWNER_LOGIN_LINK", link(&env, &server.url, "ada")?)
        .env("VIEWER_LOGIN_LINK", link(&env, &server.url, "vic")?)
        .env("OUTSIDER_LOGIN_LINK", link(&env, &server.url, "olga")?)
        .env("OWNER_TOKEN", &owner_token)
        .env("VIEWER_ID", "vic")
        .env("SESSIONS", "1")
        .env("SESSION_ORIGIN", &session_origin)
        .env("SCREENSHOT_DIR", &screenshots)
        .env("CHROMIUM", "/usr/bin/chromium")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{}\n--- hub log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    Ok(())
}
