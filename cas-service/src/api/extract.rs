//! Extractors whose rejections are `ApiError`s (stable codes, JSON bodies), and the bounded
//! JSON body reader.

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use cas_format::Hash;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Query parameters, refused with 400 INVALID_REQUEST when they do not parse.
#[derive(Debug)]
pub struct Q<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| Q(q.0))
            .map_err(|e| ApiError::invalid(query_message(&e.body_text())))
    }
}

fn query_message(text: &str) -> String {
    text.strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text)
        .to_string()
}

/// The `{hash}` path segment, refused with 400 INVALID_REQUEST unless it is 64 lowercase hex.
#[derive(Debug, Clone, Copy)]
pub struct HashPath(pub Hash);

impl<S: Send + Sync> FromRequestParts<S> for HashPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|_| ApiError::invalid("invalid path"))?;
        raw.parse()
            .map(HashPath)
            .map_err(|e| ApiError::invalid(format!("the hash in the path: {e}")))
    }
}

/// Largest JSON body a route reads (set per router from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct JsonLimit(pub usize);

/// Reads at most `limit` bytes of `body`. Handlers call it (and [`parse_json`]) themselves,
/// after the capability is verified: no body is read before auth.
pub async fn bounded_bytes(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                format!("the request body is larger than {limit} bytes"),
            )
        } else {
            ApiError::invalid("the request body could not be read")
        }
    })
}

/// Parses a JSON body; an empty body is parsed as `{}` (for optional bodies).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}
