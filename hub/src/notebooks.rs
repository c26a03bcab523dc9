//! Notebooks: their views, creation (with a first revision), metadata changes, the trash
//! (delete, restore, purge) and sync tokens. Metadata lives in the catalog; the notebook's
//! row holds its head and state ([`crate::store::notebooks`]).

use std::collections::BTreeMap;

use cas_client::Plan;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::{SYNC_PREFIX, User, sync_hash};
use crate::catalog::{NotebookEntry, NotebookStatus, Role, Source};
use crate::commit::{Parent, VersionSpec};
use crate::error::{HubError, HubResult};
use crate::idempotency::{Created, IdempotencyKey, Prior};
use crate::ids::{self, NotebookId, ProjectId};
use crate::lock::LockKey;
use crate::outbox::Effect;
use crate::projects::{MAX_DESCRIPTION, MAX_TITLE, check_tags, check_text, project_gone};
use crate::store::{EventRow, HubStore, IdempotencyRow, NotebookRow, NotebookState, VersionKind};

use crate::workspace::{Committed, FileInput, check_message, edit_error, parse_path};

/// A notebook as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotebookView {
    pub id: NotebookId,
    pub project_id: ProjectId,
    pub title: String,
    pub description: String,
    pub status: NotebookStatus,
    pub author: String,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    pub source: Source,
    /// The current revision (`null` before the first save or sync).
    pub head_revision: Option<i64>,
}

/// The source of a new notebook.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceInput {
    /// `local` (default) or `git`.
    #[serde(rename = "type")]
    pub kind: String,
    /// For `git`: `push` (the only mode).
    #[serde(default)]
    pub sync_mode: Option<String>,
    /// For `git`: default `github`.
    #[serde(default)]
    pub provider: Option<String>,
    /// A path the workspace must contain (for `git`, every push is checked).
    #[serde(default)]
    pub entry_notebook: Option<String>,
    #[serde(default)]
    pub repository: Option<String>,
    #[serde(default)]
    pub branch: Option<String>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateNotebook {
    pub title: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// `draft`, `active` (default) or `archived`.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub source: Option<SourceInput>,
    /// Files of the first revision (local notebooks).
    #[serde(default)]
    pub files: BTreeMap<String, FileInput>,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedNotebook {
    pub notebook: NotebookView,
    /// For push-synced notebooks: the sync token, shown this once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_token: Option<String>,
    /// The first revision, when files were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<Committed>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateNotebook {
    pub title: Option<String>,
    pub description: Option<String>,
    pub tags: Option<Vec<String>>,
    pub status: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Trashed {
    pub recoverable: bool,
    pub token: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TrashEntry {
    pub token: String,
    pub notebook_id: NotebookId,
    pub title: String,
    pub deleted_at: String,
    pub deleted_by: String,
}

pub(crate) fn check_title(t: &str) -> HubResult<String> {
    check_text("title", t, MAX_TITLE, true)?;
    if t.contains('\n') {
        return Err(HubError::invalid("title must be one line"));
    }
    Ok(t.trim().to_string())
}

fn check_status(s: &str) -> HubResult<NotebookStatus> {
    NotebookStatus::settable(s).ok_or_else(|| {
        HubError::invalid("status must be draft, active or archived (deletion is DELETE)")
    })
}

pub(crate) fn notebook_gone(nid: &NotebookId) -> HubError {
    HubError::not_found(format!("notebook {nid} not found"))
}

fn source_of(input: Option<SourceInput>) -> HubResult<Source> {
    let Some(s) = input else {
        return Ok(Source::Local {
            entry_notebook: None,
        });
    };
    let entry = match &s.entry_notebook {
        Some(p) => Some(parse_path(p)?.join("/")),
        None => None,
    };
    match s.kind.as_str() {
        "local" => {
            if s.sync_mode.is_some() || s.provider.is_some() || s.repository.is_some() {
                return Err(HubError::invalid(
                    "a local source has no sync_mode, provider or repository",
                ));
            }
            Ok(Source::Local {
                entry_notebook: entry,
            })
        }
        "git" => {
            let mode = s.sync_mode.unwrap_or_else(|| "push".into());
            if mode != "push" {
                return Err(HubError::invalid(
                    "sync_mode must be push: the hub does not pull from repository hosts",
                ));
            }
            for (what, v) in [("repository", &s.repository), ("branch", &s.branch)] {
                if let Some(v) = v {
                    check_text(what, v, 512, false)?;
                }
            }
            let provider = s.provider.unwrap_or_else(|| "github".into());
            check_text("provider", &provider, 64, true)?;
            Ok(Source::Git {
                provider,
                sync_mode: mode,
                entry_notebook: entry,
                repository: s.repository,
                branch: s.branch,
            })
        }
        other => Err(HubError::invalid(format!(
            "source type {other:?}: expected local or git"
        ))),
    }
}

impl Hub {
    pub fn notebook_view(
        &self,
        project: &ProjectId,
        n: &NotebookEntry,
        row: Option<&NotebookRow>,
    ) -> NotebookView {
        NotebookView {
            id: n.id.clone(),
            project_id: project.clone(),
            title: n.title.clone(),
            description: n.description.clone(),
            status: n.status,
            author: n.author.clone(),
            created_at: n.created_at.clone(),
            updated_at: row.map_or_else(
                || n.updated_at.clone(),
                |r| ids::rfc3339(r.updated_at_ms).max(n.updated_at.clone()),
            ),
            tags: n.tags.clone(),
            source: n.source.clone(),
            head_revision: row.and_then(|r| r.head_revision),
        }
    }

    /// A live notebook of a project the caller may act on with `need`: 404 when the caller
    /// cannot see it, 403 when they can but may not do this.
    pub async fn notebook_for(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        need: Role,
    ) -> HubResult<(NotebookEntry, NotebookRow)> {
        let cat = self.catalog().await?;
        let p = cat.project(pid).ok_or_else(|| project_gone(pid))?;
        let role = self.role(user, p).ok_or_else(|| project_gone(pid))?;
        let entry = p
            .live_notebook(nid)
            .ok_or_else(|| notebook_gone(nid))?
            .clone();
        if role < need {
            return Err(HubError::forbidden(format!(
                "this needs the {need:?} role on the project; you are {role:?}"
            )));
        }
        let row = self.live_notebook(pid, nid).await?;
        Ok((entry, row))
    }

    /// A new notebook entry for the caller.
    pub(crate) fn new_entry(
        user: &User,
        title: String,
        description: String,
        tags: Vec<String>,
        source: Source,
    ) -> NotebookEntry {
        let now = ids::rfc3339(ids::now_ms());
        NotebookEntry {
            id: NotebookId::generate(),
            title,
            description,
            status: NotebookStatus::Active,
            author: user.id.clone(),
            created_at: now.clone(),
            updated_at: now,
            tags,
            source,
            status_before_delete: None,
        }
    }

    /// Creates a notebook (with its first revision when files are given); with a key, once
    /// (see [`crate::idempotency`]).
    pub async fn create_notebook(
        &self,
        user: &User,
        pid: &ProjectId,
        req: CreateNotebook,
        key: Option<&IdempotencyKey>,
    ) -> HubResult<Created<CreatedNotebook>> {
        self.project_for(user, pid, Role::Editor).await?;
        if let Some(k) = key
            && let Prior::Made(row) = self.prior_create(k).await?
        {
            return self.replay_notebook(user, pid, row).await;
        }
        let title = check_title(&req.title)?;
        check_text("description", &req.description, MAX_DESCRIPTION, false)?;
        let tags = check_tags(&req.tags)?;
        let status = check_status(req.status.as_deref().unwrap_or("active"))?;
        let source = source_of(req.source)?;
        let message = check_message(req.message.as_deref())?;
        let is_git = matches!(source, Source::Git { .. });
        if is_git && !req.files.is_empty() {
            return Err(HubError::invalid(
                "a push-synced notebook receives its files by sync, not at creation",
            ));
        }
        // The first revision is planned and stored before the notebook exists: invalid files
        // create nothing, and a store that fails leaves no empty notebook behind.
        let space = pid.space();
        let mut plan = Plan::default();
        let first = if req.files.is_empty() {
            None
        } else {
            let changes = self
                .plan_changes(&space, &mut plan, req.files, Vec::new())
                .await?;
            let cas = self.cas()?;
            let (tree, stats) = cas
                .plan_tree_edit(&space, &mut plan, None, changes)
                .await
                .map_err(edit_error)?;
            self.uploader(&space, &plan)?.run(&[tree]).await?;
            Some((tree, stats))
        };
        let sync = is_git.then(ids::secret);
        let mut entry = Self::new_entry(user, title, req.description, tags, source);
        entry.status = status;
        let id = entry.id.clone();
        // The new notebook's lock is held until the answer is recorded: a retry that finds the
        // record waits for it, on any process (see `Hub::replay_notebook`).
        let outcome = self
            .with_notebook_lock(&id, async || {
                if let Some(prior) = self
                    .add_notebook(
                        user,
                        pid,
                        entry.clone(),
                        sync.as_deref().map(|s| sync_hash(&id, s)),
                        if is_git {
                            "notebook.synced.create"
                        } else {
                            "notebook.create"
                        },
                        key,
                    )
                    .await?
                {
                    return Ok(Err(prior));
                }
                let revision = match first {
                    Some((tree, stats)) => {
                        let spec = VersionSpec {
                            tree,
                            stats,
                            author: user.id.clone(),
                            message,
                            kind: VersionKind::Save,
                            saved_at_ms: ids::now_ms(),
                            parent: Parent::None,
                            extra: BTreeMap::new(),
                            snapshots: Vec::new(),
                        };
                        self.commit_new_locked(&id, plan, vec![spec]).await?.pop()
                    }
                    None => None,
                };
                let row = self.store.notebook(&id).await?;
                let created = CreatedNotebook {
                    notebook: self.notebook_view(pid, &entry, row.as_ref()),
                    sync_token: sync.map(|s| format!("{SYNC_PREFIX}{id}_{s}")),
                    revision,
                };
                if let Some(k) = key {
                    // Recorded without the sync token: only its hash is ever kept.
                    let mut recorded = serde_json::to_value(&created)
                        .map_err(|e| HubError::internal("cannot record an answer", e))?;
                    if let Some(o) = recorded.as_object_mut() {
                        o.remove("sync_token");
                    }
                    self.complete_create(k, &recorded.to_string()).await?;
                }
                Ok(Ok(created))
            })
            .await?;
        match outcome {
            Ok(created) => Ok(Created::New(created)),
            Err(prior) => self.replay_notebook(user, pid, prior).await,
        }
    }

    /// Adds a notebook entry to the catalog and its row, refusing a live title; with a key,
    /// records it with the change, or answers the earlier create's record instead (adding
    /// nothing) if the key made one.
    pub(crate) async fn add_notebook(
        &self,
        user: &User,
        pid: &ProjectId,
        entry: NotebookEntry,
        sync_token_hash: Option<String>,
        event: &str,
        key: Option<&IdempotencyKey>,
    ) -> HubResult<Option<IdempotencyRow>> {
        self.with_lock(&LockKey::catalog(), async || {
            if let Some(k) = key
                && let Prior::Made(row) = self.prior_create(k).await?
            {
                return Ok(Some(row));
            }
            let record = key.map(|k| k.record(entry.id.as_str(), None));
            let id = entry.id.clone();
            let max = self.config.max_notebooks_per_project;
            self.mutate_catalog_locked(&user.id, event, move |cat| {            let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
            if p.title_taken(&entry.title, None) {
                return Err(HubError::name_taken(&entry.title));
            }
            if p.notebooks.len() as u64 >= max {
                return Err(HubError::quota(
                    "notebooks_per_project",
                    max,
                    "the project holds as many notebooks as it may, live or in the trash; purge some",
                ));
            }
            let title = entry.title.clone();
            p.notebooks.push(entry);
            let ev = EventRow::new(
                event,
                &user.id,
                Some(pid),
                Some(&id),
                serde_json::json!({"title": title}),
            );
            Ok((
                (),
                vec![
                    Effect::CreateNotebook {
                        notebook_id: id.clone(),
                        project_id: pid.clone(),
                        sync_token_owner: sync_token_hash.as_ref().map(|_| user.id.clone()),
                        sync_token_hash,
                    },
                    Effect::Event(ev),
                ]
                .into_iter()
                .chain(record.map(Effect::Idempotency))
                .collect(),
            ))
        })
        .await?;
            Ok(None)
        })
        .await
    }

    pub async fn update_notebook(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        req: UpdateNotebook,
    ) -> HubResult<NotebookView> {
        self.notebook_for(user, pid, nid, Role::Editor).await?;
        let title = req.title.as_deref().map(check_title).transpose()?;
        if let Some(d) = &req.description {
            check_text("description", d, MAX_DESCRIPTION, false)?;
        }
        let status = req.status.as_deref().map(check_status).transpose()?;
        let tags = req.tags.as_deref().map(check_tags).transpose()?;
        let entry = self
            .mutate_catalog(&user.id, "notebook.update", |cat| {
                let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                if let Some(t) = &title
                    && p.title_taken(t, Some(nid))
                {
                    return Err(HubError::name_taken(t));
                }
                let n = p
                    .notebook_mut(nid)
                    .filter(|n| n.is_live())
                    .ok_or_else(|| notebook_gone(nid))?;
                if let Some(t) = title {
                    n.title = t;
                }
                if let Some(d) = req.description {
                    n.description = d;
                }
                if let Some(s) = status {
                    n.status = s;
                }
                if let Some(t) = tags {
                    n.tags = t;
                }
                n.updated_at = ids::rfc3339(ids::now_ms());
                let n = n.clone();
                let ev = EventRow::new(
                    "notebook.update",
                    &user.id,
                    Some(pid),
                    Some(nid),
                    serde_json::json!({}),
                );
                Ok((n, vec![Effect::Event(ev)]))
            })
            .await?;
        let row = self.store.notebook(nid).await?;
        Ok(self.notebook_view(pid, &entry, row.as_ref()))
    }

    /// A new sync token for a push-synced notebook (the old one stops working); the manager
    /// who rotates it becomes the user it acts for.
    pub async fn rotate_sync_token(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
    ) -> HubResult<String> {
        let (entry, _) = self.notebook_for(user, pid, nid, Role::Manager).await?;
        if !matches!(entry.source, Source::Git { .. }) {
            return Err(HubError::invalid(
                "only push-synced notebooks have a sync token",
            ));
        }
        let secret = ids::secret();
        let mut tx = self.store.write().await?;
        HubStore::set_sync_token(&mut tx, nid, &sync_hash(nid, &secret), &user.id).await?;
        EventRow::new(
            "notebook.sync_token",
            &user.id,
            Some(pid),
            Some(nid),
            serde_json::json!({}),
        )
        .insert(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(format!("{SYNC_PREFIX}{nid}_{secret}"))
    }

    /// Finishes purges a crashed process left half done.
    pub async fn resume_purges(&self) -> HubResult<()> {
        for nid in self.store.purging_notebooks().await? {
            // A purge another process is finishing is its to finish.
            if let Err(e) = self
                .with_notebook_lock(&nid, async || self.finish_purge(&nid, "system").await)
                .await
                && e.code != "workspace_busy"
            {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Releases every kept version of a purging notebook. The caller holds its lock.
    pub(crate) async fn finish_purge(&self, nid: &NotebookId, actor: &str) -> HubResult<()> {
        let Some(nb) = self.store.notebook(nid).await? else {
            return Ok(());
        };
        if nb.state != NotebookState::Purging {
            return Ok(());
        }
        let kept = self.kept_versions(nid).await?;
        self.release(&nb, kept, true, actor).await
    }
}
