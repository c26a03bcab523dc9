//! Sessions under test: hubs that run real marimo, and a client that drives marimo the way its
//! editor does (its page, its WebSocket, its save API), through the hub's proxy.
//!
//! marimo comes from a virtual environment made once by `scripts/marimo-runtime` (by default
//! `~/.cache/unicas-test/marimo-venv`; `UNICAS_TEST_MARIMO` names another executable).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::Backend;
use crate::hub::{HubClient, HubEnv, HubServer, data};

/// A notebook whose one cell shows `40 + 2`.
pub const NOTEBOOK: &str = "import marimo\n\napp = marimo.App()\n\n\n@app.cell\ndef _():\n    x = 40 + 2\n    x\n    return (x,)\n\n\nif __name__ == \"__main__\":\n    app.run()\n";

/// The marimo executable sessions run.
pub fn marimo() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("UNICAS_TEST_MARIMO") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/unicas-test/marimo-venv/bin/marimo"),
    };
    if !path.exists() {
        bail!(
            "no marimo at {}: run scripts/marimo-runtime (the test command does) or set UNICAS_TEST_MARIMO",
            path.display()
        );
    }
    Ok(path)
}

/// A hub environment whose sessions run marimo, swept often.
pub async fn session_env(b: Backend) -> anyhow::Result<HubEnv> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_MARIMO", marimo()?.display());
    env.set("UNICAS_HUB_SESSION_SWEEP_MS", 500);
    Ok(env)
}

/// Where the hub of `env` keeps a session's sandbox.
pub fn session_dir(env: &HubEnv, sid: &str) -> PathBuf {
    env.env.dir.path().join("data").join("sessions").join(sid)
}

/// The loopback port a session's marimo listens on (while its directory exists).
pub fn sandbox_port(env: &HubEnv, sid: &str) -> anyhow::Result<u16> {
    let record: Value =
        serde_json::from_slice(&std::fs::read(session_dir(env, sid).join("sandbox.json"))?)?;
    record["port"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .context("no port in sandbox.json")
}

/// Whether something accepts connections on a loopback port.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .is_ok()
}

/// Whether a process whose command line mentions `needle` runs.
pub fn process_running(needle: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(needle))
            .unwrap_or(false)
    })
}

/// Polls `f` until it answers `Some`, at most `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A hub of `env` with the user alice and her notebook "N" (holding [`NOTEBOOK`]) in project
/// "P": `(token, server, client, pid, nid)`.
pub async fn alice_notebook(
    env: &HubEnv,
) -> anyhow::Result<(String, HubServer, HubClient, String, String)> {
    let token = env.user("alice")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("P").await?;
    let nid = a.notebook(&pid, "N", &[("notebook.py", NOTEBOOK)]).await?;
    Ok((token, server, a, pid, nid))
}

/// Gives `user` a `role` on the project.
pub async fn add_member(c: &HubClient, pid: &str, user: &str, role: &str) -> anyhow::Result<()> {
    let (s, v) = c
        .put(
            &format!("/api/v1/projects/{pid}/members"),
            &json!({"user_id": user, "role": role}),
        )
        .await?;
    if s != StatusCode::OK {
        bail!("adding {user} as {role}: {s} {v}");
    }
    Ok(())
}

/// Creates a session (202) and waits until it runs; its id.
pub async fn started(c: &HubClient, pid: &str, nid: &str, mode: &str) -> anyhow::Result<String> {
    let (s, v) = create(c, pid, nid, mode).await?;
    if s != StatusCode::ACCEPTED {
        bail!("creating a session: {s} {v}");
    }
    let sid = v["data"]["session_id"]
        .as_str()
        .context("no session id")?
        .to_string();
    wait_status(c, pid, nid, &sid, "running", Duration::from_secs(90)).await?;
    Ok(sid)
}

/// The text of a file at the workspace's head.
pub async fn head_file(c: &HubClient, pid: &str, nid: &str, path: &str) -> anyhow::Result<String> {
    let (s, body) = c
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/{path}"
        ))
        .await?;
    if s != StatusCode::OK {
        bail!("reading {path}: {s}");
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Opens the session's editor as `token`'s user and saves the notebook with `40 + n`.
pub async fn edit_sum(base: &str, sid: &str, token: &str, n: u32) -> anyhow::Result<()> {
    let bearer = format!("Bearer {token}");
    let editor = Editor::open(base, sid, &[("authorization", &bearer)]).await?;
    editor
        .save(&with_sum(&editor.codes(), n), "notebook.py")
        .await
}

/// The API path of a session.
/// The `data` of a notebook's version listing.
pub async fn versions(c: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Value> {
    Ok(data(
        &c.get(&format!("/api/v1/projects/{pid}/notebooks/{nid}/versions"))
            .await?,
        200,
    ))
}

pub fn session_path(pid: &str, nid: &str, sid: &str) -> String {
    format!("/api/v1/projects/{pid}/notebooks/{nid}/sessions/{sid}")
}

/// Creates a session (`mode` edit or app); answers the status and the record.
pub async fn create(
    c: &HubClient,
    pid: &str,
    nid: &str,
    mode: &str,
) -> anyhow::Result<(StatusCode, Value)> {
    c.post(
        &format!("/api/v1/projects/{pid}/notebooks/{nid}/sessions"),
        &json!({ "mode": mode }),
    )
    .await
}

/// Waits until the session's status is `status`; its record.
pub async fn wait_status(
    c: &HubClient,
    pid: &str,
    nid: &str,
    sid: &str,
    status: &str,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let path = session_path(pid, nid, sid);
    let deadline = Instant::now() + timeout;
    loop {
        let (s, v) = c.get(&path).await?;
        if s != StatusCode::OK {
            bail!("GET {path}: {s} {v}");
        }
        if v["data"]["status"] == status {
            return Ok(v["data"].clone());
        }
        if ["terminated", "failed", "expired"].contains(&v["data"]["status"].as_str().unwrap_or(""))
        {
            bail!("session {sid} ended before it was {status}: {}", v["data"]);
        }
        if Instant::now() > deadline {
            bail!(
                "timed out waiting for session {sid} to be {status}; last seen: {}",
                v["data"]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The editor of one session, driven as marimo's front end drives it: through the hub.
pub struct Editor {
    client: HubClient,
    base: String,
    sid: String,
    /// Extra headers for the proxy (a bearer token, or a session cookie).
    auth: Vec<(String, String)>,
    server_token: String,
    marimo_session: String,
    cells: Value,
    _ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Editor {
    /// Loads the editor page, connects its WebSocket through the proxy and waits for the
    /// kernel. `auth` goes on every request (e.g. `authorization: Bearer …`).
    pub async fn open(base: &str, sid: &str, auth: &[(&str, &str)]) -> anyhow::Result<Editor> {
        let client = HubClient::new(base, None);
        let mut page = client.request(reqwest::Method::GET, &format!("/s/{sid}/"));
        for (k, v) in auth {
            page = page.header(*k, *v);
        }
        let page = page.send().await?;
        if page.status() != StatusCode::OK {
            bail!("the editor page answered {}", page.status());
        }
        let html = page.text().await?;
        let server_token = html
            .split("server-token data-token=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .context("the editor page has no server token")?
            .to_string();
        let marimo_session = format!("t{}", rand::random::<u64>());
        let ws_url = format!(
            "{}/s/{sid}/ws?session_id={marimo_session}",
            base.replacen("http://", "ws://", 1)
        );
        let mut req = ws_url.into_client_request()?;
        for (k, v) in auth {
            req.headers_mut().insert(
                reqwest::header::HeaderName::from_bytes(k.as_bytes())?,
                v.parse()?,
            );
        }
        let (mut ws, _) = tokio::time::timeout(
            Duration::from_secs(30),
            tokio_tungstenite::connect_async(req),
        )
        .await
        .context("the WebSocket did not connect")??;
        let cells = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(msg) = ws.next().await {
                if let Message::Text(t) = msg? {
                    let v: Value = serde_json::from_str(&t)?;
                    if v["op"] == "kernel-ready" {
                        return Ok::<Value, anyhow::Error>(v["data"].clone());
                    }
                }
            }
            bail!("the WebSocket closed before the kernel was ready")
        })
        .await
        .context("no kernel-ready over the WebSocket")??;
        let _ = ws.send(Message::Ping(Vec::new().into())).await;
        Ok(Editor {
            client,
            base: base.to_string(),
            sid: sid.to_string(),
            auth: auth
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            server_token,
            marimo_session,
            cells,
            _ws: ws,
        })
    }

    /// The code of the notebook's cells as the kernel reported them.
    pub fn codes(&self) -> Vec<String> {
        self.cells["codes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Saves the notebook with its cells' code replaced by `codes`, through marimo's own save
    /// API (what the editor's save button does).
    pub async fn save(&self, codes: &[String], filename: &str) -> anyhow::Result<()> {
        let body = json!({
            "cellIds": self.cells["cell_ids"],
            "codes": codes,
            "names": self.cells["names"],
            "configs": self.cells["configs"],
            "filename": filename,
        });
        let mut r = self
            .client
            .request(
                reqwest::Method::POST,
                &format!("/s/{}/api/kernel/save", self.sid),
            )
            .header("marimo-session-id", &self.marimo_session)
            .header("marimo-server-token", &self.server_token)
            .json(&body);
        for (k, v) in &self.auth {
            r = r.header(k, v);
        }
        let resp = r.send().await?;
        if resp.status() != StatusCode::OK {
            bail!(
                "marimo's save through {} answered {}: {}",
                self.base,
                resp.status(),
                resp.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }
}

/// Replaces `40 + 2` (or whatever number) in the first cell with `40 + n`.
pub fn with_sum(codes: &[String], n: u32) -> Vec<String> {
    codes
        .iter()
        .map(|c| match c.find("40 + ") {
            Some(i) => {
                let rest = &c[i + 5..];
                let end = rest
                    .find(|ch: char| !ch.is_ascii_digit())
                    .unwrap_or(rest.len());
                format!("{}40 + {n}{}", &c[..i], &rest[end..])
            }
            None => c.clone(),
        })
        .collect()
}
