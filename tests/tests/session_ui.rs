//! A session's marimo editor in a real headless browser (Debian's Chromium driven by
//! Playwright): the open link signs the browser in to the session, the editor loads through
//! the hub's proxy, the kernel runs the cell and its output is rendered. The script is
//! `tests/browser/session-editor.mjs`; the screenshot goes to
//! `docs/screenshots/session-editor.png`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::hub::data;
use tests::sessions::*;
use tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_editor_in_a_browser() -> anyhow::Result<()> {
    let browser_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("browser");
    anyhow::ensure!(
        browser_dir.join("node_modules/playwright-core").is_dir()
            && Path::new("/usr/bin/chromium").exists(),
        "the browser test needs Chromium and `npm ci` in tests/browser: run scripts/test"
    );
    let env = session_env(Backend::SQLITE_FS).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("Analysis").await?;
    let notebook = NOTEBOOK.replace("40 + 2", "6 * 7");
    let nid = a
        .notebook(&pid, "Answer", &[("notebook.py", notebook.as_str())])
        .await?;
    let sid = data(&create(&a, &pid, &nid, "edit").await?, 202)["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let s = wait_status(&a, &pid, &nid, &sid, "running", Duration::from_secs(90)).await?;
    let open = format!(
        "{}{}",
        server.url,
        s["open_url"].as_str().unwrap_or_default()
    );
    let screenshots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
    std::fs::create_dir_all(&screenshots)?;
    let out = Command::new("node")
        .arg("session-editor.mjs")
        .current_dir(&browser_dir)
        .env("OPEN_URL", &open)
        .env("EXPECT", "42")
        .env("SCREENSHOT", screenshots.join("session-editor.png"))
        .env("CHROMIUM", "/usr/bin/chromium")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{}\n--- hub log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    Ok(())
}
