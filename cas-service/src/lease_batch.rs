//! Batch leases: up to [`MAX_BATCH_LEASES`] leases in one request, each answered as the single
//! lease would be (or with its own error), in order. A small node may travel inline, so that a
//! small new node costs one element of one request.
//!
//! Inline nodes are published together: their bytes are validated in memory first, then one
//! partition operation extends the leases of those already stored and records a validated
//! upload generation for each new one, their objects are written, and a second operation
//! publishes them all (children before parents). Whatever does not fit that path (an upload
//! already under way for the hash, bytes that are not a valid node, a generation retired
//! meanwhile) and every element without inline bytes is leased one by one, concurrently; those
//! partition operations meet in the metadata store's batch commits
//! ([`server_kit::group_commit`]).

use std::collections::HashSet;

use axum::http::StatusCode;
use base64::Engine;
use bytes::Bytes;
use cas_format::wire::{
    BatchLeaseElement, BatchLeaseResult, ErrorBody, LeaseResponse, MAX_BATCH_LEASES,
    MAX_INLINE_NODE_BYTES,
};
use cas_format::{AppId, Hash, SpaceId};
use futures_util::StreamExt;

use crate::error::{ApiError, ApiResult};
use crate::lease::{check_lease_duration, lease_window, upload_limit};
use crate::materialize::MaterializeError;
use crate::meta::{Evidence, FinalizeOutcome, GenState, Generation, Publication, StoredObject};
use crate::{Service, now_ms};

/// Elements of one batch in flight at once.
const ELEMENT_CONCURRENCY: usize = 32;
/// Inline nodes published by one pair of partition operations: a client's batch of 100 small
/// nodes is one group, whose statements cost about as much as a group of 32.
const INLINE_GROUP: usize = 128;
/// Groups of inline nodes of one batch under way at once.
const INLINE_GROUPS_AT_ONCE: usize = 4;

/// Refuses a batch as a whole: empty or too long.
pub fn check_batch(elements: &[BatchLeaseElement]) -> ApiResult<()> {
    if elements.is_empty() {
        return Err(ApiError::invalid("leases must not be empty"));
    }
    if elements.len() > MAX_BATCH_LEASES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("a batch may hold at most {MAX_BATCH_LEASES} leases; split it"),
        ));
    }
    Ok(())
}

/// The inline bytes of an element, checked against its size limit and its hash.
fn inline_bytes(hash: &Hash, content: &str) -> ApiResult<Bytes> {
    // Base64 of the limit is a third longer: refuse more before decoding.
    if content.len() as u64 > (MAX_INLINE_NODE_BYTES.div_ceil(3)) * 4 {
        return Err(inline_too_large());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(content)
        .map_err(|_| ApiError::invalid("content is not standard base64"))?;
    if bytes.len() as u64 > MAX_INLINE_NODE_BYTES {
        return Err(inline_too_large());
    }
    if Hash::digest(&bytes) != *hash {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "NODE_DIGEST_MISMATCH",
            "the inline content does not hash to the element's hash",
        ));
    }
    Ok(Bytes::from(bytes))
}

fn inline_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!("inline content may be at most {MAX_INLINE_NODE_BYTES} bytes; upload it instead"),
    )
}

/// An inline node whose bytes proved valid, on its way to being published with the others.
struct Inline {
    index: usize,
    /// The element, without its inline bytes.
    element: BatchLeaseElement,
    /// The portable bytes, decoded.
    bytes: Bytes,
    evidence: Evidence,
    canonical_len: u64,
}

impl Inline {
    /// The element as it came, for the one-by-one path.
    fn back_to_single(self) -> (usize, BatchLeaseElement) {
        (self.index, with_content(self.element, &self.bytes))
    }
}

/// An element with its inline bytes encoded again.
fn with_content(mut e: BatchLeaseElement, bytes: &[u8]) -> BatchLeaseElement {
    e.content = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
    e
}

/// What the first look at an element found.
enum Checked {
    Inline(Inline),
    Single(usize, BatchLeaseElement),
    Refused(usize, ApiError),
}

/// An inline node with its validated generation and, once written, its object.
struct Staged {
    node: Inline,
    generation: Generation,
    object: Option<StoredObject>,
}

/// Answers to some elements of a batch, by index.
type Answers = Vec<(usize, ApiResult<LeaseResponse>)>;

fn error_result(e: ApiError) -> BatchLeaseResult {
    BatchLeaseResult::Error(ErrorBody {
        error: e.code.to_string(),
        message: e.message,
    })
}

impl Service {
    /// Leases every element; one result per element, in order.
    pub async fn lease_batch(
        &self,
        app: &AppId,
        space: &SpaceId,
        elements: Vec<BatchLeaseElement>,
    ) -> Vec<BatchLeaseResult> {
        let mut results: Vec<Option<BatchLeaseResult>> = elements.iter().map(|_| None).collect();
        // Validate inline bytes first, concurrently; the rest goes one by one.
        let checked: Vec<Checked> = futures_util::stream::iter(elements.into_iter().enumerate())
            .map(|(index, e)| self.check_inline(index, e))
            .buffered(ELEMENT_CONCURRENCY)
            .collect()
            .await;
        let mut one_by_one = Vec::new();
        let mut inline = Vec::new();
        for checked in checked {
            match checked {
                Checked::Inline(node) => inline.push(node),
                Checked::Refused(index, e) => results[index] = Some(error_result(e)),
                Checked::Single(index, e) => one_by_one.push((index, e)),
            }
        }
        // In groups, several at once: one group's objects are written while another's rows
        // are.
        let mut groups = Vec::new();
        while !inline.is_empty() {
            let rest = inline.split_off(inline.len().min(INLINE_GROUP));
            groups.push(std::mem::replace(&mut inline, rest));
        }
        let published: Vec<(Answers, Vec<(usize, BatchLeaseElement)>)> =
            futures_util::stream::iter(groups)
                .map(|group| async move {
                    let mut fallback = Vec::new();
                    let answers = self.publish_inline(app, space, group, &mut fallback).await;
                    (answers, fallback)
                })
                .buffer_unordered(INLINE_GROUPS_AT_ONCE)
                .collect()
                .await;
        for (answers, fallback) in published {
            one_by_one.extend(fallback);
            for (index, answer) in answers {
                results[index] = Some(match answer {
                    Ok(r) => BatchLeaseResult::Lease(self.outcome(r)),
                    Err(e) => error_result(e),
                });
            }
        }
        let singles: Vec<(usize, BatchLeaseResult)> = futures_util::stream::iter(one_by_one)
            .map(|(index, e)| async move {
                match self.lease_element(app, space, e).await {
                    Ok(r) => (index, BatchLeaseResult::Lease(r)),
                    Err(e) => (index, error_result(e)),
                }
            })
            .buffer_unordered(ELEMENT_CONCURRENCY)
            .collect()
            .await;
        for (index, r) in singles {
            results[index] = Some(r);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| error_result(ApiError::unavailable("not leased; retry"))))
            .collect()
    }

    /// Validates an element's inline bytes in memory. An element without them, or whose bytes
    /// are not a valid node, is leased one by one (which answers with the rejection, as for an
    /// upload).
    async fn check_inline(&self, index: usize, mut e: BatchLeaseElement) -> Checked {
        if let Err(err) = check_lease_duration(e.lease_duration_ms) {
            return Checked::Refused(index, err);
        }
        let Some(content) = e.content.take() else {
            return Checked::Single(index, e);
        };
        let bytes = match inline_bytes(&e.hash, &content) {
            Ok(bytes) => bytes,
            Err(err) => return Checked::Refused(index, err),
        };
        drop(content);
        match self.validate_inline(&e, &bytes).await {
            Ok(Some((evidence, canonical_len))) => Checked::Inline(Inline {
                index,
                element: e,
                bytes,
                evidence,
                canonical_len,
            }),
            Ok(None) => Checked::Single(index, with_content(e, &bytes)),
            Err(err) => Checked::Refused(index, err),
        }
    }

    /// The evidence of valid inline bytes; `None` if they are not a valid node.
    async fn validate_inline(
        &self,
        e: &BatchLeaseElement,
        bytes: &Bytes,
    ) -> ApiResult<Option<(Evidence, u64)>> {
        let _permit = self
            .validations
            .acquire()
            .await
            .map_err(|_| ApiError::unavailable("shutting down"))?;
        // Nothing is spooled yet: the bytes are in memory, and are written once it is known
        // that the node is new.
        let validated = self
            .validate_into(&bytes[..], bytes.len() as u64, &e.hash, tokio::io::sink())
            .await;
        match validated {
            Ok(found) => Ok(Some(found)),
            Err(MaterializeError::Failed(e)) => Err(e),
            Err(MaterializeError::Rejected(_) | MaterializeError::NotUploaded) => Ok(None),
        }
    }

    /// Publishes validated inline nodes in two partition operations; answers each by index.
    /// Nodes this path cannot take are appended to `one_by_one`.
    async fn publish_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        inline: Vec<Inline>,
        one_by_one: &mut Vec<(usize, BatchLeaseElement)>,
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

    /// Writes the objects of staged inline nodes, concurrently; answers those that failed
    /// and returns the others.
    async fn write_inline_all(
        &self,
        app: &AppId,
        space: &SpaceId,
        staged: Vec<Staged>,
        answers: &mut Answers,
    ) -> Vec<Staged> {
        let staged: Vec<Staged> = futures_util::stream::iter(staged)
            .map(|mut s| async move {
                match self.write_inline(app, space, &s).await {
                    Ok(object) => s.object = Some(object),
                    Err(e) => tracing::warn!(error = %e.message, hash = %s.node.element.hash, "an inline object could not be written"),
                }
                s
            })
            .buffer_unordered(ELEMENT_CONCURRENCY)
            .collect()
            .await;
        let (written, failed): (Vec<Staged>, Vec<Staged>) =
            staged.into_iter().partition(|s| s.object.is_some());
        for s in failed {
            answers.push((
                s.node.index,
                Err(ApiError::storage_unavailable(
                    "writing an object",
                    "the object store refused an inline node",
                )),
            ));
        }
        written
    }

    /// The first operation: extends the leases of nodes already stored and records a validated
    /// generation for each new one, a few statements for the whole group.
    async fn begin_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        inline: Vec<Inline>,
        answers: &mut Answers,
        one_by_one: &mut Vec<(usize, BatchLeaseElement)>,
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
        // A node with an upload under way, or twice in the group, goes one by one.
        let new_hashes: Vec<Hash> = new.iter().map(|n| n.element.hash).collect();
        let active = p.active_generations(&new_hashes).await?;
        let mut seen = HashSet::new();
        let mut slots = if new.is_empty() {
            None
        } else {
            self.upload_slots(&mut p, now).await?
        };
        let mut staged = Vec::new();
        for node in new {
            let hash = node.element.hash;
            if active.contains_key(&hash) || !seen.insert(hash) {
                one_by_one.push(node.back_to_single());
                continue;
            }
            if let Some(left) = slots.as_mut() {
                if *left == 0 {
                    answers.push((node.index, Err(upload_limit())));
                    continue;
                }
                *left -= 1;
            }
            let mut generation = self.generation_for(&hash, now, Some(node.canonical_len), 1);
            generation.state = GenState::Validated;
            generation.reserved_bytes = node.canonical_len as i64;
            generation.evidence = Some(node.evidence.clone());
            staged.push(Staged {
                node,
                generation,
                object: None,
            });
        }
        let generations: Vec<Generation> = staged.iter().map(|s| s.generation.clone()).collect();
        p.create_generations(&generations).await?;
        p.commit().await?;
        Ok(staged)
    }

    /// Writes an inline node's object at its generation's key: the own content, which is the
    /// tail of the portable bytes validated before.
    async fn write_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        s: &Staged,
    ) -> ApiResult<StoredObject> {
        let bytes = &s.node.bytes;
        let size = s.node.evidence.content_size as u64;
        let start = bytes.len().checked_sub(size as usize).ok_or_else(|| {
            ApiError::internal("spooling an inline node", "its content outgrows its bytes")
        })?;
        let own = bytes.slice(start..);
        self.write_content(app, space, &s.generation, own, s.node.element.delta_base)
            .await
    }

    /// The second operation: publishes every written node, children before parents. Returns
    /// the answers and the nodes whose delta base is no longer ready (to be stored alone); on a
    /// failure, the indices it concerns and the error.
    async fn finish_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        written: Vec<Staged>,
        one_by_one: &mut Vec<(usize, BatchLeaseElement)>,
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

    async fn lease_element(
        &self,
        app: &AppId,
        space: &SpaceId,
        e: BatchLeaseElement,
    ) -> ApiResult<LeaseResponse> {
        let Some(content) = e.content else {
            return self
                .lease(
                    app,
                    space,
                    &e.hash,
                    e.lease_duration_ms,
                    e.upload_bytes,
                    e.delta_base,
                )
                .await;
        };
        let bytes = inline_bytes(&e.hash, &content)?;
        drop(content);
        let len = Some(bytes.len() as u64);
        match self
            .lease(app, space, &e.hash, e.lease_duration_ms, len, e.delta_base)
            .await?
        {
            LeaseResponse::AwaitingUpload { .. }
            | LeaseResponse::AwaitingReplacementUpload { .. } => {
                self.stage_inline(app, space, &e.hash, bytes).await?;
                self.lease(app, space, &e.hash, e.lease_duration_ms, len, e.delta_base)
                    .await
            }
            other => Ok(other),
        }
    }

    /// Stages `bytes` as the upload of the node's awaiting generation (unless something was
    /// uploaded there already: then the next lease validates that).
    async fn stage_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        bytes: Bytes,
    ) -> ApiResult<()> {
        let Some(g) = self.meta.active_generation(app, space, hash).await? else {
            return Ok(());
        };
        if g.state != GenState::AwaitingUpload {
            return Ok(());
        }
        let body = Box::pin(futures_util::stream::once(async move {
            Ok::<_, std::io::Error>(bytes)
        }));
        match self
            .staging()
            .store(app, space, &g, body, MAX_INLINE_NODE_BYTES)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == "UPLOAD_ALREADY_STORED" => Ok(()),
            Err(e) => Err(e),
        }
    }
}
