//! Read-only queries for consistency checks (`fsck` and tests): they scan, so they are never on
//! a request path.

use std::collections::BTreeMap;

use cas_format::{AppId, Hash, SpaceId};
use sqlx::Row;

use super::generations::{GEN_COLUMNS, generation_from_row};
use super::nodes::{NODE_COLUMNS, node_from_row};
use super::{BalanceMap, Generation, MetaStore, NodeRow, hash_col, hb, id_col};

/// A count that disagrees with the rows it counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountMismatch {
    pub space: SpaceId,
    pub hash: Hash,
    pub recorded: i64,
    pub counted: i64,
}

/// An edge whose parent or child has no row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DanglingEdge {
    pub space: SpaceId,
    pub parent: Hash,
    pub child: Hash,
    pub missing: &'static str,
}

/// A [`CountMismatch`] from a row of `space_id`, `hash`, `recorded` and `counted`.
fn mismatch_from_row(r: &sqlx::any::AnyRow) -> Result<CountMismatch, sqlx::Error> {
    Ok(CountMismatch {
        space: id_col(r, "space_id")?,
        hash: hash_col(r, "hash")?,
        recorded: r.try_get("recorded")?,
        counted: r.try_get("counted")?,
    })
}

pub(super) fn space_filter(space: Option<&SpaceId>) -> (&'static str, String) {
    match space {
        Some(s) => ("AND n.space_id = $2", s.as_str().to_string()),
        None => ("AND $2 = $2", String::new()),
    }
}

impl MetaStore {
    /// Node rows of an App (or one Space) after `after` = (space, hash), ordered, at most `limit`.
    pub async fn nodes_page(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
        after: Option<(&SpaceId, &Hash)>,
        limit: i64,
    ) -> Result<Vec<(SpaceId, NodeRow)>, sqlx::Error> {
        let (filter, space_value) = space_filter(space);
        let (after_space, after_hash) = match after {
            Some((s, h)) => (s.as_str().to_string(), hb(h)),
            None => (String::new(), Vec::new()),
        };
        // One table: its columns need no qualifier.
        let sql = format!(
            "SELECT n.space_id, {NODE_COLUMNS} FROM nodes n WHERE n.app_id = $1 {filter} \
             AND (n.space_id > $3 OR (n.space_id = $3 AND n.hash > $4)) \
             ORDER BY n.space_id, n.hash LIMIT $5"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(app.as_str())
            .bind(space_value)
            .bind(after_space)
            .bind(after_hash)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| Ok((id_col(r, "space_id")?, node_from_row(r)?)))
            .collect()
    }

    /// Rows whose `child_ref_count` differs from the edges that point at them.
    pub async fn child_count_mismatches(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
    ) -> Result<Vec<CountMismatch>, sqlx::Error> {
        self.count_mismatches(app, space, "child_ref_count", "e.child")
            .await
    }

    /// Rows whose `ref_count` differs from their own edges.
    pub async fn ref_count_mismatches(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
    ) -> Result<Vec<CountMismatch>, sqlx::Error> {
        self.count_mismatches(app, space, "ref_count", "e.parent")
            .await
    }

    async fn count_mismatches(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
        column: &str,
        edge_side: &str,
    ) -> Result<Vec<CountMismatch>, sqlx::Error> {
        let (filter, space_value) = space_filter(space);
        let sql = format!(
            "SELECT space_id, hash, recorded, counted FROM (SELECT n.space_id, n.hash, \
             n.{column} AS recorded, (SELECT COUNT(*) FROM edges e WHERE e.app_id = n.app_id \
             AND e.space_id = n.space_id AND {edge_side} = n.hash) AS counted \
             FROM nodes n WHERE n.app_id = $1 {filter}) c WHERE recorded <> counted \
             ORDER BY space_id, hash"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(app.as_str())
            .bind(space_value)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(mismatch_from_row)
            .collect()
    }

    /// Edges whose parent or child has no node row.
    pub async fn dangling_edges(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
    ) -> Result<Vec<DanglingEdge>, sqlx::Error> {
        let filter = if space.is_some() {
            "AND e.space_id = $2"
        } else {
            "AND $2 = $2"
        };
        let space_value = space.map(|s| s.as_str().to_string()).unwrap_or_default();
        let mut out = Vec::new();
        for (side, missing) in [("e.child", "child"), ("e.parent", "parent")] {
            let sql = format!(
                "SELECT e.space_id, e.parent, e.child FROM edges e WHERE e.app_id = $1 {filter} \
                 AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.app_id = e.app_id \
                 AND n.space_id = e.space_id AND n.hash = {side})"
            );
            for r in sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(app.as_str())
                .bind(space_value.clone())
                .fetch_all(&self.pool)
                .await?
            {
                out.push(DanglingEdge {
                    space: id_col(&r, "space_id")?,
                    parent: hash_col(&r, "parent")?,
                    child: hash_col(&r, "child")?,
                    missing,
                });
            }
        }
        Ok(out)
    }

    /// The balance rows of an App (all current), by (space, domain, hash).
    pub async fn current_balances(&self, app: &AppId) -> Result<BalanceMap, sqlx::Error> {
        sqlx::query(
            "SELECT space_id, ref_domain, hash, ref_count FROM root_ref_balances WHERE app_id = $1",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            let key = (
                r.try_get("space_id")?,
                id_col(r, "ref_domain")?,
                hash_col(r, "hash")?,
            );
            Ok((key, r.try_get("ref_count")?))
        })
        .collect()
    }

    /// Root ref counts of an App (each the sum of a node's balances over domains) that are not
    /// zero although the node has no row: a node collected while referenced.
    pub async fn root_counts_without_node(
        &self,
        app: &AppId,
    ) -> Result<BTreeMap<(String, Hash), i64>, sqlx::Error> {
        sqlx::query(
            "SELECT b.space_id, b.hash, CAST(SUM(b.ref_count) AS BIGINT) AS n \
             FROM root_ref_balances b WHERE b.app_id = $1 AND NOT EXISTS (SELECT 1 FROM nodes n \
             WHERE n.app_id = b.app_id AND n.space_id = b.space_id AND n.hash = b.hash) \
             GROUP BY b.space_id, b.hash HAVING SUM(b.ref_count) <> 0",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            Ok((
                (r.try_get("space_id")?, hash_col(r, "hash")?),
                r.try_get("n")?,
            ))
        })
        .collect()
    }

    /// Nodes of an App whose `rooted` flag (what garbage collection reads) disagrees with their
    /// root ref count, the sum of their balances: `recorded` is the flag, `counted` the count.
    pub async fn rooted_mismatches(&self, app: &AppId) -> Result<Vec<CountMismatch>, sqlx::Error> {
        sqlx::query(
            "SELECT space_id, hash, recorded, counted FROM (SELECT n.space_id, n.hash, \
             CAST(n.rooted AS BIGINT) AS recorded, (SELECT CAST(COALESCE(SUM(b.ref_count), 0) \
             AS BIGINT) FROM root_ref_balances b WHERE b.app_id = n.app_id \
             AND b.space_id = n.space_id AND b.hash = n.hash) AS counted \
             FROM nodes n WHERE n.app_id = $1) c \
             WHERE recorded <> CASE WHEN counted > 0 THEN 1 ELSE 0 END",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(mismatch_from_row)
        .collect()
    }

    /// Rows of an App whose `held` flag (`recorded`) disagrees with how many places hold
    /// their bytes (`counted`: the row itself and `held_apart`; exactly one when held).
    pub async fn held_mismatches(&self, app: &AppId) -> Result<Vec<CountMismatch>, sqlx::Error> {
        sqlx::query(
            "SELECT space_id, hash, recorded, counted FROM (SELECT n.space_id, n.hash, \
             CAST(n.held AS BIGINT) AS recorded, (SELECT CAST(COUNT(*) AS BIGINT) \
             FROM held_apart h WHERE h.app_id = n.app_id AND h.space_id = n.space_id \
             AND h.hash = n.hash) + CASE WHEN n.held_bytes IS NULL THEN 0 ELSE 1 END AS counted \
             FROM nodes n WHERE n.app_id = $1) c \
             WHERE recorded <> counted",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(mismatch_from_row)
        .collect()
    }

    /// Spaces of an App that have a usage row or node rows.
    pub async fn spaces(&self, app: &AppId) -> Result<Vec<SpaceId>, sqlx::Error> {
        sqlx::query(
            "SELECT space_id FROM space_usage WHERE app_id = $1 UNION SELECT space_id FROM nodes WHERE app_id = $1 ORDER BY space_id",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| id_col(r, "space_id"))
        .collect()
    }

    /// Every upload generation of an App (or one Space), by id.
    pub async fn generations(
        &self,
        app: &AppId,
        space: Option<&SpaceId>,
    ) -> Result<BTreeMap<String, (SpaceId, Generation)>, sqlx::Error> {
        let (filter, space_value) = match space {
            Some(s) => ("AND space_id = $2", s.as_str().to_string()),
            None => ("AND $2 = $2", String::new()),
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {GEN_COLUMNS} FROM upload_generations WHERE app_id = $1 {filter}"
        )))
        .bind(app.as_str())
        .bind(space_value)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| {
            let g = generation_from_row(r)?;
            Ok((g.gen_id.clone(), (id_col(r, "space_id")?, g)))
        })
        .collect()
    }

    /// Objects queued for deletion after a re-publication, as (space, hash, generation).
    pub async fn queued_object_deletions(
        &self,
        app: &AppId,
    ) -> Result<Vec<(SpaceId, Hash, String)>, sqlx::Error> {
        sqlx::query("SELECT space_id, hash, object_gen FROM retired_objects WHERE app_id = $1")
            .bind(app.as_str())
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                Ok((
                    id_col(r, "space_id")?,
                    hash_col(r, "hash")?,
                    r.try_get("object_gen")?,
                ))
            })
            .collect()
    }
}
