//! Root-ref updates and balance pages: validation of the change set, the idempotency payload
//! hash, the revision-stable cursor, and the queue that applies the updates of one partition
//! together.
//!
//! Updates of one (App, Space) wait in that partition's queue; whoever gets its turn holds
//! the partition's gate, then takes what is queued by then (up to [`MAX_QUEUED_UPDATES`]
//! updates naming at most [`MAX_BATCH_HASHES`] hashes: those that came while it waited for
//! the gate too) and applies it in that one operation, in arrival order, each update with its
//! own revision and its own answer. The turn passes on
//! before the commit; when updates are queued behind a batch, its commit is left open for the
//! batch that takes them (`commit_followed`), so the two share one durable commit.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cas_format::wire::{RootRefItem, RootRefPage, RootRefUpdate, RootRefUpdateResponse};
use cas_format::{AppId, Hash, RefDomain, RequestId, SpaceId};
use tokio::sync::{OwnedMutexGuard, oneshot};

use crate::capability::DomainClaim;
use crate::error::{ApiError, ApiResult};
use crate::meta::{BalanceCursor, MAX_BATCH_HASHES, RefFilter, RootRefChange, RootRefRejection};
use crate::{Service, now_ms};

/// How many queued updates one turn applies at most.
pub const MAX_QUEUED_UPDATES: usize = 256;

type Answer = ApiResult<RootRefUpdateResponse>;

/// One update waiting in its partition's queue.
struct Pending {
    seq: u64,
    domain: RefDomain,
    request_id: RequestId,
    changes: BTreeMap<Hash, i64>,
    payload: Hash,
    actor: String,
    answer: oneshot::Sender<Answer>,
}

/// The queue of one partition.
#[derive(Default)]
struct Queue {
    pending: Mutex<VecDeque<Pending>>,
    /// Held while a batch of this queue is taken and applied (not while it commits).
    turn: Arc<tokio::sync::Mutex<()>>,
    /// A batch left its commit open for the next turn's batch, which has not yet come.
    followed: AtomicBool,
}

impl Queue {
    fn pending(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch: the oldest updates, within the limits (at least one).
    fn take(&self) -> Vec<Pending> {
        let mut pending = self.pending();
        let mut hashes = 0;
        let mut batch = Vec::new();
        while let Some(next) = pending.front() {
            let more = next.changes.len();
            if !batch.is_empty()
                && (batch.len() >= MAX_QUEUED_UPDATES || hashes + more > MAX_BATCH_HASHES)
            {
                break;
            }
            hashes += more;
            batch.extend(pending.pop_front());
        }
        batch
    }
}

/// Withdraws its update from the queue when dropped, unless a turn has taken it.
struct Queued {
    queue: Arc<Queue>,
    seq: u64,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.pending().retain(|p| p.seq != self.seq);
    }
}

/// The root-ref queues of every partition with updates under way.
#[derive(Default)]
pub struct RootRefQueues {
    queues: Mutex<HashMap<(AppId, SpaceId), Arc<Queue>>>,
    next_seq: AtomicU64,
}

impl RootRefQueues {
    fn of(&self, app: &AppId, space: &SpaceId) -> Arc<Queue> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if queues.len() > 1024 {
            queues.retain(|_, q| Arc::strong_count(q) > 1);
        }
        queues
            .entry((app.clone(), space.clone()))
            .or_default()
            .clone()
    }
}

pub use cas_format::wire::{MAX_CHANGES, MAX_DELTA};

/// Checks a change set and returns the hash that identifies its payload for idempotency.
pub fn check_changes(changes: &BTreeMap<Hash, i64>) -> ApiResult<Hash> {
    if changes.is_empty() {
        return Err(ApiError::invalid("changes must not be empty"));
    }
    if changes.len() > MAX_CHANGES {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("an update may change at most {MAX_CHANGES} hashes; split it"),
        ));
    }
    for (hash, delta) in changes {
        if *delta == 0 {
            return Err(ApiError::invalid(format!("the delta of {hash} is zero")));
        }
        if delta.unsigned_abs() > MAX_DELTA as u64 {
            return Err(ApiError::invalid(format!(
                "the delta of {hash} exceeds ±{MAX_DELTA}"
            )));
        }
    }
    // Sorted keys and integers: one payload, one encoding.
    let canonical =
        serde_json::to_vec(changes).map_err(|e| ApiError::internal("encoding changes", e))?;
    Ok(Hash::digest(&canonical))
}

/// The domain a capability's root-ref changes and reads belong to: the `refDomain` it names;
/// without one, the default domain for a capability of this service's own shape, and a
/// refusal for one of the public contract's shape (which requires the claim). A claim that is
/// not a domain is refused for both.
pub fn ref_domain_of(cap: &crate::auth::Capability) -> ApiResult<RefDomain> {
    match &cap.ref_domain {
        DomainClaim::Valid(d) => Ok(d.clone()),
        DomainClaim::Absent if !cap.upstream => Ok(RefDomain::default()),
        DomainClaim::Absent => Err(ApiError::forbidden(
            "ROOT_REF_INVALID",
            "a version 2 capability needs a refDomain claim for root refs",
        )),
        DomainClaim::Invalid(d) => Err(ApiError::forbidden(
            "ROOT_REF_INVALID",
            format!(
                "the capability's refDomain {d:?} is not a domain ([a-z][a-z0-9]* parts joined by ':', at most 64 characters)"
            ),
        )),
    }
}

/// The answer to a refused update.
pub fn rejection(r: RootRefRejection) -> ApiError {
    match r {
        RootRefRejection::IdempotencyConflict => ApiError::conflict(
            "IDEMPOTENCY_CONFLICT",
            "this requestId was already used with other changes",
        ),
        RootRefRejection::UnknownNode(h) => {
            ApiError::not_found("NODE_NOT_FOUND", format!("no node {h} in this Space"))
        }
        RootRefRejection::NotReady(h) => ApiError::conflict(
            "NODE_NOT_READY",
            format!("node {h} is not ready; lease and upload it again"),
        ),
        RootRefRejection::Negative { hash, result } => ApiError::conflict(
            "NEGATIVE_AGGREGATE",
            format!("the root ref count of {hash} would become {result}"),
        ),
        RootRefRejection::Overflow(h) => ApiError::conflict(
            "NODE_CONFLICT",
            format!("the root ref count of {h} would exceed 2^53 - 1"),
        ),
    }
}

/// A cursor: the revision the first page was read at, and the last balance returned. A page of
/// one (Space, domain) names only the hash; an admin page across them names all three.
pub fn encode_cursor(revision: i64, last: &BalanceCursor, with_key: bool) -> String {
    let BalanceCursor {
        space,
        domain,
        hash,
    } = last;
    if with_key {
        format!("{revision}.{space}.{domain}.{hash}")
    } else {
        format!("{revision}.{hash}")
    }
}

/// Parses a cursor of [`encode_cursor`]: `page` is the (Space, domain) of a page of one, `None`
/// for an admin page across them (whose cursor names both).
pub fn decode_cursor(
    s: &str,
    page: Option<(&SpaceId, &RefDomain)>,
) -> ApiResult<(i64, BalanceCursor)> {
    let bad = || ApiError::invalid("invalid cursor");
    let (revision, rest) = s.split_once('.').ok_or_else(bad)?;
    let revision: i64 = revision.parse().map_err(|_| bad())?;
    let (space, domain, hash) = match page {
        Some((space, domain)) => (space.clone(), domain.clone(), rest),
        None => {
            // A plain Space id may hold dots; a domain and a hash hold none.
            let (rest, hash) = rest.rsplit_once('.').ok_or_else(bad)?;
            let (space, domain) = rest.rsplit_once('.').ok_or_else(bad)?;
            (
                space.parse().map_err(|_| bad())?,
                domain.parse().map_err(|_| bad())?,
                hash,
            )
        }
    };
    let hash: Hash = hash.parse().map_err(|_| bad())?;
    if revision < 0 {
        return Err(bad());
    }
    Ok((
        revision,
        BalanceCursor {
            space,
            domain,
            hash,
        },
    ))
}

impl Service {
    /// Applies (or replays) one root-ref update as `actor`, together with whatever else is
    /// queued for the partition.
    pub async fn update_root_refs(
        &self,
        app: &AppId,
        space: &SpaceId,
        domain: &RefDomain,
        update: &RootRefUpdate,
        actor: &str,
    ) -> ApiResult<RootRefUpdateResponse> {
        let payload = check_changes(&update.changes.0)?;
        let queue = self.root_ref_queues.of(app, space);
        let seq = self
            .root_ref_queues
            .next_seq
            .fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        queue.pending().push_back(Pending {
            seq,
            domain: domain.clone(),
            request_id: update.request_id.clone(),
            changes: update.changes.0.clone(),
            payload,
            actor: actor.to_string(),
            answer,
        });
        // A request that goes away before its update is taken withdraws it: an update is
        // applied while its client waits, or not at all.
        let _queued = Queued {
            queue: queue.clone(),
            seq,
        };
        loop {
            let turn = queue.turn.clone().lock_owned().await;
            // Empty: a turn before this one took the update and answers it.
            if queue.pending().is_empty() {
                // The updates a batch left its commit open for were withdrawn: commit it.
                if queue.followed.swap(false, Ordering::SeqCst) {
                    self.meta.flush(app, space).await;
                }
                break;
            }
            // In a task of its own: the batch is applied and answered even if this request
            // goes away meanwhile.
            let (svc, app, space, q) = (self.clone(), app.clone(), space.clone(), queue.clone());
            let applied =
                tokio::spawn(async move { svc.apply_root_refs(&app, &space, &q, turn, seq).await });
            // A turn that failed to run took nothing of this request's: it is still queued.
            if applied.await.unwrap_or(false) {
                break;
            }
        }
        answered
            .await
            .unwrap_or_else(|_| Err(ApiError::unavailable("the update was interrupted; retry")))
    }

    /// Holds the partition, then takes the queued updates (those that arrived while it waited
    /// for the partition too), applies them as one batch and answers each of them; gives up
    /// the turn once the batch is applied, before it commits, and leaves the commit open for
    /// the next turn when updates are queued for it. Returns whether it took update `seq`.
    async fn apply_root_refs(
        &self,
        app: &AppId,
        space: &SpaceId,
        queue: &Queue,
        turn: OwnedMutexGuard<()>,
        seq: u64,
    ) -> bool {
        let gated = self.meta.root_ref_gate(app, space).await;
        let batch = queue.take();
        let awaited = queue.followed.swap(false, Ordering::SeqCst);
        if batch.is_empty() {
            // Withdrawn while the partition was held: commit what was left open for them.
            drop(gated);
            if awaited {
                self.meta.flush(app, space).await;
            }
            return false;
        }
        let mine = batch.iter().any(|p| p.seq == seq);
        let applied = async {
            let mut p = gated?;
            let changes: Vec<RootRefChange<'_>> = batch
                .iter()
                .map(|u| RootRefChange {
                    domain: &u.domain,
                    request_id: &u.request_id,
                    changes: &u.changes,
                    payload_hash: &u.payload,
                    actor: &u.actor,
                })
                .collect();
            let outcomes = p.update_root_refs_many(&changes, now_ms()).await?;
            if let Some(check) = p.root_refs_checked() {
                self.metrics.root_refs_checked(check);
            }
            Ok::<_, ApiError>((p, outcomes))
        }
        .await;
        // Whoever is queued now waits for this turn and brings a batch to the gate.
        let followed = applied.is_ok() && !queue.pending().is_empty();
        queue.followed.store(followed, Ordering::SeqCst);
        drop(turn);
        let (p, outcomes) = match applied {
            Ok(done) => done,
            Err(e) => {
                for u in batch {
                    let _ = u.answer.send(Err(e.clone()));
                }
                return mine;
            }
        };
        let committed = if followed {
            p.commit_followed().await
        } else {
            p.commit().await
        };
        let committed = committed.map_err(ApiError::from);
        for (u, outcome) in batch.into_iter().zip(outcomes) {
            let answer = match (outcome, &committed) {
                (Err(r), _) => Err(rejection(r)),
                (Ok(_), Err(e)) => Err(e.clone()),
                (Ok((revision, idempotent)), Ok(())) => Ok(RootRefUpdateResponse {
                    success: true,
                    idempotent,
                    revision: revision as u64,
                }),
            };
            let _ = u.answer.send(answer);
        }
        mine
    }

    /// One page of a Space's balances in one domain, stable at the revision of the first page.
    pub async fn root_ref_page(
        &self,
        app: &AppId,
        space: &SpaceId,
        domain: &RefDomain,
        limit: u32,
        cursor: Option<&str>,
    ) -> ApiResult<RootRefPage> {
        let current = self.meta.app_revision(app).await?.unwrap_or(0);
        let (revision, after) = match cursor {
            Some(c) => {
                let (rev, after) = decode_cursor(c, Some((space, domain)))?;
                if rev > current {
                    return Err(ApiError::invalid("invalid cursor"));
                }
                (rev, Some(after))
            }
            None => (current, None),
        };
        let rows = self
            .meta
            .balances_at(
                app,
                RefFilter {
                    space: Some(space),
                    domain: Some(domain),
                    hash: None,
                },
                revision,
                after.as_ref(),
                limit as i64 + 1,
            )
            .await?;
        let more = rows.len() > limit as usize;
        let rows = &rows[..rows.len().min(limit as usize)];
        let next_cursor = match (more, rows.last()) {
            (true, Some(last)) => Some(encode_cursor(revision, &last.cursor(), false)),
            _ => None,
        };
        let items: Vec<RootRefItem> = rows
            .iter()
            .map(|b| RootRefItem {
                hash: b.hash,
                ref_count: b.ref_count,
            })
            .collect();
        Ok(RootRefPage {
            ref_domain: domain.clone(),
            revision: revision as u64,
            items,
            next_cursor,
        })
    }
}
