//! Committing versions of a notebook, and releasing them. The caller holds the notebook's
//! lock. A commit stores the version nodes (and whatever of the plan they need), then, in one
//! local transaction, allocates the next revision numbers above the highest ever allocated
//! and writes the outbox row; then acquires the versions' root refs; then indexes them and
//! moves the head (see [`crate::outbox`] for what happens after a crash). Retention beyond
//! `UNICAS_HUB_MAX_VERSIONS` and purges release versions in negative deltas the same way.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use cas_client::files::svalue_node;
use cas_client::{Plan, TreeStats};
use cas_format::{Hash, Value};

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, VersionId};
use crate::lock::LockKey;
use crate::outbox::{Payload, Pending};
use crate::store::versions::{SnapshotRef, VersionSnapshots};
use crate::store::{EventRow, HubStore, NotebookRow, VersionKind, VersionRow};
use crate::workspace::Committed;

/// The `kind` of version nodes.
pub const VERSION_KIND: &str = "notebook-version";

/// How a new version is parented.
#[derive(Debug, Clone, Copy)]
pub enum Parent {
    None,
    Revision(i64),
    /// The version before it in the same commit.
    Previous,
}

/// A version to commit.
#[derive(Debug, Clone)]
pub struct VersionSpec {
    pub tree: Hash,
    pub stats: TreeStats,
    pub author: String,
    pub message: String,
    pub kind: VersionKind,
    pub saved_at_ms: i64,
    pub parent: Parent,
    /// Extra string fields of the version node (e.g. `git_commit`, `imported_from`).
    pub extra: BTreeMap<String, String>,
    /// Rendered artifacts of a session's teardown, attached as leaves of the version node.
    pub snapshots: Vec<Snapshot>,
}

/// What a session's teardown renders (seed 000 §4.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotKind {
    /// `marimo export html`: the notebook with its outputs (`html_snapshot`).
    Html,
    /// marimo's session state file (`session_snapshot`).
    Session,
}

/// A snapshot file planned into the commit.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub kind: SnapshotKind,
    pub file: cas_client::FileRef,
    pub captured_at_ms: i64,
}

impl Snapshot {
    fn field(&self) -> &'static str {
        match self.kind {
            SnapshotKind::Html => "html_snapshot",
            SnapshotKind::Session => "session_snapshot",
        }
    }
}

fn snapshots_of(spec: &VersionSpec) -> VersionSnapshots {
    let find = |k: SnapshotKind| {
        spec.snapshots
            .iter()
            .find(|s| s.kind == k)
            .map(|s| SnapshotRef {
                node: s.file.node,
                bytes: i64::try_from(s.file.size).unwrap_or(i64::MAX),
            })
    };
    VersionSnapshots {
        html: find(SnapshotKind::Html),
        session: find(SnapshotKind::Session),
        captured_at_ms: spec.snapshots.iter().map(|s| s.captured_at_ms).max(),
    }
}

/// The version node of `spec` as revision `revision`.
fn version_node(
    nb: &NotebookRow,
    spec: &VersionSpec,
    revision: i64,
    version_id: &VersionId,
    parent_id: Option<&VersionId>,
) -> HubResult<Bytes> {
    let mut fields: Vec<(String, Value)> = vec![
        ("kind".into(), Value::from(VERSION_KIND)),
        ("schema_version".into(), Value::from(1i64)),
        ("notebook_id".into(), Value::from(nb.notebook_id.as_str())),
        ("version_id".into(), Value::from(version_id.as_str())),
        ("revision".into(), Value::from(revision)),
        (
            "saved_at".into(),
            Value::from(ids::rfc3339(spec.saved_at_ms).as_str()),
        ),
        ("author".into(), Value::from(spec.author.as_str())),
        ("message".into(), Value::from(spec.message.as_str())),
        ("source_kind".into(), Value::from(spec.kind.as_str())),
        ("workspace".into(), Value::Blob(spec.tree)),
        ("file_count".into(), Value::from(spec.stats.files)),
        ("size_bytes".into(), Value::from(spec.stats.bytes)),
    ];
    if let Some(p) = parent_id {
        fields.push(("parent_id".into(), Value::from(p.as_str())));
    }
    for (k, v) in &spec.extra {
        fields.push((k.clone(), Value::from(v.as_str())));
    }
    for snap in &spec.snapshots {
        let descriptor: Vec<(String, Value)> = vec![
            (
                "captured_at".into(),
                Value::from(ids::rfc3339(snap.captured_at_ms).as_str()),
            ),
            (
                "size_bytes".into(),
                Value::from(i64::try_from(snap.file.size).unwrap_or(i64::MAX)),
            ),
            ("chunked".into(), Value::Bool(snap.file.chunked)),
            ("content".into(), Value::Blob(snap.file.node)),
        ];
        fields.push((
            snap.field().into(),
            Value::Map(descriptor.into_iter().collect()),
        ));
    }
    svalue_node(&Value::Map(fields.into_iter().collect()))
        .map_err(|e| HubError::internal("cannot encode a version", e))
}

impl Hub {
    /// Commits versions of `nb` (the caller holds its lock). With `move_head`, the head moves
    /// to the last one.
    pub async fn commit_versions(
        &self,
        nb: &NotebookRow,
        mut plan: Plan,
        specs: Vec<VersionSpec>,
        move_head: bool,
    ) -> HubResult<Vec<Committed>> {
        let space = nb.project_id.space();
        let mut rows = Vec::with_capacity(specs.len());
        let mut portables: HashMap<Hash, Bytes> = HashMap::new();
        let mut roots = Vec::with_capacity(specs.len());
        let mut previous: Option<(i64, VersionId)> = None;
        for (i, spec) in specs.into_iter().enumerate() {
            let revision = nb.max_revision + 1 + i as i64;
            let version_id = VersionId::generate();
            let (parent_revision, parent_id) = match (spec.parent, &previous) {
                (Parent::None, _) => (None, None),
                (Parent::Previous, Some((r, id))) => (Some(*r), Some(id.clone())),
                // `Previous` at the start of a batch: the revision before the batch.
                (Parent::Previous, None) | (Parent::Revision(_), _) => {
                    let r = match spec.parent {
                        Parent::Revision(r) => r,
                        _ => nb.max_revision,
                    };
                    let id = self
                        .store
                        .version(&nb.notebook_id, r)
                        .await?
                        .map(|v| v.row.version_id);
                    (id.is_some().then_some(r), id)
                }
            };
            let portable = version_node(nb, &spec, revision, &version_id, parent_id.as_ref())?;
            let hash = plan
                .add_portable(portable.clone())
                .map_err(|e| HubError::internal("cannot plan a version", e))?;
            portables.insert(hash, portable);
            roots.push(hash);
            rows.push(VersionRow {
                notebook_id: nb.notebook_id.clone(),
                project_id: nb.project_id.clone(),
                revision,
                version_id: version_id.clone(),
                version_hash: hash,
                tree_hash: spec.tree,
                parent_revision,
                saved_at_ms: spec.saved_at_ms,
                author: spec.author.clone(),
                message: spec.message.clone(),
                kind: spec.kind,
                file_count: spec.stats.files,
                logical_bytes: spec.stats.bytes,
                snapshots: snapshots_of(&spec),
            });
            previous = Some((revision, version_id));
        }
        let Some(last) = rows.last().cloned() else {
            return Ok(Vec::new());
        };
        let report = self.uploader(&space, &plan)?.run(&roots).await?;
        let events = rows
            .iter()
            .map(|r| {
                EventRow::new(
                    &match r.kind {
                        // Seed 000's name for a push-synced revision.
                        VersionKind::Sync => "notebook.synced.sync".to_string(),
                        kind => format!("notebook.{}", kind.as_str()),
                    },
                    &r.author,
                    Some(&r.project_id),
                    Some(&r.notebook_id),
                    serde_json::json!({"revision": r.revision, "version_id": r.version_id}),
                )
            })
            .collect();
        let pending = Pending {
            request_id: format!("hub:versions:{}:{}", nb.notebook_id, rows[0].revision),
            lock_key: LockKey::notebook(&nb.notebook_id),
            space,
            changes: roots.iter().map(|h| (*h, 1)).collect(),
            payload: Payload::Versions {
                rows: rows.clone(),
                move_head,
                events,
            },
            root_node: (roots.len() == 1).then(|| portables[&roots[0]].clone()),
        };
        let mut tx = self.store.write().await?;
        if !HubStore::allocate_revisions(&mut tx, &nb.notebook_id, nb.max_revision, last.revision)
            .await?
        {
            return Err(HubError::conflict(
                "the notebook's revisions moved while it was held; retry",
            ));
        }
        pending.insert(&mut tx).await?;
        tx.commit().await?;
        self.complete(&pending, false).await?;
        if move_head {
            self.prune(&nb.notebook_id).await?;
        }
        Ok(rows
            .into_iter()
            .map(|r| Committed {
                notebook_id: r.notebook_id,
                project_id: r.project_id,
                version_id: r.version_id,
                revision: r.revision,
                saved_at: ids::rfc3339(r.saved_at_ms),
                file_count: r.file_count,
                size_bytes: r.logical_bytes,
                tree: r.tree_hash.to_string(),
                uploaded_nodes: report.uploaded_nodes,
                uploaded_bytes: report.uploaded_bytes,
            })
            .collect())
    }

    /// Commits the first revision(s) of a notebook that was just created (nobody else knows
    /// it yet), in batches of 500.
    pub async fn commit_new(
        &self,
        notebook: &NotebookId,
        plan: Plan,
        specs: Vec<VersionSpec>,
    ) -> HubResult<Vec<Committed>> {
        self.with_notebook_lock(notebook, async || {
            self.commit_new_locked(notebook, plan, specs).await
        })
        .await
    }

    /// As [`Self::commit_new`], for a caller that holds the notebook's lock.
    pub(crate) async fn commit_new_locked(
        &self,
        notebook: &NotebookId,
        plan: Plan,
        mut specs: Vec<VersionSpec>,
    ) -> HubResult<Vec<Committed>> {
        let mut out = Vec::new();
        let mut plan = Some(plan);
        while !specs.is_empty() {
            let rest = specs.split_off(specs.len().min(500));
            let nb = self
                .store
                .notebook(notebook)
                .await?
                .ok_or_else(|| HubError::internal("a new notebook has no row", notebook))?;
            let batch = std::mem::replace(&mut specs, rest);
            out.extend(
                self.commit_versions(&nb, plan.take().unwrap_or_default(), batch, true)
                    .await?,
            );
        }
        Ok(out)
    }

    /// Retention: beyond `max_versions` kept versions, the oldest (never the head) are released
    /// in one negative delta and marked pruned. The caller holds the notebook's lock.
    async fn prune(&self, notebook: &NotebookId) -> HubResult<()> {
        let max = self.config.max_versions;
        if max == 0 {
            return Ok(());
        }
        let Some(nb) = self.store.notebook(notebook).await? else {
            return Ok(());
        };
        let kept = self.store.kept_versions(notebook).await?;
        if (kept.len() as u64) <= max {
            return Ok(());
        }
        let mut keep_left = max;
        let mut release = Vec::new();
        for (rev, hash) in kept.into_iter().rev() {
            if Some(rev) == nb.head_revision || keep_left > 0 {
                keep_left = keep_left.saturating_sub(1);
                continue;
            }
            release.push((rev, hash));
        }
        self.release(&nb, release, false, "hub").await
    }

    /// Releases the root refs of `versions` (one delta per thousand) and marks them pruned;
    /// with `purge`, the notebook becomes purged. The caller holds the notebook's lock.
    pub(crate) async fn release(
        &self,
        nb: &NotebookRow,
        versions: Vec<(i64, Hash)>,
        purge: bool,
        actor: &str,
    ) -> HubResult<()> {
        let chunks: Vec<&[(i64, Hash)]> = if versions.is_empty() {
            vec![&[]]
        } else {
            versions.chunks(cas_format::wire::MAX_CHANGES).collect()
        };
        let count = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let last = i + 1 == count;
            let revisions: Vec<i64> = chunk.iter().map(|(r, _)| *r).collect();
            let what = if purge { "purge" } else { "prune" };
            let event = EventRow::new(
                &format!("notebook.{what}"),
                actor,
                Some(&nb.project_id),
                Some(&nb.notebook_id),
                serde_json::json!({"revisions": revisions}),
            );
            let pending = Pending {
                request_id: format!(
                    "hub:{what}:{}:{}:{}",
                    nb.notebook_id,
                    revisions.first().copied().unwrap_or(0),
                    revisions.last().copied().unwrap_or(0)
                ),
                lock_key: LockKey::notebook(&nb.notebook_id),
                space: nb.project_id.space(),
                changes: chunk.iter().map(|(_, h)| (*h, -1)).collect(),
                payload: Payload::Release {
                    notebook_id: nb.notebook_id.clone(),
                    revisions,
                    purge: purge && last,
                    events: vec![event],
                },
                root_node: None,
            };
            if pending.changes.is_empty() {
                // Nothing to release: only the local commit.
                self.commit_without_delta(&pending).await?;
            } else {
                self.record_and_complete(&pending).await?;
            }
        }
        Ok(())
    }

    /// Kept versions of a notebook, oldest first: (revision, version node).
    pub async fn kept_versions(&self, notebook: &NotebookId) -> HubResult<Vec<(i64, Hash)>> {
        Ok(self.store.kept_versions(notebook).await?)
    }
}
