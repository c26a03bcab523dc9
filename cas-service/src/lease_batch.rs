//! Batch leases: up to [`MAX_BATCH_LEASES`] leases in one request, each answered as the single
//! lease would be (or with its own error), in order. A small node may travel inline: its
//! portable bytes are staged as an upload of the lease's generation and published by the same
//! element, so a small new node costs one element of one request.
//!
//! Elements run concurrently; their partition operations meet in the metadata store's batch
//! commits ([`server_kit::group_commit`]), so a batch costs a few durable commits, not one per
//! element.

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
use crate::meta::GenState;

/// Elements of one batch in flight at once.
const ELEMENT_CONCURRENCY: usize = 32;

/// Refuses a batch as a whole: empty or too long.
pub fn check_batch(elements: &[BatchLeaseElement]) -> ApiResult<()> {
    if elements.is_empty() {
        return Err(ApiError::invalid("leases must not be empty"));
    }
    if elements.len() > MAX_BATCH_LEASES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "TOO_MANY_LEASES",
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
        "NODE_TOO_LARGE",
        format!("inline content may be at most {MAX_INLINE_NODE_BYTES} bytes; upload it instead"),
    )
}

impl Service {
    /// Leases every element; one result per element, in order.
    pub async fn lease_batch(
        &self,
        app: &AppId,
        space: &SpaceId,
        elements: Vec<BatchLeaseElement>,
    ) -> Vec<BatchLeaseResult> {
        futures_util::stream::iter(elements)
            .map(|e| async move {
                match self.lease_element(app, space, e).await {
                    Ok(r) => BatchLeaseResult::Lease(r),
                    Err(e) => BatchLeaseResult::Error(ErrorBody {
                        error: e.code.to_string(),
                        message: e.message,
                    }),
                }
            })
            .buffered(ELEMENT_CONCURRENCY)
            .collect()
            .await
    }

    async fn lease_element(
        &self,
        app: &AppId,
        space: &SpaceId,
        e: BatchLeaseElement,
    ) -> ApiResult<LeaseResponse> {
        let Some(content) = e.content else {
            return self
                .lease(app, space, &e.hash, e.lease_duration_ms, e.upload_bytes)
                .await;
        };
        let bytes = inline_bytes(&e.hash, &content)?;
        drop(content);
        let len = Some(bytes.len() as u64);
        match self
            .lease(app, space, &e.hash, e.lease_duration_ms, len)
            .await?
        {
            LeaseResponse::AwaitingUpload { .. }
            | LeaseResponse::AwaitingReplacementUpload { .. } => {
                self.stage_inline(app, space, &e.hash, bytes).await?;
                self.lease(app, space, &e.hash, e.lease_duration_ms, len)
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
