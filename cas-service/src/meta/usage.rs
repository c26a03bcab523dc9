//! The per-(App, Space) usage row, changed in the same transactions that change nodes,
//! reservations and stored bytes, so an App total is a sum over Spaces.

use cas_format::wire::Usage;
use cas_format::{AppId, SpaceId};
use sqlx::{Any, Row, Transaction};

use super::MetaStore;

/// A change to a usage row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsageDelta {
    pub node_count: i64,
    pub not_ready_node_count: i64,
    pub ready_content_bytes: i64,
    pub ready_stored_bytes: i64,
    pub reserved_bytes: i64,
}

impl std::ops::AddAssign for UsageDelta {
    fn add_assign(&mut self, d: UsageDelta) {
        self.node_count += d.node_count;
        self.not_ready_node_count += d.not_ready_node_count;
        self.ready_content_bytes += d.ready_content_bytes;
        self.ready_stored_bytes += d.ready_stored_bytes;
        self.reserved_bytes += d.reserved_bytes;
    }
}

impl UsageDelta {
    pub fn is_zero(&self) -> bool {
        *self == UsageDelta::default()
    }
}

async fn apply(
    tx: &mut Transaction<'static, Any>,
    app: &AppId,
    space: &SpaceId,
    d: UsageDelta,
) -> Result<(), sqlx::Error> {
    if d.is_zero() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO space_usage (app_id, space_id, node_count, not_ready_node_count, \
         ready_content_bytes, ready_stored_bytes, reserved_bytes) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (app_id, space_id) DO UPDATE SET \
         node_count = space_usage.node_count + excluded.node_count, \
         not_ready_node_count = space_usage.not_ready_node_count + excluded.not_ready_node_count, \
         ready_content_bytes = space_usage.ready_content_bytes + excluded.ready_content_bytes, \
         ready_stored_bytes = space_usage.ready_stored_bytes + excluded.ready_stored_bytes, \
         reserved_bytes = space_usage.reserved_bytes + excluded.reserved_bytes",
    )
    .bind(app.as_str())
    .bind(space.as_str())
    .bind(d.node_count)
    .bind(d.not_ready_node_count)
    .bind(d.ready_content_bytes)
    .bind(d.ready_stored_bytes)
    .bind(d.reserved_bytes)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn usage_from_row(row: &sqlx::any::AnyRow, leased: i64) -> Result<Usage, sqlx::Error> {
    Ok(Usage {
        node_count: row.try_get("node_count")?,
        ready_content_bytes: row.try_get("ready_content_bytes")?,
        ready_stored_bytes: row.try_get("ready_stored_bytes")?,
        reserved_bytes: row.try_get("reserved_bytes")?,
        not_ready_node_count: row.try_get("not_ready_node_count")?,
        leased_node_count: leased,
    })
}

impl MetaStore {
    /// The usage of one Space. `leasedNodeCount` depends on the clock, so it is counted from
    /// the lease index rather than kept in the row.
    pub async fn usage(
        &self,
        app: &AppId,
        space: &SpaceId,
        now: i64,
    ) -> Result<Usage, sqlx::Error> {
        let leased: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM nodes WHERE app_id = $1 AND space_id = $2 AND lease_expires_at > $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(now)
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        let row = sqlx::query(
            "SELECT node_count, not_ready_node_count, ready_content_bytes, ready_stored_bytes, \
             reserved_bytes FROM space_usage WHERE app_id = $1 AND space_id = $2",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .fetch_optional(&self.pool)
        .await?;
        match row {
            Some(row) => usage_from_row(&row, leased),
            None => Ok(Usage {
                leased_node_count: leased,
                ..Usage::default()
            }),
        }
    }

    /// The App total: a sum over its Space rows (no Space identity in the answer).
    pub async fn app_usage(&self, app: &AppId, now: i64) -> Result<Usage, sqlx::Error> {
        let leased: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM nodes WHERE app_id = $1 AND lease_expires_at > $2",
        )
        .bind(app.as_str())
        .bind(now)
        .fetch_one(&self.pool)
        .await?
        .try_get("n")?;
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(node_count), 0) AS BIGINT) AS node_count, \
             CAST(COALESCE(SUM(not_ready_node_count), 0) AS BIGINT) AS not_ready_node_count, \
             CAST(COALESCE(SUM(ready_content_bytes), 0) AS BIGINT) AS ready_content_bytes, \
             CAST(COALESCE(SUM(ready_stored_bytes), 0) AS BIGINT) AS ready_stored_bytes, \
             CAST(COALESCE(SUM(reserved_bytes), 0) AS BIGINT) AS reserved_bytes \
             FROM space_usage WHERE app_id = $1",
        )
        .bind(app.as_str())
        .fetch_one(&self.pool)
        .await?;
        usage_from_row(&row, leased)
    }

    /// A recount of the usage row from the node and generation rows (for checks: it scans).
    pub async fn recount_usage(
        &self,
        app: &AppId,
        space: &SpaceId,
    ) -> Result<UsageDelta, sqlx::Error> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS node_count, \
             CAST(COALESCE(SUM(CASE WHEN collecting_since IS NULL THEN 0 ELSE 1 END), 0) AS BIGINT) AS not_ready, \
             CAST(COALESCE(SUM(CASE WHEN collecting_since IS NULL THEN size ELSE 0 END), 0) AS BIGINT) AS content, \
             CAST(COALESCE(SUM(CASE WHEN collecting_since IS NULL THEN stored_bytes ELSE 0 END), 0) AS BIGINT) AS stored \
             FROM nodes WHERE app_id = $1 AND space_id = $2",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .fetch_one(&self.pool)
        .await?;
        let reserved: i64 = sqlx::query(
            "SELECT CAST(COALESCE(SUM(reserved_bytes), 0) AS BIGINT) AS r FROM upload_generations \
             WHERE app_id = $1 AND space_id = $2",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .fetch_one(&self.pool)
        .await?
        .try_get("r")?;
        Ok(UsageDelta {
            node_count: row.try_get("node_count")?,
            not_ready_node_count: row.try_get("not_ready")?,
            ready_content_bytes: row.try_get("content")?,
            ready_stored_bytes: row.try_get("stored")?,
            reserved_bytes: reserved,
        })
    }

    /// The stored usage row as a delta from zero (for comparison with [`Self::recount_usage`]).
    pub async fn usage_row(&self, app: &AppId, space: &SpaceId) -> Result<UsageDelta, sqlx::Error> {
        let u = self.usage(app, space, 0).await?;
        Ok(UsageDelta {
            node_count: u.node_count,
            not_ready_node_count: u.not_ready_node_count,
            ready_content_bytes: u.ready_content_bytes,
            ready_stored_bytes: u.ready_stored_bytes,
            reserved_bytes: u.reserved_bytes,
        })
    }
}

impl super::Partition {
    /// Adds `d` to the partition's usage row, in its transaction.
    pub(crate) async fn add_usage(&mut self, d: UsageDelta) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        apply(self.tx(), &app, &space, d).await
    }
}
