//! Where a row's stored bytes are: an object of its own, an entry of a pack (`crate::pack`),
//! or held with the row in the database. A small node (one the packer takes) is published with
//! its stored bytes held, in the same transaction as its row, not written as an object of its
//! own, so a small upload costs no object write; the packer later moves it into a pack and
//! drops the held bytes. Held bytes over 2 KiB are kept beside the row, not in it
//! (`held_apart`, keyed as the row; the row's `held` flag says its bytes are held, wherever),
//! so that the updates of a row's small columns do not read and rewrite them.

use bytes::Bytes;
use cas_format::{AppId, SpaceId};

use crate::Service;
use crate::delta::{ContentError, IN_MEMORY_MAX, integrity};
use crate::error::ApiError;
use crate::meta::NodeRow;

impl Service {
    /// Whether a node of `size` content bytes is held in its row until it is packed, rather
    /// than written as an object of its own (only nodes the packer takes).
    pub(crate) fn holds(&self, size: u64) -> bool {
        let max = self
            .config
            .hold_max_bytes
            .min(self.config.pack_max_node_bytes);
        max > 0 && size <= max
    }

    /// The stored bytes a held row holds; [`ContentError::Moved`] when the row was packed,
    /// re-encoded or collected since it was read.
    pub(crate) async fn held_bytes(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
    ) -> Result<Bytes, ContentError> {
        let held = self
            .meta
            .held_bytes(app, space, &row.hash, &row.object_gen)
            .await
            .map_err(ApiError::from)?;
        let Some(bytes) = held else {
            return Err(ContentError::Moved);
        };
        if bytes.len() as i64 != row.stored_bytes {
            return Err(integrity(format!(
                "the row of {} holds {} bytes; it says {}",
                row.hash,
                bytes.len(),
                row.stored_bytes
            ))
            .into());
        }
        Ok(Bytes::from(bytes))
    }

    /// A row's whole object (or its pack entry), at most its recorded size (and never more
    /// than a node's largest own content).
    pub(crate) async fn object_bytes(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
        cached: bool,
    ) -> Result<Bytes, ContentError> {
        use tokio::io::AsyncReadExt;
        if let Some(span) = row.pack {
            return self.pack_entry(app, space, row, span, cached).await;
        }
        if row.held {
            return self.held_bytes(app, space, row).await;
        }
        let key = crate::blob::node_key(app, space, &row.hash, &row.object_gen);
        let Some((reader, len)) = self
            .blobs
            .get(&key, None)
            .await
            .map_err(|e| ApiError::storage_unavailable("reading an object", e))?
        else {
            return Err(ContentError::Moved);
        };
        // (Content at most `IN_MEMORY_MAX`, with what a zstd frame or a header adds.)
        let content_bound = len.saturating_sub(row.content_offset());
        if len as i64 != row.stored_bytes || content_bound > IN_MEMORY_MAX + 1024 {
            return Err(integrity(format!(
                "the object of {} holds {len} bytes; its row says {}",
                row.hash, row.stored_bytes
            ))
            .into());
        }
        let mut buf = Vec::with_capacity(len as usize);
        reader
            .take(len)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| ApiError::storage_unavailable("reading an object", e))?;
        Ok(Bytes::from(buf))
    }
}
