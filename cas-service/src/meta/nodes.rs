//! Node rows and ordered edges: what publishing a node writes (its upload generations are
//! in `generations`).

use std::collections::{HashMap, HashSet};

use cas_format::{AppId, Hash, SpaceId};
use sqlx::Row;
use sqlx::any::AnyRow;

use super::generations::decode_err;
use super::{MetaStore, Partition, ROWS_PER_STATEMENT, Value, hash_col, hb};
use crate::blob::Encoding;

/// A node row. Presence without `collecting_since` is readiness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub hash: Hash,
    pub size: i64,
    pub content_type: String,
    pub ref_count: i64,
    pub object_gen: String,
    pub encoding: Encoding,
    pub stored_bytes: i64,
    pub lease_started_at: i64,
    pub lease_expires_at: i64,
    pub child_ref_count: i64,
    /// Its root ref count (the sum of its balances over domains, which are read from them) is
    /// above zero: what garbage collection reads, written only when the sum goes to or from
    /// zero.
    pub rooted: bool,
    pub collecting_since: Option<i64>,
    /// For a delta object: the node whose content it needs, and the chain's depth.
    pub delta: Option<DeltaBase>,
    /// For a packed node: where its entry is in the pack that `object_gen` names.
    pub pack: Option<PackSpan>,
    /// Its stored bytes are held in the database with the row (a small node not packed yet),
    /// not in an object.
    pub held: bool,
}

/// Where a packed node's entry is: a block (one zstd frame) of the pack object, and the entry's
/// bytes in the block's content. The entry holds the node's own content in the row's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackSpan {
    pub block_offset: i64,
    pub block_bytes: i64,
    pub entry_offset: i64,
    pub entry_bytes: i64,
}

impl NodeRow {
    pub fn is_ready(&self) -> bool {
        self.collecting_since.is_none()
    }

    /// How the row's object holds the content.
    pub fn stored(&self) -> StoredObject {
        StoredObject {
            encoding: self.encoding,
            stored_bytes: self.stored_bytes,
            delta: self.delta,
            held: None,
        }
    }

    /// Where the own content starts in its object: after the header of a portable object,
    /// else at its start.
    pub fn content_offset(&self) -> u64 {
        match self.encoding {
            Encoding::Portable => self.stored_bytes.saturating_sub(self.size).max(0) as u64,
            _ => 0,
        }
    }

    /// Whether its stored bytes are an object of its own (not a pack entry, not held).
    pub fn own_object(&self) -> bool {
        self.pack.is_none() && !self.held
    }
}

/// The base a delta object is decoded with: a node of the same partition, and how many bases
/// a read of the delta goes through (1 when the base stands alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaBase {
    pub hash: Hash,
    pub depth: i64,
}

/// How an object holds a node's own content: what the row records about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub encoding: Encoding,
    pub stored_bytes: i64,
    /// Set exactly when `encoding` is [`Encoding::ZstdDelta`].
    pub delta: Option<DeltaBase>,
    /// The stored bytes themselves when the row holds them (no object was written).
    pub held: Option<bytes::Bytes>,
}

impl StoredObject {
    /// The row's `held` flag.
    pub(super) fn held_flag(&self) -> i64 {
        i64::from(self.held.is_some())
    }

    /// Held bytes small enough to be kept in the row itself.
    pub(super) fn held_in_row(&self) -> Option<Vec<u8>> {
        self.held
            .as_ref()
            .filter(|b| b.len() <= HELD_IN_ROW_MAX)
            .map(|b| b.to_vec())
    }

    /// Held bytes kept apart from the row (`held_apart`).
    pub(super) fn held_apart(&self) -> Option<&[u8]> {
        self.held.as_deref().filter(|b| b.len() > HELD_IN_ROW_MAX)
    }

    pub(super) fn base_column(&self) -> Option<Vec<u8>> {
        self.delta.map(|d| hb(&d.hash))
    }

    pub(super) fn depth(&self) -> i64 {
        self.delta.map_or(0, |d| d.depth)
    }
}

/// Held bytes up to this size are kept in the node's row (they fit in its page); larger ones
/// in `held_apart`, so that updates of the row's small columns do not read and rewrite them.
/// The migration `0010_large_held_bytes_apart` split the rows of earlier versions at this size.
pub(super) const HELD_IN_ROW_MAX: usize = 2048;

pub(crate) const NODE_COLUMNS: &str = "hash, size, content_type, ref_count, object_gen, encoding, stored_bytes, \
     lease_started_at, lease_expires_at, child_ref_count, CAST(rooted AS BIGINT) AS rooted, \
     collecting_since, \
     delta_base, delta_depth, pack_block_offset, pack_block_bytes, pack_entry_offset, \
     pack_entry_bytes, CAST(held AS BIGINT) AS held";

pub(crate) fn node_from_row(row: &AnyRow) -> Result<NodeRow, sqlx::Error> {
    Ok(NodeRow {
        hash: hash_col(row, "hash")?,
        size: row.try_get("size")?,
        content_type: row.try_get("content_type")?,
        ref_count: row.try_get("ref_count")?,
        object_gen: row.try_get("object_gen")?,
        encoding: {
            let e: String = row.try_get("encoding")?;
            Encoding::parse(&e).ok_or_else(|| decode_err("encoding", &e))?
        },
        stored_bytes: row.try_get("stored_bytes")?,
        lease_started_at: row.try_get("lease_started_at")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        child_ref_count: row.try_get("child_ref_count")?,
        rooted: row.try_get::<i64, _>("rooted")? != 0,
        collecting_since: row.try_get("collecting_since")?,
        delta: {
            let base: Option<Vec<u8>> = row.try_get("delta_base")?;
            match base {
                None => None,
                Some(b) => Some(DeltaBase {
                    hash: Hash::from_slice(&b).ok_or_else(|| decode_err("delta_base", "?"))?,
                    depth: row.try_get("delta_depth")?,
                }),
            }
        },
        pack: {
            let block_offset: Option<i64> = row.try_get("pack_block_offset")?;
            match block_offset {
                None => None,
                Some(block_offset) => Some(PackSpan {
                    block_offset,
                    block_bytes: row.try_get("pack_block_bytes")?,
                    entry_offset: row.try_get("pack_entry_offset")?,
                    entry_bytes: row.try_get("pack_entry_bytes")?,
                }),
            }
        },
        held: row.try_get::<i64, _>("held")? != 0,
    })
}

/// The result of trying to publish a node from a validated generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalizeOutcome {
    /// The row was committed (or a row being collected was made ready again).
    Published { started: i64, expires: i64 },
    /// Another request published it first; its lease was extended.
    AlreadyReady { started: i64, expires: i64 },
    /// These distinct children are not ready (nothing was written).
    MissingChildren(Vec<Hash>),
    /// The generation was retired meanwhile (nothing was written).
    GenerationGone,
    /// The object is a delta whose base is no longer ready (nothing was written): store it
    /// standalone and try again.
    DeltaBaseGone,
}

impl MetaStore {
    /// A node row, ready or being collected.
    pub async fn node(
        &self,
        app: &cas_format::AppId,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<Option<NodeRow>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE app_id = $1 AND space_id = $2 AND hash = $3"
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(node_from_row)
        .transpose()
    }

    /// The stored bytes a row holds, if it still names `object_gen` and holds them.
    pub async fn held_bytes(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        object_gen: &str,
    ) -> Result<Option<Vec<u8>>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT COALESCE(n.held_bytes, h.bytes) AS bytes FROM nodes n \
             LEFT JOIN held_apart h ON h.app_id = n.app_id AND h.space_id = n.space_id \
             AND h.hash = n.hash WHERE n.app_id = $1 AND n.space_id = $2 AND n.hash = $3 \
             AND n.object_gen = $4",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .bind(object_gen)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(r) => r.try_get("bytes"),
            None => Ok(None),
        }
    }

    /// A node's root ref count: the sum of its balances over domains.
    pub async fn root_ref_count(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query(
            "SELECT CAST(COALESCE(SUM(ref_count), 0) AS BIGINT) AS n FROM root_ref_balances \
             WHERE app_id = $1 AND space_id = $2 AND hash = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .fetch_one(&self.pool)
        .await?
        .try_get("n")
    }

    /// The ordered refs of a node.
    pub async fn node_refs(
        &self,
        app: &cas_format::AppId,
        space: &SpaceId,
        hash: &Hash,
    ) -> Result<Vec<Hash>, sqlx::Error> {
        sqlx::query(
            "SELECT child FROM edges WHERE app_id = $1 AND space_id = $2 AND parent = $3 ORDER BY ord",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| hash_col(r, "child"))
        .collect()
    }
}

impl Partition {
    pub async fn node(&mut self, hash: &Hash) -> Result<Option<NodeRow>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {NODE_COLUMNS} FROM nodes WHERE app_id = $1 AND space_id = $2 AND hash = $3"
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .fetch_optional(&mut **self.tx())
        .await?
        .as_ref()
        .map(node_from_row)
        .transpose()
    }

    /// The rows of the distinct nodes among `hashes` that have one, ready or being collected.
    pub async fn nodes(&mut self, hashes: &[Hash]) -> Result<HashMap<Hash, NodeRow>, sqlx::Error> {
        self.rows_by_hashes(hashes, |a, s, list| {
            format!(
                "SELECT {NODE_COLUMNS} FROM nodes WHERE app_id = {a} AND space_id = {s} \
                 AND hash IN ({list})"
            )
        })
        .await?
        .iter()
        .map(|r| node_from_row(r).map(|row| (row.hash, row)))
        .collect()
    }

    /// Sets a ready node's lease window.
    pub async fn set_lease(
        &mut self,
        hash: &Hash,
        started: i64,
        expires: i64,
    ) -> Result<(), sqlx::Error> {
        self.set_leases(&[(*hash, started, expires)]).await
    }

    /// Sets the lease windows `(hash, started, expires)` of distinct ready nodes.
    pub async fn set_leases(&mut self, leases: &[(Hash, i64, i64)]) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for part in leases.chunks(ROWS_PER_STATEMENT) {
            let mut q = self.statement();
            q.update_nodes(
                (app.as_str(), space.as_str()),
                "lease_started_at = v.column2, lease_expires_at = v.column3",
                part.iter().map(|(hash, started, expires)| {
                    (*hash, vec![Value::Int(*started), Value::Int(*expires)])
                }),
            );
            q.query().execute(&mut **self.tx()).await?;
        }
        Ok(())
    }

    /// The distinct refs among `refs` that are not ready, in order of first occurrence.
    pub async fn missing_children(&mut self, refs: &[Hash]) -> Result<Vec<Hash>, sqlx::Error> {
        let ready = self
            .rows_by_hashes(refs, |a, s, list| {
                format!(
                    "SELECT hash FROM nodes WHERE app_id = {a} AND space_id = {s} \
                     AND collecting_since IS NULL AND hash IN ({list})"
                )
            })
            .await?
            .iter()
            .map(|r| hash_col(r, "hash"))
            .collect::<Result<HashSet<Hash>, _>>()?;
        let mut seen = HashSet::new();
        Ok(refs
            .iter()
            .copied()
            .filter(|h| seen.insert(*h) && !ready.contains(h))
            .collect())
    }

    /// Queues a node's superseded object for deletion by the next GC pass.
    pub(super) async fn retire_object(
        &mut self,
        hash: &Hash,
        object_gen: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        sqlx::query(
            "INSERT INTO retired_objects (app_id, space_id, hash, object_gen, retired_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(hash))
        .bind(object_gen)
        .bind(now)
        .execute(&mut **self.tx())
        .await?;
        Ok(())
    }
}
