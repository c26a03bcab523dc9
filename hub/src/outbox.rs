//! The outbox: every root-ref delta the hub sends to the CAS is first written down locally with
//! its deterministic request id and the local commit that must follow it, then sent, then
//! committed (and the row deleted) in one local transaction.
//!
//! A writer that dies (or loses the CAS) between those steps leaves its row. Whoever next holds
//! the same lock key (the next writer of that workspace, the start of a hub process, or the
//! periodic sweep) settles it: it replays the delta (the CAS applies a request id once, so a
//! replay is counted once) and performs the commit. A root ref is thus neither lost nor counted
//! twice, and there is no compensating-delete window.
//!
//! Every pending row is written, sent and committed while its lock key is held, so a row that
//! someone else finds while holding the key belongs to a writer that is gone.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use cas_format::{Hash, RequestId, SpaceId};
use serde::{Deserialize, Serialize};

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids::{NotebookId, ProjectId};
use crate::lock::LockKey;
use crate::store::outbox::PendingRecord;
use crate::store::{
    EventRow, HubStore, IdempotencyRow, NotebookState, SnapshotRow, TrashRow, VersionRow, WriteTx,
};

/// A local change that rides with a catalog commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    CreateNotebook {
        notebook_id: NotebookId,
        project_id: ProjectId,
        sync_token_hash: Option<String>,
        #[serde(default)]
        sync_token_owner: Option<String>,
    },
    Trash {
        notebook_id: NotebookId,
        project_id: ProjectId,
        token: String,
        title: String,
        actor: String,
        at_ms: i64,
    },
    Restore {
        notebook_id: NotebookId,
        token: String,
    },
    StartPurge {
        notebook_id: NotebookId,
        token: String,
    },
    /// A notebook of a purged project, live or in the trash, on to its purge.
    PurgeNotebook {
        notebook_id: NotebookId,
    },
    Event(EventRow),
    /// What an idempotent create answered.
    Idempotency(IdempotencyRow),
    /// Invitations of `email` to these projects were claimed (or a purged project's dropped).
    DropInvitations {
        email: Option<String>,
        project_ids: Vec<ProjectId>,
    },
}

/// What the local commit after the delta does.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Payload {
    /// Swap the catalog head from `expected_seq`, with effects.
    Catalog {
        expected_seq: i64,
        snapshot_id: String,
        snapshot_hash: Hash,
        effects: Vec<Effect>,
        /// The snapshot's row in the catalog history (absent in rows of older hubs).
        #[serde(default)]
        history: Option<SnapshotRow>,
    },
    /// Catalog snapshots the retention pass released.
    CatalogRelease { snapshot_ids: Vec<String> },
    /// Index committed versions; move the head to the last one if `move_head` (never when a
    /// dead writer's row is settled: its revision joins the history, the head stays).
    Versions {
        rows: Vec<VersionRow>,
        move_head: bool,
        events: Vec<EventRow>,
    },
    /// Mark versions pruned (retention), or the whole notebook purged.
    Release {
        notebook_id: NotebookId,
        revisions: Vec<i64>,
        purge: bool,
        events: Vec<EventRow>,
    },
}

/// One outbox row.
#[derive(Debug, Clone)]
pub struct Pending {
    pub request_id: String,
    pub lock_key: LockKey,
    pub space: SpaceId,
    pub changes: BTreeMap<Hash, i64>,
    pub payload: Payload,
    /// The portable bytes of the root node the delta acquires, to store it again if it was
    /// collected while its writer was gone.
    pub root_node: Option<Bytes>,
}

impl Pending {
    fn kind(&self) -> &'static str {
        match self.payload {
            Payload::Catalog { .. } => "catalog",
            Payload::CatalogRelease { .. } => "catalog-release",
            Payload::Versions { .. } => "versions",
            Payload::Release { purge: false, .. } => "prune",
            Payload::Release { purge: true, .. } => "purge",
        }
    }

    /// Writes the row in `tx` (with whatever else the caller commits with it).
    pub async fn insert(&self, tx: &mut WriteTx) -> HubResult<()> {
        let payload = serde_json::to_string(&self.payload)
            .map_err(|e| HubError::internal("cannot encode an outbox row", e))?;
        HubStore::insert_pending(
            tx,
            &PendingRecord {
                request_id: self.request_id.clone(),
                kind: self.kind().to_string(),
                lock_key: self.lock_key.as_str().to_string(),
                space: self.space.clone(),
                changes: self.changes.clone(),
                payload,
                root_node: self.root_node.clone(),
            },
        )
        .await?;
        Ok(())
    }

    fn from_record(r: PendingRecord) -> Result<Pending, serde_json::Error> {
        Ok(Pending {
            payload: serde_json::from_str(&r.payload)?,
            request_id: r.request_id,
            lock_key: LockKey::stored(r.lock_key),
            space: r.space,
            changes: r.changes,
            root_node: r.root_node,
        })
    }
}

/// How sending a delta ended.
enum Sent {
    Applied,
    /// The CAS refused it for good (nothing was applied).
    Refused(cas_client::ClientError),
}

impl Hub {
    /// Writes `p` (in a transaction of its own), then completes it.
    pub(crate) async fn record_and_complete(&self, p: &Pending) -> HubResult<()> {
        let mut tx = self.store.write().await?;
        p.insert(&mut tx).await?;
        tx.commit().await?;
        self.complete(p, false).await
    }

    /// Performs the commit of `p`, which has no delta to send.
    pub(crate) async fn commit_without_delta(&self, p: &Pending) -> HubResult<()> {
        let mut tx = self.store.write().await?;
        commit_payload(&mut tx, &p.payload, false).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Sends the delta of `p` (idempotently) and performs its commit. On a transient failure
    /// the row stays for recovery and the error is returned; on a refusal the row is dropped.
    pub(crate) async fn complete(&self, p: &Pending, recovering: bool) -> HubResult<()> {
        match self.send(p, recovering).await? {
            Sent::Applied => {}
            Sent::Refused(e) => {
                tracing::warn!(request = %p.request_id, error = %e, "the content store refused a root-ref delta; dropping it");
                self.store.drop_pending(&p.request_id).await?;
                return Err(HubError::internal(
                    "the content store refused to retain the new state; nothing was committed",
                    e,
                ));
            }
        }
        let mut tx = self.store.write().await?;
        commit_payload(&mut tx, &p.payload, recovering).await?;
        HubStore::delete_pending(&mut tx, &p.request_id).await?;
        crate::failpoint::hit("hub-before-local-commit").await?;
        tx.commit().await?;
        Ok(())
    }

    async fn send(&self, p: &Pending, recovering: bool) -> HubResult<Sent> {
        let request_id: RequestId = p
            .request_id
            .parse()
            .map_err(|e| HubError::internal("bad request id", e))?;
        let cas = self.cas()?;
        if recovering && let Some(root) = &p.root_node {
            // The root may have been collected while its writer was gone: store it again (its
            // children must still be there; if not, the delta is refused below).
            let hash = Hash::digest(root);
            let nodes = std::collections::HashMap::from([(hash, root.clone())]);
            if let Err(e) = cas
                .store_dag(&p.space, &nodes, &[hash], self.config.lease_ms, 1)
                .await
            {
                if e.is_transient() {
                    return Err(e.into());
                }
                return Ok(Sent::Refused(e));
            }
        }
        crate::failpoint::hit("hub-before-root-refs").await?;
        match cas
            .update_root_refs(&p.space, &request_id, p.changes.clone())
            .await
        {
            Ok(r) => {
                tracing::debug!(request = %p.request_id, revision = r.revision, replayed = r.idempotent, "root refs updated");
                crate::failpoint::hit("hub-after-root-refs").await?;
                Ok(Sent::Applied)
            }
            Err(e) if e.is_transient() => Err(e.into()),
            Err(e) => Ok(Sent::Refused(e)),
        }
    }

    /// Settles the rows left under `key` by writers that are gone. The caller holds the key.
    pub(crate) async fn settle(&self, key: &LockKey) -> HubResult<()> {
        for record in self.store.pending_under(key.as_str()).await? {
            let p = Pending::from_record(record)
                .map_err(|e| HubError::internal("an outbox row cannot be read", e))?;
            tracing::info!(request = %p.request_id, "settling a root-ref delta left by a writer that is gone");
            match self.complete(&p, true).await {
                Ok(()) => {}
                Err(e) if e.status == axum::http::StatusCode::SERVICE_UNAVAILABLE => return Err(e),
                // Refused for good: the row was dropped; what it would have committed is lost,
                // which only happens when its nodes were collected while the hub was away.
                Err(e) => {
                    tracing::error!(request = %p.request_id, error = %e, "abandoned an outbox row")
                }
            }
        }
        Ok(())
    }

    /// Settles every row whose lock key can be taken now (at start and periodically).
    pub async fn recover(&self) -> HubResult<usize> {
        let mut settled = 0;
        for key in self.store.pending_lock_keys().await? {
            let key = LockKey::stored(key);
            let guard = match self
                .locks
                .acquire(&key, Duration::from_millis(200))
                .await
                .map_err(|e| HubError::internal("lock failed", e))?
            {
                Ok(g) => g,
                Err(_) => continue, // a live writer holds it and settles it itself
            };
            let r = self.settle(&key).await;
            guard.release().await;
            r?;
            settled += 1;
        }
        Ok(settled)
    }
}

/// The local commit of a payload, in `tx`.
async fn commit_payload(tx: &mut WriteTx, payload: &Payload, recovering: bool) -> HubResult<()> {
    let now = crate::ids::now_ms();
    match payload {
        Payload::Catalog {
            expected_seq,
            snapshot_id,
            snapshot_hash,
            effects,
            history,
        } => {
            if !HubStore::swap_catalog_head(tx, *expected_seq, snapshot_id, snapshot_hash, now)
                .await?
            {
                // Only possible if the catalog lock was not held: never commit over it.
                return Err(HubError::conflict(
                    "the catalog moved while it was being changed; retry",
                ));
            }
            if let Some(h) = history {
                HubStore::insert_catalog_snapshot(tx, h).await?;
            }
            for e in effects {
                apply_effect(tx, e, now).await?;
            }
        }
        Payload::CatalogRelease { snapshot_ids } => {
            HubStore::mark_snapshots_released(tx, snapshot_ids, now).await?;
        }
        Payload::Versions {
            rows,
            move_head,
            events,
        } => {
            HubStore::insert_versions(tx, rows).await?;
            if let Some(last) = rows.last() {
                let head = (*move_head && !recovering).then_some(last.revision);
                HubStore::touch_head(tx, &last.notebook_id, head, now).await?;
            }
            for e in events {
                let mut e = e.clone();
                if recovering {
                    e.event = format!("{}.recovered", e.event);
                }
                e.insert(tx).await?;
            }
        }
        Payload::Release {
            notebook_id,
            revisions,
            purge,
            events,
        } => {
            HubStore::mark_pruned(tx, notebook_id, revisions, now).await?;
            if *purge {
                HubStore::set_notebook_state(tx, notebook_id, NotebookState::Purged, now).await?;
            }
            for e in events {
                e.insert(tx).await?;
            }
        }
    }
    Ok(())
}

async fn apply_effect(tx: &mut WriteTx, e: &Effect, now: i64) -> HubResult<()> {
    match e {
        Effect::CreateNotebook {
            notebook_id,
            project_id,
            sync_token_hash,
            sync_token_owner,
        } => {
            HubStore::insert_notebook(
                tx,
                notebook_id,
                project_id,
                sync_token_hash.as_deref(),
                sync_token_owner.as_deref(),
                now,
            )
            .await?;
        }
        Effect::Trash {
            notebook_id,
            project_id,
            token,
            title,
            actor,
            at_ms,
        } => {
            HubStore::set_notebook_state(tx, notebook_id, NotebookState::Trashed, now).await?;
            let entry = TrashRow {
                token: token.clone(),
                notebook_id: notebook_id.clone(),
                title: title.clone(),
                trashed_at_ms: *at_ms,
                actor: actor.clone(),
            };
            HubStore::insert_trash(tx, project_id, &entry).await?;
        }
        // Both take the notebook out of the trash: back to live, or on to its purge.
        Effect::Restore { notebook_id, token } | Effect::StartPurge { notebook_id, token } => {
            let state = if matches!(e, Effect::Restore { .. }) {
                NotebookState::Live
            } else {
                NotebookState::Purging
            };
            HubStore::set_notebook_state(tx, notebook_id, state, now).await?;
            HubStore::delete_trash(tx, token).await?;
        }
        Effect::PurgeNotebook { notebook_id } => {
            HubStore::set_notebook_state(tx, notebook_id, NotebookState::Purging, now).await?;
            HubStore::delete_trash_of(tx, notebook_id).await?;
        }
        Effect::Event(ev) => ev.insert(tx).await?,
        Effect::Idempotency(row) => {
            row.insert(tx).await?;
        }
        Effect::DropInvitations { email, project_ids } => {
            for pid in project_ids {
                HubStore::delete_invitations(tx, Some(pid), email.as_deref()).await?;
            }
        }
    }
    Ok(())
}
