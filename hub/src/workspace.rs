//! Notebooks as workspaces with revisions (seed 002 rules), stored as CAS nodes.
//!
//! A revision is a version node (an SValue) referencing the workspace tree. Committing one
//! happens while the notebook's lock is held: check the expected revision against the head,
//! build the new tree from the base tree (only the directories on changed paths are new
//! nodes), store what is missing, allocate the next revision number above the highest ever
//! allocated and write the outbox row in one transaction, acquire the version's root ref, then
//! index the version and move the head. See [`crate::outbox`] for what happens after a crash.

use std::collections::{BTreeMap, HashMap};

use axum::http::StatusCode;
use bytes::Bytes;
use cas_client::files::{FileRef, plan_bytes, svalue_node};
use cas_client::{Change, ClientError, Entry, Plan, TreeStats, Uploader};
use cas_format::{Hash, SpaceId, Value};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use crate::Hub;
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::outbox::{EventRow, Payload, Pending, VersionRow};

/// Content type of version nodes' `kind`.
pub const VERSION_KIND: &str = "notebook-version";
/// Longest path inside a workspace, in bytes.
pub const MAX_PATH_BYTES: usize = cas_client::tree::MAX_PATH_BYTES;
/// Deepest path inside a workspace.
pub const MAX_PATH_DEPTH: usize = cas_client::tree::MAX_PATH_DEPTH;
/// Longest commit message.
pub const MAX_MESSAGE: usize = 4096;

/// The mutable head of a notebook.
#[derive(Debug, Clone)]
pub struct NotebookRow {
    pub notebook_id: String,
    pub project_id: String,
    pub state: String,
    pub head_revision: Option<i64>,
    pub max_revision: i64,
    pub sync_token_hash: Option<String>,
    /// Whom the sync token acts for (`None`: the notebook's author).
    pub sync_token_owner: Option<String>,
    pub updated_at_ms: i64,
}

/// One indexed version.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionView {
    pub version_id: String,
    pub notebook_id: String,
    pub revision: i64,
    pub saved_at: String,
    pub author: String,
    pub message: String,
    pub parent_revision: Option<i64>,
    /// How it was made: `save`, `sync`, `restore`, `fork`, `branch`, `import`.
    pub kind: String,
    pub file_count: i64,
    /// Logical bytes of the files of this version.
    pub size_bytes: i64,
    /// `kept`, or `pruned` by retention (then it no longer loads: 410).
    pub state: String,
    pub is_head: bool,
    /// The version node.
    pub hash: String,
    /// The workspace tree node.
    pub tree: String,
}

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

/// What a commit produced.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Committed {
    pub notebook_id: String,
    pub project_id: String,
    pub version_id: String,
    pub revision: i64,
    pub saved_at: String,
    pub file_count: i64,
    pub size_bytes: i64,
    pub tree: String,
    /// Nodes and bytes the commit had to upload (unchanged content costs nothing).
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
}

impl From<cas_client::WalkedEntry> for ListedEntry {
    fn from(w: cas_client::WalkedEntry) -> Self {
        let (kind, size, executable, target) = match w.entry {
            Entry::File { file, executable } => ("file", Some(file.size), executable, None),
            Entry::Dir { .. } => ("dir", None, false, None),
            Entry::Symlink { target } => ("symlink", None, false, Some(target)),
        };
        ListedEntry {
            path: w.path,
            kind: kind.into(),
            size,
            executable,
            target,
        }
    }
}

/// One entry of a workspace listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ListedEntry {
    pub path: String,
    /// `file`, `dir` or `symlink`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

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
    pub kind: String,
    pub saved_at_ms: i64,
    pub parent: Parent,
    /// Extra string fields of the version node (e.g. `git_commit`, `imported_from`).
    pub extra: BTreeMap<String, String>,
}

pub fn project_space(project_id: &str) -> HubResult<SpaceId> {
    project_id
        .parse()
        .map_err(|_| HubError::internal("bad project id", project_id))
}

/// Splits and checks a workspace path (see [`cas_client::parse_path`]).
pub fn parse_path(path: &str) -> HubResult<Vec<String>> {
    cas_client::parse_path(path).map_err(|e| HubError::invalid(e.to_string()))
}

pub(crate) fn edit_error(e: ClientError) -> HubError {
    match e {
        ClientError::Invalid(m) => HubError::invalid(m),
        other => other.into(),
    }
}

fn conflict(expected: Option<i64>, actual: Option<i64>) -> HubError {
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

fn pruned(revision: i64) -> HubError {
    HubError::new(
        StatusCode::GONE,
        "revision_pruned",
        format!("revision {revision} was pruned by retention; it stays listed but no longer loads"),
    )
    .with("revision", revision)
}

fn parse_hash(s: &str) -> HubResult<Hash> {
    s.parse()
        .map_err(|e| HubError::internal("a stored hash is invalid", e))
}

fn version_view(row: &sqlx::any::AnyRow, head: Option<i64>) -> HubResult<VersionView> {
    let revision: i64 = row.try_get("revision")?;
    Ok(VersionView {
        version_id: row.try_get("version_id")?,
        notebook_id: row.try_get("notebook_id")?,
        revision,
        saved_at: ids::rfc3339(row.try_get("saved_at_ms")?),
        author: row.try_get("author")?,
        message: row.try_get("message")?,
        parent_revision: row.try_get("parent_revision")?,
        kind: row.try_get("kind")?,
        file_count: row.try_get("file_count")?,
        size_bytes: row.try_get("logical_bytes")?,
        state: row.try_get("state")?,
        is_head: head == Some(revision),
        hash: row.try_get("version_hash")?,
        tree: row.try_get("tree_hash")?,
    })
}

const VERSION_COLUMNS: &str = "notebook_id, revision, version_id, version_hash, tree_hash, parent_revision, \
     saved_at_ms, author, message, kind, file_count, logical_bytes, state";

impl Hub {
    pub async fn notebook_row(&self, notebook_id: &str) -> HubResult<Option<NotebookRow>> {
        let row = sqlx::query(
            "SELECT notebook_id, project_id, state, head_revision, max_revision, sync_token_hash, \
             sync_token_owner, updated_at_ms FROM hub_notebooks WHERE notebook_id = $1",
        )
        .bind(notebook_id)
        .fetch_optional(&self.db.pool)
        .await?;
        row.map(|r| {
            Ok(NotebookRow {
                notebook_id: r.try_get("notebook_id")?,
                project_id: r.try_get("project_id")?,
                state: r.try_get("state")?,
                head_revision: r.try_get("head_revision")?,
                max_revision: r.try_get("max_revision")?,
                sync_token_hash: r.try_get("sync_token_hash")?,
                sync_token_owner: r.try_get("sync_token_owner")?,
                updated_at_ms: r.try_get("updated_at_ms")?,
            })
        })
        .transpose()
    }

    /// The notebook row of a live notebook of `project_id`, or 404.
    pub async fn live_notebook(
        &self,
        project_id: &str,
        notebook_id: &str,
    ) -> HubResult<NotebookRow> {
        match self.notebook_row(notebook_id).await? {
            Some(r) if r.project_id == project_id && r.state == "live" => Ok(r),
            _ => Err(HubError::not_found(format!(
                "notebook {notebook_id} not found"
            ))),
        }
    }

    /// One version by revision.
    pub async fn version(&self, nb: &NotebookRow, revision: i64) -> HubResult<Option<VersionView>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM hub_versions WHERE notebook_id = $1 AND revision = $2"
        )))
        .bind(&nb.notebook_id)
        .bind(revision)
        .fetch_optional(&self.db.pool)
        .await?;
        row.map(|r| version_view(&r, nb.head_revision)).transpose()
    }

    /// One version by id.
    pub async fn version_by_id(
        &self,
        nb: &NotebookRow,
        version_id: &str,
    ) -> HubResult<VersionView> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM hub_versions WHERE notebook_id = $1 AND version_id = $2"
        )))
        .bind(&nb.notebook_id)
        .bind(version_id)
        .fetch_optional(&self.db.pool)
        .await?;
        match row {
            Some(r) => version_view(&r, nb.head_revision),
            None => Err(HubError::not_found(format!(
                "version {version_id} not found"
            ))),
        }
    }

    /// Versions newest first, `limit` after the revision `before`.
    pub async fn versions(
        &self,
        nb: &NotebookRow,
        before: Option<i64>,
        limit: u32,
    ) -> HubResult<Vec<VersionView>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {VERSION_COLUMNS} FROM hub_versions WHERE notebook_id = $1 AND revision < $2 \
             ORDER BY revision DESC LIMIT $3"
        )))
        .bind(&nb.notebook_id)
        .bind(before.unwrap_or(i64::MAX))
        .bind(i64::from(limit))
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| version_view(r, nb.head_revision))
            .collect()
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
            Some(v) if v.state == "pruned" => Err(pruned(rev)),
            Some(v) => Ok(v),
            None => Err(HubError::not_found(format!("revision {rev} not found"))),
        }
    }

    /// The file at `path` of a version, or 404.
    pub async fn file_at(
        &self,
        project_id: &str,
        v: &VersionView,
        path: &str,
    ) -> HubResult<FileRef> {
        let parts = parse_path(path)?;
        let space = project_space(project_id)?;
        match self
            .cas
            .lookup_path(&space, &parse_hash(&v.tree)?, &parts)
            .await?
        {
            Some(Entry::File { file, .. }) => Ok(file),
            _ => Err(HubError::not_found(format!(
                "no file {path:?} in revision {}",
                v.revision
            ))),
        }
    }

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
            let given = [
                input.content.is_some(),
                input.content_base64.is_some(),
                input.staged.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if given != 1 {
                return Err(HubError::invalid(format!(
                    "{path:?}: give exactly one of content, content_base64 and staged"
                )));
            }
            let file = if let Some(text) = input.content {
                plan_bytes(plan, text.as_bytes()).map_err(edit_error)?
            } else if let Some(b64) = input.content_base64 {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|e| HubError::invalid(format!("{path:?}: content_base64: {e}")))?;
                plan_bytes(plan, &bytes).map_err(edit_error)?
            } else if let Some(staged) = input.staged {
                self.check_staged(space, &staged).await?;
                FileRef {
                    node: staged.node,
                    size: staged.size,
                    chunked: staged.chunked,
                }
            } else {
                unreachable!("exactly one input was counted above")
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
        let bad = || {
            HubError::invalid(format!(
                "staged file {} is not an upload of this project (upload it again)",
                staged.node
            ))
        };
        let meta = match self.cas.read_metadata(space, &staged.node).await {
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
            let content = self.cas.read_svalue_node(space, &staged.node).await?;
            let (v, _) = cas_format::svalue::decode(&content).map_err(|_| bad())?;
            if v.get("kind").and_then(Value::as_str) != Some(cas_client::files::CHUNKED_FILE)
                || v.get("size").and_then(Value::as_i64) != Some(staged.size as i64)
            {
                return Err(bad());
            }
        }
        // Protect it until the save's own leases and root ref take over.
        self.cas
            .lease_node(space, &staged.node, self.config.lease_ms, None)
            .await?;
        Ok(())
    }

    /// Saves a workspace (seed 002): holds the notebook, checks `expected_revision`, writes one
    /// new revision from the head's tree plus the changes.
    pub async fn save(
        &self,
        project_id: &str,
        notebook_id: &str,
        actor: &str,
        req: SaveRequest,
        kind: &str,
    ) -> HubResult<Committed> {
        let message = check_message(req.message.as_deref())?;
        let space = project_space(project_id)?;
        // Planning leaves and checking staged files needs no lock.
        let mut plan = Plan::default();
        let changes = self
            .plan_changes(&space, &mut plan, req.files, req.deleted)
            .await?;
        let guard = self.lock(&notebook_lock(notebook_id)).await?;
        let result = async {
            self.settle(&notebook_lock(notebook_id)).await?;
            let nb = self.live_notebook(project_id, notebook_id).await?;
            if req.expected_revision != nb.head_revision {
                return Err(conflict(req.expected_revision, nb.head_revision));
            }
            let (base_tree, base_stats) = match nb.head_revision {
                Some(rev) => {
                    let v = self.loadable(&nb, Some(rev)).await?;
                    (
                        Some(parse_hash(&v.tree)?),
                        TreeStats {
                            files: v.file_count,
                            bytes: v.size_bytes,
                        },
                    )
                }
                None => (None, TreeStats::default()),
            };
            let (tree, delta) = self
                .cas
                .plan_tree_edit(&space, &mut plan, base_tree, changes)
                .await
                .map_err(edit_error)?;
            let spec = VersionSpec {
                tree,
                stats: TreeStats {
                    files: base_stats.files.saturating_add(delta.files),
                    bytes: base_stats.bytes.saturating_add(delta.bytes),
                },
                author: actor.to_string(),
                message,
                kind: kind.to_string(),
                saved_at_ms: ids::now_ms(),
                parent: nb.head_revision.map_or(Parent::None, Parent::Revision),
                extra: BTreeMap::new(),
            };
            let mut done = self.commit_versions(&nb, plan, vec![spec], true).await?;
            Ok(done.remove(0))
        }
        .await;
        guard.release().await;
        result
    }

    /// Commits versions of `nb` (the caller holds its lock): stores the version nodes (and
    /// whatever of `plan` they need), then the outbox row and the revision allocation, then
    /// the root refs, then the index. With `move_head`, the head moves to the last one.
    pub async fn commit_versions(
        &self,
        nb: &NotebookRow,
        mut plan: Plan,
        specs: Vec<VersionSpec>,
        move_head: bool,
    ) -> HubResult<Vec<Committed>> {
        let space = project_space(&nb.project_id)?;
        let mut rows = Vec::with_capacity(specs.len());
        let mut portables: HashMap<Hash, Bytes> = HashMap::new();
        let mut roots = Vec::with_capacity(specs.len());
        let mut previous: Option<(i64, String)> = None;
        for (i, spec) in specs.into_iter().enumerate() {
            let revision = nb.max_revision + 1 + i as i64;
            let version_id = ids::version_id();
            let (parent_revision, parent_id) = match spec.parent {
                Parent::None => (None, None),
                Parent::Previous if previous.is_some() => {
                    let (r, id) = previous.clone().unwrap_or_default();
                    (Some(r), Some(id))
                }
                Parent::Previous | Parent::Revision(_) => {
                    // `Previous` at the start of a batch: the revision before the batch.
                    let r = match spec.parent {
                        Parent::Revision(r) => r,
                        _ => nb.max_revision,
                    };
                    let id: Option<String> = sqlx::query_scalar(
                        "SELECT version_id FROM hub_versions WHERE notebook_id = $1 AND revision = $2",
                    )
                    .bind(&nb.notebook_id)
                    .bind(r)
                    .fetch_optional(&self.db.pool)
                    .await?;
                    (id.is_some().then_some(r), id)
                }
            };
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
            if let Some(p) = &parent_id {
                fields.push(("parent_id".into(), Value::from(p.as_str())));
            }
            for (k, v) in &spec.extra {
                fields.push((k.clone(), Value::from(v.as_str())));
            }
            let value = Value::Map(fields.into_iter().collect());
            let portable = svalue_node(&value)
                .map_err(|e| HubError::internal("cannot encode a version", e))?;
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
                kind: spec.kind.clone(),
                file_count: spec.stats.files,
                logical_bytes: spec.stats.bytes,
            });
            previous = Some((revision, version_id));
        }
        let Some(last) = rows.last().cloned() else {
            return Ok(Vec::new());
        };
        let report = Uploader::new(
            &self.cas,
            &space,
            &plan,
            self.config.lease_ms,
            self.config.parallelism,
        )
        .run(&roots)
        .await?;
        let events = rows
            .iter()
            .map(|r| {
                EventRow::new(
                    &format!("notebook.{}", r.kind),
                    &r.author,
                    Some(&r.project_id),
                    Some(&r.notebook_id),
                    serde_json::json!({"revision": r.revision, "version_id": r.version_id}),
                )
            })
            .collect();
        let pending = Pending {
            request_id: format!("hub:versions:{}:{}", nb.notebook_id, rows[0].revision),
            lock_key: notebook_lock(&nb.notebook_id),
            space,
            changes: roots.iter().map(|h| (*h, 1)).collect(),
            payload: Payload::Versions {
                rows: rows.clone(),
                move_head,
                events,
            },
            root_node: (roots.len() == 1).then(|| portables[&roots[0]].clone()),
        };
        let mut tx = self.db.write().await?;
        let allocated = sqlx::query(
            "UPDATE hub_notebooks SET max_revision = $1 WHERE notebook_id = $2 AND max_revision = $3",
        )
        .bind(last.revision)
        .bind(&nb.notebook_id)
        .bind(nb.max_revision)
        .execute(tx.conn())
        .await?
        .rows_affected();
        if allocated != 1 {
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

    /// Retention: beyond `max_versions` kept versions, the oldest (never the head) are released
    /// in one negative delta and marked pruned. The caller holds the notebook's lock.
    async fn prune(&self, notebook_id: &str) -> HubResult<()> {
        let max = self.config.max_versions;
        if max == 0 {
            return Ok(());
        }
        let Some(nb) = self.notebook_row(notebook_id).await? else {
            return Ok(());
        };
        let kept = sqlx::query(
            "SELECT revision, version_hash FROM hub_versions WHERE notebook_id = $1 AND state = 'kept' \
             ORDER BY revision DESC",
        )
        .bind(notebook_id)
        .fetch_all(&self.db.pool)
        .await?;
        if (kept.len() as u64) <= max {
            return Ok(());
        }
        let mut keep_left = max;
        let mut release = Vec::new();
        for r in &kept {
            let rev: i64 = r.try_get("revision")?;
            if Some(rev) == nb.head_revision || keep_left > 0 {
                keep_left = keep_left.saturating_sub(1);
                continue;
            }
            let h: String = r.try_get("version_hash")?;
            release.push((rev, parse_hash(&h)?));
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
        let space = project_space(&nb.project_id)?;
        let chunks: Vec<&[(i64, Hash)]> = if versions.is_empty() {
            vec![&[]]
        } else {
            versions
                .chunks(cas_service::root_refs::MAX_CHANGES)
                .collect()
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
                lock_key: notebook_lock(&nb.notebook_id),
                space: space.clone(),
                changes: chunk.iter().map(|(_, h)| (*h, -1)).collect(),
                payload: Payload::Release {
                    notebook_id: nb.notebook_id.clone(),
                    revisions,
                    purge: purge && last,
                    events: vec![event],
                },
                root_node: None,
            };
            let mut tx = self.db.write().await?;
            pending.insert(&mut tx).await?;
            tx.commit().await?;
            if pending.changes.is_empty() {
                // Nothing to release: only the local commit.
                let mut tx = self.db.write().await?;
                sqlx::query("DELETE FROM hub_pending WHERE request_id = $1")
                    .bind(&pending.request_id)
                    .execute(tx.conn())
                    .await?;
                tx.commit().await?;
                self.release_local(&pending).await?;
            } else {
                self.complete(&pending, false).await?;
            }
        }
        Ok(())
    }

    /// The local half of a release without a delta.
    async fn release_local(&self, p: &Pending) -> HubResult<()> {
        if let Payload::Release {
            notebook_id,
            purge: true,
            events,
            ..
        } = &p.payload
        {
            let mut tx = self.db.write().await?;
            sqlx::query(
                "UPDATE hub_notebooks SET state = 'purged', head_revision = NULL, sync_token_hash = NULL, \
                 updated_at_ms = $1 WHERE notebook_id = $2",
            )
            .bind(ids::now_ms())
            .bind(notebook_id)
            .execute(tx.conn())
            .await?;
            for e in events {
                e.insert(&mut tx).await?;
            }
            tx.commit().await?;
        }
        Ok(())
    }

    /// Kept versions of a notebook, oldest first: (revision, version node).
    pub async fn kept_versions(&self, notebook_id: &str) -> HubResult<Vec<(i64, Hash)>> {
        let rows = sqlx::query(
            "SELECT revision, version_hash FROM hub_versions WHERE notebook_id = $1 AND state = 'kept' ORDER BY revision",
        )
        .bind(notebook_id)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("revision")?,
                    parse_hash(&r.try_get::<String, _>("version_hash")?)?,
                ))
            })
            .collect()
    }

    /// Writes a new revision with the tree of version `version_id` (seed 000 restore).
    pub async fn restore_version(
        &self,
        project_id: &str,
        notebook_id: &str,
        version_id: &str,
        expected_revision: Option<i64>,
        actor: &str,
    ) -> HubResult<Committed> {
        let guard = self.lock(&notebook_lock(notebook_id)).await?;
        let result = async {
            self.settle(&notebook_lock(notebook_id)).await?;
            let nb = self.live_notebook(project_id, notebook_id).await?;
            if let Some(e) = expected_revision
                && Some(e) != nb.head_revision
            {
                return Err(conflict(Some(e), nb.head_revision));
            }
            let v = self.version_by_id(&nb, version_id).await?;
            if v.state == "pruned" {
                return Err(pruned(v.revision));
            }
            let spec = VersionSpec {
                tree: parse_hash(&v.tree)?,
                stats: TreeStats {
                    files: v.file_count,
                    bytes: v.size_bytes,
                },
                author: actor.to_string(),
                message: format!("Restored revision {}", v.revision),
                kind: "restore".into(),
                saved_at_ms: ids::now_ms(),
                parent: nb.head_revision.map_or(Parent::None, Parent::Revision),
                extra: BTreeMap::from([("restored_from".to_string(), v.version_id.clone())]),
            };
            let mut done = self
                .commit_versions(&nb, Plan::default(), vec![spec], true)
                .await?;
            Ok(done.remove(0))
        }
        .await;
        guard.release().await;
        result
    }

    /// Commits the first revision(s) of a notebook that was just created (nobody else knows it).
    pub async fn commit_new(
        &self,
        notebook_id: &str,
        plan: Plan,
        specs: Vec<VersionSpec>,
    ) -> HubResult<Vec<Committed>> {
        let guard = self.lock(&notebook_lock(notebook_id)).await?;
        let result = async {
            let nb = self
                .notebook_row(notebook_id)
                .await?
                .ok_or_else(|| HubError::internal("a new notebook has no row", notebook_id))?;
            let mut out = Vec::new();
            let mut specs = specs;
            let mut plan = Some(plan);
            while !specs.is_empty() {
                let rest = specs.split_off(specs.len().min(500));
                let nb = self
                    .notebook_row(notebook_id)
                    .await?
                    .unwrap_or_else(|| nb.clone());
                let batch = std::mem::replace(&mut specs, rest);
                out.extend(
                    self.commit_versions(&nb, plan.take().unwrap_or_default(), batch, true)
                        .await?,
                );
            }
            Ok(out)
        }
        .await;
        guard.release().await;
        result
    }
}

/// The lock key of a notebook's workspace.
pub fn notebook_lock(notebook_id: &str) -> String {
    format!("nb:{notebook_id}")
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
