//! The hub under test: `e2e-unicas-hub` processes (embedding the CAS, or against a separate
//! `unicas-server`), each with its own hub database (a SQLite file in the data directory, or a
//! fresh Postgres database), and a small JSON client of its API.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use cas_client::{AppCasClient, SigningKey};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::{
    Backend, Db, Process, Server, TestEnv, binary, drop_database, pg_admin, pg_admin_url, random_id,
};

/// Runs an async scenario on SQLite and on Postgres (filesystem store), one test each:
/// `hub_e2e!(name)` expects `async fn name(b: Backend) -> anyhow::Result<()>` in scope.
#[macro_export]
macro_rules! hub_e2e {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            fn run(b: $crate::Backend) {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(super::$name(b))
                    .unwrap();
            }
            #[test]
            fn sqlite_fs() {
                run($crate::Backend::SQLITE_FS)
            }
            #[test]
            fn postgres_fs() {
                run($crate::Backend::POSTGRES_FS)
            }
        }
    )*};
}

/// Runs async scenarios on one backend, one test each: `hub_e2e_on!(sqlite_fs => SQLITE_FS:
/// name, …)` expects `async fn name(b: Backend) -> anyhow::Result<()>` in scope.
#[macro_export]
macro_rules! hub_e2e_on {
    ($test:ident => $backend:ident: $($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn $test() {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(4)
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(super::$name($crate::Backend::$backend))
                    .unwrap();
            }
        }
    )*};
}

/// A hub with the user alice, her client and her project "P": `(env, server, client, pid,
/// token)`, bound in that order so the server stops before its data directory goes.
pub async fn alice_with_project(
    b: Backend,
) -> anyhow::Result<(HubEnv, HubServer, HubClient, String, String)> {
    let env = HubEnv::new(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    Ok((env, server, a, pid, token))
}

/// The `data` of a success envelope with `status`.
#[track_caller]
pub fn data(got: &(StatusCode, Value), status: u16) -> Value {
    assert_eq!(got.0.as_u16(), status, "unexpected answer: {}", got.1);
    assert_eq!(
        got.1["success"],
        json!(true),
        "not a success envelope: {}",
        got.1
    );
    got.1["data"].clone()
}

/// The `error` of an error envelope with `status` and `code`.
#[track_caller]
pub fn refused(got: &(StatusCode, Value), status: u16, code: &str) -> Value {
    assert_eq!(got.0.as_u16(), status, "unexpected answer: {}", got.1);
    assert_eq!(
        got.1["success"],
        json!(false),
        "not an error envelope: {}",
        got.1
    );
    assert_eq!(
        got.1["error"]["code"],
        json!(code),
        "wrong error code: {}",
        got.1
    );
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "an error without a message: {}",
        got.1
    );
    got.1["error"].clone()
}

/// A POSIX ustar header for one entry.
pub fn tar_header(name: &str, kind: u8, size: usize, link: &str) -> [u8; 512] {
    assert!(name.len() <= 100 && link.len() <= 100);
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let mode: &[u8] = if kind == b'5' {
        b"0000755\0"
    } else {
        b"0000644\0"
    };
    h[100..108].copy_from_slice(mode);
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(format!("{:011o}\0", 1_700_000_000u64).as_bytes());
    h[148..156].copy_from_slice(b"        ");
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// A hand-built tar archive of regular files (names taken verbatim, so they can be hostile).
pub fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content) in entries {
        out.extend_from_slice(&tar_header(name, b'0', content.len(), ""));
        out.extend_from_slice(content);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// A hand-built tar archive of regular files and symlinks (`Some(target)`).
pub fn tar_with_links(entries: &[(&str, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content, link) in entries {
        match link {
            Some(target) => out.extend_from_slice(&tar_header(name, b'2', 0, target)),
            None => {
                out.extend_from_slice(&tar_header(name, b'0', content.len(), ""));
                out.extend_from_slice(content);
                out.resize(out.len().div_ceil(512) * 512, 0);
            }
        }
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// A client of the hub's embedded CAS signing as the hub (its key, kid, issuer and App).
pub fn hub_cas(env: &HubEnv, server: &HubServer) -> anyhow::Result<AppCasClient> {
    let pem = std::fs::read_to_string(
        Path::new(&env.env.vars["UNICAS_DATA_DIR"]).join("hub-signing-key.pem"),
    )?;
    let key = SigningKey::from_pem(&pem, "hub-1", "urn:unicas:hub", "unicas")?;
    let url = server.cas_url.clone().context("the hub embeds no CAS")?;
    let app = "hub".parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(AppCasClient::new(url, app, Arc::new(key))?)
}

/// A test environment for the hub: the CAS's [`TestEnv`] plus the hub's variables.
pub struct HubEnv {
    pub env: TestEnv,
    hub_db: Option<String>,
}

impl HubEnv {
    /// An environment on `backend`; the hub's database follows the CAS's (SQLite or Postgres).
    pub async fn new(backend: Backend) -> anyhow::Result<Self> {
        let mut env = TestEnv::new(backend).await?;
        env.set("UNICAS_HUB_LISTEN", "127.0.0.1:0");
        env.set("UNICAS_HUB_AUTH", "token");
        env.set("UNICAS_HUB_WORKSPACE_WAIT_MS", "5000");
        env.set("UNICAS_HUB_RECOVERY_INTERVAL_MS", "0");
        env.set("UNICAS_LOG", "warn");
        let mut hub_db = None;
        if backend.db == Db::Postgres {
            let name = random_id("unicas_hub_e2e_");
            pg_admin(format!("CREATE DATABASE {name}")).await?;
            let admin = pg_admin_url();
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            env.set("UNICAS_HUB_DATABASE_URL", format!("{base}/{name}"));
            hub_db = Some(name);
        }
        Ok(HubEnv { env, hub_db })
    }

    pub fn set(&mut self, key: &str, value: impl ToString) -> &mut Self {
        self.env.set(key, value);
        self
    }

    /// An `unicas-hub` command with this environment.
    pub fn hub_command(&self) -> Command {
        let mut c = Command::new(binary("e2e-unicas-hub"));
        c.envs(&self.env.vars);
        c
    }

    /// Runs `unicas-hub ARGS` to completion; fails unless it succeeds. Returns stdout.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.hub_command().args(args).output()?;
        if !out.status.success() {
            bail!(
                "unicas-hub {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Creates a user and a token for them; returns the token.
    pub fn user(&self, id: &str) -> anyhow::Result<String> {
        self.cli(&["user", "create", id])?;
        Ok(self
            .cli(&["token", "create", "--user", id])?
            .trim()
            .to_string())
    }

    /// Starts a CAS service of its own for the hubs of this environment (so several hub
    /// processes share it), registers the hub's App and key there, and points
    /// `UNICAS_HUB_CAS_URL` at it.
    pub fn separate_cas(&mut self) -> anyhow::Result<Server> {
        let cas = self.env.start()?;
        let public = self.cli(&["public-key"])?;
        let pub_path = self.env.dir.path().join("hub.pub.pem");
        std::fs::write(&pub_path, public)?;
        self.env
            .cli(&["app", "create", "hub", "--issuer", "urn:unicas:hub"])?;
        self.env.cli(&[
            "app",
            "add-key",
            "hub",
            "--kid",
            "hub-1",
            "--alg",
            "EdDSA",
            "--public-key",
            pub_path.to_str().context("path")?,
        ])?;
        self.set("UNICAS_HUB_CAS_URL", &cas.url);
        Ok(cas)
    }

    /// Starts `unicas-hub serve` (embedding the CAS unless `UNICAS_HUB_CAS_URL` is set).
    pub fn start(&self) -> anyhow::Result<HubServer> {
        self.start_with(&[])
    }

    pub fn start_with(&self, extra: &[(&str, &str)]) -> anyhow::Result<HubServer> {
        HubServer::start(self, extra)
    }
}

impl Drop for HubEnv {
    fn drop(&mut self) {
        if let Some(name) = self.hub_db.take() {
            drop_database(name);
        }
        kill_processes_under(self.env.dir.path());
    }
}

/// Kills what still runs in `dir` (sandboxes a test left behind by killing its hub), so a
/// test run leaves no process.
fn kill_processes_under(dir: &Path) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if std::fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir)) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    }
}

/// A running `unicas-hub serve`. Killed when dropped.
pub struct HubServer {
    /// The process; its `url` is the hub's base URL.
    process: Process,
    /// The embedded CAS's URL, if it embeds one.
    pub cas_url: Option<String>,
}

impl std::ops::Deref for HubServer {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.process
    }
}

impl HubServer {
    fn start(env: &HubEnv, extra: &[(&str, &str)]) -> anyhow::Result<HubServer> {
        let process = Process::spawn(
            env.hub_command(),
            env.env.dir.path(),
            "unicas-hub",
            "hub listening on ",
            Duration::from_secs(90),
            extra,
        )?;
        // The lines after it are printed right away.
        std::thread::sleep(Duration::from_millis(50));
        let cas_url = process
            .stdout_lines()
            .iter()
            .find_map(|l| l.strip_prefix("cas listening on ").map(str::to_string));
        Ok(HubServer { process, cas_url })
    }

    /// The token printed on first start (token mode, no users yet), waiting up to 10 s for the
    /// line (it may come after the hub answers).
    pub fn admin_token(&self) -> Option<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let found = self
                .stdout_lines()
                .iter()
                .find_map(|l| l.strip_prefix("admin token: ").map(str::to_string));
            if found.is_some() || std::time::Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, now.
    pub fn kill(self) {
        self.process.kill()
    }

    /// SIGTERM, then wait 15 s for a graceful exit; returns whether it exited successfully.
    pub fn terminate(self) -> anyhow::Result<bool> {
        self.process.terminate_within(Duration::from_secs(15))
    }

    /// A client of this hub with `token` (or none, for the single-user mode).
    pub fn client(&self, token: Option<&str>) -> HubClient {
        HubClient::new(&self.url, token)
    }
}

/// A JSON client of the hub API. Every call answers the status and the parsed body (`Null` when
/// the body is not JSON).
#[derive(Clone)]
pub struct HubClient {
    http: reqwest::Client,
    pub base: String,
    token: Option<String>,
}

impl HubClient {
    pub fn new(base: &str, token: Option<&str>) -> Self {
        HubClient {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("http client"),
            base: base.trim_end_matches('/').to_string(),
            token: token.map(str::to_string),
        }
    }

    /// A request with this client's token, for headers the helpers do not set.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.req(method, path)
    }

    /// Sends a request built with [`Self::request`]; answers the status and the parsed body.
    pub async fn send(r: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
        Self::answer(r).await
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn answer(r: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
        let resp = r.send().await?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(StatusCode, Value)> {
        Self::answer(self.req(reqwest::Method::GET, path)).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<(StatusCode, Value)> {
        Self::answer(self.req(reqwest::Method::DELETE, path)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<(StatusCode, Value)> {
        Self::answer(self.req(reqwest::Method::POST, path).json(body)).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> anyhow::Result<(StatusCode, Value)> {
        Self::answer(self.req(reqwest::Method::PATCH, path).json(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<(StatusCode, Value)> {
        Self::answer(self.req(reqwest::Method::PUT, path).json(body)).await
    }

    /// POSTs raw bytes with a content type and extra headers.
    pub async fn post_bytes(
        &self,
        path: &str,
        content_type: &str,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut r = self
            .req(reqwest::Method::POST, path)
            .header("content-type", content_type)
            .body(body);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        Self::answer(r).await
    }

    /// GETs raw bytes.
    pub async fn get_bytes(&self, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
        let resp = self.req(reqwest::Method::GET, path).send().await?;
        Ok((resp.status(), resp.bytes().await?))
    }

    /// Creates a project; returns its id.
    pub async fn project(&self, name: &str) -> anyhow::Result<String> {
        let (s, v) = self
            .post("/api/v1/projects", &serde_json::json!({"name": name}))
            .await?;
        if s != StatusCode::CREATED {
            bail!("creating project {name}: {s} {v}");
        }
        Ok(v["data"]["id"].as_str().context("project id")?.to_string())
    }

    /// Creates a local notebook with `files` (path → text); returns its id.
    pub async fn notebook(
        &self,
        pid: &str,
        title: &str,
        files: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        let files: serde_json::Map<String, Value> = files
            .iter()
            .map(|(p, c)| (p.to_string(), serde_json::json!({"content": c})))
            .collect();
        let (s, v) = self
            .post(
                &format!("/api/v1/projects/{pid}/notebooks"),
                &serde_json::json!({"title": title, "files": files}),
            )
            .await?;
        if s != StatusCode::CREATED {
            bail!("creating notebook {title}: {s} {v}");
        }
        Ok(v["data"]["notebook"]["id"]
            .as_str()
            .context("notebook id")?
            .to_string())
    }

    /// Saves text files on top of `expected`; answers the status and body.
    pub async fn save(
        &self,
        pid: &str,
        nid: &str,
        expected: Option<i64>,
        files: &[(&str, &str)],
        deleted: &[&str],
    ) -> anyhow::Result<(StatusCode, Value)> {
        let files: serde_json::Map<String, Value> = files
            .iter()
            .map(|(p, c)| (p.to_string(), serde_json::json!({"content": c})))
            .collect();
        self.post(
            &format!("/api/v1/projects/{pid}/notebooks/{nid}/workspace"),
            &serde_json::json!({"expected_revision": expected, "files": files, "deleted": deleted}),
        )
        .await
    }
}
