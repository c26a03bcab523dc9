//! The trash: a deleted notebook keeps its whole history, restorable by token under its title;
//! a purge releases every root of its history (one delta per thousand) and CAS garbage
//! collection frees what nothing else references.

use crate::Hub;
use crate::auth::User;
use crate::catalog::{NotebookStatus, Role};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId};
use crate::notebooks::{NotebookView, TrashEntry, Trashed, notebook_gone};
use crate::outbox::Effect;
use crate::projects::project_gone;
use crate::store::EventRow;

impl Hub {
    /// Moves a notebook, with its whole history, to the project's trash.
    pub async fn trash_notebook(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
    ) -> HubResult<Trashed> {
        self.notebook_for(user, pid, nid, Role::Manager).await?;
        self.with_notebook_lock(nid, async || {
            self.live_notebook(pid, nid).await?;
            let at = ids::now_ms();
            let token = format!("{nid}.{at}-{}", &ids::secret()[..8]);
            let t = token.clone();
            self.mutate_catalog(&user.id, "notebook.delete", move |cat| {
                let p = cat.project_mut(pid).ok_or_else(|| project_gone(pid))?;
                let n = p
                    .notebook_mut(nid)
                    .filter(|n| n.is_live())
                    .ok_or_else(|| notebook_gone(nid))?;
                n.status_before_delete =
                    Some(std::mem::replace(&mut n.status, NotebookStatus::Deleted));
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
                            notebook_id: nid.clone(),
                            project_id: pid.clone(),
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
        })
        .await
    }

    pub async fn list_trash(&self, user: &User, pid: &ProjectId) -> HubResult<Vec<TrashEntry>> {
        self.project_for(user, pid, Role::Viewer).await?;
        Ok(self
            .store
            .trash(pid)
            .await?
            .into_iter()
            .map(|r| TrashEntry {
                token: r.token,
                notebook_id: r.notebook_id,
                title: r.title,
                deleted_at: ids::rfc3339(r.trashed_at_ms),
                deleted_by: r.actor,
            })
            .collect())
    }

    async fn trashed(&self, pid: &ProjectId, token: &str) -> HubResult<NotebookId> {
        self.store
            .trashed_notebook(pid, token)
            .await?
            .ok_or_else(|| HubError::not_found("no such entry in the trash"))
    }

    /// Brings a trashed notebook back under its title, with every revision it had; refused
    /// (and nothing changed) when a live notebook has taken the title meanwhile.
    pub async fn restore_trash(
        &self,
        user: &User,
        pid: &ProjectId,
        token: &str,
    ) -> HubResult<NotebookView> {
        self.project_for(user, pid, Role::Manager).await?;
        let nid = self.trashed(pid, token).await?;
        self.with_notebook_lock(&nid, async || {
            self.trashed(pid, token).await?;
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
                        .unwrap_or(NotebookStatus::Active);
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
            let row = self.store.notebook(&nid).await?;
            Ok(self.notebook_view(pid, &entry, row.as_ref()))
        })
        .await
    }

    /// Purges a trashed notebook: it leaves the catalog and every root of its history is
    /// released in one delta (per thousand); CAS GC then frees what nothing else references.
    pub async fn purge_trash(&self, user: &User, pid: &ProjectId, token: &str) -> HubResult<()> {
        self.project_for(user, pid, Role::Manager).await?;
        let nid = self.trashed(pid, token).await?;
        self.with_notebook_lock(&nid, async || {
            self.trashed(pid, token).await?;
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
        })
        .await
    }
}
