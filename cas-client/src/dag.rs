//! Storing a DAG whose nodes are at hand: bottom-up, each distinct node once, with bounded
//! parallelism. Every child is leased (by its own `ensure_node`) before its parent is leased,
//! so GC cannot take a child in between; a parent that still finds a child missing (its lease
//! ran out and GC took it) gets that child stored again.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use cas_format::{Hash, NodeLimits, SpaceId, decode_portable};
use futures_util::{StreamExt, TryStreamExt};

use crate::client::AppCasClient;
use crate::error::ClientError;
use crate::store::Ensured;

/// What storing a DAG did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DagReport {
    /// Distinct nodes in the DAG.
    pub nodes: u64,
    /// Nodes this call uploaded.
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
}

/// The refs of a portable node.
pub fn portable_refs(portable: &[u8]) -> Result<Vec<Hash>, ClientError> {
    decode_portable(portable, &NodeLimits::format_max())
        .map(|n| n.descriptor.refs)
        .map_err(|e| ClientError::Invalid(format!("not a portable node: {e}")))
}

/// Orders the nodes reachable from `roots` children first, each once. Nodes not in `nodes`
/// are taken to exist already (they are leased when met as children, not uploaded).
pub fn children_first(
    nodes: &HashMap<Hash, Bytes>,
    roots: &[Hash],
) -> Result<Vec<Vec<Hash>>, ClientError> {
    // Depth of a node = 1 + the deepest of its children; nodes of equal depth are independent.
    let mut depth: HashMap<Hash, usize> = HashMap::new();
    let mut stack: Vec<(Hash, bool)> = roots.iter().map(|r| (*r, false)).collect();
    let mut on_path = HashSet::new();
    while let Some((h, expanded)) = stack.pop() {
        if depth.contains_key(&h) && !expanded {
            continue;
        }
        let Some(bytes) = nodes.get(&h) else {
            depth.insert(h, 0);
            continue;
        };
        let refs = portable_refs(bytes)?;
        if expanded {
            on_path.remove(&h);
            let d = refs
                .iter()
                .map(|c| depth.get(c).copied().unwrap_or(0) + 1)
                .max()
                .unwrap_or(1);
            depth.insert(h, d.max(1));
        } else {
            if !on_path.insert(h) {
                return Err(ClientError::Invalid("the nodes form a cycle".into()));
            }
            stack.push((h, true));
            for c in refs.iter().rev() {
                if !depth.contains_key(c) {
                    stack.push((*c, false));
                }
            }
        }
    }
    let max = depth.values().copied().max().unwrap_or(0);
    let mut layers = vec![Vec::new(); max + 1];
    for (h, d) in depth {
        layers[d].push(h);
    }
    for l in &mut layers {
        l.sort_unstable();
    }
    Ok(layers)
}

impl AppCasClient {
    /// Stores the DAG below `roots` from `nodes` (hash → portable bytes), children first, up
    /// to `parallelism` nodes at a time, leasing each for `lease_ms`. Nodes missing from
    /// `nodes` must already be ready in the Space.
    pub async fn store_dag(
        &self,
        space: &SpaceId,
        nodes: &HashMap<Hash, Bytes>,
        roots: &[Hash],
        lease_ms: u64,
        parallelism: usize,
    ) -> Result<DagReport, ClientError> {
        let layers = children_first(nodes, roots)?;
        let mut report = DagReport::default();
        for layer in layers {
            let results: Vec<(u64, u64)> = futures_util::stream::iter(layer)
                .map(|h| self.store_one(space, nodes, h, lease_ms))
                .buffer_unordered(parallelism.max(1))
                .try_collect()
                .await?;
            for (n, b) in results {
                report.nodes += 1;
                report.uploaded_nodes += n;
                report.uploaded_bytes += b;
            }
        }
        Ok(report)
    }

    /// Ensures one node; stores children again if the service says they went missing.
    /// Returns (nodes uploaded, bytes uploaded).
    fn store_one<'a>(
        &'a self,
        space: &'a SpaceId,
        nodes: &'a HashMap<Hash, Bytes>,
        hash: Hash,
        lease_ms: u64,
    ) -> futures_util::future::BoxFuture<'a, Result<(u64, u64), ClientError>> {
        Box::pin(async move {
            let Some(bytes) = nodes.get(&hash) else {
                // Not ours to upload: it must be ready; lease it so a parent can reference it.
                return match self.lease_node(space, &hash, lease_ms, None).await? {
                    cas_format::wire::LeaseResponse::Ready { .. } => Ok((0, 0)),
                    other => Err(ClientError::Invalid(format!(
                        "node {hash} is not in the DAG being stored and not ready ({})",
                        other.state()
                    ))),
                };
            };
            let mut uploaded = (0u64, 0u64);
            for _ in 0..4 {
                let r = self.ensure_node(space, &hash, bytes, lease_ms).await?;
                if r.uploaded_bytes > 0 {
                    uploaded.0 += 1;
                    uploaded.1 += r.uploaded_bytes;
                }
                match r.state {
                    Ensured::Ready { .. } => return Ok(uploaded),
                    Ensured::AwaitingChildren(missing) => {
                        for child in missing {
                            let (n, b) = self.store_one(space, nodes, child, lease_ms).await?;
                            uploaded.0 += n;
                            uploaded.1 += b;
                        }
                    }
                }
            }
            Err(ClientError::Protocol(format!(
                "node {hash} kept waiting for children that were stored again"
            )))
        })
    }
}
