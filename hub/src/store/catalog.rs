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
