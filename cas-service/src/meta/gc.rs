//! Garbage-collection steps that touch the database: marking eligible rows as being collected,
//! sweeping marked rows once their objects are gone, and retiring upload generations.

use cas_format::Hash;
use sqlx::Row;

use super::generations::{GEN_COLUMNS, GenState, Generation, generation_from_row};
use super::usage::UsageDelta;
use super::{Partition, hash_col, hb};

/// A row marked as being collected, with what its sweep needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marked {
    pub hash: Hash,
    pub object_gen: String,
    pub size: i64,
    /// It has an object of its own (to delete), not an entry in a pack (whose object GC leaves
    /// to the packer) nor held bytes (which go with its row).
    pub own_object: bool,
}

/// A generation whose objects GC deletes before forgetting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetiringGeneration {
    pub generation: Generation,
    /// The objects its publication attempts may have written (none for a published one: its
    /// publication queued the others for deletion).
    pub objects: Vec<String>,
}

/// Whether a marked row has an object of its own.
fn own_object(r: &sqlx::any::AnyRow) -> Result<bool, sqlx::Error> {
    Ok(r.try_get::<Option<i64>, _>("pack_block_offset")?.is_none()
        && r.try_get::<i64, _>("held")? == 0)
}

impl Partition {
    /// Step 1: rechecks eligibility under the gate and marks up to `max` rows as being
    /// collected (from now on they are not ready). Also returns rows a crashed pass left marked
    /// before `stale_before`. Returns how many rows were examined and the marked rows.
    pub async fn mark_for_collection(
        &mut self,
        now: i64,
        stale_before: i64,
        max: i64,
    ) -> Result<(u64, Vec<Marked>), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let leftovers = sqlx::query(
            "SELECT hash, object_gen, size, pack_block_offset, \
             CAST(held AS BIGINT) AS held \
             FROM nodes WHERE app_id = $1 AND space_id = $2 \
             AND collecting_since IS NOT NULL AND collecting_since <= $3 LIMIT $4",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(stale_before)
        .bind(max)
        .fetch_all(&mut **self.tx())
        .await?;
        let candidates = sqlx::query(
            "SELECT hash, object_gen, size, stored_bytes, pack_block_offset, \
             CAST(held AS BIGINT) AS held FROM nodes n \
             WHERE app_id = $1 AND space_id = $2 AND child_ref_count = 0 AND rooted = 0 \
             AND collecting_since IS NULL AND lease_expires_at <= $3 \
             AND (SELECT COALESCE(SUM(b.ref_count), 0) FROM root_ref_balances b \
               WHERE b.app_id = n.app_id AND b.space_id = n.space_id AND b.hash = n.hash) <= 0 \
             AND NOT EXISTS (SELECT 1 FROM upload_generations g WHERE g.app_id = n.app_id \
               AND g.space_id = n.space_id AND g.hash = n.hash \
               AND g.state IN ('awaiting_upload', 'validated') AND g.expires_at > $3) \
             ORDER BY lease_expires_at LIMIT $4",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(now)
        .bind(max)
        .fetch_all(&mut **self.tx())
        .await?;
        let mut marked = Vec::with_capacity(leftovers.len() + candidates.len());
        for r in &leftovers {
            marked.push(Marked {
                hash: hash_col(r, "hash")?,
                object_gen: r.try_get("object_gen")?,
                size: r.try_get("size")?,
                own_object: own_object(r)?,
            });
        }
        let mut delta = UsageDelta::default();
        let mut fresh = Vec::with_capacity(candidates.len());
        for r in &candidates {
            let m = Marked {
                hash: hash_col(r, "hash")?,
                object_gen: r.try_get("object_gen")?,
                size: r.try_get("size")?,
                own_object: own_object(r)?,
            };
            let stored: i64 = r.try_get("stored_bytes")?;
            delta.not_ready_node_count += 1;
            delta.ready_content_bytes -= m.size;
            delta.ready_stored_bytes -= stored;
            fresh.push(m.hash);
            marked.push(m);
        }
        if !fresh.is_empty() {
            let mut b = self.binds();
            let (since, a, s) = (b.one(), b.one(), b.one());
            let hashes = b.list(fresh.len());
            let sql = format!(
                "UPDATE nodes SET collecting_since = {since} WHERE app_id = {a} \
                 AND space_id = {s} AND collecting_since IS NULL AND hash IN ({hashes})"
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(now)
                .bind(app.as_str())
                .bind(space.as_str());
            for h in &fresh {
                q = q.bind(hb(h));
            }
            q.execute(&mut **self.tx()).await?;
            self.add_usage(delta).await?;
        }
        Ok(((leftovers.len() + candidates.len()) as u64, marked))
    }

    /// Step 3, once the objects are deleted: for each row still marked with the same object,
    /// deletes its edges, decrements its children (a count that would go negative aborts the
    /// whole transaction) and deletes the row. Returns rows deleted and their content bytes.
    pub async fn sweep(&mut self, marked: &[Marked]) -> Result<(u64, u64), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let mut deleted = 0u64;
        let mut reclaimed = 0u64;
        for m in marked {
            let Some(row) = self.node(&m.hash).await? else {
                continue;
            };
            if row.is_ready() || row.object_gen != m.object_gen {
                // Made ready again by a re-upload: not ours to delete.
                continue;
            }
            let children = sqlx::query(
                "SELECT child, COUNT(*) AS n FROM edges WHERE app_id = $1 AND space_id = $2 \
                 AND parent = $3 GROUP BY child",
            )
            .bind(app.as_str())
            .bind(space.as_str())
            .bind(hb(&m.hash))
            .fetch_all(&mut **self.tx())
            .await?;
            sqlx::query("DELETE FROM edges WHERE app_id = $1 AND space_id = $2 AND parent = $3")
                .bind(app.as_str())
                .bind(space.as_str())
                .bind(hb(&m.hash))
                .execute(&mut **self.tx())
                .await?;
            let counts = children
                .iter()
                .map(|c| Ok((hash_col(c, "child")?, -c.try_get::<i64, _>("n")?)))
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            self.add_child_refs(&counts).await?;
            sqlx::query("DELETE FROM nodes WHERE app_id = $1 AND space_id = $2 AND hash = $3")
                .bind(app.as_str())
                .bind(space.as_str())
                .bind(hb(&m.hash))
                .execute(&mut **self.tx())
                .await?;
            self.leave_pack(&row).await?;
            self.add_usage(UsageDelta {
                node_count: -1,
                not_ready_node_count: -1,
                ..Default::default()
            })
            .await?;
            deleted += 1;
            reclaimed += row.size as u64;
        }
        Ok((deleted, reclaimed))
    }

    /// Retires expired active generations (releasing their reservations) and returns up to
    /// `max` generations whose objects GC should now delete: retired ones, expired ones, and
    /// published ones whose upload URL can no longer be used.
    pub async fn retiring_generations(
        &mut self,
        now: i64,
        max: i64,
    ) -> Result<Vec<RetiringGeneration>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {GEN_COLUMNS} FROM upload_generations WHERE app_id = $1 AND space_id = $2 \
             AND ((state IN ('published', 'retired') AND url_expires_at <= $3) \
               OR (state IN ('awaiting_upload', 'validated') AND expires_at <= $3)) \
             ORDER BY expires_at LIMIT $4"
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(now)
        .bind(max)
        .fetch_all(&mut **self.tx())
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let g = generation_from_row(r)?;
            if g.state.is_active() {
                self.retire_generation(&g).await?;
            }
            // (Publication queued the other attempts' objects for deletion.)
            let objects = if g.state != GenState::Published {
                g.attempt_objects().collect()
            } else {
                Vec::new()
            };
            out.push(RetiringGeneration {
                objects,
                generation: g,
            });
        }
        Ok(out)
    }

    /// Forgets generations whose objects are gone.
    pub async fn forget_generations(&mut self, gen_ids: &[String]) -> Result<(), sqlx::Error> {
        for id in gen_ids {
            sqlx::query(
                "DELETE FROM upload_generations WHERE gen_id = $1 AND state IN ('published', 'retired')",
            )
            .bind(id.as_str())
            .execute(&mut **self.tx())
            .await?;
            sqlx::query("DELETE FROM upload_bodies WHERE gen_id = $1")
                .bind(id.as_str())
                .execute(&mut **self.tx())
                .await?;
        }
        Ok(())
    }

    /// Objects superseded by a re-publication, up to `max`.
    pub async fn retired_objects(&mut self, max: i64) -> Result<Vec<(Hash, String)>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "SELECT hash, object_gen FROM retired_objects WHERE app_id = $1 AND space_id = $2 LIMIT $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(max)
        .fetch_all(&mut **self.tx())
        .await?
        .iter()
        .map(|r| Ok((hash_col(r, "hash")?, r.try_get("object_gen")?)))
        .collect()
    }

    pub async fn forget_retired_objects(
        &mut self,
        objects: &[(Hash, String)],
    ) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for (hash, object_gen) in objects {
            sqlx::query(
                "DELETE FROM retired_objects WHERE app_id = $1 AND space_id = $2 AND hash = $3 \
                 AND object_gen = $4",
            )
            .bind(app.as_str())
            .bind(space.as_str())
            .bind(hb(hash))
            .bind(object_gen.as_str())
            .execute(&mut **self.tx())
            .await?;
        }
        Ok(())
    }
}

/// What is outstanding across the store, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Nodes whose lease has not run out.
    pub leased_nodes: i64,
    /// Upload generations awaiting an upload or their children.
    pub upload_slots: i64,
    /// Nodes nothing references whose lease has run out: what GC has yet to take.
    pub gc_eligible: i64,
    /// When the longest-waiting of them became eligible (its lease ran out).
    pub gc_oldest_since: Option<i64>,
}

impl super::MetaStore {
    /// Counts what is outstanding at `now` (three counting queries over the whole store).
    pub async fn backlog(&self, now: i64) -> Result<Backlog, sqlx::Error> {
        let leased_nodes: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE lease_expires_at > $1")
                .bind(now)
                .fetch_one(&self.pool)
                .await?
                .try_get("n")?;
        let upload_slots: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM upload_generations \
             WHERE state IN ('awaiting_upload', 'validated') AND expires_at > $1",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, MIN(lease_expires_at) AS since FROM nodes \
             WHERE child_ref_count = 0 AND rooted = 0 AND lease_expires_at <= $1",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok(Backlog {
            leased_nodes,
            upload_slots,
            gc_eligible: row.try_get("n")?,
            gc_oldest_since: row.try_get("since")?,
        })
    }
}
