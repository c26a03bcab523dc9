//! The hub's concurrency and crash promises, against real processes: concurrent savers on one
//! revision, two hub processes over one Postgres, and a hub killed between the CAS root-ref
//! call and its local commit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use cas_client::{AppCasClient, SigningKey};
use cas_format::Hash;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tests::hub::{HubClient, HubEnv, HubServer};
use tests::{Backend, space};

fn run(f: impl std::future::Future<Output = anyhow::Result<()>>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
        .unwrap();
}

/// A CAS client acting as the hub's App (its key is in the data directory).
fn hub_cas(env: &HubEnv, cas_url: &str) -> anyhow::Result<AppCasClient> {
    let pem = std::fs::read_to_string(
        std::path::Path::new(&env.env.vars["UNICAS_DATA_DIR"]).join("hub-signing-key.pem"),
    )?;
    let key = SigningKey::from_pem(&pem, "hub-1", "urn:unicas:hub", "unicas")?;
    Ok(AppCasClient::new(cas_url, "hub".parse()?, Arc::new(key))?)
}

/// Root-ref balances of a project's Space.
async fn balances(cas: &AppCasClient, pid: &str) -> anyhow::Result<BTreeMap<Hash, i64>> {
    let mut out = BTreeMap::new();
    let mut cursor = None;
    loop {
        let page = cas
            .list_root_refs(&space(pid), 200, cursor.as_deref())
            .await?;
        for i in page.items {
            out.insert(i.hash, i.ref_count);
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(out),
        }
    }
}

/// Every version of a notebook, oldest first.
async fn versions(c: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("?limit=1000&cursor={c}"),
            None => "?limit=1000".into(),
        };
        let (s, v) = c
            .get(&format!(
                "/api/v1/projects/{pid}/notebooks/{nid}/versions{q}"
            ))
            .await?;
        ensure!(s == StatusCode::OK, "versions: {s} {v}");
        all.extend(v["data"]["items"].as_array().cloned().unwrap_or_default());
        match v["data"]["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    all.reverse();
    Ok(all)
}

/// The invariants between the hub's version index and the CAS: every kept version holds
/// exactly one root ref, nothing else in the Space does, revisions are unique.
async fn check_retention(
    c: &HubClient,
    cas: &AppCasClient,
    pid: &str,
    nids: &[String],
) -> anyhow::Result<()> {
    let mut expected = BTreeMap::new();
    for nid in nids {
        let mut seen = BTreeSet::new();
        for v in versions(c, pid, nid).await? {
            let rev = v["revision"].as_i64().context("revision")?;
            ensure!(seen.insert(rev), "revision {rev} of {nid} appears twice");
            if v["state"] == "kept" {
                let h: Hash = v["hash"].as_str().context("hash")?.parse()?;
                ensure!(
                    expected.insert(h, 1i64).is_none(),
                    "version node {h} indexed twice"
                );
            }
        }
    }
    let actual = balances(cas, pid).await?;
    ensure!(
        actual == expected,
        "root refs of {pid} do not match the kept versions:\n CAS  {actual:?}\n hub  {expected:?}"
    );
    Ok(())
}

async fn head(c: &HubClient, pid: &str, nid: &str) -> anyhow::Result<Option<i64>> {
    let (s, v) = c
        .get(&format!("/api/v1/projects/{pid}/notebooks/{nid}"))
        .await?;
    ensure!(s == StatusCode::OK, "notebook: {s} {v}");
    Ok(v["data"]["head_revision"].as_i64())
}

/// Many savers on the same revision: exactly one wins, every other gets 409 with the actual
/// revision, and every refused edit survives as its own notebook through branch-refused-edit.
async fn concurrent_savers(b: Backend) -> anyhow::Result<()> {
    let env = HubEnv::new(b).await?;
    let token = env.user("alice")?;
    let server = env.start()?;
    let c = server.client(Some(&token));
    let pid = c.project("races").await?;
    let nid = c
        .notebook(&pid, "shared", &[("notebook.py", "v0\n")])
        .await?;
    let mut branches = Vec::new();
    for (expected_rev, round) in (1i64..).zip(0..6) {
        let savers = 6;
        let mut tasks = Vec::new();
        for i in 0..savers {
            let c = c.clone();
            let (pid, nid) = (pid.clone(), nid.clone());
            tasks.push(tokio::spawn(async move {
                let content = format!("round {round} saver {i}\n");
                let r = c
                    .save(
                        &pid,
                        &nid,
                        Some(expected_rev),
                        &[("notebook.py", &content)],
                        &[],
                    )
                    .await;
                (i, content, r)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            let (i, content, r) = t.await?;
            let (s, v) = r?;
            match s {
                StatusCode::CREATED => winners.push((i, content, v)),
                StatusCode::CONFLICT => {
                    ensure!(v["error"]["code"] == "workspace_conflict", "{v}");
                    ensure!(v["error"]["expected_revision"] == expected_rev, "{v}");
                    ensure!(v["error"]["actual_revision"] == expected_rev + 1, "{v}");
                    // Keep the refused edit.
                    let (s, b) = c
                        .post(
                            &format!("/api/v1/projects/{pid}/notebooks/{nid}/branch-refused-edit"),
                            &json!({"base_revision": expected_rev,
                                    "files": {"notebook.py": {"content": content}}}),
                        )
                        .await?;
                    ensure!(s == StatusCode::CREATED, "branch: {s} {b}");
                    branches.push((
                        b["data"]["notebook"]["id"]
                            .as_str()
                            .context("id")?
                            .to_string(),
                        content,
                    ));
                }
                other => bail!("saver {i}: unexpected {other}: {v}"),
            }
        }
        ensure!(
            winners.len() == 1,
            "round {round}: {} savers won",
            winners.len()
        );
        let (_, content, v) = &winners[0];
        ensure!(v["data"]["revision"] == expected_rev + 1, "{v}");
        let (s, body) = c
            .get_bytes(&format!(
                "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/notebook.py"
            ))
            .await?;
        ensure!(s == StatusCode::OK && body == content.as_bytes(), "{s}");
    }
    // Every refused edit is readable in its branch, and no branch buried another.
    let titles: BTreeSet<String> = {
        let (_, cat) = c.get("/api/v1/catalog").await?;
        cat["data"]["projects"][0]["notebooks"]
            .as_array()
            .context("notebooks")?
            .iter()
            .filter_map(|n| n["title"].as_str().map(str::to_string))
            .collect()
    };
    ensure!(titles.len() == 1 + branches.len(), "titles: {titles:?}");
    for (bid, content) in &branches {
        let (s, body) = c
            .get_bytes(&format!(
                "/api/v1/projects/{pid}/notebooks/{bid}/workspace/files/notebook.py"
            ))
            .await?;
        ensure!(
            s == StatusCode::OK && body == content.as_bytes(),
            "branch {bid}"
        );
    }
    let cas = hub_cas(&env, server.cas_url.as_deref().context("embedded CAS")?)?;
    let mut all = vec![nid.clone()];
    all.extend(branches.iter().map(|(b, _)| b.clone()));
    check_retention(&c, &cas, &pid, &all).await
}

#[test]
fn concurrent_savers_sqlite_fs() {
    run(concurrent_savers(Backend::SQLITE_FS));
}

#[test]
fn concurrent_savers_postgres_fs() {
    run(concurrent_savers(Backend::POSTGRES_FS));
}

/// Two hub processes over one hub database and one CAS (Postgres: advisory locks; SQLite: one
/// host, lock files in the shared data directory): savers on both, racing on one notebook,
/// each retrying on conflict. Every acknowledged save is a distinct revision, the head is the
/// last, and the CAS holds exactly one root ref per kept version.
#[test]
fn two_hub_processes_over_one_postgres() {
    run(two_hub_processes(Backend::POSTGRES_FS));
}

#[test]
fn two_hub_processes_over_one_sqlite_file() {
    run(two_hub_processes(Backend::SQLITE_FS));
}

async fn two_hub_processes(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    // One CAS service for both hubs, registered with the hub's key.
    let cas = env.separate_cas()?;
    env.set("UNICAS_HUB_WORKSPACE_WAIT_MS", "20000");
    let token = env.user("alice")?;
    let h1 = env.start()?;
    let h2 = env.start()?;
    ensure!(
        h1.cas_url.is_none() && h2.cas_url.is_none(),
        "the hubs embed no CAS"
    );
    let (c1, c2) = (h1.client(Some(&token)), h2.client(Some(&token)));
    let pid = c1.project("two").await?;
    let nid = c1.notebook(&pid, "shared", &[("n.py", "0\n")]).await?;
    // The second process sees the first one's catalog at once.
    let (s, v) = c2
        .get(&format!("/api/v1/projects/{pid}/notebooks/{nid}"))
        .await?;
    ensure!(s == StatusCode::OK, "{s} {v}");

    let per_writer = 8;
    let mut tasks = Vec::new();
    for (w, c) in [c1.clone(), c2.clone(), c1.clone(), c2.clone()]
        .into_iter()
        .enumerate()
    {
        let (pid, nid) = (pid.clone(), nid.clone());
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut conflicts = 0;
            for i in 0..per_writer {
                loop {
                    let h = head(&c, &pid, &nid).await?;
                    let content = format!("writer {w} save {i}\n");
                    let (s, v) = c
                        .save(&pid, &nid, h, &[(&format!("w{w}.txt"), &content)], &[])
                        .await?;
                    match s {
                        StatusCode::CREATED => {
                            acked.push(v["data"]["revision"].as_i64().context("rev")?);
                            break;
                        }
                        StatusCode::CONFLICT => conflicts += 1,
                        other => bail!("writer {w}: {other} {v}"),
                    }
                }
            }
            Ok::<_, anyhow::Error>((acked, conflicts))
        }));
    }
    let mut acked = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let (a, c) = t.await??;
        acked.extend(a);
        conflicts += c;
    }
    let distinct: BTreeSet<i64> = acked.iter().copied().collect();
    ensure!(
        distinct.len() == acked.len(),
        "a revision was acknowledged twice: {acked:?}"
    );
    ensure!(acked.len() == 4 * per_writer, "{}", acked.len());
    let last = *distinct.iter().next_back().context("none")?;
    ensure!(head(&c1, &pid, &nid).await? == Some(last));
    ensure!(head(&c2, &pid, &nid).await? == Some(last));
    let all = versions(&c2, &pid, &nid).await?;
    ensure!(all.len() == 1 + acked.len(), "{} versions", all.len());
    // Each writer's last file holds its last save: nothing acknowledged was lost.
    for w in 0..4 {
        let (s, body) = c1
            .get_bytes(&format!(
                "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/w{w}.txt"
            ))
            .await?;
        ensure!(
            s == StatusCode::OK
                && body == format!("writer {w} save {}\n", per_writer - 1).as_bytes(),
            "writer {w}: {s} {body:?}"
        );
    }
    let hub_client = hub_cas(&env, &cas.url)?;
    check_retention(&c1, &hub_client, &pid, std::slice::from_ref(&nid)).await?;
    eprintln!(
        "{} saves through two processes, {conflicts} conflicts retried",
        acked.len()
    );
    // A writer held up in one process makes the other answer 503 workspace_busy, and write
    // nothing; covered for one process in `killed_between_root_refs_and_commit`.
    drop((h1, h2));
    drop(cas);
    Ok(())
}

async fn start_paused(env: &HubEnv, failpoint: &str) -> anyhow::Result<HubServer> {
    env.start_with(&[("UNICAS_FAILPOINTS", &format!("{failpoint}=pause"))])
}

/// A hub killed between the root-ref call and its local commit (and, in a second round, just
/// before the root-ref call) recovers on restart: the revision joins the history (the head
/// stays, seed 002), its root ref is counted exactly once, and its number is never reused.
/// While the first writer holds the workspace, another gets 503 `workspace_busy` and writes
/// nothing.
async fn killed_between_root_refs_and_commit(b: Backend) -> anyhow::Result<()> {
    let mut env = HubEnv::new(b).await?;
    env.set("UNICAS_HUB_WORKSPACE_WAIT_MS", "300");
    let token = env.user("alice")?;
    let server = env.start()?;
    let c = server.client(Some(&token));
    let pid = c.project("crash").await?;
    let nid = c.notebook(&pid, "nb", &[("a.txt", "one\n")]).await?;
    drop(c);
    server.terminate()?;

    let failpoint = "hub-after-root-refs";
    let server = start_paused(&env, failpoint).await?;
    let c = server.client(Some(&token));
    let content = "lost ack\n";
    let saver = {
        let (c, pid, nid) = (c.clone(), pid.clone(), nid.clone());
        tokio::spawn(async move {
            c.save(&pid, &nid, Some(1), &[("a.txt", content)], &[])
                .await
        })
    };
    server
        .wait_for_log(
            &format!("failpoint {failpoint} reached"),
            Duration::from_secs(30),
        )
        .await?;
    // The paused writer holds the workspace: another writer is turned away, unharmed.
    let (s, v) = c.save(&pid, &nid, Some(1), &[("b.txt", "x")], &[]).await?;
    ensure!(s == StatusCode::SERVICE_UNAVAILABLE, "{s} {v}");
    ensure!(v["error"]["code"] == "workspace_busy", "{v}");
    ensure!(v["error"]["timeout_seconds"].as_f64().is_some(), "{v}");
    ensure!(
        v["error"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("nothing was written")),
        "seed 002's reason rides inside error: {v}"
    );
    server.kill();
    ensure!(
        saver.await?.is_err(),
        "the paused save must not have been answered"
    );

    // Restart: recovery settles the outbox row.
    let server = env.start()?;
    let c = server.client(Some(&token));
    let all = versions(&c, &pid, &nid).await?;
    let recovered = all
        .iter()
        .find(|v| v["revision"] == 2)
        .with_context(|| format!("revision 2 was not recovered: {all:?}"))?;
    ensure!(
        recovered["state"] == "kept" && recovered["is_head"] == false,
        "{recovered}"
    );
    ensure!(head(&c, &pid, &nid).await? == Some(1), "the head moved");
    let vid = recovered["version_id"].as_str().context("vid")?;
    let (s, body) = c
        .get_bytes(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/versions/{vid}/files/a.txt"
        ))
        .await?;
    ensure!(
        s == StatusCode::OK && body == content.as_bytes(),
        "{s} {body:?}"
    );
    // The busy writer wrote nothing.
    let (s, _) = c
        .get(&format!(
            "/api/v1/projects/{pid}/notebooks/{nid}/workspace/files/b.txt"
        ))
        .await?;
    ensure!(s == StatusCode::NOT_FOUND, "{s}");
    let cas = hub_cas(&env, server.cas_url.as_deref().context("embedded CAS")?)?;
    check_retention(&c, &cas, &pid, std::slice::from_ref(&nid)).await?;
    // The number is never reused: the next save on the head gets a higher one.
    let (s, v) = c
        .save(&pid, &nid, Some(1), &[("a.txt", "after\n")], &[])
        .await?;
    ensure!(s == StatusCode::CREATED, "{s} {v}");
    ensure!(v["data"]["revision"] == 3, "{v}");
    check_retention(&c, &cas, &pid, std::slice::from_ref(&nid)).await?;
    server.terminate()?;
    second_round(&env, &token, &pid, &nid, 3).await
}

/// The second failpoint, with the head at `head_rev`.
async fn second_round(
    env: &HubEnv,
    token: &str,
    pid: &str,
    nid: &str,
    head_rev: i64,
) -> anyhow::Result<()> {
    let server = start_paused(env, "hub-before-root-refs").await?;
    let c = server.client(Some(token));
    let saver = {
        let (c, pid, nid) = (c.clone(), pid.to_string(), nid.to_string());
        tokio::spawn(async move {
            c.save(
                &pid,
                &nid,
                Some(head_rev),
                &[("a.txt", "before refs\n")],
                &[],
            )
            .await
        })
    };
    server
        .wait_for_log(
            "failpoint hub-before-root-refs reached",
            Duration::from_secs(30),
        )
        .await?;
    server.kill();
    ensure!(
        saver.await?.is_err(),
        "the paused save must not have been answered"
    );
    let server = env.start()?;
    let c = server.client(Some(token));
    let all = versions(&c, pid, nid).await?;
    let last = all.last().context("no versions")?;
    ensure!(
        last["revision"] == head_rev + 1 && last["state"] == "kept",
        "{last}"
    );
    ensure!(
        head(&c, pid, nid).await? == Some(head_rev),
        "the head moved"
    );
    let cas = hub_cas(env, server.cas_url.as_deref().context("embedded CAS")?)?;
    check_retention(&c, &cas, pid, &[nid.to_string()]).await?;
    Ok(())
}

#[test]
fn killed_between_root_refs_and_commit_sqlite_fs() {
    run(killed_between_root_refs_and_commit(Backend::SQLITE_FS));
}

#[test]
fn killed_between_root_refs_and_commit_postgres_fs() {
    run(killed_between_root_refs_and_commit(Backend::POSTGRES_FS));
}
