//! How a node's own content is stored: as a zstd delta against the base its lease named
//! (`crate::delta`), compressed alone, or as it is; each form only where it earns its cost.

use bytes::Bytes;

use crate::Service;
use crate::blob::Encoding;
use crate::error::{ApiError, ApiResult};
use crate::meta::{DeltaBase, StoredObject};

/// `content` compressed alone at `level` (unless a sample says it does not compress; not
/// taken again when one `sampled` it already), and with `base` as its dictionary; either is
/// `None` where zstd refused or was not tried.
pub(crate) fn encode_both(
    content: &[u8],
    base: Option<&[u8]>,
    level: i32,
    sampled: bool,
) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let alone = (sampled || crate::compressibility::worth_compressing(content, level))
        .then(|| crate::compressibility::compress(content, level).ok())
        .flatten();
    let delta = base.and_then(|base| {
        let mut c = zstd::bulk::Compressor::with_dictionary(level, base).ok()?;
        c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .ok()?;
        c.compress(content).ok()
    });
    (alone, delta)
}

/// How to store `content` (blocking: it compresses): as a delta against `base`, compressed
/// alone, or as it is, each form only where it earns its cost to readers: compression an
/// eighth of the size, a delta an eighth of the compressed size (a delta's read also reads
/// its chain). `compress`: whether compression alone is tried at all
/// ([`Service::tries_compressing`]); `sampled`: a sample of it compressed already (see
/// [`crate::compressibility`]).
fn encode(
    content: Bytes,
    base: Option<(Bytes, DeltaBase)>,
    level: i32,
    compress: bool,
    sampled: bool,
) -> (Bytes, StoredObject) {
    let size = content.len() as u64;
    if !compress && base.is_none() {
        return (content, identity(size));
    }
    let (alone, delta) = encode_both(&content, base.as_ref().map(|(c, _)| &c[..]), level, sampled);
    let alone = alone
        .filter(|a| compress && (a.len() as u64) < size - size / 8)
        .map(Bytes::from);
    let best_alone = alone.as_ref().map_or(size, |a| a.len() as u64);
    if let (Some(d), Some((_, link))) = (delta, base)
        && (d.len() as u64) < best_alone - best_alone / 8
    {
        let len = d.len() as i64;
        return (
            Bytes::from(d),
            StoredObject {
                encoding: Encoding::ZstdDelta,
                stored_bytes: len,
                delta: Some(link),
                held: None,
            },
        );
    }
    match alone {
        Some(a) => {
            let len = a.len() as i64;
            (
                a,
                StoredObject {
                    encoding: Encoding::Zstd,
                    stored_bytes: len,
                    delta: None,
                    held: None,
                },
            )
        }
        None => (content, identity(size)),
    }
}

impl Service {
    /// Whether content of `size` bytes is tried compressed (`compress_min_bytes`; 0 turns
    /// compression off).
    pub(crate) fn tries_compressing(&self, size: u64) -> bool {
        let min = self.config.compress_min_bytes;
        min > 0 && size >= min
    }

    /// Chooses how to store a node's own `content` (at most [`IN_MEMORY_MAX`] bytes): as a
    /// delta against `base` (content, and the stored form of the base's row), compressed
    /// alone, or as it is (`sampled`: a sample of it compressed already, see
    /// [`crate::compressibility`]). Answers the object's bytes and what the row records.
    pub(crate) async fn encode_content(
        &self,
        content: Bytes,
        base: Option<(Bytes, DeltaBase)>,
        sampled: bool,
    ) -> ApiResult<(Bytes, StoredObject)> {
        let level = self.config.compress_level;
        let compress = self.tries_compressing(content.len() as u64);
        if !compress && base.is_none() {
            return Ok(encode(content, None, level, false, sampled));
        }
        tokio::task::spawn_blocking(move || encode(content, base, level, compress, sampled))
            .await
            .map_err(|e| ApiError::internal("encoding an object", e))
    }

    /// As [`Service::encode_content`] for contents named against no base, many at once: their
    /// compression is one blocking task (for small nodes, handing each to a blocking thread of
    /// its own, and waking a worker for its result, costs more than compressing it).
    pub(crate) async fn encode_contents(
        &self,
        contents: Vec<Bytes>,
    ) -> ApiResult<Vec<(Bytes, StoredObject)>> {
        let level = self.config.compress_level;
        let jobs: Vec<(Bytes, bool)> = contents
            .into_iter()
            .map(|c| {
                let compress = self.tries_compressing(c.len() as u64);
                (c, compress)
            })
            .collect();
        let any = jobs.iter().any(|(_, compress)| *compress);
        let encode_all = move || {
            jobs.into_iter()
                .map(|(c, compress)| encode(c, None, level, compress, false))
                .collect()
        };
        if !any {
            return Ok(encode_all());
        }
        tokio::task::spawn_blocking(encode_all)
            .await
            .map_err(|e| ApiError::internal("encoding an object", e))
    }
}

/// An object that holds `size` bytes of content as they are.
pub(crate) fn identity(size: u64) -> StoredObject {
    StoredObject {
        encoding: Encoding::Identity,
        stored_bytes: size as i64,
        delta: None,
        held: None,
    }
}
