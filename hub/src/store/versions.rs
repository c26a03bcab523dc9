//! The version index (`hub_versions`): one row per committed revision. The version itself is a
//! node in the CAS.

use cas_format::Hash;
use serde::{Deserialize, Serialize};
use sqlx::Row;

use super::{HubStore, WriteTx, enum_col, parsed, parsed_opt};
use crate::ids::{NotebookId, ProjectId, VersionId};

column_enum! {
    /// How a version was made.
    pub enum VersionKind {
        Save = "save",
        Sync = "sync",
        Restore = "restore",
        Fork = "fork",
        Branch = "branch",
        Import = "import",
        Session = "session",
    }
}

column_enum! {
    /// Whether a version still loads (`Kept`) or was released by retention (`Pruned`, for good).
    pub enum VersionState {
        Kept = "kept",
        Pruned = "pruned",
    }
}

/// A row of the version index, as a commit writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionRow {
    pub notebook_id: NotebookId,
    pub project_id: ProjectId,
    pub revision: i64,
    pub version_id: VersionId,
    pub version_hash: Hash,
    pub tree_hash: Hash,
    pub parent_revision: Option<i64>,
    pub saved_at_ms: i64,
    pub author: String,
    pub message: String,
    pub kind: VersionKind,
    pub file_count: i64,
    pub logical_bytes: i64,
    /// What a session's teardown attached (seed 000 §4.7).
    #[serde(default)]
    pub snapshots: VersionSnapshots,
}

/// A snapshot file of a version: its node and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRef {
    pub node: Hash,
    pub bytes: i64,
}

/// The snapshots of a version, if it has any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSnapshots {
    pub html: Option<SnapshotRef>,
    pub session: Option<SnapshotRef>,
    pub captured_at_ms: Option<i64>,
}

/// An indexed version and its state.
#[derive(Debug, Clone)]
pub struct StoredVersion {
    pub row: VersionRow,
    pub state: VersionState,
}

const VERSION_COLUMNS: &str = "notebook_id, revision, version_id, project_id, version_hash, \
     tree_hash, parent_revision, saved_at_ms, author, message, kind, file_count, logical_bytes, state, \
     html_snapshot_hash, html_snapshot_bytes, session_snapshot_hash, session_snapshot_bytes, \
     snapshots_at_ms";

fn snapshot_col(r: &sqlx::any::AnyRow, name: &str) -> Result<Option<SnapshotRef>, sqlx::Error> {
    let node: Option<Hash> = parsed_opt(r, &format!("{name}_snapshot_hash"))?;
    let bytes: Option<i64> = r.try_get(format!("{name}_snapshot_bytes").as_str())?;
    Ok(node.map(|node| SnapshotRef {
        node,
        bytes: bytes.unwrap_or(0),
    }))
}

fn stored(r: &sqlx::any::AnyRow) -> Result<StoredVersion, sqlx::Error> {
    Ok(StoredVersion {
        row: VersionRow {
            notebook_id: parsed(r, "notebook_id")?,
            project_id: parsed(r, "project_id")?,
            revision: r.try_get("revision")?,
            version_id: parsed(r, "version_id")?,
            version_hash: parsed(r, "version_hash")?,
            tree_hash: parsed(r, "tree_hash")?,
            parent_revision: r.try_get("parent_revision")?,
            saved_at_ms: r.try_get("saved_at_ms")?,
            author: r.try_get("author")?,
            message: r.try_get("message")?,
            kind: enum_col(r, "kind")?,
            file_count: r.try_get("file_count")?,
            logical_bytes: r.try_get("logical_bytes")?,
            snapshots: VersionSnapshots {
                html: snapshot_col(r, "html")?,
                session: snapshot_col(r, "session")?,
                captured_at_ms: r.try_get("snapshots_at_ms")?,
            },
        },
        state: enum_col(r, "state")?,
    })
}

/// What a project's version index sums to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionSums {
    /// File bytes of every kept version (clamped, never overflowing).
    pub logical_bytes: i64,
    pub kept: i64,
    pub pruned: i64,
}

impl HubStore {
    /// The version of `notebook` at `revision`.
    pub async fn version(
        &self,
        notebook: &NotebookId,
        revision: i64,
    ) -> Result<Option<StoredVersion>, sqlx::Error> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM hub_versions WHERE notebook_id = $1 AND revision = $2"
        )))
        .bind(notebook.as_str())
        .bind(revision)
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(stored).transpose()
    }

    /// The version of `notebook` with the id `version`.
    pub async fn version_by_id(
        &self,
        notebook: &NotebookId,
        version: &VersionId,
    ) -> Result<Option<StoredVersion>, sqlx::Error> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM hub_versions WHERE notebook_id = $1 AND version_id = $2"
        )))
        .bind(notebook.as_str())
        .bind(version.as_str())
        .fetch_optional(self.pool())
        .await?;
        row.as_ref().map(stored).transpose()
    }

    /// Versions newest first, at most `limit` below the revision `before`.
    pub async fn versions(
        &self,
        notebook: &NotebookId,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<StoredVersion>, sqlx::Error> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM hub_versions WHERE notebook_id = $1 AND revision < $2 \
             ORDER BY revision DESC LIMIT $3"
        )))
        .bind(notebook.as_str())
        .bind(before.unwrap_or(i64::MAX))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(stored).collect()
    }

    /// Kept versions of a notebook, oldest first: (revision, version node).
    pub async fn kept_versions(
        &self,
        notebook: &NotebookId,
    ) -> Result<Vec<(i64, Hash)>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT revision, version_hash FROM hub_versions WHERE notebook_id = $1 AND state = $2 \
             ORDER BY revision",
        )
        .bind(notebook.as_str())
        .bind(VersionState::Kept.as_str())
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("revision")?, parsed(r, "version_hash")?)))
            .collect()
    }

    /// Indexes committed versions (once: a replayed commit indexes nothing twice).
    pub async fn insert_versions(tx: &mut WriteTx, rows: &[VersionRow]) -> Result<(), sqlx::Error> {
        for r in rows {
            sqlx::query(
                "INSERT INTO hub_versions (notebook_id, revision, version_id, project_id, version_hash, \
                 tree_hash, parent_revision, saved_at_ms, author, message, kind, file_count, logical_bytes, state, \
                 html_snapshot_hash, html_snapshot_bytes, session_snapshot_hash, session_snapshot_bytes, \
                 snapshots_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) \
                 ON CONFLICT (notebook_id, revision) DO NOTHING",
            )
            .bind(r.notebook_id.as_str())
            .bind(r.revision)
            .bind(r.version_id.as_str())
            .bind(r.project_id.as_str())
            .bind(r.version_hash.to_string())
            .bind(r.tree_hash.to_string())
            .bind(r.parent_revision)
            .bind(r.saved_at_ms)
            .bind(&r.author)
            .bind(&r.message)
            .bind(r.kind.as_str())
            .bind(r.file_count)
            .bind(r.logical_bytes)
            .bind(VersionState::Kept.as_str())
            .bind(r.snapshots.html.map(|s| s.node.to_string()))
            .bind(r.snapshots.html.map(|s| s.bytes))
            .bind(r.snapshots.session.map(|s| s.node.to_string()))
            .bind(r.snapshots.session.map(|s| s.bytes))
            .bind(r.snapshots.captured_at_ms)
            .execute(tx.conn())
            .await?;
        }
        Ok(())
    }

    /// Marks versions of a notebook pruned (released by retention or a purge).
    pub async fn mark_pruned(
        tx: &mut WriteTx,
        notebook: &NotebookId,
        revisions: &[i64],
        now: i64,
    ) -> Result<(), sqlx::Error> {
        for chunk in revisions.chunks(500) {
            let list = chunk
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",");
            // The revisions are integers: inlining them is safe.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE hub_versions SET state = $1, pruned_at_ms = $2 \
                 WHERE notebook_id = $3 AND state = $4 AND revision IN ({list})"
            )))
            .bind(VersionState::Pruned.as_str())
            .bind(now)
            .bind(notebook.as_str())
            .bind(VersionState::Kept.as_str())
            .execute(tx.conn())
            .await?;
        }
        Ok(())
    }

    /// What a project's versions hold.
    pub async fn version_sums(&self, project: &ProjectId) -> Result<VersionSums, sqlx::Error> {
        let row = sqlx::query(
            // Summed as floating point (a legacy row can be huge; an integer SUM would fail
            // with an overflow), and clamped below.
            "SELECT CAST(COALESCE(SUM(CASE WHEN state = 'kept' THEN CAST(logical_bytes AS DOUBLE PRECISION) ELSE 0 END), 0) AS DOUBLE PRECISION) AS logical, \
             CAST(COALESCE(SUM(CASE WHEN state = 'kept' THEN 1 ELSE 0 END), 0) AS BIGINT) AS kept, \
             CAST(COALESCE(SUM(CASE WHEN state = 'pruned' THEN 1 ELSE 0 END), 0) AS BIGINT) AS pruned \
             FROM hub_versions WHERE project_id = $1",
        )
        .bind(project.as_str())
        .fetch_one(self.pool())
        .await?;
        let logical: f64 = row.try_get("logical")?;
        Ok(VersionSums {
            logical_bytes: if logical >= i64::MAX as f64 {
                i64::MAX
            } else {
                logical.max(0.0) as i64
            },
            kept: row.try_get("kept")?,
            pruned: row.try_get("pruned")?,
        })
    }

    /// When each kept version of a project was saved and its logical bytes, oldest first; at
    /// most `limit` (the most recent ones).
    pub async fn kept_version_sizes(
        &self,
        project: &ProjectId,
        limit: i64,
    ) -> Result<Vec<(i64, i64)>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT saved_at_ms, logical_bytes FROM hub_versions \
             WHERE project_id = $1 AND state = 'kept' \
             ORDER BY saved_at_ms DESC, notebook_id DESC, revision DESC LIMIT $2",
        )
        .bind(project.as_str())
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let mut out = rows
            .iter()
            .map(|r| Ok((r.try_get("saved_at_ms")?, r.try_get("logical_bytes")?)))
            .collect::<Result<Vec<(i64, i64)>, sqlx::Error>>()?;
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_states_round_trip() {
        for k in [
            VersionKind::Save,
            VersionKind::Sync,
            VersionKind::Restore,
            VersionKind::Fork,
            VersionKind::Branch,
            VersionKind::Import,
            VersionKind::Session,
        ] {
            assert_eq!(VersionKind::parse(k.as_str()), Some(k));
            assert_eq!(
                serde_json::to_value(k).ok(),
                Some(serde_json::Value::from(k.as_str()))
            );
        }
        for s in [VersionState::Kept, VersionState::Pruned] {
            assert_eq!(VersionState::parse(s.as_str()), Some(s));
        }
        assert_eq!(VersionKind::parse("merge"), None);
    }
}
