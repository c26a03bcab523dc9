//! The hub under test: `e2e-unicas-hub` processes (embedding the CAS, or against a separate
//! `unicas-server`), each with its own hub database (a SQLite file in the data directory, or a
//! fresh Postgres database), and a small JSON client of its API.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::Value;

use crate::{
    Backend, Db, Process, TestEnv, binary, drop_database, pg_admin, pg_admin_url, random_id,
};

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

    /// The token printed on first start (token mode, no users yet).
    pub fn admin_token(&self) -> Option<String> {
        self.stdout_lines()
            .iter()
            .find_map(|l| l.strip_prefix("admin token: ").map(str::to_string))
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
