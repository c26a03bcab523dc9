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
use sqlx::Row;

use crate::Hub;
use crate::db::WriteTx;
use crate::error::{HubError, HubResult};

/// An audit event row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventRow {
    pub id: String,
    pub project_id: Option<String>,
    pub notebook_id: Option<String>,
    pub ts_ms: i64,
    pub event: String,
    pub actor: String,
    pub detail: serde_json::Value,
}

impl EventRow {
    pub fn new(
        event: &str,
        actor: &str,
        project_id: Option<&str>,
        notebook_id: Option<&str>,
        detail: serde_json::Value,
    ) -> Self {
        EventRow {
            id: crate::ids::event_id(),
            project_id: project_id.map(str::to_string),
            notebook_id: notebook_id.map(str::to_string),
            ts_ms: crate::ids::now_ms(),
            event: event.to_string(),
            actor: actor.to_string(),
            detail,
        }
    }

    pub async fn insert(&self, tx: &mut WriteTx) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO hub_events (id, project_id, notebook_id, ts_ms, event, actor, detail) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&self.id)
        .bind(&self.project_id)
        .bind(&self.notebook_id)
        .bind(self.ts_ms)
        .bind(&self.event)
        .bind(&self.actor)
        .bind(self.detail.to_string())
        .execute(tx.conn())
        .await?;
        Ok(())
    }
}

/// A row of the version index.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionRow {
    pub notebook_id: String,
    pub project_id: String,
    pub revision: i64,
    pub version_id: String,
    pub version_hash: Hash,
    pub tree_hash: Hash,
    pub parent_revision: Option<i64>,
    pub saved_at_ms: i64,
    pub author: String,
    pub message: String,
    pub kind: String,
    pub file_count: i64,
    pub logical_bytes: i64,
}

/// A local change that rides with a catalog commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "snake_case")]
pub enum Effect {
    CreateNotebook {
        notebook_id: String,
        project_id: String,
        sync_token_hash: Option<String>,
        #[serde(default)]
        sync_token_owner: Option<String>,
    },
    Trash {
        notebook_id: String,
        project_id: String,
        token: String,
        title: String,
        actor: String,
        at_ms: i64,
    },
    Restore {
        notebook_id: String,
        token: String,
    },
    StartPurge {
        notebook_id: String,
        token: String,
    },
    Event(EventRow),
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
    },
    /// Index committed versions; move the head to the last one if `move_head` (never when a
    /// dead writer's row is settled: its revision joins the history, the head stays).
    Versions {
        rows: Vec<VersionRow>,
        move_head: bool,
        events: Vec<EventRow>,
    },
    /// Mark versions pruned (retention), or the whole notebook purged.
    Release {
        notebook_id: String,
        revisions: Vec<i64>,
        purge: bool,
        events: Vec<EventRow>,
    },
}

/// One outbox row.
#[derive(Debug, Clone)]
pub struct Pending {
    pub request_id: String,
    pub lock_key: String,
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
            Payload::Versions { .. } => "versions",
            Payload::Release { purge: false, .. } => "prune",
            Payload::Release { purge: true, .. } => "purge",
        }
    }

    /// Writes the row; `before` runs in the same transaction (e.g. the revision allocation).
    pub async fn insert(&self, tx: &mut WriteTx) -> Result<(), sqlx::Error> {
        let changes: BTreeMap<String, i64> = self
            .changes
            .iter()
            .map(|(h, d)| (h.to_string(), *d))
            .collect();
        sqlx::query(
            "INSERT INTO hub_pending (request_id, kind, lock_key, space_id, changes, payload, root_node, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&self.request_id)
        .bind(self.kind())
        .bind(&self.lock_key)
        .bind(self.space.as_str())
        .bind(serde_json::to_string(&changes).unwrap_or_default())
        .bind(serde_json::to_string(&self.payload).unwrap_or_default())
        .bind(self.root_node.as_ref().map(|b| b.to_vec()))
        .bind(crate::ids::now_ms())
        .execute(tx.conn())
        .await?;
        Ok(())
    }
}

fn parse_row(row: &sqlx::any::AnyRow) -> Result<Pending, String> {
    let request_id: String = row.try_get("request_id").map_err(|e| e.to_string())?;
    let lock_key: String = row.try_get("lock_key").map_err(|e| e.to_string())?;
    let space: String = row.try_get("space_id").map_err(|e| e.to_string())?;
    let changes: String = row.try_get("changes").map_err(|e| e.to_string())?;
    let payload: String = row.try_get("payload").map_err(|e| e.to_string())?;
    let root: Option<Vec<u8>> = row.try_get("root_node").map_err(|e| e.to_string())?;
    let changes: BTreeMap<String, i64> =
        serde_json::from_str(&changes).map_err(|e| e.to_string())?;
    Ok(Pending {
        request_id,
        lock_key,
        space: space.parse().map_err(|e| format!("{e}"))?,
        changes: changes
            .into_iter()
            .map(|(h, d)| Ok((h.parse::<Hash>().map_err(|e| e.to_string())?, d)))
            .collect::<Result<_, String>>()?,
        payload: serde_json::from_str(&payload).map_err(|e| e.to_string())?,
        root_node: root.map(Bytes::from),
    })
}

/// How sending a delta ended.
enum Sent {
    Applied,
    /// The CAS refused it for good (nothing was applied).
    Refused(cas_client::ClientError),
}

impl Hub {
    /// Sends the delta of `p` (idempotently) and performs its commit. On a transient failure
    /// the row stays for recovery and the error is returned; on a refusal the row is dropped.
    pub(crate) async fn complete(&self, p: &Pending, recovering: bool) -> HubResult<()> {
        match self.send(p, recovering).await? {
            Sent::Applied => {}
            Sent::Refused(e) => {
                tracing::warn!(request = %p.request_id, error = %e, "the content store refused a root-ref delta; dropping it");
                sqlx::query("DELETE FROM hub_pending WHERE request_id = $1")
                    .bind(&p.request_id)
                    .execute(&self.db.pool)
                    .await?;
                return Err(HubError::internal(
                    "the content store refused to retain the new state; nothing was committed",
                    e,
                ));
            }
        }
        let mut tx = self.db.write().await?;
        self.commit_payload(&mut tx, p, recovering).await?;
        sqlx::query("DELETE FROM hub_pending WHERE request_id = $1")
            .bind(&p.request_id)
            .execute(tx.conn())
            .await?;
        crate::failpoint::hit("hub-before-local-commit").await?;
        tx.commit().await?;
        Ok(())
    }

    async fn send(&self, p: &Pending, recovering: bool) -> HubResult<Sent> {
        let request_id: RequestId = p
            .request_id
            .parse()
            .map_err(|e| HubError::internal("bad request id", e))?;
        if recovering && let Some(root) = &p.root_node {
            // The root may have been collected while its writer was gone: store it again (its
            // children must still be there; if not, the delta is refused below).
            let hash = Hash::digest(root);
            let nodes = std::collections::HashMap::from([(hash, root.clone())]);
            if let Err(e) = self
                .cas
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
        match self
            .cas
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

    async fn commit_payload(
        &self,
        tx: &mut WriteTx,
        p: &Pending,
        recovering: bool,
    ) -> HubResult<()> {
        let now = crate::ids::now_ms();
        match &p.payload {
            Payload::Catalog {
                expected_seq,
                snapshot_id,
                snapshot_hash,
                effects,
            } => {
                let swapped = if *expected_seq == 0 {
                    sqlx::query(
                        "INSERT INTO hub_catalog (id, seq, snapshot_id, snapshot_hash, updated_at_ms) \
                         VALUES (1, 1, $1, $2, $3) ON CONFLICT (id) DO NOTHING",
                    )
                    .bind(snapshot_id)
                    .bind(snapshot_hash.to_string())
                    .bind(now)
                    .execute(tx.conn())
                    .await?
                    .rows_affected()
                } else {
                    sqlx::query(
                        "UPDATE hub_catalog SET seq = seq + 1, snapshot_id = $1, snapshot_hash = $2, \
                         updated_at_ms = $3 WHERE id = 1 AND seq = $4",
                    )
                    .bind(snapshot_id)
                    .bind(snapshot_hash.to_string())
                    .bind(now)
                    .bind(*expected_seq)
                    .execute(tx.conn())
                    .await?
                    .rows_affected()
                };
                if swapped != 1 {
                    // Only possible if the catalog lock was not held: never commit over it.
                    return Err(HubError::conflict(
                        "the catalog moved while it was being changed; retry",
                    ));
                }
                for e in effects {
                    apply_effect(tx, e, now).await?;
                }
            }
            Payload::Versions {
                rows,
                move_head,
                events,
            } => {
                for r in rows {
                    sqlx::query(
                        "INSERT INTO hub_versions (notebook_id, revision, version_id, project_id, version_hash, \
                         tree_hash, parent_revision, saved_at_ms, author, message, kind, file_count, logical_bytes, state) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, 'kept') \
                         ON CONFLICT (notebook_id, revision) DO NOTHING",
                    )
                    .bind(&r.notebook_id)
                    .bind(r.revision)
                    .bind(&r.version_id)
                    .bind(&r.project_id)
                    .bind(r.version_hash.to_string())
                    .bind(r.tree_hash.to_string())
                    .bind(r.parent_revision)
                    .bind(r.saved_at_ms)
                    .bind(&r.author)
                    .bind(&r.message)
                    .bind(&r.kind)
                    .bind(r.file_count)
                    .bind(r.logical_bytes)
                    .execute(tx.conn())
                    .await?;
                }
                if let Some(last) = rows.last() {
                    if *move_head && !recovering {
                        sqlx::query(
                            "UPDATE hub_notebooks SET head_revision = $1, updated_at_ms = $2 WHERE notebook_id = $3",
                        )
                        .bind(last.revision)
                        .bind(now)
                        .bind(&last.notebook_id)
                        .execute(tx.conn())
                        .await?;
                    } else {
                        sqlx::query(
                            "UPDATE hub_notebooks SET updated_at_ms = $1 WHERE notebook_id = $2",
                        )
                        .bind(now)
                        .bind(&last.notebook_id)
                        .execute(tx.conn())
                        .await?;
                    }
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
                for chunk in revisions.chunks(500) {
                    let list = chunk
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(",");
                    // The revisions are integers we wrote ourselves: inlining them is safe.
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "UPDATE hub_versions SET state = 'pruned', pruned_at_ms = $1 \
                         WHERE notebook_id = $2 AND state = 'kept' AND revision IN ({list})"
                    )))
                    .bind(now)
                    .bind(notebook_id)
                    .execute(tx.conn())
                    .await?;
                }
                if *purge {
                    sqlx::query(
                        "UPDATE hub_notebooks SET state = 'purged', head_revision = NULL, \
                         sync_token_hash = NULL, updated_at_ms = $1 WHERE notebook_id = $2",
                    )
                    .bind(now)
                    .bind(notebook_id)
                    .execute(tx.conn())
                    .await?;
                }
                for e in events {
                    e.insert(tx).await?;
                }
            }
        }
        Ok(())
    }

    /// Settles the rows left under `lock_key` by writers that are gone. The caller holds the key.
    pub(crate) async fn settle(&self, lock_key: &str) -> HubResult<()> {
        let rows = sqlx::query(
            "SELECT request_id, lock_key, space_id, changes, payload, root_node FROM hub_pending \
             WHERE lock_key = $1 ORDER BY created_at_ms, request_id",
        )
        .bind(lock_key)
        .fetch_all(&self.db.pool)
        .await?;
        for row in rows {
            let p = match parse_row(&row) {
                Ok(p) => p,
                Err(e) => {
                    return Err(HubError::internal("an outbox row cannot be read", e));
                }
            };
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
        let keys: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT lock_key FROM hub_pending ORDER BY lock_key")
                .fetch_all(&self.db.pool)
                .await?;
        let mut settled = 0;
        for key in keys {
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

async fn apply_effect(tx: &mut WriteTx, e: &Effect, now: i64) -> HubResult<()> {
    match e {
        Effect::CreateNotebook {
            notebook_id,
            project_id,
            sync_token_hash,
            sync_token_owner,
        } => {
            sqlx::query(
                "INSERT INTO hub_notebooks (notebook_id, project_id, state, head_revision, max_revision, \
                 sync_token_hash, sync_token_owner, created_at_ms, updated_at_ms) \
                 VALUES ($1, $2, 'live', NULL, 0, $3, $4, $5, $5) ON CONFLICT (notebook_id) DO NOTHING",
            )
            .bind(notebook_id)
            .bind(project_id)
            .bind(sync_token_hash)
            .bind(sync_token_owner)
            .bind(now)
            .execute(tx.conn())
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
            sqlx::query("UPDATE hub_notebooks SET state = 'trashed', updated_at_ms = $1 WHERE notebook_id = $2")
                .bind(now)
                .bind(notebook_id)
                .execute(tx.conn())
                .await?;
            sqlx::query(
                "INSERT INTO hub_trash (token, project_id, notebook_id, title, trashed_at_ms, actor) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (token) DO NOTHING",
            )
            .bind(token)
            .bind(project_id)
            .bind(notebook_id)
            .bind(title)
            .bind(at_ms)
            .bind(actor)
            .execute(tx.conn())
            .await?;
        }
        // Both take the notebook out of the trash: back to live, or on to its purge.
        Effect::Restore { notebook_id, token } | Effect::StartPurge { notebook_id, token } => {
            let state = if matches!(e, Effect::Restore { .. }) {
                "live"
            } else {
                "purging"
            };
            sqlx::query(
                "UPDATE hub_notebooks SET state = $1, updated_at_ms = $2 WHERE notebook_id = $3",
            )
            .bind(state)
            .bind(now)
            .bind(notebook_id)
            .execute(tx.conn())
            .await?;
            sqlx::query("DELETE FROM hub_trash WHERE token = $1")
                .bind(token)
                .execute(tx.conn())
                .await?;
        }
        Effect::Event(ev) => ev.insert(tx).await?,
    }
    Ok(())
}
