//! New notebooks made from another's history: a fork copies one revision into a new notebook
//! at revision 1; a refused edit (seed 002) is kept as the first revision of its own notebook,
//! named for what it diverged from. Neither overwrites anything.

use std::collections::BTreeMap;

use cas_client::Plan;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::User;
use crate::catalog::{Role, Source};
use crate::commit::{Parent, VersionSpec};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId};
use crate::notebooks::{CreatedNotebook, check_title};
use crate::projects::{MAX_TITLE, project_gone};
use crate::store::{VersionKind, VersionState};
use crate::versions::pruned;
use crate::workspace::{FileInput, check_message, edit_error};

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

/// A branch whose files are planned already.
pub struct PlannedBranch<'a> {
    pub user: &'a User,
    pub project: &'a ProjectId,
    pub notebook: &'a NotebookId,
    pub base_revision: i64,
    pub title: Option<String>,
    pub message: String,
    pub plan: Plan,
    pub changes: Vec<(Vec<String>, cas_client::Change)>,
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_bytes(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Hub {
    /// Copies one revision into a new notebook at revision 1, leaving the source alone.
    pub async fn fork(
        &self,
        user: &User,
        pid: &ProjectId,
        nid: &NotebookId,
        req: ForkRequest,
    ) -> HubResult<CreatedNotebook> {
        let (src, nb) = self.notebook_for(user, pid, nid, Role::Editor).await?;
        let title = check_title(&req.new_title)?;
        let v = self.loadable(&nb, req.revision).await?;
        // A tree that entered before the workspace limits held is not copied further.
        let summary = self
            .cas()?
            .check_tree(&pid.space(), &v.tree, &cas_client::TreeLimits::default())
            .await
            .map_err(edit_error)?;
        let entry_notebook = src.source.entry_notebook().map(str::to_string);
        let entry = Self::new_entry(
            user,
            title,
            src.description.clone(),
            src.tags.clone(),
            Source::Local { entry_notebook },
        );
        self.add_notebook(user, pid, entry.clone(), None, "notebook.fork", None)
            .await?;
        let spec = VersionSpec {
            tree: v.tree,
            stats: summary.stats,
            author: user.id.clone(),
            message: format!("Forked from {} revision {}", src.title, v.revision),
            kind: VersionKind::Fork,
            saved_at_ms: ids::now_ms(),
            parent: Parent::None,
            extra: BTreeMap::from([("forked_from".to_string(), v.version_id.to_string())]),
            snapshots: Vec::new(),
        };
        let revision = self
            .commit_new(&entry.id, Plan::default(), vec![spec])
            .await?
            .pop();
        let row = self.store.notebook(&entry.id).await?;
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
        pid: &ProjectId,
        nid: &NotebookId,
        req: BranchRequest,
    ) -> HubResult<CreatedNotebook> {
        self.notebook_for(user, pid, nid, Role::Editor).await?;
        let message = check_message(req.message.as_deref())?;
        let mut plan = Plan::default();
        let changes = self
            .plan_changes(&pid.space(), &mut plan, req.files, req.deleted)
            .await?;
        self.branch_planned(PlannedBranch {
            user,
            project: pid,
            notebook: nid,
            base_revision: req.base_revision,
            title: req.title,
            message,
            plan,
            changes,
        })
        .await
    }

    /// [`Hub::branch_refused_edit`] of changes already planned.
    pub async fn branch_planned(&self, b: PlannedBranch<'_>) -> HubResult<CreatedNotebook> {
        let PlannedBranch {
            user,
            project: pid,
            notebook: nid,
            mut plan,
            changes,
            message,
            ..
        } = b;
        let (src, nb) = self.notebook_for(user, pid, nid, Role::Editor).await?;
        let base = match self.version(&nb, b.base_revision).await? {
            Some(v) if v.state == VersionState::Pruned => return Err(pruned(v.revision)),
            Some(v) => v,
            None => {
                return Err(HubError::invalid(format!(
                    "base_revision {} does not exist: an edit that diverged from nothing is not a divergence",
                    b.base_revision
                )));
            }
        };
        let space = pid.space();
        let (tree, delta) = self
            .cas()?
            .plan_tree_edit(&space, &mut plan, Some(base.tree), changes)
            .await
            .map_err(edit_error)?;
        let explicit = b.title.as_deref().map(check_title).transpose()?;
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
        let entry = Self::new_entry(
            user,
            title,
            src.description.clone(),
            src.tags.clone(),
            Source::Local {
                entry_notebook: src.source.entry_notebook().map(str::to_string),
            },
        );
        self.add_notebook(user, pid, entry.clone(), None, "notebook.branch", None)
            .await?;
        let spec = VersionSpec {
            tree,
            stats: cas_client::TreeStats {
                files: base.file_count.saturating_add(delta.files),
                bytes: base.size_bytes.saturating_add(delta.bytes),
            },
            author: user.id.clone(),
            message,
            kind: VersionKind::Branch,
            saved_at_ms: ids::now_ms(),
            parent: Parent::None,
            extra: BTreeMap::from([
                ("branched_from".to_string(), base.version_id.to_string()),
                ("branched_from_notebook".to_string(), nid.to_string()),
            ]),
            snapshots: Vec::new(),
        };
        let revision = self.commit_new(&entry.id, plan, vec![spec]).await?.pop();
        let row = self.store.notebook(&entry.id).await?;
        Ok(CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, row.as_ref()),
            sync_token: None,
            revision,
        })
    }
}
