//! The lease state machine: one hash-addressed operation that extends a ready node's lease,
//! hands out an upload target for a missing one, validates uploaded bytes, waits for children,
//! and publishes: object first, then one transaction.
//!
//! Only the short begin and finalize steps hold the partition's mutation gate; reading and
//! validating the uploaded bytes and writing the object happen outside it, bounded by a
//! semaphore.

use cas_format::wire::{LeaseResponse, UploadTarget};
use cas_format::{AppId, Hash, SpaceId};

use crate::blob::{node_key, upload_key};
use crate::error::{ApiError, ApiResult};
use crate::materialize::{Content, MaterializeError};
use crate::meta::{Evidence, FinalizeOutcome, GenState, Generation, Partition, TargetKind};
use crate::{Service, failpoint, now_ms};

/// What the begin step decided.
enum Begin {
    Done(LeaseResponse),
    /// Bytes may be waiting at this generation's target: read and check them.
    Materialize(Generation),
}

/// What an attempt to publish an uploaded node came to.
enum Published {
    Answer(LeaseResponse),
    /// The generation was retired meanwhile: the lease starts over.
    Retry,
    /// Its delta base is no longer ready: the lease starts over, storing the node alone.
    BaseGone,
}

/// A lease request asks for a duration greater than 0 (which the service then clamps).
pub fn check_lease_duration(ms: u64) -> ApiResult<()> {
    if ms == 0 {
        return Err(ApiError::invalid("leaseDurationMs must be greater than 0"));
    }
    Ok(())
}

/// The lease window after a claim of `duration` at `now`: a lease that has lapsed starts a new
/// period; a running one is never shortened.
pub fn lease_window(started: i64, expires: i64, now: i64, duration: i64) -> (i64, i64) {
    if expires > now {
        let started = if started > 0 { started } else { now };
        // A running lease that still covers seven eighths of the claim is kept as it is: a
        // client renewing often then costs a write once per eighth of its lease, not per call.
        if expires >= now + duration - duration / 8 {
            (started, expires)
        } else {
            (started, now + duration)
        }
    } else {
        (now, now + duration)
    }
}

/// The refusal of an upload beyond the Space's limit of uploads in progress.
pub(crate) fn upload_limit() -> ApiError {
    ApiError::too_many(
        "CAS_UPLOAD_LIMIT",
        "too many uploads are in progress in this Space; finish or let some expire",
        5,
    )
}

impl Service {
    pub(crate) async fn presigned_target(
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
    /// `delta_base` names a node this one probably resembles: if this lease publishes it, it
    /// may be stored as a delta against that node (`crate::delta`).
    pub async fn lease(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        duration_ms: u64,
        upload_bytes: Option<u64>,
        delta_base: Option<Hash>,
    ) -> ApiResult<LeaseResponse> {
        let duration = self.config.clamp_lease(duration_ms) as i64;
        if let Some(n) = upload_bytes
            && n > self.config.node_max_bytes
        {
            return Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                format!("a node may be at most {} bytes", self.config.node_max_bytes),
            ));
        }
        let now = now_ms();
        // A ready node whose lease already covers the claim (see `lease_window`) needs no write
        // and no gate: GC cannot take a node whose lease has not expired. When this process has
        // seen such a lease (`lease_memo`), it needs no read either.
        let covered = |(started, expires): (i64, i64)| {
            (lease_window(started, expires, now, duration) == (started, expires)).then_some(
                LeaseResponse::Ready {
                    hash: *hash,
                    lease_started_at: started,
                    lease_expires_at: expires,
                },
            )
        };
        if let Some(r) = self.leases.get(app, space, hash, now).and_then(covered) {
            return Ok(self.outcome(r));
        }
        if let Some(row) = self.meta.node(app, space, hash).await?
            && row.is_ready()
        {
            let window = (row.lease_started_at, row.lease_expires_at);
            self.leases.remember(app, space, hash, window, now);
            if let Some(r) = covered(window) {
                return Ok(self.outcome(r));
            }
        }
        // Two rounds at most: a generation retired by GC while we validated it is replaced once,
        // and a delta whose base GC took meanwhile is stored alone.
        let mut delta_base = delta_base;
        for _ in 0..2 {
            let g = match self
                .lease_begin(app, space, hash, duration, upload_bytes)
                .await?
            {
                Begin::Done(r) => return Ok(self.outcome(r)),
                Begin::Materialize(g) => g,
            };
            match self
                .materialize_and_publish(app, space, &g, duration, delta_base)
                .await?
            {
                Published::Answer(r) => return Ok(self.outcome(r)),
                Published::Retry => continue,
                Published::BaseGone => delta_base = None,
            }
        }
        Err(ApiError::unavailable(
            "the upload was retired while it was published; retry",
        ))
    }

    pub(crate) fn outcome(&self, r: LeaseResponse) -> LeaseResponse {
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
            self.leases
                .remember(app, space, hash, (started, expires), now);
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
                let g = self
                    .new_generation(&mut p, hash, now, upload_bytes, 0)
                    .await?;
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

    /// Records that a generation's bytes are valid; its slot lasts another upload TTL.
    pub(crate) async fn record_validated(
        &self,
        p: &mut Partition,
        g: &Generation,
        evidence: &Evidence,
        canonical_len: u64,
    ) -> Result<(), sqlx::Error> {
        let expires = now_ms() + self.config.upload_ttl_ms as i64;
        p.record_evidence(g, evidence, canonical_len as i64, expires)
            .await
    }

    /// Creates an upload generation (refusing beyond the Space's limit), with `attempt`
    /// publication attempts taken (1 when its creator writes the object right away).
    pub(crate) async fn new_generation(
        &self,
        p: &mut Partition,
        hash: &Hash,
        now: i64,
        upload_bytes: Option<u64>,
        attempt: i64,
    ) -> ApiResult<Generation> {
        if self.upload_slots(p, now).await? == Some(0) {
            return Err(upload_limit());
        }
        let g = self.generation_for(hash, now, upload_bytes, attempt);
        p.create_generation(&g).await?;
        Ok(g)
    }

    /// How many more uploads the Space may have in progress; `None` without a limit.
    pub(crate) async fn upload_slots(
        &self,
        p: &mut Partition,
        now: i64,
    ) -> Result<Option<u64>, sqlx::Error> {
        let limit = self.config.max_active_uploads;
        if limit == 0 {
            return Ok(None);
        }
        let active = p.count_active_generations(now).await?.max(0) as u64;
        Ok(Some(limit.saturating_sub(active)))
    }

    /// A new upload generation of a node, awaiting its upload; not recorded yet.
    pub(crate) fn generation_for(
        &self,
        hash: &Hash,
        now: i64,
        upload_bytes: Option<u64>,
        attempt: i64,
    ) -> Generation {
        let max = self.config.node_max_bytes;
        let target = TargetKind::choose(
            self.blobs.presigns(),
            upload_bytes,
            self.config.small_upload_bytes,
            max,
        );
        Generation {
            gen_id: ulid::Ulid::generate().to_string(),
            hash: *hash,
            state: GenState::AwaitingUpload,
            target,
            created_at: now,
            url_expires_at: now + self.config.upload_url_ttl_ms as i64,
            expires_at: now + self.config.upload_ttl_ms as i64,
            reserved_bytes: upload_bytes.unwrap_or(max).min(max) as i64,
            evidence: None,
            attempt,
        }
    }

    /// Reads and checks the uploaded bytes of `g` and publishes the node if every child is
    /// ready.
    async fn materialize_and_publish(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        duration: i64,
        delta_base: Option<Hash>,
    ) -> ApiResult<Published> {
        let hash = g.hash;
        let spooled = {
            let _permit = self
                .validations
                .acquire()
                .await
                .map_err(|_| ApiError::unavailable("shutting down"))?;
            self.materialize(app, space, g, delta_base.is_none()).await
        };
        let spooled = match spooled {
            Ok(s) => s,
            Err(MaterializeError::NotUploaded) if g.state == GenState::Validated => {
                // Bytes validated in memory (inline) and neither stored nor staged: a write
                // that failed, or a crash, in between. Nothing can be uploaded to this
                // generation any more, so a new one takes the upload (unless it was published
                // meanwhile: then the next round finds the node ready).
                let mut p = self.meta.gate(app, space).await?;
                let current = p.generation(&g.gen_id).await?;
                let Some(current) = current.filter(|c| c.state == GenState::Validated) else {
                    return Ok(Published::Retry);
                };
                p.retire_generation(&current).await?;
                let declared = Some(current.reserved_bytes.max(0) as u64);
                let fresh = self
                    .new_generation(&mut p, &hash, now_ms(), declared, 0)
                    .await?;
                p.commit().await?;
                let upload = self.presigned_target(app, space, &fresh).await?;
                return Ok(Published::Answer(LeaseResponse::AwaitingUpload {
                    hash,
                    upload,
                }));
            }
            Err(MaterializeError::NotUploaded) => {
                let g = self.fresh_url(app, space, g).await?;
                let upload = self.presigned_target(app, space, &g).await?;
                return Ok(Published::Answer(LeaseResponse::AwaitingUpload {
                    hash,
                    upload,
                }));
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
                    None => self.new_generation(&mut p, &hash, now, None, 0).await?,
                };
                p.commit().await?;
                let fresh = self.fresh_url(app, space, &fresh).await?;
                let upload = self.presigned_target(app, space, &fresh).await?;
                return Ok(Published::Answer(
                    LeaseResponse::AwaitingReplacementUpload {
                        hash,
                        upload,
                        rejection,
                    },
                ));
            }
            Err(MaterializeError::Failed(e)) => return Err(e),
        };

        // Record the evidence, check the children and take a publication attempt under the
        // gate: the attempt's object is this request's alone.
        let attempt = {
            let mut p = self.meta.gate(app, space).await?;
            let Some(current) = p.generation(&g.gen_id).await? else {
                return Ok(Published::Retry);
            };
            if !current.state.is_active() {
                if current.state == GenState::Published {
                    drop(p);
                    return Ok(Published::Answer(
                        self.lease_begin_ready(app, space, &hash, duration).await?,
                    ));
                }
                return Ok(Published::Retry);
            }
            if current.state == GenState::AwaitingUpload {
                self.record_validated(&mut p, &current, &spooled.evidence, spooled.canonical_len)
                    .await?;
            }
            let missing = p.missing_children(&spooled.evidence.refs).await?;
            if !missing.is_empty() {
                p.commit().await?;
                return Ok(Published::Answer(
                    LeaseResponse::ValidatedAwaitingChildren {
                        hash,
                        child_hashes: missing,
                    },
                ));
            }
            let attempt = p.next_attempt(&current).await?;
            p.commit().await?;
            attempt
        };
        let g = &attempt;

        // Object first.
        let size = spooled.evidence.content_size as u64;
        let stored = match spooled.content {
            Content::Spooled(spool) => {
                self.write_object(app, space, g, spool, size, delta_base)
                    .await?
            }
            Content::Held(held) => {
                self.adopt_object(app, space, g, held, spooled.canonical_len)
                    .await?
            }
        };
        let wrote_object = stored.held.is_none();
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
            .finalize(g, &spooled.evidence, stored, now, duration)
            .await?;
        p.commit().await?;
        match outcome {
            FinalizeOutcome::Published { started, expires } => {
                tracing::debug!(%hash, generation = %g.gen_id, "node published");
                self.staging().discard_published(app, space, g).await;
                Ok(Published::Answer(LeaseResponse::Ready {
                    hash,
                    lease_started_at: started,
                    lease_expires_at: expires,
                }))
            }
            FinalizeOutcome::AlreadyReady { started, expires } => {
                // Another attempt published the node first: this attempt's object is unused.
                self.discard_attempt(app, space, g, wrote_object).await;
                Ok(Published::Answer(LeaseResponse::Ready {
                    hash,
                    lease_started_at: started,
                    lease_expires_at: expires,
                }))
            }
            FinalizeOutcome::MissingChildren(missing) => {
                self.discard_attempt(app, space, g, wrote_object).await;
                Ok(Published::Answer(
                    LeaseResponse::ValidatedAwaitingChildren {
                        hash,
                        child_hashes: missing,
                    },
                ))
            }
            FinalizeOutcome::DeltaBaseGone => {
                // The next round takes another attempt and stores the node alone.
                self.discard_attempt(app, space, g, wrote_object).await;
                Ok(Published::BaseGone)
            }
            FinalizeOutcome::GenerationGone => {
                // GC retired the generation while we wrote its object: the lease starts over
                // with a fresh generation.
                self.discard_attempt(app, space, g, wrote_object).await;
                Ok(Published::Retry)
            }
        }
    }

    /// Deletes the object a publication attempt wrote and no row points at (if it wrote one;
    /// a failure leaves it to GC, which the publication or the retirement told of every
    /// attempt).
    pub(crate) async fn discard_attempt(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &Generation,
        wrote_object: bool,
    ) {
        if wrote_object {
            self.delete_logged(&node_key(app, space, &g.hash, &g.object_name()))
                .await;
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
}

#[cfg(test)]
mod tests {
    use super::lease_window;

    #[test]
    fn a_lapsed_lease_starts_a_new_period() {
        assert_eq!(lease_window(100, 500, 1000, 600), (1000, 1600));
        assert_eq!(lease_window(0, 0, 1000, 600), (1000, 1600));
    }

    #[test]
    fn a_running_lease_is_never_shortened() {
        // Asked for less than it still has: kept.
        assert_eq!(lease_window(100, 5000, 1000, 600), (100, 5000));
        // Covers seven eighths of the claim: kept, no write.
        assert_eq!(lease_window(100, 1000 + 600 - 75, 1000, 600), (100, 1525));
        // Covers less: extended to the whole claim from now, the start kept.
        assert_eq!(lease_window(100, 1000 + 600 - 76, 1000, 600), (100, 1600));
        // A running lease without a start gets one.
        assert_eq!(lease_window(0, 5000, 1000, 600), (1000, 5000));
    }
}
