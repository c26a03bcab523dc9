//! Saving what a session changed: the files of its directory that differ from the revision it
//! is based on become one workspace save (seed 002) with that revision as
//! `expected_revision`. A conflict keeps the edits as a branch (`branch-refused-edit`), and
//! the session saves to the branch from then on. At teardown the rendered notebook and
//! marimo's session state become snapshot leaves of the version the save cuts.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cas_client::Plan;
use cas_client::files::plan_spooled;

use crate::Hub;
use crate::commit::{Snapshot, SnapshotKind};
use crate::error::{HubError, HubResult};
use crate::forks::PlannedBranch;
use crate::ids;
use crate::sessions::capture::{self, Known, Limits, open_below};
use crate::store::VersionKind;
use crate::store::sessions::SessionRow;
use crate::workspace::{Committed, PlannedSave};

/// How long `marimo export html` may take at teardown.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a session's files are.
pub struct Dirs<'a> {
    pub files: &'a Path,
    pub home: &'a Path,
    pub entry: &'a str,
}

/// What a save did.
pub struct Saved {
    pub committed: Option<Committed>,
    /// What the directory held, for the next save.
    pub known: Known,
}

impl Hub {
    fn capture_limits(&self) -> Limits {
        Limits {
            max_bytes: self.config.sessions.capture_max_bytes,
            max_files: self.config.sessions.capture_max_files,
        }
    }

    /// Saves the changes of the session `row` from `dirs` (with snapshots when `render`).
    pub async fn save_session_files(
        &self,
        row: &SessionRow,
        dirs: &Dirs<'_>,
        known: Known,
        render: bool,
    ) -> HubResult<Saved> {
        let space = row.project_id.space();
        let nb = self
            .store
            .notebook(&row.save_notebook_id)
            .await?
            .ok_or_else(|| HubError::not_found("the notebook of this session is gone"))?;
        let base = match row.base_revision {
            Some(r) => Some(self.loadable(&nb, Some(r)).await?.tree),
            None => None,
        };
        let captured = capture::capture(
            self.cas()?,
            &space,
            base,
            dirs.files.to_path_buf(),
            known,
            self.capture_limits(),
            self.config.spool_dir(),
        )
        .await?;
        if !captured.skipped.is_empty() {
            tracing::warn!(session = %row.session_id, skipped = ?captured.skipped, "session files left out of a save");
        }
        if captured.changes.is_empty() {
            return Ok(Saved {
                committed: None,
                known: captured.known,
            });
        }
        let mut plan = captured.plan;
        let snapshots = if render {
            self.render_snapshots(dirs, &mut plan).await
        } else {
            Vec::new()
        };
        let message = "Session edits".to_string();
        let saved = self
            .save_planned(PlannedSave {
                project: &row.project_id,
                notebook: &row.save_notebook_id,
                actor: &row.user_id,
                expected_revision: row.base_revision,
                message: message.clone(),
                plan: plan.clone(),
                changes: captured.changes.clone(),
                kind: VersionKind::Session,
                snapshots,
            })
            .await;
        let (notebook, committed, branched) = match saved {
            Ok(c) => (row.save_notebook_id.clone(), c, row.branched),
            Err(e) if e.code == "workspace_conflict" && row.base_revision.is_some() => {
                let user = self
                    .store
                    .user(&row.user_id)
                    .await?
                    .ok_or_else(|| HubError::forbidden("the session's user is gone"))?;
                let created = self
                    .branch_planned(PlannedBranch {
                        user: &user,
                        project: &row.project_id,
                        notebook: &row.save_notebook_id,
                        base_revision: row.base_revision.unwrap_or_default(),
                        title: None,
                        message: format!("{message} (the notebook changed meanwhile)"),
                        plan,
                        changes: captured.changes,
                    })
                    .await?;
                tracing::info!(session = %row.session_id, branch = %created.notebook.id, "a session's save conflicted; its edits went to a branch");
                let c = created.revision.ok_or_else(|| {
                    HubError::internal("branching a session's edits", "no revision")
                })?;
                (created.notebook.id, c, true)
            }
            Err(e) => return Err(e),
        };
        self.store
            .record_session_save(
                &row.session_id,
                &notebook,
                committed.revision,
                branched,
                committed.version_id.as_str(),
                ids::now_ms(),
            )
            .await?;
        Ok(Saved {
            committed: Some(committed),
            known: captured.known,
        })
    }

    /// What the files written out from `tree` into `files` look like on disk, so the first
    /// save reads only what changed.
    pub async fn save_session_known(
        &self,
        space: &cas_format::SpaceId,
        tree: &cas_format::Hash,
        files: &Path,
    ) -> HubResult<Known> {
        use std::os::unix::fs::MetadataExt;
        let limits = cas_client::TreeLimits {
            max_entries: self
                .config
                .sessions
                .capture_max_files
                .saturating_mul(4)
                .max(1024),
            ..cas_client::TreeLimits::default()
        };
        let mut walk = self.cas()?.walk(space, tree, limits).await?;
        let mut known = Known::new();
        while let Some(w) = walk.next().await? {
            if !matches!(w.entry, cas_client::Entry::File { .. }) {
                continue;
            }
            if let Ok(m) = std::fs::symlink_metadata(files.join(&w.path)) {
                let stamp = capture::Stamp {
                    size: m.len(),
                    mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                };
                known.insert(w.path, (stamp, w.entry));
            }
        }
        Ok(known)
    }

    /// The HTML and session-state snapshots of a teardown, planned into `plan`. Best effort:
    /// what marimo does not produce is left out, and logged.
    async fn render_snapshots(&self, dirs: &Dirs<'_>, plan: &mut Plan) -> Vec<Snapshot> {
        let mut out = Vec::new();
        match self.export_html(dirs).await {
            Ok(file) => out.push(self.plan_snapshot(SnapshotKind::Html, file, plan)),
            Err(e) => tracing::warn!(error = %e, "no HTML snapshot"),
        }
        // marimo keeps the state of a notebook `d/n.py` in `d/__marimo__/session/n.py.json`.
        let mut parts: Vec<&str> = dirs.entry.split('/').collect();
        let name = parts.pop().unwrap_or_default();
        let state = format!("{name}.json");
        parts.extend(["__marimo__", "session", state.as_str()]);
        let files = dirs.files.to_path_buf();
        let owned: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        let limit = self.config.sessions.capture_max_bytes;
        let spool = self.config.spool_dir();
        let read = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&spool)?;
            let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
            copy_to_spool(open_below(&files, &refs)?, limit, &spool)
        })
        .await;
        match read {
            Ok(Ok(file)) => out.push(self.plan_snapshot(SnapshotKind::Session, file, plan)),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "no session snapshot"),
            Err(e) => tracing::warn!(error = %e, "no session snapshot"),
        }
        out.into_iter().flatten().collect()
    }

    fn plan_snapshot(
        &self,
        kind: SnapshotKind,
        (file, len): (std::fs::File, u64),
        plan: &mut Plan,
    ) -> Option<Snapshot> {
        match plan_spooled(plan, &Arc::new(file), 0, len) {
            Ok(file) => Some(Snapshot {
                kind,
                file,
                captured_at_ms: ids::now_ms(),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "a snapshot could not be planned");
                None
            }
        }
    }

    /// Runs `marimo export html` into a spool file.
    async fn export_html(&self, dirs: &Dirs<'_>) -> Result<(std::fs::File, u64), String> {
        let runtime = self
            .sessions
            .runtimes
            .get()
            .await
            .map_err(|e| e.to_string())?;
        let spool = self.config.spool_dir();
        std::fs::create_dir_all(&spool).map_err(|e| e.to_string())?;
        let out: PathBuf = tempfile::Builder::new()
            .prefix("snapshot-")
            .suffix(".html")
            .tempfile_in(&spool)
            .map_err(|e| e.to_string())?
            .into_temp_path()
            .keep()
            .map_err(|e| e.to_string())?;
        let result = runtime
            .export_html(dirs.files, dirs.home, dirs.entry, &out, EXPORT_TIMEOUT)
            .await;
        let opened = std::fs::File::open(&out);
        let _ = std::fs::remove_file(&out);
        result?;
        let limit = self.config.sessions.capture_max_bytes;
        copy_to_spool(opened.map_err(|e| e.to_string())?, limit, &spool).map_err(|e| e.to_string())
    }
}

/// Copies `src` (at most `limit` bytes) to an unnamed spool file; the file and its length.
fn copy_to_spool(
    mut src: std::fs::File,
    limit: u64,
    spool: &Path,
) -> std::io::Result<(std::fs::File, u64)> {
    let mut copy = tempfile::tempfile_in(spool)?;
    let n = std::io::copy(&mut (&mut src).take(limit + 1), &mut copy)?;
    if n > limit {
        return Err(std::io::Error::other(format!("larger than {limit} bytes")));
    }
    copy.rewind()?;
    Ok((copy, n))
}
