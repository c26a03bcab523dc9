//! The README's curl walkthrough, run as written against a real server.

use std::path::Path;
use std::process::Command;

use tests::*;

fn quickstart_block(readme: &str) -> String {
    block(readme, "<!-- quickstart")
}

fn block(readme: &str, marker: &str) -> String {
    let start = readme.find(marker).expect("quickstart marker");
    let rest = &readme[start..];
    let body = rest.split_once("```sh\n").expect("sh block").1;
    body.split_once("```").expect("end of block").0.to_string()
}

#[tokio::test]
async fn readme_curl_walkthrough_works_as_written() -> anyhow::Result<()> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))?;
    let script = quickstart_block(&readme);
    let env = TestEnv::new(Backend::SQLITE_FS).await?;
    let server = env.start()?;
    // The binaries under their installed names.
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(binary("e2e-unicas-server"), bin.join("unicas-server"))?;
    std::os::unix::fs::symlink(binary("e2e-unicas"), bin.join("unicas"))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(env.dir.path())
        .envs(&env.vars)
        .env("PATH", path)
        .env("UNICAS_SERVER", &server.url)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the walkthrough failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "\"state\":\"ready\"",
        "hello, unicas",
        "\"success\":true",
        "{\"results\":[{\"state\":\"ready\"",
        "\"nodeCount\":2",
    ] {
        assert!(stdout.contains(needle), "{needle} missing from:\n{stdout}");
    }
    Ok(())
}

#[tokio::test]
async fn readme_hub_walkthrough_works_as_written() -> anyhow::Result<()> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))?;
    // The sessions block continues the walkthrough (same shell, same notebook).
    let script = format!(
        "{}\n{}",
        block(&readme, "<!-- hub-quickstart"),
        block(&readme, "<!-- hub-sessions")
    );
    let mut env = tests::sessions::session_env(Backend::SQLITE_FS).await?;
    env.set("UNICAS_HUB_AUTH", "none");
    let hub = env.start()?;
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(env.env.dir.path())
        .env("UNICAS_HUB", &hub.url)
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the hub walkthrough failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "\"revision\":2",
        "\"code\":\"workspace_conflict\"",
        "\"actual_revision\":2",
        "print(1)",
        "\"readyStoredBytes\"",
        "\"logicalBytes\":18",
        "200\nterminated",
        // The retried create was a replay: one project named Reports.
        "idempotency-replayed: true",
        "projects named Reports: 1",
    ] {
        assert!(stdout.contains(needle), "{needle} missing from:\n{stdout}");
    }
    Ok(())
}
