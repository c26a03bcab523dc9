//! The history of a notebook as the API shows it: versions by revision or id, newest first,
//! the one a read means (the head by default; 410 once pruned), and the files in them.

use axum::http::StatusCode;
use cas_client::Entry;
use cas_client::files::FileRef;
use serde::Serialize;
use utoipa::ToSchema;

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId, VersionId};
use crate::store::versions::SnapshotRef;
use crate::store::{NotebookRow, NotebookState, StoredVersion, VersionKind, VersionState};
use crate::workspace::parse_path;

/// One indexed version.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionView {
    pub version_id: VersionId,
    pub notebook_id: NotebookId,
    pub revision: i64,
    pub saved_at: String,
    pub author: String,
    pub message: String,
    pub parent_revision: Option<i64>,
    /// How it was made.
    pub kind: VersionKind,
    pub file_count: i64,
    /// Logical bytes of the files of this version.
    pub size_bytes: i64,
    /// `kept`, or `pruned` by retention (then it no longer loads: 410).
    pub state: VersionState,
    pub is_head: bool,
    /// The version node.
    #[schema(value_type = String)]
    pub hash: cas_format::Hash,
    /// The workspace tree node.
    #[schema(value_type = String)]
    pub tree: cas_format::Hash,
    /// The rendered notebook a session's teardown attached (`GET …/versions/{vid}/html`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub html_snapshot: Option<SnapshotView>,
    /// marimo's session state a session's teardown attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_snapshot: Option<SnapshotView>,
}

/// A snapshot of a version: when it was captured and its size, never where it is stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotView {
    pub captured_at: String,
    pub size_bytes: i64,
}

impl VersionView {
    fn of(v: StoredVersion, head: Option<i64>) -> VersionView {
        let r = v.row;
        VersionView {
            is_head: head == Some(r.revision),
            version_id: r.version_id,
            notebook_id: r.notebook_id,
            revision: r.revision,
            saved_at: ids::rfc3339(r.saved_at_ms),
            author: r.author,
            message: r.message,
            parent_revision: r.parent_revision,
            kind: r.kind,
            file_count: r.file_count,
            size_bytes: r.logical_bytes,
            state: v.state,
            hash: r.version_hash,
            tree: r.tree_hash,
            html_snapshot: snapshot_view(r.snapshots.html, r.snapshots.captured_at_ms),
            session_snapshot: snapshot_view(r.snapshots.session, r.snapshots.captured_at_ms),
        }
    }
}

fn snapshot_view(s: Option<SnapshotRef>, at_ms: Option<i64>) -> Option<SnapshotView> {
    s.map(|s| SnapshotView {
        captured_at: ids::rfc3339(at_ms.unwrap_or(0)),
        size_bytes: s.bytes,
    })
}

pub(crate) fn pruned(revision: i64) -> HubError {
    HubError::new(
        StatusCode::GONE,
        "revision_pruned",
        format!("revision {revision} was pruned by retention; it stays listed but no longer loads"),
    )
    .with("revision", revision)
}

impl Hub {
    /// The notebook row of a live notebook of `project`, or 404.
    pub async fn live_notebook(
        &self,
        project: &ProjectId,
        notebook: &NotebookId,
    ) -> HubResult<NotebookRow> {
        match self.store.notebook(notebook).await? {
            Some(r) if r.project_id == *project && r.state == NotebookState::Live => Ok(r),
            _ => Err(HubError::not_found(format!(
                "notebook {notebook} not found"
            ))),
        }
    }

    /// One version by revision.
    pub async fn version(&self, nb: &NotebookRow, revision: i64) -> HubResult<Option<VersionView>> {
        Ok(self
            .store
            .version(&nb.notebook_id, revision)
            .await?
            .map(|v| VersionView::of(v, nb.head_revision)))
    }

    /// One version by id, or 404.
    pub async fn version_by_id(&self, nb: &NotebookRow, id: &VersionId) -> HubResult<VersionView> {
        self.store
            .version_by_id(&nb.notebook_id, id)
            .await?
            .map(|v| VersionView::of(v, nb.head_revision))
            .ok_or_else(|| HubError::not_found(format!("version {id} not found")))
    }

    /// Versions newest first, `limit` below the revision `before`.
    pub async fn versions(
        &self,
        nb: &NotebookRow,
        before: Option<i64>,
        limit: u32,
    ) -> HubResult<Vec<VersionView>> {
        Ok(self
            .store
            .versions(&nb.notebook_id, before, limit)
            .await?
            .into_iter()
            .map(|v| VersionView::of(v, nb.head_revision))
            .collect())
    }

    /// The version to read: `revision`, or the head. 404 when there is none, 410 when pruned.
    pub async fn loadable(
        &self,
        nb: &NotebookRow,
        revision: Option<i64>,
    ) -> HubResult<VersionView> {
        let Some(rev) = revision.or(nb.head_revision) else {
            return Err(HubError::not_found(format!(
                "notebook {} has no revision yet",
                nb.notebook_id
            )));
        };
        match self.version(nb, rev).await? {
            Some(v) if v.state == VersionState::Pruned => Err(pruned(rev)),
            Some(v) => Ok(v),
            None => Err(HubError::not_found(format!("revision {rev} not found"))),
        }
    }

    /// The file at `path` of a version, or 404.
    pub async fn file_at(
        &self,
        project: &ProjectId,
        v: &VersionView,
        path: &str,
    ) -> HubResult<FileRef> {
        let parts = parse_path(path)?;
        match self
            .cas()?
            .lookup_path(&project.space(), &v.tree, &parts)
            .await?
        {
            Some(Entry::File { file, .. }) => Ok(file),
            _ => Err(HubError::not_found(format!(
                "no file {path:?} in revision {}",
                v.revision
            ))),
        }
    }
}
