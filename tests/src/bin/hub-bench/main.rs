//! The storage benchmark of the hub: replays the history of a real Git repository of notebooks
//! through push sync (`POST /api/sync/git/v1`), one push per commit, oldest first, and sets what
//! the CAS stores beside what the same snapshots cost elsewhere, measured in the same run.
//!
//! ```text
//! scripts/bench hub [REPO] [OPTIONS]     # builds release binaries, starts a local S3 server
//! hub-bench REPO [OPTIONS]
//!   REPO                     a Git directory or work tree; its HEAD is replayed
//!   --topo                   every commit reachable from HEAD in topological order
//!                            (default: `git rev-list --reverse --first-parent HEAD`)
//!   --limit N                only the first N commits of that list
//!   --compress-min-bytes N   compression threshold of the replays that compress (default 64,
//!                            the service's default)
//!   --compress-level N       their zstd level (default 3, the service's default)
//!   --no-plain               skip the replay with the layout before compression and deltas
//!                            (compression off, no deltas)
//!   --no-zstd                skip the replay with compression at rest and no deltas
//!   --delta-max-depth N      chain depth of the replay with deltas (default 8, the service's
//!                            default)
//!   --no-delta               skip the replay with compression and deltas against the bases
//!                            the hub names, without packs
//!   --no-pack                skip the replay with the service's defaults (compression,
//!                            deltas and packs)
//!   --unheld                 also replay the defaults with small nodes written as objects
//!                            until they are packed (`hold_max_bytes` 0)
//!   --pack-level N           zstd level of pack blocks in that replay (the service's default)
//!   --pack-block-bytes N     content bytes per pack block in that replay (the default)
//!   --pack-max-node-bytes N  largest node packed in that replay (the default)
//!   --no-restic | --no-git   skip those baselines
//!   --fs                     the filesystem store even when an S3 server is configured
//!   --csv FILE               also write one line per push to FILE
//! ```
//!
//! Each replay starts a fresh `unicas-hub serve` (the `e2e-unicas-hub` build) embedding its CAS,
//! SQLite metadata. With `UNICAS_S3_ENDPOINT` and `UNICAS_TEST_BUCKET` set (scripts/bench starts
//! a moto server), the CAS's object store is S3 reached through a counting proxy, so object-store
//! requests are counted for real (presigned uploads go through the proxy too: their URLs are
//! signed for its address). Otherwise the store is the filesystem and the count is the one the
//! CAS keeps of its own object-store requests (`unicas_object_store_requests_total`). Either
//! count covers what the service asked of its store while the push ran, GC passes and packing
//! included.
//!
//! Reported, for the same history:
//! - storage: the CAS's `readyStoredBytes` (with `readyContentBytes`, `nodeCount`) from
//!   `GET /api/v1/projects/{pid}/storage`, beside the seed-000 layout (every version a full copy:
//!   the sum over commits of the tree's file bytes, from `git ls-tree`, checked against the
//!   hub's `logicalBytes`), git's packs after `git gc --aggressive --prune=now` (the same
//!   snapshots as a linear history, and a clone of HEAD when the repository is complete), and a
//!   restic repository (v2, compression auto) with one backup per commit;
//! - per push: uploaded bytes (beside the tar body), save latency (beside `restic backup` of the
//!   same tree), object-store requests (beside the files a full copy would write) and CAS API
//!   requests by route.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

mod baselines;
mod format;
mod options;
mod replay;

use baselines::*;
use format::*;
use options::*;
use replay::*;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut o = parse_options()?;
    let t0 = Instant::now();
    // A Git directory or a work tree.
    let git_dir = Command::new("git")
        .arg("-C")
        .arg(&o.repo)
        .args(["rev-parse", "--path-format=absolute", "--git-dir"])
        .output()?;
    anyhow::ensure!(
        git_dir.status.success(),
        "{} is not a Git repository: {}",
        o.repo.display(),
        String::from_utf8_lossy(&git_dir.stderr).trim()
    );
    o.repo = PathBuf::from(String::from_utf8(git_dir.stdout)?.trim());
    let head = git_text(&o.repo, &["rev-parse", "HEAD"])?;
    let shallow = git_text(&o.repo, &["rev-parse", "--is-shallow-repository"])? == "true";
    let reachable = git_text(&o.repo, &["rev-list", "--count", "HEAD"])?;
    let order = if o.topo {
        vec!["rev-list", "--reverse", "--topo-order", "HEAD"]
    } else {
        vec!["rev-list", "--reverse", "--first-parent", "HEAD"]
    };
    let mut ids: Vec<String> = git_text(&o.repo, &order)?
        .lines()
        .map(str::to_string)
        .collect();
    if let Some(n) = o.limit {
        ids.truncate(n);
    }
    let mut commits = Vec::with_capacity(ids.len());
    let mut incomplete = Vec::new();
    for id in &ids {
        match tree_of(&o.repo, id)? {
            Some(c) => commits.push(c),
            None => incomplete.push(id.clone()),
        }
    }
    anyhow::ensure!(!commits.is_empty(), "no commit to replay");
    let full_copies: u64 = commits.iter().map(|c| c.bytes).sum();
    let distinct: BTreeMap<&str, u64> = commits
        .iter()
        .flat_map(|c| c.blobs.iter().map(|(h, s)| (h.as_str(), *s)))
        .collect();
    let distinct_bytes: u64 = distinct.values().sum();
    let mean_files = commits.iter().map(|c| c.files).sum::<u64>() as f64 / commits.len() as f64;

    println!(
        "hub storage benchmark: {} at {} (HEAD)",
        o.repo.display(),
        &head[..12.min(head.len())]
    );
    println!(
        "history: {} commits, {} ({} reachable from HEAD{}), replayed oldest first, one push each",
        commits.len(),
        if o.topo {
            "every commit in topological order"
        } else {
            "first-parent chain of HEAD"
        },
        reachable,
        if shallow { "; SHALLOW clone" } else { "" }
    );
    if !incomplete.is_empty() {
        println!(
            "  skipped {} commits whose trees reference objects missing from the repository \
             (partial clone): {}",
            incomplete.len(),
            incomplete
                .iter()
                .map(|c| &c[..10])
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let last = commits.last().map_or(0, |c| c.bytes);
    println!(
        "trees: {:.0} files on average; last tree {} in {} files; {} distinct file versions",
        mean_files,
        mb(last),
        commits.last().map_or(0, |c| c.files),
        thousands(distinct.len() as u64)
    );

    let work = tempfile::Builder::new().prefix("hub-bench-").tempdir()?;

    // The hub, with the layout before compression, deltas and packs, with compression alone,
    // with compression and deltas, and with the defaults (compression, deltas and packs).
    let mut replays = Vec::new();
    let variants = layouts(&o);
    for (label, layout) in &variants {
        let t = Instant::now();
        eprintln!(
            "replaying {} commits through the hub ({label})",
            commits.len()
        );
        let r = replay(&o, &commits, label, *layout)
            .await
            .with_context(|| format!("replay ({label})"))?;
        eprintln!("  done in {:.0} s", t.elapsed().as_secs_f64());
        replays.push(r);
    }

    // git and restic of the same snapshots.
    let (git_linear_bytes, git_full_bytes) = if o.git {
        eprintln!("git gc --aggressive of the same snapshots");
        let linear = git_linear(&o.repo, &commits, work.path());
        let missing = git(
            &o.repo,
            &["rev-list", "--objects", "--missing=print", "HEAD"],
        )?
        .split(|b| *b == b'\n')
        .filter(|l| l.first() == Some(&b'?'))
        .count();
        let full = if missing > 0 {
            Err(anyhow::anyhow!(
                "n/a: {missing} objects reachable from HEAD are missing (partial clone)"
            ))
        } else {
            eprintln!("git gc --aggressive of a clone of HEAD");
            git_full(&o.repo, work.path())
        };
        (Some(linear), Some(full))
    } else {
        (None, None)
    };
    let restic_result = if o.restic {
        eprintln!("restic backup of each of the {} trees", commits.len());
        Some(restic(&o.repo, &commits, work.path()))
    } else {
        None
    };

    if let Some(path) = &o.csv {
        let mut out = String::from(
            "variant,push,commit,files,file_bytes,received_bytes,uploaded_bytes,uploaded_nodes,\
             latency_ms,store_requests,cas_requests\n",
        );
        for r in &replays {
            for (i, (p, c)) in r.pushes.iter().zip(&commits).enumerate() {
                out.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{:.1},{},{}\n",
                    r.label,
                    i + 1,
                    c.id,
                    p.file_count,
                    p.size_bytes,
                    p.received_bytes,
                    p.uploaded_bytes,
                    p.uploaded_nodes,
                    ms(p.latency),
                    p.store.values().sum::<u64>(),
                    p.cas.values().sum::<u64>()
                ));
            }
        }
        std::fs::write(path, out).with_context(|| format!("{}", path.display()))?;
    }

    // ---- storage
    let git_base = git_linear_bytes
        .as_ref()
        .and_then(|r| r.as_ref().ok())
        .copied();
    let vs = |bytes: u64| -> Vec<String> {
        vec![
            thousands(bytes),
            mb(bytes),
            format!("{:.4}", bytes as f64 / full_copies as f64),
            git_base.map_or("-".into(), |g| format!("{:.2}", bytes as f64 / g as f64)),
        ]
    };
    println!();
    let short = |s: &str| -> String { s.chars().take(COL - 2).collect() };
    println!(
        "  {:<LABEL$}{:>COL$}{:>14}{:>14}{:>14}",
        "storage of the whole history", "bytes", "", "/ full copies", "/ git packed"
    );
    let srow = |label: &str, bytes: u64| {
        let v = vs(bytes);
        println!(
            "  {label:<LABEL$}{:>COL$}{:>14}{:>14}{:>14}",
            v[0], v[1], v[2], v[3]
        );
    };
    let note = |label: &str, text: &str| println!("  {label:<LABEL$}{text:>COL$}");
    srow(
        "baseline: seed-000 layout, every version a full copy",
        full_copies,
    );
    for r in &replays {
        let logical = r.storage["logicalBytes"].as_u64().unwrap_or(0);
        note(
            &format!("  hub logicalBytes ({})", r.label),
            &format!(
                "{} {}",
                thousands(logical),
                if logical == full_copies {
                    "= git trees"
                } else {
                    "DIFFERS from git trees"
                }
            ),
        );
    }
    match &git_linear_bytes {
        Some(Ok(b)) => srow(
            &format!("baseline: git packed, the same {} snapshots", commits.len()),
            *b,
        ),
        Some(Err(e)) => na("baseline: git packed, the same snapshots", e),
        None => {}
    }
    match &git_full_bytes {
        Some(Ok(b)) => srow(
            &format!("git packed, clone of HEAD ({reachable} commits)"),
            *b,
        ),
        Some(Err(e)) => na(
            &format!("git packed, clone of HEAD ({reachable} commits)"),
            e,
        ),
        None => {}
    }
    match &restic_result {
        Some(Ok(r)) => srow(
            &format!(
                "restic repo v2, compression auto ({}), {} snapshots",
                r.version.trim_start_matches("restic "),
                commits.len()
            ),
            r.bytes,
        ),
        Some(Err(e)) => na("restic repo v2", e),
        None => {}
    }
    srow(
        "distinct file versions, uncompressed (whole-file dedup)",
        distinct_bytes,
    );
    for r in &replays {
        let s = &r.storage;
        let stored = s["readyStoredBytes"].as_u64().unwrap_or(0);
        srow(&format!("CAS readyStoredBytes, {}", r.label), stored);
        note(
            "  readyContentBytes",
            &thousands(s["readyContentBytes"].as_u64().unwrap_or(0)),
        );
        note(
            "  nodeCount / keptVersions",
            &format!(
                "{} / {}",
                thousands(s["nodeCount"].as_u64().unwrap_or(0)),
                s["keptVersions"].as_u64().unwrap_or(0)
            ),
        );
    }

    // ---- per push
    if !replays.is_empty() {
        println!();
        let mut header = format!(
            "  {:<LABEL$}",
            format!("per push ({} pushes)", commits.len())
        );
        for r in &replays {
            header.push_str(&format!("{:>COL$}", short(&r.label)));
        }
        println!("{header}");
        let col =
            |f: &dyn Fn(&Replay) -> String| -> Vec<String> { replays.iter().map(f).collect() };
        let rest = |r: &Replay| -> Vec<Push> { r.pushes.iter().skip(1).cloned().collect() };
        // One row per key of a per-push count: its mean over the pushes, and the first push's.
        let by_key = |pick: &dyn Fn(&Push) -> &BTreeMap<String, u64>| {
            let keys: BTreeSet<&String> = replays
                .iter()
                .flat_map(|r| r.pushes.iter().flat_map(|p| pick(p).keys()))
                .collect();
            for k in keys {
                row(
                    &format!("  {k}, mean (first push)"),
                    &col(&|r| {
                        let v: Vec<u64> = r
                            .pushes
                            .iter()
                            .map(|p| pick(p).get(k).copied().unwrap_or(0))
                            .collect();
                        format!("{:.2} ({})", mean(&v), v[0])
                    }),
                );
            }
        };
        row(
            "uploaded bytes, first push",
            &col(&|r| thousands(r.pushes[0].uploaded_bytes)),
        );
        row(
            "  baseline: its tar body",
            &col(&|r| thousands(r.pushes[0].received_bytes)),
        );
        row(
            "uploaded bytes, pushes 2.., total",
            &col(&|r| thousands(rest(r).iter().map(|p| p.uploaded_bytes).sum())),
        );
        row(
            "  mean / p50 / p99",
            &col(&|r| stats_u64(&rest(r).iter().map(|p| p.uploaded_bytes).collect::<Vec<_>>())),
        );
        row(
            "  baseline: tar bodies, mean / p50 / p99",
            &col(&|r| stats_u64(&rest(r).iter().map(|p| p.received_bytes).collect::<Vec<_>>())),
        );
        row(
            "  uploaded / tar body, pushes 2..",
            &col(&|r| {
                let up: u64 = rest(r).iter().map(|p| p.uploaded_bytes).sum();
                let body: u64 = rest(r).iter().map(|p| p.received_bytes).sum();
                format!("{:.4}", up as f64 / body.max(1) as f64)
            }),
        );
        row(
            "uploaded bytes, all pushes (total)",
            &col(&|r| thousands(r.pushes.iter().map(|p| p.uploaded_bytes).sum())),
        );
        row(
            "uploaded nodes per push, mean / p50 / p99",
            &col(&|r| {
                stats_u64(
                    &r.pushes
                        .iter()
                        .map(|p| p.uploaded_nodes)
                        .collect::<Vec<_>>(),
                )
            }),
        );
        let lat = |r: &Replay| -> Vec<Duration> { r.pushes.iter().map(|p| p.latency).collect() };
        row(
            "save latency, ms: p50 / p99 / mean",
            &col(&|r| {
                let l = lat(r);
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    ms(pct(&l, 0.5).unwrap_or_default()),
                    ms(pct(&l, 0.99).unwrap_or_default()),
                    l.iter().map(|d| ms(*d)).sum::<f64>() / l.len() as f64
                )
            }),
        );
        row(
            "  first push, ms",
            &col(&|r| format!("{:.0}", ms(r.pushes[0].latency))),
        );
        row(
            &format!("read a file of an old version ({OLD_READS}), ms: p50 / p99 / mean"),
            &col(&|r| {
                let l = &r.old_reads;
                format!(
                    "{:.1} / {:.1} / {:.1}",
                    ms(pct(l, 0.5).unwrap_or_default()),
                    ms(pct(l, 0.99).unwrap_or_default()),
                    l.iter().map(|d| ms(*d)).sum::<f64>() / l.len().max(1) as f64
                )
            }),
        );
        if let Some(Ok(rs)) = &restic_result {
            let l = &rs.backups;
            let base = format!(
                "{:.0} / {:.0} / {:.0}",
                ms(pct(l, 0.5).unwrap_or_default()),
                ms(pct(l, 0.99).unwrap_or_default()),
                l.iter().map(|d| ms(*d)).sum::<f64>() / l.len() as f64
            );
            row(
                "  baseline: restic backup of the tree, ms",
                &col(&|_| base.clone()),
            );
            row(
                "  hub p50 / restic p50",
                &col(&|r| {
                    format!(
                        "{:.3}",
                        ms(pct(&lat(r), 0.5).unwrap_or_default())
                            / ms(pct(l, 0.5).unwrap_or_default()).max(1e-9)
                    )
                }),
            );
        }
        let totals = |r: &Replay| -> Vec<u64> {
            r.pushes
                .iter()
                .map(|p| p.store.values().sum::<u64>())
                .collect()
        };
        let measured = replays.iter().all(|r| r.measured_store);
        row(
            if measured {
                "object-store requests (S3, counted at a proxy), mean / p50 / p99"
            } else {
                "object-store requests (filesystem store, the CAS's count), mean / p50 / p99"
            },
            &col(&|r| stats_u64(&totals(r))),
        );
        row("  first push", &col(&|r| thousands(totals(r)[0])));
        row(
            "  max",
            &col(&|r| thousands(totals(r).iter().copied().max().unwrap_or(0))),
        );
        by_key(&|p| &p.store);
        row(
            "  baseline: files per commit (a full copy writes each)",
            &col(&|_| format!("{mean_files:.1}")),
        );
        row(
            "  requests / files per commit",
            &col(&|r| format!("{:.4}", mean(&totals(r)) / mean_files)),
        );
        row(
            "CAS API requests per push (/metrics), mean / p50 / p99",
            &col(&|r| {
                stats_u64(
                    &r.pushes
                        .iter()
                        .map(|p| p.cas.values().sum::<u64>())
                        .collect::<Vec<_>>(),
                )
            }),
        );
        by_key(&|p| &p.cas);
        // Per-push cross-check of what the hub counted against the git trees.
        row(
            "pushes whose size_bytes/file_count differ from git",
            &col(&|r| {
                thousands(
                    r.pushes
                        .iter()
                        .zip(&commits)
                        .filter(|(p, c)| p.size_bytes != c.bytes || p.file_count != c.files)
                        .count() as u64,
                )
            }),
        );
    }

    // ---- verdict
    println!();
    println!("verdict");
    for r in &replays {
        let stored = r.storage["readyStoredBytes"].as_u64().unwrap_or(0);
        let ratio = stored as f64 / full_copies as f64;
        println!(
            "  CAS stored / full copies ({}): {:.4}  (requirement <= 0.1: {})",
            r.label,
            ratio,
            if ratio <= 0.1 { "met" } else { "NOT met" }
        );
        if let Some(g) = git_base {
            let q = stored as f64 / g as f64;
            println!(
                "  CAS stored / git packed ({}): {:.2}  (goal <= 1: {}{})",
                r.label,
                q,
                if q <= 1.0 { "met" } else { "not met" },
                if q > 1.0 {
                    format!(", {} over git", mb(stored - g))
                } else {
                    String::new()
                }
            );
        }
    }
    if let Some(g) = git_base {
        println!(
            "  note: the CAS cuts notebooks at their cells and other text into chunks of a few \
             KiB, stores each distinct chunk once (the distinct file versions hold {} here), \
             plus one tree node per changed directory and one version node per push; with the \
             defaults each object is zstd-compressed and a changed chunk, file or directory is \
             kept as a delta against the one it replaces. git also compresses many objects \
             together in a pack ({} here): chunks compressed one by one lose that context, which \
             is what packs of small nodes would recover.",
            mb(distinct_bytes),
            mb(g)
        );
    }
    println!("\n(total run time {:.0} s)", t0.elapsed().as_secs_f64());
    Ok(())
}
