//! SValue v1: the structured values stored in nodes of content type
//! `application/vnd.unidocs.svalue+cbor;version=1` (see `spec/svalue.md` in the design documents).
//!
//! A value is null, a boolean, a number (one finite number type, integral values within
//! ±(2^53 − 1)), a string, an array, a map with string keys, or an [`Value::Blob`] naming another
//! node. The CBOR encoding is deterministic (RFC 8949 core rules), so one value has one byte
//! string and therefore one node hash; the SBlob tags met in encoded preorder are the node's refs.

use std::collections::BTreeMap;

use crate::hash::Hash;

mod decode;
mod encode;
mod json;

pub use decode::{decode, decode_with_limits, extract_refs};
pub use encode::{Encoded, encode, encode_with_limits};
pub use json::JsonError;

/// The content type of SValue nodes.
pub const SVALUE_CONTENT_TYPE: &str = "application/vnd.unidocs.svalue+cbor;version=1";
/// The CBOR tag of an SBlob.
pub const SBLOB_TAG: u64 = 65536;
/// Largest magnitude of an integral number: 2^53 − 1.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// An SValue.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// A finite number. Integral values encode as CBOR integers and must lie within
    /// ±[`MAX_SAFE_INTEGER`]; others encode as the shortest exact IEEE 754 float.
    Number(f64),
    String(String),
    Array(Vec<Value>),
    /// Keys are unique; the encoder orders them canonically whatever the map's own order.
    Map(BTreeMap<String, Value>),
    /// A handle to another node.
    Blob(Hash),
}

impl Value {
    /// The integer this value holds, if it is an integral number.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(n) if n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER as f64 => {
                Some(*n as i64)
            }
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&BTreeMap<String, Value>> {
        match self {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_blob(&self) -> Option<Hash> {
        match self {
            Value::Blob(h) => Some(*h),
            _ => None,
        }
    }

    /// The map entry `key`, if this is a map that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_map().and_then(|m| m.get(key))
    }

    /// Builds a map from `(key, value)` pairs.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl From<i64> for Value {
    /// Note that an integer beyond ±(2^53 − 1) makes a value the encoder refuses.
    fn from(n: i64) -> Self {
        Value::Number(n as f64)
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Self {
        Value::Number(n as f64)
    }
}

impl From<f64> for Value {
    fn from(n: f64) -> Self {
        Value::Number(n)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}

impl From<Hash> for Value {
    fn from(h: Hash) -> Self {
        Value::Blob(h)
    }
}

impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Self {
        Value::Array(a)
    }
}

/// Bounds checked against declared lengths before anything is allocated. The encoder checks
/// the same bounds, so a value the encoder accepts decodes under the same limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SValueLimits {
    /// Total encoded bytes.
    pub max_bytes: u64,
    /// Nesting depth of arrays, maps and SBlobs (a scalar at top level has depth 1).
    pub max_depth: u32,
    pub max_array_len: u64,
    pub max_map_entries: u64,
    /// Bytes of one string (keys included).
    pub max_string_bytes: u64,
    /// SBlobs in the whole value (the node's refs).
    pub max_refs: u64,
}

impl Default for SValueLimits {
    /// The service defaults: 32 MiB, depth 128, 1 Mi items per array or map, 16 MiB strings,
    /// 256 refs (the node ref limit).
    fn default() -> Self {
        SValueLimits {
            max_bytes: 32 << 20,
            max_depth: 128,
            max_array_len: 1 << 20,
            max_map_entries: 1 << 20,
            max_string_bytes: 16 << 20,
            max_refs: 256,
        }
    }
}

/// What an SValue limit applies to, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SValueLimit {
    Bytes,
    Depth,
    ArrayLength,
    MapEntries,
    StringBytes,
    Refs,
}

impl std::fmt::Display for SValueLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SValueLimit::Bytes => "encoded size",
            SValueLimit::Depth => "nesting depth",
            SValueLimit::ArrayLength => "array length",
            SValueLimit::MapEntries => "map entry count",
            SValueLimit::StringBytes => "string length",
            SValueLimit::Refs => "SBlob count",
        })
    }
}

/// Why bytes are not a canonical SValue, or why a value cannot be encoded.
/// Decoding errors carry the byte offset of the offending item.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SValueError {
    #[error("input ends inside an item at offset {offset}")]
    Truncated { offset: u64 },
    #[error("trailing bytes after the value, from offset {offset}")]
    TrailingBytes { offset: u64 },
    #[error("non-shortest head at offset {offset}")]
    NonShortestHead { offset: u64 },
    #[error("indefinite length at offset {offset}")]
    IndefiniteLength { offset: u64 },
    #[error("reserved additional information {info} at offset {offset}")]
    ReservedHead { offset: u64, info: u8 },
    #[error("integer beyond ±(2^53 − 1) at offset {offset}")]
    IntegerOutOfRange { offset: u64 },
    #[error("float at offset {offset} holds an integral value; integral numbers are CBOR integers")]
    IntegralFloat { offset: u64 },
    #[error("float at offset {offset} is NaN or infinite")]
    NonFiniteFloat { offset: u64 },
    #[error("float at offset {offset} is not in its shortest exact form")]
    NonShortestFloat { offset: u64 },
    #[error("byte string outside an SBlob at offset {offset}")]
    ByteString { offset: u64 },
    #[error("SBlob at offset {offset} holds {len} bytes; it must hold exactly 32")]
    BlobLength { offset: u64, len: u64 },
    #[error("unknown tag {tag} at offset {offset}; only 65536 (SBlob) is allowed")]
    UnknownTag { offset: u64, tag: u64 },
    #[error("simple value {value} at offset {offset}; only false, true and null are allowed")]
    SimpleValue { offset: u64, value: u64 },
    #[error("map key at offset {offset} is not a string")]
    NonStringKey { offset: u64 },
    #[error("map key at offset {offset} is out of canonical order")]
    KeyOrder { offset: u64 },
    #[error("duplicate map key {key:?} at offset {offset}")]
    DuplicateKey { offset: u64, key: String },
    #[error("invalid UTF-8 in the string at offset {offset}")]
    InvalidUtf8 { offset: u64 },
    #[error("{what} {value} at offset {offset} is above the limit of {limit}")]
    Limit {
        what: SValueLimit,
        value: u64,
        limit: u64,
        offset: u64,
    },
    #[error("cannot encode {value}: an integral number must lie within ±(2^53 − 1)")]
    UnsafeInteger { value: f64 },
    #[error("cannot encode a NaN or infinite number")]
    NonFiniteNumber,
    #[error("cannot encode: {what} {value} is above the limit of {limit}")]
    EncodeLimit {
        what: SValueLimit,
        value: u64,
        limit: u64,
    },
}
