//! Export and import: moving DAGs between Spaces and deployments as archives
//! (`cas_format::archive`).
//!
//! Export writes the roots and every descendant, children before parents, each node once,
//! streaming: one node in memory at a time plus the set of hashes already written.
//!
//! Import first reads the whole archive and verifies every node, its refs and the stream digest,
//! and checks that every ref pointing outside the archive is ready in the target Space; only then
//! does it store the nodes that are not ready (in archive order, so children before parents), and
//! only after that, if asked, does it acquire one root ref per root with the caller's
//! deterministic request id. Running it again skips what is there and replays the root-ref
//! request, so an interrupted import is resumed by running it again.

use std::collections::{BTreeMap, HashSet};
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use cas_format::archive::{ArchiveLimits, ArchiveReader, ArchiveSummary, ArchiveWriter};
use cas_format::wire::{LeaseResponse, MAX_BATCH_LEASES, MAX_INLINE_NODE_BYTES};
use cas_format::{ContentType, Hash, NodeDescriptor, RequestId, SpaceId};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::client::AppCasClient;
use crate::dag::Progress;
use crate::error::ClientError;
use crate::tree_check::{ArchiveTreeCheck, TreeLimits};

/// What an export wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportReport {
    pub roots: Vec<Hash>,
    pub nodes: u64,
    pub bytes: u64,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportReport {
    pub roots: Vec<Hash>,
    pub nodes: u64,
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
    /// The root-ref update, if one was asked: (revision, whether it was a replay).
    pub retained: Option<(u64, bool)>,
}

/// Bytes of archive nodes an import holds in memory at once, in KiB (64 MiB).
const IMPORT_BUDGET_KIB: usize = 64 << 10;

/// Reads an open file from its start, through the handle (`pread`), whatever its position.
struct FileFromStart {
    file: Arc<std::fs::File>,
    at: u64,
}

impl FileFromStart {
    fn new(file: Arc<std::fs::File>) -> Self {
        FileFromStart { file, at: 0 }
    }
}

impl std::io::Read for FileFromStart {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Reads the archive in `file` (from its start, through the handle) and checks every tree it
/// holds within `limits` (see [`ArchiveTreeCheck`]), refusing more than `max_nodes` nodes and
/// any ref that leaves the archive. Nothing is stored. Blocking.
pub fn check_archive(
    file: &std::fs::File,
    limits: TreeLimits,
    max_nodes: u64,
) -> Result<(ArchiveSummary, ArchiveTreeCheck), ClientError> {
    let handle = file
        .try_clone()
        .map_err(|e| ClientError::io("cannot open the archive", e))?;
    let mut reader = ArchiveReader::new(
        BufReader::with_capacity(1 << 20, FileFromStart::new(Arc::new(handle))),
        ArchiveLimits {
            max_nodes,
            ..ArchiveLimits::default()
        },
    )
    .map_err(invalid)?;
    let mut check = ArchiveTreeCheck::new(limits, reader.roots());
    while let Some(node) = reader.next_node().map_err(invalid)? {
        check.visit(&node)?;
    }
    let summary = reader
        .summary()
        .cloned()
        .ok_or_else(|| ClientError::Invalid("invalid archive: it has no end".into()))?;
    if let Some(h) = summary.external_refs.first() {
        return Err(ClientError::Invalid(format!(
            "the archive refers to node {h}, which it does not hold; export it whole"
        )));
    }
    Ok((summary, check))
}

fn invalid(e: impl std::fmt::Display) -> ClientError {
    ClientError::Invalid(format!("invalid archive: {e}"))
}

impl AppCasClient {
    /// The portable bytes of a stored node, checked against its hash.
    pub async fn read_portable(
        &self,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<(Vec<Hash>, Bytes), ClientError> {
        let meta = self.read_metadata(space, hash).await?;
        let content = self.read_content(space, hash, None).await?;
        let ct = ContentType::new(meta.metadata.content_type)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let d = NodeDescriptor::new(ct, meta.metadata.refs.clone(), content.len() as u64);
        let bytes = d
            .encode_portable(&content)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if Hash::digest(&bytes) != *hash {
            return Err(ClientError::Protocol(format!(
                "node {hash} read back does not hash to itself"
            )));
        }
        Ok((meta.metadata.refs, Bytes::from(bytes)))
    }

    /// Writes `roots` and all their descendants to the archive file `path`.
    pub async fn export(
        &self,
        space: &SpaceId,
        roots: &[Hash],
        path: &Path,
        progress: Option<Progress>,
    ) -> Result<ExportReport, ClientError> {
        let file = std::fs::File::create(path)
            .map_err(|e| ClientError::io(format!("cannot create {}", path.display()), e))?;
        self.export_to(space, roots, file, progress).await
    }

    /// Writes `roots` and all their descendants as an archive to the open `file`.
    pub async fn export_to(
        &self,
        space: &SpaceId,
        roots: &[Hash],
        file: std::fs::File,
        progress: Option<Progress>,
    ) -> Result<ExportReport, ClientError> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let roots_owned = roots.to_vec();
        let writer = tokio::task::spawn_blocking(move || {
            let mut w = ArchiveWriter::new(
                std::io::BufWriter::with_capacity(1 << 20, file),
                &roots_owned,
                ArchiveLimits::default(),
            )
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
            while let Some(node) = rx.blocking_recv() {
                w.write_node(&node)
                    .map_err(|e| ClientError::Invalid(e.to_string()))?;
            }
            let (_, summary) = w
                .finish()
                .map_err(|e| ClientError::Invalid(e.to_string()))?;
            Ok::<ArchiveSummary, ClientError>(summary)
        });
        let walked = self.walk_children_first(space, roots, &tx, progress).await;
        drop(tx);
        let summary = writer
            .await
            .map_err(|e| ClientError::Invalid(format!("the archive writer failed: {e}")))?;
        walked?;
        let summary = summary?;
        Ok(ExportReport {
            roots: summary.roots,
            nodes: summary.node_count,
            bytes: summary.bytes,
        })
    }

    async fn walk_children_first(
        &self,
        space: &SpaceId,
        roots: &[Hash],
        out: &tokio::sync::mpsc::Sender<Bytes>,
        progress: Option<Progress>,
    ) -> Result<(), ClientError> {
        let mut visited = HashSet::new();
        // (node, its children pushed already?) — a node is written after all of its children.
        let mut stack: Vec<(Hash, Option<Bytes>)> =
            roots.iter().rev().map(|r| (*r, None)).collect();
        let (mut nodes, mut bytes) = (0u64, 0u64);
        while let Some((hash, expanded)) = stack.pop() {
            match expanded {
                Some(portable) => {
                    bytes += portable.len() as u64;
                    nodes += 1;
                    out.send(portable)
                        .await
                        .map_err(|_| ClientError::Invalid("the archive writer stopped".into()))?;
                    if let Some(p) = &progress {
                        p(bytes, nodes);
                    }
                }
                None => {
                    if !visited.insert(hash) {
                        continue;
                    }
                    let (refs, portable) = self.read_portable(space, &hash).await?;
                    stack.push((hash, Some(portable)));
                    let mut seen = HashSet::new();
                    for child in refs.iter().rev() {
                        if seen.insert(*child) && !visited.contains(child) {
                            stack.push((*child, None));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Imports the archive file `path` into `space`; with `retain`, then acquires one root ref
    /// per root with that request id.
    pub async fn import(
        &self,
        space: &SpaceId,
        path: &Path,
        retain: Option<&RequestId>,
        lease_ms: u64,
        parallelism: usize,
        progress: Option<Progress>,
    ) -> Result<ImportReport, ClientError> {
        let file = std::fs::File::open(path)
            .map_err(|e| ClientError::io(format!("cannot open {}", path.display()), e))?;
        self.import_file(space, file, retain, lease_ms, parallelism, progress)
            .await
    }

    /// Imports the archive in the open `file` (read from its start, through the handle only)
    /// into `space`; with `retain`, then acquires one root ref per root with that request id.
    pub async fn import_file(
        &self,
        space: &SpaceId,
        file: std::fs::File,
        retain: Option<&RequestId>,
        lease_ms: u64,
        parallelism: usize,
        progress: Option<Progress>,
    ) -> Result<ImportReport, ClientError> {
        let file = Arc::new(file);
        // 1. Verify everything, offline.
        let f = file.clone();
        let summary = tokio::task::spawn_blocking(move || {
            ArchiveReader::new(
                BufReader::with_capacity(1 << 20, FileFromStart::new(f)),
                ArchiveLimits::default(),
            )
            .and_then(|r| r.verify_to_end())
            .map_err(invalid)
        })
        .await
        .map_err(|e| ClientError::Invalid(format!("verification failed: {e}")))??;
        // 2. Refs that leave the archive must be ready in the target.
        for h in &summary.external_refs {
            match self.lease_node(space, h, lease_ms, None).await? {
                LeaseResponse::Ready { .. } => {}
                _ => {
                    return Err(ClientError::Invalid(format!(
                        "the archive refers to node {h}, which is neither in it nor in the target Space"
                    )));
                }
            }
        }
        // 3. Store what is missing, children before parents.
        let (uploaded_nodes, uploaded_bytes) = self
            .import_nodes(space, file, lease_ms, parallelism.max(1), progress)
            .await?;
        // 4. Only now, the root refs.
        let retained = match retain {
            Some(id) => {
                let changes: BTreeMap<Hash, i64> = summary.roots.iter().map(|r| (*r, 1)).collect();
                let r = self.update_root_refs(space, id, changes).await?;
                Some((r.revision, r.idempotent))
            }
            None => None,
        };
        Ok(ImportReport {
            roots: summary.roots,
            nodes: summary.node_count,
            uploaded_nodes,
            uploaded_bytes,
            retained,
        })
    }

    async fn import_nodes(
        &self,
        space: &SpaceId,
        file: Arc<std::fs::File>,
        lease_ms: u64,
        parallelism: usize,
        progress: Option<Progress>,
    ) -> Result<(u64, u64), ClientError> {
        // Nodes in memory (read ahead or being stored) are bounded in bytes, not only in
        // number: a node holds `max(size, 1 KiB)` of the budget until it is stored.
        let budget = Arc::new(Semaphore::new(IMPORT_BUDGET_KIB));
        let (tx, mut rx) =
            tokio::sync::mpsc::channel::<(Hash, Vec<Hash>, Bytes, OwnedSemaphorePermit)>(1);
        let read_budget = budget.clone();
        let reader = tokio::task::spawn_blocking(move || {
            let mut r = ArchiveReader::new(
                BufReader::with_capacity(1 << 20, FileFromStart::new(file)),
                ArchiveLimits::default(),
            )
            .map_err(invalid)?;
            while let Some(n) = r.next_node().map_err(invalid)? {
                let kib = (n.bytes.len() / 1024).clamp(1, IMPORT_BUDGET_KIB) as u32;
                let Ok(permit) = tokio::runtime::Handle::current()
                    .block_on(read_budget.clone().acquire_many_owned(kib))
                else {
                    break;
                };
                if tx
                    .blocking_send((n.hash, n.descriptor.refs, Bytes::from(n.bytes), permit))
                    .is_err()
                {
                    break;
                }
            }
            Ok::<(), ClientError>(())
        });
        let client = Arc::new(self.clone());
        // A task stores one node, or a batch of small ones (none a child of another).
        let mut in_flight: JoinSet<Result<Vec<(Hash, u64)>, ClientError>> = JoinSet::new();
        let mut flying: HashSet<Hash> = HashSet::new();
        let (mut uploaded_nodes, mut uploaded_bytes, mut done) = (0u64, 0u64, 0u64);
        let mut settle =
            |r: Result<Result<Vec<(Hash, u64)>, ClientError>, tokio::task::JoinError>,
             flying: &mut HashSet<Hash>| {
                let stored =
                    r.map_err(|e| ClientError::Invalid(format!("an upload task failed: {e}")))??;
                for (hash, n) in stored {
                    flying.remove(&hash);
                    done += 1;
                    if n > 0 {
                        uploaded_nodes += 1;
                        uploaded_bytes += n;
                    }
                }
                if let Some(p) = &progress {
                    p(uploaded_bytes, done);
                }
                Ok::<(), ClientError>(())
            };
        let mut batch = SmallBatch::default();
        loop {
            let next = rx.recv().await;
            // The batch goes when it is full, when a node needs one of its members, or at the
            // end; a task goes once none of the children it needs is still in flight.
            let flush = match &next {
                Some((_, refs, bytes, _)) => {
                    batch.is_full_for(bytes.len()) || refs.iter().any(|c| batch.hashes.contains(c))
                }
                None => true,
            };
            if flush && !batch.nodes.is_empty() {
                let full = std::mem::take(&mut batch);
                while in_flight.len() >= parallelism
                    || full.children.iter().any(|c| flying.contains(c))
                {
                    if let Some(r) = in_flight.join_next().await {
                        settle(r, &mut flying)?;
                    }
                }
                flying.extend(full.hashes.iter().copied());
                let (client, space) = (client.clone(), space.clone());
                in_flight.spawn(async move {
                    let nodes: Vec<(Hash, Bytes)> =
                        full.nodes.iter().map(|(h, b, _)| (*h, b.clone())).collect();
                    let uploaded = client.store_small_nodes(&space, &nodes, lease_ms).await?;
                    drop(full);
                    Ok(nodes.into_iter().map(|(h, _)| h).zip(uploaded).collect())
                });
            }
            let Some((hash, refs, bytes, permit)) = next else {
                break;
            };
            if bytes.len() as u64 <= MAX_INLINE_NODE_BYTES {
                batch.push(hash, refs, bytes, permit);
                continue;
            }
            // A large node: on its own, lease, upload and lease.
            while in_flight.len() >= parallelism || refs.iter().any(|c| flying.contains(c)) {
                if let Some(r) = in_flight.join_next().await {
                    settle(r, &mut flying)?;
                }
            }
            flying.insert(hash);
            let (client, space) = (client.clone(), space.clone());
            in_flight.spawn(async move {
                let r = client.ensure_node(&space, &hash, &bytes, lease_ms).await;
                drop((bytes, permit));
                let r = r?;
                match r.state {
                    crate::store::Ensured::Ready { .. } => Ok(vec![(hash, r.uploaded_bytes)]),
                    crate::store::Ensured::AwaitingChildren(missing) => Err(ClientError::Invalid(format!(
                        "node {hash} lost {} of its children to GC during the import (their leases ran out); run the import again",
                        missing.len()
                    ))),
                }
            });
        }
        while let Some(r) = in_flight.join_next().await {
            settle(r, &mut flying)?;
        }
        reader
            .await
            .map_err(|e| ClientError::Invalid(format!("the archive reader failed: {e}")))??;
        Ok((uploaded_nodes, uploaded_bytes))
    }
}

/// Small nodes of an import gathered for one batch lease, with their budget permits.
#[derive(Default)]
struct SmallBatch {
    nodes: Vec<(Hash, Bytes, OwnedSemaphorePermit)>,
    hashes: HashSet<Hash>,
    /// The children its members need ready first.
    children: HashSet<Hash>,
    bytes: usize,
}

impl SmallBatch {
    /// Bytes of inline content one batch carries at most.
    const MAX_BYTES: usize = 4 << 20;

    fn is_full_for(&self, len: usize) -> bool {
        self.nodes.len() >= MAX_BATCH_LEASES || self.bytes + len > Self::MAX_BYTES
    }

    fn push(&mut self, hash: Hash, refs: Vec<Hash>, bytes: Bytes, permit: OwnedSemaphorePermit) {
        self.bytes += bytes.len();
        self.hashes.insert(hash);
        self.children.extend(refs);
        self.nodes.push((hash, bytes, permit));
    }
}
