//! Storing a DAG in batches: the uploader's first phase.
//!
//! 1. *Discover*, top-down: the roots are leased in batches; a node that is ready ends its
//!    branch, a missing one has its distinct children leased in the next round (so every child
//!    is leased before its new parent, as in the node-by-node walk).
//! 2. *Store*, bottom-up in waves (a node's wave comes after all of its children's): the small
//!    nodes of a wave travel inline in batch leases (raw, in the binary body), which validate
//!    and publish them; a node whose bytes the service already holds is leased again in a
//!    batch; the large ones go through the node-by-node path (lease, PUT, lease).
//!
//! Whatever a batch does not settle is left to the node-by-node walk that follows.
//!
//! Imports, which meet their nodes children first in the archive, store their small nodes
//! with `AppCasClient::store_small_nodes`: one batch lease finds what is missing, a second
//! carries it inline.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use cas_format::Hash;
use cas_format::wire::{
    BatchLeaseElement, BatchLeaseResult, LeaseResponse, MAX_BATCH_LEASES, MAX_INLINE_NODE_BYTES,
    UploadTarget,
};
use futures_util::future::try_join_all;
use futures_util::{StreamExt, TryStreamExt};

use crate::dag::{Uploader, portable_bytes};
use crate::error::ClientError;

/// Bytes of inline nodes one request carries at most (raw, after the request's JSON).
const INLINE_BYTES_PER_REQUEST: u64 = 4 << 20;

/// Inline batch requests in flight at once (each holds at most
/// [`INLINE_BYTES_PER_REQUEST`] of nodes, twice over while its body is built).
const INLINE_REQUESTS_IN_FLIGHT: usize = 2;

/// `items` in groups of at most [`MAX_BATCH_LEASES`] items and [`INLINE_BYTES_PER_REQUEST`]
/// bytes (as `size` counts them), in order.
fn groups<T>(items: Vec<T>, size: impl Fn(&T) -> u64) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0u64;
    for item in items {
        let len = size(&item);
        let full = groups
            .last()
            .is_none_or(|g| g.len() >= MAX_BATCH_LEASES || bytes + len > INLINE_BYTES_PER_REQUEST);
        if full {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += len;
        if let Some(g) = groups.last_mut() {
            g.push(item);
        }
    }
    groups
}

/// What discovery found out about a node that is not ready.
#[derive(Debug)]
struct Missing {
    /// Its distinct children that must be ready first.
    children: Vec<Hash>,
    /// The service holds its validated bytes already: a lease publishes it.
    validated: bool,
    /// Where its lease asked for its bytes.
    upload: Option<UploadTarget>,
}

impl Uploader<'_> {
    /// Leases `elements` (without inline nodes) in requests of at most [`MAX_BATCH_LEASES`]
    /// elements, a few at a time; results in order.
    async fn lease_elements(
        &self,
        elements: Vec<BatchLeaseElement>,
    ) -> Result<Vec<BatchLeaseResult>, ClientError> {
        let requests = groups(elements, |_| 0);
        let answers = try_join_all(requests.into_iter().map(|r| async move {
            let _permit = self
                .calls
                .acquire()
                .await
                .map_err(|_| ClientError::Cancelled)?;
            self.client.lease_batch(self.space, r).await
        }))
        .await?;
        Ok(answers.into_iter().flatten().collect())
    }

    fn element(&self, hash: Hash) -> BatchLeaseElement {
        BatchLeaseElement {
            hash,
            lease_duration_ms: self.lease_ms,
            upload_bytes: self.plan.nodes.get(&hash).map(|n| n.portable_len),
            content: None,
            content_bytes: None,
            delta_base: self.plan.delta_base(&hash),
        }
    }

    /// Stores one group of small nodes by one batch lease with their bytes inline.
    async fn store_inline(
        &self,
        group: Vec<Hash>,
        roots: &HashSet<Hash>,
    ) -> Result<(), ClientError> {
        let mut elements = Vec::with_capacity(group.len());
        for h in &group {
            let Some(node) = self.plan.nodes.get(h) else {
                continue;
            };
            let bytes = portable_bytes(h, &node.source).await?;
            elements.push((self.element(*h), Some(bytes)));
        }
        let sent: Vec<Hash> = elements.iter().map(|(e, _)| e.hash).collect();
        let results = {
            let _permit = self
                .calls
                .acquire()
                .await
                .map_err(|_| ClientError::Cancelled)?;
            self.client.lease_batch_raw(self.space, elements).await?
        };
        for (h, r) in sent.iter().zip(results) {
            if matches!(r, BatchLeaseResult::Lease(LeaseResponse::Ready { .. })) {
                if let Some(node) = self.plan.nodes.get(h) {
                    self.uploaded_nodes.fetch_add(1, Ordering::Relaxed);
                    self.uploaded_bytes
                        .fetch_add(node.portable_len, Ordering::Relaxed);
                }
                self.settled(*h, roots);
            }
        }
        Ok(())
    }

    /// Marks a node settled for this run (it is not looked at again) and counts it.
    fn settled(&self, hash: Hash, roots: &HashSet<Hash>) {
        // Roots are leased once more by the node-by-node walk, which counts them.
        if !roots.contains(&hash) && self.cell(hash).set(()).is_ok() {
            self.tick();
        }
    }

    /// The batched phase of [`Uploader::run`].
    pub(crate) async fn run_batched(&self, roots: &[Hash]) -> Result<(), ClientError> {
        let root_set: HashSet<Hash> = roots.iter().copied().collect();
        let mut missing: HashMap<Hash, Missing> = HashMap::new();
        let mut seen: HashSet<Hash> = root_set.clone();
        let mut frontier: Vec<Hash> = seen.iter().copied().collect();
        while !frontier.is_empty() {
            let elements = frontier.iter().map(|h| self.element(*h)).collect();
            let results = self.lease_elements(elements).await?;
            let mut next = Vec::new();
            for (hash, r) in frontier.iter().zip(results) {
                let (children, validated, upload) = match r {
                    BatchLeaseResult::Lease(LeaseResponse::Ready { .. }) => {
                        self.settled(*hash, &root_set);
                        continue;
                    }
                    BatchLeaseResult::Lease(LeaseResponse::ValidatedAwaitingChildren {
                        child_hashes,
                        ..
                    }) => (child_hashes, true, None),
                    BatchLeaseResult::Lease(
                        LeaseResponse::AwaitingUpload { upload, .. }
                        | LeaseResponse::AwaitingReplacementUpload { upload, .. },
                    ) => match self.plan.nodes.get(hash) {
                        Some(node) => {
                            let mut distinct = HashSet::new();
                            let children = node
                                .refs
                                .iter()
                                .copied()
                                .filter(|c| distinct.insert(*c))
                                .collect();
                            (children, false, Some(upload))
                        }
                        // Not ours to upload: the node-by-node walk reports it.
                        None => continue,
                    },
                    // The node-by-node walk meets the same error and reports it.
                    BatchLeaseResult::Error(_) => continue,
                };
                for c in &children {
                    if seen.insert(*c) {
                        next.push(*c);
                    }
                }
                missing.insert(
                    *hash,
                    Missing {
                        children,
                        validated,
                        upload,
                    },
                );
            }
            frontier = next;
        }
        self.store_waves(missing, &root_set).await
    }

    /// Stores the large nodes of a wave: each PUT to the target its first lease named (a few
    /// at once, as many as calls may be in flight), then all of them leased again in batches,
    /// which validate and publish them. Whatever that does not settle (a target that expired
    /// or refused the bytes, a node the service rejected) goes node by node, which leases it
    /// afresh and reports what is wrong.
    async fn store_large(
        &self,
        large: Vec<(Hash, Option<UploadTarget>)>,
        roots: &HashSet<Hash>,
    ) -> Result<(), ClientError> {
        let puts: Vec<(Hash, Option<u64>)> = futures_util::stream::iter(large)
            .map(|(h, target)| async move {
                let (Some(target), Some(node)) = (target, self.plan.nodes.get(&h)) else {
                    return Ok((h, None));
                };
                let _permit = self
                    .calls
                    .acquire()
                    .await
                    .map_err(|_| ClientError::Cancelled)?;
                let bytes = portable_bytes(&h, &node.source).await?;
                let len = bytes.len() as u64;
                let put = self.client.upload(&target, bytes).await;
                Ok::<_, ClientError>((h, put.ok().map(|()| len)))
            })
            .buffer_unordered(self.parallelism)
            .try_collect()
            .await?;
        let mut uploaded = Vec::new();
        let mut again = Vec::new();
        for (h, put) in puts {
            match put {
                Some(len) => uploaded.push((h, len)),
                None => again.push(h),
            }
        }
        let elements = uploaded.iter().map(|(h, _)| self.element(*h)).collect();
        let results = self.lease_elements(elements).await?;
        for ((h, len), r) in uploaded.into_iter().zip(results) {
            if matches!(r, BatchLeaseResult::Lease(LeaseResponse::Ready { .. })) {
                self.uploaded_nodes.fetch_add(1, Ordering::Relaxed);
                self.uploaded_bytes.fetch_add(len, Ordering::Relaxed);
                self.settled(h, roots);
            } else {
                again.push(h);
            }
        }
        try_join_all(again.into_iter().map(|h| self.ensure(h))).await?;
        Ok(())
    }

    /// Stores the missing nodes, children before parents.
    async fn store_waves(
        &self,
        mut missing: HashMap<Hash, Missing>,
        roots: &HashSet<Hash>,
    ) -> Result<(), ClientError> {
        // Kahn's order over the missing nodes: a wave holds the nodes whose missing children
        // are all in earlier waves.
        let mut parents: HashMap<Hash, Vec<Hash>> = HashMap::new();
        let mut waiting: HashMap<Hash, usize> = HashMap::new();
        for (h, m) in &missing {
            let inside: Vec<&Hash> = m
                .children
                .iter()
                .filter(|c| missing.contains_key(c))
                .collect();
            waiting.insert(*h, inside.len());
            for c in inside {
                parents.entry(*c).or_default().push(*h);
            }
        }
        let mut wave: Vec<Hash> = waiting
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(h, _)| *h)
            .collect();
        while !wave.is_empty() {
            let mut inline = Vec::new();
            let mut validated = Vec::new();
            let mut large = Vec::new();
            for h in &wave {
                let Some(m) = missing.remove(h) else { continue };
                match self.plan.nodes.get(h) {
                    _ if m.validated => validated.push(*h),
                    Some(node) if node.portable_len <= MAX_INLINE_NODE_BYTES => inline.push(*h),
                    Some(_) => large.push((*h, m.upload)),
                    None => {}
                }
            }
            let inline_groups = groups(inline, |h| {
                self.plan.nodes.get(h).map_or(0, |n| n.portable_len)
            });
            let validated_elements = validated.iter().map(|h| self.element(*h)).collect();
            let (_, _, results) = tokio::try_join!(
                self.store_large(large, roots),
                futures_util::stream::iter(inline_groups)
                    .map(|g| self.store_inline(g, roots))
                    .buffer_unordered(INLINE_REQUESTS_IN_FLIGHT)
                    .try_collect::<Vec<()>>(),
                self.lease_elements(validated_elements),
            )?;
            for (h, r) in validated.iter().zip(results) {
                if matches!(r, BatchLeaseResult::Lease(LeaseResponse::Ready { .. })) {
                    self.settled(*h, roots);
                }
            }
            let mut next = Vec::new();
            for h in &wave {
                for p in parents.get(h).into_iter().flatten() {
                    if let Some(n) = waiting.get_mut(p) {
                        *n -= 1;
                        if *n == 0 {
                            next.push(*p);
                        }
                    }
                }
            }
            wave = next;
        }
        Ok(())
    }
}

impl crate::client::AppCasClient {
    /// Makes small nodes (each at most [`MAX_INLINE_NODE_BYTES`], none a child of another)
    /// ready with two batch leases: one to find what is missing, one carrying what is missing
    /// inline. Answers the bytes uploaded for each node, in order.
    pub(crate) async fn store_small_nodes(
        &self,
        space: &cas_format::SpaceId,
        nodes: &[(Hash, bytes::Bytes)],
        lease_ms: u64,
    ) -> Result<Vec<u64>, ClientError> {
        let element = |h: Hash, len: usize| BatchLeaseElement {
            hash: h,
            lease_duration_ms: lease_ms,
            upload_bytes: Some(len as u64),
            content: None,
            content_bytes: None,
            delta_base: None,
        };
        let first = self
            .lease_batch(
                space,
                nodes.iter().map(|(h, b)| element(*h, b.len())).collect(),
            )
            .await?;
        let missing: Vec<usize> = first
            .iter()
            .enumerate()
            .filter(|(_, r)| !matches!(r, BatchLeaseResult::Lease(LeaseResponse::Ready { .. })))
            .map(|(i, _)| i)
            .collect();
        let mut uploaded = vec![0u64; nodes.len()];
        if missing.is_empty() {
            return Ok(uploaded);
        }
        let elements = missing
            .iter()
            .map(|&i| {
                let (h, b) = &nodes[i];
                (element(*h, b.len()), Some(b.clone()))
            })
            .collect();
        let second = self.lease_batch_raw(space, elements).await?;
        for (&i, r) in missing.iter().zip(second) {
            let hash = nodes[i].0;
            match r {
                BatchLeaseResult::Lease(LeaseResponse::Ready { .. }) => {
                    uploaded[i] = nodes[i].1.len() as u64;
                }
                BatchLeaseResult::Lease(LeaseResponse::ValidatedAwaitingChildren {
                    child_hashes,
                    ..
                }) => {
                    return Err(ClientError::Invalid(format!(
                        "node {hash} lost {} of its children to GC during the import (their leases ran out); run the import again",
                        child_hashes.len()
                    )));
                }
                BatchLeaseResult::Lease(other) => {
                    return Err(ClientError::Protocol(format!(
                        "node {hash} was not stored from its inline bytes ({})",
                        other.state()
                    )));
                }
                BatchLeaseResult::Error(e) => {
                    return Err(ClientError::Protocol(format!(
                        "node {hash}: {} {}",
                        e.error, e.message
                    )));
                }
            }
        }
        Ok(uploaded)
    }
}
