//! Upload targets served by the service itself: signed, expiring, write-once URLs that only
//! store bytes. Validation happens on the following lease.
//!
//! `PUT {public_url}/v1/cas/uploads/{generation}?appId&spaceId&hash&expires&signature`, where
//! the signature is HMAC-SHA256 (keyed by a service secret shared by all replicas through the
//! database) over every other part. A tampered or expired URL is refused with 403, like a
//! presigned object-store URL; a second PUT to the same URL with 412.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use cas_format::wire::UploadTarget;
use cas_format::{AppId, Hash, NODE_MEDIA_TYPE, SpaceId};
use futures_util::TryStreamExt;
use hmac::{KeyInit, Mac};
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::meta::{GenState, Generation, TargetKind};
use crate::staging::{already_stored, too_large};
use crate::{Service, now_ms};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Signs and checks service upload URLs.
#[derive(Clone)]
pub struct UploadSigner {
    key: Vec<u8>,
    public_url: String,
}

impl std::fmt::Debug for UploadSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadSigner")
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

fn message(app: &AppId, space: &SpaceId, hash: &Hash, generation: &str, expires: i64) -> String {
    format!("unicas-upload-v1\n{app}\n{space}\n{hash}\n{generation}\n{expires}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl UploadSigner {
    pub fn new(key: Vec<u8>, public_url: String) -> Self {
        UploadSigner { key, public_url }
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length.
        <HmacSha256 as KeyInit>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!())
    }

    /// The upload target of a generation written through the service.
    pub fn target(&self, app: &AppId, space: &SpaceId, g: &Generation) -> UploadTarget {
        let mut mac = self.mac();
        mac.update(message(app, space, &g.hash, &g.gen_id, g.url_expires_at).as_bytes());
        let signature = hex(&mac.finalize().into_bytes());
        let url = format!(
            "{}/v1/cas/uploads/{}?appId={app}&spaceId={space}&hash={}&expires={}&signature={signature}",
            self.public_url, g.gen_id, g.hash, g.url_expires_at
        );
        UploadTarget {
            method: "PUT".into(),
            url,
            expires_at: g.url_expires_at,
            headers: upload_headers(),
        }
    }

    fn check(&self, generation: &str, q: &UploadQuery) -> Result<(), ApiError> {
        let given = decode_hex(&q.signature).ok_or_else(bad_signature)?;
        let mut mac = self.mac();
        mac.update(message(&q.app_id, &q.space_id, &q.hash, generation, q.expires).as_bytes());
        mac.verify_slice(&given).map_err(|_| bad_signature())
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn bad_signature() -> ApiError {
    ApiError::forbidden(
        "UPLOAD_SIGNATURE_INVALID",
        "the upload URL's signature does not match",
    )
}

/// The headers a client sends with every upload.
pub fn upload_headers() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("content-type".to_string(), NODE_MEDIA_TYPE.to_string()),
        ("if-none-match".to_string(), "*".to_string()),
    ])
}

/// Query of a service upload URL.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub space_id: SpaceId,
    #[param(value_type = String)]
    pub hash: Hash,
    pub expires: i64,
    pub signature: String,
}

/// Stores the body of a signed upload URL, once.
pub async fn store(
    svc: &Service,
    generation: &str,
    q: &UploadQuery,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<u64> {
    svc.signer.check(generation, q)?;
    if q.expires < now_ms() {
        return Err(ApiError::forbidden(
            "UPLOAD_URL_EXPIRED",
            "the upload URL has expired",
        ));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if content_type != Some(NODE_MEDIA_TYPE) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UPLOAD_CONTENT_TYPE",
            format!("an upload must be sent as {NODE_MEDIA_TYPE}"),
        ));
    }
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        != Some("*")
    {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "UPLOAD_PRECONDITION_REQUIRED",
            "an upload must carry `if-none-match: *`",
        ));
    }
    let max = svc.config.node_max_bytes;
    let declared: Option<u64> = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let Some((app, space, g)) = svc.meta.generation(generation).await? else {
        return Err(ApiError::not_found("UPLOAD_NOT_FOUND", "no such upload"));
    };
    if app != q.app_id || space != q.space_id || g.hash != q.hash {
        return Err(bad_signature());
    }
    if g.state != GenState::AwaitingUpload {
        return Err(already_stored());
    }
    let limit = match g.target {
        TargetKind::Inline => max.min(svc.config.small_upload_bytes),
        _ => max,
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let stream = Box::pin(body.into_data_stream().map_err(std::io::Error::other));
    svc.staging().store(&app, &space, &g, stream, limit).await
}
