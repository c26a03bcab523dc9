//! UniCAS byte formats, with no I/O: node hashes, node format v1, the SValue codec, the archive
//! codec, identifiers and the wire types that service and client share.
//!
//! Everything here takes bytes (or a `std::io::Read`/`Write` for the archive stream), returns a
//! `Result` whose error says what is wrong and where, never panics on input, and checks declared
//! lengths against configurable limits before allocating.
#![forbid(unsafe_code)]

pub mod archive;
pub mod hash;
pub mod ids;
pub mod node;
pub mod svalue;
pub mod wire;

pub use hash::{Hash, HashParseError};
pub use ids::{AppId, IdError, RefDomain, RequestId, SpaceId};
pub use node::{
    ContentType, NODE_MEDIA_TYPE, NodeDescriptor, NodeError, NodeLimits, NodeRejectKind,
    NodeStreamValidator, PortableNode, decode_portable, verify_portable,
};
pub use svalue::{SVALUE_CONTENT_TYPE, SValueError, SValueLimits, Value};
