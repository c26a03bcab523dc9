//! Projects in the trash (seed 000 §4.3, §7.4): deleting a project moves it, with every notebook
//! and version it holds, to the trash, where it is invisible to everything that reads projects;
//! a manager restores it, or purges it at once; the maintenance pass purges it once
//! `UNICAS_HUB_PROJECT_TRASH_RETENTION` is over. A purge takes every notebook out of the
//! catalog and releases every root of their histories (the notebook purge's deltas), then
//! removes the project and its open invitations; CAS garbage collection then frees what
//! nothing else references. A purge that stops half way is finished by the next pass.

use serde::Serialize;
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::User;
use crate::catalog::{ProjectEntry, Role};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId};
use crate::outbox::Effect;
use crate::projects::{ProjectView, project_gone};
use crate::store::EventRow;
use crate::store::sessions::SessionStatus;

/// A project in the trash.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TrashedProject {
    pub id: ProjectId,
    pub name: String,
    pub owner: String,
    pub deleted_at: String,
    pub deleted_by: String,
    /// When the maintenance pass purges it (absent: never, the retention is `0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purge_after: Option<String>,
    /// Notebooks it holds, live or in its own trash.
    pub notebook_count: usize,
}

fn not_in_trash(pid: &ProjectId) -> HubError {
    HubError::not_found(format!("project {pid} is not in the trash"))
}

impl Hub {
    /// The role `user` has on a trashed project (as if it were live); 404 if none or too low.
    fn require_trashed<'c>(
        &self,
        user: &User,
        cat: &'c crate::catalog::Catalog,
        pid: &ProjectId,
        need: Role,
    ) -> HubResult<&'c ProjectEntry> {
        let p = cat
            .any_project(pid)
            .filter(|p| !p.is_live())
            .ok_or_else(|| not_in_trash(pid))?;
        match self.role(user, p) {
            Some(r) if r >= need => Ok(p),
            _ => Err(not_in_trash(pid)),
        }
    }

    /// Moves a project with everything it holds to the trash (manager); refused while sessions
    /// run on its notebooks.
    pub async fn trash_project(&self, user: &User, pid: &ProjectId) -> HubResult<()> {
        self.project_for(user, pid, Role::Manager).await?;
        let live: Vec<SessionStatus> = SessionStatus::ALL
            .iter()
            .copied()
            .filter(|s| !s.is_terminal())
            .collect();
        if !self
            .store
            .project_sessions(pid, &live, None, 1)
            .await?
            .is_empty()
        {
            return Err(HubError::conflict(format!(
                "sessions run on notebooks of project {pid}; end them before deleting it"
            )));
        }
        let at = ids::rfc3339(ids::now_ms());
        self.mutate_catalog(&user.id, "project.delete", |cat| {
            let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
            p.deleted_at = Some(at.clone());
            p.deleted_by = Some(user.id.clone());
            let ev = EventRow::new(
                "project.delete",
                &user.id,
                Some(pid),
                None,
                serde_json::json!({}),
            );
            Ok(((), vec![Effect::Event(ev)]))
        })
        .await
    }

    /// Projects in the trash the caller manages, most recently deleted first.
    pub async fn trashed_projects(&self, user: &User) -> HubResult<Vec<TrashedProject>> {
        let cat = self.catalog().await?;
        let keep = self.config.retention.project_trash_ms;
        let mut out: Vec<TrashedProject> = cat
            .all_projects()
            .filter(|p| !p.is_live())
            .filter(|p| self.role(user, p).is_some_and(|r| r >= Role::Manager))
            .map(|p| {
                let deleted_at = p.deleted_at.clone().unwrap_or_default();
                TrashedProject {
                    purge_after: (keep > 0)
                        .then(|| ids::parse_rfc3339_ms(&deleted_at))
                        .flatten()
                        .map(|ms| ids::rfc3339(ms.saturating_add(keep as i64))),
                    id: p.id.clone(),
                    name: p.name.clone(),
                    owner: p.owner.clone(),
                    deleted_at,
                    deleted_by: p.deleted_by.clone().unwrap_or_default(),
                    notebook_count: p.notebooks.len(),
                }
            })
            .collect();
        out.sort_by(|a, b| b.deleted_at.cmp(&a.deleted_at));
        Ok(out)
    }

    /// Brings a project back from the trash with everything it held (manager).
    pub async fn restore_project(&self, user: &User, pid: &ProjectId) -> HubResult<ProjectView> {
        self.require_trashed(user, &*self.catalog().await?, pid, Role::Manager)?;
        let restored = self
            .mutate_catalog(&user.id, "project.restore", |cat| {
                let p = cat
                    .any_project_mut(pid)
                    .filter(|p| !p.is_live())
                    .ok_or_else(|| not_in_trash(pid))?;
                p.deleted_at = None;
                p.deleted_by = None;
                p.updated_at = ids::rfc3339(ids::now_ms());
                let p = p.clone();
                let ev = EventRow::new(
                    "project.restore",
                    &user.id,
                    Some(pid),
                    None,
                    serde_json::json!({}),
                );
                Ok((p, vec![Effect::Event(ev)]))
            })
            .await?;
        self.project_view(user, &restored)
            .ok_or_else(|| project_gone(pid))
    }

    /// Purges a project in the trash now (manager).
    pub async fn purge_project_now(&self, user: &User, pid: &ProjectId) -> HubResult<()> {
        self.require_trashed(user, &*self.catalog().await?, pid, Role::Manager)?;
        self.purge_project(&user.id, pid).await
    }

    /// Purges the projects whose time in the trash is over; how many.
    pub async fn purge_expired_projects(&self) -> HubResult<usize> {
        // Notebook purges a stopped process left half done, projects' included.
        self.resume_purges().await?;
        let keep = self.config.retention.project_trash_ms;
        if keep == 0 {
            return Ok(0);
        }
        let before = ids::now_ms().saturating_sub(i64::try_from(keep).unwrap_or(i64::MAX));
        let due: Vec<ProjectId> = self
            .catalog()
            .await?
            .all_projects()
            .filter(|p| {
                p.deleted_at
                    .as_deref()
                    .and_then(ids::parse_rfc3339_ms)
                    .is_some_and(|at| at < before)
            })
            .map(|p| p.id.clone())
            .collect();
        for pid in &due {
            self.purge_project("system", pid).await?;
        }
        Ok(due.len())
    }

    /// Takes every notebook of a trashed project out of the catalog (on to their purge),
    /// releases their histories, then removes the project.
    async fn purge_project(&self, actor: &str, pid: &ProjectId) -> HubResult<()> {
        let notebooks: Vec<NotebookId> = self
            .mutate_catalog(actor, "project.purge", |cat| {
                let p = cat
                    .any_project_mut(pid)
                    .filter(|p| !p.is_live())
                    .ok_or_else(|| not_in_trash(pid))?;
                let ids: Vec<NotebookId> = p.notebooks.drain(..).map(|n| n.id).collect();
                let effects = ids
                    .iter()
                    .map(|n| Effect::PurgeNotebook {
                        notebook_id: n.clone(),
                    })
                    .collect();
                Ok((ids, effects))
            })
            .await?;
        for nid in &notebooks {
            self.with_notebook_lock(nid, async || self.finish_purge(nid, actor).await)
                .await?;
        }
        self.mutate_catalog(actor, "project.purge", |cat| {
            if cat.any_project(pid).filter(|p| !p.is_live()).is_none() {
                return Err(not_in_trash(pid));
            }
            cat.remove_project(pid);
            let ev = EventRow::new(
                "project.purge",
                actor,
                Some(pid),
                None,
                serde_json::json!({"notebooks": notebooks.len()}),
            );
            Ok((
                (),
                vec![
                    Effect::Event(ev),
                    Effect::DropInvitations {
                        email: None,
                        project_ids: vec![pid.clone()],
                    },
                ],
            ))
        })
        .await
    }
}
