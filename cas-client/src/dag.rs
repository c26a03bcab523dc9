//! Storing a DAG: a [`Plan`] says what every node is and where its bytes come from; an
//! [`Uploader`] makes the Space hold it, uploading only what is not ready.
//!
//! The walk is top-down and lease-first: a node that is already ready is leased and its
//! descendants are left alone (the node's child counts protect them). A node that is missing
//! gets each distinct direct child ensured (leased, or uploaded) first, then its own bytes
//! uploaded, then a second lease that publishes it; so every child is leased before its new
//! parent and GC cannot take it in between. Each distinct node is handled once per run, the
//! network calls are bounded by a semaphore, and a child that went missing before its parent
//! was published (its lease ran out) is stored again.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use cas_format::wire::LeaseResponse;
use cas_format::{ContentType, Hash, NodeDescriptor, NodeLimits, SpaceId, decode_portable};
use futures_util::future::{BoxFuture, try_join_all};
use tokio::sync::{OnceCell, Semaphore};

use crate::client::AppCasClient;
use crate::error::ClientError;
use crate::store::Ensured;

/// Where a planned node's bytes come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// The portable full node, in memory.
    Portable(Bytes),
    /// An `application/octet-stream` leaf whose content is a slice of a file, read when (and
    /// only if) it has to be uploaded. The file must still be what `stamp` says it was when it
    /// was planned; the service checks the bytes against the hash in any case.
    FileSlice {
        path: PathBuf,
        offset: u64,
        len: u64,
        stamp: FileStamp,
    },
    /// An `application/octet-stream` leaf whose content is a slice of an open spool file
    /// (never re-opened by name, so nothing can redirect it).
    Spooled {
        file: Arc<File>,
        offset: u64,
        len: u64,
    },
}

/// What a file was when it was planned: its length and when it was last modified. A file
/// whose stamp differs when its slices are read again changed meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    pub len: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

/// One node of a plan.
#[derive(Debug, Clone)]
pub struct PlannedNode {
    pub refs: Vec<Hash>,
    pub source: Source,
    /// Length of the portable node.
    pub portable_len: u64,
}

/// The nodes of a DAG by hash. Refs to nodes outside the plan must be ready in the Space.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub nodes: HashMap<Hash, PlannedNode>,
    /// For some planned nodes, a node of the Space they probably resemble (the previous
    /// version of the same file, chunk or directory), named to the service as `deltaBase`.
    pub delta_bases: HashMap<Hash, Hash>,
}

impl Plan {
    /// Names `base` as the node that the planned node `node` probably resembles.
    pub fn suggest_base(&mut self, node: Hash, base: Hash) {
        if node != base && self.nodes.contains_key(&node) {
            self.delta_bases.insert(node, base);
        }
    }

    /// The base suggested for `node`, if any.
    pub fn delta_base(&self, node: &Hash) -> Option<Hash> {
        self.delta_bases.get(node).copied()
    }

    /// Adds a node given as portable bytes; returns its hash.
    pub fn add_portable(&mut self, portable: Bytes) -> Result<Hash, ClientError> {
        let node = decode_portable(&portable, &NodeLimits::format_max())
            .map_err(|e| ClientError::Invalid(format!("not a portable node: {e}")))?;
        let hash = node.hash;
        let refs = node.descriptor.refs;
        self.nodes.entry(hash).or_insert(PlannedNode {
            refs,
            portable_len: portable.len() as u64,
            source: Source::Portable(portable),
        });
        Ok(hash)
    }

    /// Adds an octet-stream leaf whose content is `len` bytes of `path` at `offset`, the file
    /// being what `stamp` says.
    pub fn add_file_slice(
        &mut self,
        hash: Hash,
        path: PathBuf,
        stamp: FileStamp,
        offset: u64,
        len: u64,
    ) {
        let prefix = leaf_descriptor(len).prefix_len();
        self.nodes.entry(hash).or_insert(PlannedNode {
            refs: Vec::new(),
            portable_len: prefix + len,
            source: Source::FileSlice {
                path,
                offset,
                len,
                stamp,
            },
        });
    }

    /// Adds an octet-stream leaf whose content is `len` bytes of the open `file` at `offset`.
    pub fn add_spooled(&mut self, hash: Hash, file: Arc<File>, offset: u64, len: u64) {
        let prefix = leaf_descriptor(len).prefix_len();
        self.nodes.entry(hash).or_insert(PlannedNode {
            refs: Vec::new(),
            portable_len: prefix + len,
            source: Source::Spooled { file, offset, len },
        });
    }

    /// Adds the nodes and suggested bases of `other` (a node planned in both keeps this
    /// plan's source: the bytes are the same).
    pub fn merge(&mut self, other: Plan) {
        for (hash, node) in other.nodes {
            self.nodes.entry(hash).or_insert(node);
        }
        self.delta_bases.extend(other.delta_bases);
    }

    /// Total portable bytes of the planned nodes.
    pub fn bytes(&self) -> u64 {
        self.nodes.values().map(|n| n.portable_len).sum()
    }
}

/// The descriptor of an `application/octet-stream` leaf of `len` bytes.
pub fn leaf_descriptor(len: u64) -> NodeDescriptor {
    NodeDescriptor::new(ContentType::octet_stream(), Vec::new(), len)
}

/// What storing a DAG did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DagReport {
    /// Distinct nodes the run looked at.
    pub nodes: u64,
    /// Nodes this run uploaded.
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
}

/// Receives progress: bytes uploaded so far and nodes handled.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// Makes a Space hold the DAG of a plan.
pub struct Uploader<'a> {
    pub(crate) client: &'a AppCasClient,
    pub(crate) space: &'a SpaceId,
    pub(crate) plan: &'a Plan,
    pub(crate) lease_ms: u64,
    pub(crate) calls: Semaphore,
    /// Calls in flight at most (the permits of `calls`).
    pub(crate) parallelism: usize,
    done: std::sync::Mutex<HashMap<Hash, Arc<OnceCell<()>>>>,
    nodes: AtomicU64,
    pub(crate) uploaded_nodes: AtomicU64,
    pub(crate) uploaded_bytes: AtomicU64,
    progress: Option<Progress>,
}

impl<'a> Uploader<'a> {
    pub fn new(
        client: &'a AppCasClient,
        space: &'a SpaceId,
        plan: &'a Plan,
        lease_ms: u64,
        parallelism: usize,
    ) -> Self {
        Uploader {
            client,
            space,
            plan,
            lease_ms,
            calls: Semaphore::new(parallelism.max(1)),
            parallelism: parallelism.max(1),
            done: std::sync::Mutex::new(HashMap::new()),
            nodes: AtomicU64::new(0),
            uploaded_nodes: AtomicU64::new(0),
            uploaded_bytes: AtomicU64::new(0),
            progress: None,
        }
    }

    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Makes every root (and so its whole DAG) ready and leased: first in batches
    /// ([`crate::batch`]), then node by node for whatever the batches left (a lease that ran
    /// out meanwhile, a node too large to travel inline); each root is leased once more at the
    /// end, so nothing is taken for ready without the service saying so.
    pub async fn run(&self, roots: &[Hash]) -> Result<DagReport, ClientError> {
        self.run_batched(roots).await?;
        try_join_all(roots.iter().map(|r| self.ensure(*r))).await?;
        Ok(DagReport {
            nodes: self.nodes.load(Ordering::Relaxed),
            uploaded_nodes: self.uploaded_nodes.load(Ordering::Relaxed),
            uploaded_bytes: self.uploaded_bytes.load(Ordering::Relaxed),
        })
    }

    pub(crate) fn cell(&self, hash: Hash) -> Arc<OnceCell<()>> {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(hash)
            .or_default()
            .clone()
    }

    /// Ensures `hash` once per run.
    pub(crate) fn ensure(&self, hash: Hash) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(async move {
            let cell = self.cell(hash);
            cell.get_or_try_init(|| self.ensure_now(hash)).await?;
            Ok(())
        })
    }

    async fn lease(
        &self,
        hash: &Hash,
        upload_bytes: Option<u64>,
    ) -> Result<LeaseResponse, ClientError> {
        let _permit = self
            .calls
            .acquire()
            .await
            .map_err(|_| ClientError::Cancelled)?;
        self.client
            .lease_node_based(
                self.space,
                hash,
                self.lease_ms,
                upload_bytes,
                self.plan.delta_base(hash),
            )
            .await
    }

    pub(crate) fn tick(&self) {
        let nodes = self.nodes.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(p) = &self.progress {
            p(self.uploaded_bytes.load(Ordering::Relaxed), nodes);
        }
    }

    fn ensure_now(&self, hash: Hash) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(async move {
            let Some(node) = self.plan.nodes.get(&hash) else {
                // Outside the plan: it must be ready.
                return match self.lease(&hash, None).await? {
                    LeaseResponse::Ready { .. } => {
                        self.tick();
                        Ok(())
                    }
                    other => Err(ClientError::Invalid(format!(
                        "node {hash} is neither in what is being stored nor ready in the Space ({})",
                        other.state()
                    ))),
                };
            };
            let response = self.lease(&hash, Some(node.portable_len)).await?;
            if matches!(response, LeaseResponse::Ready { .. }) {
                self.tick();
                return Ok(());
            }
            // Children first: each distinct child leased (or stored) before the parent.
            let mut seen = HashSet::new();
            let children: Vec<Hash> = node
                .refs
                .iter()
                .copied()
                .filter(|c| seen.insert(*c))
                .collect();
            try_join_all(children.iter().map(|c| self.ensure(*c))).await?;
            // Someone may have uploaded it already: then, now that the children are ready, the
            // next lease publishes it.
            let mut first = (!matches!(response, LeaseResponse::ValidatedAwaitingChildren { .. }))
                .then_some(response);
            for _ in 0..8 {
                let report = self
                    .client
                    .lease_and_upload(
                        self.space,
                        &hash,
                        node.portable_len,
                        self.lease_ms,
                        Some(&self.calls),
                        first.take(),
                        self.plan.delta_base(&hash),
                        || portable_bytes(&hash, &node.source),
                    )
                    .await?;
                if report.uploaded_bytes > 0 {
                    self.uploaded_nodes.fetch_add(1, Ordering::Relaxed);
                    self.uploaded_bytes
                        .fetch_add(report.uploaded_bytes, Ordering::Relaxed);
                }
                match report.state {
                    Ensured::Ready { .. } => {
                        self.tick();
                        return Ok(());
                    }
                    Ensured::AwaitingChildren(missing) => {
                        // A child we leased earlier was collected since: store it again.
                        for c in missing {
                            self.ensure_now(c).await?;
                        }
                    }
                }
            }
            Err(ClientError::Protocol(format!(
                "node {hash} did not become ready: its children kept going missing"
            )))
        })
    }
}

/// The portable bytes of a planned node, checked against its hash (a file may have changed
/// since it was planned). A file's bytes are read by one blocking task: opened, its stamp
/// compared, and the slice read straight into the node's buffer.
pub(crate) async fn portable_bytes(hash: &Hash, source: &Source) -> Result<Bytes, ClientError> {
    match source {
        Source::Portable(b) => Ok(b.clone()),
        Source::FileSlice {
            path,
            offset,
            len,
            stamp,
        } => {
            let (path, offset, len, stamp) = (path.clone(), *offset, *len, *stamp);
            blocking(move || {
                let io = |e| ClientError::io(format!("cannot read {}", path.display()), e);
                let file = File::open(&path).map_err(io)?;
                // A file that changed since it was planned is refused here, without hashing
                // it again: the service checks every byte against the hash anyway.
                let changed = || {
                    ClientError::Invalid(format!(
                        "{} changed while it was being stored",
                        path.display()
                    ))
                };
                if FileStamp::of(&file.metadata().map_err(io)?) != stamp {
                    return Err(changed());
                }
                read_leaf(&file, offset, len).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => changed(),
                    _ => io(e),
                })
            })
            .await
        }
        Source::Spooled { file, offset, len } => {
            let (file, offset, len, hash) = (file.clone(), *offset, *len, *hash);
            blocking(move || {
                let out = read_leaf(&file, offset, len)
                    .map_err(|e| ClientError::io("cannot read the spool file", e))?;
                if Hash::digest(&out) != hash {
                    return Err(ClientError::Invalid(
                        "the spool file changed while it was being stored".into(),
                    ));
                }
                Ok(out)
            })
            .await
        }
    }
}

/// The portable bytes of the leaf whose content is the `len` bytes of `file` at `offset`,
/// read through the handle into the buffer that holds them (an end of file before them is
/// [`std::io::ErrorKind::UnexpectedEof`]).
fn read_leaf(file: &File, offset: u64, len: u64) -> std::io::Result<Bytes> {
    use std::os::unix::fs::FileExt;
    let mut out = leaf_descriptor(len)
        .prefix()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let start = out.len();
    out.resize(start + len as usize, 0);
    file.read_exact_at(&mut out[start..], offset)?;
    Ok(Bytes::from(out))
}

/// Runs `read` on a blocking thread.
async fn blocking(
    read: impl FnOnce() -> Result<Bytes, ClientError> + Send + 'static,
) -> Result<Bytes, ClientError> {
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| ClientError::Invalid(format!("reading a node failed: {e}")))?
}

impl AppCasClient {
    /// Stores the DAG below `roots` from `nodes` (hash → portable bytes), leasing each node for
    /// `lease_ms`, with up to `parallelism` calls in flight. Nodes missing from `nodes` must
    /// already be ready in the Space.
    pub async fn store_dag(
        &self,
        space: &SpaceId,
        nodes: &HashMap<Hash, Bytes>,
        roots: &[Hash],
        lease_ms: u64,
        parallelism: usize,
    ) -> Result<DagReport, ClientError> {
        let mut plan = Plan::default();
        for bytes in nodes.values() {
            plan.add_portable(bytes.clone())?;
        }
        Uploader::new(self, space, &plan, lease_ms, parallelism)
            .run(roots)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A planned file slice is read back as its node, and refused once the file changed since
    /// it was planned (without hashing it again: the stamp tells).
    #[tokio::test]
    async fn a_file_changed_since_planning_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1_000]).expect("write");
        let mut plan = Plan::default();
        let file = crate::files::plan_file(&mut plan, &path).expect("plan");
        let source = plan.nodes[&file.node].source.clone();
        let bytes = portable_bytes(&file.node, &source).await.expect("read");
        assert_eq!(Hash::digest(&bytes), file.node);
        std::fs::write(&path, vec![7u8; 1_001]).expect("rewrite");
        let e = portable_bytes(&file.node, &source)
            .await
            .expect_err("a changed file");
        assert!(
            e.to_string().contains("changed while it was being stored"),
            "{e}"
        );
    }

    /// Every leaf of a file planned in chunks is read back from its offset as the node its
    /// hash names, from the file and from a spool of the same bytes.
    #[tokio::test]
    async fn leaves_at_offsets_are_read_back_as_their_nodes() {
        use rand::{RngCore, SeedableRng};
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        let mut data = vec![0u8; 9 << 20];
        rand::rngs::StdRng::seed_from_u64(3).fill_bytes(&mut data);
        std::fs::write(&path, &data).expect("write");
        let mut plan = Plan::default();
        let file = crate::files::plan_file(&mut plan, &path).expect("plan");
        assert!(file.chunked);
        let spool = Arc::new(File::open(&path).expect("open"));
        let mut spooled = Plan::default();
        let again = crate::files::plan_spooled(&mut spooled, &spool, 0, data.len() as u64)
            .expect("plan the spool");
        assert_eq!(again.node, file.node);
        let mut leaves = 0;
        for p in [&plan, &spooled] {
            for (hash, node) in &p.nodes {
                if matches!(node.source, Source::Portable(_)) {
                    continue;
                }
                let bytes = portable_bytes(hash, &node.source).await.expect("read");
                assert_eq!(Hash::digest(&bytes), *hash);
                assert_eq!(bytes.len() as u64, node.portable_len);
                leaves += 1;
            }
        }
        assert!(leaves >= 6, "{leaves} leaves");
    }
}
