//! The archive codec: a stream of portable nodes that carries a DAG between deployments.
//!
//! # Byte layout, version 1
//!
//! All integers are unsigned little-endian. Offsets are from the start of the stream.
//!
//! ```text
//! header
//!   0   8   magic        "UCASARC\n" (55 43 41 53 41 52 43 0a)
//!   8   2   version      1
//!   10  2   flags        0
//!   12  4   root count   R, 1 ..= 65536
//!   16  32R roots        R distinct 32-byte node hashes
//! records, any number of
//!   +0  1   kind         0x4e ('N')
//!   +1  8   length       L, at most the node limit (32 MiB by default)
//!   +9  L   node         a portable full node (node format v1); its hash is SHA-256 of these L bytes
//! end record, exactly once, last
//!   +0  1   kind         0x45 ('E')
//!   +1  8   node count   the number of node records
//!   +9  32  digest       SHA-256 of every byte of the stream before this field
//! ```
//!
//! Nothing may follow the end record. Any other record kind is an error.
//!
//! Rules a reader enforces (and the writer refuses to break):
//! - every node record is a valid portable node under the reader's node limits; an SValue node's
//!   refs equal the SBlobs of its content;
//! - each node appears once, and before every node that references it (children before
//!   parents), so a reader can check a node's refs when it meets it;
//! - a ref to a node that is not in the archive is allowed; such refs are *external* and are
//!   reported, so an importer can require them to exist at the destination;
//! - every root appears as a node record;
//! - the node count and the digest match.
//!
//! A reader holds one node at a time plus the set of hashes seen so far.

use std::collections::HashSet;
use std::io::{self, Read, Write};

use sha2::{Digest, Sha256};

use crate::hash::Hash;
use crate::node::{NodeDescriptor, NodeError, NodeLimits, decode_portable};
use crate::svalue::{SValueError, SValueLimits, extract_refs};

/// The 8 magic bytes.
pub const ARCHIVE_MAGIC: [u8; 8] = *b"UCASARC\n";
/// The archive format version this crate reads and writes.
pub const ARCHIVE_VERSION: u16 = 1;
/// Media type of an archive.
pub const ARCHIVE_MEDIA_TYPE: &str = "application/vnd.unidocs.cas-archive.v1";
/// Kind byte of a node record.
pub const RECORD_NODE: u8 = b'N';
/// Kind byte of the end record.
pub const RECORD_END: u8 = b'E';
/// Most roots an archive may name.
pub const MAX_ROOTS: u32 = 65536;

/// Bounds a reader enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    pub node: NodeLimits,
    pub svalue: SValueLimits,
    /// Most node records.
    pub max_nodes: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            node: NodeLimits::default(),
            svalue: SValueLimits::default(),
            max_nodes: 100_000_000,
        }
    }
}

/// Why a stream is not a valid archive. Offsets point at the record or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("reading the archive failed at offset {offset}: {source}")]
    Io { offset: u64, source: io::Error },
    #[error("archive is truncated at offset {offset}, inside the {context}")]
    Truncated { offset: u64, context: &'static str },
    #[error("not a UniCAS archive: the first 8 bytes are {found:02x?}")]
    Magic { found: [u8; 8] },
    #[error("unsupported archive version {found} at offset 8 (only version 1 is defined)")]
    Version { found: u16 },
    #[error("archive flags at offset 10 must be 0, found {found:#x}")]
    Flags { found: u16 },
    #[error("archive names {count} roots; it must name 1..={MAX_ROOTS}")]
    RootCount { count: u32 },
    #[error("root {hash} is named twice in the header")]
    DuplicateRoot { hash: Hash },
    #[error("unknown record kind {kind:#04x} at offset {offset}")]
    UnknownRecord { offset: u64, kind: u8 },
    #[error("node record at offset {offset} is {len} bytes, above the node limit of {limit}")]
    NodeTooLarge { offset: u64, len: u64, limit: u64 },
    #[error("invalid node in the record at offset {offset}: {source}")]
    Node { offset: u64, source: NodeError },
    #[error("invalid SValue content of node {hash} (record at offset {offset}): {source}")]
    SValue {
        offset: u64,
        hash: Hash,
        source: SValueError,
    },
    #[error(
        "node {hash} (record at offset {offset}) has header refs that differ from the SBlobs of its content"
    )]
    SValueRefs { offset: u64, hash: Hash },
    #[error("node {hash} appears twice (second time at offset {offset})")]
    DuplicateNode { offset: u64, hash: Hash },
    #[error(
        "node {hash} at offset {offset} appears after a node that references it (children must come first)"
    )]
    ChildAfterParent { offset: u64, hash: Hash },
    #[error("archive has more than {limit} nodes")]
    TooManyNodes { limit: u64 },
    #[error("end record at offset {offset} counts {declared} nodes but the archive holds {actual}")]
    CountMismatch {
        offset: u64,
        declared: u64,
        actual: u64,
    },
    #[error(
        "archive digest mismatch: the end record says {declared}, the stream hashes to {actual}"
    )]
    Digest { declared: Hash, actual: Hash },
    #[error("trailing bytes after the end record, at offset {offset}")]
    TrailingBytes { offset: u64 },
    #[error("root {hash} is named in the header but not in the archive")]
    MissingRoot { hash: Hash },
    #[error("the archive writer was given no roots")]
    NoRoots,
}

/// What a complete, verified archive holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSummary {
    pub roots: Vec<Hash>,
    pub node_count: u64,
    /// Refs to nodes that are not in the archive, sorted.
    pub external_refs: Vec<Hash>,
    /// The stream digest from the end record.
    pub digest: Hash,
    /// Length of the whole stream.
    pub bytes: u64,
}

/// A verified node read from an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveNode {
    pub hash: Hash,
    pub descriptor: NodeDescriptor,
    /// The portable full node.
    pub bytes: Vec<u8>,
    /// Offset of its record.
    pub offset: u64,
}

impl ArchiveNode {
    /// The own content.
    pub fn content(&self) -> &[u8] {
        let prefix = self.descriptor.prefix_len() as usize;
        &self.bytes[prefix.min(self.bytes.len())..]
    }
}

/// The checks every node passes, shared by reader and writer.
#[derive(Debug, Default)]
struct DagOrder {
    seen: HashSet<Hash>,
    /// Refs met before their node: external unless the node appears later, which is an error.
    pending: HashSet<Hash>,
}

impl DagOrder {
    fn admit(
        &mut self,
        bytes: &[u8],
        offset: u64,
        limits: &ArchiveLimits,
    ) -> Result<(Hash, NodeDescriptor), ArchiveError> {
        let node = decode_portable(bytes, &limits.node)
            .map_err(|source| ArchiveError::Node { offset, source })?;
        let hash = node.hash;
        if node.descriptor.content_type.is_svalue() {
            let refs = extract_refs(node.content, &limits.svalue).map_err(|source| {
                ArchiveError::SValue {
                    offset,
                    hash,
                    source,
                }
            })?;
            if refs != node.descriptor.refs {
                return Err(ArchiveError::SValueRefs { offset, hash });
            }
        }
        if self.seen.contains(&hash) {
            return Err(ArchiveError::DuplicateNode { offset, hash });
        }
        if self.pending.contains(&hash) {
            return Err(ArchiveError::ChildAfterParent { offset, hash });
        }
        for r in &node.descriptor.refs {
            if !self.seen.contains(r) {
                self.pending.insert(*r);
            }
        }
        self.seen.insert(hash);
        Ok((hash, node.descriptor))
    }

    fn external_refs(&self) -> Vec<Hash> {
        let mut v: Vec<Hash> = self.pending.iter().copied().collect();
        v.sort_unstable();
        v
    }

    fn missing_root(&self, roots: &[Hash]) -> Option<Hash> {
        roots.iter().find(|r| !self.seen.contains(r)).copied()
    }
}

fn check_roots(roots: &[Hash]) -> Result<(), ArchiveError> {
    if roots.is_empty() || roots.len() > MAX_ROOTS as usize {
        return Err(ArchiveError::RootCount {
            count: roots.len().min(u32::MAX as usize) as u32,
        });
    }
    let mut distinct = HashSet::with_capacity(roots.len());
    for r in roots {
        if !distinct.insert(*r) {
            return Err(ArchiveError::DuplicateRoot { hash: *r });
        }
    }
    Ok(())
}

/// Reads and verifies an archive, one node at a time.
pub struct ArchiveReader<R> {
    src: R,
    sha: Sha256,
    offset: u64,
    limits: ArchiveLimits,
    roots: Vec<Hash>,
    order: DagOrder,
    count: u64,
    summary: Option<ArchiveSummary>,
}

impl<R> std::fmt::Debug for ArchiveReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveReader")
            .field("offset", &self.offset)
            .field("roots", &self.roots.len())
            .field("count", &self.count)
            .finish()
    }
}

impl<R: Read> ArchiveReader<R> {
    /// Reads and checks the header.
    pub fn new(src: R, limits: ArchiveLimits) -> Result<Self, ArchiveError> {
        let mut r = ArchiveReader {
            src,
            sha: Sha256::new(),
            offset: 0,
            limits,
            roots: Vec::new(),
            order: DagOrder::default(),
            count: 0,
            summary: None,
        };
        let mut fixed = [0u8; 16];
        r.read_exact(&mut fixed, "header", true)?;
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&fixed[..8]);
        if magic != ARCHIVE_MAGIC {
            return Err(ArchiveError::Magic { found: magic });
        }
        let version = u16::from_le_bytes([fixed[8], fixed[9]]);
        if version != ARCHIVE_VERSION {
            return Err(ArchiveError::Version { found: version });
        }
        let flags = u16::from_le_bytes([fixed[10], fixed[11]]);
        if flags != 0 {
            return Err(ArchiveError::Flags { found: flags });
        }
        let count = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
        if count == 0 || count > MAX_ROOTS {
            return Err(ArchiveError::RootCount { count });
        }
        let mut roots = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let mut h = [0u8; 32];
            r.read_exact(&mut h, "root list", true)?;
            roots.push(Hash::from_bytes(h));
        }
        check_roots(&roots)?;
        r.roots = roots;
        Ok(r)
    }

    /// The roots named in the header.
    pub fn roots(&self) -> &[Hash] {
        &self.roots
    }

    /// The summary, once the end record has been read and checked.
    pub fn summary(&self) -> Option<&ArchiveSummary> {
        self.summary.as_ref()
    }

    fn read_exact(
        &mut self,
        buf: &mut [u8],
        context: &'static str,
        hashed: bool,
    ) -> Result<(), ArchiveError> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.src.read(&mut buf[filled..]) {
                Ok(0) => {
                    return Err(ArchiveError::Truncated {
                        offset: self.offset + filled as u64,
                        context,
                    });
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(ArchiveError::Io {
                        offset: self.offset + filled as u64,
                        source,
                    });
                }
            }
        }
        if hashed {
            self.sha.update(&*buf);
        }
        self.offset += buf.len() as u64;
        Ok(())
    }

    /// The next verified node, or `None` after the end record was read and checked.
    pub fn next_node(&mut self) -> Result<Option<ArchiveNode>, ArchiveError> {
        if self.summary.is_some() {
            return Ok(None);
        }
        let record_at = self.offset;
        let mut head = [0u8; 9];
        self.read_exact(&mut head[..1], "record kind", true)?;
        match head[0] {
            RECORD_NODE => {
                self.read_exact(&mut head[1..], "node record length", true)?;
                let mut len = [0u8; 8];
                len.copy_from_slice(&head[1..]);
                let len = u64::from_le_bytes(len);
                let limit = self.limits.node.max_canonical_size;
                if len > limit {
                    return Err(ArchiveError::NodeTooLarge {
                        offset: record_at,
                        len,
                        limit,
                    });
                }
                if self.count >= self.limits.max_nodes {
                    return Err(ArchiveError::TooManyNodes {
                        limit: self.limits.max_nodes,
                    });
                }
                // Grown as bytes arrive, so a lying length on a short stream allocates little.
                let mut bytes = Vec::new();
                let got = (&mut self.src)
                    .take(len)
                    .read_to_end(&mut bytes)
                    .map_err(|source| ArchiveError::Io {
                        offset: self.offset,
                        source,
                    })?;
                if (got as u64) < len {
                    return Err(ArchiveError::Truncated {
                        offset: self.offset + got as u64,
                        context: "node record",
                    });
                }
                self.sha.update(&bytes);
                self.offset += len;
                let (hash, descriptor) = self.order.admit(&bytes, record_at, &self.limits)?;
                self.count += 1;
                Ok(Some(ArchiveNode {
                    hash,
                    descriptor,
                    bytes,
                    offset: record_at,
                }))
            }
            RECORD_END => {
                self.read_exact(&mut head[1..], "end record", true)?;
                let mut count = [0u8; 8];
                count.copy_from_slice(&head[1..]);
                let declared = u64::from_le_bytes(count);
                let actual_digest = Hash::from_bytes(self.sha.clone().finalize().into());
                let mut digest = [0u8; 32];
                self.read_exact(&mut digest, "end record digest", false)?;
                let declared_digest = Hash::from_bytes(digest);
                if declared != self.count {
                    return Err(ArchiveError::CountMismatch {
                        offset: record_at,
                        declared,
                        actual: self.count,
                    });
                }
                if declared_digest != actual_digest {
                    return Err(ArchiveError::Digest {
                        declared: declared_digest,
                        actual: actual_digest,
                    });
                }
                let mut probe = [0u8; 1];
                loop {
                    match self.src.read(&mut probe) {
                        Ok(0) => break,
                        Ok(_) => {
                            return Err(ArchiveError::TrailingBytes {
                                offset: self.offset,
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(source) => {
                            return Err(ArchiveError::Io {
                                offset: self.offset,
                                source,
                            });
                        }
                    }
                }
                if let Some(hash) = self.order.missing_root(&self.roots) {
                    return Err(ArchiveError::MissingRoot { hash });
                }
                self.summary = Some(ArchiveSummary {
                    roots: self.roots.clone(),
                    node_count: self.count,
                    external_refs: self.order.external_refs(),
                    digest: declared_digest,
                    bytes: self.offset,
                });
                Ok(None)
            }
            kind => Err(ArchiveError::UnknownRecord {
                offset: record_at,
                kind,
            }),
        }
    }

    /// Reads every node, discarding them, and returns the summary.
    pub fn verify_to_end(mut self) -> Result<ArchiveSummary, ArchiveError> {
        while self.next_node()?.is_some() {}
        // next_node returned None, which it does only once the summary is set.
        self.summary.ok_or(ArchiveError::Truncated {
            offset: self.offset,
            context: "end record",
        })
    }
}

/// Writes an archive. Nodes must be written children first; each is verified as it is written.
pub struct ArchiveWriter<W: Write> {
    dst: W,
    sha: Sha256,
    offset: u64,
    limits: ArchiveLimits,
    roots: Vec<Hash>,
    order: DagOrder,
    count: u64,
}

impl<W: Write> std::fmt::Debug for ArchiveWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveWriter")
            .field("offset", &self.offset)
            .field("count", &self.count)
            .finish()
    }
}

impl<W: Write> ArchiveWriter<W> {
    /// Writes the header naming `roots`.
    pub fn new(dst: W, roots: &[Hash], limits: ArchiveLimits) -> Result<Self, ArchiveError> {
        if roots.is_empty() {
            return Err(ArchiveError::NoRoots);
        }
        check_roots(roots)?;
        let mut w = ArchiveWriter {
            dst,
            sha: Sha256::new(),
            offset: 0,
            limits,
            roots: roots.to_vec(),
            order: DagOrder::default(),
            count: 0,
        };
        let mut header = Vec::with_capacity(16 + 32 * roots.len());
        header.extend_from_slice(&ARCHIVE_MAGIC);
        header.extend_from_slice(&ARCHIVE_VERSION.to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes());
        header.extend_from_slice(&(roots.len() as u32).to_le_bytes());
        for r in roots {
            header.extend_from_slice(r.as_bytes());
        }
        w.put(&header, true)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8], hashed: bool) -> Result<(), ArchiveError> {
        self.dst
            .write_all(bytes)
            .map_err(|source| ArchiveError::Io {
                offset: self.offset,
                source,
            })?;
        if hashed {
            self.sha.update(bytes);
        }
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// Whether a node with this hash was already written.
    pub fn contains(&self, hash: &Hash) -> bool {
        self.order.seen.contains(hash)
    }

    /// Verifies and appends one portable node; returns its hash.
    pub fn write_node(&mut self, portable: &[u8]) -> Result<Hash, ArchiveError> {
        let record_at = self.offset;
        let (hash, _) = self.order.admit(portable, record_at, &self.limits)?;
        let mut head = [0u8; 9];
        head[0] = RECORD_NODE;
        head[1..].copy_from_slice(&(portable.len() as u64).to_le_bytes());
        self.put(&head, true)?;
        self.put(portable, true)?;
        self.count += 1;
        Ok(hash)
    }

    /// Writes the end record and returns the destination and the summary.
    pub fn finish(mut self) -> Result<(W, ArchiveSummary), ArchiveError> {
        if let Some(hash) = self.order.missing_root(&self.roots) {
            return Err(ArchiveError::MissingRoot { hash });
        }
        let mut end = [0u8; 9];
        end[0] = RECORD_END;
        end[1..].copy_from_slice(&self.count.to_le_bytes());
        self.put(&end, true)?;
        let digest = Hash::from_bytes(self.sha.clone().finalize().into());
        self.put(digest.as_bytes(), false)?;
        self.dst.flush().map_err(|source| ArchiveError::Io {
            offset: self.offset,
            source,
        })?;
        let summary = ArchiveSummary {
            roots: self.roots.clone(),
            node_count: self.count,
            external_refs: self.order.external_refs(),
            digest,
            bytes: self.offset,
        };
        Ok((self.dst, summary))
    }
}
