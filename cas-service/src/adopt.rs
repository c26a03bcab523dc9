//! Uploads adopted as their nodes' objects. On a filesystem store the bytes a client PUT to the
//! service's own URL are a file already. When re-encoding them gains nothing (no delta base is
//! named, the node is too large to be held in its row, and a sample of its content says it does
//! not compress), the upload is validated where it lies and hard-linked into place as the
//! node's object ([`Encoding::Portable`]: its portable bytes, the own content after the header),
//! so its bytes are written once, not twice, and none are deleted after. On an object store,
//! an upload the client wrote there itself through a presigned URL is read to be validated
//! (its content spooled, as its encoding is not known before), and when its content is then
//! stored as it is, the upload is copied into place within the store, checked to be the very
//! version read (`crate::blob::StagedObject`): the service does not send its bytes again.

use cas_format::{AppId, Hash, SpaceId};

use crate::Service;
use crate::blob::{Encoding, HeldUpload, SpoolFile, StagedObject, node_key, upload_key};
use crate::encode::identity;
use crate::error::{ApiError, ApiResult};
use crate::materialize::{Content, MaterializeError, READ_CHUNK, Validated};
use crate::meta::{Evidence, Generation, StoredObject, TargetKind};

/// Uploads smaller than this are stored anew as before: a copy costs little, and the header an
/// adopted object keeps would be a visible share of what it stores.
const ADOPT_MIN_BYTES: u64 = 64 << 10;

/// Whether an upload is adopted.
pub(crate) enum Adoption {
    /// Validated where it lies, to become its object.
    Adopted(Validated),
    /// To be read and stored anew, from the upload held open when there is one (it is not
    /// opened again); `sampled` is what a sample of it said about compressing it, if one was
    /// taken.
    Copied {
        held: Option<HeldUpload>,
        sampled: Option<bool>,
    },
}

impl Service {
    /// The upload of `g` validated where it lies, to be adopted as its object, or why not
    /// (see the module).
    pub(crate) async fn validate_for_adoption(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
    ) -> Result<Adoption, MaterializeError> {
        let copied = |held, sampled| Ok(Adoption::Copied { held, sampled });
        if g.target != TargetKind::Service {
            return copied(None, None);
        }
        let held = self
            .blobs
            .hold_upload(&upload_key(app, space, &g.gen_id))
            .await
            .map_err(|e| ApiError::storage_unavailable("reading an upload", e))?;
        let Some(held) = held else {
            return copied(None, None);
        };
        if !self.adopts(held.size()) {
            return copied(Some(held), None);
        }
        let sampled = self.upload_compresses(&held).await?;
        if sampled == Some(true) {
            return copied(Some(held), sampled);
        }
        let (evidence, canonical_len) = self.validate_held(&held, &g.hash).await?;
        // A header so large that the content alone would be held or copied: copied.
        if !self.adopts(evidence.content_size.max(0) as u64) {
            return copied(Some(held), sampled);
        }
        Ok(Adoption::Adopted(Validated {
            evidence,
            canonical_len,
            content: Content::Held(held),
        }))
    }

    /// Whether content of `size` bytes is adopted rather than copied: large enough, and not
    /// to be held in its row.
    fn adopts(&self, size: u64) -> bool {
        size >= ADOPT_MIN_BYTES && !self.holds(size)
    }

    /// Whether the upload's sample says it compresses; `None` when compression is off for
    /// its size (nothing is sampled).
    async fn upload_compresses(&self, held: &HeldUpload) -> ApiResult<Option<bool>> {
        let len = held.size();
        if !self.tries_compressing(len) {
            return Ok(None);
        }
        let level = self.config.compress_level;
        crate::compressibility::file_worth_compressing_async(held.file(), len, level)
            .await
            .map(Some)
            .map_err(|e| ApiError::storage_unavailable("reading an upload", e))
    }

    /// Checks the held upload's bytes as [`Service::validate_into`] checks a stream, read in
    /// one blocking task from where they lie.
    async fn validate_held(
        &self,
        held: &HeldUpload,
        hash: &Hash,
    ) -> Result<(Evidence, u64), MaterializeError> {
        let mut check = self.node_check(held.size())?;
        let reading = |e| ApiError::storage_unavailable("reading an upload", e);
        let file = held.file().try_clone().map_err(reading)?;
        let hash = *hash;
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; READ_CHUNK];
            let mut at = 0u64;
            loop {
                let n = file.read_at(&mut buf, at).map_err(reading)?;
                if n == 0 {
                    return check.finish(&hash);
                }
                check.feed(&buf[..n])?;
                at += n as u64;
            }
        })
        .await
        .map_err(|e| ApiError::internal("validating an upload", e))?
    }

    /// Stores own content of `size` bytes that is kept as it is at `key`: an upload of at least
    /// [`ADOPT_MIN_BYTES`] that the client wrote to the object store itself is copied into
    /// place there (its portable bytes, the version validated); anything else, or an upload
    /// no longer the version validated, is the spool file put.
    pub(crate) async fn store_as_is(
        &self,
        key: &str,
        spool: SpoolFile,
        size: u64,
        staged: Option<StagedObject>,
    ) -> ApiResult<StoredObject> {
        if let Some(staged) = staged.filter(|_| size >= ADOPT_MIN_BYTES) {
            Self::put_failpoint().await?;
            match self.blobs.copy_staged(&staged, key).await {
                Ok(true) => {
                    return Ok(StoredObject {
                        encoding: Encoding::Portable,
                        stored_bytes: staged.len as i64,
                        delta: None,
                        held: None,
                    });
                }
                Ok(false) => tracing::warn!(
                    upload = %staged.key,
                    "an upload is not the version validated any more; its content is sent"
                ),
                Err(e) => tracing::warn!(
                    upload = %staged.key,
                    error = %e,
                    "an upload could not be copied into place; its content is sent"
                ),
            }
        }
        self.put(key, spool, size).await?;
        Ok(identity(size))
    }

    /// Makes the validated upload of attempt `g` its object, durably; returns what the row
    /// records (its portable bytes, `canonical_len` long).
    pub(crate) async fn adopt_object(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        held: HeldUpload,
        canonical_len: u64,
    ) -> ApiResult<StoredObject> {
        Self::put_failpoint().await?;
        let key = node_key(app, space, &g.hash, &g.object_name());
        self.blobs
            .adopt(&held, &key)
            .await
            .map_err(|e| ApiError::blob("writing an object", e))?;
        Ok(StoredObject {
            encoding: Encoding::Portable,
            stored_bytes: canonical_len as i64,
            delta: None,
            held: None,
        })
    }
}
