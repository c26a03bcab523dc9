//! Reading node content: whole or one byte range, decompressing transparently.

use cas_format::{AppId, Hash, SpaceId};
use tokio::io::AsyncReadExt;

use crate::Service;
use crate::blob::{Encoding, ObjectReader, node_key};
use crate::error::{ApiError, ApiResult};
use crate::meta::NodeRow;

/// A `Range` header that cannot be satisfied for a node of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsatisfiable {
    pub size: u64,
}

/// Interprets a `Range` header for a body of `size` bytes. `Ok(None)` means "send the whole
/// body": no header, or a form this service does not serve (several ranges, other units,
/// malformed), which HTTP allows a server to ignore. Otherwise `start..end` (end exclusive).
pub fn parse_range(header: Option<&str>, size: u64) -> Result<Option<(u64, u64)>, Unsatisfiable> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let parse = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            s.parse().ok()
        }
    };
    match (first.is_empty(), last.is_empty()) {
        // bytes=-n: the last n bytes.
        (true, false) => match parse(last) {
            Some(n) if n == 0 || size == 0 => Err(Unsatisfiable { size }),
            Some(n) => Ok(Some((size.saturating_sub(n), size))),
            None => Ok(None),
        },
        // bytes=a-: from a to the end.
        (false, true) => match parse(first) {
            Some(a) if a >= size => Err(Unsatisfiable { size }),
            Some(a) => Ok(Some((a, size))),
            None => Ok(None),
        },
        // bytes=a-b: inclusive.
        (false, false) => match (parse(first), parse(last)) {
            (Some(a), Some(b)) if a > b => Ok(None),
            (Some(a), Some(_)) if a >= size => Err(Unsatisfiable { size }),
            (Some(a), Some(b)) => Ok(Some((a, b.min(size - 1) + 1))),
            _ => Ok(None),
        },
        (true, true) => Ok(None),
    }
}

/// The content of a ready node, possibly one range of it.
pub struct NodeContent {
    pub row: NodeRow,
    pub range: Option<(u64, u64)>,
    pub body: ObjectReader,
}

/// Why content could not be read.
pub enum ReadError {
    Api(ApiError),
    Unsatisfiable(Unsatisfiable),
}

impl From<ApiError> for ReadError {
    fn from(e: ApiError) -> Self {
        ReadError::Api(e)
    }
}

fn not_found() -> ApiError {
    ApiError::not_found("NODE_NOT_FOUND", "no ready node with this hash")
}

impl Service {
    /// A ready node's row, or 404 (unknown or being collected).
    pub async fn ready_node(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
    ) -> ApiResult<NodeRow> {
        match self.meta.node(app, space, hash).await? {
            Some(row) if row.is_ready() => Ok(row),
            _ => Err(not_found()),
        }
    }

    /// Opens a ready node's content, honouring `range_header`.
    pub async fn read_content(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        range_header: Option<&str>,
    ) -> Result<NodeContent, ReadError> {
        let mut row = self.ready_node(app, space, hash).await?;
        let size = row.size as u64;
        let range = parse_range(range_header, size).map_err(ReadError::Unsatisfiable)?;
        // A row whose object GC replaced meanwhile (re-encoding a collected base's dependent)
        // is read again, a few times at most.
        for _ in 0..4 {
            if !row.own_object() || !row.encoding.streams() {
                // Rebuilt through its chain, read from its pack block or its row, and
                // verified, in memory (deltas, packed and held nodes are small).
                let (row, content) = self.delta_content(app, space, row).await?;
                let body = match range {
                    Some((start, end)) => content.slice(start as usize..end as usize),
                    None => content,
                };
                return Ok(NodeContent {
                    row,
                    range,
                    body: Box::pin(std::io::Cursor::new(body)),
                });
            }
            match self.open_object(app, space, &row, range).await? {
                Some(body) => return Ok(NodeContent { row, range, body }),
                None => row = self.ready_node(app, space, hash).await?,
            }
        }
        Err(
            ApiError::unavailable("the node's storage kept changing while it was read; retry")
                .into(),
        )
    }

    /// The content of a row whose object stands alone, or `None` when the object is gone and
    /// the row changed meanwhile (read it again).
    async fn open_object(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
        range: Option<(u64, u64)>,
    ) -> Result<Option<ObjectReader>, ReadError> {
        let hash = &row.hash;
        let key = node_key(app, space, hash, &row.object_gen);
        let compressed = row.encoding == Encoding::Zstd;
        // A portable object is read from its content on (its header is not content).
        let offset = row.content_offset();
        let object_range = match range {
            _ if compressed => None,
            Some((start, end)) => Some((start + offset, end + offset)),
            None if offset > 0 => Some((offset, offset + row.size.max(0) as u64)),
            None => None,
        };
        let found = self
            .blobs
            .get(&key, object_range)
            .await
            .map_err(|e| ApiError::storage_unavailable("reading an object", e))?;
        let Some((reader, _)) = found else {
            // Collected or re-encoded since the row was read, or an integrity fault.
            return match self
                .meta
                .node(app, space, hash)
                .await
                .map_err(ApiError::from)?
            {
                Some(again) if again.is_ready() && again.object_gen == row.object_gen => {
                    Err(ApiError::internal(
                        "reading a node",
                        format!("ready node {hash} has no object {key}"),
                    )
                    .into())
                }
                Some(again) if again.is_ready() => Ok(None),
                _ => Err(not_found().into()),
            };
        };
        let mut decoded = row.encoding.decode(reader);
        let body: ObjectReader = match (compressed, range) {
            (true, Some((start, end))) => {
                // zstd frames are not seekable: decode and discard up to the start.
                tokio::io::copy(&mut (&mut decoded).take(start), &mut tokio::io::sink())
                    .await
                    .map_err(|e| ApiError::storage_unavailable("decompressing an object", e))?;
                Box::pin(decoded.take(end - start))
            }
            _ => decoded,
        };
        Ok(Some(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let r = |h: &str, size| parse_range(Some(h), size);
        assert_eq!(r("bytes=0-9", 100), Ok(Some((0, 10))));
        assert_eq!(r("bytes=90-200", 100), Ok(Some((90, 100))));
        assert_eq!(r("bytes=95-", 100), Ok(Some((95, 100))));
        assert_eq!(r("bytes=-5", 100), Ok(Some((95, 100))));
        assert_eq!(r("bytes=-500", 100), Ok(Some((0, 100))));
        assert_eq!(r("bytes=100-", 100), Err(Unsatisfiable { size: 100 }));
        assert_eq!(r("bytes=100-101", 100), Err(Unsatisfiable { size: 100 }));
        assert_eq!(r("bytes=-0", 100), Err(Unsatisfiable { size: 100 }));
        assert_eq!(r("bytes=0-0", 0), Err(Unsatisfiable { size: 0 }));
        assert_eq!(r("bytes=-1", 0), Err(Unsatisfiable { size: 0 }));
        // Ignored forms: the whole body is sent.
        assert_eq!(r("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(r("items=0-1", 100), Ok(None));
        assert_eq!(r("bytes=5-1", 100), Ok(None));
        assert_eq!(r("bytes=x-1", 100), Ok(None));
        assert_eq!(r("bytes=+1-2", 100), Ok(None));
        assert_eq!(parse_range(None, 100), Ok(None));
    }
}
