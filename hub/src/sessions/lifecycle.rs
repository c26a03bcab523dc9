//! A session's life: created `starting` (the sandbox comes up in the background), `running`,
//! and ended by `DELETE`, a takeover, a sweep (see `sweep`) or the hub's shutdown: the sandbox
//! stops first, then what it changed is saved (with the teardown's snapshots), then the record
//! is retired. One teardown runs at a time per session; a failed save leaves the files in
//! place and the session ending, to be retried.

use std::sync::Arc;

use serde_json::json;

use crate::Hub;
use crate::auth::User;
use crate::catalog::{Role, Source};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId, SessionId};
use crate::sandbox::{SandboxError, StartSpec};
use crate::sessions::claims::{self, ClaimDecision};
use crate::sessions::save::Dirs;
use crate::sessions::view::proxy_path;
use crate::sessions::{LiveSession, NewLive};
use crate::store::sessions::{ClaimRow, SessionMode, SessionRow, SessionStatus};
use crate::store::{EventRow, HubStore, WriteTx};

/// How often a live session's heartbeat is written to the database at most.
pub(crate) const HEARTBEAT_WRITE_MS: i64 = 60_000;

/// How a create went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// A new session, starting.
    Created,
    /// The caller's live session on this notebook.
    Reused,
    /// The shared editor's session.
    Attached,
}

/// Why a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Deleted,
    TakenOver,
    Shutdown,
    /// No heartbeat, idle, or past its lifetime.
    Expired(&'static str),
    /// Its sandbox stopped by itself.
    Crashed,
}

/// Where a session's sandbox runs, seen from this process.
pub enum Owner {
    Here(Arc<LiveSession>),
    /// Another hub process, at this internal URL.
    There(String),
    /// Nowhere any more.
    Gone,
}

fn sanitize(e: &SandboxError) -> (&'static str, String) {
    match e {
        SandboxError::Runtime(m) => ("runtime_unavailable", m.clone()),
        SandboxError::Start(m) => ("sandbox_failed", m.clone()),
        SandboxError::Io(m) => (
            "sandbox_failed",
            format!("the sandbox could not be prepared ({m})"),
        ),
    }
}

impl Hub {
    /// Creates a session, or returns the caller's live one (seed 000 §8).
    pub async fn open_session(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        mode: SessionMode,
    ) -> HubResult<(SessionRow, Opened)> {
        let need = match mode {
            SessionMode::Edit => Role::Editor,
            SessionMode::App => Role::Viewer,
        };
        let (entry, nb) = self.notebook_for(user, pid, nid, need).await?;
        self.cas()?;
        if let Some(e) = self.sessions.runtimes.recent_failure() {
            return Err(HubError::runtime_unavailable(e.0));
        }
        if let Some(row) = self.store.reusable_session(nid, &user.id, mode).await? {
            return Ok((row, Opened::Reused));
        }
        // Notebooks synced from Git are edited on a copy that is never saved back.
        let persist = mode == SessionMode::Edit && matches!(entry.source, Source::Local { .. });
        let file = entry
            .source
            .entry_notebook()
            .unwrap_or("notebook.py")
            .to_string();
        let now = ids::now_ms();
        let row = self.new_session_row(&user.id, pid, nid, mode, nb.head_revision, now);
        let sid = row.session_id.clone();
        let mut tx = self.store.write().await?;
        self.check_session_limits(&mut tx, &user.id).await?;
        if persist {
            match claims::decide(&mut tx, nid, &user.id, now).await? {
                ClaimDecision::Attach(holder) => return Ok((*holder, Opened::Attached)),
                ClaimDecision::Take => {
                    let claim = ClaimRow {
                        notebook_id: nid.clone(),
                        project_id: pid.clone(),
                        session_id: sid.clone(),
                        user_id: user.id.clone(),
                        sharing: self.config.sessions.editor_mode,
                        claimed_at_ms: now,
                        takeover: None,
                    };
                    HubStore::put_editor_claim(&mut tx, &claim).await?;
                }
            }
        }
        Self::record_session(&mut tx, &row).await?;
        tx.commit().await?;
        self.launch(&row, persist, file, nb.head_revision);
        Ok((row, Opened::Created))
    }

    /// A new record (`starting`, owned by this process) for `user_id` on a notebook.
    pub(crate) fn new_session_row(
        &self,
        user_id: &str,
        pid: &ProjectId,
        nid: &NotebookId,
        mode: SessionMode,
        revision: Option<i64>,
        now: i64,
    ) -> SessionRow {
        SessionRow {
            session_id: SessionId::generate(),
            project_id: pid.clone(),
            notebook_id: nid.clone(),
            user_id: user_id.to_string(),
            mode,
            status: SessionStatus::Starting,
            started_at_ms: now,
            last_heartbeat_ms: now,
            ended_at_ms: None,
            opened_revision: revision,
            base_revision: revision,
            save_notebook_id: nid.clone(),
            branched: false,
            last_saved_at_ms: None,
            last_version_id: None,
            python_version: None,
            marimo_version: None,
            sandbox_id: None,
            owner_instance: self.sessions.instance.clone(),
            owner_url: self.sessions.internal_url().to_string(),
            error_code: None,
            error_message: None,
        }
    }

    /// Refuses one more sandbox beyond the deployment's and `user_id`'s limits, counted in the
    /// transaction that will record it.
    pub(crate) async fn check_session_limits(
        &self,
        tx: &mut WriteTx,
        user_id: &str,
    ) -> HubResult<()> {
        let limits = &self.config.sessions;
        let (total, mine) = HubStore::live_session_counts(tx, user_id).await?;
        if limits.max_total > 0 && total as u64 >= limits.max_total {
            return Err(HubError::too_many_sessions(
                "the hub runs as many sessions as it may; end one or retry later",
                limits.max_total,
            ));
        }
        if limits.max_per_user > 0 && mine as u64 >= limits.max_per_user {
            return Err(HubError::too_many_sessions(
                "you have as many live sessions as a user may; end one first",
                limits.max_per_user,
            ));
        }
        Ok(())
    }

    /// Writes a new record with its `session.create` event.
    pub(crate) async fn record_session(tx: &mut WriteTx, row: &SessionRow) -> HubResult<()> {
        HubStore::insert_session(tx, row).await?;
        EventRow::new(
            "session.create",
            &row.user_id,
            Some(&row.project_id),
            Some(&row.notebook_id),
            json!({"session_id": row.session_id, "mode": row.mode}),
        )
        .insert(tx)
        .await?;
        Ok(())
    }

    /// Starts the sandbox of a recorded session in the background, on `revision`.
    pub(crate) fn launch(
        &self,
        row: &SessionRow,
        persist: bool,
        entry: String,
        revision: Option<i64>,
    ) {
        let live = self.sessions.insert(NewLive {
            id: row.session_id.clone(),
            project: row.project_id.clone(),
            notebook: row.notebook_id.clone(),
            user: row.user_id.clone(),
            mode: row.mode,
            persist,
            entry,
            now_ms: row.started_at_ms,
        });
        let hub = self.clone();
        tokio::spawn(async move { hub.bring_up(live, revision).await });
    }

    /// Prepares the workspace, starts the sandbox and marks the session running (or failed).
    async fn bring_up(&self, live: Arc<LiveSession>, revision: Option<i64>) {
        match self.start_sandbox(&live, revision).await {
            Ok(()) => {
                let (rt, sb) = match (self.sessions.runtimes.get().await, live.sandbox()) {
                    (Ok(rt), Some(sb)) => (rt, sb.clone()),
                    _ => return,
                };
                let moved = self
                    .store
                    .set_session_running(
                        &live.id,
                        &rt.python_version,
                        &rt.marimo_version,
                        &sb.id,
                        ids::now_ms(),
                    )
                    .await;
                if !matches!(moved, Ok(true)) {
                    // Ended while it started (or the database failed): end it properly.
                    if let Err(e) = self.end_session(&live, End::Deleted).await {
                        tracing::warn!(session = %live.id, error = %e, "ending a session that was ended while it started");
                    }
                }
            }
            Err(e) => {
                let (code, message) = sanitize(&e);
                tracing::warn!(session = %live.id, %code, error = %message, "a session failed to start");
                let pid = live.sandbox().map(|s| s.pid);
                self.sessions.provider.stop(&live.id, pid).await;
                self.retire(
                    &live,
                    SessionStatus::Failed,
                    Some((code, &message)),
                    "session.terminate",
                )
                .await;
                self.drop_workspace(&live).await;
            }
        }
    }

    async fn start_sandbox(
        &self,
        live: &Arc<LiveSession>,
        revision: Option<i64>,
    ) -> Result<(), SandboxError> {
        let provider = &self.sessions.provider;
        let ws = provider.workspace(&live.id).await?;
        if let Some(rev) = revision {
            let fill = async {
                let nb = self
                    .store
                    .notebook(&live.notebook)
                    .await?
                    .ok_or_else(|| HubError::not_found("the notebook is gone"))?;
                let v = self.loadable(&nb, Some(rev)).await?;
                let space = live.project.space();
                let cas = self.cas()?;
                cas.materialize_tree(&space, &v.tree, &ws.files, self.config.parallelism, None)
                    .await?;
                // What was written is what the first save compares against.
                let mut known = live.save.lock().await;
                *known = self.save_session_known(&space, &v.tree, &ws.files).await?;
                Ok::<(), HubError>(())
            };
            fill.await.map_err(|e| {
                SandboxError::Io(format!("writing the workspace out failed: {}", e.message))
            })?;
        }
        let runtime = self
            .sessions
            .runtimes
            .get()
            .await
            .map_err(|e| SandboxError::Runtime(e.0))?;
        let spec = StartSpec {
            session: live.id.clone(),
            mode: live.mode,
            entry: live.entry.clone(),
            base_url: proxy_path(&live.id).trim_end_matches('/').to_string(),
            runtime,
        };
        let result = provider.start(&spec, &ws).await;
        live.set_workspace(ws);
        let sandbox = result?;
        let _ = live.sandbox.set(sandbox);
        Ok(())
    }

    /// Ends a session this process owns: saves (with snapshots), stops the sandbox, retires
    /// the record. A failed save leaves the session ending and its files in place: the sweep
    /// tries again (and after a crash, the next process on the host).
    pub async fn end_session(&self, live: &Arc<LiveSession>, why: End) -> HubResult<()> {
        // One teardown at a time; one that comes second finds the work done.
        let mut done = live.teardown.lock().await;
        if *done {
            return Ok(());
        }
        let why = live.begin_end(why);
        // An ending asked for is `terminating` while it saves; an expiry or a crash is
        // recorded once the save is done, so a terminal record means the changes are in.
        if matches!(why, End::Deleted | End::TakenOver | End::Shutdown) {
            let mut tx = self.store.write().await?;
            HubStore::set_session_status(
                &mut tx,
                &live.id,
                SessionStatus::Terminating,
                ids::now_ms(),
                None,
            )
            .await?;
            tx.commit().await?;
        }
        // Stopped first, so what is saved is final: marimo writes nothing after.
        let pid = live.sandbox().map(|s| s.pid);
        self.sessions.provider.stop(&live.id, pid).await;
        let saved = self.save_live(live, true).await;
        if let Err(e) = &saved
            && why != End::Shutdown
        {
            tracing::warn!(session = %live.id, error = %e, "a session's last save failed; its files stay until it succeeds");
            return Err(HubError::unavailable(format!(
                "the session stopped, but saving its changes failed ({}); they stay on disk and the save is retried",
                e.message
            )));
        }
        let (status, event, error) = match why {
            End::Expired(_) => (SessionStatus::Expired, "session.expired", None),
            End::Crashed => (
                SessionStatus::Failed,
                "session.terminate",
                Some(("sandbox_exited", "the sandbox stopped by itself")),
            ),
            _ => (SessionStatus::Terminated, "session.terminate", None),
        };
        self.retire(live, status, error, event).await;
        if saved.is_ok() {
            self.drop_workspace(live).await;
        } else {
            // Shutting down with unsaved changes: the files stay for the next start.
            self.sessions.remove(&live.id);
        }
        *done = true;
        Ok(())
    }

    /// Saves a live session's changes (one save at a time per session).
    pub async fn save_live(&self, live: &LiveSession, render: bool) -> HubResult<()> {
        if !live.persist || live.sandbox().is_none() {
            return Ok(());
        }
        let Some((files, home)) = live.dirs() else {
            return Ok(());
        };
        let mut known = live.save.lock().await;
        let row = self
            .store
            .session(&live.id)
            .await?
            .ok_or_else(|| HubError::not_found("the session record is gone"))?;
        let dirs = Dirs {
            files: &files,
            home: &home,
            entry: &live.entry,
        };
        let saved = self
            .save_session_files(&row, &dirs, known.clone(), render)
            .await?;
        *known = saved.known;
        Ok(())
    }

    /// Moves the record to a terminal status, releases the editor and writes the event.
    async fn retire(
        &self,
        live: &LiveSession,
        status: SessionStatus,
        error: Option<(&str, &str)>,
        event: &str,
    ) {
        let done = async {
            let mut tx = self.store.write().await?;
            let now = ids::now_ms();
            HubStore::set_session_status(&mut tx, &live.id, status, now, error).await?;
            HubStore::release_editor_claim(&mut tx, &live.notebook, &live.id).await?;
            EventRow::new(
                event,
                &live.user,
                Some(&live.project),
                Some(&live.notebook),
                json!({"session_id": live.id, "status": status}),
            )
            .insert(&mut tx)
            .await?;
            tx.commit().await
        };
        if let Err(e) = done.await {
            tracing::warn!(session = %live.id, error = %e, "retiring a session record failed");
        }
    }

    /// Removes the workspace, then lets go of it: while it is held, no other process (or
    /// sweep) takes it for an orphan.
    async fn drop_workspace(&self, live: &LiveSession) {
        if let Err(e) = self.sessions.provider.discard(&live.id).await {
            tracing::warn!(session = %live.id, error = %e, "removing a session's directory failed");
        }
        live.take_workspace();
        self.sessions.remove(&live.id);
    }

    /// Where the sandbox of `row` runs.
    pub fn owner_of(&self, row: &SessionRow) -> Owner {
        if let Some(live) = self.sessions.get(&row.session_id) {
            return Owner::Here(live);
        }
        if row.status.is_terminal() || row.owner_instance == self.sessions.instance {
            return Owner::Gone;
        }
        Owner::There(row.owner_url.clone())
    }

    /// A heartbeat: kept in memory by the owner; written at most once a minute.
    pub async fn heartbeat(&self, row: &SessionRow) -> HubResult<()> {
        let now = ids::now_ms();
        if let Some(live) = self.sessions.get(&row.session_id) {
            live.touch(now);
        }
        if SessionStatus::LIVE.contains(&row.status) {
            self.store
                .touch_session(&row.session_id, now, HEARTBEAT_WRITE_MS)
                .await?;
        }
        Ok(())
    }

    /// Ends every session this process owns, saving first (the hub is stopping).
    pub async fn shutdown_sessions(&self) {
        for live in self.sessions.all() {
            if let Err(e) = self.end_session(&live, End::Shutdown).await {
                tracing::warn!(session = %live.id, error = %e, "ending a session at shutdown failed");
            }
        }
    }
}
