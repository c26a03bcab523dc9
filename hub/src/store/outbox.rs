//! The outbox (`hub_pending`): root-ref deltas written down before they are sent, with the
//! local commit that follows them (see `crate::outbox`).

use std::collections::BTreeMap;

use bytes::Bytes;
use cas_format::{Hash, SpaceId};
use sqlx::Row;

use super::{HubStore, WriteTx, decode_err, parsed};

/// One outbox row; `payload` is the local commit, as JSON.
#[derive(Debug, Clone)]
pub struct PendingRecord {
    pub request_id: String,
    pub kind: String,
    pub lock_key: String,
    pub space: SpaceId,
    pub changes: BTreeMap<Hash, i64>,
    pub payload: String,
    pub root_node: Option<Bytes>,
}

impl HubStore {
    pub async fn insert_pending(tx: &mut WriteTx, p: &PendingRecord) -> Result<(), sqlx::Error> {
        let changes: BTreeMap<String, i64> =
            p.changes.iter().map(|(h, d)| (h.to_string(), *d)).collect();
        let changes =
            serde_json::to_string(&changes).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query(
            "INSERT INTO hub_pending (request_id, kind, lock_key, space_id, changes, payload, root_node, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&p.request_id)
        .bind(&p.kind)
        .bind(&p.lock_key)
        .bind(p.space.as_str())
        .bind(changes)
        .bind(&p.payload)
        .bind(p.root_node.as_ref().map(|b| b.to_vec()))
        .bind(crate::ids::now_ms())
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Deletes a row as part of the commit that settles it.
    pub async fn delete_pending(tx: &mut WriteTx, request_id: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM hub_pending WHERE request_id = $1")
            .bind(request_id)
            .execute(tx.conn())
            .await?;
        Ok(())
    }

    /// Drops a row whose delta the CAS refused for good.
    pub async fn drop_pending(&self, request_id: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        Self::delete_pending(&mut tx, request_id).await?;
        tx.commit().await
    }

    /// The rows left under a lock key, oldest first.
    pub async fn pending_under(&self, lock_key: &str) -> Result<Vec<PendingRecord>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT request_id, kind, lock_key, space_id, changes, payload, root_node FROM hub_pending \
             WHERE lock_key = $1 ORDER BY created_at_ms, request_id",
        )
        .bind(lock_key)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                let changes: String = r.try_get("changes")?;
                let changes: BTreeMap<String, i64> =
                    serde_json::from_str(&changes).map_err(|e| decode_err("changes", e))?;
                let root: Option<Vec<u8>> = r.try_get("root_node")?;
                Ok(PendingRecord {
                    request_id: r.try_get("request_id")?,
                    kind: r.try_get("kind")?,
                    lock_key: r.try_get("lock_key")?,
                    space: parsed(r, "space_id")?,
                    changes: changes
                        .into_iter()
                        .map(|(h, d)| Ok((h.parse().map_err(|e| decode_err("changes", e))?, d)))
                        .collect::<Result<_, sqlx::Error>>()?,
                    payload: r.try_get("payload")?,
                    root_node: root.map(Bytes::from),
                })
            })
            .collect()
    }

    /// Every lock key that has rows.
    pub async fn pending_lock_keys(&self) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT DISTINCT lock_key FROM hub_pending ORDER BY lock_key")
            .fetch_all(self.pool())
            .await
    }
}
