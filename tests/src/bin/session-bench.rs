//! The session benchmark: how fast a session starts, what an idle one costs, and what the
//! proxy adds, against real marimo, with ratios against baselines measured in the same run.
//!
//! ```text
//! scripts/bench sessions [OPTIONS]     # builds release binaries, makes the marimo runtime
//! session-bench [OPTIONS]
//!   --starts N        sessions started one after another for the latency figures (default 10)
//!   --idle N          sessions kept idle together for the memory figure (default 4)
//!   --seconds S       length of each proxy load run (default 5)
//!   --concurrency C   requests in flight during those runs (default 8)
//! ```
//!
//! Reported:
//! - start latency, p50 and p95: `POST …/sessions` until the record says `running`, with the
//!   runtime already prepared (one session is started and ended first), beside the time
//!   `marimo edit` alone takes to answer its health check when started by hand (same machine,
//!   same run);
//! - memory per idle session: the resident memory of each session's process group (marimo and
//!   its kernel) once idle, and the hub's own growth per session;
//! - proxy overhead: requests per second for marimo's health route through `/s/{sid}/` beside
//!   the same route straight at the sandbox's port, and the ratio.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tests::hub::{HubClient, HubEnv, data};
use tests::sessions::*;
use tests::{Backend, proc_status_kib};

struct Options {
    starts: usize,
    idle: usize,
    seconds: u64,
    concurrency: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        starts: 10,
        idle: 4,
        seconds: 5,
        concurrency: 8,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || -> anyhow::Result<u64> {
            args.next()
                .with_context(|| format!("{a} needs a value"))?
                .parse()
                .with_context(|| format!("{a} needs a number"))
        };
        match a.as_str() {
            "--starts" => o.starts = value()?.max(2) as usize,
            "--idle" => o.idle = value()?.max(1) as usize,
            "--seconds" => o.seconds = value()?.max(1),
            "--concurrency" => o.concurrency = value()?.max(1) as usize,
            other => bail!("unknown option {other}"),
        }
    }
    Ok(o)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Resident memory of every process in the group `pgid`, in KiB.
fn group_rss_kib(pgid: i32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(2)?.parse::<i32>().ok()
                })
                == Some(pgid)
        })
        .filter_map(|pid| proc_status_kib(pid, "VmRSS:").ok())
        .sum()
}

/// Requests per second of `GET url` with `c` in flight for `secs`.
async fn rate(url: &str, headers: &[(&str, String)], c: usize, secs: u64) -> anyhow::Result<f64> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (http, url) = (http.clone(), url.to_string());
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let mut r = http.get(&url);
                for (k, v) in &headers {
                    r = r.header(k, v);
                }
                let resp = r.send().await?;
                if !resp.status().is_success() {
                    bail!("{url}: {}", resp.status());
                }
                resp.bytes().await?;
                n += 1;
            }
            Ok::<u64, anyhow::Error>(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / secs as f64)
}

/// `marimo edit` started by hand until its health check answers, in ms.
async fn bare_marimo_start(dir: &std::path::Path) -> anyhow::Result<f64> {
    std::fs::write(dir.join("notebook.py"), NOTEBOOK)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let t = Instant::now();
    let mut child = std::process::Command::new(marimo()?)
        .args([
            "edit",
            "notebook.py",
            "--headless",
            "--no-token",
            "--skip-update-check",
            "--no-sandbox",
            "--port",
        ])
        .arg(port.to_string())
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let url = format!("http://127.0.0.1:{port}/health");
    let ms = loop {
        if reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break t.elapsed().as_secs_f64() * 1000.0;
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("marimo did not answer within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    child.kill()?;
    child.wait()?;
    Ok(ms)
}

async fn start_one(a: &HubClient, pid: &str, nid: &str) -> anyhow::Result<(String, f64)> {
    let t = Instant::now();
    let s = data(&create(a, pid, nid, "edit").await?, 202);
    let sid = s["session_id"].as_str().unwrap_or_default().to_string();
    wait_status(a, pid, nid, &sid, "running", Duration::from_secs(120)).await?;
    Ok((sid, t.elapsed().as_secs_f64() * 1000.0))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = options()?;
    let mut env = session_env(Backend::SQLITE_FS).await?;
    env.set("UNICAS_HUB_SESSION_MAX_PER_USER", 0);
    env.set("UNICAS_HUB_SESSION_SAVE_INTERVAL_MS", 0);
    let token = env.user("bench")?;
    let server = env.start()?;
    let a = server.client(Some(&token));
    let pid = a.project("bench").await?;
    let mut notebooks = Vec::new();
    for i in 0..o.idle.max(1) {
        notebooks.push(
            a.notebook(&pid, &format!("N{i}"), &[("notebook.py", NOTEBOOK)])
                .await?,
        );
    }
    let nid = notebooks[0].clone();

    // Warm: the runtime is probed once, and the first start pays for the filesystem caches.
    let (sid, _) = start_one(&a, &pid, &nid).await?;
    data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    let mut starts = Vec::new();
    for _ in 0..o.starts {
        let (sid, ms) = start_one(&a, &pid, &nid).await?;
        starts.push(ms);
        data(&a.delete(&session_path(&pid, &nid, &sid)).await?, 200);
    }
    let scratch = tempfile::tempdir()?;
    let mut bare = Vec::new();
    for _ in 0..3 {
        bare.push(bare_marimo_start(scratch.path()).await?);
    }
    starts.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    let bare_p50 = percentile(&bare, 0.5);
    println!(
        "session start (POST until running), {} starts:",
        starts.len()
    );
    println!(
        "  p50 {:.0} ms, p95 {:.0} ms; marimo alone p50 {:.0} ms (×{:.2} for the hub's p50)",
        percentile(&starts, 0.5),
        percentile(&starts, 0.95),
        bare_p50,
        percentile(&starts, 0.5) / bare_p50
    );

    // Idle sessions: memory of their process groups, and the hub's growth.
    let hub_before = proc_status_kib(server.pid(), "VmRSS:")?;
    let mut live = Vec::new();
    for n in &notebooks {
        let (sid, _) = start_one(&a, &pid, n).await?;
        live.push((n.clone(), sid));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut per_session = Vec::new();
    for (_, sid) in &live {
        let pgid = read_pid(&env, sid)?;
        per_session.push(group_rss_kib(pgid) as f64 / 1024.0);
    }
    let hub_after = proc_status_kib(server.pid(), "VmRSS:")?;
    let avg = per_session.iter().sum::<f64>() / per_session.len() as f64;
    println!("idle sessions: {}", live.len());
    println!(
        "  {:.1} MiB resident per session (marimo and its kernel); the hub grew {:.1} MiB per session",
        avg,
        (hub_after as f64 - hub_before as f64) / 1024.0 / live.len() as f64
    );

    // Proxy overhead on marimo's health route.
    let (_, sid) = &live[0];
    let port = sandbox_port(&env, sid)?;
    let direct = rate(
        &format!("http://127.0.0.1:{port}/s/{sid}/health"),
        &[],
        o.concurrency,
        o.seconds,
    )
    .await?;
    let proxied = rate(
        &format!("{}/s/{sid}/health", server.url),
        &[("authorization", format!("Bearer {token}"))],
        o.concurrency,
        o.seconds,
    )
    .await?;
    println!(
        "proxy, GET health, {} in flight, {} s each:",
        o.concurrency, o.seconds
    );
    println!(
        "  {proxied:.0} req/s through /s/{{sid}}/, {direct:.0} req/s straight to the sandbox (×{:.2})",
        proxied / direct
    );
    for (n, sid) in &live {
        data(&a.delete(&session_path(&pid, n, sid)).await?, 200);
    }
    Ok(())
}

fn read_pid(env: &HubEnv, sid: &str) -> anyhow::Result<i32> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session_dir(env, sid).join("sandbox.json"))?)?;
    v["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .context("no pid in sandbox.json")
}
