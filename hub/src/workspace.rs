//! Notebooks as workspaces with revisions (seed 002 rules), stored as CAS nodes.
//!
//! A save states the revision it was made from; while the notebook's lock is held it is
//! checked against the head (a stale one is 409 `workspace_conflict`), the new tree is built
//! from the head's tree (only the directories on changed paths are new nodes), and one new
//! revision is committed ([`crate::commit`]).

use std::collections::BTreeMap;

use axum::http::StatusCode;
use cas_client::files::{FileRef, plan_bytes};
use cas_client::{Change, ClientError, Entry, Plan, TreeStats};
use cas_format::{Hash, SpaceId, Value};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Hub;
use crate::commit::{Parent, VersionSpec};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId, VersionId};
use crate::store::{VersionKind, VersionState};
use crate::versions::pruned;

/// Longest path inside a workspace, in bytes.
pub const MAX_PATH_BYTES: usize = cas_client::tree::MAX_PATH_BYTES;
/// Deepest path inside a workspace.
pub const MAX_PATH_DEPTH: usize = cas_client::tree::MAX_PATH_DEPTH;
/// Longest commit message.
pub const MAX_MESSAGE: usize = 4096;

/// A file of a save: inline text, inline base64, or a staged upload.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FileInput {
    /// UTF-8 text content.
    #[serde(default)]
    pub content: Option<String>,
    /// Binary content, standard base64.
    #[serde(default)]
    pub content_base64: Option<String>,
    /// A file uploaded with `POST /api/v1/projects/{pid}/uploads`.
    #[serde(default)]
    pub staged: Option<StagedFile>,
    #[serde(default)]
    pub executable: bool,
}

/// A file stored in the project's Space ahead of a save (the answer of an upload).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct StagedFile {
    #[schema(value_type = String)]
    pub node: Hash,
    pub size: u64,
    pub chunked: bool,
}

/// The body of a save.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SaveRequest {
    /// The revision the edit was made from; omitted or null claims the workspace is new.
    #[serde(default)]
    pub expected_revision: Option<i64>,
    #[serde(default)]
    pub message: Option<String>,
    /// Changed or new files by path (`/`-separated, relative).
    #[serde(default)]
    pub files: BTreeMap<String, FileInput>,
    /// Paths to delete (a directory goes with everything below it).
    #[serde(default)]
    pub deleted: Vec<String>,
}

/// A save whose files are planned already.
pub struct PlannedSave<'a> {
    pub project: &'a ProjectId,
    pub notebook: &'a NotebookId,
    pub actor: &'a str,
    pub expected_revision: Option<i64>,
    pub message: String,
    pub plan: Plan,
    pub changes: Vec<(Vec<String>, Change)>,
    pub kind: VersionKind,
    pub snapshots: Vec<crate::commit::Snapshot>,
}

/// What a commit produced.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Committed {
    pub notebook_id: NotebookId,
    pub project_id: ProjectId,
    pub version_id: VersionId,
    pub revision: i64,
    pub saved_at: String,
    pub file_count: i64,
    pub size_bytes: i64,
    pub tree: String,
    /// Nodes and bytes the commit had to upload (unchanged content costs nothing).
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
}

/// One entry of a workspace listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ListedEntry {
    pub path: String,
    /// `file`, `dir` or `symlink`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// A file's content node (its leaf, or the index of its chunks): equal nodes, equal bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl From<cas_client::WalkedEntry> for ListedEntry {
    fn from(w: cas_client::WalkedEntry) -> Self {
        let (kind, size, node, executable, target) = match w.entry {
            Entry::File { file, executable } => (
                "file",
                Some(file.size),
                Some(file.node.to_string()),
                executable,
                None,
            ),
            Entry::Dir { .. } => ("dir", None, None, false, None),
            Entry::Symlink { target } => ("symlink", None, None, false, Some(target)),
        };
        ListedEntry {
            path: w.path,
            kind: kind.into(),
            size,
            node,
            executable,
            target,
        }
    }
}

/// Splits and checks a workspace path (see [`cas_client::parse_path`]).
pub fn parse_path(path: &str) -> HubResult<Vec<String>> {
    cas_client::parse_path(path).map_err(|e| HubError::invalid(e.to_string()))
}

pub fn check_message(m: Option<&str>) -> HubResult<String> {
    let m = m.unwrap_or("").trim();
    if m.len() > MAX_MESSAGE {
        return Err(HubError::invalid(format!(
            "message is longer than {MAX_MESSAGE} bytes"
        )));
    }
    Ok(m.to_string())
}

/// A client error about local input is the caller's 422; anything else is the CAS's.
pub(crate) fn edit_error(e: ClientError) -> HubError {
    match e {
        ClientError::Invalid(m) => HubError::invalid(m),
        other => other.into(),
    }
}

pub(crate) fn conflict(expected: Option<i64>, actual: Option<i64>) -> HubError {
    let reason = match (expected, actual) {
        (Some(e), Some(a)) => format!(
            "the workspace moved to revision {a} while you were editing revision {e}; reload and reapply your change."
        ),
        (None, Some(a)) => format!(
            "the workspace already exists at revision {a}; load it and save against that revision."
        ),
        (Some(e), None) => format!(
            "the workspace has no revision yet, but the save was made from revision {e}; save without expected_revision."
        ),
        (None, None) => "the workspace changed; reload it.".to_string(),
    };
    HubError::new(StatusCode::CONFLICT, "workspace_conflict", reason.clone())
        .with("actual_revision", actual)
        .with("expected_revision", expected)
        .with("reason", reason)
}

impl Hub {
    /// Plans the inline and staged files of a save into changes.
    pub async fn plan_changes(
        &self,
        space: &SpaceId,
        plan: &mut Plan,
        files: BTreeMap<String, FileInput>,
        deleted: Vec<String>,
    ) -> HubResult<Vec<(Vec<String>, Change)>> {
        use base64::Engine;
        let mut changes = Vec::with_capacity(files.len() + deleted.len());
        let mut seen = std::collections::HashSet::new();
        for (path, input) in files {
            let parts = parse_path(&path)?;
            if !seen.insert(parts.clone()) {
                return Err(HubError::invalid(format!("{path:?} appears twice")));
            }
            let file = match (input.content, input.content_base64, input.staged) {
                (Some(text), None, None) => {
                    plan_bytes(plan, text.as_bytes()).map_err(edit_error)?
                }
                (None, Some(b64), None) => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64.as_bytes())
                        .map_err(|e| HubError::invalid(format!("{path:?}: content_base64: {e}")))?;
                    plan_bytes(plan, &bytes).map_err(edit_error)?
                }
                (None, None, Some(staged)) => {
                    self.check_staged(space, &staged).await?;
                    FileRef {
                        node: staged.node,
                        size: staged.size,
                        chunked: staged.chunked,
                    }
                }
                _ => {
                    return Err(HubError::invalid(format!(
                        "{path:?}: give exactly one of content, content_base64 and staged"
                    )));
                }
            };
            changes.push((
                parts,
                Change::Put(Entry::File {
                    file,
                    executable: input.executable,
                }),
            ));
        }
        for path in deleted {
            let parts = parse_path(&path)?;
            if !seen.insert(parts.clone()) {
                return Err(HubError::invalid(format!(
                    "{path:?} is both written and deleted"
                )));
            }
            changes.push((parts, Change::Remove));
        }
        Ok(changes)
    }

    /// A staged file must be ready in the project's Space and be what its description says.
    async fn check_staged(&self, space: &SpaceId, staged: &StagedFile) -> HubResult<()> {
        let cas = self.cas()?;
        let bad = || {
            HubError::invalid(format!(
                "staged file {} is not an upload of this project (upload it again)",
                staged.node
            ))
        };
        let meta = match cas.read_metadata(space, &staged.node).await {
            Ok(m) => m,
            Err(e) if e.status() == Some(404) => return Err(bad()),
            Err(e) => return Err(e.into()),
        };
        let is_index = meta.metadata.content_type == cas_format::SVALUE_CONTENT_TYPE;
        if is_index != staged.chunked {
            return Err(bad());
        }
        if !is_index && meta.metadata.size != staged.size {
            return Err(bad());
        }
        if is_index {
            let content = cas.read_svalue_node(space, &staged.node).await?;
            let (v, _) = cas_format::svalue::decode(&content).map_err(|_| bad())?;
            if v.get("kind").and_then(Value::as_str) != Some(cas_client::files::CHUNKED_FILE)
                || v.get("size").and_then(Value::as_i64) != Some(staged.size as i64)
            {
                return Err(bad());
            }
        }
        // Protect it until the save's own leases and root ref take over.
        cas.lease_node(space, &staged.node, self.config.lease_ms, None)
            .await?;
        Ok(())
    }

    /// Saves a workspace (seed 002): holds the notebook, checks `expected_revision`, writes one
    /// new revision from the head's tree plus the changes.
    pub async fn save(
        &self,
        project: &ProjectId,
        notebook: &NotebookId,
        actor: &str,
        req: SaveRequest,
        kind: VersionKind,
    ) -> HubResult<Committed> {
        let message = check_message(req.message.as_deref())?;
        let space = project.space();
        // Planning leaves and checking staged files needs no lock.
        let mut plan = Plan::default();
        let changes = self
            .plan_changes(&space, &mut plan, req.files, req.deleted)
            .await?;
        self.save_planned(PlannedSave {
            project,
            notebook,
            actor,
            expected_revision: req.expected_revision,
            message,
            plan,
            changes,
            kind,
            snapshots: Vec::new(),
        })
        .await
    }

    /// [`Hub::save`] of changes already planned.
    pub async fn save_planned(&self, s: PlannedSave<'_>) -> HubResult<Committed> {
        let space = s.project.space();
        let PlannedSave {
            mut plan, changes, ..
        } = s;
        self.with_notebook_lock(s.notebook, async || {
            let nb = self.live_notebook(s.project, s.notebook).await?;
            if s.expected_revision != nb.head_revision {
                return Err(conflict(s.expected_revision, nb.head_revision));
            }
            let (base_tree, base_stats) = match nb.head_revision {
                Some(rev) => {
                    let v = self.loadable(&nb, Some(rev)).await?;
                    (
                        Some(v.tree),
                        TreeStats {
                            files: v.file_count,
                            bytes: v.size_bytes,
                        },
                    )
                }
                None => (None, TreeStats::default()),
            };
            let (tree, delta) = self
                .cas()?
                .plan_tree_edit(&space, &mut plan, base_tree, changes.clone())
                .await
                .map_err(edit_error)?;
            self.suggest_bases(&space, &mut plan, tree, base_tree).await;
            let spec = VersionSpec {
                tree,
                stats: TreeStats {
                    files: base_stats.files.saturating_add(delta.files),
                    bytes: base_stats.bytes.saturating_add(delta.bytes),
                },
                author: s.actor.to_string(),
                message: s.message.clone(),
                kind: s.kind,
                saved_at_ms: ids::now_ms(),
                parent: nb.head_revision.map_or(Parent::None, Parent::Revision),
                extra: BTreeMap::new(),
                snapshots: s.snapshots.clone(),
            };
            let mut done = self
                .commit_versions(&nb, plan.clone(), vec![spec], true)
                .await?;
            Ok(done.remove(0))
        })
        .await
    }

    /// Writes a new revision with the tree of version `version` (seed 000 restore).
    pub async fn restore_version(
        &self,
        project: &ProjectId,
        notebook: &NotebookId,
        version: &VersionId,
        expected_revision: Option<i64>,
        actor: &str,
    ) -> HubResult<Committed> {
        self.with_notebook_lock(notebook, async || {
            let nb = self.live_notebook(project, notebook).await?;
            if let Some(e) = expected_revision
                && Some(e) != nb.head_revision
            {
                return Err(conflict(Some(e), nb.head_revision));
            }
            let v = self.version_by_id(&nb, version).await?;
            if v.state == VersionState::Pruned {
                return Err(pruned(v.revision));
            }
            let spec = VersionSpec {
                tree: v.tree,
                stats: TreeStats {
                    files: v.file_count,
                    bytes: v.size_bytes,
                },
                author: actor.to_string(),
                message: format!("Restored revision {}", v.revision),
                kind: VersionKind::Restore,
                saved_at_ms: ids::now_ms(),
                parent: nb.head_revision.map_or(Parent::None, Parent::Revision),
                extra: BTreeMap::from([("restored_from".to_string(), v.version_id.to_string())]),
                snapshots: Vec::new(),
            };
            let mut done = self
                .commit_versions(&nb, Plan::default(), vec![spec], true)
                .await?;
            Ok(done.remove(0))
        })
        .await
    }
}
