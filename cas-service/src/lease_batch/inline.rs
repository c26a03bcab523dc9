//! Inline nodes of a batch lease, published together: their bytes were validated in memory
//! ([`Service::lease_batch`]); one partition operation extends the leases of those already
//! stored and records a validated upload generation for each new one (or takes over the
//! generation a lease made for it, still awaiting an upload), their objects are written, and
//! a second operation publishes them all (children before parents).

use std::collections::HashSet;

use bytes::Bytes;
use cas_format::wire::{BatchLeaseElement, LeaseResponse, MAX_INLINE_NODE_BYTES};
use cas_format::{AppId, Hash, SpaceId};
use futures_util::StreamExt;

use super::{Answers, ELEMENT_CONCURRENCY, RUNS_AT_ONCE, Single, runs};
use crate::error::{ApiError, ApiResult};
use crate::lease::{lease_window, upload_limit};
use crate::materialize::Encoded;
use crate::meta::{Evidence, FinalizeOutcome, GenState, Generation, Publication, StoredObject};
use crate::{Service, now_ms};

/// Inline nodes published by one pair of partition operations: a client's batch of 100 small
/// nodes is one group, whose statements cost about as much as a group of 32.
const INLINE_GROUP: usize = 128;
/// Groups of inline nodes of one batch under way at once.
const INLINE_GROUPS_AT_ONCE: usize = 4;

/// An inline node whose bytes proved valid, on its way to being published with the others.
pub(super) struct Inline {
    pub index: usize,
    /// The element, without its inline bytes.
    pub element: BatchLeaseElement,
    /// The portable bytes, decoded.
    pub bytes: Bytes,
    pub evidence: Evidence,
    pub canonical_len: u64,
}

impl Inline {
    /// The element as it came, for the one-by-one path.
    fn back_to_single(self) -> Single {
        (self.index, self.element, Some(self.bytes))
    }
}

/// An inline node's own content: the tail of the portable bytes validated before.
fn own_content(s: &Staged) -> ApiResult<Bytes> {
    let bytes = &s.node.bytes;
    let size = s.node.evidence.content_size as usize;
    let start = bytes.len().checked_sub(size).ok_or_else(|| {
        ApiError::internal("spooling an inline node", "its content outgrows its bytes")
    })?;
    Ok(bytes.slice(start..))
}

/// An inline node with its validated generation and, once written, its object.
struct Staged {
    node: Inline,
    generation: Generation,
    object: Option<StoredObject>,
}

impl Service {
    /// Publishes validated inline nodes in groups, several at once (one group's objects are
    /// written while another's rows are); answers each by index, and returns the nodes this
    /// path cannot take, for the one-by-one path.
    pub(super) async fn publish_all_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        mut inline: Vec<Inline>,
    ) -> (Answers, Vec<Single>) {
        let mut groups = Vec::new();
        while !inline.is_empty() {
            let rest = inline.split_off(inline.len().min(INLINE_GROUP));
            groups.push(std::mem::replace(&mut inline, rest));
        }
        let published: Vec<(Answers, Vec<Single>)> = futures_util::stream::iter(groups)
            .map(|group| async move {
                let mut fallback = Vec::new();
                let answers = self.publish_inline(app, space, group, &mut fallback).await;
                (answers, fallback)
            })
            .buffer_unordered(INLINE_GROUPS_AT_ONCE)
            .collect()
            .await;
        let mut answers = Vec::new();
        let mut one_by_one = Vec::new();
        for (a, fallback) in published {
            answers.extend(a);
            one_by_one.extend(fallback);
        }
        (answers, one_by_one)
    }

    /// Publishes validated inline nodes in two partition operations; answers each by index.
    /// Nodes this path cannot take are appended to `one_by_one`.
    async fn publish_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        inline: Vec<Inline>,
        one_by_one: &mut Vec<Single>,
    ) -> Answers {
        if inline.is_empty() {
            return Vec::new();
        }
        let indices: Vec<usize> = inline.iter().map(|n| n.index).collect();
        let mut answers = Vec::new();
        let staged = match self
            .begin_inline(app, space, inline, &mut answers, one_by_one)
            .await
        {
            Ok(staged) => staged,
            Err(e) => return indices.into_iter().map(|i| (i, Err(e.clone()))).collect(),
        };
        // Objects first, concurrently; rows second, in one operation. A delta whose base GC
        // took meanwhile is written again alone, and published by one more operation.
        let mut pending = staged;
        while !pending.is_empty() {
            let written = self
                .write_inline_all(app, space, pending, &mut answers)
                .await;
            match self.finish_inline(app, space, written, one_by_one).await {
                Ok((done, based_on_gone)) => {
                    answers.extend(done);
                    pending = based_on_gone
                        .into_iter()
                        .map(|mut s| {
                            s.node.element.delta_base = None;
                            s.object = None;
                            s
                        })
                        .collect();
                }
                Err((indices, e)) => {
                    answers.extend(indices.into_iter().map(|i| (i, Err(e.clone()))));
                    break;
                }
            }
        }
        answers
    }

    /// Writes the objects of staged inline nodes: each encoded (concurrently), then all of them
    /// written together (on the filesystem by a few tasks, each directory fsynced once); answers
    /// those that failed (each with its own error: a full disk is a 507, a failing store a
    /// 503) and returns the others.
    async fn write_inline_all(
        &self,
        app: &AppId,
        space: &SpaceId,
        staged: Vec<Staged>,
        answers: &mut Answers,
    ) -> Vec<Staged> {
        // A node named against a delta base is encoded alone (it reads its base); the others
        // in runs, each run one blocking task.
        let (based, alone): (Vec<Staged>, Vec<Staged>) = staged
            .into_iter()
            .partition(|s| s.node.element.delta_base.is_some());
        let mut encoded: Vec<(Staged, ApiResult<Encoded>)> = futures_util::stream::iter(based)
            .map(|s| async move {
                let encoded = async {
                    let (g, hint) = (&s.generation, s.node.element.delta_base);
                    self.encode_inline(app, space, g, own_content(&s)?, hint)
                        .await
                }
                .await;
                (s, encoded)
            })
            .buffer_unordered(ELEMENT_CONCURRENCY)
            .collect()
            .await;
        let alone = runs(alone, |s| s.node.evidence.content_size as usize);
        let runs: Vec<Vec<(Staged, ApiResult<Encoded>)>> = futures_util::stream::iter(alone)
            .map(|run| self.encode_run(app, space, run))
            .buffer_unordered(RUNS_AT_ONCE)
            .collect()
            .await;
        encoded.extend(runs.into_iter().flatten());
        let failed = |answers: &mut Answers, s: Staged, e: ApiError| {
            tracing::warn!(error = %e.message, hash = %s.node.element.hash, "an inline object could not be written");
            answers.push((s.node.index, Err(e)));
        };
        let mut ready: Vec<Option<Staged>> = Vec::new();
        let (mut objects, mut owners) = (Vec::new(), Vec::new());
        for (mut s, encoded) in encoded {
            match encoded {
                Ok((stored, object)) => {
                    s.object = Some(stored);
                    if let Some(object) = object {
                        objects.push(object);
                        owners.push(ready.len());
                    }
                    ready.push(Some(s));
                }
                Err(e) => failed(answers, s, e),
            }
        }
        let written = self.put_many_bytes(objects).await;
        for (owner, result) in owners.into_iter().zip(written) {
            if let Err(e) = result
                && let Some(s) = ready[owner].take()
            {
                failed(answers, s, e);
            }
        }
        ready.into_iter().flatten().collect()
    }

    /// The first operation: extends the leases of nodes already stored and records a validated
    /// generation for each new one, a few statements for the whole group.
    async fn begin_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        inline: Vec<Inline>,
        answers: &mut Answers,
        one_by_one: &mut Vec<Single>,
    ) -> ApiResult<Vec<Staged>> {
        let now = now_ms();
        let mut p = self.meta.gate(app, space).await?;
        let hashes: Vec<Hash> = inline.iter().map(|n| n.element.hash).collect();
        let mut rows = p.nodes(&hashes).await?;
        let mut leases = Vec::new();
        let mut new = Vec::new();
        for node in inline {
            let hash = node.element.hash;
            let Some(row) = rows.get_mut(&hash).filter(|r| r.is_ready()) else {
                new.push(node);
                continue;
            };
            let duration = self.config.clamp_lease(node.element.lease_duration_ms) as i64;
            let (started, expires) =
                lease_window(row.lease_started_at, row.lease_expires_at, now, duration);
            if (started, expires) != (row.lease_started_at, row.lease_expires_at) {
                (row.lease_started_at, row.lease_expires_at) = (started, expires);
                leases.retain(|(h, _, _)| *h != hash);
                leases.push((hash, started, expires));
            }
            answers.push((
                node.index,
                Ok(LeaseResponse::Ready {
                    hash,
                    lease_started_at: started,
                    lease_expires_at: expires,
                }),
            ));
        }
        p.set_leases(&leases).await?;
        // A node whose lease made a generation that still awaits its upload (as a client's
        // lease without bytes does before it sends them inline) takes that generation over:
        // the bytes are here, validated. One with validated bytes already, an expired one
        // (the single lease retires it; its slot is no longer counted), or a node twice in
        // the group goes one by one.
        let new_hashes: Vec<Hash> = new.iter().map(|n| n.element.hash).collect();
        let active = p.active_generations(&new_hashes).await?;
        let mut seen = HashSet::new();
        let creates = new.iter().any(|n| !active.contains_key(&n.element.hash));
        let mut slots = self.batch_slots(&mut p, now, creates).await?;
        let mut staged = Vec::new();
        let mut taken_over = Vec::new();
        let mut reserved_before = 0;
        let mut created = Vec::new();
        for node in new {
            let hash = node.element.hash;
            if !seen.insert(hash) {
                one_by_one.push(node.back_to_single());
                continue;
            }
            let generation = match active.get(&hash) {
                Some(awaiting)
                    if awaiting.state == GenState::AwaitingUpload && awaiting.expires_at > now =>
                {
                    reserved_before += awaiting.reserved_bytes;
                    let g = Generation {
                        state: GenState::Validated,
                        reserved_bytes: node.canonical_len as i64,
                        expires_at: awaiting
                            .expires_at
                            .max(now + self.config.upload_ttl_ms as i64),
                        evidence: Some(node.evidence.clone()),
                        attempt: awaiting.attempt.max(0) + 1,
                        ..awaiting.clone()
                    };
                    taken_over.push(g.clone());
                    g
                }
                Some(_) => {
                    one_by_one.push(node.back_to_single());
                    continue;
                }
                None => {
                    if !slots.take() {
                        answers.push((node.index, Err(upload_limit())));
                        continue;
                    }
                    let mut g = self.generation_for(&hash, now, Some(node.canonical_len), 1);
                    g.state = GenState::Validated;
                    g.reserved_bytes = node.canonical_len as i64;
                    g.evidence = Some(node.evidence.clone());
                    created.push(g.clone());
                    g
                }
            };
            staged.push(Staged {
                node,
                generation,
                object: None,
            });
        }
        p.validate_awaiting(&taken_over, reserved_before).await?;
        p.create_generations(&created).await?;
        p.commit().await?;
        Ok(staged)
    }

    /// The stored forms of a run of inline nodes named against no delta base
    /// ([`Service::encode_inline_run`]), each with its node.
    async fn encode_run(
        &self,
        app: &AppId,
        space: &SpaceId,
        run: Vec<Staged>,
    ) -> Vec<(Staged, ApiResult<Encoded>)> {
        let mut out = Vec::with_capacity(run.len());
        let mut owned = Vec::with_capacity(run.len());
        for s in run {
            match own_content(&s) {
                Ok(own) => owned.push((s, own)),
                Err(e) => out.push((s, Err(e))),
            }
        }
        let nodes = owned
            .iter()
            .map(|(s, own)| (&s.generation, own.clone()))
            .collect();
        let encoded = self.encode_inline_run(app, space, nodes).await;
        let nodes = owned.into_iter().map(|(s, _)| s);
        match encoded {
            Ok(encoded) => out.extend(nodes.zip(encoded.into_iter().map(Ok))),
            Err(e) => out.extend(nodes.map(|s| (s, Err(e.clone())))),
        }
        out
    }

    /// The second operation: publishes every written node, children before parents. Returns
    /// the answers and the nodes whose delta base is no longer ready (to be stored alone); on a
    /// failure, the indices it concerns and the error.
    async fn finish_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        written: Vec<Staged>,
        one_by_one: &mut Vec<Single>,
    ) -> Result<(Answers, Vec<Staged>), (Vec<usize>, ApiError)> {
        let indices: Vec<usize> = written.iter().map(|s| s.node.index).collect();
        let failed = |e: ApiError| (indices.clone(), e);
        let written: Vec<(Staged, StoredObject)> = written
            .into_iter()
            .filter_map(|mut s| s.object.take().map(|o| (s, o)))
            .collect();
        let publications: Vec<Publication> = written
            .iter()
            .map(|(s, stored)| Publication {
                generation: &s.generation,
                evidence: &s.node.evidence,
                stored: stored.clone(),
                lease_ms: self.config.clamp_lease(s.node.element.lease_duration_ms) as i64,
            })
            .collect();
        let outcomes = async {
            let mut p = self.meta.gate(app, space).await?;
            let outcomes = p.finalize_many(&publications, now_ms()).await?;
            p.commit().await?;
            Ok::<_, sqlx::Error>(outcomes)
        }
        .await
        .map_err(|e| failed(e.into()))?;
        drop(publications);
        let mut answers = Vec::new();
        let mut based_on_gone = Vec::new();
        for ((s, stored), outcome) in written.into_iter().zip(outcomes) {
            let wrote_object = stored.held.is_none();
            let hash = s.generation.hash;
            match outcome {
                FinalizeOutcome::Published { started, expires }
                | FinalizeOutcome::AlreadyReady { started, expires } => {
                    // Published by another request first: this object is unused.
                    if matches!(outcome, FinalizeOutcome::AlreadyReady { .. }) && wrote_object {
                        self.discard_attempt(app, space, &s.generation, true).await;
                    }
                    answers.push((
                        s.node.index,
                        Ok(LeaseResponse::Ready {
                            hash,
                            lease_started_at: started,
                            lease_expires_at: expires,
                        }),
                    ))
                }
                // No child arrived in this group: it waits for them with its bytes staged, as
                // an upload would.
                FinalizeOutcome::MissingChildren(missing) => {
                    let answer = self.stage_waiting(app, space, &s, missing).await;
                    answers.push((s.node.index, answer));
                }
                // GC retired the generation while its object was written: the object is ours
                // to remove, and the element starts over one by one.
                FinalizeOutcome::GenerationGone => {
                    self.discard_attempt(app, space, &s.generation, wrote_object)
                        .await;
                    one_by_one.push(s.node.back_to_single());
                }
                FinalizeOutcome::DeltaBaseGone => based_on_gone.push(s),
            }
        }
        Ok((answers, based_on_gone))
    }

    /// Stages the bytes of a validated inline node whose children are missing, so that the
    /// lease that follows them publishes it.
    async fn stage_waiting(
        &self,
        app: &AppId,
        space: &SpaceId,
        s: &Staged,
        missing: Vec<Hash>,
    ) -> ApiResult<LeaseResponse> {
        let bytes = s.node.bytes.clone();
        let body = Box::pin(futures_util::stream::once(async move {
            Ok::<_, std::io::Error>(bytes)
        }));
        match self
            .staging()
            .store(app, space, &s.generation, body, MAX_INLINE_NODE_BYTES)
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == "UPLOAD_ALREADY_STORED" => {}
            Err(e) => return Err(e),
        }
        Ok(LeaseResponse::ValidatedAwaitingChildren {
            hash: s.generation.hash,
            child_hashes: missing,
        })
    }
}
