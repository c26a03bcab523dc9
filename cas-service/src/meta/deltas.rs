//! Delta objects whose base is going away: finding them, and recording that one is now stored
//! alone under a new object.

use cas_format::{AppId, Hash, SpaceId};

use super::nodes::{NODE_COLUMNS, NodeRow, StoredObject, node_from_row};
use super::usage::UsageDelta;
use super::{Binds, MetaStore, Partition, hb};

/// Bases named by one query at most.
const BASES_PER_QUERY: usize = 500;

impl MetaStore {
    /// The ready nodes of a partition whose objects are deltas against one of `bases`.
    pub async fn delta_dependents(
        &self,
        app: &AppId,
        space: &SpaceId,
        bases: &[Hash],
    ) -> Result<Vec<NodeRow>, sqlx::Error> {
        let mut found = Vec::new();
        for part in bases.chunks(BASES_PER_QUERY) {
            let mut b = Binds::new(self.dialect());
            let (a, s) = (b.one(), b.one());
            let bases = b.list(part.len());
            let sql = format!(
                "SELECT {NODE_COLUMNS} FROM nodes WHERE app_id = {a} AND space_id = {s} \
                 AND collecting_since IS NULL AND delta_base IN ({bases})"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(app.as_str())
                .bind(space.as_str());
            for h in part {
                q = q.bind(hb(h));
            }
            for r in q.fetch_all(&self.pool).await? {
                found.push(node_from_row(&r)?);
            }
        }
        Ok(found)
    }
}

impl Partition {
    /// Points a ready node at a new object that holds its content alone, if the row still
    /// names `old_gen`; the old object is queued for deletion. Returns whether it did.
    pub async fn store_alone(
        &mut self,
        hash: &Hash,
        old_gen: &str,
        new_gen: &str,
        stored: StoredObject,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let Some(row) = self.node(hash).await? else {
            return Ok(false);
        };
        if !row.is_ready() || row.object_gen != old_gen {
            return Ok(false);
        }
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "UPDATE nodes SET object_gen = $4, encoding = $5, stored_bytes = $6, \
             delta_base = NULL, delta_depth = 0, pack_block_offset = NULL, \
             pack_block_bytes = NULL, pack_entry_offset = NULL, pack_entry_bytes = NULL, \
             held_bytes = $7, held = $8 WHERE app_id = $1 AND space_id = $2 AND hash = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .bind(new_gen)
        .bind(stored.encoding.as_str())
        .bind(stored.stored_bytes)
        .bind(stored.held_in_row())
        .bind(stored.held_flag())
        .execute(&mut **self.tx())
        .await?;
        self.replace_apart(&row, stored.held_apart()).await?;
        self.release_object(&row, now).await?;
        self.add_usage(UsageDelta {
            ready_stored_bytes: stored.stored_bytes - row.stored_bytes,
            ..Default::default()
        })
        .await?;
        Ok(true)
    }
}
