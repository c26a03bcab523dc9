//! The catalog head (`hub_catalog`): the one pointer to the current catalog snapshot node.
//! `seq` moves by one with every commit and is the optimistic check of a swap.

use cas_format::Hash;
use sqlx::Row;

use super::{HubStore, WriteTx, parsed};

/// The current head.
#[derive(Debug, Clone)]
pub struct Head {
    pub seq: i64,
    pub hash: Hash,
}

impl HubStore {
    pub async fn catalog_head(&self) -> Result<Option<Head>, sqlx::Error> {
        let row = sqlx::query("SELECT seq, snapshot_hash FROM hub_catalog WHERE id = 1")
            .fetch_optional(self.pool())
            .await?;
        row.map(|r| {
            Ok(Head {
                seq: r.try_get("seq")?,
                hash: parsed(&r, "snapshot_hash")?,
            })
        })
        .transpose()
    }

    /// Moves the head from `expected_seq` (`0`: there is none yet) to a new snapshot;
    /// `false` if it moved meanwhile.
    pub async fn swap_catalog_head(
        tx: &mut WriteTx,
        expected_seq: i64,
        snapshot_id: &str,
        hash: &Hash,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let n = if expected_seq == 0 {
            sqlx::query(
                "INSERT INTO hub_catalog (id, seq, snapshot_id, snapshot_hash, updated_at_ms) \
                 VALUES (1, 1, $1, $2, $3) ON CONFLICT (id) DO NOTHING",
            )
            .bind(snapshot_id)
            .bind(hash.to_string())
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
            .bind(hash.to_string())
            .bind(now)
            .bind(expected_seq)
            .execute(tx.conn())
            .await?
            .rows_affected()
        };
        Ok(n == 1)
    }
}

/// A kept (or released) catalog snapshot.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SnapshotRow {
    pub snapshot_id: String,
    pub hash: Hash,
    pub created_at_ms: i64,
    pub operation: String,
    pub actor: String,
    pub previous_snapshot_id: Option<String>,
    /// When the retention pass released it (its root ref dropped); `None` while kept.
    pub released_at_ms: Option<i64>,
}

const SNAPSHOT_COLUMNS: &str = "snapshot_id, snapshot_hash, created_at_ms, operation, actor, \
     previous_snapshot_id, released_at_ms";

fn snapshot_row(r: &sqlx::any::AnyRow) -> Result<SnapshotRow, sqlx::Error> {
    Ok(SnapshotRow {
        snapshot_id: r.try_get("snapshot_id")?,
        hash: parsed(r, "snapshot_hash")?,
        created_at_ms: r.try_get("created_at_ms")?,
        operation: r.try_get("operation")?,
        actor: r.try_get("actor")?,
        previous_snapshot_id: r.try_get("previous_snapshot_id")?,
        released_at_ms: r.try_get("released_at_ms")?,
    })
}

impl HubStore {
    /// Records a snapshot the head now names (once: a replayed commit records nothing twice).
    pub async fn insert_catalog_snapshot(
        tx: &mut WriteTx,
        s: &SnapshotRow,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO hub_catalog_snapshots ({SNAPSHOT_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, NULL) ON CONFLICT (snapshot_id) DO NOTHING"
        )))
        .bind(&s.snapshot_id)
        .bind(s.hash.to_string())
        .bind(s.created_at_ms)
        .bind(&s.operation)
        .bind(&s.actor)
        .bind(&s.previous_snapshot_id)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Snapshots newest first, those created before `before_ms` when given; released ones
    /// only if `released`.
    pub async fn catalog_snapshots(
        &self,
        before_ms: Option<i64>,
        released: bool,
        limit: i64,
    ) -> Result<Vec<SnapshotRow>, sqlx::Error> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM hub_catalog_snapshots \
             WHERE created_at_ms < $1 AND ($2 = 1 OR released_at_ms IS NULL) \
             ORDER BY created_at_ms DESC, snapshot_id DESC LIMIT $3"
        )))
        .bind(before_ms.unwrap_or(i64::MAX))
        .bind(i64::from(released))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(snapshot_row).collect()
    }

    pub async fn catalog_snapshot(&self, id: &str) -> Result<Option<SnapshotRow>, sqlx::Error> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SNAPSHOT_COLUMNS} FROM hub_catalog_snapshots WHERE snapshot_id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(snapshot_row).transpose()
    }

    /// Marks snapshots released (their root refs were dropped).
    pub async fn mark_snapshots_released(
        tx: &mut WriteTx,
        ids: &[String],
        now: i64,
    ) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE hub_catalog_snapshots SET released_at_ms = $1 \
             WHERE released_at_ms IS NULL AND snapshot_id IN ({})",
            super::placeholders(2, ids.len())
        )))
        .bind(now);
        for id in ids {
            q = q.bind(id);
        }
        q.execute(tx.conn()).await?;
        Ok(())
    }
}
