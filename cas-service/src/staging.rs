//! Staging: where the bytes of an upload generation wait until a lease validates them. Each
//! generation has one target ([`TargetKind`]), and every step that touches its bytes goes
//! through [`Staging`]: choosing the target, storing what the service's own URL receives,
//! reading it back for validation, and removing it once published or retired.
//!
//! - `Service`: a temporary object in the blob store, written through the service's URL;
//! - `Inline`: a database row, for small nodes on object stores where one write per node
//!   matters;
//! - `Presigned`: a temporary object the client writes straight to the object store.

use axum::http::StatusCode;
use cas_format::{AppId, SpaceId};

use crate::blob::{BlobStore, BodyStream, ObjectReader, PutOnceError, StagedObject, upload_key};
use crate::error::{ApiError, ApiResult};
use crate::meta::{Generation, MetaStore, TargetKind};

/// The staged bytes of upload generations.
pub struct Staging<'a> {
    pub blobs: &'a BlobStore,
    pub meta: &'a MetaStore,
}

impl TargetKind {
    /// The target of a new generation: the service's own URL on a filesystem store; on an
    /// object store, the database for a node declared at most `small` bytes (one object write
    /// at publication instead of four), else a presigned URL of the store itself.
    pub fn choose(presigns: bool, declared: Option<u64>, small: u64, max: u64) -> TargetKind {
        match (presigns, declared) {
            (false, _) => TargetKind::Service,
            (true, Some(n)) if n <= small.min(max) => TargetKind::Inline,
            (true, _) => TargetKind::Presigned,
        }
    }
}

pub(crate) fn already_stored() -> ApiError {
    ApiError::new(
        StatusCode::PRECONDITION_FAILED,
        "UPLOAD_ALREADY_STORED",
        "this upload URL has already been used",
    )
}

pub(crate) fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
        format!("an upload may hold at most {limit} bytes"),
    )
}

async fn collect_bounded(mut stream: BodyStream, limit: u64) -> ApiResult<Vec<u8>> {
    use futures_util::StreamExt;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::invalid(format!("the upload body could not be read: {e}")))?;
        if out.len() as u64 + chunk.len() as u64 > limit {
            return Err(too_large(limit));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

impl Staging<'_> {
    /// Stores what the service's own URL of `g` received (at most `limit` bytes), once.
    pub async fn store(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        body: BodyStream,
        limit: u64,
    ) -> ApiResult<u64> {
        match g.target {
            TargetKind::Inline => {
                // The bytes go to the database, on this host's disk when it is SQLite.
                self.blobs
                    .spool()
                    .check_free()
                    .await
                    .map_err(|e| ApiError::blob("storing an upload", e))?;
                let bytes = collect_bounded(body, limit).await?;
                if !self.meta.put_upload_body(&g.gen_id, &bytes).await? {
                    return Err(already_stored());
                }
                Ok(bytes.len() as u64)
            }
            TargetKind::Service | TargetKind::Presigned => {
                match self
                    .blobs
                    .put_once(&upload_key(app, space, &g.gen_id), body, limit)
                    .await
                {
                    Ok(n) => Ok(n),
                    Err(PutOnceError::Exists) => Err(already_stored()),
                    Err(PutOnceError::TooLarge(n)) => Err(too_large(n)),
                    Err(PutOnceError::Body(e)) => Err(ApiError::invalid(format!(
                        "the upload body could not be read: {e}"
                    ))),
                    Err(PutOnceError::Store(e)) => Err(ApiError::blob("storing an upload", e)),
                }
            }
        }
    }

    /// The bytes uploaded for `g` and their length, if anything was uploaded yet; for an
    /// upload in an object store that copies within itself, which version was read (it can be
    /// copied into place, `crate::adopt`).
    pub async fn open(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
    ) -> ApiResult<Option<(ObjectReader, u64, Option<StagedObject>)>> {
        match g.target {
            TargetKind::Inline => Ok(self.meta.upload_body(&g.gen_id).await?.map(|body| {
                let len = body.len() as u64;
                (
                    Box::pin(std::io::Cursor::new(body)) as ObjectReader,
                    len,
                    None,
                )
            })),
            TargetKind::Service | TargetKind::Presigned => self
                .blobs
                .get_staged(&upload_key(app, space, &g.gen_id))
                .await
                .map_err(|e| ApiError::storage_unavailable("reading an upload", e)),
        }
    }

    /// Removes the bytes of a generation just published, where the service itself guards
    /// write-once (its own URL, the database). A presigned target keeps its object until its
    /// URL has expired (a late PUT could otherwise write it again); GC removes it then.
    pub async fn discard_published(&self, app: &AppId, space: &SpaceId, g: &Generation) {
        let result = match g.target {
            TargetKind::Service => self
                .blobs
                .delete(&upload_key(app, space, &g.gen_id))
                .await
                .map_err(|e| e.to_string()),
            TargetKind::Inline => self
                .meta
                .delete_upload_body(&g.gen_id)
                .await
                .map_err(|e| e.to_string()),
            TargetKind::Presigned => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not delete upload bytes; GC will");
        }
    }

    /// Removes whatever bytes a retired or long-published generation still has in the blob
    /// store (a database row goes with the generation's row); whether that worked.
    pub async fn delete(&self, app: &AppId, space: &SpaceId, g: &Generation) -> bool {
        match g.target {
            TargetKind::Inline => true,
            TargetKind::Service | TargetKind::Presigned => {
                match self.blobs.delete(&upload_key(app, space, &g.gen_id)).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, "object delete failed; the next pass retries");
                        false
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let mib = 1 << 20;
        assert_eq!(
            TargetKind::choose(false, Some(10), mib, 32 * mib),
            TargetKind::Service
        );
        assert_eq!(
            TargetKind::choose(true, Some(10), mib, 32 * mib),
            TargetKind::Inline
        );
        assert_eq!(
            TargetKind::choose(true, Some(mib), mib, 32 * mib),
            TargetKind::Inline
        );
        assert_eq!(
            TargetKind::choose(true, Some(mib + 1), mib, 32 * mib),
            TargetKind::Presigned
        );
        assert_eq!(
            TargetKind::choose(true, None, mib, 32 * mib),
            TargetKind::Presigned
        );
        // A small-upload threshold above the node limit is the node limit.
        assert_eq!(
            TargetKind::choose(true, Some(2048), 4096, 1024),
            TargetKind::Presigned
        );
    }
}
