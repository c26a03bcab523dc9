//! The elements of a batch lease body, in either form: JSON, whose inline nodes are base64
//! `content`, or binary ([`BATCH_LEASE_BINARY`]), whose inline nodes follow the JSON as raw
//! bytes, each element naming its length as `contentBytes`. The lengths a client names are
//! checked against the bytes that came before anything is leased: a body whose lengths do
//! not add up to its bytes exactly is refused whole.

use axum::http::{HeaderMap, header};
use bytes::Bytes;
use cas_format::wire::{BATCH_LEASE_BINARY, BatchLeaseElement};

use crate::error::{ApiError, ApiResult};

/// An element's inline node as it came.
pub enum Content {
    /// Standard base64, from a JSON body; decoded when the element is checked.
    Base64(String),
    /// Raw bytes of a binary body (a slice of it, not a copy).
    Raw(Bytes),
}

impl Content {
    /// About how many bytes of node it holds (base64 is not decoded to tell).
    pub fn node_len(&self) -> usize {
        match self {
            Content::Base64(text) => text.len() / 4 * 3,
            Content::Raw(bytes) => bytes.len(),
        }
    }
}

/// One element of a batch: its lease (without inline content) and its inline node, if any.
pub struct Element {
    pub lease: BatchLeaseElement,
    pub content: Option<Content>,
}

/// Whether the request's body is the binary form.
pub fn is_binary(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case(BATCH_LEASE_BINARY))
}

/// The elements of a JSON body.
pub fn json_elements(leases: Vec<BatchLeaseElement>) -> ApiResult<Vec<Element>> {
    leases
        .into_iter()
        .enumerate()
        .map(|(i, mut lease)| {
            if lease.content_bytes.is_some() {
                return Err(ApiError::invalid(format!(
                    "element {i} names contentBytes, which only a body of type \
                     {BATCH_LEASE_BINARY} carries; in JSON the node is base64 content"
                )));
            }
            let content = lease.content.take().map(Content::Base64);
            Ok(Element { lease, content })
        })
        .collect()
}

/// The elements of a binary body: `nodes` is what followed its JSON.
pub fn binary_elements(leases: Vec<BatchLeaseElement>, nodes: Bytes) -> ApiResult<Vec<Element>> {
    let total = nodes.len() as u64;
    let mut at = 0u64;
    let mut elements = Vec::with_capacity(leases.len());
    for (i, mut lease) in leases.into_iter().enumerate() {
        if lease.content.is_some() {
            return Err(ApiError::invalid(format!(
                "element {i} carries base64 content in a binary body; its node goes after the \
                 JSON, its length in contentBytes"
            )));
        }
        let content = match lease.content_bytes.take() {
            None => None,
            Some(n) => {
                let end = at.checked_add(n).filter(|end| *end <= total).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "element {i} names {n} bytes of content where {} are left after the JSON",
                        total - at
                    ))
                })?;
                // Both ends are within `nodes`, whose length is a `usize`.
                let node = nodes.slice(at as usize..end as usize);
                at = end;
                Some(Content::Raw(node))
            }
        };
        elements.push(Element { lease, content });
    }
    if at != total {
        return Err(ApiError::invalid(format!(
            "{total} bytes follow the JSON of the body, but its elements name {at}"
        )));
    }
    Ok(elements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cas_format::Hash;

    fn element(content: Option<&str>, content_bytes: Option<u64>) -> BatchLeaseElement {
        BatchLeaseElement {
            hash: Hash::digest(b"x"),
            lease_duration_ms: 60_000,
            upload_bytes: None,
            content: content.map(str::to_string),
            content_bytes,
            delta_base: None,
        }
    }

    fn raw(e: &Element) -> Option<&[u8]> {
        match &e.content {
            Some(Content::Raw(b)) => Some(b),
            _ => None,
        }
    }

    #[test]
    fn nodes_are_cut_where_their_lengths_say() {
        let nodes = Bytes::from_static(b"abcdef");
        let leases = vec![
            element(None, Some(2)),
            element(None, None),
            element(None, Some(0)),
            element(None, Some(4)),
        ];
        let got = binary_elements(leases, nodes).unwrap();
        let cut: Vec<Option<&[u8]>> = got.iter().map(raw).collect();
        assert_eq!(cut, [Some(&b"ab"[..]), None, Some(b""), Some(b"cdef")]);
        assert!(got.iter().all(|e| e.lease.content_bytes.is_none()));
    }

    #[test]
    fn lengths_that_do_not_add_up_are_refused() {
        let nodes = || Bytes::from_static(b"abcdef");
        let cases = [
            (vec![Some(2), Some(3)], "its elements name 5"),
            (
                vec![Some(2), Some(5)],
                "names 5 bytes of content where 4 are left",
            ),
            (vec![Some(7)], "names 7 bytes"),
            (
                vec![Some(1), Some(u64::MAX)],
                "names 18446744073709551615 bytes",
            ),
            (
                vec![None],
                "6 bytes follow the JSON of the body, but its elements name 0",
            ),
        ];
        for (lengths, says) in cases {
            let leases = lengths.iter().map(|n| element(None, *n)).collect();
            let Err(e) = binary_elements(leases, nodes()) else {
                panic!("{lengths:?} was taken");
            };
            assert_eq!(e.code, "INVALID_REQUEST");
            assert!(e.message.contains(says), "{lengths:?}: {}", e.message);
        }
        let both = vec![element(Some("YQ=="), Some(1))];
        assert!(binary_elements(both, Bytes::from_static(b"a")).is_err());
        assert!(json_elements(vec![element(None, Some(1))]).is_err());
        let json = json_elements(vec![element(Some("YQ=="), None)]).unwrap();
        assert!(matches!(&json[0].content, Some(Content::Base64(s)) if s == "YQ=="));
    }

    #[test]
    fn the_binary_form_is_named_by_its_media_type() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, v.parse().unwrap());
            is_binary(&h)
        };
        assert!(with(BATCH_LEASE_BINARY));
        assert!(with("Application/Vnd.Unicas.Leases ; charset=binary"));
        assert!(!with("application/json"));
        assert!(!with("application/vnd.unicas.leases2"));
        assert!(!is_binary(&HeaderMap::new()));
    }
}
