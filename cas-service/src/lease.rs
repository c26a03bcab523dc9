//! The lease state machine: one hash-addressed operation that extends a ready node's lease,
//! hands out an upload target for a missing one, validates uploaded bytes, waits for children,
//! and publishes: object first, then one transaction.
//!
//! Only the short begin and finalize steps hold the partition's mutation gate; reading and
//! validating the uploaded bytes and writing the object happen outside it, bounded by a
//! semaphore.

use cas_format::node::LimitField;
use cas_format::svalue::{self, SValueLimits};
use cas_format::wire::{LeaseResponse, Rejection, UploadTarget};
use cas_format::{
    AppId, Hash, NodeDescriptor, NodeError, NodeLimits, NodeStreamValidator, SpaceId,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::blob::{SpoolFile, node_key, upload_key};
use crate::error::{ApiError, ApiResult};
use crate::meta::{
    Evidence, FinalizeOutcome, GenState, Generation, Partition, TargetKind, lease_window,
};
use crate::{Service, failpoint, now_ms};

const READ_CHUNK: usize = 256 << 10;

/// What the begin step decided.
enum Begin {
    Done(LeaseResponse),
    /// Bytes may be waiting at this generation's target: read and check them.
    Materialize(Generation),
}

/// Uploaded bytes proven valid, with the own content spooled to a local file.
struct Spooled {
    evidence: Evidence,
    canonical_len: u64,
    spool: SpoolFile,
}

enum MaterializeError {
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

fn rejection(code: &str, message: impl Into<String>) -> MaterializeError {
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

    async fn presigned_target(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
    ) -> ApiResult<UploadTarget> {
        if g.target != TargetKind::Presigned {
            return Ok(self.signer.target(app, space, g));
        }
        let ttl = (g.url_expires_at - now_ms()).max(1) as u64;
        let declared = (g.reserved_bytes < self.config.node_max_bytes as i64)
            .then_some(g.reserved_bytes as u64);
        let presigned = self
            .blobs
            .presign_put_once(&upload_key(app, space, &g.gen_id), ttl, declared)
            .await
            .map_err(|e| ApiError::storage_unavailable("presigning an upload", e))?
            .ok_or_else(|| ApiError::internal("presigning an upload", "store cannot presign"))?;
        Ok(UploadTarget {
            method: "PUT".into(),
            url: presigned.url,
            expires_at: g.url_expires_at,
            headers: presigned.headers.into_iter().collect(),
        })
    }

    /// `g`, or `g` with a new URL expiry when its URL has expired or is about to (within a
    /// quarter of the URL lifetime, at most a minute): a lease never hands out a URL that
    /// cannot be used, and the upload slot stays the same, so an upload already under way
    /// lands where the next lease looks.
    async fn fresh_url(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
    ) -> ApiResult<Generation> {
        let ttl = self.config.upload_url_ttl_ms as i64;
        let margin = (ttl / 4).min(60_000);
        let now = now_ms();
        if g.state != GenState::AwaitingUpload || g.url_expires_at - now > margin {
            return Ok(g.clone());
        }
        let url_expires_at = now + ttl;
        let mut p = self.meta.gate(app, space).await?;
        let refreshed = p
            .refresh_upload_url(&g.gen_id, url_expires_at, url_expires_at)
            .await?;
        let current = p.generation(&g.gen_id).await?;
        p.commit().await?;
        match current {
            Some(c) if refreshed => {
                tracing::debug!(hash = %g.hash, generation = %g.gen_id, "upload URL renewed");
                Ok(c)
            }
            _ => Ok(g.clone()),
        }
    }

    /// Leases `hash` for about `duration_ms`. `upload_bytes` is the client's optional
    /// statement of the portable node's size; it only selects the kind of upload target.
    pub async fn lease(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        duration_ms: u64,
        upload_bytes: Option<u64>,
    ) -> ApiResult<LeaseResponse> {
        let duration = self.config.clamp_lease(duration_ms) as i64;
        if let Some(n) = upload_bytes
            && n > self.config.node_max_bytes
        {
            return Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "NODE_TOO_LARGE",
                format!("a node may be at most {} bytes", self.config.node_max_bytes),
            ));
        }
        let now = now_ms();
        // A ready node whose lease already covers the claim (see `lease_window`) needs no write
        // and no gate: GC cannot take a node whose lease has not expired.
        if let Some(row) = self.meta.node(app, space, hash).await?
            && row.is_ready()
            && lease_window(row.lease_started_at, row.lease_expires_at, now, duration)
                == (row.lease_started_at, row.lease_expires_at)
        {
            return Ok(self.outcome(LeaseResponse::Ready {
                hash: *hash,
                lease_started_at: row.lease_started_at,
                lease_expires_at: row.lease_expires_at,
            }));
        }
        // Two rounds at most: a generation retired by GC while we validated it is replaced once.
        for _ in 0..2 {
            let g = match self
                .lease_begin(app, space, hash, duration, upload_bytes)
                .await?
            {
                Begin::Done(r) => return Ok(self.outcome(r)),
                Begin::Materialize(g) => g,
            };
            match self
                .materialize_and_publish(app, space, &g, duration)
                .await?
            {
                Some(r) => return Ok(self.outcome(r)),
                None => continue,
            }
        }
        Err(ApiError::unavailable(
            "the upload was retired while it was published; retry",
        ))
    }

    fn outcome(&self, r: LeaseResponse) -> LeaseResponse {
        self.metrics.lease_outcome(r.state());
        r
    }

    async fn lease_begin(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        duration: i64,
        upload_bytes: Option<u64>,
    ) -> ApiResult<Begin> {
        let now = now_ms();
        let mut p = self.meta.gate(app, space).await?;
        if let Some(row) = p.node(hash).await?
            && row.is_ready()
        {
            let (started, expires) =
                lease_window(row.lease_started_at, row.lease_expires_at, now, duration);
            if (started, expires) != (row.lease_started_at, row.lease_expires_at) {
                p.set_lease(hash, started, expires).await?;
            }
            p.commit().await?;
            return Ok(Begin::Done(LeaseResponse::Ready {
                hash: *hash,
                lease_started_at: started,
                lease_expires_at: expires,
            }));
        }
        let mut active = p.active_generation(hash).await?;
        if let Some(g) = &active
            && g.expires_at <= now
        {
            p.retire_generation(g).await?;
            active = None;
        }
        match active {
            None => {
                let g = self.new_generation(&mut p, hash, now, upload_bytes).await?;
                p.commit().await?;
                let upload = self.presigned_target(app, space, &g).await?;
                Ok(Begin::Done(LeaseResponse::AwaitingUpload {
                    hash: *hash,
                    upload,
                }))
            }
            Some(g) if g.state == GenState::Validated => {
                let refs = g
                    .evidence
                    .as_ref()
                    .map(|e| e.refs.clone())
                    .unwrap_or_default();
                let missing = p.missing_children(&refs).await?;
                if missing.is_empty() {
                    p.commit().await?;
                    return Ok(Begin::Materialize(g));
                }
                p.touch_generation(&g.gen_id, now + self.config.upload_ttl_ms as i64)
                    .await?;
                p.commit().await?;
                Ok(Begin::Done(LeaseResponse::ValidatedAwaitingChildren {
                    hash: *hash,
                    child_hashes: missing,
                }))
            }
            Some(g) => {
                p.commit().await?;
                Ok(Begin::Materialize(g))
            }
        }
    }

    /// Creates an upload generation (refusing beyond the Space's limit).
    async fn new_generation(
        &self,
        p: &mut Partition,
        hash: &Hash,
        now: i64,
        upload_bytes: Option<u64>,
    ) -> ApiResult<Generation> {
        let limit = self.config.max_active_uploads;
        if limit > 0 && p.count_active_generations(now).await? >= limit as i64 {
            return Err(ApiError::too_many(
                "CAS_UPLOAD_LIMIT",
                "too many uploads are in progress in this Space; finish or let some expire",
                5,
            ));
        }
        let max = self.config.node_max_bytes;
        let target = match (self.blobs.presigns(), upload_bytes) {
            (false, _) => TargetKind::Service,
            (true, Some(n)) if n <= self.config.small_upload_bytes.min(max) => TargetKind::Inline,
            (true, _) => TargetKind::Presigned,
        };
        let g = Generation {
            gen_id: ulid::Ulid::generate().to_string(),
            hash: *hash,
            state: GenState::AwaitingUpload,
            target,
            created_at: now,
            url_expires_at: now + self.config.upload_url_ttl_ms as i64,
            expires_at: now + self.config.upload_ttl_ms as i64,
            reserved_bytes: upload_bytes.unwrap_or(max).min(max) as i64,
            evidence: None,
        };
        p.create_generation(&g).await?;
        Ok(g)
    }

    /// Reads and checks the uploaded bytes of `g` and publishes the node if every child is
    /// ready. `None` means the generation was retired meanwhile and the lease should start over.
    async fn materialize_and_publish(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        duration: i64,
    ) -> ApiResult<Option<LeaseResponse>> {
        let hash = g.hash;
        let spooled = {
            let _permit = self
                .validations
                .acquire()
                .await
                .map_err(|_| ApiError::unavailable("shutting down"))?;
            self.materialize(app, space, g).await
        };
        let spooled = match spooled {
            Ok(s) => s,
            Err(MaterializeError::NotUploaded) => {
                let g = self.fresh_url(app, space, g).await?;
                let upload = self.presigned_target(app, space, &g).await?;
                return Ok(Some(LeaseResponse::AwaitingUpload { hash, upload }));
            }
            Err(MaterializeError::Rejected(rejection)) => {
                self.metrics.upload_rejected(&rejection.code);
                tracing::info!(%hash, code = %rejection.code, "upload rejected");
                let now = now_ms();
                let mut p = self.meta.gate(app, space).await?;
                match p.generation(&g.gen_id).await? {
                    Some(current) if current.state.is_active() => {
                        p.retire_generation(&current).await?
                    }
                    _ => {}
                }
                let fresh = match p.active_generation(&hash).await? {
                    Some(other) => other,
                    None => self.new_generation(&mut p, &hash, now, None).await?,
                };
                p.commit().await?;
                let fresh = self.fresh_url(app, space, &fresh).await?;
                let upload = self.presigned_target(app, space, &fresh).await?;
                return Ok(Some(LeaseResponse::AwaitingReplacementUpload {
                    hash,
                    upload,
                    rejection,
                }));
            }
            Err(MaterializeError::Failed(e)) => return Err(e),
        };

        // Record the evidence and check the children under the gate.
        {
            let now = now_ms();
            let mut p = self.meta.gate(app, space).await?;
            let Some(current) = p.generation(&g.gen_id).await? else {
                return Ok(None);
            };
            if !current.state.is_active() {
                if current.state == GenState::Published {
                    drop(p);
                    return Ok(Some(
                        self.lease_begin_ready(app, space, &hash, duration).await?,
                    ));
                }
                return Ok(None);
            }
            if current.state == GenState::AwaitingUpload {
                p.record_evidence(
                    &current,
                    &spooled.evidence,
                    spooled.canonical_len as i64,
                    now + self.config.upload_ttl_ms as i64,
                )
                .await?;
            }
            let missing = p.missing_children(&spooled.evidence.refs).await?;
            p.commit().await?;
            if !missing.is_empty() {
                return Ok(Some(LeaseResponse::ValidatedAwaitingChildren {
                    hash,
                    child_hashes: missing,
                }));
            }
        }

        // Object first.
        let key = node_key(app, space, &hash, &g.gen_id);
        let (encoding, stored) = self
            .write_object(&key, spooled.spool, spooled.evidence.content_size as u64)
            .await?;
        if failpoint::hit("publish.after_object").await {
            return Err(ApiError::storage_unavailable(
                "publishing",
                "failpoint publish.after_object",
            ));
        }

        // Row second, in one transaction.
        let now = now_ms();
        let mut p = self.meta.gate(app, space).await?;
        let outcome = p
            .finalize(g, &spooled.evidence, encoding, stored as i64, now, duration)
            .await?;
        p.commit().await?;
        match outcome {
            FinalizeOutcome::Published { started, expires } => {
                tracing::debug!(%hash, generation = %g.gen_id, "node published");
                self.discard_upload(app, space, g).await;
                Ok(Some(LeaseResponse::Ready {
                    hash,
                    lease_started_at: started,
                    lease_expires_at: expires,
                }))
            }
            FinalizeOutcome::AlreadyReady { started, expires } => Ok(Some(LeaseResponse::Ready {
                hash,
                lease_started_at: started,
                lease_expires_at: expires,
            })),
            FinalizeOutcome::MissingChildren(missing) => {
                Ok(Some(LeaseResponse::ValidatedAwaitingChildren {
                    hash,
                    child_hashes: missing,
                }))
            }
            FinalizeOutcome::GenerationGone => {
                // GC retired the generation while we wrote its object: that object is ours to
                // remove, and the lease starts over with a fresh generation.
                if let Err(e) = self.blobs.delete(&key).await {
                    tracing::warn!(error = %e, "could not delete the object of a retired upload");
                }
                Ok(None)
            }
        }
    }

    /// The ready answer for a node another request just published.
    async fn lease_begin_ready(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        duration: i64,
    ) -> ApiResult<LeaseResponse> {
        match self.lease_begin(app, space, hash, duration, None).await? {
            Begin::Done(r) => Ok(r),
            Begin::Materialize(_) => {
                Err(ApiError::unavailable("the node is being published; retry"))
            }
        }
    }

    /// Deletes the temporary bytes of a published generation where the service itself guards
    /// write-once (its own URLs); presigned targets keep theirs until the URL expires.
    async fn discard_upload(&self, app: &AppId, space: &SpaceId, g: &Generation) {
        let result = match g.target {
            TargetKind::Service => self
                .blobs
                .delete(&upload_key(app, space, &g.gen_id))
                .await
                .map_err(|e| e.to_string()),
            TargetKind::Inline => self
                .meta
                .delete_upload_body(&g.gen_id)
                .await
                .map_err(|e| e.to_string()),
            TargetKind::Presigned => Ok(()),
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not delete upload bytes; GC will");
        }
    }

    /// Streams the uploaded bytes through the validator, spooling the own content.
    async fn materialize(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
    ) -> Result<Spooled, MaterializeError> {
        let max = self.config.node_max_bytes;
        let (mut reader, len): (crate::blob::ObjectReader, u64) = match g.target {
            TargetKind::Inline => match self
                .meta
                .upload_body(&g.gen_id)
                .await
                .map_err(ApiError::from)?
            {
                Some(body) => {
                    let len = body.len() as u64;
                    (Box::pin(std::io::Cursor::new(body)), len)
                }
                None => return Err(MaterializeError::NotUploaded),
            },
            TargetKind::Service | TargetKind::Presigned => {
                match self
                    .blobs
                    .get(&upload_key(app, space, &g.gen_id), None)
                    .await
                    .map_err(|e| ApiError::storage_unavailable("reading an upload", e))?
                {
                    Some(found) => found,
                    None => return Err(MaterializeError::NotUploaded),
                }
            }
        };
        if len > max {
            return Err(rejection(
                "NODE_TOO_LARGE",
                format!("the upload holds {len} bytes; the limit is {max}"),
            ));
        }
        let spool = self
            .blobs
            .spool()
            .file("content-")
            .await
            .map_err(|e| ApiError::blob("spooling an upload", e))?;
        let mut file = tokio::fs::File::from_std(
            spool
                .handle()
                .map_err(|e| ApiError::internal("opening a spool file", e))?,
        );
        let mut validator = NodeStreamValidator::new(self.node_limits());
        let svalue_limits = SValueLimits {
            max_bytes: max,
            max_refs: self.config.node_max_refs as u64,
            ..SValueLimits::default()
        };
        let mut svalue_content: Option<Vec<u8>> = None;
        let mut buf = vec![0u8; READ_CHUNK];
        let mut total = 0u64;
        loop {
            let n = reader
                .read(&mut buf)
                .await
                .map_err(|e| ApiError::storage_unavailable("reading an upload", e))?;
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > max {
                return Err(rejection(
                    "NODE_TOO_LARGE",
                    format!("the upload is larger than {max} bytes"),
                ));
            }
            let content = validator
                .update(&buf[..n])
                .map_err(|e| node_rejection(&e))?;
            if validator
                .descriptor()
                .is_some_and(|d| d.content_type.is_svalue())
            {
                svalue_content
                    .get_or_insert_with(Vec::new)
                    .extend_from_slice(content);
            }
            file.write_all(content)
                .await
                .map_err(|e| ApiError::internal("writing a spool file", e))?;
        }
        file.flush()
            .await
            .map_err(|e| ApiError::internal("writing a spool file", e))?;
        drop(file);
        let (descriptor, _) = validator
            .finish(Some(&g.hash))
            .map_err(|e| node_rejection(&e))?;
        if descriptor.content_type.is_svalue() {
            let content = svalue_content.unwrap_or_default();
            let refs = svalue::extract_refs(&content, &svalue_limits).map_err(|e| {
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
        Ok(Spooled {
            evidence: Evidence {
                content_type: content_type.as_str().to_string(),
                content_size: content_size as i64,
                refs,
            },
            canonical_len: total,
            spool,
        })
    }

    /// Writes the own content at `key`, compressed when configured and worthwhile. Returns the
    /// encoding and the stored size.
    async fn write_object(
        &self,
        key: &str,
        spool: SpoolFile,
        size: u64,
    ) -> ApiResult<(&'static str, u64)> {
        let min = self.config.compress_min_bytes;
        if min > 0 && size >= min {
            let compressed = self.compress(&spool).await?;
            let len = compressed
                .file()
                .metadata()
                .map_err(|e| ApiError::internal("reading a spool file", e))?
                .len();
            // Only when it saves at least an eighth: decompressing costs every reader.
            if len < size - size / 8 {
                self.put(key, compressed, len).await?;
                return Ok(("zstd", len));
            }
        }
        self.put(key, spool, size).await?;
        Ok(("identity", size))
    }

    async fn put(&self, key: &str, file: SpoolFile, len: u64) -> ApiResult<()> {
        if failpoint::hit("blob.put").await {
            return Err(ApiError::storage_unavailable(
                "writing an object",
                "failpoint blob.put",
            ));
        }
        self.blobs
            .put_file(key, file, len)
            .await
            .map_err(|e| ApiError::blob("writing an object", e))
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
