//! Push sync (seed 000 §4.6, push mode): an external workflow posts the complete workspace
//! tree as a tar archive with the notebook's sync token; it becomes a new immutable version.
//!
//! The body is read as a stream (bounded in bytes and entries, a spool slot held, the disk
//! above its floor): file contents go to one anonymous spool file, the tree is built in memory
//! ([`cas_client::TreeBuilder`]), symlinks stay link entries whose target is data, and an entry
//! whose path passes through a symlink of the same archive is refused. Nothing the archive
//! names is ever created on disk. Unchanged files and subtrees are already in the project's
//! Space and cost one lease, not an upload.

use axum::http::StatusCode;
use cas_client::TreeBuilder;
use cas_client::tarball::{TarError, TarLimits, read_tar};
use serde::Serialize;
use tokio::io::AsyncRead;
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::{SYNC_PREFIX, same, sync_hash};
use crate::catalog::{Role, Source};
use crate::commit::{Parent, VersionSpec};
use crate::error::{HubError, HubResult};
use crate::ids::{self, NotebookId, ProjectId, VersionId};
use crate::store::{NotebookState, VersionKind};
use crate::workspace::{check_message, parse_path};

/// Most entries one push may hold.
pub const MAX_ENTRIES: u64 = 200_000;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Synced {
    pub version_id: VersionId,
    pub revision: i64,
    pub notebook_id: NotebookId,
    pub project_id: ProjectId,
    pub file_count: i64,
    pub size_bytes: i64,
    /// Bytes of the tar body received.
    pub received_bytes: u64,
    /// What had to be uploaded to the CAS (unchanged files cost nothing).
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
    pub tree: String,
}

fn tar_error(e: TarError) -> HubError {
    match e {
        TarError::TooLarge(n) => {
            HubError::too_large(format!("the body exceeds the sync size limit of {n} bytes"))
        }
        TarError::Invalid(m) => HubError::invalid(format!("{m}; nothing was stored")),
        TarError::Body(e) if crate::spool::is_disk_full(&e) => HubError::insufficient_storage(),
        TarError::Body(e) => HubError::invalid(format!("the body could not be read: {e}")),
        TarError::Spool(e) => HubError::internal("spooling a push failed", e),
    }
}

impl Hub {
    /// Receives one push: authenticates the sync token, stores the tree, commits a version.
    pub async fn push_sync<R: AsyncRead + Unpin + Send + 'static>(
        &self,
        token: Option<&str>,
        body: R,
        commit: Option<String>,
        message: Option<String>,
    ) -> HubResult<Synced> {
        let unauthorized = || HubError::unauthorized("a valid sync token is required");
        let rest = token
            .and_then(|t| t.strip_prefix(SYNC_PREFIX))
            .ok_or_else(unauthorized)?;
        if rest.len() < 21 || rest.as_bytes()[19] != b'_' {
            return Err(unauthorized());
        }
        let (nid, secret) = (&rest[..19], &rest[20..]);
        let nid: NotebookId = nid.parse().map_err(|_| unauthorized())?;
        let nb = self.store.notebook(&nid).await?.ok_or_else(unauthorized)?;
        match &nb.sync_token_hash {
            Some(h) if nb.state == NotebookState::Live && same(h, &sync_hash(&nid, secret)) => {}
            _ => return Err(unauthorized()),
        }
        let cat = self.catalog().await?;
        let project = cat.project(&nb.project_id).ok_or_else(unauthorized)?;
        let entry = project.notebook(&nid).ok_or_else(unauthorized)?;
        // The token acts for its owner, as the owner stands now: removed from the project,
        // demoted below editor or suspended, and the token stops working.
        let owner_id = nb.sync_token_owner.as_deref().unwrap_or(&entry.author);
        let standing = match self.user_standing(owner_id).await? {
            Some(owner) => self
                .role(&owner, project)
                .is_some_and(|r| r >= Role::Editor),
            None => false,
        };
        if !standing {
            return Err(HubError::forbidden(
                "the user this sync token acts for may no longer write to this project; a manager can rotate the token to become its owner",
            ));
        }
        let entry_notebook = match &entry.source {
            Source::Git { entry_notebook, .. } => entry_notebook.clone(),
            Source::Local { .. } => return Err(unauthorized()),
        };
        if let Some(c) = &commit
            && (c.is_empty() || c.len() > 64 || !c.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(HubError::invalid("the commit must be a hex object id"));
        }
        let message = check_message(message.as_deref())?;
        let message = if message.is_empty() {
            commit
                .as_ref()
                .map_or_else(|| "Sync".to_string(), |c| format!("Sync of {c}"))
        } else {
            message
        };

        // Read the archive, streaming, into a tree: contents to an anonymous spool file.
        let _slot = self.spools.slot()?;
        let spool = self.spools.file()?;
        let entry_path = entry_notebook.as_deref().map(parse_path).transpose()?;
        let reader = self.spools.guard(tokio_util::io::SyncIoBridge::new(body));
        let limits = TarLimits {
            max_bytes: self.config.sync_max_bytes,
        };
        let (plan, tree, stats, received, entry_found) = tokio::task::spawn_blocking(move || {
            let mut builder = TreeBuilder::new(spool, MAX_ENTRIES);
            let summary = read_tar(reader, &limits, &mut builder).map_err(tar_error)?;
            // Checked inside the pushed tree: every component a directory of the push and the
            // last a regular file, so no link can point the check anywhere else.
            let found = entry_path.as_deref().is_none_or(|p| builder.is_file(p));
            let (plan, root, stats) = builder.finish().map_err(|e| match e {
                cas_client::ClientError::Invalid(m) => HubError::invalid(m),
                other => HubError::internal("planning a push failed", other),
            })?;
            Ok::<_, HubError>((plan, root, stats, summary.received, found))
        })
        .await
        .map_err(|e| HubError::internal("reading a push failed", e))??;
        if !entry_found && let Some(entry) = &entry_notebook {
            return Err(HubError::invalid(format!(
                "the push does not contain the entry notebook {entry:?}; nothing was stored"
            ))
            .with("entry_notebook", entry.as_str()));
        }
        let space = nb.project_id.space();
        // The head as this push found it: only advice for storing the new nodes as deltas.
        let head = match nb.head_revision {
            Some(rev) => self.loadable(&nb, Some(rev)).await.ok().map(|v| v.tree),
            None => None,
        };
        let mut plan = plan;
        self.suggest_bases(&space, &mut plan, tree, head).await;
        let report = self
            .uploader(&space, &plan)?
            .run(&[tree])
            .await
            .map_err(|e| match e {
                cas_client::ClientError::Invalid(m) => HubError::invalid(m),
                other => other.into(),
            })?;
        drop(plan);

        let mut committed = self
            .with_notebook_lock(&nid, async || {
                let nb = match self.store.notebook(&nid).await? {
                    Some(nb) if nb.state == NotebookState::Live => nb,
                    _ => {
                        return Err(HubError::new(
                            StatusCode::GONE,
                            "NOT_FOUND",
                            "the notebook was deleted",
                        ));
                    }
                };
                let mut extra = std::collections::BTreeMap::new();
                if let Some(c) = &commit {
                    extra.insert("git_commit".to_string(), c.clone());
                }
                let spec = VersionSpec {
                    tree,
                    stats,
                    author: format!("sync:{nid}"),
                    message,
                    kind: VersionKind::Sync,
                    saved_at_ms: ids::now_ms(),
                    parent: nb.head_revision.map_or(Parent::None, Parent::Revision),
                    extra,
                    snapshots: Vec::new(),
                };
                self.commit_versions(&nb, cas_client::Plan::default(), vec![spec], true)
                    .await
            })
            .await?;
        let c = committed.remove(0);
        Ok(Synced {
            version_id: c.version_id,
            revision: c.revision,
            notebook_id: c.notebook_id,
            project_id: c.project_id,
            file_count: c.file_count,
            size_bytes: c.size_bytes,
            received_bytes: received,
            uploaded_nodes: report.uploaded_nodes + c.uploaded_nodes,
            uploaded_bytes: report.uploaded_bytes + c.uploaded_bytes,
            tree: c.tree,
        })
    }
}
