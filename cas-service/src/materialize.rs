//! From uploaded bytes to a stored object: the bytes at an upload target are streamed through
//! the node validator (and, for SValue content, the SValue decoder) into an unnamed spool
//! file, then written to the object store, compressed when that is worthwhile; or, where the
//! upload is a file that can become the object as it is, validated where it lies
//! (`crate::adopt`).

use cas_format::node::LimitField;
use cas_format::svalue::{self, SValueLimits};
use cas_format::wire::Rejection;
use cas_format::{AppId, NodeDescriptor, NodeError, NodeLimits, NodeStreamValidator, SpaceId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use bytes::Bytes;
use cas_format::Hash;

use crate::adopt::Adoption;
use crate::blob::{Encoding, HeldUpload, ObjectReader, SpoolFile, StagedObject, node_key};
use crate::delta::IN_MEMORY_MAX;
use crate::encode::identity;
use crate::error::{ApiError, ApiResult};
use crate::meta::{Evidence, Generation, StoredObject};
use crate::{Service, failpoint};

pub(crate) const READ_CHUNK: usize = 256 << 10;

/// Uploaded bytes proven valid, and where their content waits.
pub(crate) struct Validated {
    pub evidence: Evidence,
    pub canonical_len: u64,
    pub content: Content,
}

/// Where a validated upload's content waits to be stored.
pub(crate) enum Content {
    /// The own content alone, spooled to a local file.
    Spooled(SpooledContent),
    /// The upload itself, held open, to become the object as it is (`crate::adopt`).
    Held(HeldUpload),
}

/// An inline node's stored form, and the object to write at its key (none when its row
/// holds its bytes).
pub(crate) type Encoded = (StoredObject, Option<(String, Bytes)>);

/// Own content spooled to a local file, and whether a sample of the upload already said it
/// compresses (when one was taken: then it is not sampled again); `staged`: the upload's
/// object as it was read, when the client wrote it to the object store itself (to be copied
/// into place there when its content is stored as it is, `crate::adopt`).
pub(crate) struct SpooledContent {
    pub file: SpoolFile,
    pub sampled: Option<bool>,
    pub staged: Option<StagedObject>,
}

/// The checks of one node's portable bytes, fed in pieces: the node format, its limits and
/// its hash, and for SValue content the canonical encoding and its refs.
pub(crate) struct NodeCheck {
    validator: NodeStreamValidator,
    svalue_limits: SValueLimits,
    /// The SValue content seen so far (other content is not kept).
    svalue_content: Option<Vec<u8>>,
    total: u64,
    max: u64,
}

impl NodeCheck {
    /// Checks the next piece; answers the part of it that is the node's own content.
    pub(crate) fn feed<'p>(&mut self, piece: &'p [u8]) -> Result<&'p [u8], MaterializeError> {
        self.total += piece.len() as u64;
        if self.total > self.max {
            return Err(rejection(
                "NODE_TOO_LARGE",
                format!("the upload is larger than {} bytes", self.max),
            ));
        }
        let content = self
            .validator
            .update(piece)
            .map_err(|e| node_rejection(&e))?;
        if self
            .validator
            .descriptor()
            .is_some_and(|d| d.content_type.is_svalue())
        {
            self.svalue_content
                .get_or_insert_with(Vec::new)
                .extend_from_slice(content);
        }
        Ok(content)
    }

    /// The evidence of the whole node, which must hash to `hash`; and its portable length.
    pub(crate) fn finish(self, hash: &Hash) -> Result<(Evidence, u64), MaterializeError> {
        let (descriptor, _) = self
            .validator
            .finish(Some(hash))
            .map_err(|e| node_rejection(&e))?;
        if descriptor.content_type.is_svalue() {
            let content = self.svalue_content.unwrap_or_default();
            let refs = svalue::extract_refs(&content, &self.svalue_limits).map_err(|e| {
                rejection(
                    "INVALID_SVALUE",
                    format!("the content is not a canonical SValue: {e}"),
                )
            })?;
            if refs != descriptor.refs {
                return Err(rejection(
                    "SVALUE_REFS_MISMATCH",
                    "the header refs differ from the SBlobs of the SValue content",
                ));
            }
        }
        let NodeDescriptor {
            content_type,
            refs,
            content_size,
        } = descriptor;
        Ok((
            Evidence {
                content_type: content_type.as_str().to_string(),
                content_size: content_size as i64,
                refs,
            },
            self.total,
        ))
    }
}

pub(crate) enum MaterializeError {
    /// Nothing was uploaded yet.
    NotUploaded,
    Rejected(Rejection),
    Failed(ApiError),
}

impl From<ApiError> for MaterializeError {
    fn from(e: ApiError) -> Self {
        MaterializeError::Failed(e)
    }
}

pub(crate) fn rejection(code: &str, message: impl Into<String>) -> MaterializeError {
    MaterializeError::Rejected(Rejection {
        code: code.to_string(),
        message: message.into(),
    })
}

fn node_rejection(e: &NodeError) -> MaterializeError {
    let code = match e {
        NodeError::Digest { .. } => "NODE_DIGEST_MISMATCH",
        NodeError::Limit {
            field: LimitField::ContentSize | LimitField::CanonicalSize,
            ..
        }
        | NodeError::SizeOverflow => "NODE_TOO_LARGE",
        NodeError::Limit {
            field: LimitField::RefCount,
            ..
        } => "TOO_MANY_REFS",
        _ => "INVALID_CANONICAL_NODE",
    };
    rejection(code, e.to_string())
}

impl Service {
    fn node_limits(&self) -> NodeLimits {
        NodeLimits {
            max_content_size: self.config.node_max_bytes,
            max_canonical_size: self.config.node_max_bytes,
            max_refs: self.config.node_max_refs,
            ..NodeLimits::default()
        }
    }

    /// Checks the uploaded bytes: where they lie when they are to be adopted as the object
    /// (only when `adopt`, that is without a delta base to try), else streamed through the
    /// validator, the own content spooled.
    pub(crate) async fn materialize(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        adopt: bool,
    ) -> Result<Validated, MaterializeError> {
        let (held, sampled) = match adopt {
            false => (None, None),
            true => match self.validate_for_adoption(app, space, g).await? {
                Adoption::Adopted(validated) => return Ok(validated),
                Adoption::Copied { held, sampled } => (held, sampled),
            },
        };
        let (reader, len, staged) = match held {
            // Read from its start (its checks so far read by position).
            Some(held) => {
                let file = held
                    .file()
                    .try_clone()
                    .map_err(|e| ApiError::storage_unavailable("reading an upload", e))?;
                let reader: ObjectReader = Box::pin(tokio::fs::File::from_std(file));
                (reader, held.size(), None)
            }
            None => match self.staging().open(app, space, g).await? {
                Some(found) => found,
                None => return Err(MaterializeError::NotUploaded),
            },
        };
        let mut validated = self.validate(reader, len, &g.hash, sampled).await?;
        if let Content::Spooled(spooled) = &mut validated.content {
            // The object read is the node's portable bytes, exactly.
            spooled.staged = staged.filter(|s| s.len == validated.canonical_len);
        }
        Ok(validated)
    }

    /// Streams `len` portable bytes of the node `hash` through the validator, spooling the own
    /// content (of which a sample of the upload said it compresses or not, if one was taken).
    pub(crate) async fn validate(
        &self,
        reader: impl tokio::io::AsyncRead + Unpin,
        len: u64,
        hash: &cas_format::Hash,
        sampled: Option<bool>,
    ) -> Result<Validated, MaterializeError> {
        let spool = self
            .blobs
            .spool()
            .file("content-")
            .await
            .map_err(|e| ApiError::blob("spooling an upload", e))?;
        let file = tokio::fs::File::from_std(
            spool
                .handle()
                .map_err(|e| ApiError::internal("opening a spool file", e))?,
        );
        let (evidence, canonical_len) = self.validate_into(reader, len, hash, file).await?;
        Ok(Validated {
            evidence,
            canonical_len,
            content: Content::Spooled(SpooledContent {
                file: spool,
                sampled,
                staged: None,
            }),
        })
    }

    /// Streams `len` portable bytes of the node `hash` through the validator, writing the own
    /// content to `sink`; answers the evidence and the portable length.
    pub(crate) async fn validate_into(
        &self,
        mut reader: impl tokio::io::AsyncRead + Unpin,
        len: u64,
        hash: &cas_format::Hash,
        mut file: impl tokio::io::AsyncWrite + Unpin,
    ) -> Result<(Evidence, u64), MaterializeError> {
        let mut check = self.node_check(len)?;
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|e| ApiError::storage_unavailable("reading an upload", e))?;
            if n == 0 {
                break;
            }
            let content = check.feed(&buf[..n])?;
            file.write_all(content)
                .await
                .map_err(|e| ApiError::internal("writing a spool file", e))?;
        }
        file.flush()
            .await
            .map_err(|e| ApiError::internal("writing a spool file", e))?;
        drop(file);
        check.finish(hash)
    }

    /// Checks the portable bytes of the node `hash`, held in memory, as
    /// [`Service::validate_into`] checks a stream (read once, hashed once, not copied).
    pub(crate) fn validate_bytes(
        &self,
        bytes: &[u8],
        hash: &cas_format::Hash,
    ) -> Result<(Evidence, u64), MaterializeError> {
        let mut check = self.node_check(bytes.len() as u64)?;
        check.feed(bytes)?;
        check.finish(hash)
    }

    /// The checks of a node said to be `len` portable bytes long; refuses one over the limit.
    pub(crate) fn node_check(&self, len: u64) -> Result<NodeCheck, MaterializeError> {
        let max = self.config.node_max_bytes;
        if len > max {
            return Err(rejection(
                "NODE_TOO_LARGE",
                format!("the upload holds {len} bytes; the limit is {max}"),
            ));
        }
        Ok(NodeCheck {
            validator: NodeStreamValidator::new(self.node_limits()),
            svalue_limits: SValueLimits {
                max_bytes: max,
                max_refs: self.config.node_max_refs as u64,
                ..SValueLimits::default()
            },
            svalue_content: None,
            total: 0,
            max,
        })
    }

    /// Writes the own content of the node of generation `g` to its object: as a delta against
    /// `hint` when that base is usable and it pays, else compressed when configured and
    /// worthwhile, else as it is (see `crate::delta`; an upload the client wrote to the object
    /// store itself then copied into place there, [`Service::store_as_is`]). A small node's
    /// stored bytes are kept in memory for its row to hold instead ([`Service::holds`]).
    /// Returns what the row records.
    pub(crate) async fn write_object(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        spooled: SpooledContent,
        size: u64,
        hint: Option<Hash>,
    ) -> ApiResult<StoredObject> {
        let (spool, sampled, staged) = (spooled.file, spooled.sampled, spooled.staged);
        let key = node_key(app, space, &g.hash, &g.object_name());
        let compress = self.tries_compressing(size);
        let hold = self.holds(size);
        if size <= IN_MEMORY_MAX && (compress || hint.is_some() || hold) {
            let encoded = {
                let _permit = self.in_memory_permit().await?;
                match self.delta_base(app, space, &g.hash, size, hint).await? {
                    None if !compress => None,
                    // Content that its sample says does not compress is written as it is,
                    // without being read whole.
                    None if !hold
                        && !self.spool_worth_compressing(&spool, sampled, size).await? =>
                    {
                        None
                    }
                    base => {
                        let content = read_spool(&spool, size).await?;
                        // Without a base, the sample above said the content compresses, or
                        // it is held in its row: either way it is tried whole.
                        let sampled = base.is_none();
                        Some(self.encode_content(content, base, sampled).await?)
                    }
                }
            };
            let (bytes, stored) = match encoded {
                Some(done) => done,
                None if hold => (read_spool(&spool, size).await?, identity(size)),
                None => return self.store_as_is(&key, spool, size, staged).await,
            };
            if hold {
                return Ok(StoredObject {
                    held: Some(bytes),
                    ..stored
                });
            }
            if stored.encoding != Encoding::Identity {
                // The spool file takes the encoded bytes: no second file per node.
                rewrite_spool(&spool, bytes).await?;
            }
            self.put(&key, spool, stored.stored_bytes as u64).await?;
            return Ok(stored);
        } else if compress && self.spool_worth_compressing(&spool, sampled, size).await? {
            let compressed = self.compress(&spool).await?;
            let len = compressed
                .file()
                .metadata()
                .map_err(|e| ApiError::internal("reading a spool file", e))?
                .len();
            // Only when it saves at least an eighth: decompressing costs every reader.
            if len < size - size / 8 {
                self.put(&key, compressed, len).await?;
                return Ok(StoredObject {
                    encoding: Encoding::Zstd,
                    stored_bytes: len as i64,
                    delta: None,
                    held: None,
                });
            }
        }
        self.store_as_is(&key, spool, size, staged).await
    }

    /// As [`Service::write_object`] decides, for own content already in memory (an inline
    /// node): encoded there, and either held (in what it returns) or to be written as the
    /// object it also returns, at the generation's key.
    pub(crate) async fn encode_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        own: Bytes,
        hint: Option<Hash>,
    ) -> ApiResult<Encoded> {
        let size = own.len() as u64;
        let (bytes, stored) = if self.tries_compressing(size) || hint.is_some() {
            let _permit = self.in_memory_permit().await?;
            let base = self.delta_base(app, space, &g.hash, size, hint).await?;
            self.encode_content(own, base, false).await?
        } else {
            (own, identity(size))
        };
        Ok(self.place_inline(app, space, g, size, bytes, stored))
    }

    /// As [`Service::encode_inline`] for nodes named against no delta base, many at once
    /// ([`Service::encode_contents`]): one answer per node, in order.
    pub(crate) async fn encode_inline_run(
        &self,
        app: &AppId,
        space: &SpaceId,
        nodes: Vec<(&Generation, Bytes)>,
    ) -> ApiResult<Vec<Encoded>> {
        let _permit = self.in_memory_permit().await?;
        let contents = nodes.iter().map(|(_, own)| own.clone()).collect();
        let encoded = self.encode_contents(contents).await?;
        Ok(nodes
            .iter()
            .zip(encoded)
            .map(|((g, own), (bytes, stored))| {
                self.place_inline(app, space, g, own.len() as u64, bytes, stored)
            })
            .collect())
    }

    /// An inline node's stored form once encoded: held in its row, or the object to write at
    /// the generation's key.
    fn place_inline(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        size: u64,
        bytes: Bytes,
        stored: StoredObject,
    ) -> Encoded {
        if self.holds(size) {
            return (
                StoredObject {
                    held: Some(bytes),
                    ..stored
                },
                None,
            );
        }
        let key = node_key(app, space, &g.hash, &g.object_name());
        (stored, Some((key, bytes)))
    }

    /// Writes objects held in memory, each at its key, together ([`BlobStore::put_many_bytes`]);
    /// one result per item, in order.
    ///
    /// [`BlobStore::put_many_bytes`]: crate::blob::BlobStore::put_many_bytes
    pub(crate) async fn put_many_bytes(&self, items: Vec<(String, Bytes)>) -> Vec<ApiResult<()>> {
        let mut failed = Vec::with_capacity(items.len());
        let mut to_write = Vec::with_capacity(items.len());
        for item in items {
            match Self::put_failpoint().await {
                Ok(()) => {
                    failed.push(None);
                    to_write.push(item);
                }
                Err(e) => failed.push(Some(e)),
            }
        }
        let mut written = self.blobs.put_many_bytes(to_write).await.into_iter();
        failed
            .into_iter()
            .map(|f| match f {
                Some(e) => Err(e),
                None => match written.next() {
                    Some(result) => result.map_err(|e| ApiError::blob("writing an object", e)),
                    None => Err(ApiError::internal(
                        "writing an object",
                        "the store answered fewer results than objects",
                    )),
                },
            })
            .collect()
    }

    /// Writes an object held in memory at `key`.
    pub(crate) async fn put_bytes(&self, key: &str, bytes: Bytes) -> ApiResult<()> {
        Self::put_failpoint().await?;
        self.blobs
            .put_bytes(key, bytes)
            .await
            .map_err(|e| ApiError::blob("writing an object", e))
    }

    pub(crate) async fn put_failpoint() -> ApiResult<()> {
        if failpoint::hit("blob.put").await {
            return Err(ApiError::storage_unavailable(
                "writing an object",
                "failpoint blob.put",
            ));
        }
        Ok(())
    }

    pub(crate) async fn put(&self, key: &str, file: SpoolFile, len: u64) -> ApiResult<()> {
        Self::put_failpoint().await?;
        self.blobs
            .put_file(key, file, len)
            .await
            .map_err(|e| ApiError::blob("writing an object", e))
    }

    /// Whether the `size` bytes of content in `spool` are worth compressing, from a sample
    /// read alone ([`crate::compressibility`]), unless one was `sampled` already.
    async fn spool_worth_compressing(
        &self,
        spool: &SpoolFile,
        sampled: Option<bool>,
        size: u64,
    ) -> ApiResult<bool> {
        if let Some(known) = sampled {
            return Ok(known);
        }
        let level = self.config.compress_level;
        crate::compressibility::file_worth_compressing_async(spool.file(), size, level)
            .await
            .map_err(|e| ApiError::internal("reading a spool file", e))
    }

    async fn compress(&self, spool: &SpoolFile) -> ApiResult<SpoolFile> {
        let out = self
            .blobs
            .spool()
            .file("zstd-")
            .await
            .map_err(|e| ApiError::blob("spooling compressed content", e))?;
        let spooled = |e| ApiError::internal("reading a spool file", e);
        let mut input = spool.handle().map_err(spooled)?;
        std::io::Seek::rewind(&mut input).map_err(spooled)?;
        let input = tokio::fs::File::from_std(input);
        let mut encoder = async_compression::tokio::write::ZstdEncoder::with_quality(
            tokio::fs::File::from_std(out.handle().map_err(spooled)?),
            async_compression::Level::Precise(self.config.compress_level),
        );
        tokio::io::copy(&mut tokio::io::BufReader::new(input), &mut encoder)
            .await
            .map_err(|e| ApiError::internal("compressing", e))?;
        encoder
            .shutdown()
            .await
            .map_err(|e| ApiError::internal("compressing", e))?;
        Ok(out)
    }
}

/// The `size` bytes of a spool file, read through its handle.
async fn read_spool(spool: &SpoolFile, size: u64) -> ApiResult<Bytes> {
    let file = spool
        .handle()
        .map_err(|e| ApiError::internal("reading a spool file", e))?;
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; size as usize];
        file.read_exact_at(&mut buf, 0)?;
        Ok::<_, std::io::Error>(Bytes::from(buf))
    })
    .await
    .map_err(|e| ApiError::internal("reading a spool file", e))?
    .map_err(|e| ApiError::internal("reading a spool file", e))
}

/// Replaces a spool file's bytes with `bytes`.
async fn rewrite_spool(spool: &SpoolFile, bytes: Bytes) -> ApiResult<()> {
    let file = spool
        .handle()
        .map_err(|e| ApiError::internal("writing a spool file", e))?;
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        file.set_len(0)?;
        file.write_all_at(&bytes, 0)
    })
    .await
    .map_err(|e| ApiError::internal("writing a spool file", e))?
    .map_err(|e| ApiError::internal("writing a spool file", e))
}
