//! Node format v1: the byte layout whose SHA-256 names every node, the portable full node, and
//! a streaming validator for it (see `spec/node-format.md` in the design documents).
//!
//! ```text
//! hash = SHA-256( header(24) || content_type || child_hash_1 .. child_hash_n || own_content )
//!
//! header, little-endian:
//!   0  2  signature "UD"        8  8  content size         20 2  content type length
//!   2  2  version = 1           16 4  ref count            22 2  reserved = 0
//!   4  4  flags = 0
//! ```

use std::fmt;

use sha2::{Digest, Sha256};

use crate::hash::Hash;

/// Media type of a portable full node (what is PUT to an upload target and carried in archives).
pub const NODE_MEDIA_TYPE: &str = "application/vnd.unidocs.cas-node.v1";
/// Length of the fixed header.
pub const HEADER_LEN: usize = 24;
/// The two signature bytes, "UD".
pub const SIGNATURE: [u8; 2] = *b"UD";
/// The only format version this crate reads and writes.
pub const FORMAT_VERSION: u16 = 1;
/// The format's own bound on a content type's length.
pub const MAX_CONTENT_TYPE_LEN: u16 = 1024;

/// Bounds a decoder enforces before it allocates anything. The service defaults are
/// [`NodeLimits::default`]; offline tools may widen them up to [`NodeLimits::format_max`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    /// Largest own content, in bytes.
    pub max_content_size: u64,
    /// Largest canonical node (header + content type + refs + content), in bytes.
    pub max_canonical_size: u64,
    /// Most child refs.
    pub max_refs: u32,
    /// Longest content type, in bytes (never above [`MAX_CONTENT_TYPE_LEN`]).
    pub max_content_type_len: u16,
}

impl Default for NodeLimits {
    /// The service defaults: a 32 MiB canonical node, 256 refs, 1024-byte content type.
    fn default() -> Self {
        NodeLimits {
            max_content_size: 32 << 20,
            max_canonical_size: 32 << 20,
            max_refs: 256,
            max_content_type_len: MAX_CONTENT_TYPE_LEN,
        }
    }
}

impl NodeLimits {
    /// Everything the format itself allows.
    pub const fn format_max() -> Self {
        NodeLimits {
            max_content_size: u64::MAX,
            max_canonical_size: u64::MAX,
            max_refs: u32::MAX,
            max_content_type_len: MAX_CONTENT_TYPE_LEN,
        }
    }
}

/// Which rule a node broke. Coarser than [`NodeError`]; stable for tests and error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRejectKind {
    Signature,
    Version,
    Flags,
    Reserved,
    ContentType,
    Length,
    Limit,
    Digest,
}

/// Why bytes are not a valid node. Every variant says where and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    #[error("bad signature at offset 0: expected \"UD\" (55 44), found {:02x} {:02x}", found[0], found[1])]
    Signature { found: [u8; 2] },
    #[error("unsupported format version {found} at offset 2 (only version 1 is defined)")]
    Version { found: u16 },
    #[error("flags at offset 4 must be 0, found {found:#x}")]
    Flags { found: u32 },
    #[error("reserved field at offset 22 must be 0, found {found:#x}")]
    Reserved { found: u16 },
    #[error("content type length at offset 20 is {len}; it must be 1..={MAX_CONTENT_TYPE_LEN}")]
    ContentTypeLength { len: u64 },
    #[error(
        "content type byte {byte:#04x} at offset {offset} is not printable ASCII (0x20..=0x7e)"
    )]
    ContentTypeByte { offset: u64, byte: u8 },
    #[error("{field} is {value}, above the limit of {limit}")]
    Limit {
        field: LimitField,
        value: u64,
        limit: u64,
    },
    #[error("the declared node length overflows 64 bits")]
    SizeOverflow,
    #[error(
        "node is truncated: the header declares {expected} bytes in all, the input has {actual}"
    )]
    Truncated { expected: u64, actual: u64 },
    #[error("node input has {} bytes after the {expected} bytes the header declares", describe_trailing(*.actual, *.expected))]
    TrailingBytes { expected: u64, actual: Option<u64> },
    #[error("content is {actual} bytes but the descriptor declares {declared}")]
    ContentSize { declared: u64, actual: u64 },
    #[error("digest mismatch: expected {expected}, the bytes hash to {actual}")]
    Digest { expected: Hash, actual: Hash },
}

fn describe_trailing(actual: Option<u64>, expected: u64) -> String {
    match actual {
        Some(a) => (a - expected).to_string(),
        None => "more".to_string(),
    }
}

/// Names of the limited quantities, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitField {
    ContentSize,
    CanonicalSize,
    RefCount,
    ContentTypeLength,
}

impl fmt::Display for LimitField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitField::ContentSize => "content size (offset 8)",
            LimitField::CanonicalSize => "canonical node size",
            LimitField::RefCount => "ref count (offset 16)",
            LimitField::ContentTypeLength => "content type length (offset 20)",
        })
    }
}

impl NodeError {
    pub fn kind(&self) -> NodeRejectKind {
        match self {
            NodeError::Signature { .. } => NodeRejectKind::Signature,
            NodeError::Version { .. } => NodeRejectKind::Version,
            NodeError::Flags { .. } => NodeRejectKind::Flags,
            NodeError::Reserved { .. } => NodeRejectKind::Reserved,
            NodeError::ContentTypeLength { .. } | NodeError::ContentTypeByte { .. } => {
                NodeRejectKind::ContentType
            }
            NodeError::Limit { .. } | NodeError::SizeOverflow => NodeRejectKind::Limit,
            NodeError::Truncated { .. }
            | NodeError::TrailingBytes { .. }
            | NodeError::ContentSize { .. } => NodeRejectKind::Length,
            NodeError::Digest { .. } => NodeRejectKind::Digest,
        }
    }
}

/// A content type: 1..=1024 bytes of printable ASCII, compared byte for byte.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentType(String);

impl ContentType {
    pub fn new(s: impl Into<String>) -> Result<Self, NodeError> {
        let s = s.into();
        check_content_type(s.as_bytes(), 0)?;
        Ok(ContentType(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `application/octet-stream`.
    pub fn octet_stream() -> Self {
        ContentType("application/octet-stream".to_string())
    }

    /// The SValue content type.
    pub fn svalue() -> Self {
        ContentType(crate::svalue::SVALUE_CONTENT_TYPE.to_string())
    }

    pub fn is_svalue(&self) -> bool {
        self.0 == crate::svalue::SVALUE_CONTENT_TYPE
    }
}

impl fmt::Debug for ContentType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for ContentType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ContentType {
    type Err = NodeError;
    fn from_str(s: &str) -> Result<Self, NodeError> {
        ContentType::new(s)
    }
}

/// `base` is the offset of the first content-type byte in the node, for error messages.
fn check_content_type(bytes: &[u8], base: u64) -> Result<(), NodeError> {
    if bytes.is_empty() || bytes.len() > MAX_CONTENT_TYPE_LEN as usize {
        return Err(NodeError::ContentTypeLength {
            len: bytes.len() as u64,
        });
    }
    if let Some(i) = bytes.iter().position(|b| !(0x20..=0x7e).contains(b)) {
        return Err(NodeError::ContentTypeByte {
            offset: base + i as u64,
            byte: bytes[i],
        });
    }
    Ok(())
}

/// The immutable metadata of a node: its content type, ordered child refs and content size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDescriptor {
    pub content_type: ContentType,
    /// Ordered child refs; order and duplicates are part of the identity.
    pub refs: Vec<Hash>,
    pub content_size: u64,
}

impl NodeDescriptor {
    pub fn new(content_type: ContentType, refs: Vec<Hash>, content_size: u64) -> Self {
        NodeDescriptor {
            content_type,
            refs,
            content_size,
        }
    }

    /// The 24-byte header.
    pub fn header(&self) -> Result<[u8; HEADER_LEN], NodeError> {
        let refs = u32::try_from(self.refs.len()).map_err(|_| NodeError::Limit {
            field: LimitField::RefCount,
            value: self.refs.len() as u64,
            limit: u32::MAX as u64,
        })?;
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&SIGNATURE);
        h[2..4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[8..16].copy_from_slice(&self.content_size.to_le_bytes());
        h[16..20].copy_from_slice(&refs.to_le_bytes());
        // A ContentType is at most 1024 bytes, so this cannot truncate.
        h[20..22].copy_from_slice(&(self.content_type.0.len() as u16).to_le_bytes());
        Ok(h)
    }

    /// Bytes before the own content: header, content type and refs.
    pub fn prefix_len(&self) -> u64 {
        HEADER_LEN as u64 + self.content_type.0.len() as u64 + 32 * self.refs.len() as u64
    }

    /// Total canonical length, or `SizeOverflow`.
    pub fn canonical_len(&self) -> Result<u64, NodeError> {
        self.prefix_len()
            .checked_add(self.content_size)
            .ok_or(NodeError::SizeOverflow)
    }

    /// Checks the descriptor against `limits`.
    pub fn check_limits(&self, limits: &NodeLimits) -> Result<(), NodeError> {
        check_declared(
            self.content_size,
            self.refs.len() as u64,
            self.content_type.0.len() as u64,
            limits,
        )
    }

    /// Header, content type and refs: everything the hash covers before the own content.
    pub fn prefix(&self) -> Result<Vec<u8>, NodeError> {
        let mut out = Vec::with_capacity(self.prefix_len() as usize);
        out.extend_from_slice(&self.header()?);
        out.extend_from_slice(self.content_type.0.as_bytes());
        for r in &self.refs {
            out.extend_from_slice(r.as_bytes());
        }
        Ok(out)
    }

    /// A hasher primed with the prefix; feed it the own content.
    pub fn hasher(&self) -> Result<NodeHasher, NodeError> {
        let mut sha = Sha256::new();
        sha.update(self.header()?);
        sha.update(self.content_type.0.as_bytes());
        for r in &self.refs {
            sha.update(r.as_bytes());
        }
        Ok(NodeHasher {
            sha,
            declared: self.content_size,
            seen: 0,
        })
    }

    /// The node hash of this descriptor with `content`.
    pub fn hash_of(&self, content: &[u8]) -> Result<Hash, NodeError> {
        let mut h = self.hasher()?;
        h.update(content);
        h.finish()
    }

    /// The portable full node: prefix followed by `content`.
    pub fn encode_portable(&self, content: &[u8]) -> Result<Vec<u8>, NodeError> {
        if content.len() as u64 != self.content_size {
            return Err(NodeError::ContentSize {
                declared: self.content_size,
                actual: content.len() as u64,
            });
        }
        let total = usize::try_from(self.canonical_len()?).map_err(|_| NodeError::SizeOverflow)?;
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&self.prefix()?);
        out.extend_from_slice(content);
        Ok(out)
    }
}

fn check_declared(
    content_size: u64,
    ref_count: u64,
    ct_len: u64,
    limits: &NodeLimits,
) -> Result<(), NodeError> {
    let limit = |field, value: u64, limit: u64| {
        if value > limit {
            Err(NodeError::Limit {
                field,
                value,
                limit,
            })
        } else {
            Ok(())
        }
    };
    limit(
        LimitField::ContentTypeLength,
        ct_len,
        limits.max_content_type_len.min(MAX_CONTENT_TYPE_LEN) as u64,
    )?;
    limit(LimitField::RefCount, ref_count, limits.max_refs as u64)?;
    limit(
        LimitField::ContentSize,
        content_size,
        limits.max_content_size,
    )?;
    let total = (HEADER_LEN as u64 + ct_len)
        .checked_add(ref_count.checked_mul(32).ok_or(NodeError::SizeOverflow)?)
        .and_then(|p| p.checked_add(content_size))
        .ok_or(NodeError::SizeOverflow)?;
    limit(LimitField::CanonicalSize, total, limits.max_canonical_size)
}

/// Hashes a node whose prefix is already fed; counts content bytes so that a short or long
/// content is an error, not a different hash.
#[derive(Clone)]
pub struct NodeHasher {
    sha: Sha256,
    declared: u64,
    seen: u64,
}

impl NodeHasher {
    pub fn update(&mut self, content: &[u8]) {
        self.seen = self.seen.saturating_add(content.len() as u64);
        self.sha.update(content);
    }

    pub fn finish(self) -> Result<Hash, NodeError> {
        if self.seen != self.declared {
            return Err(NodeError::ContentSize {
                declared: self.declared,
                actual: self.seen,
            });
        }
        Ok(Hash::from_bytes(self.sha.finalize().into()))
    }
}

impl fmt::Debug for NodeHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeHasher")
            .field("declared", &self.declared)
            .field("seen", &self.seen)
            .finish()
    }
}

/// The fields of a header that passed the format rules.
#[derive(Debug, Clone, Copy)]
struct HeaderFields {
    content_size: u64,
    ref_count: u32,
    ct_len: u16,
}

impl HeaderFields {
    fn prefix_len(&self) -> u64 {
        HEADER_LEN as u64 + self.ct_len as u64 + 32 * self.ref_count as u64
    }
}

fn parse_header(h: &[u8; HEADER_LEN], limits: &NodeLimits) -> Result<HeaderFields, NodeError> {
    let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
    if h[0..2] != SIGNATURE {
        return Err(NodeError::Signature {
            found: [h[0], h[1]],
        });
    }
    let version = u16_at(2);
    if version != FORMAT_VERSION {
        return Err(NodeError::Version { found: version });
    }
    let flags = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if flags != 0 {
        return Err(NodeError::Flags { found: flags });
    }
    let reserved = u16_at(22);
    if reserved != 0 {
        return Err(NodeError::Reserved { found: reserved });
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&h[8..16]);
    let fields = HeaderFields {
        content_size: u64::from_le_bytes(size),
        ref_count: u32::from_le_bytes([h[16], h[17], h[18], h[19]]),
        ct_len: u16_at(20),
    };
    if fields.ct_len == 0 || fields.ct_len > MAX_CONTENT_TYPE_LEN {
        return Err(NodeError::ContentTypeLength {
            len: fields.ct_len as u64,
        });
    }
    check_declared(
        fields.content_size,
        fields.ref_count as u64,
        fields.ct_len as u64,
        limits,
    )?;
    Ok(fields)
}

/// A portable node decoded from a byte slice; `content` borrows from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortableNode<'a> {
    pub hash: Hash,
    pub descriptor: NodeDescriptor,
    pub content: &'a [u8],
}

/// Decodes a portable full node, enforcing every format rule and `limits`, and computes its
/// hash. Use [`verify_portable`] when the expected hash is known.
pub fn decode_portable<'a>(
    bytes: &'a [u8],
    limits: &NodeLimits,
) -> Result<PortableNode<'a>, NodeError> {
    let actual = bytes.len() as u64;
    let Some(header) = bytes.first_chunk::<HEADER_LEN>() else {
        return Err(NodeError::Truncated {
            expected: HEADER_LEN as u64,
            actual,
        });
    };
    let fields = parse_header(header, limits)?;
    // parse_header checked that this sum does not overflow.
    let prefix = fields.prefix_len();
    let expected = prefix + fields.content_size;
    if actual < expected {
        return Err(NodeError::Truncated { expected, actual });
    }
    if actual > expected {
        return Err(NodeError::TrailingBytes {
            expected,
            actual: Some(actual),
        });
    }
    let ct_end = HEADER_LEN + fields.ct_len as usize;
    let ct = &bytes[HEADER_LEN..ct_end];
    check_content_type(ct, HEADER_LEN as u64)?;
    let refs = bytes[ct_end..prefix as usize]
        .chunks_exact(32)
        .filter_map(Hash::from_slice)
        .collect();
    let descriptor = NodeDescriptor {
        // check_content_type proved the bytes are printable ASCII.
        content_type: ContentType(String::from_utf8_lossy(ct).into_owned()),
        refs,
        content_size: fields.content_size,
    };
    Ok(PortableNode {
        hash: Hash::digest(bytes),
        descriptor,
        content: &bytes[prefix as usize..],
    })
}

/// Decodes a portable full node and checks that it hashes to `expected`.
pub fn verify_portable<'a>(
    bytes: &'a [u8],
    expected: &Hash,
    limits: &NodeLimits,
) -> Result<PortableNode<'a>, NodeError> {
    let node = decode_portable(bytes, limits)?;
    if node.hash != *expected {
        return Err(NodeError::Digest {
            expected: *expected,
            actual: node.hash,
        });
    }
    Ok(node)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Header,
    ContentType,
    Refs,
    Content,
}

/// Validates a portable node fed in arbitrary chunks, without holding its content.
///
/// [`update`](Self::update) returns the part of each chunk that is own content, so the caller
/// can store it as it passes; [`finish`](Self::finish) checks the length and the digest.
/// Limits are checked as soon as the header is complete, before anything is allocated.
pub struct NodeStreamValidator {
    limits: NodeLimits,
    sha: Sha256,
    stage: Stage,
    header: [u8; HEADER_LEN],
    fields: Option<HeaderFields>,
    ct: Vec<u8>,
    refs: Vec<Hash>,
    ref_buf: [u8; 32],
    ref_filled: usize,
    content_seen: u64,
    total: u64,
    descriptor: Option<NodeDescriptor>,
}

impl fmt::Debug for NodeStreamValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeStreamValidator")
            .field("stage", &self.stage)
            .field("total", &self.total)
            .finish()
    }
}

impl NodeStreamValidator {
    pub fn new(limits: NodeLimits) -> Self {
        NodeStreamValidator {
            limits,
            sha: Sha256::new(),
            stage: Stage::Header,
            header: [0; HEADER_LEN],
            fields: None,
            ct: Vec::new(),
            refs: Vec::new(),
            ref_buf: [0; 32],
            ref_filled: 0,
            content_seen: 0,
            total: 0,
            descriptor: None,
        }
    }

    /// The descriptor, once header, content type and refs have been read.
    pub fn descriptor(&self) -> Option<&NodeDescriptor> {
        self.descriptor.as_ref()
    }

    /// Bytes consumed so far.
    pub fn bytes_seen(&self) -> u64 {
        self.total
    }

    /// Feeds the next chunk; returns the part of it that is own content.
    pub fn update<'c>(&mut self, chunk: &'c [u8]) -> Result<&'c [u8], NodeError> {
        let mut rest = chunk;
        let mut content: &'c [u8] = &[];
        while !rest.is_empty() {
            match self.stage {
                Stage::Header => {
                    let filled = self.total as usize;
                    let take = (HEADER_LEN - filled).min(rest.len());
                    self.header[filled..filled + take].copy_from_slice(&rest[..take]);
                    self.consume(&rest[..take]);
                    rest = &rest[take..];
                    if self.total as usize == HEADER_LEN {
                        let fields = parse_header(&self.header, &self.limits)?;
                        self.ct.reserve_exact(fields.ct_len as usize);
                        self.refs.reserve_exact(fields.ref_count as usize);
                        self.fields = Some(fields);
                        self.stage = Stage::ContentType;
                    }
                }
                Stage::ContentType => {
                    let want = self.field().ct_len as usize - self.ct.len();
                    let take = want.min(rest.len());
                    self.ct.extend_from_slice(&rest[..take]);
                    self.consume(&rest[..take]);
                    rest = &rest[take..];
                    if self.ct.len() == self.field().ct_len as usize {
                        check_content_type(&self.ct, HEADER_LEN as u64)?;
                        self.stage = Stage::Refs;
                        self.advance_past_refs_if_done();
                    }
                }
                Stage::Refs => {
                    let take = (32 - self.ref_filled).min(rest.len());
                    self.ref_buf[self.ref_filled..self.ref_filled + take]
                        .copy_from_slice(&rest[..take]);
                    self.ref_filled += take;
                    self.consume(&rest[..take]);
                    rest = &rest[take..];
                    if self.ref_filled == 32 {
                        self.refs.push(Hash::from_bytes(self.ref_buf));
                        self.ref_filled = 0;
                        self.advance_past_refs_if_done();
                    }
                }
                Stage::Content => {
                    let fields = self.field();
                    let want = fields.content_size - self.content_seen;
                    if want == 0 {
                        return Err(NodeError::TrailingBytes {
                            expected: fields.prefix_len() + fields.content_size,
                            actual: None,
                        });
                    }
                    let take = (want.min(rest.len() as u64)) as usize;
                    content = &rest[..take];
                    self.content_seen += take as u64;
                    self.consume(content);
                    rest = &rest[take..];
                }
            }
        }
        Ok(content)
    }

    fn field(&self) -> HeaderFields {
        // Only called after the header stage, which sets it.
        self.fields.unwrap_or(HeaderFields {
            content_size: 0,
            ref_count: 0,
            ct_len: 0,
        })
    }

    fn consume(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.total += bytes.len() as u64;
    }

    fn advance_past_refs_if_done(&mut self) {
        let fields = self.field();
        if self.refs.len() == fields.ref_count as usize {
            self.stage = Stage::Content;
            self.descriptor = Some(NodeDescriptor {
                content_type: ContentType(String::from_utf8_lossy(&self.ct).into_owned()),
                refs: std::mem::take(&mut self.refs),
                content_size: fields.content_size,
            });
        }
    }

    /// Checks that the node is complete and, if given, that it hashes to `expected`.
    pub fn finish(self, expected: Option<&Hash>) -> Result<(NodeDescriptor, Hash), NodeError> {
        let complete = self.stage == Stage::Content
            && self.content_seen == self.fields.map_or(0, |f| f.content_size);
        let descriptor = match (complete, self.descriptor) {
            (true, Some(d)) => d,
            _ => {
                let expected = self
                    .fields
                    .map_or(HEADER_LEN as u64, |f| f.prefix_len() + f.content_size);
                return Err(NodeError::Truncated {
                    expected,
                    actual: self.total,
                });
            }
        };
        let actual = Hash::from_bytes(self.sha.finalize().into());
        if let Some(expected) = expected
            && *expected != actual
        {
            return Err(NodeError::Digest {
                expected: *expected,
                actual,
            });
        }
        Ok((descriptor, actual))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (NodeDescriptor, Vec<u8>) {
        let child = Hash::digest(b"child");
        let d = NodeDescriptor::new(
            ContentType::new("text/plain").unwrap(),
            vec![child, child],
            5,
        );
        (d, b"hello".to_vec())
    }

    #[test]
    fn streaming_matches_slice_decoding_for_every_split() {
        let (d, content) = sample();
        let bytes = d.encode_portable(&content).unwrap();
        let whole = decode_portable(&bytes, &NodeLimits::default()).unwrap();
        for split in 0..=bytes.len() {
            let mut v = NodeStreamValidator::new(NodeLimits::default());
            let mut got = v.update(&bytes[..split]).unwrap().to_vec();
            got.extend_from_slice(v.update(&bytes[split..]).unwrap());
            let (desc, _) = v.finish(Some(&whole.hash)).unwrap();
            assert_eq!(desc, d);
            assert_eq!(got, content);
        }
    }

    #[test]
    fn streaming_rejects_trailing_and_truncated_input() {
        let (d, content) = sample();
        let mut bytes = d.encode_portable(&content).unwrap();
        let mut v = NodeStreamValidator::new(NodeLimits::default());
        v.update(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(v.finish(None).unwrap_err().kind(), NodeRejectKind::Length);
        bytes.push(0);
        let mut v = NodeStreamValidator::new(NodeLimits::default());
        assert_eq!(v.update(&bytes).unwrap_err().kind(), NodeRejectKind::Length);
    }

    #[test]
    fn limits_are_checked_from_the_header_alone() {
        let d = NodeDescriptor::new(ContentType::octet_stream(), vec![], u64::MAX - 10);
        let header = d.header().unwrap();
        let err = decode_portable(&header, &NodeLimits::default()).unwrap_err();
        assert!(matches!(
            err,
            NodeError::Limit {
                field: LimitField::ContentSize,
                ..
            }
        ));
        let err = decode_portable(&header, &NodeLimits::format_max()).unwrap_err();
        assert_eq!(err, NodeError::SizeOverflow);
        let mut v = NodeStreamValidator::new(NodeLimits::default());
        assert!(v.update(&header).is_err());
        let refs = vec![Hash::digest(b""); 257];
        let d = NodeDescriptor::new(ContentType::octet_stream(), refs, 0);
        let bytes = d.encode_portable(&[]).unwrap();
        let err = decode_portable(&bytes, &NodeLimits::default()).unwrap_err();
        assert!(matches!(
            err,
            NodeError::Limit {
                field: LimitField::RefCount,
                value: 257,
                limit: 256
            }
        ));
    }

    #[test]
    fn hasher_counts_content() {
        let (d, _) = sample();
        assert!(matches!(
            d.hash_of(b"hell"),
            Err(NodeError::ContentSize {
                declared: 5,
                actual: 4
            })
        ));
        assert!(d.encode_portable(b"hello!").is_err());
    }
}
