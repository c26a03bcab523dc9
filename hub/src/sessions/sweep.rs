//! Keeping sessions honest over time: periodic saves, the sweep (silent, idle, too old or
//! crashed sandboxes end after saving; records of processes that stopped heartbeating are
//! closed; old records are reaped), and the adoption of sandboxes a dead hub process left on
//! this host (their changes saved, their processes stopped).

use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::Hub;
use crate::catalog::Source;
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId};
use crate::sandbox::Orphan;
use crate::sessions::lifecycle::{End, HEARTBEAT_WRITE_MS};
use crate::sessions::save::Dirs;
use crate::store::sessions::{SessionMode, SessionRow, SessionStatus};
use crate::store::{EventRow, HubStore};

impl Hub {
    /// Saves every live session's changes, every `UNICAS_HUB_SESSION_SAVE_INTERVAL_MS`.
    pub async fn session_saves(&self, stop: CancellationToken) {
        let every = self.config.sessions.save_interval_ms;
        if every == 0 {
            return;
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(every)) => {}
            }
            for live in self.sessions.all() {
                if live.is_ending() {
                    continue;
                }
                if let Err(e) = self.save_live(&live, false).await {
                    tracing::warn!(session = %live.id, error = %e, "a periodic session save failed; retrying later");
                }
            }
        }
    }

    /// Sweeps sessions every `UNICAS_HUB_SESSION_SWEEP_MS`.
    pub async fn session_sweeps(&self, stop: CancellationToken) {
        let every = Duration::from_millis(self.config.sessions.sweep_ms);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            if let Err(e) = self.sweep_sessions().await {
                tracing::warn!(error = %e, "a session sweep failed; retrying later");
            }
        }
    }

    /// One sweep: ends this process's sessions that are silent, idle, too old or whose sandbox
    /// stopped; expires records of other processes that stopped heartbeating; adopts
    /// sandboxes left on this host by a process that died; reaps old records.
    pub async fn sweep_sessions(&self) -> HubResult<()> {
        self.sweep_app_pools().await?;
        let c = &self.config.sessions;
        let now = ids::now_ms();
        for live in self.sessions.all() {
            if live.teardown.try_lock().is_err() {
                // Being ended right now.
                continue;
            }
            let why = if live.is_ending() {
                Some(End::Deleted)
            } else if let Some(sb) = live.sandbox()
                && self.sessions.provider.probe(sb).await == crate::sandbox::Health::Exited
            {
                Some(End::Crashed)
            } else if live.mode == SessionMode::App {
                // App sandboxes live by their pool's visits (`sweep_app_pools`).
                (now - live.started_ms > c.max_lifetime_s as i64 * 1000)
                    .then_some(End::Expired("lifetime"))
            } else if now - live.last_seen_ms(now) > c.expire_ms as i64 {
                Some(End::Expired("no heartbeat"))
            } else if now - live.last_active_ms() > c.idle_timeout_s as i64 * 1000 {
                Some(End::Expired("idle"))
            } else if now - live.started_ms > c.max_lifetime_s as i64 * 1000 {
                Some(End::Expired("lifetime"))
            } else {
                None
            };
            match why {
                Some(why) if live.sandbox().is_some() || live.is_ending() => {
                    tracing::info!(session = %live.id, ?why, "ending a session");
                    if let Err(e) = self.end_session(&live, why).await {
                        tracing::warn!(session = %live.id, error = %e, "ending a session failed; retrying later");
                    }
                }
                _ => {
                    self.store
                        .touch_session(&live.id, live.last_seen_ms(now), HEARTBEAT_WRITE_MS)
                        .await?;
                }
            }
        }
        // Records of processes that stopped heartbeating for them.
        let stale = now - c.expire_ms as i64 - HEARTBEAT_WRITE_MS;
        let open = [
            SessionStatus::Starting,
            SessionStatus::Running,
            SessionStatus::Terminating,
        ];
        for row in self.store.sessions_in(&open, 500).await? {
            if row.last_heartbeat_ms < stale && self.sessions.get(&row.session_id).is_none() {
                self.close_unowned(&row, "no heartbeat from its hub process")
                    .await?;
            }
        }
        self.recover_orphans().await;
        self.store
            .reap_sessions(now - c.retention_ms as i64)
            .await?;
        Ok(())
    }

    async fn expire_record(&self, row: &SessionRow, reason: &str) -> HubResult<()> {
        self.close_record(row, SessionStatus::Expired, "session.expired", reason)
            .await
    }

    /// Moves a record no process serves any more to `status` (if it may), releasing its
    /// editor claim.
    async fn close_record(
        &self,
        row: &SessionRow,
        status: SessionStatus,
        event: &str,
        reason: &str,
    ) -> HubResult<()> {
        let mut tx = self.store.write().await?;
        let now = ids::now_ms();
        if HubStore::set_session_status(&mut tx, &row.session_id, status, now, None).await? {
            HubStore::release_editor_claim(&mut tx, &row.notebook_id, &row.session_id).await?;
            EventRow::new(
                event,
                &row.user_id,
                Some(&row.project_id),
                Some(&row.notebook_id),
                json!({"session_id": row.session_id, "status": status, "reason": reason}),
            )
            .insert(&mut tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Finishes the record of a session whose process is gone: an ending under way is
    /// finished, a live session expired.
    async fn close_unowned(&self, row: &SessionRow, reason: &str) -> HubResult<()> {
        if row.status == SessionStatus::Terminating {
            self.close_record(row, SessionStatus::Terminated, "session.terminate", reason)
                .await
        } else if SessionStatus::LIVE.contains(&row.status) {
            self.expire_record(row, reason).await
        } else {
            Ok(())
        }
    }

    /// Retires a live record no process owns any more (its process died): what it left on
    /// this host is adopted first.
    pub async fn retire_unowned(&self, row: &SessionRow) -> HubResult<()> {
        self.recover_orphans().await;
        let now = self.store.session(&row.session_id).await?;
        if let Some(r) = now {
            self.close_unowned(&r, "its hub process is gone").await?;
        }
        Ok(())
    }

    /// Adopts sandboxes whose hub process died: stops them, saves their changes, expires
    /// their records and removes them. One whose save fails is left for the next attempt.
    pub async fn recover_orphans(&self) {
        for o in self.sessions.provider.orphans().await {
            if let Err(e) = self.recover_orphan(&o).await {
                tracing::warn!(session = %o.session, error = %e, "recovering a session left by a stopped hub failed; retrying later");
            }
        }
    }

    async fn recover_orphan(&self, o: &Orphan) -> HubResult<()> {
        self.sessions.provider.stop(&o.session, o.pid).await;
        if let Some(row) = self.store.session(&o.session).await? {
            let persist = row.mode == SessionMode::Edit && self.persists(&row).await;
            if persist {
                let dirs = Dirs {
                    files: &o.files,
                    home: &o.home,
                    entry: &self.entry_of(&row).await,
                };
                let saved = self
                    .save_session_files(&row, &dirs, Default::default(), false)
                    .await?;
                if let Some(c) = saved.committed {
                    tracing::info!(session = %o.session, revision = c.revision, "saved the changes of a session whose hub stopped");
                }
            }
            self.close_unowned(&row, "its hub process stopped").await?;
        }
        self.sessions
            .provider
            .discard(&o.session)
            .await
            .map_err(|e| HubError::internal("removing a session's directory", e))?;
        Ok(())
    }

    async fn persists(&self, row: &SessionRow) -> bool {
        self.catalog_entry(&row.project_id, &row.notebook_id)
            .await
            .is_some_and(|e| matches!(e.source, Source::Local { .. }))
    }

    async fn entry_of(&self, row: &SessionRow) -> String {
        self.catalog_entry(&row.project_id, &row.notebook_id)
            .await
            .and_then(|e| e.source.entry_notebook().map(str::to_string))
            .unwrap_or_else(|| "notebook.py".into())
    }

    async fn catalog_entry(
        &self,
        pid: &ProjectId,
        nid: &NotebookId,
    ) -> Option<crate::catalog::NotebookEntry> {
        let cat = self.catalog().await.ok()?;
        cat.project(pid)?
            .notebooks
            .iter()
            .find(|n| n.id == *nid)
            .cloned()
    }
}
