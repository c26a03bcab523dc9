//! One replay of the history through a fresh hub: a push per commit, what each cost, and
//! reads of old versions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tests::fault_proxy::FaultProxy;
use tests::hub::{HubClient, HubEnv};
use tests::{Backend, Blobs};

use super::*;

/// One push and what it cost.
#[derive(Debug, Default, Clone)]
pub(crate) struct Push {
    pub(crate) received_bytes: u64,
    pub(crate) uploaded_bytes: u64,
    pub(crate) uploaded_nodes: u64,
    pub(crate) size_bytes: u64,
    pub(crate) file_count: u64,
    pub(crate) latency: Duration,
    /// Object-store requests by kind (measured, or derived on the filesystem store).
    pub(crate) store: BTreeMap<String, u64>,
    /// CAS API requests by "METHOD route".
    pub(crate) cas: BTreeMap<String, u64>,
}

pub(crate) struct Replay {
    pub(crate) label: String,
    /// Latencies of reading a random file of a random version of the older half.
    pub(crate) old_reads: Vec<Duration>,
    pub(crate) storage: Value,
    pub(crate) pushes: Vec<Push>,
    pub(crate) measured_store: bool,
}

/// From the CAS's `/metrics`: `unicas_http_requests_total` by "METHOD route" (without
/// `/metrics` itself), and `unicas_object_store_requests_total` by operation (`PUT`, `GET`,
/// ...): the requests the service made of its object store, whatever the store.
pub(crate) async fn cas_requests(
    http: &reqwest::Client,
    cas_url: &str,
) -> anyhow::Result<(BTreeMap<String, u64>, BTreeMap<String, u64>)> {
    let text = http
        .get(format!("{cas_url}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let label = |labels: &str, name: &str| -> Option<String> {
        let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
        let end = labels[start..].find('"')? + start;
        Some(labels[start..end].to_string())
    };
    let (mut api, mut store) = (BTreeMap::new(), BTreeMap::new());
    for line in text.lines() {
        let (family, rest) = if let Some(rest) = line.strip_prefix("unicas_http_requests_total{") {
            (&mut api, rest)
        } else if let Some(rest) = line.strip_prefix("unicas_object_store_requests_total{") {
            (&mut store, rest)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let key = match (label(labels, "method"), label(labels, "route")) {
            (_, Some(route)) if route == "/metrics" => continue,
            (Some(method), Some(route)) => format!("{method} {route}"),
            _ => match label(labels, "operation") {
                Some(op) => op.to_uppercase(),
                None => continue,
            },
        };
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *family.entry(key).or_default() += n;
    }
    Ok((api, store))
}

pub(crate) fn diff(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

pub(crate) async fn replay(
    o: &Options,
    commits: &[Commit],
    label: &str,
    layout: Layout,
) -> anyhow::Result<Replay> {
    let s3 = !o.fs
        && std::env::var("UNICAS_S3_ENDPOINT").is_ok()
        && std::env::var("UNICAS_TEST_BUCKET").is_ok();
    let backend = if s3 {
        Backend::SQLITE_S3
    } else {
        Backend::SQLITE_FS
    };
    let mut env = HubEnv::new(backend).await?;
    env.set("UNICAS_RATE_LIMIT_PER_IP", 0)
        .set("UNICAS_RATE_LIMIT_PER_APP", 0)
        .set("UNICAS_HUB_SYNC_MAX_BYTES", 4u64 << 30);
    env.set("UNICAS_COMPRESS_MIN_BYTES", layout.compress_min_bytes)
        .set("UNICAS_COMPRESS_LEVEL", layout.compress_level)
        .set("UNICAS_DELTA_MAX_DEPTH", layout.delta_max_depth);
    // Packs with the service's defaults, except that GC passes run every second and pack
    // loose nodes 5 s old (not 60 s), so that the replay ends packed without waiting a minute.
    let defaults = cas_service::config::Config::default();
    env.set(
        "UNICAS_PACK_MAX_NODE_BYTES",
        if layout.pack {
            o.pack_max_node_bytes
                .unwrap_or(defaults.pack_max_node_bytes)
        } else {
            0
        },
    )
    .set("UNICAS_PACK_MIN_NODES", defaults.pack_min_nodes)
    .set(
        "UNICAS_PACK_BLOCK_BYTES",
        o.pack_block_bytes.unwrap_or(defaults.pack_block_bytes),
    )
    .set(
        "UNICAS_PACK_LEVEL",
        o.pack_level.unwrap_or(defaults.pack_level),
    )
    .set(
        "UNICAS_HOLD_MAX_BYTES",
        if layout.hold {
            defaults.hold_max_bytes
        } else {
            0
        },
    )
    .set("UNICAS_PACK_DELAY_MS", 5_000)
    .set("UNICAS_GC_INTERVAL_MS", 1_000);
    let proxy = if backend.blobs == Blobs::S3 {
        let upstream = std::env::var("UNICAS_S3_ENDPOINT")?;
        let proxy = FaultProxy::start(&upstream).await?;
        env.set("UNICAS_S3_ENDPOINT", &proxy.url);
        Some(proxy)
    } else {
        None
    };
    let server = env.start()?;
    let cas_url = server
        .cas_url
        .clone()
        .context("the hub did not embed a CAS")?;
    let admin = server
        .admin_token()
        .context("the hub printed no admin token")?;
    let client = server.client(Some(&admin));
    let pid = client.project("hub-bench").await?;
    let (status, created) = client
        .post(
            &format!("/api/v1/projects/{pid}/notebooks"),
            &json!({"title": "history", "source": {"type": "git", "sync_mode": "push"}}),
        )
        .await?;
    anyhow::ensure!(
        status.is_success(),
        "creating the notebook: {status} {created}"
    );
    let nid = created["data"]["notebook"]["id"]
        .as_str()
        .context("no notebook id")?
        .to_string();
    let sync_token = created["data"]["sync_token"]
        .as_str()
        .context("no sync token")?
        .to_string();
    let sync = HubClient::new(&server.url, Some(&sync_token));
    let http = reqwest::Client::new();

    let mut pushes = Vec::with_capacity(commits.len());
    let mut versions = Vec::with_capacity(commits.len());
    let started = Instant::now();
    for (i, c) in commits.iter().enumerate() {
        let tar = archive(&o.repo, &c.id)?;
        let (cas_before, own_before) = cas_requests(&http, &cas_url).await?;
        let store_before = proxy.as_ref().map(|p| p.counts().kinds());
        let t = Instant::now();
        let (status, answer) = sync
            .post_bytes(
                "/api/sync/git/v1",
                "application/x-tar",
                tar,
                &[("x-sync-commit", c.id.as_str())],
            )
            .await?;
        let latency = t.elapsed();
        if !status.is_success() {
            bail!(
                "push {} of {} ({}) failed: {status} {answer}\n{}",
                i + 1,
                commits.len(),
                c.id,
                server.log()
            );
        }
        let (cas_after, own_after) = cas_requests(&http, &cas_url).await?;
        let d = &answer["data"];
        versions.push(d["version_id"].as_str().unwrap_or_default().to_string());
        let n = |k: &str| d[k].as_u64().unwrap_or(0);
        let mut p = Push {
            received_bytes: n("received_bytes"),
            uploaded_bytes: n("uploaded_bytes"),
            uploaded_nodes: n("uploaded_nodes"),
            size_bytes: n("size_bytes"),
            file_count: n("file_count"),
            latency,
            store: BTreeMap::new(),
            cas: diff(&cas_after, &cas_before),
        };
        p.store = match (&proxy, store_before) {
            (Some(proxy), Some(before)) => diff(&proxy.counts().kinds(), &before),
            _ => diff(&own_after, &own_before),
        };
        pushes.push(p);
        if (i + 1).is_multiple_of(25) {
            eprintln!(
                "  {label}: {} of {} pushes, {:.0} s",
                i + 1,
                commits.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let storage = settled_storage(&client, &pid).await?;
    let old_reads = read_old_files(&client, &pid, &nid, commits, &versions).await?;
    drop(server);
    Ok(Replay {
        label: label.to_string(),
        old_reads,
        storage: storage["data"].clone(),
        pushes,
        measured_store: proxy.is_some(),
    })
}

/// The project's storage once GC passes stopped changing it (packing what the replay left):
/// the same stored bytes over four reads 1.5 s apart.
async fn settled_storage(client: &HubClient, pid: &str) -> anyhow::Result<Value> {
    let mut last = None;
    let mut same = 0;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (status, storage) = client
            .get(&format!("/api/v1/projects/{pid}/storage"))
            .await?;
        anyhow::ensure!(status.is_success(), "storage: {status} {storage}");
        let stored = storage["data"]["readyStoredBytes"].as_u64();
        same = if stored == last { same + 1 } else { 0 };
        last = stored;
        if same >= 3 || Instant::now() > deadline {
            return Ok(storage);
        }
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
}

/// Reads of old files: this many, each a random file of a random version of the older half of
/// the history, through `GET …/versions/{vid}/files/{path}`, checked against git's bytes.
pub(crate) const OLD_READS: usize = 200;

/// `s` with every byte but the unreserved ones percent-encoded, for a URL path segment.
pub(crate) fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) async fn read_old_files(
    client: &HubClient,
    pid: &str,
    nid: &str,
    commits: &[Commit],
    versions: &[String],
) -> anyhow::Result<Vec<Duration>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let half = commits.len().div_ceil(2);
    let mut took = Vec::with_capacity(OLD_READS);
    for _ in 0..OLD_READS {
        let i = rng.random_range(0..half);
        let c = &commits[i];
        if c.paths.is_empty() {
            continue;
        }
        let k = rng.random_range(0..c.paths.len());
        let path: Vec<String> = c.paths[k].split('/').map(percent_encode).collect();
        let url = format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{}/files/{}",
            versions[i],
            path.join("/")
        );
        let t = Instant::now();
        let (status, bytes) = client.get_bytes(&url).await?;
        took.push(t.elapsed());
        anyhow::ensure!(status.is_success(), "{url}: {status}");
        anyhow::ensure!(
            bytes.len() as u64 == c.blobs[k].1,
            "{url}: {} bytes, git has {}",
            bytes.len(),
            c.blobs[k].1
        );
    }
    Ok(took)
}
