//! Session records (`hub_sessions`) and editor claims (`hub_editor_claims`), seed 000 §4.8.
//! Status changes are conditional updates: a record moves only from a status that may become
//! the new one, so two processes racing on one session cannot both move it.

use sqlx::Row;

use super::{HubStore, WriteTx, enum_col, parsed, placeholders};
use crate::ids::{NotebookId, ProjectId, SessionId};

column_enum! {
    /// Where a session stands: `starting → running → terminating → terminated`, and `failed`
    /// or `expired` on the way (see [`SessionStatus::may_become`]).
    pub enum SessionStatus {
        Starting = "starting",
        Running = "running",
        Terminating = "terminating",
        Terminated = "terminated",
        Failed = "failed",
        Expired = "expired",
    }
}

impl SessionStatus {
    /// The statuses of a session whose sandbox may still run.
    pub const LIVE: &'static [SessionStatus] = &[SessionStatus::Starting, SessionStatus::Running];

    /// Whether a session in this status may move to `next`.
    pub fn may_become(self, next: SessionStatus) -> bool {
        use SessionStatus::*;
        matches!(
            (self, next),
            (Starting, Running | Failed | Terminating | Expired)
                | (Running, Terminating | Failed | Expired)
                | (Terminating, Terminated | Failed)
        )
    }

    /// The statuses a session may move to `next` from.
    pub fn predecessors(next: SessionStatus) -> Vec<SessionStatus> {
        SessionStatus::ALL
            .iter()
            .copied()
            .filter(|s| s.may_become(next))
            .collect()
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SessionStatus::Terminated | SessionStatus::Failed | SessionStatus::Expired
        )
    }
}

column_enum! {
    /// `edit`: the marimo editor, whose changes are saved; `app`: the notebook run as a
    /// read-only application, whose changes are discarded.
    pub enum SessionMode {
        Edit = "edit",
        App = "app",
    }
}

column_enum! {
    /// How the persistent editor of a notebook is shared (`UNICAS_HUB_EDITOR_MODE`).
    pub enum Sharing {
        Exclusive = "exclusive",
        Shared = "shared",
    }
}

column_enum! {
    /// The phase of a takeover of a notebook's editor.
    pub enum TakeoverPhase {
        Requested = "requested",
        Draining = "draining",
        Ready = "ready",
    }
}

/// A session record.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub session_id: SessionId,
    pub project_id: ProjectId,
    pub notebook_id: NotebookId,
    pub user_id: String,
    pub mode: SessionMode,
    pub status: SessionStatus,
    pub started_at_ms: i64,
    pub last_heartbeat_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub opened_revision: Option<i64>,
    pub base_revision: Option<i64>,
    pub save_notebook_id: NotebookId,
    pub branched: bool,
    pub last_saved_at_ms: Option<i64>,
    pub last_version_id: Option<String>,
    pub python_version: Option<String>,
    pub marimo_version: Option<String>,
    pub sandbox_id: Option<String>,
    pub owner_instance: String,
    pub owner_url: String,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
}

const SESSION_COLUMNS: &str = "session_id, project_id, notebook_id, user_id, mode, status, \
     started_at_ms, last_heartbeat_ms, ended_at_ms, opened_revision, base_revision, \
     save_notebook_id, branched, last_saved_at_ms, last_version_id, python_version, \
     marimo_version, sandbox_id, owner_instance, owner_url, error_code, error_message";

fn session_row(r: &sqlx::any::AnyRow) -> Result<SessionRow, sqlx::Error> {
    let branched: i64 = r.try_get("branched")?;
    Ok(SessionRow {
        session_id: parsed(r, "session_id")?,
        project_id: parsed(r, "project_id")?,
        notebook_id: parsed(r, "notebook_id")?,
        user_id: r.try_get("user_id")?,
        mode: enum_col(r, "mode")?,
        status: enum_col(r, "status")?,
        started_at_ms: r.try_get("started_at_ms")?,
        last_heartbeat_ms: r.try_get("last_heartbeat_ms")?,
        ended_at_ms: r.try_get("ended_at_ms")?,
        opened_revision: r.try_get("opened_revision")?,
        base_revision: r.try_get("base_revision")?,
        save_notebook_id: parsed(r, "save_notebook_id")?,
        branched: branched != 0,
        last_saved_at_ms: r.try_get("last_saved_at_ms")?,
        last_version_id: r.try_get("last_version_id")?,
        python_version: r.try_get("python_version")?,
        marimo_version: r.try_get("marimo_version")?,
        sandbox_id: r.try_get("sandbox_id")?,
        owner_instance: r.try_get("owner_instance")?,
        owner_url: r.try_get("owner_url")?,
        error_code: r.try_get("error_code")?,
        error_message: r.try_get("error_message")?,
    })
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// Binds `statuses` in order (for an `IN` list made by [`placeholders`]).
fn bind_statuses<'q>(mut q: AnyQuery<'q>, statuses: &[SessionStatus]) -> AnyQuery<'q> {
    for s in statuses {
        q = q.bind(s.as_str());
    }
    q
}

async fn session_by_id<'e, E>(e: E, id: &SessionId) -> Result<Option<SessionRow>, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {SESSION_COLUMNS} FROM hub_sessions WHERE session_id = $1"
    )))
    .bind(id.as_str())
    .fetch_optional(e)
    .await?
    .as_ref()
    .map(session_row)
    .transpose()
}

/// The persistent editor of a notebook.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRow {
    pub notebook_id: NotebookId,
    pub project_id: ProjectId,
    pub session_id: SessionId,
    pub user_id: String,
    pub sharing: Sharing,
    pub claimed_at_ms: i64,
    pub takeover: Option<Takeover>,
}

/// A takeover in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Takeover {
    pub phase: TakeoverPhase,
    pub requested_by: String,
    pub requested_at_ms: i64,
    pub drain_expires_at_ms: Option<i64>,
}

fn claim_row(r: &sqlx::any::AnyRow) -> Result<ClaimRow, sqlx::Error> {
    let phase: Option<String> = r.try_get("takeover_phase")?;
    let takeover = match phase {
        None => None,
        Some(_) => Some(Takeover {
            phase: enum_col(r, "takeover_phase")?,
            requested_by: r
                .try_get::<Option<String>, _>("requested_by")?
                .unwrap_or_default(),
            requested_at_ms: r.try_get::<Option<i64>, _>("requested_at_ms")?.unwrap_or(0),
            drain_expires_at_ms: r.try_get("drain_expires_at_ms")?,
        }),
    };
    Ok(ClaimRow {
        notebook_id: parsed(r, "notebook_id")?,
        project_id: parsed(r, "project_id")?,
        session_id: parsed(r, "session_id")?,
        user_id: r.try_get("user_id")?,
        sharing: enum_col(r, "sharing")?,
        claimed_at_ms: r.try_get("claimed_at_ms")?,
        takeover,
    })
}

const CLAIM_COLUMNS: &str = "notebook_id, project_id, session_id, user_id, sharing, \
     claimed_at_ms, takeover_phase, requested_by, requested_at_ms, drain_expires_at_ms";

impl HubStore {
    pub async fn insert_session(tx: &mut WriteTx, s: &SessionRow) -> Result<(), sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO hub_sessions ({SESSION_COLUMNS}) VALUES ({})",
            placeholders(1, 22)
        )))
        .bind(s.session_id.as_str())
        .bind(s.project_id.as_str())
        .bind(s.notebook_id.as_str())
        .bind(&s.user_id)
        .bind(s.mode.as_str())
        .bind(s.status.as_str())
        .bind(s.started_at_ms)
        .bind(s.last_heartbeat_ms)
        .bind(s.ended_at_ms)
        .bind(s.opened_revision)
        .bind(s.base_revision)
        .bind(s.save_notebook_id.as_str())
        .bind(i64::from(s.branched))
        .bind(s.last_saved_at_ms)
        .bind(s.last_version_id.as_deref())
        .bind(s.python_version.as_deref())
        .bind(s.marimo_version.as_deref())
        .bind(s.sandbox_id.as_deref())
        .bind(&s.owner_instance)
        .bind(&s.owner_url)
        .bind(s.error_code.as_deref())
        .bind(s.error_message.as_deref())
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    pub async fn session(&self, id: &SessionId) -> Result<Option<SessionRow>, sqlx::Error> {
        session_by_id(self.pool(), id).await
    }

    /// A session, read in a write transaction.
    pub async fn session_tx(
        tx: &mut WriteTx,
        id: &SessionId,
    ) -> Result<Option<SessionRow>, sqlx::Error> {
        session_by_id(tx.conn(), id).await
    }

    /// Sessions of `project` in one of `statuses`, by id after `after`.
    pub async fn project_sessions(
        &self,
        project: &ProjectId,
        statuses: &[SessionStatus],
        after: Option<&SessionId>,
        limit: u32,
    ) -> Result<Vec<SessionRow>, sqlx::Error> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM hub_sessions WHERE project_id = $1 AND session_id > $2 \
             AND status IN ({}) ORDER BY session_id LIMIT $3",
            placeholders(4, statuses.len())
        )))
        .bind(project.as_str())
        .bind(after.map_or("", SessionId::as_str))
        .bind(i64::from(limit));
        q = bind_statuses(q, statuses);
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(session_row)
            .collect()
    }

    /// Every session in one of `statuses` (sweeps), oldest heartbeat first.
    pub async fn sessions_in(
        &self,
        statuses: &[SessionStatus],
        limit: u32,
    ) -> Result<Vec<SessionRow>, sqlx::Error> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM hub_sessions WHERE status IN ({}) \
             ORDER BY last_heartbeat_ms LIMIT $1",
            placeholders(2, statuses.len())
        )))
        .bind(i64::from(limit));
        q = bind_statuses(q, statuses);
        q.fetch_all(self.pool())
            .await?
            .iter()
            .map(session_row)
            .collect()
    }

    /// The live session of `user` on `notebook` in `mode`, if any (the one a create reuses).
    pub async fn reusable_session(
        &self,
        notebook: &NotebookId,
        user: &str,
        mode: SessionMode,
    ) -> Result<Option<SessionRow>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {SESSION_COLUMNS} FROM hub_sessions WHERE notebook_id = $1 AND user_id = $2 \
             AND mode = $3 AND status IN ('starting', 'running') ORDER BY started_at_ms DESC LIMIT 1"
        )))
        .bind(notebook.as_str())
        .bind(user)
        .bind(mode.as_str())
        .fetch_optional(self.pool())
        .await?
        .as_ref()
        .map(session_row)
        .transpose()
    }

    /// Live sessions in all, and those of `user`.
    pub async fn live_session_counts(
        tx: &mut WriteTx,
        user: &str,
    ) -> Result<(i64, i64), sqlx::Error> {
        let r = sqlx::query(
            "SELECT COUNT(*) AS total, \
             COALESCE(SUM(CASE WHEN user_id = $1 THEN 1 ELSE 0 END), 0) AS mine \
             FROM hub_sessions WHERE status IN ('starting', 'running')",
        )
        .bind(user)
        .fetch_one(tx.conn())
        .await?;
        Ok((r.try_get("total")?, r.try_get("mine")?))
    }

    /// Moves a session to `next` if its status may become it; `false` if it had moved on.
    pub async fn set_session_status(
        tx: &mut WriteTx,
        id: &SessionId,
        next: SessionStatus,
        now_ms: i64,
        error: Option<(&str, &str)>,
    ) -> Result<bool, sqlx::Error> {
        let from = SessionStatus::predecessors(next);
        let ended = next.is_terminal().then_some(now_ms);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE hub_sessions SET status = $2, ended_at_ms = COALESCE($3, ended_at_ms), \
             last_heartbeat_ms = CASE WHEN last_heartbeat_ms < $4 THEN $4 ELSE last_heartbeat_ms END, \
             error_code = COALESCE($5, error_code), error_message = COALESCE($6, error_message) \
             WHERE session_id = $1 AND status IN ({})",
            placeholders(7, from.len())
        )))
        .bind(id.as_str())
        .bind(next.as_str())
        .bind(ended)
        .bind(now_ms)
        .bind(error.map(|e| e.0))
        .bind(error.map(|e| e.1));
        q = bind_statuses(q, &from);
        Ok(q.execute(tx.conn()).await?.rows_affected() == 1)
    }

    /// A starting session is running: its runtime and sandbox.
    pub async fn set_session_running(
        &self,
        id: &SessionId,
        python_version: &str,
        marimo_version: &str,
        sandbox_id: &str,
        now_ms: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.write().await?;
        let moved =
            Self::set_session_status(&mut tx, id, SessionStatus::Running, now_ms, None).await?;
        if moved {
            sqlx::query(
                "UPDATE hub_sessions SET python_version = $2, marimo_version = $3, sandbox_id = $4 \
                 WHERE session_id = $1",
            )
            .bind(id.as_str())
            .bind(python_version)
            .bind(marimo_version)
            .bind(sandbox_id)
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    /// Writes a heartbeat if the stored one is older than `min_age_ms` (at most one write per
    /// interval, seed 000 §8).
    pub async fn touch_session(
        &self,
        id: &SessionId,
        now_ms: i64,
        min_age_ms: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query(
            "UPDATE hub_sessions SET last_heartbeat_ms = $2 WHERE session_id = $1 \
             AND last_heartbeat_ms < $3 AND status IN ('starting', 'running')",
        )
        .bind(id.as_str())
        .bind(now_ms)
        .bind(now_ms - min_age_ms)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    /// What a save of the session's changes produced: the revision its next saves are based
    /// on, in the notebook they go to.
    pub async fn record_session_save(
        &self,
        id: &SessionId,
        save_notebook: &NotebookId,
        base_revision: i64,
        branched: bool,
        version_id: &str,
        now_ms: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.write().await?;
        sqlx::query(
            "UPDATE hub_sessions SET save_notebook_id = $2, base_revision = $3, branched = $4, \
             last_version_id = $5, last_saved_at_ms = $6 WHERE session_id = $1",
        )
        .bind(id.as_str())
        .bind(save_notebook.as_str())
        .bind(base_revision)
        .bind(i64::from(branched))
        .bind(version_id)
        .bind(now_ms)
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }

    /// Deletes terminal records whose last sign of life is older than `before_ms`.
    pub async fn reap_sessions(&self, before_ms: i64) -> Result<u64, sqlx::Error> {
        let mut tx = self.write().await?;
        let n = sqlx::query(
            "DELETE FROM hub_sessions WHERE status IN ('terminated', 'failed', 'expired') \
             AND COALESCE(ended_at_ms, last_heartbeat_ms) < $1",
        )
        .bind(before_ms)
        .execute(tx.conn())
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n)
    }

    pub async fn editor_claim(
        tx: &mut WriteTx,
        notebook: &NotebookId,
    ) -> Result<Option<ClaimRow>, sqlx::Error> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {CLAIM_COLUMNS} FROM hub_editor_claims WHERE notebook_id = $1"
        )))
        .bind(notebook.as_str())
        .fetch_optional(tx.conn())
        .await?
        .as_ref()
        .map(claim_row)
        .transpose()
    }

    pub async fn read_editor_claim(
        &self,
        notebook: &NotebookId,
    ) -> Result<Option<ClaimRow>, sqlx::Error> {
        let mut tx = self.write().await?;
        let c = Self::editor_claim(&mut tx, notebook).await?;
        tx.commit().await?;
        Ok(c)
    }

    /// Makes `c` the claim of its notebook (a new holder; no takeover in progress).
    pub async fn put_editor_claim(tx: &mut WriteTx, c: &ClaimRow) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO hub_editor_claims (notebook_id, project_id, session_id, user_id, sharing, \
             claimed_at_ms) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (notebook_id) DO UPDATE SET \
             project_id = excluded.project_id, session_id = excluded.session_id, \
             user_id = excluded.user_id, sharing = excluded.sharing, \
             claimed_at_ms = excluded.claimed_at_ms, takeover_phase = NULL, requested_by = NULL, \
             requested_at_ms = NULL, drain_expires_at_ms = NULL",
        )
        .bind(c.notebook_id.as_str())
        .bind(c.project_id.as_str())
        .bind(c.session_id.as_str())
        .bind(&c.user_id)
        .bind(c.sharing.as_str())
        .bind(c.claimed_at_ms)
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    /// Records a takeover's phase on the claim held by `holder`; `false` if the claim moved on.
    pub async fn set_takeover(
        tx: &mut WriteTx,
        notebook: &NotebookId,
        holder: &SessionId,
        t: &Takeover,
    ) -> Result<bool, sqlx::Error> {
        let n = sqlx::query(
            "UPDATE hub_editor_claims SET takeover_phase = $3, requested_by = $4, \
             requested_at_ms = $5, drain_expires_at_ms = $6 WHERE notebook_id = $1 AND session_id = $2",
        )
        .bind(notebook.as_str())
        .bind(holder.as_str())
        .bind(t.phase.as_str())
        .bind(&t.requested_by)
        .bind(t.requested_at_ms)
        .bind(t.drain_expires_at_ms)
        .execute(tx.conn())
        .await?
        .rows_affected();
        Ok(n == 1)
    }

    /// Drops the claim if `holder` still holds it without a takeover in progress.
    pub async fn release_editor_claim(
        tx: &mut WriteTx,
        notebook: &NotebookId,
        holder: &SessionId,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "DELETE FROM hub_editor_claims WHERE notebook_id = $1 AND session_id = $2 \
             AND takeover_phase IS NULL",
        )
        .bind(notebook.as_str())
        .bind(holder.as_str())
        .execute(tx.conn())
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::SessionStatus::{self, *};

    #[test]
    fn statuses_move_only_as_the_seed_says() {
        let allowed = [
            (Starting, Running),
            (Starting, Failed),
            (Starting, Terminating),
            (Starting, Expired),
            (Running, Terminating),
            (Running, Failed),
            (Running, Expired),
            (Terminating, Terminated),
            (Terminating, Failed),
        ];
        for &a in SessionStatus::ALL {
            for &b in SessionStatus::ALL {
                assert_eq!(
                    a.may_become(b),
                    allowed.contains(&(a, b)),
                    "{} → {}",
                    a.as_str(),
                    b.as_str()
                );
            }
            assert_eq!(SessionStatus::parse(a.as_str()), Some(a));
        }
        for t in [Terminated, Failed, Expired] {
            assert!(t.is_terminal());
            assert!(SessionStatus::ALL.iter().all(|&n| !t.may_become(n)));
        }
        assert_eq!(SessionStatus::predecessors(Terminated), vec![Terminating]);
        assert_eq!(SessionStatus::parse("stopped"), None);
    }
}
