//! Projects and notebooks: catalog mutations, the trash, forks, refused-edit branches, and the
//! views the API returns.

use std::collections::BTreeMap;

use cas_client::{Plan, TreeStats};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::{SYNC_PREFIX, User, sync_hash};
use crate::catalog::{Catalog, Member, NotebookEntry, ProjectEntry, Role, Source};
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::outbox::{Effect, EventRow};
use crate::workspace::{
    Committed, FileInput, NotebookRow, Parent, VersionSpec, check_message, notebook_lock,
    parse_path, project_space,
};

pub const MAX_TITLE: usize = 200;
pub const MAX_DESCRIPTION: usize = 4096;
pub const MAX_TAGS: usize = 32;

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_bytes(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A project as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProjectView {
    pub id: String,
    pub name: String,
    pub description: String,
    pub owner: String,
    pub members: Vec<Member>,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    /// Live notebooks (not in the trash).
    pub notebook_count: usize,
    /// The caller's role.
    pub role: Role,
}

/// A notebook as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NotebookView {
    pub id: String,
    pub project_id: String,
    pub title: String,
    pub description: String,
    pub status: String,
    pub author: String,
    pub created_at: String,
    pub updated_at: String,
    pub tags: Vec<String>,
    pub source: Source,
    /// The current revision (`null` before the first save or sync).
    pub head_revision: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProject {
    pub name: Option<String>,
    pub description: Option<String>,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutMember {
    pub user_id: String,
    /// `viewer`, `editor` or `manager`.
    pub role: Role,
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

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The new notebook's title (refused if a live notebook has it).
    pub new_title: String,
    /// Default: the head.
    #[serde(default)]
    pub revision: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// The revision the refused edit was made from.
    pub base_revision: i64,
    #[serde(default)]
    pub files: BTreeMap<String, FileInput>,
    #[serde(default)]
    pub deleted: Vec<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// Default: "<title> (from revision N)".
    #[serde(default)]
    pub title: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Trashed {
    pub recoverable: bool,
    pub token: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TrashEntry {
    pub token: String,
    pub notebook_id: String,
    pub title: String,
    pub deleted_at: String,
    pub deleted_by: String,
}

fn check_text(what: &str, s: &str, max: usize, required: bool) -> HubResult<()> {
    if required && s.trim().is_empty() {
        return Err(HubError::invalid(format!("{what} must not be empty")));
    }
    if s.len() > max {
        return Err(HubError::invalid(format!(
            "{what} is longer than {max} bytes"
        )));
    }
    if s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Err(HubError::invalid(format!(
            "{what} contains control characters"
        )));
    }
    Ok(())
}

pub(crate) fn check_title(t: &str) -> HubResult<String> {
    check_text("title", t, MAX_TITLE, true)?;
    if t.contains('\n') {
        return Err(HubError::invalid("title must be one line"));
    }
    Ok(t.trim().to_string())
}

fn check_tags(tags: &[String]) -> HubResult<Vec<String>> {
    if tags.len() > MAX_TAGS {
        return Err(HubError::invalid(format!("at most {MAX_TAGS} tags")));
    }
    let mut out = Vec::with_capacity(tags.len());
    for t in tags {
        check_text("tag", t, 64, true)?;
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    Ok(out)
}

fn check_status(s: &str) -> HubResult<()> {
    if matches!(s, "draft" | "active" | "archived") {
        Ok(())
    } else {
        Err(HubError::invalid(
            "status must be draft, active or archived (deletion is DELETE)",
        ))
    }
}

fn project_gone(pid: &str) -> HubError {
    HubError::not_found(format!("project {pid} not found"))
}

fn notebook_gone(nid: &str) -> HubError {
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
    pub fn project_view(&self, user: &User, p: &ProjectEntry) -> Option<ProjectView> {
        let role = self.role(user, p)?;
        Some(ProjectView {
            id: p.id.clone(),
            name: p.name.clone(),
            description: p.description.clone(),
            owner: p.owner.clone(),
            members: p.members.clone(),
            created_at: p.created_at.clone(),
            updated_at: p.updated_at.clone(),
            tags: p.tags.clone(),
            notebook_count: p.notebooks.iter().filter(|n| n.status != "deleted").count(),
            role,
        })
    }

    pub fn notebook_view(
        &self,
        project_id: &str,
        n: &NotebookEntry,
        row: Option<&NotebookRow>,
    ) -> NotebookView {
        NotebookView {
            id: n.id.clone(),
            project_id: project_id.to_string(),
            title: n.title.clone(),
            description: n.description.clone(),
            status: n.status.clone(),
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

    /// The catalog, a project in it, and the caller's role (404 or 403 as [`Hub::require`]).
    pub async fn project_for(
        &self,
        user: &User,
        project_id: &str,
        need: Role,
    ) -> HubResult<(std::sync::Arc<Catalog>, Role)> {
        let cat = self.catalog().await?;
        let p = cat
            .project(project_id)
            .ok_or_else(|| project_gone(project_id))?;
        let role = self.require(user, p, need)?;
        Ok((cat, role))
    }

    /// A live notebook of a project the caller may act on with `need`.
    pub async fn notebook_for(
        &self,
        user: &User,
        project_id: &str,
        notebook_id: &str,
        need: Role,
    ) -> HubResult<(NotebookEntry, NotebookRow)> {
        // Visibility first: a notebook of a project the caller cannot see is "not found".
        let cat = self.catalog().await?;
        let p = cat
            .project(project_id)
            .ok_or_else(|| project_gone(project_id))?;
        let role = self.role(user, p).ok_or_else(|| project_gone(project_id))?;
        let entry = p
            .notebook(notebook_id)
            .filter(|n| n.status != "deleted")
            .ok_or_else(|| notebook_gone(notebook_id))?
            .clone();
        if role < need {
            return Err(HubError::forbidden(format!(
                "this needs the {need:?} role on the project; you are {role:?}"
            )));
        }
        let row = self.live_notebook(project_id, notebook_id).await?;
        Ok((entry, row))
    }

    pub async fn create_project(&self, user: &User, req: CreateProject) -> HubResult<ProjectView> {
        check_text("name", &req.name, MAX_TITLE, true)?;
        check_text("description", &req.description, MAX_DESCRIPTION, false)?;
        let tags = check_tags(&req.tags)?;
        let now = ids::rfc3339(ids::now_ms());
        let id = ids::project_id();
        let project = ProjectEntry {
            id: id.clone(),
            name: req.name.trim().to_string(),
            description: req.description,
            owner: user.id.clone(),
            members: vec![Member {
                user_id: user.id.clone(),
                role: Role::Admin,
            }],
            created_at: now.clone(),
            updated_at: now,
            tags,
            notebooks: Vec::new(),
        };
        let p = project.clone();
        let (max_projects, per_user) =
            (self.config.max_projects, self.config.max_projects_per_user);
        self.mutate_catalog(&user.id, "project.create", move |cat| {
            if cat.project_count() as u64 >= max_projects {
                return Err(HubError::quota(
                    "projects",
                    max_projects,
                    "the deployment holds as many projects as it allows",
                ));
            }
            let owned = cat.projects().filter(|p| p.owner == user.id).count() as u64;
            if per_user > 0 && owned >= per_user && !user.super_admin {
                return Err(HubError::quota(
                    "projects_per_user",
                    per_user,
                    "you own as many projects as a user may; delete one first",
                ));
            }
            cat.add_project(p);
            let ev = EventRow::new(
                "project.create",
                &user.id,
                Some(&id),
                None,
                serde_json::json!({}),
            );
            Ok(((), vec![Effect::Event(ev)]))
        })
        .await?;
        self.project_view(user, &project)
            .ok_or_else(|| HubError::internal("a new project is invisible to its owner", ""))
    }

    pub async fn update_project(
        &self,
        user: &User,
        pid: &str,
        req: UpdateProject,
    ) -> HubResult<ProjectView> {
        self.project_for(user, pid, Role::Manager).await?;
        if let Some(n) = &req.name {
            check_text("name", n, MAX_TITLE, true)?;
        }
        if let Some(d) = &req.description {
            check_text("description", d, MAX_DESCRIPTION, false)?;
        }
        let tags = req.tags.as_deref().map(check_tags).transpose()?;
        let updated = self
            .mutate_catalog(&user.id, "project.update", |cat| {
                let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                if let Some(n) = req.name {
                    p.name = n.trim().to_string();
                }
                if let Some(d) = req.description {
                    p.description = d;
                }
                if let Some(t) = tags {
                    p.tags = t;
                }
                p.updated_at = ids::rfc3339(ids::now_ms());
                let ev = EventRow::new(
                    "project.update",
                    &user.id,
                    Some(pid),
                    None,
                    serde_json::json!({}),
                );
                Ok((p.clone(), vec![Effect::Event(ev)]))
            })
            .await?;
        self.project_view(user, &updated)
            .ok_or_else(|| project_gone(pid))
    }

    /// Deletes an empty project (no notebook, live or in the trash).
    pub async fn delete_project(&self, user: &User, pid: &str) -> HubResult<()> {
        self.project_for(user, pid, Role::Manager).await?;
        self.mutate_catalog(&user.id, "project.delete", |cat| {
            let p = cat.project(pid).ok_or_else(|| project_gone(pid))?;
            if !p.notebooks.is_empty() {
                return Err(HubError::conflict(format!(
                    "project {pid} still holds {} notebook(s), live or in the trash; delete and purge them first",
                    p.notebooks.len()
                )));
            }
            cat.remove_project(pid);
            let ev = EventRow::new("project.delete", &user.id, Some(pid), None, serde_json::json!({}));
            Ok(((), vec![Effect::Event(ev)]))
        })
        .await
    }

    pub async fn put_member(
        &self,
        user: &User,
        pid: &str,
        req: PutMember,
    ) -> HubResult<ProjectView> {
        self.project_for(user, pid, Role::Manager).await?;
        if req.role == Role::Admin {
            return Err(HubError::invalid(
                "the admin role is reserved for the owner",
            ));
        }
        if self.user(&req.user_id).await?.is_none() {
            return Err(HubError::invalid(format!("no user {}", req.user_id)));
        }
        let updated = self
            .mutate_catalog(&user.id, "project.members", |cat| {
                let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                if p.owner == req.user_id {
                    return Err(HubError::conflict("the owner's role cannot change"));
                }
                match p.members.iter_mut().find(|m| m.user_id == req.user_id) {
                    Some(m) => m.role = req.role,
                    None => {
                        if p.members.len() >= 1000 {
                            return Err(HubError::conflict("at most 1000 members"));
                        }
                        p.members.push(Member {
                            user_id: req.user_id.clone(),
                            role: req.role,
                        })
                    }
                }
                p.updated_at = ids::rfc3339(ids::now_ms());
                let ev = EventRow::new(
                    "project.members",
                    &user.id,
                    Some(pid),
                    None,
                    serde_json::json!({"user_id": req.user_id, "role": req.role}),
                );
                Ok((p.clone(), vec![Effect::Event(ev)]))
            })
            .await?;
        self.project_view(user, &updated)
            .ok_or_else(|| project_gone(pid))
    }

    /// Removes a member; returns the members left.
    pub async fn remove_member(
        &self,
        user: &User,
        pid: &str,
        member: &str,
    ) -> HubResult<Vec<Member>> {
        self.project_for(user, pid, Role::Manager).await?;
        self.mutate_catalog(&user.id, "project.members", |cat| {
            let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
            if p.owner == member {
                return Err(HubError::conflict("the owner cannot be removed"));
            }
            let before = p.members.len();
            p.members.retain(|m| m.user_id != member);
            if p.members.len() == before {
                return Err(HubError::not_found(format!("{member} is not a member")));
            }
            p.updated_at = ids::rfc3339(ids::now_ms());
            let ev = EventRow::new(
                "project.members",
                &user.id,
                Some(pid),
                None,
                serde_json::json!({"user_id": member, "role": null}),
            );
            Ok((p.members.clone(), vec![Effect::Event(ev)]))
        })
        .await
    }

    pub async fn create_notebook(
        &self,
        user: &User,
        pid: &str,
        req: CreateNotebook,
    ) -> HubResult<CreatedNotebook> {
        self.project_for(user, pid, Role::Editor).await?;
        let title = check_title(&req.title)?;
        check_text("description", &req.description, MAX_DESCRIPTION, false)?;
        let tags = check_tags(&req.tags)?;
        let status = req.status.unwrap_or_else(|| "active".into());
        check_status(&status)?;
        let source = source_of(req.source)?;
        let message = check_message(req.message.as_deref())?;
        let is_git = matches!(source, Source::Git { .. });
        if is_git && !req.files.is_empty() {
            return Err(HubError::invalid(
                "a push-synced notebook receives its files by sync, not at creation",
            ));
        }
        // Plan the first revision before anything is created, so invalid files create nothing.
        let space = project_space(pid)?;
        let mut plan = Plan::default();
        let first = if req.files.is_empty() {
            None
        } else {
            let changes = self
                .plan_changes(&space, &mut plan, req.files, Vec::new())
                .await?;
            let (tree, stats) = self
                .cas
                .plan_tree_edit(&space, &mut plan, None, changes)
                .await
                .map_err(|e| match e {
                    cas_client::ClientError::Invalid(m) => HubError::invalid(m),
                    other => other.into(),
                })?;
            // Stored before the notebook exists: a store that fails leaves no empty notebook.
            cas_client::Uploader::new(
                &self.cas,
                &space,
                &plan,
                self.config.lease_ms,
                self.config.parallelism,
            )
            .run(&[tree])
            .await?;
            Some((tree, stats))
        };
        let id = ids::notebook_id();
        let sync = is_git.then(ids::secret);
        let now = ids::rfc3339(ids::now_ms());
        let entry = NotebookEntry {
            id: id.clone(),
            title: title.clone(),
            description: req.description,
            status,
            author: user.id.clone(),
            created_at: now.clone(),
            updated_at: now,
            tags,
            source,
            status_before_delete: None,
        };
        self.add_notebook(
            user,
            pid,
            entry.clone(),
            sync.as_deref().map(|s| sync_hash(&id, s)),
            "notebook.create",
        )
        .await?;
        let revision = match first {
            Some((tree, stats)) => {
                let spec = VersionSpec {
                    tree,
                    stats,
                    author: user.id.clone(),
                    message,
                    kind: "save".into(),
                    saved_at_ms: ids::now_ms(),
                    parent: Parent::None,
                    extra: BTreeMap::new(),
                };
                self.commit_new(&id, plan, vec![spec]).await?.pop()
            }
            None => None,
        };
        let row = self.notebook_row(&id).await?;
        Ok(CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, row.as_ref()),
            sync_token: sync.map(|s| format!("{SYNC_PREFIX}{id}_{s}")),
            revision,
        })
    }

    /// Adds a notebook entry to the catalog and its row, refusing a live title.
    pub(crate) async fn add_notebook(
        &self,
        user: &User,
        pid: &str,
        entry: NotebookEntry,
        sync_token_hash: Option<String>,
        event: &str,
    ) -> HubResult<()> {
        let id = entry.id.clone();
        let max = self.config.max_notebooks_per_project;
        self.mutate_catalog(&user.id, event, move |cat| {
            let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
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
                        project_id: pid.to_string(),
                        sync_token_owner: sync_token_hash.as_ref().map(|_| user.id.clone()),
                        sync_token_hash,
                    },
                    Effect::Event(ev),
                ],
            ))
        })
        .await
    }

    pub async fn update_notebook(
        &self,
        user: &User,
        pid: &str,
        nid: &str,
        req: UpdateNotebook,
    ) -> HubResult<NotebookView> {
        self.notebook_for(user, pid, nid, Role::Editor).await?;
        let title = req.title.as_deref().map(check_title).transpose()?;
        if let Some(d) = &req.description {
            check_text("description", d, MAX_DESCRIPTION, false)?;
        }
        if let Some(s) = &req.status {
            check_status(s)?;
        }
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
                    .filter(|n| n.status != "deleted")
                    .ok_or_else(|| notebook_gone(nid))?;
                if let Some(t) = title {
                    n.title = t;
                }
                if let Some(d) = req.description {
                    n.description = d;
                }
                if let Some(s) = req.status {
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
        let row = self.notebook_row(nid).await?;
        Ok(self.notebook_view(pid, &entry, row.as_ref()))
    }

    /// Moves a notebook, with its whole history, to the project's trash.
    pub async fn trash_notebook(&self, user: &User, pid: &str, nid: &str) -> HubResult<Trashed> {
        self.notebook_for(user, pid, nid, Role::Manager).await?;
        let guard = self.lock(&notebook_lock(nid)).await?;
        let result = async {
            self.settle(&notebook_lock(nid)).await?;
            self.live_notebook(pid, nid).await?;
            let at = ids::now_ms();
            let token = format!("{nid}.{at}-{}", &ids::secret()[..8]);
            let t = token.clone();
            self.mutate_catalog(&user.id, "notebook.delete", move |cat| {
                let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                let n = p
                    .notebook_mut(nid)
                    .filter(|n| n.status != "deleted")
                    .ok_or_else(|| notebook_gone(nid))?;
                n.status_before_delete = Some(std::mem::replace(&mut n.status, "deleted".into()));
                n.updated_at = ids::rfc3339(at);
                let title = n.title.clone();
                let ev = EventRow::new(
                    "notebook.delete",
                    &user.id,
                    Some(pid),
                    Some(nid),
                    serde_json::json!({"token": t}),
                );
                Ok((
                    (),
                    vec![
                        Effect::Trash {
                            notebook_id: nid.to_string(),
                            project_id: pid.to_string(),
                            token: t,
                            title,
                            actor: user.id.clone(),
                            at_ms: at,
                        },
                        Effect::Event(ev),
                    ],
                ))
            })
            .await?;
            Ok(Trashed {
                recoverable: true,
                token,
            })
        }
        .await;
        guard.release().await;
        result
    }

    pub async fn list_trash(&self, user: &User, pid: &str) -> HubResult<Vec<TrashEntry>> {
        self.project_for(user, pid, Role::Viewer).await?;
        let rows = sqlx::query(
            "SELECT token, notebook_id, title, trashed_at_ms, actor FROM hub_trash WHERE project_id = $1 \
             ORDER BY trashed_at_ms DESC, token LIMIT 10000",
        )
        .bind(pid)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(TrashEntry {
                    token: r.try_get("token")?,
                    notebook_id: r.try_get("notebook_id")?,
                    title: r.try_get("title")?,
                    deleted_at: ids::rfc3339(r.try_get("trashed_at_ms")?),
                    deleted_by: r.try_get("actor")?,
                })
            })
            .collect()
    }

    async fn trash_row(&self, pid: &str, token: &str) -> HubResult<String> {
        let nid: Option<String> = sqlx::query_scalar(
            "SELECT notebook_id FROM hub_trash WHERE token = $1 AND project_id = $2",
        )
        .bind(token)
        .bind(pid)
        .fetch_optional(&self.db.pool)
        .await?;
        nid.ok_or_else(|| HubError::not_found("no such entry in the trash"))
    }

    /// Brings a trashed notebook back under its title, with every revision it had; refused
    /// (and nothing changed) when a live notebook has taken the title meanwhile.
    pub async fn restore_trash(
        &self,
        user: &User,
        pid: &str,
        token: &str,
    ) -> HubResult<NotebookView> {
        self.project_for(user, pid, Role::Manager).await?;
        let nid = self.trash_row(pid, token).await?;
        let guard = self.lock(&notebook_lock(&nid)).await?;
        let result = async {
            self.trash_row(pid, token).await?;
            let entry = self
                .mutate_catalog(&user.id, "notebook.restore", |cat| {
                    let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                    let title = p
                        .notebook(&nid)
                        .map(|n| n.title.clone())
                        .ok_or_else(|| notebook_gone(&nid))?;
                    if p.title_taken(&title, Some(&nid)) {
                        return Err(HubError::name_taken(&title));
                    }
                    let n = p.notebook_mut(&nid).ok_or_else(|| notebook_gone(&nid))?;
                    n.status = n
                        .status_before_delete
                        .take()
                        .unwrap_or_else(|| "active".into());
                    n.updated_at = ids::rfc3339(ids::now_ms());
                    let n = n.clone();
                    let ev = EventRow::new(
                        "notebook.restore",
                        &user.id,
                        Some(pid),
                        Some(&nid),
                        serde_json::json!({}),
                    );
                    Ok((
                        n,
                        vec![
                            Effect::Restore {
                                notebook_id: nid.clone(),
                                token: token.to_string(),
                            },
                            Effect::Event(ev),
                        ],
                    ))
                })
                .await?;
            let row = self.notebook_row(&nid).await?;
            Ok(self.notebook_view(pid, &entry, row.as_ref()))
        }
        .await;
        guard.release().await;
        result
    }

    /// Purges a trashed notebook: it leaves the catalog and every root of its history is
    /// released in one delta (per thousand); CAS GC then frees what nothing else references.
    pub async fn purge_trash(&self, user: &User, pid: &str, token: &str) -> HubResult<()> {
        self.project_for(user, pid, Role::Manager).await?;
        let nid = self.trash_row(pid, token).await?;
        let guard = self.lock(&notebook_lock(&nid)).await?;
        let result = async {
            self.trash_row(pid, token).await?;
            self.mutate_catalog(&user.id, "notebook.purge", |cat| {
                let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                p.notebooks.retain(|n| n.id != nid);
                Ok((
                    (),
                    vec![Effect::StartPurge {
                        notebook_id: nid.clone(),
                        token: token.to_string(),
                    }],
                ))
            })
            .await?;
            self.finish_purge(&nid, &user.id).await
        }
        .await;
        guard.release().await;
        result
    }

    /// Releases every kept version of a purging notebook. The caller holds its lock.
    pub(crate) async fn finish_purge(&self, nid: &str, actor: &str) -> HubResult<()> {
        self.settle(&notebook_lock(nid)).await?;
        let Some(nb) = self.notebook_row(nid).await? else {
            return Ok(());
        };
        if nb.state != "purging" {
            return Ok(());
        }
        let kept = self.kept_versions(nid).await?;
        self.release(&nb, kept, true, actor).await
    }

    /// Finishes purges a crashed process left half done.
    pub async fn resume_purges(&self) -> HubResult<()> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT notebook_id FROM hub_notebooks WHERE state = 'purging'")
                .fetch_all(&self.db.pool)
                .await?;
        for nid in ids {
            let Ok(guard) = self.lock(&notebook_lock(&nid)).await else {
                continue;
            };
            let r = self.finish_purge(&nid, "system").await;
            guard.release().await;
            r?;
        }
        Ok(())
    }

    /// Copies one revision into a new notebook at revision 1, leaving the source alone.
    pub async fn fork(
        &self,
        user: &User,
        pid: &str,
        nid: &str,
        req: ForkRequest,
    ) -> HubResult<CreatedNotebook> {
        let (src, nb) = self.notebook_for(user, pid, nid, Role::Editor).await?;
        let title = check_title(&req.new_title)?;
        let v = self.loadable(&nb, req.revision).await?;
        let tree = v
            .tree
            .parse()
            .map_err(|e| HubError::internal("bad tree hash", e))?;
        // A tree that entered before the workspace limits held is not copied further.
        let summary = self
            .cas
            .check_tree(
                &project_space(pid)?,
                &tree,
                &cas_client::TreeLimits::default(),
            )
            .await
            .map_err(crate::workspace::edit_error)?;
        let now_ms = ids::now_ms();
        let entry = NotebookEntry {
            id: ids::notebook_id(),
            title,
            description: src.description.clone(),
            status: "active".into(),
            author: user.id.clone(),
            created_at: ids::rfc3339(now_ms),
            updated_at: ids::rfc3339(now_ms),
            tags: src.tags.clone(),
            source: Source::Local {
                entry_notebook: match &src.source {
                    Source::Local { entry_notebook } | Source::Git { entry_notebook, .. } => {
                        entry_notebook.clone()
                    }
                },
            },
            status_before_delete: None,
        };
        self.add_notebook(user, pid, entry.clone(), None, "notebook.fork")
            .await?;
        let spec = VersionSpec {
            tree,
            stats: summary.stats,
            author: user.id.clone(),
            message: format!("Forked from {} revision {}", src.title, v.revision),
            kind: "fork".into(),
            saved_at_ms: now_ms,
            parent: Parent::None,
            extra: BTreeMap::from([("forked_from".to_string(), v.version_id.clone())]),
        };
        let revision = self
            .commit_new(&entry.id, Plan::default(), vec![spec])
            .await?
            .pop();
        let row = self.notebook_row(&entry.id).await?;
        Ok(CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, row.as_ref()),
            sync_token: None,
            revision,
        })
    }

    /// Keeps a refused edit as the first revision of its own notebook (seed 002).
    pub async fn branch_refused_edit(
        &self,
        user: &User,
        pid: &str,
        nid: &str,
        req: BranchRequest,
    ) -> HubResult<CreatedNotebook> {
        let (src, nb) = self.notebook_for(user, pid, nid, Role::Editor).await?;
        let message = check_message(req.message.as_deref())?;
        let base = match self.version(&nb, req.base_revision).await? {
            Some(v) if v.state == "pruned" => {
                return Err(HubError::new(
                    axum::http::StatusCode::GONE,
                    "revision_pruned",
                    format!("revision {} was pruned by retention", req.base_revision),
                )
                .with("revision", req.base_revision));
            }
            Some(v) => v,
            None => {
                return Err(HubError::invalid(format!(
                    "base_revision {} does not exist: an edit that diverged from nothing is not a divergence",
                    req.base_revision
                )));
            }
        };
        let space = project_space(pid)?;
        let mut plan = Plan::default();
        let changes = self
            .plan_changes(&space, &mut plan, req.files, req.deleted)
            .await?;
        let base_tree = base
            .tree
            .parse()
            .map_err(|e| HubError::internal("bad tree hash", e))?;
        let (tree, delta) = self
            .cas
            .plan_tree_edit(&space, &mut plan, Some(base_tree), changes)
            .await
            .map_err(|e| match e {
                cas_client::ClientError::Invalid(m) => HubError::invalid(m),
                other => other.into(),
            })?;
        let explicit = req.title.as_deref().map(check_title).transpose()?;
        let cat = self.catalog().await?;
        let p = cat.project(pid).ok_or_else(|| project_gone(pid))?;
        let title = match explicit {
            Some(t) => t,
            None => {
                let stem = format!("{} (from revision {})", src.title, base.revision);
                // Room for a " NNNN" suffix; the limit is in bytes, so cut at a character
                // boundary at or below it.
                let stem = truncate_bytes(&stem, MAX_TITLE - 5).to_string();
                (1..=1000)
                    .map(|i| {
                        if i == 1 {
                            stem.clone()
                        } else {
                            format!("{stem} {i}")
                        }
                    })
                    .find(|t| !p.title_taken(t, None))
                    .ok_or_else(|| HubError::name_taken(&stem))?
            }
        };
        let now_ms = ids::now_ms();
        let entry = NotebookEntry {
            id: ids::notebook_id(),
            title,
            description: src.description.clone(),
            status: "active".into(),
            author: user.id.clone(),
            created_at: ids::rfc3339(now_ms),
            updated_at: ids::rfc3339(now_ms),
            tags: src.tags.clone(),
            source: Source::Local {
                entry_notebook: None,
            },
            status_before_delete: None,
        };
        self.add_notebook(user, pid, entry.clone(), None, "notebook.branch")
            .await?;
        let spec = VersionSpec {
            tree,
            stats: TreeStats {
                files: base.file_count.saturating_add(delta.files),
                bytes: base.size_bytes.saturating_add(delta.bytes),
            },
            author: user.id.clone(),
            message,
            kind: "branch".into(),
            saved_at_ms: now_ms,
            parent: Parent::None,
            extra: BTreeMap::from([
                ("branched_from".to_string(), base.version_id.clone()),
                ("branched_from_notebook".to_string(), nid.to_string()),
            ]),
        };
        let revision = self.commit_new(&entry.id, plan, vec![spec]).await?.pop();
        let row = self.notebook_row(&entry.id).await?;
        Ok(CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, row.as_ref()),
            sync_token: None,
            revision,
        })
    }

    /// A new sync token for a push-synced notebook (the old one stops working).
    pub async fn rotate_sync_token(&self, user: &User, pid: &str, nid: &str) -> HubResult<String> {
        let (entry, _) = self.notebook_for(user, pid, nid, Role::Manager).await?;
        if !matches!(entry.source, Source::Git { .. }) {
            return Err(HubError::invalid(
                "only push-synced notebooks have a sync token",
            ));
        }
        let secret = ids::secret();
        let mut tx = self.db.write().await?;
        // The manager who rotates it becomes the user the token acts for.
        sqlx::query(
            "UPDATE hub_notebooks SET sync_token_hash = $1, sync_token_owner = $2 \
             WHERE notebook_id = $3 AND state = 'live'",
        )
        .bind(sync_hash(nid, &secret))
        .bind(&user.id)
        .bind(nid)
        .execute(tx.conn())
        .await?;
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
}
