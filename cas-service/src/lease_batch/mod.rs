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
        // Validate inline bytes first, concurrently; then publish the inline nodes and answer
        // the elements without bytes together; the rest goes one by one.
        let checked: Vec<Checked> = futures_util::stream::iter(elements.into_iter().enumerate())
            .map(|(index, e)| self.check_inline(index, e))
            .buffered(ELEMENT_CONCURRENCY)
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

    /// Validates an element's inline bytes in memory, on a blocking thread (decoding and
    /// hashing a batch's elements is most of its CPU, which is then spread over the cores). An
    /// element without them, or whose bytes are not a valid node, is leased one by one (which
    /// answers with the rejection, as for an upload).
    async fn check_inline(&self, index: usize, element: Element) -> Checked {
        let Element { lease: e, content } = element;
        if let Err(err) = check_lease_duration(e.lease_duration_ms) {
            return Checked::Refused(index, err);
        }
        let Some(content) = content else {
            return Checked::Single((index, e, None));
        };
        let Ok(_permit) = self.validations.acquire().await else {
            return Checked::Refused(index, ApiError::unavailable("shutting down"));
        };
        let (svc, hash) = (self.clone(), e.hash);
        // The validation hashes the bytes; bytes that do not hash to the element's hash are
        // refused by the one-by-one path, as any invalid node is. Nothing is spooled yet: the
        // bytes are in memory, and are written once it is known that the node is new.
        let checked = tokio::task::spawn_blocking(move || {
            let bytes = decode_inline(content)?;
            let found = svc.validate_bytes(&bytes, &hash);
            Ok::<_, ApiError>((bytes, found))
        })
        .await;
        match checked {
            Err(join) => Checked::Refused(index, ApiError::internal("validating a node", join)),
            Ok(Err(err)) | Ok(Ok((_, Err(MaterializeError::Failed(err))))) => {
                Checked::Refused(index, err)
            }
            Ok(Ok((bytes, Ok((evidence, canonical_len))))) => Checked::Inline(Inline {
                index,
                element: e,
                bytes,
                evidence,
                canonical_len,
            }),
            Ok(Ok((bytes, Err(MaterializeError::Rejected(_) | MaterializeError::NotUploaded)))) => {
                Checked::Single((index, e, Some(bytes)))
            }
        }
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
