//! Request and response bodies of the data plane (`/v1/cas/*`), shared by service and client so
//! that the two cannot drift. Field names are the JSON names of the contract (camelCase);
//! timestamps are milliseconds since the Unix epoch.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::hash::Hash;
use crate::ids::{RefDomain, RequestId};

/// The permissions a capability grants, one per data-plane operation.
pub mod permission {
    pub const NODES_READ: &str = "cas:nodes:read";
    pub const NODES_LEASE: &str = "cas:nodes:lease";
    pub const USAGE_READ: &str = "cas:usage:read";
    pub const GC_EXECUTE: &str = "cas:gc:execute";
    pub const ROOT_REFS_UPDATE: &str = "cas:root-refs:update";
    pub const ROOT_REFS_READ: &str = "cas:root-refs:read";
    /// Every permission of the data plane.
    pub const ALL: &[&str] = &[
        NODES_READ,
        NODES_LEASE,
        USAGE_READ,
        GC_EXECUTE,
        ROOT_REFS_UPDATE,
        ROOT_REFS_READ,
    ];
}

/// Most changes in one root-ref update.
pub const MAX_CHANGES: usize = 1000;
/// Largest magnitude of one root-ref delta.
pub const MAX_DELTA: i64 = 1_000_000;
/// Nodes one GC pass examines when the request names no number.
pub const GC_DEFAULT_NODES: u32 = 100;
/// Most nodes one GC pass may be asked to examine.
pub const GC_MAX_NODES: u32 = 10_000;
/// Root-ref balances per page when the request names no limit.
pub const ROOT_REFS_DEFAULT_LIMIT: u32 = 100;
/// Most root-ref balances per page.
pub const ROOT_REFS_MAX_LIMIT: u32 = 200;
/// Most leases one batch lease request may hold.
pub const MAX_BATCH_LEASES: usize = 1000;
/// Largest portable node a batch lease element may carry inline.
pub const MAX_INLINE_NODE_BYTES: u64 = 256 * 1024;
/// Largest body of one batch lease request.
pub const MAX_BATCH_LEASE_BODY: u64 = 16 << 20;
/// Media type of a batch lease body whose inline nodes travel as raw bytes: see
/// [`batch_body`].
pub const BATCH_LEASE_BINARY: &str = "application/vnd.unicas.leases";

/// The error body of every non-2xx answer: a stable code and a safe message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// Stable machine-readable code, e.g. `APP_SUSPENDED`.
    pub error: String,
    /// Human-readable detail that never names a path, key, query or other partition.
    pub message: String,
}

/// Body of `POST /v1/cas/nodes/{hash}/lease`. Unknown fields are ignored (the public contract
/// lets clients add fields); `leaseDurationMs` must be greater than 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseRequest {
    /// Requested lease duration, greater than 0; the service clamps it (60 s … 24 h by
    /// default).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub lease_duration_ms: u64,
    /// Optional and advisory: a node of the same Space this one probably resembles (the
    /// previous version of the same file). When this lease publishes the node, the service may
    /// store it as a delta against that node; it ignores a hash that is not a ready node
    /// here. Reads are the same either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub delta_base: Option<Hash>,
}

/// Where and how to upload a portable full node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UploadTarget {
    /// Always `PUT`.
    pub method: String,
    /// A presigned, write-once URL.
    pub url: String,
    /// When the URL stops working.
    pub expires_at: i64,
    /// Headers to send exactly as given (lowercase names).
    pub headers: BTreeMap<String, String>,
}

/// Why an uploaded node was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rejection {
    /// `NODE_DIGEST_MISMATCH`, `INVALID_CANONICAL_NODE`, `NODE_TOO_LARGE`, `SVALUE_REFS_MISMATCH`, …
    pub code: String,
    pub message: String,
}

/// The answer to a lease: a union discriminated by `state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LeaseResponse {
    /// The node is ready and leased until `leaseExpiresAt`.
    #[serde(rename_all = "camelCase")]
    Ready {
        hash: Hash,
        lease_started_at: i64,
        lease_expires_at: i64,
    },
    /// PUT the portable node to `upload`, then repeat the lease.
    AwaitingUpload { hash: Hash, upload: UploadTarget },
    /// The previous upload was refused; PUT a correct node to the new `upload`.
    AwaitingReplacementUpload {
        hash: Hash,
        upload: UploadTarget,
        rejection: Rejection,
    },
    /// The bytes are valid, but these distinct children (in canonical order) are not ready.
    #[serde(rename_all = "camelCase")]
    ValidatedAwaitingChildren { hash: Hash, child_hashes: Vec<Hash> },
}

impl LeaseResponse {
    pub fn hash(&self) -> Hash {
        match self {
            LeaseResponse::Ready { hash, .. }
            | LeaseResponse::AwaitingUpload { hash, .. }
            | LeaseResponse::AwaitingReplacementUpload { hash, .. }
            | LeaseResponse::ValidatedAwaitingChildren { hash, .. } => *hash,
        }
    }

    /// The `state` discriminator.
    pub fn state(&self) -> &'static str {
        match self {
            LeaseResponse::Ready { .. } => "ready",
            LeaseResponse::AwaitingUpload { .. } => "awaiting_upload",
            LeaseResponse::AwaitingReplacementUpload { .. } => "awaiting_replacement_upload",
            LeaseResponse::ValidatedAwaitingChildren { .. } => "validated_awaiting_children",
        }
    }
}

/// One element of `POST /v1/cas/leases`: the single lease's body plus the node's hash, its
/// optional declared size, and, for a node of at most [`MAX_INLINE_NODE_BYTES`], optionally
/// the portable node itself, validated and published by this very lease: in a JSON body as
/// `content` (standard base64), in a binary body ([`BATCH_LEASE_BINARY`]) as `contentBytes`
/// raw bytes after the JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchLeaseElement {
    pub hash: Hash,
    /// As in the single lease: greater than 0; the service clamps it.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub lease_duration_ms: u64,
    /// The size of the portable node the client would upload (chooses the upload target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_bytes: Option<u64>,
    /// The portable node, standard base64, at most 256 KiB decoded (JSON bodies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// In a binary body only: the length of the portable node this element carries among the
    /// bytes after the JSON (the elements' nodes follow it back to back, in order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_bytes: Option<u64>,
    /// As in the single lease: an advisory base for storing the node as a delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub delta_base: Option<Hash>,
}

/// Body of `POST /v1/cas/leases`: up to [`MAX_BATCH_LEASES`] leases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchLeaseRequest {
    pub leases: Vec<BatchLeaseElement>,
}

/// A binary batch lease body ([`BATCH_LEASE_BINARY`]): the JSON request (`json`, a
/// [`BatchLeaseRequest`] whose elements name their `contentBytes`) after its length as four
/// bytes, big-endian, then the elements' portable nodes back to back, in element order. Inline
/// nodes then travel without base64 or JSON escaping, each byte copied once.
pub fn batch_body(json: &[u8], nodes: &[impl AsRef<[u8]>]) -> Result<Vec<u8>, BatchBodyError> {
    let mut body = batch_body_head(json)?;
    body.reserve_exact(nodes.iter().map(|n| n.as_ref().len()).sum::<usize>());
    for n in nodes {
        body.extend_from_slice(n.as_ref());
    }
    Ok(body)
}

/// The start of a [`batch_body`]: the JSON's length and the JSON, which the nodes follow (a
/// client may send them as parts of their own, without copying them into one buffer).
pub fn batch_body_head(json: &[u8]) -> Result<Vec<u8>, BatchBodyError> {
    let said = u32::try_from(json.len()).map_err(|_| BatchBodyError::JsonTooLong(json.len()))?;
    let mut head = Vec::with_capacity(4 + json.len());
    head.extend_from_slice(&said.to_be_bytes());
    head.extend_from_slice(json);
    Ok(head)
}

/// Why a binary batch lease body cannot be split.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchBodyError {
    #[error("a binary batch body starts with its JSON's length in four bytes; it has {0} bytes")]
    NoLength(usize),
    #[error("the JSON of a binary batch body is said to be {said} bytes; {left} follow")]
    ShortJson { said: u64, left: usize },
    #[error("a JSON of {0} bytes is too long for a binary batch body")]
    JsonTooLong(usize),
}

/// Splits a binary batch lease body into its JSON and the bytes after it (the nodes); the
/// lengths the JSON names are the caller's to check against the second part.
pub fn split_batch_body(body: &[u8]) -> Result<(&[u8], &[u8]), BatchBodyError> {
    let Some((len, rest)) = body.split_first_chunk::<4>() else {
        return Err(BatchBodyError::NoLength(body.len()));
    };
    let said = u32::from_be_bytes(*len) as u64;
    if said > rest.len() as u64 {
        return Err(BatchBodyError::ShortJson {
            said,
            left: rest.len(),
        });
    }
    Ok(rest.split_at(said as usize))
}

/// One answer of a batch lease: the single lease's answer, or this element's own error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum BatchLeaseResult {
    Lease(LeaseResponse),
    Error(ErrorBody),
}

/// The answer to `POST /v1/cas/leases`: one result per element, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BatchLeaseResponse {
    pub results: Vec<BatchLeaseResult>,
}

/// Immutable metadata of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeMetadata {
    pub hash: Hash,
    /// Bytes of own content.
    pub size: u64,
    pub content_type: String,
    /// Ordered child refs; duplicates are significant.
    pub refs: Vec<Hash>,
}

/// Mutable state of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeState {
    pub lease_started_at: i64,
    pub lease_expires_at: i64,
    pub child_ref_count: i64,
    pub root_ref_count: i64,
}

/// Body of `GET /v1/cas/nodes/{hash}/metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeMetadataResponse {
    pub metadata: NodeMetadata,
    pub state: NodeState,
}

/// Body of `GET /v1/cas/usage` (and, summed over Spaces, of the admin App usage).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// Node rows, ready or being collected.
    pub node_count: i64,
    /// Own-content bytes of ready rows.
    pub ready_content_bytes: i64,
    /// Bytes the object store holds for ready rows (after compression).
    pub ready_stored_bytes: i64,
    /// Bytes reserved by active upload generations.
    pub reserved_bytes: i64,
    /// Rows being collected.
    pub not_ready_node_count: i64,
    /// Rows with an unexpired lease.
    pub leased_node_count: i64,
}

/// Body of `POST /v1/cas/gc` (optional). Unknown fields are ignored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GcRequest {
    /// 1–10,000; default 100.
    #[serde(default)]
    pub max_nodes: Option<u32>,
}

/// Result of one bounded GC pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GcResponse {
    pub examined: u64,
    pub deleted: u64,
    pub reclaimed_content_bytes: u64,
}

/// Signed, non-zero root-ref deltas by hash. Duplicate keys are refused when parsing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, i64>))]
pub struct RefChanges(pub BTreeMap<Hash, i64>);

impl<'de> Deserialize<'de> for RefChanges {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RefChanges;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of hash to signed integer delta")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RefChanges, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(hash) = map.next_key::<Hash>()? {
                    let delta = map.next_value::<i64>()?;
                    if out.insert(hash, delta).is_some() {
                        return Err(serde::de::Error::custom(format_args!(
                            "hash {hash} appears twice in changes"
                        )));
                    }
                }
                Ok(RefChanges(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Body of `POST /v1/cas/root-refs`. Unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RootRefUpdate {
    pub request_id: RequestId,
    pub changes: RefChanges,
}

/// Answer to an accepted (or replayed) root-ref update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RootRefUpdateResponse {
    pub success: bool,
    /// True when this request id was already applied with the same changes.
    pub idempotent: bool,
    /// The App-global revision of the update.
    pub revision: u64,
}

/// One root-ref balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RootRefItem {
    pub hash: Hash,
    pub ref_count: i64,
}

/// A page of root-ref balances, all read at `revision`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RootRefPage {
    /// The domain the balances belong to: the capability's `refDomain`, else the default one.
    /// (Absent in answers of older servers, which kept only the default domain.)
    #[serde(default)]
    pub ref_domain: RefDomain,
    pub revision: u64,
    pub items: Vec<RootRefItem>,
    /// Pass as `cursor` to read the next page at the same revision; absent on the last page.
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_union_shapes() {
        let h = Hash::digest(b"x");
        let r = LeaseResponse::Ready {
            hash: h,
            lease_started_at: 1,
            lease_expires_at: 2,
        };
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["state"], "ready");
        assert_eq!(j["leaseExpiresAt"], 2);
        let v = LeaseResponse::ValidatedAwaitingChildren {
            hash: h,
            child_hashes: vec![h],
        };
        let j = serde_json::to_value(&v).unwrap();
        assert_eq!(j["state"], "validated_awaiting_children");
        assert_eq!(j["childHashes"][0], h.to_string());
        assert_eq!(serde_json::from_value::<LeaseResponse>(j).unwrap(), v);
    }

    #[test]
    fn binary_batch_bodies_split_as_they_were_joined() {
        let json = br#"{"leases":[]}"#;
        let body = batch_body(json, &[&b"ab"[..], b"", b"cde"]).unwrap();
        assert_eq!(&body[..4], &[0, 0, 0, 13]);
        assert_eq!(split_batch_body(&body), Ok((&json[..], &b"abcde"[..])));
        // Nothing after the JSON, or nothing but the length.
        let bare = batch_body(b"", &[] as &[&[u8]]).unwrap();
        assert_eq!(split_batch_body(&bare), Ok((&b""[..], &b""[..])));
        for short in [&b""[..], b"\0", b"\0\0\0"] {
            assert_eq!(
                split_batch_body(short),
                Err(BatchBodyError::NoLength(short.len()))
            );
        }
        // A length past the end, up to the largest four bytes can say.
        assert_eq!(
            split_batch_body(&body[..body.len() - 6]),
            Err(BatchBodyError::ShortJson { said: 13, left: 12 })
        );
        let mut huge = body.clone();
        huge[..4].copy_from_slice(&[0xff; 4]);
        assert_eq!(
            split_batch_body(&huge),
            Err(BatchBodyError::ShortJson {
                said: u32::MAX as u64,
                left: 18
            })
        );
    }

    #[test]
    fn lease_requests_ignore_unknown_fields() {
        assert!(serde_json::from_str::<LeaseRequest>(r#"{"leaseDurationMs":60000}"#).is_ok());
        // The public contract lets clients add fields.
        assert!(serde_json::from_str::<LeaseRequest>(r#"{"leaseDurationMs":60000,"x":1}"#).is_ok());
        assert!(serde_json::from_str::<LeaseRequest>(r#"{"leaseDurationMs":-1}"#).is_err());
        assert!(serde_json::from_str::<LeaseRequest>(r#"{}"#).is_err());
    }

    #[test]
    fn root_ref_changes_refuse_duplicates_and_fractions() {
        let h = "a".repeat(64);
        let ok = format!(r#"{{"requestId":"r:1","changes":{{"{h}":2}}}}"#);
        let u: RootRefUpdate = serde_json::from_str(&ok).unwrap();
        assert_eq!(u.changes.0.values().copied().collect::<Vec<_>>(), vec![2]);
        let dup = format!(r#"{{"requestId":"r:1","changes":{{"{h}":2,"{h}":3}}}}"#);
        assert!(serde_json::from_str::<RootRefUpdate>(&dup).is_err());
        let frac = format!(r#"{{"requestId":"r:1","changes":{{"{h}":1.5}}}}"#);
        assert!(serde_json::from_str::<RootRefUpdate>(&frac).is_err());
        let bad_hash = r#"{"requestId":"r:1","changes":{"ABC":1}}"#;
        assert!(serde_json::from_str::<RootRefUpdate>(bad_hash).is_err());
    }
}
