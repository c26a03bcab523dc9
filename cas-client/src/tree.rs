//! Directories as trees of nodes.
//!
//! A directory is an SValue node
//!
//! ```text
//! {"kind": "dir", "entries": {
//!     "<name>": {"kind": "file", "node": SBlob, "size": n, "chunked": bool, "executable": bool},
//!     "<name>": {"kind": "dir", "node": SBlob},
//!     "<name>": {"kind": "symlink", "target": "<path>"}}}
//! ```
//!
//! where a file's node is a leaf or a chunked-file index (see [`crate::files`]). A directory
//! with more than [`TREE_FANOUT`] entries is split, in name order, into parts of at most that
//! many entries, listed by `{"kind": "dir-parts", "parts": [SBlob, ...]}` (nested again beyond
//! 256 parts), so any directory respects the 256-ref limit. An unchanged subtree keeps its hash,
//! so a new version of a tree uploads only what changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cas_format::{Hash, SpaceId, Value};
use futures_util::{StreamExt, TryStreamExt};

use crate::client::AppCasClient;
use crate::dag::{DagReport, Plan, Progress, Uploader};
use crate::error::ClientError;
use crate::files::{FileRef, plan_file, svalue_node};
pub use crate::tree_edit::{Change, TreeStats, WalkedEntry};
pub use crate::tree_plan::plan_dir;

/// Entries of one directory node.
pub const TREE_FANOUT: usize = 256;

/// One entry of a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    File { file: FileRef, executable: bool },
    Dir { node: Hash },
    Symlink { target: String },
}

fn entry_value(e: &Entry) -> Value {
    match e {
        Entry::File { file, executable } => Value::map([
            ("kind", Value::from("file")),
            ("node", Value::Blob(file.node)),
            ("size", Value::from(file.size as i64)),
            ("chunked", Value::Bool(file.chunked)),
            ("executable", Value::Bool(*executable)),
        ]),
        Entry::Dir { node } => {
            Value::map([("kind", Value::from("dir")), ("node", Value::Blob(*node))])
        }
        Entry::Symlink { target } => Value::map([
            ("kind", Value::from("symlink")),
            ("target", Value::from(target.as_str())),
        ]),
    }
}

/// Whether `name` may be a directory entry: a single path component.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

/// Longest path inside a tree, in bytes (`/`-separated).
pub const MAX_PATH_BYTES: usize = 1024;
/// Deepest path inside a tree, in components.
pub const MAX_PATH_DEPTH: usize = 64;
/// Most `dir-parts` levels above one directory's entry nodes (256⁴ entries is far beyond any
/// tree this client writes).
pub const MAX_PART_LEVELS: usize = 4;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("{0:?} is not a file path")]
    Empty(String),
    #[error("{0:?} is deeper than {MAX_PATH_DEPTH} directories")]
    TooDeep(String),
    #[error("{path:?}: invalid path component {component:?}")]
    Component { path: String, component: String },
}

/// Splits a relative, `/`-separated path into its components: a leading `./` and empty
/// components are dropped; `.`, `..`, NUL, over-long components, more than
/// [`MAX_PATH_DEPTH`] components or more than [`MAX_PATH_BYTES`] bytes are refused, so a
/// parsed path can only name something below the tree's root.
pub fn parse_path(path: &str) -> Result<Vec<String>, PathError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong);
    }
    let parts: Vec<String> = path
        .trim_start_matches("./")
        .split('/')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    if parts.is_empty() {
        return Err(PathError::Empty(path.to_string()));
    }
    if parts.len() > MAX_PATH_DEPTH {
        return Err(PathError::TooDeep(path.to_string()));
    }
    if let Some(bad) = parts.iter().find(|p| !valid_name(p)) {
        return Err(PathError::Component {
            path: path.to_string(),
            component: bad.clone(),
        });
    }
    Ok(parts)
}

/// Adds the node(s) of a directory with `entries` to `plan`; returns its hash.
pub fn plan_entries(
    plan: &mut Plan,
    entries: &BTreeMap<String, Entry>,
) -> Result<Hash, ClientError> {
    let all: Vec<(&String, &Entry)> = entries.iter().collect();
    if all.len() <= TREE_FANOUT {
        let value = Value::map([
            (
                "entries",
                Value::Map(
                    all.iter()
                        .map(|(n, e)| ((*n).clone(), entry_value(e)))
                        .collect(),
                ),
            ),
            ("kind", Value::from("dir")),
        ]);
        return plan.add_portable(svalue_node(&value)?);
    }
    let mut level: Vec<Hash> = Vec::new();
    for group in all.chunks(TREE_FANOUT) {
        let value = Value::map([
            (
                "entries",
                Value::Map(
                    group
                        .iter()
                        .map(|(n, e)| ((*n).clone(), entry_value(e)))
                        .collect(),
                ),
            ),
            ("kind", Value::from("dir")),
        ]);
        level.push(plan.add_portable(svalue_node(&value)?)?);
    }
    loop {
        let mut next = Vec::new();
        for group in level.chunks(TREE_FANOUT) {
            let value = Value::map([
                ("kind", Value::from("dir-parts")),
                (
                    "parts",
                    Value::Array(group.iter().map(|h| Value::Blob(*h)).collect()),
                ),
            ]);
            next.push(plan.add_portable(svalue_node(&value)?)?);
        }
        if next.len() == 1 {
            return Ok(next[0]);
        }
        level = next;
    }
}

fn parse_entry(hash: &Hash, name: &str, v: &Value) -> Result<Entry, ClientError> {
    let bad =
        |what: &str| ClientError::Protocol(format!("directory {hash}: entry {name:?}: {what}"));
    match v.get("kind").and_then(Value::as_str) {
        Some("file") => {
            let node = v
                .get("node")
                .and_then(Value::as_blob)
                .ok_or_else(|| bad("no node"))?;
            let size = v
                .get("size")
                .and_then(Value::as_i64)
                .filter(|s| *s >= 0)
                .ok_or_else(|| bad("no size"))? as u64;
            let chunked = v.get("chunked").and_then(Value::as_bool).unwrap_or(false);
            let executable = v
                .get("executable")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            Ok(Entry::File {
                file: FileRef {
                    node,
                    size,
                    chunked,
                },
                executable,
            })
        }
        Some("dir") => Ok(Entry::Dir {
            node: v
                .get("node")
                .and_then(Value::as_blob)
                .ok_or_else(|| bad("no node"))?,
        }),
        Some("symlink") => Ok(Entry::Symlink {
            target: v
                .get("target")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("no target"))?
                .to_string(),
        }),
        other => Err(bad(&format!("unknown kind {other:?}"))),
    }
}

/// A directory node: its entries, or the parts that hold them.
pub(crate) enum DirNode {
    Entries(BTreeMap<String, Entry>),
    Parts(Vec<Hash>),
}

/// Reads the decoded directory node `hash`.
pub(crate) fn parse_dir_node(hash: &Hash, value: &Value) -> Result<DirNode, ClientError> {
    match value.get("kind").and_then(Value::as_str) {
        Some("dir") => {
            let entries = value
                .get("entries")
                .and_then(Value::as_map)
                .ok_or_else(|| ClientError::Protocol(format!("directory {hash} has no entries")))?;
            entries
                .iter()
                .map(|(name, v)| {
                    if !valid_name(name) {
                        return Err(ClientError::Protocol(format!(
                            "directory {hash}: invalid name {name:?}"
                        )));
                    }
                    Ok((name.clone(), parse_entry(hash, name, v)?))
                })
                .collect::<Result<_, _>>()
                .map(DirNode::Entries)
        }
        Some("dir-parts") => value
            .get("parts")
            .and_then(Value::as_array)
            .ok_or_else(|| ClientError::Protocol(format!("directory {hash} has no parts")))?
            .iter()
            .map(|p| {
                p.as_blob()
                    .ok_or_else(|| ClientError::Protocol(format!("directory {hash}: bad part")))
            })
            .collect::<Result<_, _>>()
            .map(DirNode::Parts),
        other => Err(ClientError::Protocol(format!(
            "node {hash} is not a directory (kind {other:?})"
        ))),
    }
}

impl AppCasClient {
    /// The entries of the directory node `hash`, its parts merged.
    pub async fn read_dir(
        &self,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<BTreeMap<String, Entry>, ClientError> {
        self.read_dir_at(space, hash, 0).await
    }

    /// As [`Self::read_dir`], `level` parts deep (bounded by [`MAX_PART_LEVELS`]).
    fn read_dir_at<'a>(
        &'a self,
        space: &'a SpaceId,
        hash: &'a Hash,
        level: usize,
    ) -> futures_util::future::BoxFuture<'a, Result<BTreeMap<String, Entry>, ClientError>> {
        Box::pin(async move {
            let content = self.read_svalue_node(space, hash).await?;
            let (value, _) = cas_format::svalue::decode(&content)
                .map_err(|e| ClientError::Protocol(format!("directory {hash}: {e}")))?;
            match parse_dir_node(hash, &value)? {
                DirNode::Entries(entries) => Ok(entries),
                DirNode::Parts(parts) => {
                    if level >= MAX_PART_LEVELS {
                        return Err(ClientError::Protocol(format!(
                            "directory {hash}: parts nested more than {MAX_PART_LEVELS} deep"
                        )));
                    }
                    let mut merged = BTreeMap::new();
                    for p in parts {
                        for (name, e) in self.read_dir_at(space, &p, level + 1).await? {
                            if merged.insert(name.clone(), e).is_some() {
                                return Err(ClientError::Protocol(format!(
                                    "directory {hash}: {name:?} twice"
                                )));
                            }
                        }
                    }
                    Ok(merged)
                }
            }
        })
    }

    /// Stores the directory at `dir` as a tree; returns its hash and what was uploaded.
    pub async fn store_tree(
        &self,
        space: &SpaceId,
        dir: &Path,
        lease_ms: u64,
        parallelism: usize,
        progress: Option<Progress>,
    ) -> Result<(Hash, DagReport, u64), ClientError> {
        let dir = dir.to_path_buf();
        let (plan, root) = tokio::task::spawn_blocking(move || {
            let mut plan = Plan::default();
            plan_dir(&mut plan, &dir).map(|root| (plan, root))
        })
        .await
        .map_err(|e| ClientError::Invalid(format!("planning failed: {e}")))??;
        let mut uploader = Uploader::new(self, space, &plan, lease_ms, parallelism);
        if let Some(p) = progress {
            uploader = uploader.with_progress(p);
        }
        let report = uploader.run(&[root]).await?;
        Ok((root, report, plan.bytes()))
    }

    /// Stores the file at `path`; returns it and what was uploaded.
    pub async fn store_file(
        &self,
        space: &SpaceId,
        path: &Path,
        lease_ms: u64,
        parallelism: usize,
        progress: Option<Progress>,
    ) -> Result<(FileRef, DagReport), ClientError> {
        let path = path.to_path_buf();
        let (plan, file) = tokio::task::spawn_blocking(move || {
            let mut plan = Plan::default();
            plan_file(&mut plan, &path).map(|f| (plan, f))
        })
        .await
        .map_err(|e| ClientError::Invalid(format!("planning failed: {e}")))??;
        let mut uploader = Uploader::new(self, space, &plan, lease_ms, parallelism);
        if let Some(p) = progress {
            uploader = uploader.with_progress(p);
        }
        let report = uploader.run(&[file.node]).await?;
        Ok((file, report))
    }

    /// Stores `len` bytes of the open spool `file` (from its start) as a file; returns it and
    /// what was uploaded. The file is read only through its handle.
    pub async fn store_spooled(
        &self,
        space: &SpaceId,
        file: std::fs::File,
        len: u64,
        lease_ms: u64,
        parallelism: usize,
    ) -> Result<(FileRef, DagReport), ClientError> {
        let file = Arc::new(file);
        let (plan, file_ref) = tokio::task::spawn_blocking(move || {
            let mut plan = Plan::default();
            crate::files::plan_spooled(&mut plan, &file, 0, len).map(|f| (plan, f))
        })
        .await
        .map_err(|e| ClientError::Invalid(format!("planning failed: {e}")))??;
        let report = Uploader::new(self, space, &plan, lease_ms, parallelism)
            .run(&[file_ref.node])
            .await?;
        Ok((file_ref, report))
    }

    /// Writes the tree `hash` into `dest`, which must not exist or be an empty directory.
    /// Returns the bytes of file content written.
    pub async fn materialize_tree(
        &self,
        space: &SpaceId,
        hash: &Hash,
        dest: &Path,
        parallelism: usize,
        progress: Option<Progress>,
    ) -> Result<u64, ClientError> {
        match std::fs::read_dir(dest) {
            Ok(mut it) => {
                if it.next().is_some() {
                    return Err(ClientError::Invalid(format!(
                        "{} is not empty",
                        dest.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ClientError::io(
                    format!("cannot read {}", dest.display()),
                    e,
                ));
            }
        }
        let written = Arc::new(AtomicU64::new(0));
        self.materialize_dir(
            space,
            *hash,
            dest.to_path_buf(),
            parallelism.max(1),
            written.clone(),
            progress,
        )
        .await?;
        Ok(written.load(Ordering::Relaxed))
    }

    fn materialize_dir(
        &self,
        space: &SpaceId,
        hash: Hash,
        dest: PathBuf,
        parallelism: usize,
        written: Arc<AtomicU64>,
        progress: Option<Progress>,
    ) -> futures_util::future::BoxFuture<'_, Result<(), ClientError>> {
        let space = space.clone();
        Box::pin(async move {
            tokio::fs::create_dir_all(&dest)
                .await
                .map_err(|e| ClientError::io(format!("cannot create {}", dest.display()), e))?;
            let entries = self.read_dir(&space, &hash).await?;
            let mut dirs = Vec::new();
            let mut files = Vec::new();
            for (name, entry) in entries {
                let path = dest.join(&name);
                match entry {
                    Entry::Dir { node } => dirs.push((node, path)),
                    Entry::Symlink { target } => {
                        tokio::fs::symlink(&target, &path).await.map_err(|e| {
                            ClientError::io(format!("cannot create {}", path.display()), e)
                        })?
                    }
                    Entry::File { file, executable } => files.push((file, executable, path)),
                }
            }
            futures_util::stream::iter(files)
                .map(|(file, executable, path)| {
                    let (space, written, progress) =
                        (space.clone(), written.clone(), progress.clone());
                    async move {
                        let n = self.write_file(&space, &file, executable, &path).await?;
                        let total = written.fetch_add(n, Ordering::Relaxed) + n;
                        if let Some(p) = &progress {
                            p(total, 0);
                        }
                        Ok::<(), ClientError>(())
                    }
                })
                .buffer_unordered(parallelism)
                .try_collect::<Vec<()>>()
                .await?;
            for (node, path) in dirs {
                self.materialize_dir(
                    &space,
                    node,
                    path,
                    parallelism,
                    written.clone(),
                    progress.clone(),
                )
                .await?;
            }
            Ok(())
        })
    }

    async fn write_file(
        &self,
        space: &SpaceId,
        file: &FileRef,
        executable: bool,
        path: &Path,
    ) -> Result<u64, ClientError> {
        let out = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .await
            .map_err(|e| ClientError::io(format!("cannot create {}", path.display()), e))?;
        let mut out = tokio::io::BufWriter::with_capacity(1 << 20, out);
        let n = self.read_file_ref(space, file, &mut out).await?;
        tokio::io::AsyncWriteExt::flush(&mut out)
            .await
            .map_err(|e| ClientError::io(format!("cannot write {}", path.display()), e))?;
        if n != file.size {
            return Err(ClientError::Protocol(format!(
                "{}: {n} bytes, the tree says {}",
                path.display(),
                file.size
            )));
        }
        if executable {
            use std::os::unix::fs::PermissionsExt;
            let mut perms = tokio::fs::metadata(path)
                .await
                .map_err(|e| ClientError::io(format!("cannot stat {}", path.display()), e))?
                .permissions();
            perms.set_mode(perms.mode() | 0o111);
            tokio::fs::set_permissions(path, perms)
                .await
                .map_err(|e| ClientError::io(format!("cannot chmod {}", path.display()), e))?;
        }
        Ok(n)
    }
}

impl AppCasClient {
    /// The entry at `path` (components) below the tree `root`, if any.
    pub async fn lookup_path(
        &self,
        space: &SpaceId,
        root: &Hash,
        path: &[String],
    ) -> Result<Option<Entry>, ClientError> {
        let mut dir = *root;
        for (i, name) in path.iter().enumerate() {
            let mut entries = self.read_dir(space, &dir).await?;
            match entries.remove(name) {
                None => return Ok(None),
                Some(e) if i + 1 == path.len() => return Ok(Some(e)),
                Some(Entry::Dir { node }) => dir = node,
                Some(_) => return Ok(None),
            }
        }
        Ok(Some(Entry::Dir { node: *root }))
    }
}
