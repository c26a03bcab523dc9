//! Files as nodes.
//!
//! A file is one `application/octet-stream` leaf, or leaves listed by an SValue index node:
//!
//! ```text
//! {"kind": "chunked-file", "depth": 0, "size": <file size>,
//!  "chunks": [SBlob, ...], "sizes": [<bytes of each chunk>, ...]}
//! ```
//!
//! Where a file of at most [`FORMAT_MAX`] bytes is cut depends on its content
//! ([`crate::chunking`]): notebooks at their cells, other text in chunks of a few KiB, binary
//! content of at most [`CHUNKING_THRESHOLD`] bytes not at all. Larger files, and larger binary
//! content, are cut by content-defined chunking (FastCDC 2020, chunks of
//! [`CHUNK_MIN`]..[`CHUNK_MAX`] bytes, [`CHUNK_AVG`] on average).
//!
//! An index lists at most [`INDEX_FANOUT`] entries (the node ref limit is 256). A file with more
//! chunks gets more levels: an index of depth `d > 0` lists indexes of depth `d - 1`, with their
//! sizes. Reading walks the index in order.
//!
//! Why these numbers: cut points depend on content, so an edit moves only the chunks around it,
//! and a file that grows at the end keeps its earlier chunks. For large binary content an
//! average of 1 MiB keeps the per-node cost (one lease, one row) small next to the bytes it
//! carries, while an edit re-uploads about one to three chunks. The chunk bounds stay far under
//! the 32 MiB node limit.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use cas_format::svalue::{self, SValueLimits};
use cas_format::{ContentType, Hash, NodeDescriptor, SpaceId, Value};
use futures_util::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::chunking::{FORMAT_MAX, SEGMENT_MAX, chunk_lengths};
use crate::client::AppCasClient;
use crate::dag::{FileStamp, Plan, leaf_descriptor};
use crate::error::ClientError;

/// Binary content up to this size is one leaf.
pub const CHUNKING_THRESHOLD: u64 = 1 << 20;
pub const CHUNK_MIN: usize = 256 << 10;
pub const CHUNK_AVG: usize = 1 << 20;
pub const CHUNK_MAX: usize = 4 << 20;
/// Entries of one index node.
pub const INDEX_FANOUT: usize = 256;
/// Small chunks of one file read at once.
const SMALL_READS_IN_FLIGHT: usize = 8;
/// The `kind` of an index node.
pub const CHUNKED_FILE: &str = "chunked-file";

/// A file stored as nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRef {
    /// The leaf, or the root index of a chunked file.
    pub node: Hash,
    pub size: u64,
    pub chunked: bool,
}

fn index_value(depth: u32, entries: &[(Hash, u64)]) -> Value {
    Value::map([
        ("kind", Value::from(CHUNKED_FILE)),
        ("depth", Value::from(depth)),
        (
            "size",
            Value::from(entries.iter().map(|(_, s)| *s as i64).sum::<i64>()),
        ),
        (
            "chunks",
            Value::Array(entries.iter().map(|(h, _)| Value::Blob(*h)).collect()),
        ),
        (
            "sizes",
            Value::Array(
                entries
                    .iter()
                    .map(|(_, s)| Value::from(*s as i64))
                    .collect(),
            ),
        ),
    ])
}

/// The portable bytes of an SValue node.
pub fn svalue_node(value: &Value) -> Result<Bytes, ClientError> {
    let enc =
        svalue::encode(value).map_err(|e| ClientError::Invalid(format!("cannot encode: {e}")))?;
    let d = NodeDescriptor::new(ContentType::svalue(), enc.refs, enc.bytes.len() as u64);
    d.encode_portable(&enc.bytes)
        .map(Bytes::from)
        .map_err(|e| ClientError::Invalid(e.to_string()))
}

/// Adds the index nodes over `chunks` (hash, size) to `plan`; returns the root index.
fn plan_index(plan: &mut Plan, mut level: Vec<(Hash, u64)>) -> Result<Hash, ClientError> {
    let mut depth = 0;
    loop {
        let mut next = Vec::with_capacity(level.len() / INDEX_FANOUT + 1);
        for group in level.chunks(INDEX_FANOUT) {
            let hash = plan.add_portable(svalue_node(&index_value(depth, group))?)?;
            next.push((hash, group.iter().map(|(_, s)| s).sum()));
        }
        if next.len() == 1 {
            return Ok(next[0].0);
        }
        level = next;
        depth += 1;
    }
}

/// Plans `size` bytes of content read from `reader`, chunked when large; `add` records each
/// leaf (hash, offset in the content, length) with where its bytes can be read again. Never
/// holds more than one chunk in memory. `what` names the content in errors.
fn plan_content(
    plan: &mut Plan,
    reader: impl Read,
    size: u64,
    what: &dyn std::fmt::Display,
    mut add: impl FnMut(&mut Plan, Hash, u64, u64),
) -> Result<FileRef, ClientError> {
    let io = |e| ClientError::io(format!("cannot read {what}"), e);
    if size <= FORMAT_MAX as u64 {
        let mut content = Vec::with_capacity(size as usize);
        reader
            .take(size + 1)
            .read_to_end(&mut content)
            .map_err(io)?;
        if content.len() as u64 != size {
            return Err(ClientError::Invalid(format!(
                "{what} changed while it was read"
            )));
        }
        return plan_layout(plan, &content, |plan, content, offset| {
            let hash = hash_leaf(content)?;
            add(plan, hash, offset, content.len() as u64);
            Ok(hash)
        });
    }
    let mut chunks = Vec::new();
    let mut total = 0u64;
    for chunk in fastcdc::v2020::StreamCDC::new(
        BufReader::with_capacity(1 << 20, reader),
        CHUNK_MIN,
        CHUNK_AVG,
        CHUNK_MAX,
    ) {
        let chunk = chunk.map_err(|e| ClientError::Invalid(format!("cannot read {what}: {e}")))?;
        let hash = hash_leaf(&chunk.data)?;
        add(plan, hash, chunk.offset, chunk.length as u64);
        chunks.push((hash, chunk.length as u64));
        total += chunk.length as u64;
    }
    if total != size {
        return Err(ClientError::Invalid(format!(
            "{what} changed while it was read"
        )));
    }
    let node = plan_index(plan, chunks)?;
    Ok(FileRef {
        node,
        size: total,
        chunked: true,
    })
}

/// Plans the file at `path` into `plan` (reading it once to hash it, never holding it whole).
/// Blocking: call it from a blocking thread.
pub fn plan_file(plan: &mut Plan, path: &Path) -> Result<FileRef, ClientError> {
    let io = |e| ClientError::io(format!("cannot read {}", path.display()), e);
    let file = File::open(path).map_err(io)?;
    let stamp = FileStamp::of(&file.metadata().map_err(io)?);
    let owned = path.to_path_buf();
    plan_content(
        plan,
        file,
        stamp.len,
        &path.display(),
        |plan, hash, offset, len| plan.add_file_slice(hash, owned.clone(), stamp, offset, len),
    )
}

/// Reads `len` bytes of an open file from `offset`, through the handle.
struct SliceReader<'a> {
    file: &'a File,
    offset: u64,
    end: u64,
}

impl Read for SliceReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let want = (self.end - self.offset).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Plans `len` bytes of the open spool `file` from `offset` as a file; its leaves are read
/// again through the handle when they are uploaded. Blocking.
pub fn plan_spooled(
    plan: &mut Plan,
    file: &Arc<File>,
    offset: u64,
    len: u64,
) -> Result<FileRef, ClientError> {
    let reader = SliceReader {
        file,
        offset,
        end: offset + len,
    };
    plan_content(plan, reader, len, &"the spool file", |plan, hash, at, n| {
        plan.add_spooled(hash, file.clone(), offset + at, n)
    })
}

fn hash_leaf(content: &[u8]) -> Result<Hash, ClientError> {
    leaf_descriptor(content.len() as u64)
        .hash_of(content)
        .map_err(|e| ClientError::Invalid(e.to_string()))
}

/// Plans bytes held in memory, as [`plan_file`] plans a file.
pub fn plan_bytes(plan: &mut Plan, bytes: &[u8]) -> Result<FileRef, ClientError> {
    let leaf = |plan: &mut Plan, content: &[u8]| -> Result<Hash, ClientError> {
        let portable = leaf_descriptor(content.len() as u64)
            .encode_portable(content)
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        plan.add_portable(Bytes::from(portable))
    };
    if bytes.len() <= FORMAT_MAX {
        return plan_layout(plan, bytes, |plan, content, _| leaf(plan, content));
    }
    let mut chunks = Vec::new();
    for c in fastcdc::v2020::FastCDC::new(bytes, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX) {
        let hash = leaf(plan, &bytes[c.offset..c.offset + c.length])?;
        chunks.push((hash, c.length as u64));
    }
    Ok(FileRef {
        node: plan_index(plan, chunks)?,
        size: bytes.len() as u64,
        chunked: true,
    })
}

/// Plans `content` (at most [`FORMAT_MAX`] bytes) in the layout [`chunk_lengths`] picks: one
/// leaf, or leaves under an index. `leaf` plans one piece found at an offset.
fn plan_layout(
    plan: &mut Plan,
    content: &[u8],
    mut leaf: impl FnMut(&mut Plan, &[u8], u64) -> Result<Hash, ClientError>,
) -> Result<FileRef, ClientError> {
    let lengths = chunk_lengths(content);
    let size = content.len() as u64;
    if lengths.len() == 1 {
        return Ok(FileRef {
            node: leaf(plan, content, 0)?,
            size,
            chunked: false,
        });
    }
    let mut chunks = Vec::with_capacity(lengths.len());
    let mut at = 0usize;
    for n in lengths {
        let hash = leaf(plan, &content[at..at + n], at as u64)?;
        chunks.push((hash, n as u64));
        at += n;
    }
    Ok(FileRef {
        node: plan_index(plan, chunks)?,
        size,
        chunked: true,
    })
}

/// A parsed index node.
pub(crate) struct Index {
    pub(crate) depth: u32,
    /// The `size` it states.
    pub(crate) size: u64,
    pub(crate) entries: Vec<(Hash, u64)>,
}

pub(crate) fn parse_index(hash: &Hash, content: &[u8]) -> Result<Index, ClientError> {
    let bad = |what: &str| {
        ClientError::Protocol(format!("node {hash} is not a chunked-file index: {what}"))
    };
    let (value, _) = svalue::decode_with_limits(content, &SValueLimits::default())
        .map_err(|e| bad(&e.to_string()))?;
    if value.get("kind").and_then(Value::as_str) != Some(CHUNKED_FILE) {
        return Err(bad("no kind \"chunked-file\""));
    }
    let depth = value
        .get("depth")
        .and_then(Value::as_i64)
        .filter(|d| (0..16).contains(d))
        .ok_or_else(|| bad("depth"))? as u32;
    let chunks = value
        .get("chunks")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("chunks"))?;
    let sizes = value
        .get("sizes")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("sizes"))?;
    if chunks.len() != sizes.len() {
        return Err(bad("chunks and sizes differ in length"));
    }
    let entries = chunks
        .iter()
        .zip(sizes)
        .map(|(c, s)| {
            Ok((
                c.as_blob().ok_or_else(|| bad("chunk"))?,
                s.as_i64().filter(|n| *n >= 0).ok_or_else(|| bad("size"))? as u64,
            ))
        })
        .collect::<Result<_, ClientError>>()?;
    let size = value
        .get("size")
        .and_then(Value::as_i64)
        .filter(|n| *n >= 0)
        .ok_or_else(|| bad("size"))? as u64;
    Ok(Index {
        depth,
        size,
        entries,
    })
}

impl AppCasClient {
    /// Streams a node's content to `out`, checking it against `hash`: the content type and
    /// size come with the content, refs are known empty for leaves.
    async fn copy_leaf<W: AsyncWrite + Unpin + Send>(
        &self,
        space: &SpaceId,
        hash: &Hash,
        out: &mut W,
    ) -> Result<u64, ClientError> {
        let (content_type, size, mut stream) = self.read_stream_typed(space, hash).await?;
        let ct =
            ContentType::new(content_type).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut hasher = NodeDescriptor::new(ct, Vec::new(), size)
            .hasher()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            hasher.update(&chunk);
            written += chunk.len() as u64;
            out.write_all(&chunk)
                .await
                .map_err(|e| ClientError::io("cannot write the output", e))?;
        }
        match hasher.finish() {
            Ok(h) if h == *hash => Ok(written),
            _ => Err(ClientError::Protocol(format!(
                "the content read for {hash} does not hash to it"
            ))),
        }
    }

    /// Reads an SValue node whole and checks it against its hash.
    pub async fn read_svalue_node(
        &self,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<Bytes, ClientError> {
        let content = self.read_node(space, hash).await?;
        let refs = svalue::extract_refs(&content, &SValueLimits::default())
            .map_err(|e| ClientError::Protocol(format!("node {hash} is not an SValue: {e}")))?;
        let d = NodeDescriptor::new(ContentType::svalue(), refs, content.len() as u64);
        match d.hash_of(&content) {
            Ok(h) if h == *hash => Ok(content),
            _ => Err(ClientError::Protocol(format!(
                "node {hash} does not hash to itself"
            ))),
        }
    }

    /// Writes the file stored at `node` to `out`, streaming (one chunk at a time) and checking
    /// every node read. Returns the bytes written.
    pub async fn read_file<W: AsyncWrite + Unpin + Send>(
        &self,
        space: &SpaceId,
        node: &Hash,
        out: &mut W,
    ) -> Result<u64, ClientError> {
        let meta = self.read_metadata(space, node).await?;
        let written = if meta.metadata.content_type == cas_format::SVALUE_CONTENT_TYPE {
            self.copy_index(space, node, out).await?
        } else {
            self.copy_leaf(space, node, out).await?
        };
        out.flush()
            .await
            .map_err(|e| ClientError::io("cannot write the output", e))?;
        Ok(written)
    }

    /// Like [`Self::read_file`], for a file whose layout is known (a tree entry): one request
    /// fewer per file.
    pub async fn read_file_ref<W: AsyncWrite + Unpin + Send>(
        &self,
        space: &SpaceId,
        file: &FileRef,
        out: &mut W,
    ) -> Result<u64, ClientError> {
        let written = if file.chunked {
            self.copy_index(space, &file.node, out).await?
        } else {
            self.copy_leaf(space, &file.node, out).await?
        };
        out.flush()
            .await
            .map_err(|e| ClientError::io("cannot write the output", e))?;
        Ok(written)
    }

    fn copy_index<'a, W: AsyncWrite + Unpin + Send>(
        &'a self,
        space: &'a SpaceId,
        node: &'a Hash,
        out: &'a mut W,
    ) -> futures_util::future::BoxFuture<'a, Result<u64, ClientError>> {
        Box::pin(async move {
            let content = self.read_svalue_node(space, node).await?;
            let index = parse_index(node, &content)?;
            let mismatch = |child: &Hash, n: u64, size: u64| {
                ClientError::Protocol(format!(
                    "chunk {child} holds {n} bytes, its index says {size}"
                ))
            };
            let small = |size: u64| index.depth == 0 && size <= SEGMENT_MAX as u64;
            let mut written = 0u64;
            let mut entries = index.entries.iter().copied().peekable();
            while let Some((child, size)) = entries.next() {
                if small(size) {
                    // A run of small leaves (a notebook's cells): read a few at a time, written
                    // in order; at most SMALL_READS_IN_FLIGHT × SEGMENT_MAX bytes held.
                    let mut run = vec![(child, size)];
                    while let Some(next) = entries.next_if(|(_, s)| small(*s)) {
                        run.push(next);
                    }
                    let mut reads = futures_util::stream::iter(run)
                        .map(|(child, size)| async move {
                            let content = self.read_content(space, &child, None).await?;
                            if content.len() as u64 != size {
                                return Err(mismatch(&child, content.len() as u64, size));
                            }
                            match hash_leaf(&content) {
                                Ok(h) if h == child => Ok(content),
                                _ => Err(ClientError::Protocol(format!(
                                    "the content read for {child} does not hash to it"
                                ))),
                            }
                        })
                        .buffered(SMALL_READS_IN_FLIGHT);
                    while let Some(content) = reads.next().await {
                        let content = content?;
                        out.write_all(&content)
                            .await
                            .map_err(|e| ClientError::io("cannot write the output", e))?;
                        written += content.len() as u64;
                    }
                    continue;
                }
                let n = if index.depth == 0 {
                    self.copy_leaf(space, &child, out).await?
                } else {
                    self.copy_index(space, &child, out).await?
                };
                if n != size {
                    return Err(mismatch(&child, n, size));
                }
                written += n;
            }
            Ok(written)
        })
    }
}
