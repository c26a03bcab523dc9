//! Pack rows and the packer's lock: what packing writes to the database, and the counts GC and
//! re-publication keep (the packer itself is `crate::pack`).

use cas_format::{AppId, Hash, SpaceId};
use sqlx::Row;

use super::check::space_filter;
use super::generations::decode_err;
use super::nodes::{DeltaBase, NODE_COLUMNS, NodeRow, PackSpan, node_from_row};
use super::usage::UsageDelta;
use super::{MetaStore, Partition, hb};
use crate::blob::Encoding;

/// Whether a pack's object is complete and pointed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackState {
    /// Its object may be incomplete or missing; no row points at it.
    Writing,
    Live,
}

impl PackState {
    fn as_str(self) -> &'static str {
        match self {
            PackState::Writing => "writing",
            PackState::Live => "live",
        }
    }

    fn parse(s: &str) -> Option<PackState> {
        match s {
            "writing" => Some(PackState::Writing),
            "live" => Some(PackState::Live),
            _ => None,
        }
    }
}

/// A pack row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackRow {
    pub space: SpaceId,
    pub pack_id: String,
    pub state: PackState,
    pub object_bytes: i64,
    pub live_nodes: i64,
    pub live_bytes: i64,
    pub created_at: i64,
}

/// A node placed in a new pack: the object its row named when it was read, and what the row
/// says once it points at its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedEntry {
    pub hash: Hash,
    pub old_gen: String,
    pub encoding: Encoding,
    /// Kept when the entry is a delta frame against a node outside the pack.
    pub delta: Option<DeltaBase>,
    pub span: PackSpan,
    /// The entry's share of its block's bytes.
    pub share: i64,
}

fn pack_from_row(r: &sqlx::any::AnyRow) -> Result<PackRow, sqlx::Error> {
    let state: String = r.try_get("state")?;
    Ok(PackRow {
        space: r
            .try_get::<String, _>("space_id")?
            .parse()
            .map_err(|_| decode_err("space_id", "?"))?,
        pack_id: r.try_get("pack_id")?,
        state: PackState::parse(&state).ok_or_else(|| decode_err("state", &state))?,
        object_bytes: r.try_get("object_bytes")?,
        live_nodes: r.try_get("live_nodes")?,
        live_bytes: r.try_get("live_bytes")?,
        created_at: r.try_get("created_at")?,
    })
}

const PACK_COLUMNS: &str =
    "space_id, pack_id, state, object_bytes, live_nodes, live_bytes, created_at";

impl MetaStore {
    /// Ready nodes of a partition that are not packed and hold at most `max_size` bytes of
    /// content, oldest first, with when their rows were created.
    pub async fn loose_nodes(
        &self,
        app: &AppId,
        space: &SpaceId,
        max_size: i64,
        limit: i64,
    ) -> Result<Vec<(NodeRow, i64)>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {NODE_COLUMNS}, created_at FROM nodes WHERE app_id = $1 AND space_id = $2 \
             AND pack_block_offset IS NULL AND collecting_since IS NULL AND size <= $3 \
             ORDER BY created_at LIMIT $4"
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(max_size)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| Ok((node_from_row(r)?, r.try_get("created_at")?)))
        .collect()
    }

    /// The packs of an App (or of one Space), in order of creation.
    pub async fn packs(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
    ) -> Result<Vec<PackRow>, sqlx::Error> {
        let (filter, space_value) = space_filter(space);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {PACK_COLUMNS} FROM packs n WHERE n.app_id = $1 {filter} \
             ORDER BY n.created_at, n.pack_id"
        )))
        .bind(app.as_str())
        .bind(space_value)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(pack_from_row)
        .collect()
    }

    /// The ready rows that point at a pack.
    pub async fn pack_members(
        &self,
        app: &AppId,
        space: &SpaceId,
        pack_id: &str,
    ) -> Result<Vec<NodeRow>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE app_id = $1 AND space_id = $2 \
             AND object_gen = $3 AND pack_block_offset IS NOT NULL AND collecting_since IS NULL \
             ORDER BY pack_block_offset, pack_entry_offset"
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(pack_id)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(node_from_row)
        .collect()
    }

    /// Recounts, per (Space, pack), the rows that point at it and their shares (for `fsck`).
    pub async fn pack_recount(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
    ) -> Result<Vec<(SpaceId, String, i64, i64)>, sqlx::Error> {
        let (filter, space_value) = space_filter(space);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT n.space_id, n.object_gen, COUNT(*) AS nodes, \
             CAST(COALESCE(SUM(n.stored_bytes), 0) AS BIGINT) AS bytes FROM nodes n \
             WHERE n.app_id = $1 {filter} AND n.pack_block_offset IS NOT NULL \
             GROUP BY n.space_id, n.object_gen"
        )))
        .bind(app.as_str())
        .bind(space_value)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            Ok((
                r.try_get::<String, _>("space_id")?
                    .parse()
                    .map_err(|_| decode_err("space_id", "?"))?,
                r.try_get("object_gen")?,
                r.try_get("nodes")?,
                r.try_get("bytes")?,
            ))
        })
        .collect()
    }
}

impl Partition {
    /// Takes the partition's packer lock for `holder` until `until`, unless another holder's
    /// has not run out. When taken, answers the packs a packer that lost its lock left
    /// `writing`: their objects may be partial, and no row points at them.
    pub async fn acquire_packer(
        &mut self,
        holder: &str,
        now: i64,
        until: i64,
    ) -> Result<Option<Vec<String>>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let current =
            sqlx::query("SELECT holder, until FROM packers WHERE app_id = $1 AND space_id = $2")
                .bind(app.as_str())
                .bind(space.as_str())
                .fetch_optional(&mut **self.tx())
                .await?;
        if let Some(r) = &current {
            let other: String = r.try_get("holder")?;
            let other_until: i64 = r.try_get("until")?;
            if other != holder && other_until > now {
                return Ok(None);
            }
        }
        sqlx::query(
            "INSERT INTO packers (app_id, space_id, holder, until) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (app_id, space_id) DO UPDATE SET holder = $3, until = $4",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(holder)
        .bind(until)
        .execute(&mut **self.tx())
        .await?;
        let writing = sqlx::query(
            "SELECT pack_id FROM packs WHERE app_id = $1 AND space_id = $2 AND state = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(PackState::Writing.as_str())
        .fetch_all(&mut **self.tx())
        .await?
        .iter()
        .map(|r| r.try_get("pack_id"))
        .collect::<Result<_, _>>()?;
        Ok(Some(writing))
    }

    /// Whether `holder` still holds the packer lock: nobody took it over, even if it ran out
    /// (a packer that took it over would have deleted this one's `writing` pack).
    pub async fn holds_packer(&mut self, holder: &str) -> Result<bool, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        Ok(sqlx::query(
            "SELECT 1 AS held FROM packers WHERE app_id = $1 AND space_id = $2 AND holder = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(holder)
        .fetch_optional(&mut **self.tx())
        .await?
        .is_some())
    }

    pub async fn release_packer(&mut self, holder: &str) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query("DELETE FROM packers WHERE app_id = $1 AND space_id = $2 AND holder = $3")
            .bind(app.as_str())
            .bind(space.as_str())
            .bind(holder)
            .execute(&mut **self.tx())
            .await?;
        Ok(())
    }

    /// Records a pack about to be written (before its object exists).
    pub async fn begin_pack(&mut self, pack_id: &str, now: i64) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "INSERT INTO packs (app_id, space_id, pack_id, state, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(pack_id)
        .bind(PackState::Writing.as_str())
        .bind(now)
        .execute(&mut **self.tx())
        .await?;
        Ok(())
    }

    /// Live packs no row points at any more: their objects can go.
    pub async fn dead_packs(&mut self) -> Result<Vec<String>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "SELECT pack_id FROM packs WHERE app_id = $1 AND space_id = $2 AND state = $3 \
             AND live_nodes = 0",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(PackState::Live.as_str())
        .fetch_all(&mut **self.tx())
        .await?
        .iter()
        .map(|r| r.try_get("pack_id"))
        .collect()
    }

    /// Forgets packs whose objects are gone: `writing` ones, and live ones no row points at.
    pub async fn forget_packs(&mut self, pack_ids: &[String]) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for id in pack_ids {
            sqlx::query(
                "DELETE FROM packs WHERE app_id = $1 AND space_id = $2 AND pack_id = $3 \
                 AND (state = $4 OR live_nodes = 0)",
            )
            .bind(app.as_str())
            .bind(space.as_str())
            .bind(id.as_str())
            .bind(PackState::Writing.as_str())
            .execute(&mut **self.tx())
            .await?;
        }
        Ok(())
    }

    /// Points the rows of `entries` at their entries of the pack `pack_id` (whose object of
    /// `object_bytes` is written), for each row that is still ready and still names the object
    /// it was read from, and whose kept delta base is still ready. Their previous objects are
    /// released, the usage row takes the new shares, and the pack goes live. Answers how many
    /// rows now point at the pack.
    pub async fn commit_pack(
        &mut self,
        pack_id: &str,
        object_bytes: i64,
        entries: &[PackedEntry],
        now: i64,
    ) -> Result<i64, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let (mut nodes, mut bytes) = (0i64, 0i64);
        let mut usage = UsageDelta::default();
        for e in entries {
            let Some(row) = self.node(&e.hash).await? else {
                continue;
            };
            if !row.is_ready() || row.object_gen != e.old_gen {
                continue;
            }
            // A base that GC marked lists its dependents after the mark: one packed as a delta
            // against it now would be missed.
            if let Some(d) = e.delta
                && !self.node(&d.hash).await?.is_some_and(|b| b.is_ready())
            {
                continue;
            }
            sqlx::query(
                "UPDATE nodes SET object_gen = $4, encoding = $5, stored_bytes = $6, \
                 delta_base = $7, delta_depth = $8, pack_block_offset = $9, \
                 pack_block_bytes = $10, pack_entry_offset = $11, pack_entry_bytes = $12, \
                 held_bytes = NULL, held = 0 WHERE app_id = $1 AND space_id = $2 AND hash = $3",
            )
            .bind(app.as_str())
            .bind(space.as_str())
            .bind(hb(&e.hash))
            .bind(pack_id)
            .bind(e.encoding.as_str())
            .bind(e.share)
            .bind(e.delta.map(|d| hb(&d.hash)))
            .bind(e.delta.map_or(0, |d| d.depth))
            .bind(e.span.block_offset)
            .bind(e.span.block_bytes)
            .bind(e.span.entry_offset)
            .bind(e.span.entry_bytes)
            .execute(&mut **self.tx())
            .await?;
            self.replace_apart(&row, None).await?;
            self.release_object(&row, now).await?;
            usage.ready_stored_bytes += e.share - row.stored_bytes;
            nodes += 1;
            bytes += e.share;
        }
        sqlx::query(
            "UPDATE packs SET state = $4, object_bytes = $5, live_nodes = $6, live_bytes = $7 \
             WHERE app_id = $1 AND space_id = $2 AND pack_id = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(pack_id)
        .bind(PackState::Live.as_str())
        .bind(object_bytes)
        .bind(nodes)
        .bind(bytes)
        .execute(&mut **self.tx())
        .await?;
        self.add_usage(usage).await?;
        Ok(nodes)
    }

    /// Lets go of the object a row pointed at, now that it points elsewhere: a node's own
    /// object is queued for deletion by the next GC pass, a pack loses the entry (bytes the
    /// row held went with the update that moved it).
    pub(super) async fn release_object(
        &mut self,
        row: &NodeRow,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        match row.pack {
            Some(_) => self.leave_pack(row).await,
            None if row.held => Ok(()),
            None => self.retire_object(&row.hash, &row.object_gen, now).await,
        }
    }

    /// For a packed row that is going away or moving: its pack counts it no longer.
    pub(super) async fn leave_pack(&mut self, row: &NodeRow) -> Result<(), sqlx::Error> {
        if row.pack.is_none() {
            return Ok(());
        }
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "UPDATE packs SET live_nodes = live_nodes - 1, live_bytes = live_bytes - $4 \
             WHERE app_id = $1 AND space_id = $2 AND pack_id = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(row.object_gen.as_str())
        .bind(row.stored_bytes)
        .execute(&mut **self.tx())
        .await?;
        Ok(())
    }
}
