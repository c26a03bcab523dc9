//! App pools (`hub_app_pools`, `hub_app_members`, `hub_app_visits`): one notebook's sandboxes
//! serving `marimo run` and the visit slots on them. Every change runs in one transaction that
//! ends by moving the pool row's `version` from the one it read ([`HubStore::swap_pool`]): a
//! change made on stale state commits nothing and is retried.

use sqlx::Row;

use super::sessions::SessionStatus;
use super::{HubStore, WriteTx, parsed};
use crate::ids::{NotebookId, ProjectId, SessionId};

/// A sandbox of a pool, with its session's status.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRow {
    pub sandbox_id: SessionId,
    pub notebook_id: NotebookId,
    /// The revision it serves (`None`: the notebook had none).
    pub revision: Option<i64>,
    pub reserved_until_ms: i64,
    pub idle_since_ms: i64,
    pub replaced_by: Option<SessionId>,
    /// It keeps its visits and takes no new ones (an app session from before pools).
    pub drain_only: bool,
    pub created_at_ms: i64,
    /// Its session's status (`None`: the record is gone).
    pub status: Option<SessionStatus>,
}

/// A visit slot.
#[derive(Debug, Clone, PartialEq)]
pub struct VisitRow {
    pub notebook_id: NotebookId,
    pub user_id: String,
    pub visit_id: String,
    pub sandbox_id: SessionId,
    pub lease_until_ms: i64,
    pub grace_until_ms: Option<i64>,
    pub admitted_at_ms: i64,
}

impl VisitRow {
    /// When its slot is released: the end of its grace after a departure, else of its lease.
    pub fn until_ms(&self) -> i64 {
        self.grace_until_ms.unwrap_or(self.lease_until_ms)
    }
}

/// A pool as one transaction read it.
#[derive(Debug, Clone, Default)]
pub struct PoolState {
    /// The pool row's version (`0`: there is no row yet).
    pub version: i64,
    pub members: Vec<MemberRow>,
    pub visits: Vec<VisitRow>,
}

fn member(r: &sqlx::any::AnyRow) -> Result<MemberRow, sqlx::Error> {
    let status: Option<String> = r.try_get("status")?;
    let replaced: Option<String> = r.try_get("replaced_by")?;
    Ok(MemberRow {
        sandbox_id: parsed(r, "sandbox_id")?,
        notebook_id: parsed(r, "notebook_id")?,
        revision: r.try_get("revision")?,
        reserved_until_ms: r.try_get("reserved_until_ms")?,
        idle_since_ms: r.try_get("idle_since_ms")?,
        replaced_by: replaced
            .map(|s| s.parse().map_err(|e| super::decode_err("replaced_by", e)))
            .transpose()?,
        drain_only: r.try_get::<i64, _>("drain_only")? != 0,
        created_at_ms: r.try_get("created_at_ms")?,
        status: status.as_deref().and_then(SessionStatus::parse),
    })
}

fn visit(r: &sqlx::any::AnyRow) -> Result<VisitRow, sqlx::Error> {
    Ok(VisitRow {
        notebook_id: parsed(r, "notebook_id")?,
        user_id: r.try_get("user_id")?,
        visit_id: r.try_get("visit_id")?,
        sandbox_id: parsed(r, "sandbox_id")?,
        lease_until_ms: r.try_get("lease_until_ms")?,
        grace_until_ms: r.try_get("grace_until_ms")?,
        admitted_at_ms: r.try_get("admitted_at_ms")?,
    })
}

const VISIT_COLUMNS: &str = "notebook_id, user_id, visit_id, sandbox_id, lease_until_ms, \
     grace_until_ms, admitted_at_ms";

impl HubStore {
    /// The pool of `notebook` as `tx` sees it.
    pub async fn pool_state(
        &self,
        tx: &mut WriteTx,
        notebook: &NotebookId,
    ) -> Result<PoolState, sqlx::Error> {
        // On Postgres the row is locked for the transaction: changes of one pool take turns
        // instead of failing their swap (which still guards against anything that did not).
        let sql = match self.dialect() {
            super::Dialect::Postgres => {
                "SELECT version FROM hub_app_pools WHERE notebook_id = $1 FOR UPDATE"
            }
            super::Dialect::Sqlite => "SELECT version FROM hub_app_pools WHERE notebook_id = $1",
        };
        let version: Option<i64> = sqlx::query_scalar(sql)
            .bind(notebook.as_str())
            .fetch_optional(tx.conn())
            .await?;
        let members = sqlx::query(
            "SELECT m.sandbox_id, m.notebook_id, m.revision, m.reserved_until_ms, m.idle_since_ms, \
             m.replaced_by, m.drain_only, m.created_at_ms, s.status FROM hub_app_members m \
             LEFT JOIN hub_sessions s ON s.session_id = m.sandbox_id \
             WHERE m.notebook_id = $1 ORDER BY m.created_at_ms, m.sandbox_id",
        )
        .bind(notebook.as_str())
        .fetch_all(tx.conn())
        .await?
        .iter()
        .map(member)
        .collect::<Result<_, _>>()?;
        let visits = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VISIT_COLUMNS} FROM hub_app_visits WHERE notebook_id = $1 \
             ORDER BY admitted_at_ms, user_id, visit_id"
        )))
        .bind(notebook.as_str())
        .fetch_all(tx.conn())
        .await?
        .iter()
        .map(visit)
        .collect::<Result<_, _>>()?;
        Ok(PoolState {
            version: version.unwrap_or(0),
            members,
            visits,
        })
    }

    /// Moves the pool's version from `expected` (`0`: creates the row); `false` if another
    /// change moved it first (then nothing of this transaction may be committed).
    pub async fn swap_pool(
        tx: &mut WriteTx,
        notebook: &NotebookId,
        project: &ProjectId,
        expected: i64,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let n = if expected == 0 {
            sqlx::query(
                "INSERT INTO hub_app_pools (notebook_id, project_id, version, updated_at_ms) \
                 VALUES ($1, $2, 1, $3) ON CONFLICT (notebook_id) DO NOTHING",
            )
            .bind(notebook.as_str())
            .bind(project.as_str())
            .bind(now)
            .execute(tx.conn())
            .await?
            .rows_affected()
        } else {
            sqlx::query(
                "UPDATE hub_app_pools SET version = version + 1, updated_at_ms = $1 \
                 WHERE notebook_id = $2 AND version = $3",
            )
            .bind(now)
            .bind(notebook.as_str())
            .bind(expected)
            .execute(tx.conn())
            .await?
            .rows_affected()
        };
        Ok(n == 1)
    }

    pub async fn insert_member(tx: &mut WriteTx, m: &MemberRow) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO hub_app_members (sandbox_id, notebook_id, revision, reserved_until_ms, \
             idle_since_ms, replaced_by, drain_only, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(m.sandbox_id.as_str())
        .bind(m.notebook_id.as_str())
        .bind(m.revision)
        .bind(m.reserved_until_ms)
        .bind(m.idle_since_ms)
        .bind(m.replaced_by.as_ref().map(SessionId::as_str))
        .bind(i64::from(m.drain_only))
        .bind(m.created_at_ms)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Records what a member last held: when its last slot was released, its replacement.
    pub async fn update_member(tx: &mut WriteTx, m: &MemberRow) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE hub_app_members SET idle_since_ms = $1, replaced_by = $2 WHERE sandbox_id = $3",
        )
        .bind(m.idle_since_ms)
        .bind(m.replaced_by.as_ref().map(SessionId::as_str))
        .bind(m.sandbox_id.as_str())
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Removes a member and every visit on it.
    pub async fn delete_member(tx: &mut WriteTx, sandbox: &SessionId) -> Result<(), sqlx::Error> {
        for sql in [
            "DELETE FROM hub_app_visits WHERE sandbox_id = $1",
            "DELETE FROM hub_app_members WHERE sandbox_id = $1",
        ] {
            sqlx::query(sql)
                .bind(sandbox.as_str())
                .execute(tx.conn())
                .await?;
        }
        Ok(())
    }

    /// Writes a visit (a new one, or its renewed lease, grace or sandbox).
    pub async fn put_visit(tx: &mut WriteTx, v: &VisitRow) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO hub_app_visits ({VISIT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (notebook_id, user_id, visit_id) DO UPDATE SET sandbox_id = $4, \
             lease_until_ms = $5, grace_until_ms = $6"
        )))
        .bind(v.notebook_id.as_str())
        .bind(&v.user_id)
        .bind(&v.visit_id)
        .bind(v.sandbox_id.as_str())
        .bind(v.lease_until_ms)
        .bind(v.grace_until_ms)
        .bind(v.admitted_at_ms)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    pub async fn delete_visit(tx: &mut WriteTx, v: &VisitRow) -> Result<(), sqlx::Error> {
        sqlx::query(
            "DELETE FROM hub_app_visits WHERE notebook_id = $1 AND user_id = $2 AND visit_id = $3",
        )
        .bind(v.notebook_id.as_str())
        .bind(&v.user_id)
        .bind(&v.visit_id)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Whether `user` holds a slot on `sandbox` at `now` (leased, or in its grace).
    pub async fn has_visit(
        &self,
        sandbox: &SessionId,
        user: &str,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM hub_app_visits WHERE sandbox_id = $1 AND user_id = $2 \
             AND COALESCE(grace_until_ms, lease_until_ms) > $3",
        )
        .bind(sandbox.as_str())
        .bind(user)
        .bind(now)
        .fetch_one(self.pool())
        .await?;
        Ok(n > 0)
    }

    /// Visit slots held now, over every pool (the `app_pool_visits` gauge).
    pub async fn visits_held(&self, now: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM hub_app_visits WHERE COALESCE(grace_until_ms, lease_until_ms) > $1",
        )
        .bind(now)
        .fetch_one(self.pool())
        .await
    }
}
