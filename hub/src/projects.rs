//! Projects: their views, creation, changes, members and deletion, all as catalog mutations;
//! and the checks every piece of metadata meets.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::User;
use crate::catalog::{Catalog, Member, ProjectDefaultRole, ProjectEntry, Role};
use crate::error::{HubError, HubResult};
use crate::idempotency::{Created, IdempotencyKey, Prior, answer_json};
use crate::ids::{self, ProjectId};
use crate::lock::LockKey;
use crate::outbox::Effect;
use crate::store::EventRow;

pub const MAX_TITLE: usize = 200;
pub const MAX_DESCRIPTION: usize = 4096;
pub const MAX_TAGS: usize = 32;
/// Most members of one project.
pub const MAX_MEMBERS: usize = 1000;

/// A project as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProjectView {
    pub id: ProjectId,
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
    /// What signed-in users who are not members get: `inherit` (the deployment's default),
    /// `none`, `viewer` or `editor`.
    pub default_role: ProjectDefaultRole,
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
    /// `inherit`, `none`, `viewer` or `editor`.
    pub default_role: Option<ProjectDefaultRole>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutMember {
    pub user_id: String,
    /// `viewer`, `editor` or `manager`.
    pub role: Role,
}

/// Checks one piece of text metadata.
pub(crate) fn check_text(what: &str, s: &str, max: usize, required: bool) -> HubResult<()> {
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

/// Checks tags and drops repeats.
pub(crate) fn check_tags(tags: &[String]) -> HubResult<Vec<String>> {
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

pub(crate) fn project_gone(pid: &ProjectId) -> HubError {
    HubError::not_found(format!("project {pid} not found"))
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
            notebook_count: p.live_notebooks().count(),
            role,
            default_role: p.default_role.unwrap_or(ProjectDefaultRole::Inherit),
        })
    }

    /// The catalog, a project in it, and the caller's role (404 or 403 as [`Hub::require`]).
    pub async fn project_for(
        &self,
        user: &User,
        project: &ProjectId,
        need: Role,
    ) -> HubResult<(std::sync::Arc<Catalog>, Role)> {
        let cat = self.catalog().await?;
        let p = cat.project(project).ok_or_else(|| project_gone(project))?;
        let role = self.require(user, p, need)?;
        Ok((cat, role))
    }

    /// Creates a project owned by the caller; with a key, once (see [`crate::idempotency`]).
    pub async fn create_project(
        &self,
        user: &User,
        req: CreateProject,
        key: Option<&IdempotencyKey>,
    ) -> HubResult<Created<ProjectView>> {
        check_text("name", &req.name, MAX_TITLE, true)?;
        check_text("description", &req.description, MAX_DESCRIPTION, false)?;
        let tags = check_tags(&req.tags)?;
        if user.scope.as_ref().is_some_and(|s| !s.all_projects()) {
            return Err(HubError::forbidden(
                "a token limited to some projects cannot create projects",
            ));
        }
        self.with_lock(&LockKey::catalog(), async || {
            if let Some(k) = key
                && let Prior::Made(row) = self.prior_create(k).await?
            {
                return self.replay_project(user, row).await;
            }
            let now = ids::rfc3339(ids::now_ms());
            let id = ProjectId::generate();
            let project = ProjectEntry {
                id: id.clone(),
                name: req.name.trim().to_string(),
                description: req.description.clone(),
                owner: user.id.clone(),
                members: vec![Member {
                    user_id: user.id.clone(),
                    role: Role::Admin,
                }],
                created_at: now.clone(),
                updated_at: now,
                tags: tags.clone(),
                notebooks: Vec::new(),
                default_role: None,
                deleted_at: None,
                deleted_by: None,
            };
            let view = self
                .project_view(user, &project)
                .ok_or_else(|| HubError::internal("a new project is invisible to its owner", ""))?;
            let record = match key {
                Some(k) => Some(k.record(id.as_str(), Some(answer_json(&view)?))),
                None => None,
            };
            let (max_projects, per_user) =
                (self.config.max_projects, self.config.max_projects_per_user);
            self.mutate_catalog_locked(&user.id, "project.create", move |cat| {
                if cat.project_count() as u64 >= max_projects {
                    return Err(HubError::quota(
                        "projects",
                        max_projects,
                        "the deployment holds as many projects as it allows",
                    ));
                }
                let owned = cat.all_projects().filter(|p| p.owner == user.id).count() as u64;
                if per_user > 0 && owned >= per_user && !user.super_admin {
                    return Err(HubError::quota(
                        "projects_per_user",
                        per_user,
                        "you own as many projects as a user may; delete one first",
                    ));
                }
                cat.add_project(project);
                let ev = EventRow::new(
                    "project.create",
                    &user.id,
                    Some(&id),
                    None,
                    serde_json::json!({}),
                );
                let mut effects = vec![Effect::Event(ev)];
                effects.extend(record.map(Effect::Idempotency));
                Ok(((), effects))
            })
            .await?;
            Ok(Created::New(view))
        })
        .await
    }

    /// Changes a project with `f` (which answers what its event records), as the caller, who
    /// must be a manager.
    async fn change_project<T>(
        &self,
        user: &User,
        pid: &ProjectId,
        operation: &str,
        f: impl FnOnce(&mut ProjectEntry) -> HubResult<(T, serde_json::Value)>,
    ) -> HubResult<T> {
        self.project_for(user, pid, Role::Manager).await?;
        self.mutate_catalog(&user.id, operation, |cat| {
            let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
            let (out, detail) = f(p)?;
            p.updated_at = ids::rfc3339(ids::now_ms());
            let ev = EventRow::new(operation, &user.id, Some(pid), None, detail);
            Ok((out, vec![Effect::Event(ev)]))
        })
        .await
    }

    pub async fn update_project(
        &self,
        user: &User,
        pid: &ProjectId,
        req: UpdateProject,
    ) -> HubResult<ProjectView> {
        if let Some(n) = &req.name {
            check_text("name", n, MAX_TITLE, true)?;
        }
        if let Some(d) = &req.description {
            check_text("description", d, MAX_DESCRIPTION, false)?;
        }
        let tags = req.tags.as_deref().map(check_tags).transpose()?;
        let updated = self
            .change_project(user, pid, "project.update", |p| {
                if let Some(n) = req.name {
                    p.name = n.trim().to_string();
                }
                if let Some(d) = req.description {
                    p.description = d;
                }
                if let Some(t) = tags {
                    p.tags = t;
                }
                let mut detail = serde_json::json!({});
                if let Some(d) = req.default_role {
                    p.default_role = (d != ProjectDefaultRole::Inherit).then_some(d);
                    detail = serde_json::json!({"default_role": d});
                }
                Ok((p.clone(), detail))
            })
            .await?;
        self.project_view(user, &updated)
            .ok_or_else(|| project_gone(pid))
    }

    pub async fn put_member(
        &self,
        user: &User,
        pid: &ProjectId,
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
            .change_project(user, pid, "project.members", |p| {
                if p.owner == req.user_id {
                    return Err(HubError::conflict("the owner's role cannot change"));
                }
                match p.members.iter_mut().find(|m| m.user_id == req.user_id) {
                    Some(m) => m.role = req.role,
                    None => {
                        if p.members.len() >= MAX_MEMBERS {
                            return Err(HubError::quota(
                                "members",
                                MAX_MEMBERS as u64,
                                "the project has as many members as it may",
                            ));
                        }
                        p.members.push(Member {
                            user_id: req.user_id.clone(),
                            role: req.role,
                        })
                    }
                }
                let detail = serde_json::json!({"user_id": req.user_id, "role": req.role});
                Ok((p.clone(), detail))
            })
            .await?;
        self.project_view(user, &updated)
            .ok_or_else(|| project_gone(pid))
    }

    /// Removes a member; returns the members left.
    pub async fn remove_member(
        &self,
        user: &User,
        pid: &ProjectId,
        member: &str,
    ) -> HubResult<Vec<Member>> {
        self.change_project(user, pid, "project.members", |p| {
            if p.owner == member {
                return Err(HubError::conflict("the owner cannot be removed"));
            }
            let before = p.members.len();
            p.members.retain(|m| m.user_id != member);
            if p.members.len() == before {
                return Err(HubError::not_found(format!("{member} is not a member")));
            }
            let detail = serde_json::json!({"user_id": member, "role": null});
            Ok((p.members.clone(), detail))
        })
        .await
    }
}
