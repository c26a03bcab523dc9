//! Batch leases: up to [`MAX_BATCH_LEASES`] leases in one request, each answered as the single
//! lease would be (or with its own error), in order. A small node may travel inline, so that a
//! small new node costs one element of one request.
//!
//! Inline nodes are published together ([`inline`]); elements without bytes get their common
//! answers (ready, or a new upload generation) together too ([`plain`]). Whatever does not fit
//! those paths (an upload under way for the hash, bytes that are not a valid node, a
//! generation retired meanwhile) is leased one by one, concurrently; those partition
//! operations meet in the metadata store's batch commits ([`server_kit::group_commit`]).

mod body;
mod inline;
mod plain;

use axum::http::StatusCode;
use base64::Engine;
use bytes::Bytes;
use cas_format::wire::{
    BatchLeaseElement, BatchLeaseResult, ErrorBody, LeaseResponse, MAX_BATCH_LEASES,
    MAX_INLINE_NODE_BYTES,
};
use cas_format::{AppId, Hash, SpaceId};
use futures_util::StreamExt;

use crate::Service;
use crate::error::{ApiError, ApiResult};
use crate::lease::check_lease_duration;
use crate::materialize::MaterializeError;
use crate::meta::{GenState, Partition};
pub use body::{Content, Element, binary_elements, is_binary, json_elements};
use inline::Inline;

/// Elements of one batch in flight at once.
pub(super) const ELEMENT_CONCURRENCY: usize = 32;

/// Inline bytes in one run of a batch's nodes: a run's CPU work (decoding and hashing, then
/// compressing) is one blocking task, so that a batch of small nodes is a few hand-offs to the
/// blocking threads rather than one (and a wake-up for its result) per node, while a large
/// batch still spreads over the cores.
const RUN_BYTES: usize = 256 << 10;
/// Most nodes in one run.
const RUN_NODES: usize = 64;
/// Runs of one batch under way at once.
pub(super) const RUNS_AT_ONCE: usize = 8;

/// `items` in order, cut into runs of at most [`RUN_NODES`] items and about [`RUN_BYTES`] (a
/// run takes at least one item).
pub(super) fn runs<T>(items: Vec<T>, len: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut runs: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let n = len(&item);
        match runs.last_mut() {
            Some(run) if run.len() < RUN_NODES && bytes + n <= RUN_BYTES => run.push(item),
            _ => {
                bytes = 0;
                runs.push(vec![item]);
            }
        }
        bytes += n;
    }
    runs
}

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

/// The inline bytes of an element, checked against its size limit only.
fn decode_inline(content: Content) -> ApiResult<Bytes> {
    let bytes = match content {
        Content::Raw(bytes) => bytes,
        Content::Base64(text) => {
            // Base64 of the limit is a third longer: refuse more before decoding.
            if text.len() as u64 > (MAX_INLINE_NODE_BYTES.div_ceil(3)) * 4 {
                return Err(inline_too_large());
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|_| ApiError::invalid("content is not standard base64"))?;
            Bytes::from(bytes)
        }
    };
    if bytes.len() as u64 > MAX_INLINE_NODE_BYTES {
        return Err(inline_too_large());
    }
    Ok(bytes)
}

fn inline_too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!("inline content may be at most {MAX_INLINE_NODE_BYTES} bytes; upload it instead"),
    )
}

/// An element for the one-by-one path: its index, its lease and its inline bytes, decoded.
pub(super) type Single = (usize, BatchLeaseElement, Option<Bytes>);

/// What the first look at an element found.
enum Checked {
    Inline(Inline),
    Single(Single),
    Refused(usize, ApiError),
}

/// Answers to some elements of a batch, by index.
pub(super) type Answers = Vec<(usize, ApiResult<LeaseResponse>)>;

/// The upload slots one partition operation of a batch may still give out (`None`: the Space
/// has no limit).
pub(super) struct Slots(Option<u64>);

impl Slots {
    /// Takes one; `false` when none is left.
    pub(super) fn take(&mut self) -> bool {
        match &mut self.0 {
            None => true,
            Some(0) => false,
            Some(left) => {
                *left -= 1;
                true
            }
        }
    }
}

fn error_result(e: ApiError) -> BatchLeaseResult {
    BatchLeaseResult::Error(ErrorBody {
        error: e.code.to_string(),
        message: e.message,
    })
}

impl Service {
    /// The Space's upload slots left, read only when the operation creates generations.
    pub(super) async fn batch_slots(
        &self,
        p: &mut Partition,
        now: i64,
        creates: bool,
    ) -> Result<Slots, sqlx::Error> {
        Ok(Slots(if creates {
            self.upload_slots(p, now).await?
        } else {
            None
        }))
    }

    /// Leases every element; one result per element, in order.
    pub async fn lease_batch(
        &self,
        app: &AppId,
        space: &SpaceId,
        elements: Vec<Element>,
    ) -> Vec<BatchLeaseResult> {
        let mut results: Vec<Option<BatchLeaseResult>> = elements.iter().map(|_| None).collect();
        // Validate inline bytes first, in runs, concurrently; then publish the inline nodes and
        // answer the elements without bytes together; the rest goes one by one.
        let elements = runs(elements.into_iter().enumerate().collect(), |(_, e)| {
            e.content.as_ref().map_or(0, Content::node_len)
        });
        let checked: Vec<Checked> = futures_util::stream::iter(elements)
            .map(|run| self.check_run(run))
            .buffered(RUNS_AT_ONCE)
            .flat_map(futures_util::stream::iter)
            .collect()
            .await;
        let mut one_by_one = Vec::new();
        let mut inline = Vec::new();
        let mut plain = Vec::new();
        for checked in checked {
            match checked {
                Checked::Inline(node) => inline.push(node),
                Checked::Single((index, e, None)) => plain.push((index, e)),
                Checked::Refused(index, e) => results[index] = Some(error_result(e)),
                Checked::Single(single) => one_by_one.push(single),
            }
        }
        let (mut answers, fallback) = self.publish_all_inline(app, space, inline).await;
        one_by_one.extend(fallback);
        let plain_indices: Vec<usize> = plain.iter().map(|(i, _)| *i).collect();
        match self.lease_plain(app, space, plain).await {
            Ok((plain_answers, fallback)) => {
                answers.extend(plain_answers);
                one_by_one.extend(fallback.into_iter().map(|(i, e)| (i, e, None)));
            }
            Err(e) => answers.extend(plain_indices.into_iter().map(|i| (i, Err(e.clone())))),
        }
        for (index, answer) in answers {
            results[index] = Some(match answer {
                Ok(r) => BatchLeaseResult::Lease(self.outcome(r)),
                Err(e) => error_result(e),
            });
        }
        let singles: Vec<(usize, BatchLeaseResult)> = futures_util::stream::iter(one_by_one)
            .map(|(index, e, bytes)| async move {
                match self.lease_element(app, space, e, bytes).await {
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

    /// Validates the inline bytes of a run of elements in memory, on one blocking thread
    /// (decoding and hashing a batch's elements is most of its CPU, which the runs spread over
    /// the cores); one answer per element, in order. An element without them, or whose bytes
    /// are not a valid node, is leased one by one (which answers with the rejection, as for an
    /// upload).
    async fn check_run(&self, run: Vec<(usize, Element)>) -> Vec<Checked> {
        // Each element's answer, or its index while its bytes await validation.
        let mut checked: Vec<Result<Checked, usize>> = Vec::with_capacity(run.len());
        let mut inline = Vec::new();
        for (index, Element { lease: e, content }) in run {
            match (check_lease_duration(e.lease_duration_ms), content) {
                (Err(err), _) => checked.push(Ok(Checked::Refused(index, err))),
                (Ok(()), None) => checked.push(Ok(Checked::Single((index, e, None)))),
                (Ok(()), Some(content)) => {
                    inline.push((checked.len(), index, e, content));
                    checked.push(Err(index));
                }
            }
        }
        if inline.is_empty() {
            return checked.into_iter().flatten().collect();
        }
        // The answers when the validation cannot run: those awaiting it refused with `e`.
        let refused = |checked: Vec<Result<Checked, usize>>, e: ApiError| -> Vec<Checked> {
            let refuse = |index| Checked::Refused(index, e.clone());
            checked
                .into_iter()
                .map(|c| c.unwrap_or_else(refuse))
                .collect()
        };
        let Ok(_permit) = self.validations.acquire().await else {
            return refused(checked, ApiError::unavailable("shutting down"));
        };
        // The validation hashes the bytes; bytes that do not hash to the element's hash are
        // refused by the one-by-one path, as any invalid node is. Nothing is spooled yet: the
        // bytes are in memory, and are written once it is known that the node is new.
        let svc = self.clone();
        let validated = tokio::task::spawn_blocking(move || {
            inline
                .into_iter()
                .map(|(at, index, e, content)| {
                    let found = decode_inline(content).map(|bytes| {
                        let found = svc.validate_bytes(&bytes, &e.hash);
                        (bytes, found)
                    });
                    (at, index, e, found)
                })
                .collect::<Vec<_>>()
        })
        .await;
        let validated = match validated {
            Ok(v) => v,
            Err(join) => return refused(checked, ApiError::internal("validating a node", join)),
        };
        for (at, index, e, found) in validated {
            checked[at] = Ok(match found {
                Err(err) | Ok((_, Err(MaterializeError::Failed(err)))) => {
                    Checked::Refused(index, err)
                }
                Ok((bytes, Ok((evidence, canonical_len)))) => Checked::Inline(Inline {
                    index,
                    element: e,
                    bytes,
                    evidence,
                    canonical_len,
                }),
                Ok((bytes, Err(MaterializeError::Rejected(_) | MaterializeError::NotUploaded))) => {
                    Checked::Single((index, e, Some(bytes)))
                }
            });
        }
        checked.into_iter().flatten().collect()
    }

    async fn lease_element(
        &self,
        app: &AppId,
        space: &SpaceId,
        e: BatchLeaseElement,
        bytes: Option<Bytes>,
    ) -> ApiResult<LeaseResponse> {
        let Some(bytes) = bytes else {
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
        if Hash::digest(&bytes) != e.hash {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "NODE_DIGEST_MISMATCH",
                "the inline content does not hash to the element's hash",
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_keep_order_and_bounds() {
        // Small nodes, a node larger than a run, then tiny ones: more than a run's count.
        let sizes: Vec<usize> = (0..40)
            .map(|i| 1024 * (1 + i % 9))
            .chain([RUN_BYTES + 1])
            .chain(std::iter::repeat_n(10, 150))
            .collect();
        let items: Vec<(usize, usize)> = sizes.iter().copied().enumerate().collect();
        let cut = runs(items.clone(), |(_, n)| *n);
        assert_eq!(cut.concat(), items, "every item, in order");
        for run in &cut {
            assert!(!run.is_empty() && run.len() <= RUN_NODES);
            let bytes: usize = run.iter().map(|(_, n)| n).sum();
            assert!(
                run.len() == 1 || bytes <= RUN_BYTES,
                "{bytes} bytes in a run"
            );
        }
        let alone = cut.iter().find(|r| r[0].1 > RUN_BYTES).unwrap();
        assert_eq!(
            alone.len(),
            1,
            "a node larger than a run is a run of its own"
        );
        // Runs are full before a new one starts: 150 tiny nodes take three runs.
        assert_eq!(cut.iter().filter(|r| r[0].1 == 10).count(), 3);
        assert!(runs(Vec::<usize>::new(), |n| *n).is_empty());
    }
}
