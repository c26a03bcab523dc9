//! Commands that talk to a service: `put`, `get`, `stat`, `tree put|get`, `refs add|remove|list`,
//! `usage`, `gc`, `export`, `import`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use cas_format::{Hash, RequestId};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::Connection;
use crate::capability::{CapabilityProvider, FixedToken};
use crate::client::AppCasClient;
use crate::dag::Progress;

/// Options of commands that store data.
#[derive(Debug, Clone, Args)]
pub struct StoreOptions {
    /// How long stored nodes stay leased, in ms.
    #[arg(long, default_value_t = 15 * 60 * 1000)]
    pub lease_ms: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
}

#[derive(Debug, Subcommand)]
pub enum TreeCommand {
    /// Store a directory as a tree; print its hash.
    Put {
        dir: PathBuf,
        #[command(flatten)]
        store: StoreOptions,
    },
    /// Write the tree HASH into DIR (which must not exist or be empty).
    Get {
        hash: Hash,
        dir: PathBuf,
        #[arg(long, default_value_t = 8)]
        parallel: usize,
    },
}

#[derive(Debug, Subcommand)]
pub enum RefsCommand {
    /// Add one root ref to each HASH, as one idempotent update.
    Add {
        #[arg(required = true)]
        hashes: Vec<Hash>,
        #[arg(long)]
        request_id: RequestId,
    },
    /// Remove one root ref from each HASH, as one idempotent update.
    Remove {
        #[arg(required = true)]
        hashes: Vec<Hash>,
        #[arg(long)]
        request_id: RequestId,
    },
    /// List the Space's root-ref balances (all pages, read at one revision).
    List,
}

/// A progress bar on stderr when it is a terminal; nothing in pipes.
fn progress_bar(what: &'static str, total: Option<u64>) -> (Option<ProgressBar>, Option<Progress>) {
    if !std::io::stderr().is_terminal() {
        return (None, None);
    }
    let bar = match total {
        Some(t) => ProgressBar::new(t).with_style(
            ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{msg} {spinner} {bytes} {bytes_per_sec} ({pos} nodes)")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    };
    bar.set_message(what);
    bar.enable_steady_tick(Duration::from_millis(120));
    let b = bar.clone();
    let counted_nodes = total.is_none();
    let cb: Progress = Arc::new(move |bytes, nodes| {
        b.set_position(if counted_nodes { nodes } else { bytes });
        if counted_nodes {
            b.set_message(format!("{what} {}", indicatif::HumanBytes(bytes)));
        }
    });
    (Some(bar), Some(cb))
}

fn finish(bar: Option<ProgressBar>) {
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

impl Connection {
    /// A client of the service for the App.
    pub fn client(&self) -> anyhow::Result<AppCasClient> {
        let app = self.app()?;
        let provider: Arc<dyn CapabilityProvider> = match &self.token {
            Some(t) => Arc::new(FixedToken(t.clone())),
            None => Arc::new(self.signing_key().context(
                "give --token, or --signing-key with --kid and --issuer (or their UNICAS_* variables)",
            )?),
        };
        Ok(AppCasClient::new(self.server.clone(), app, provider)?)
    }
}

pub async fn put(
    c: &Connection,
    json: bool,
    file: PathBuf,
    store: StoreOptions,
) -> anyhow::Result<Vec<u8>> {
    let client = c.client()?;
    let space = c.space()?;
    let size = std::fs::metadata(&file)
        .with_context(|| format!("cannot read {}", file.display()))?
        .len();
    let (bar, progress) = progress_bar("uploading", Some(size));
    let result = client
        .store_file(&space, &file, store.lease_ms, store.parallel, progress)
        .await;
    finish(bar);
    let (f, report) = result?;
    Ok(if json {
        format!(
            "{}\n",
            json!({"hash": f.node, "size": f.size, "chunked": f.chunked, "nodes": report.nodes,
                   "uploadedNodes": report.uploaded_nodes, "uploadedBytes": report.uploaded_bytes})
        )
    } else {
        format!("{}\n", f.node)
    }
    .into_bytes())
}

pub async fn get(c: &Connection, hash: Hash, output: Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    let client = c.client()?;
    let space = c.space()?;
    match output {
        Some(path) => {
            let tmp = path.with_extension("unicas-partial");
            let file = tokio::fs::File::create(&tmp)
                .await
                .with_context(|| format!("cannot create {}", tmp.display()))?;
            let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
            let (bar, progress) = progress_bar("downloading", None);
            let result = client.read_file(&space, &hash, &mut out).await;
            finish(bar);
            let _ = progress;
            if let Err(e) = result {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e.into());
            }
            tokio::io::AsyncWriteExt::flush(&mut out).await?;
            tokio::fs::rename(&tmp, &path)
                .await
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(Vec::new())
        }
        None => {
            // Stream to stdout; a failure midway still exits non-zero.
            let mut out = tokio::io::stdout();
            client.read_file(&space, &hash, &mut out).await?;
            Ok(Vec::new())
        }
    }
}

pub async fn stat(c: &Connection, json: bool, hash: Hash) -> anyhow::Result<Vec<u8>> {
    let m = c.client()?.read_metadata(&c.space()?, &hash).await?;
    if json {
        return Ok(format!("{}\n", serde_json::to_string(&m)?).into_bytes());
    }
    let mut out = format!(
        "hash {}\nsize {}\ncontent-type {}\nrefs {}\nchild-refs {}\nroot-refs {}\nlease-expires-at {}\n",
        m.metadata.hash,
        m.metadata.size,
        m.metadata.content_type,
        m.metadata.refs.len(),
        m.state.child_ref_count,
        m.state.root_ref_count,
        m.state.lease_expires_at
    );
    for r in &m.metadata.refs {
        out.push_str(&format!("ref {r}\n"));
    }
    Ok(out.into_bytes())
}

pub async fn tree(c: &Connection, json: bool, cmd: TreeCommand) -> anyhow::Result<Vec<u8>> {
    let client = c.client()?;
    let space = c.space()?;
    match cmd {
        TreeCommand::Put { dir, store } => {
            let (bar, progress) = progress_bar("uploading", None);
            let result = client
                .store_tree(&space, &dir, store.lease_ms, store.parallel, progress)
                .await;
            finish(bar);
            let (hash, report, total) = result?;
            Ok(if json {
                format!(
                    "{}\n",
                    json!({"hash": hash, "nodes": report.nodes, "uploadedNodes": report.uploaded_nodes,
                           "uploadedBytes": report.uploaded_bytes, "treeBytes": total})
                )
            } else {
                format!("{hash}\n")
            }
            .into_bytes())
        }
        TreeCommand::Get {
            hash,
            dir,
            parallel,
        } => {
            let (bar, progress) = progress_bar("downloading", None);
            let result = client
                .materialize_tree(&space, &hash, &dir, parallel, progress)
                .await;
            finish(bar);
            let written = result?;
            Ok(if json {
                format!("{}\n", json!({"hash": hash, "bytes": written})).into_bytes()
            } else {
                Vec::new()
            })
        }
    }
}

pub async fn refs(c: &Connection, json: bool, cmd: RefsCommand) -> anyhow::Result<Vec<u8>> {
    let client = c.client()?;
    let space = c.space()?;
    let update = |hashes: Vec<Hash>, delta: i64| -> anyhow::Result<BTreeMap<Hash, i64>> {
        let mut changes = BTreeMap::new();
        for h in hashes {
            if changes.insert(h, delta).is_some() {
                bail!("{h} is given twice");
            }
        }
        Ok(changes)
    };
    let (changes, request_id) = match cmd {
        RefsCommand::Add { hashes, request_id } => (update(hashes, 1)?, request_id),
        RefsCommand::Remove { hashes, request_id } => (update(hashes, -1)?, request_id),
        RefsCommand::List => {
            let mut out = String::new();
            let mut items = Vec::new();
            let mut cursor: Option<String> = None;
            let revision = loop {
                let page = client
                    .list_root_refs(&space, 200, cursor.as_deref())
                    .await?;
                items.extend(page.items);
                match page.next_cursor {
                    Some(c) => cursor = Some(c),
                    None => break page.revision,
                }
            };
            if json {
                out = format!("{}\n", json!({"revision": revision, "items": items}));
            } else {
                for i in items {
                    out.push_str(&format!("{} {}\n", i.hash, i.ref_count));
                }
            }
            return Ok(out.into_bytes());
        }
    };
    let r = client
        .update_root_refs(&space, &request_id, changes)
        .await?;
    Ok(if json {
        format!("{}\n", serde_json::to_string(&r)?)
    } else {
        format!(
            "revision {}{}\n",
            r.revision,
            if r.idempotent { " (replayed)" } else { "" }
        )
    }
    .into_bytes())
}

pub async fn usage(c: &Connection, json: bool) -> anyhow::Result<Vec<u8>> {
    let u = c.client()?.usage(&c.space()?).await?;
    Ok(if json {
        format!("{}\n", serde_json::to_string(&u)?)
    } else {
        format!(
            "nodes {}\nnot-ready-nodes {}\nleased-nodes {}\nready-content-bytes {}\nready-stored-bytes {}\nreserved-bytes {}\n",
            u.node_count, u.not_ready_node_count, u.leased_node_count, u.ready_content_bytes, u.ready_stored_bytes, u.reserved_bytes
        )
    }
    .into_bytes())
}

pub async fn gc(c: &Connection, json: bool, max_nodes: Option<u32>) -> anyhow::Result<Vec<u8>> {
    let r = c.client()?.gc(&c.space()?, max_nodes).await?;
    Ok(if json {
        format!("{}\n", serde_json::to_string(&r)?)
    } else {
        format!(
            "examined {}\ndeleted {}\nreclaimed-content-bytes {}\n",
            r.examined, r.deleted, r.reclaimed_content_bytes
        )
    }
    .into_bytes())
}

pub async fn export(
    c: &Connection,
    json: bool,
    roots: Vec<Hash>,
    output: PathBuf,
) -> anyhow::Result<Vec<u8>> {
    let client = c.client()?;
    let space = c.space()?;
    let (bar, progress) = progress_bar("exporting", None);
    let result = client.export(&space, &roots, &output, progress).await;
    finish(bar);
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&output);
            return Err(e.into());
        }
    };
    Ok(if json {
        format!(
            "{}\n",
            json!({"roots": r.roots, "nodes": r.nodes, "bytes": r.bytes})
        )
        .into_bytes()
    } else {
        Vec::new()
    })
}

pub async fn import(
    c: &Connection,
    json: bool,
    file: PathBuf,
    retain: bool,
    request_id: Option<RequestId>,
    store: StoreOptions,
) -> anyhow::Result<Vec<u8>> {
    let client = c.client()?;
    let space = c.space()?;
    let retain = match (retain, request_id) {
        (true, Some(id)) => Some(id),
        (true, None) => bail!(
            "--retain needs --request-id (a deterministic id makes a repeated import idempotent)"
        ),
        (false, Some(_)) => bail!("--request-id is only used with --retain"),
        (false, None) => None,
    };
    let (bar, progress) = progress_bar("importing", None);
    let result = client
        .import(
            &space,
            &file,
            retain.as_ref(),
            store.lease_ms,
            store.parallel,
            progress,
        )
        .await;
    finish(bar);
    let r = result?;
    Ok(if json {
        format!(
            "{}\n",
            json!({"roots": r.roots, "nodes": r.nodes, "uploadedNodes": r.uploaded_nodes,
                   "uploadedBytes": r.uploaded_bytes,
                   "revision": r.retained.map(|(rev, _)| rev), "replayed": r.retained.map(|(_, idem)| idem)})
        )
        .into_bytes()
    } else {
        r.roots
            .iter()
            .map(|h| format!("{h}\n"))
            .collect::<String>()
            .into_bytes()
    })
}
