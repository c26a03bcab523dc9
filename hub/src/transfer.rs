//! Bodies that carry content: staged file uploads, workspace export (a CAS archive of every kept
//! version) and import. Bodies are spooled to anonymous files (see [`crate::spool`]), bounded,
//! never held in memory whole. An imported archive is data: every version's tree is walked
//! within the workspace limits and every size it claims is checked against the nodes, and what
//! the hub records (files, bytes, author) is computed, not taken from the archive.

use std::collections::BTreeMap;

use cas_client::TreeLimits;
use cas_client::{ClientError, Plan, TreeStats};
use cas_format::Value;
use tokio::io::AsyncRead;

use crate::Hub;
use crate::auth::User;
use crate::catalog::{Role, Source};
use crate::commit::{Parent, VERSION_KIND, VersionSpec};
use crate::error::{HubError, HubResult};
use crate::ids::ProjectId;
use crate::notebooks::CreatedNotebook;
use crate::store::{NotebookRow, VersionKind};
use crate::workspace::{MAX_MESSAGE, StagedFile};

fn client_invalid(e: ClientError) -> HubError {
    match e {
        ClientError::Invalid(m) => HubError::invalid(m),
        other => other.into(),
    }
}

/// Most nodes of one imported archive.
pub const MAX_IMPORT_NODES: u64 = 1_000_000;

impl Hub {
    /// Stores one file in the project's Space ahead of a save (chunked when large). The answer
    /// goes into a save's `files` as `staged`; it is protected by a lease until then.
    pub async fn stage_upload<R: AsyncRead + Unpin>(
        &self,
        user: &User,
        pid: &ProjectId,
        body: R,
    ) -> HubResult<StagedFile> {
        self.project_for(user, pid, Role::Editor).await?;
        let space = pid.space();
        let _slot = self.spools.slot()?;
        let (file, len) = self
            .spools
            .copy(body, self.config.upload_max_bytes, "upload")
            .await?;
        let (file, _report) = self
            .cas()?
            .store_spooled(
                &space,
                file,
                len,
                self.config.lease_ms,
                self.config.parallelism,
            )
            .await
            .map_err(client_invalid)?;
        Ok(StagedFile {
            node: file.node,
            size: file.size,
            chunked: file.chunked,
        })
    }

    /// Writes every kept version of the notebook (and all it references) to an archive in an
    /// anonymous spool file; returns it open at the start and its length.
    pub async fn export_notebook(&self, nb: &NotebookRow) -> HubResult<(tokio::fs::File, u64)> {
        let roots: Vec<_> = self
            .kept_versions(&nb.notebook_id)
            .await?
            .into_iter()
            .map(|(_, h)| h)
            .collect();
        if roots.is_empty() {
            return Err(HubError::not_found(format!(
                "notebook {} has no revision to export",
                nb.notebook_id
            )));
        }
        let _slot = self.spools.slot()?;
        let mut file = self.spools.file()?;
        let writer = file
            .try_clone()
            .map_err(|e| HubError::internal("cannot open a spool file", e))?;
        let space = nb.project_id.space();
        let report = self.cas()?.export_to(&space, &roots, writer, None).await?;
        std::io::Seek::rewind(&mut file)
            .map_err(|e| HubError::internal("cannot rewind the archive", e))?;
        Ok((tokio::fs::File::from_std(file), report.bytes))
    }

    /// Creates a notebook from an exported archive: every node is verified and stored, then one
    /// new revision per exported version, in their order, each retained by a root ref.
    pub async fn import_notebook<R: AsyncRead + Unpin>(
        &self,
        user: &User,
        pid: &ProjectId,
        title: &str,
        body: R,
    ) -> HubResult<CreatedNotebook> {
        self.project_for(user, pid, Role::Editor).await?;
        let title = crate::notebooks::check_title(title)?;
        {
            let cat = self.catalog().await?;
            if let Some(p) = cat.project(pid)
                && p.title_taken(&title, None)
            {
                return Err(HubError::name_taken(&title));
            }
        }
        let space = pid.space();
        let slot = self.spools.slot()?;
        let (file, _) = self
            .spools
            .copy(body, self.config.sync_max_bytes, "archive")
            .await?;
        // First the archive alone: every version a notebook version, every tree within the
        // workspace limits, every size it claims true. Nothing is stored before this passes.
        let checked = {
            let file = file
                .try_clone()
                .map_err(|e| HubError::internal("cannot open a spool file", e))?;
            tokio::task::spawn_blocking(move || {
                cas_client::transfer::check_archive(&file, TreeLimits::default(), MAX_IMPORT_NODES)
            })
            .await
            .map_err(|e| HubError::internal("checking an archive failed", e))?
        };
        let (summary, check) = checked.map_err(client_invalid)?;
        let mut versions = Vec::with_capacity(summary.roots.len());
        for root in &summary.roots {
            let v = check.roots().get(root).ok_or_else(|| {
                HubError::invalid(format!("root {root} is not a notebook version"))
            })?;
            let (revision, mut spec) = parse_version(root, v, &user.id)?;
            // What the version holds is computed from its tree, not taken from the archive.
            spec.stats = check
                .summary(&spec.tree)
                .ok_or_else(|| {
                    HubError::invalid(format!(
                        "version {revision} of the archive: its workspace is not a directory of the archive"
                    ))
                })?
                .stats;
            versions.push((revision, spec));
        }
        self.cas()?
            .import_file(
                &space,
                file,
                None,
                self.config.lease_ms,
                self.config.parallelism,
                None,
            )
            .await
            .map_err(client_invalid)?;
        drop(slot);
        versions.sort_by_key(|v| v.0);
        let entry = Self::new_entry(
            user,
            title,
            String::new(),
            Vec::new(),
            Source::Local {
                entry_notebook: None,
            },
        );
        let specs: Vec<VersionSpec> = versions
            .into_iter()
            .enumerate()
            .map(|(i, (_, mut spec))| {
                spec.parent = if i == 0 {
                    Parent::None
                } else {
                    Parent::Previous
                };
                spec
            })
            .collect();
        self.add_notebook(user, pid, entry.clone(), None, "notebook.import", None)
            .await?;
        let committed = self.commit_new(&entry.id, Plan::default(), specs).await?;
        let row = self.store.notebook(&entry.id).await?;
        Ok(CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, row.as_ref()),
            sync_token: None,
            revision: committed.into_iter().last(),
        })
    }
}

/// Reads an exported version node into (original revision, spec), authored by `importer`;
/// its counts are left for the caller to compute from the tree.
fn parse_version(
    root: &cas_format::Hash,
    v: &Value,
    importer: &str,
) -> HubResult<(i64, VersionSpec)> {
    let bad =
        |what: &str| HubError::invalid(format!("root {root} is not a notebook version: {what}"));
    if v.get("kind").and_then(Value::as_str) != Some(VERSION_KIND) {
        return Err(bad("no kind \"notebook-version\""));
    }
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let n = |k: &str| v.get(k).and_then(Value::as_i64);
    let tree = v
        .get("workspace")
        .and_then(Value::as_blob)
        .ok_or_else(|| bad("no workspace"))?;
    let revision = n("revision")
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("no revision"))?;
    let saved_at_ms = s("saved_at")
        .and_then(|t| {
            time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).ok()
        })
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .ok_or_else(|| bad("no saved_at"))?;
    let message = s("message").unwrap_or_default();
    if message.len() > MAX_MESSAGE {
        return Err(bad(&format!(
            "its message is longer than {MAX_MESSAGE} bytes"
        )));
    }
    let mut extra = BTreeMap::new();
    for (from, to) in [
        ("version_id", "imported_from"),
        ("author", "imported_author"),
    ] {
        if let Some(value) = s(from) {
            if value.len() > 256 {
                return Err(bad(&format!("its {from} is longer than 256 bytes")));
            }
            extra.insert(to.to_string(), value);
        }
    }
    Ok((
        revision,
        VersionSpec {
            tree,
            stats: TreeStats::default(),
            author: importer.to_string(),
            message,
            kind: VersionKind::Import,
            saved_at_ms,
            parent: Parent::None,
            extra,
            snapshots: Vec::new(),
        },
    ))
}
