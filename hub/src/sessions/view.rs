//! The session record as the API shows it (seed 000 §4.8), and the editor claim.

use serde::Serialize;
use utoipa::ToSchema;

use crate::ids::{self, NotebookId, ProjectId, SessionId};
use crate::store::sessions::{
    ClaimRow, SessionMode, SessionRow, SessionStatus, Sharing, TakeoverPhase,
};

/// The Python runtime a session runs on.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RuntimeView {
    pub python_version: String,
    pub marimo_version: String,
}

/// Why a session failed, without anything secret.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionErrorView {
    pub code: String,
    pub message: String,
}

/// A session.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SessionView {
    pub session_id: SessionId,
    pub notebook_id: NotebookId,
    pub project_id: ProjectId,
    pub user_id: String,
    pub status: SessionStatus,
    pub mode: SessionMode,
    pub started_at: String,
    pub last_heartbeat: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Set once the sandbox runs.
    pub runtime: Option<RuntimeView>,
    pub sandbox_id: Option<String>,
    /// Where the session is opened: `/s/{sid}/` on the hub (absolute when the hub knows its
    /// public URL). Never the sandbox's own address.
    pub sandbox_url: Option<String>,
    /// For the session's own user: a link that opens it in a browser (it signs the browser
    /// in to this session for a while). Short-lived; ask again for a fresh one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_url: Option<String>,
    /// The revision the session opened (`null`: the workspace had none).
    pub opened_revision: Option<i64>,
    /// The revision its next save is based on.
    pub base_revision: Option<i64>,
    /// Where its changes are saved: the notebook, or the branch a conflicting save created.
    pub saves_to: NotebookId,
    /// Whether a save conflicted and the session's edits went to a branch
    /// (`branch-refused-edit`).
    pub branched: bool,
    pub last_saved_at: Option<String>,
    pub last_version_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<SessionErrorView>,
}

impl SessionView {
    /// `base` is the hub's public origin, if known (`https://hub.example.com`).
    pub fn of(row: &SessionRow, base: Option<&str>, open_url: Option<String>) -> Self {
        let live = !row.status.is_terminal();
        SessionView {
            session_id: row.session_id.clone(),
            notebook_id: row.notebook_id.clone(),
            project_id: row.project_id.clone(),
            user_id: row.user_id.clone(),
            status: row.status,
            mode: row.mode,
            started_at: ids::rfc3339(row.started_at_ms),
            last_heartbeat: ids::rfc3339(row.last_heartbeat_ms),
            ended_at: row.ended_at_ms.map(ids::rfc3339),
            runtime: match (&row.python_version, &row.marimo_version) {
                (Some(p), Some(m)) => Some(RuntimeView {
                    python_version: p.clone(),
                    marimo_version: m.clone(),
                }),
                _ => None,
            },
            sandbox_id: row.sandbox_id.clone(),
            sandbox_url: live
                .then(|| format!("{}{}", base.unwrap_or(""), proxy_path(&row.session_id))),
            open_url: open_url.filter(|_| live),
            opened_revision: row.opened_revision,
            base_revision: row.base_revision,
            saves_to: row.save_notebook_id.clone(),
            branched: row.branched,
            last_saved_at: row.last_saved_at_ms.map(ids::rfc3339),
            last_version_id: row.last_version_id.clone(),
            error: match (&row.error_code, &row.error_message) {
                (Some(c), Some(m)) => Some(SessionErrorView {
                    code: c.clone(),
                    message: m.clone(),
                }),
                _ => None,
            },
        }
    }
}

/// The path a session is served at.
pub fn proxy_path(id: &SessionId) -> String {
    format!("/s/{id}/")
}

/// A takeover of the editor in progress.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TransferView {
    pub requested_by: String,
    pub phase: TakeoverPhase,
    pub requested_at: String,
}

/// Who holds a notebook's persistent editor (seed 000 §4.8.2).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EditorClaimView {
    pub notebook_id: NotebookId,
    /// `null` when nobody holds it.
    pub session_id: Option<SessionId>,
    pub user_id: Option<String>,
    pub sharing: Sharing,
    pub claimed_at: Option<String>,
    pub transfer: Option<TransferView>,
}

impl EditorClaimView {
    pub fn of(notebook: &NotebookId, claim: Option<&ClaimRow>, sharing: Sharing) -> Self {
        match claim {
            None => EditorClaimView {
                notebook_id: notebook.clone(),
                session_id: None,
                user_id: None,
                sharing,
                claimed_at: None,
                transfer: None,
            },
            Some(c) => EditorClaimView {
                notebook_id: c.notebook_id.clone(),
                session_id: Some(c.session_id.clone()),
                user_id: Some(c.user_id.clone()),
                sharing: c.sharing,
                claimed_at: Some(ids::rfc3339(c.claimed_at_ms)),
                transfer: c.takeover.as_ref().map(|t| TransferView {
                    requested_by: t.requested_by.clone(),
                    phase: t.phase,
                    requested_at: ids::rfc3339(t.requested_at_ms),
                }),
            },
        }
    }
}
