//! Handlers of the data plane `/v1/cas/*`. Every route but the upload target checks a Space
//! capability before it touches storage (and before it reads the request body).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cas_format::wire::{
    BatchLeaseRequest, BatchLeaseResponse, ErrorBody, GC_DEFAULT_NODES, GC_MAX_NODES, GcRequest,
    GcResponse, LeaseRequest, LeaseResponse, MAX_BATCH_LEASE_BODY, NodeMetadata,
    NodeMetadataResponse, NodeState, ROOT_REFS_DEFAULT_LIMIT, ROOT_REFS_MAX_LIMIT, RootRefPage,
    RootRefUpdate, RootRefUpdateResponse, Usage, split_batch_body,
};
use cas_format::{AppId, SpaceId};
use serde::Deserialize;
use tokio_util::io::ReaderStream;
use utoipa::IntoParams;

use super::extract::{HashPath, JsonLimit, Q, bounded_bytes, parse_json};
use crate::auth::{Capability, permission};
use crate::error::{ApiError, ApiResult};
use crate::lease_batch;
use crate::read::ReadError;
use crate::upload::UploadQuery;
use crate::{Service, now_ms};

/// The partition every data-plane route addresses.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct PartitionQuery {
    /// The App (must equal the App of the capability's issuer).
    #[param(value_type = String)]
    pub app_id: AppId,
    /// The Space (one grant of the capability must select it).
    #[param(value_type = String)]
    pub space_id: SpaceId,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct LeaseQuery {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub space_id: SpaceId,
    /// Optional: the size in bytes of the portable node the client will upload. It only
    /// chooses the upload target (small uploads through the service cost one object write).
    pub upload_bytes: Option<u64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct RootRefsQuery {
    #[param(value_type = String)]
    pub app_id: AppId,
    #[param(value_type = String)]
    pub space_id: SpaceId,
    /// 1..=200, default 100.
    pub limit: Option<u32>,
    /// From the previous page's `nextCursor`: the page is read at the first page's revision
    /// (refused with 400 once the Space's balances in this domain changed more than 100,000
    /// times since it).
    pub cursor: Option<String>,
}

impl Service {
    async fn authorize(
        &self,
        headers: &HeaderMap,
        app: &AppId,
        space: &SpaceId,
        permission: &str,
    ) -> ApiResult<Capability> {
        let cap = crate::auth::verify(
            &self.registry,
            headers,
            app,
            space,
            permission,
            crate::auth::VerifyOptions {
                audience: &self.config.audience,
                leeway_s: self.config.auth_leeway_s,
                max_lifetime_s: self.config.max_capability_lifetime_s,
            },
        )
        .await?;
        self.limit_app(app)?;
        Ok(cap)
    }
}

/// Reads a node's own content (or one byte range of it).
#[utoipa::path(
    get, path = "/v1/cas/nodes/{hash}", tag = "nodes",
    params(("hash" = String, Path, description = "64 lowercase hex characters"), PartitionQuery,
           ("range" = Option<String>, Header, description = "One range: `bytes=a-b`, `bytes=a-` or `bytes=-n`")),
    responses(
        (status = 200, description = "The own content, served as the node's own content type; `X-CAS-Refs`: its ordered child hashes, comma-separated (empty for none)", content_type = "*/*"),
        (status = 206, description = "One range of it; `Content-Range` says which"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "Unknown or not ready", body = ErrorBody),
        (status = 416, description = "Unsatisfiable range; `Content-Range: bytes */size`", body = ErrorBody),
    ),
    security(("capability" = []))
)]
pub async fn get_node(
    State(svc): State<Service>,
    Q(q): Q<PartitionQuery>,
    HashPath(hash): HashPath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    svc.authorize(&headers, &q.app_id, &q.space_id, permission::NODES_READ)
        .await?;
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let content = match svc.read_content(&q.app_id, &q.space_id, &hash, range).await {
        Ok(c) => c,
        Err(ReadError::Api(e)) => return Err(e),
        Err(ReadError::Unsatisfiable(u)) => {
            let mut r = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "INVALID_REQUEST",
                format!("the node has {} bytes", u.size),
            )
            .into_response();
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{}", u.size))
                    .unwrap_or(HeaderValue::from_static("bytes */0")),
            );
            return Ok(r);
        }
    };
    let size = content.row.size as u64;
    let (status, len) = match content.range {
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, end - start),
        None => (StatusCode::OK, size),
    };
    // The ordered child hashes (empty for a leaf), and the node's own content type: what an
    // upstream client reads to rebuild the node. The type passed validation as a media type;
    // one that is not a valid header value is served as bytes.
    let refs = if content.row.ref_count > 0 {
        svc.meta.node_refs(&q.app_id, &q.space_id, &hash).await?
    } else {
        Vec::new()
    };
    let refs: Vec<String> = refs.iter().map(|h| h.to_hex()).collect();
    let content_type = HeaderValue::from_str(&content.row.content_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let mut builder = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header("x-cas-refs", refs.join(","))
        .header(header::CONTENT_LENGTH, len)
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::ETAG, format!("\"{hash}\""))
        .header(
            header::CACHE_CONTROL,
            "private, max-age=31536000, immutable",
        )
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header("x-unicas-content-type", content.row.content_type.as_str());
    if crate::web_guard::is_active_type(&content.row.content_type) {
        builder = builder.header(header::CONTENT_SECURITY_POLICY, "sandbox");
    }
    if let Some((start, end)) = content.range {
        builder = builder.header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", end - 1),
        );
    }
    builder
        .body(Body::from_stream(ReaderStream::with_capacity(
            content.body,
            256 << 10,
        )))
        .map_err(|e| ApiError::internal("building a response", e))
}

/// Reads a node's immutable metadata and mutable state.
#[utoipa::path(
    get, path = "/v1/cas/nodes/{hash}/metadata", tag = "nodes",
    params(("hash" = String, Path), PartitionQuery),
    responses(
        (status = 200, body = NodeMetadataResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "Unknown or not ready", body = ErrorBody),
    ),
    security(("capability" = []))
)]
pub async fn get_metadata(
    State(svc): State<Service>,
    Q(q): Q<PartitionQuery>,
    HashPath(hash): HashPath,
    headers: HeaderMap,
) -> ApiResult<Json<NodeMetadataResponse>> {
    svc.authorize(&headers, &q.app_id, &q.space_id, permission::NODES_READ)
        .await?;
    let row = svc.ready_node(&q.app_id, &q.space_id, &hash).await?;
    let refs = svc.meta.node_refs(&q.app_id, &q.space_id, &hash).await?;
    let root_ref_count = svc
        .meta
        .root_ref_count(&q.app_id, &q.space_id, &hash)
        .await?;
    Ok(Json(NodeMetadataResponse {
        metadata: NodeMetadata {
            hash,
            size: row.size as u64,
            content_type: row.content_type,
            refs,
        },
        state: NodeState {
            lease_started_at: row.lease_started_at,
            lease_expires_at: row.lease_expires_at,
            child_ref_count: row.child_ref_count,
            root_ref_count,
        },
    }))
}

/// Leases a node: extends a ready node's lease, or returns upload instructions, validation
/// results and the children it waits for.
#[utoipa::path(
    post, path = "/v1/cas/nodes/{hash}/lease", tag = "nodes",
    params(("hash" = String, Path), LeaseQuery),
    request_body = LeaseRequest,
    responses(
        (status = 200, description = "A union on `state`", body = LeaseResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 429, description = "CAS_UPLOAD_LIMIT or rate limited; see Retry-After", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("capability" = []))
)]
pub async fn lease(
    State(svc): State<Service>,
    Q(q): Q<LeaseQuery>,
    HashPath(hash): HashPath,
    Extension(JsonLimit(limit)): Extension<JsonLimit>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<LeaseResponse>> {
    svc.authorize(&headers, &q.app_id, &q.space_id, permission::NODES_LEASE)
        .await?;
    let req: LeaseRequest = parse_json(&bounded_bytes(body, limit).await?)?;
    crate::lease::check_lease_duration(req.lease_duration_ms)?;
    let r = svc
        .lease(
            &q.app_id,
            &q.space_id,
            &hash,
            req.lease_duration_ms,
            q.upload_bytes,
            req.delta_base,
        )
        .await?;
    Ok(Json(r))
}

/// Leases up to 1,000 nodes in one request. Each element is the single lease's body plus its
/// `hash` (and optionally `uploadBytes`); a node of at most 256 KiB may carry its portable
/// bytes inline, and is then validated and published by this request. `results` holds, in
/// order, each element's lease answer or its own error (`{"error", "message"}`): one bad
/// element fails alone. The body may be at most 16 MiB.
///
/// Inline nodes travel as `content` (standard base64) in a JSON body, or raw in a body of type
/// `application/vnd.unicas.leases`: the JSON's length as four bytes (big-endian), the JSON,
/// whose inline elements name `contentBytes` instead of `content`, then those elements' nodes
/// back to back in element order. A binary body whose lengths do not add up to exactly the
/// bytes after its JSON is refused whole (400).
#[utoipa::path(
    post, path = "/v1/cas/leases", tag = "nodes",
    params(PartitionQuery),
    request_body(content(
        (BatchLeaseRequest = "application/json"),
        (Vec<u8> = "application/vnd.unicas.leases"),
    )),
    responses(
        (status = 200, description = "One result per element, in order", body = BatchLeaseResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, description = "More than 1,000 elements or a body over 16 MiB", body = ErrorBody),
        (status = 429, description = "Rate limited; see Retry-After", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security(("capability" = []))
)]
pub async fn lease_batch(
    State(svc): State<Service>,
    Q(q): Q<PartitionQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<BatchLeaseResponse>> {
    svc.authorize(&headers, &q.app_id, &q.space_id, permission::NODES_LEASE)
        .await?;
    let body = bounded_bytes(body, MAX_BATCH_LEASE_BODY as usize).await?;
    let elements = if lease_batch::is_binary(&headers) {
        let (json, nodes) =
            split_batch_body(&body).map_err(|e| ApiError::invalid(e.to_string()))?;
        let req: BatchLeaseRequest = parse_json(json)?;
        lease_batch::check_batch(&req.leases)?;
        lease_batch::binary_elements(req.leases, body.slice_ref(nodes))?
    } else {
        let req: BatchLeaseRequest = parse_json(&body)?;
        lease_batch::check_batch(&req.leases)?;
        lease_batch::json_elements(req.leases)?
    };
    let results = svc.lease_batch(&q.app_id, &q.space_id, elements).await;
    Ok(Json(BatchLeaseResponse { results }))
}

/// Reads the Space's usage.
#[utoipa::path(
    get, path = "/v1/cas/usage", tag = "space",
    params(PartitionQuery),
    responses((status = 200, body = Usage), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("capability" = []))
)]
pub async fn usage(
    State(svc): State<Service>,
    Q(q): Q<PartitionQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<Usage>> {
    svc.authorize(&headers, &q.app_id, &q.space_id, permission::USAGE_READ)
        .await?;
    Ok(Json(
        svc.meta.usage(&q.app_id, &q.space_id, now_ms()).await?,
    ))
}

/// Runs one bounded GC pass over the Space.
#[utoipa::path(
    post, path = "/v1/cas/gc", tag = "space",
    params(PartitionQuery),
    request_body(content = Option<GcRequest>, description = "Optional; `maxNodes` 1..=10000, default 100"),
    responses((status = 200, body = GcResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("capability" = []))
)]
pub async fn gc(
    State(svc): State<Service>,
    Q(q): Q<PartitionQuery>,
    Extension(JsonLimit(limit)): Extension<JsonLimit>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<GcResponse>> {
    svc.authorize(&headers, &q.app_id, &q.space_id, permission::GC_EXECUTE)
        .await?;
    let req: GcRequest = parse_json(&bounded_bytes(body, limit).await?)?;
    let max = req.max_nodes.unwrap_or(GC_DEFAULT_NODES);
    if !(1..=GC_MAX_NODES).contains(&max) {
        return Err(ApiError::invalid(format!(
            "maxNodes must be 1..={GC_MAX_NODES}"
        )));
    }
    Ok(Json(
        svc.gc_pass_to_completion(&q.app_id, &q.space_id, max)
            .await?,
    ))
}

/// Applies a signed root-ref delta in the capability's `refDomain` (idempotent by `requestId`
/// within that domain); a node's count is the sum over domains and may not go below zero.
#[utoipa::path(
    post, path = "/v1/cas/root-refs", tag = "root-refs",
    params(PartitionQuery),
    request_body = RootRefUpdate,
    responses(
        (status = 200, body = RootRefUpdateResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "Also ROOT_REF_INVALID: a version 2 capability without a valid refDomain", body = ErrorBody),
        (status = 404, description = "NODE_NOT_FOUND: a hash names no node of the Space", body = ErrorBody),
        (status = 409, description = "IDEMPOTENCY_CONFLICT, NODE_NOT_READY, NEGATIVE_AGGREGATE, NODE_CONFLICT (a count would exceed 2^53 - 1)", body = ErrorBody),
        (status = 413, description = "PAYLOAD_TOO_LARGE: more than 1000 changes", body = ErrorBody),
    ),
    security(("capability" = []))
)]
pub async fn update_root_refs(
    State(svc): State<Service>,
    Q(q): Q<PartitionQuery>,
    Extension(JsonLimit(limit)): Extension<JsonLimit>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<RootRefUpdateResponse>> {
    let cap = svc
        .authorize(
            &headers,
            &q.app_id,
            &q.space_id,
            permission::ROOT_REFS_UPDATE,
        )
        .await?;
    let domain = crate::root_refs::ref_domain_of(&cap)?;
    let bytes = bounded_bytes(body, limit).await?;
    if bytes.is_empty() {
        return Err(ApiError::invalid(
            "a body {\"requestId\", \"changes\"} is required",
        ));
    }
    let update: RootRefUpdate = parse_json(&bytes)?;
    Ok(Json(
        svc.update_root_refs(&q.app_id, &q.space_id, &domain, &update, &cap.actor)
            .await?,
    ))
}

/// Lists the Space's root-ref balances in the capability's `refDomain`, paginated at one
/// revision.
#[utoipa::path(
    get, path = "/v1/cas/root-refs", tag = "root-refs",
    params(RootRefsQuery),
    responses((status = 200, body = RootRefPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "Also ROOT_REF_INVALID: a version 2 capability without a valid refDomain", body = ErrorBody)),
    security(("capability" = []))
)]
pub async fn list_root_refs(
    State(svc): State<Service>,
    Q(q): Q<RootRefsQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<RootRefPage>> {
    let cap = svc
        .authorize(&headers, &q.app_id, &q.space_id, permission::ROOT_REFS_READ)
        .await?;
    let domain = crate::root_refs::ref_domain_of(&cap)?;
    let limit = q.limit.unwrap_or(ROOT_REFS_DEFAULT_LIMIT);
    if !(1..=ROOT_REFS_MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be 1..={ROOT_REFS_MAX_LIMIT}"
        )));
    }
    Ok(Json(
        svc.root_ref_page(&q.app_id, &q.space_id, &domain, limit, q.cursor.as_deref())
            .await?,
    ))
}

/// The write-once upload target of the service's own signed URLs.
#[utoipa::path(
    put, path = "/v1/cas/uploads/{generation}", tag = "nodes",
    params(("generation" = String, Path), UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/vnd.unidocs.cas-node.v1", description = "The portable full node"),
    responses(
        (status = 200, description = "Stored; repeat the lease to validate and publish"),
        (status = 403, description = "Tampered or expired URL", body = ErrorBody),
        (status = 412, description = "This URL was already used", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 428, body = ErrorBody),
    )
)]
pub async fn upload(
    State(svc): State<Service>,
    Path(generation): Path<String>,
    Q(q): Q<UploadQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    crate::upload::store(&svc, &generation, &q, &headers, body).await?;
    Ok(StatusCode::OK)
}
