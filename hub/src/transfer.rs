//! Bodies that carry content: staged file uploads, workspace export (a CAS archive of every kept
//! version) and import. Bodies are spooled to disk, bounded, never held in memory whole.

use std::collections::BTreeMap;
use std::path::Path;

use cas_client::files::FileRef;
use cas_client::{ClientError, Plan, TreeStats};
use cas_format::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::Hub;
use crate::auth::User;
use crate::catalog::{NotebookEntry, Role, Source};
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::notebooks::CreatedNotebook;
use crate::workspace::{NotebookRow, Parent, StagedFile, VERSION_KIND, VersionSpec, project_space};

/// Copies `body` into a new temporary file of the spool directory, refusing more than `limit`
/// bytes (413). Returns the file (deleted when dropped) and the bytes written.
pub async fn spool<R: AsyncRead + Unpin>(
    dir: &Path,
    body: R,
    limit: u64,
    what: &str,
) -> HubResult<(tempfile::NamedTempFile, u64)> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| HubError::internal("cannot create the spool directory", e))?;
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| HubError::internal("cannot create a spool file", e))?;
    let file = tmp
        .reopen()
        .map_err(|e| HubError::internal("cannot open a spool file", e))?;
    let mut out = tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(file));
    let mut limited = body.take(limit.saturating_add(1));
    let n = tokio::io::copy(&mut limited, &mut out)
        .await
        .map_err(|e| HubError::invalid(format!("the {what} could not be read: {e}")))?;
    if n > limit {
        return Err(HubError::too_large(format!(
            "the {what} is larger than {limit} bytes"
        )));
    }
    out.flush()
        .await
        .map_err(|e| HubError::internal("cannot write a spool file", e))?;
    Ok((tmp, n))
}

fn client_invalid(e: ClientError) -> HubError {
    match e {
        ClientError::Invalid(m) => HubError::invalid(m),
        other => other.into(),
    }
}

impl Hub {
    /// Stores one file in the project's Space ahead of a save (chunked when large). The answer
    /// goes into a save's `files` as `staged`; it is protected by a lease until then.
    pub async fn stage_upload<R: AsyncRead + Unpin>(
        &self,
        user: &User,
        pid: &str,
        body: R,
    ) -> HubResult<StagedFile> {
        self.project_for(user, pid, Role::Editor).await?;
        let space = project_space(pid)?;
        let (tmp, _) = spool(
            &self.config.spool_dir(),
            body,
            self.config.upload_max_bytes,
            "upload",
        )
        .await?;
        let (file, _report): (FileRef, _) = self
            .cas
            .store_file(
                &space,
                tmp.path(),
                self.config.lease_ms,
                self.config.parallelism,
                None,
            )
            .await
            .map_err(client_invalid)?;
        Ok(StagedFile {
            node: file.node,
            size: file.size,
            chunked: file.chunked,
        })
    }

    /// Writes every kept version of the notebook (and all it references) to an archive in a
    /// temporary file, already unlinked; returns it open at the start and its length.
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
        let dir = self.config.spool_dir();
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| HubError::internal("cannot create the spool directory", e))?;
        let tmp = tempfile::NamedTempFile::new_in(&dir)
            .map_err(|e| HubError::internal("cannot create a spool file", e))?;
        let space = project_space(&nb.project_id)?;
        self.cas.export(&space, &roots, tmp.path(), None).await?;
        let file = tmp
            .reopen()
            .map_err(|e| HubError::internal("cannot reopen the archive", e))?;
        let len = file
            .metadata()
            .map_err(|e| HubError::internal("cannot stat the archive", e))?
            .len();
        drop(tmp); // unlinked; the open handle keeps it readable
        Ok((tokio::fs::File::from_std(file), len))
    }

    /// Creates a notebook from an exported archive: every node is verified and stored, then one
    /// new revision per exported version, in their order, each retained by a root ref.
    pub async fn import_notebook<R: AsyncRead + Unpin>(
        &self,
        user: &User,
        pid: &str,
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
        let space = project_space(pid)?;
        let (tmp, _) = spool(
            &self.config.spool_dir(),
            body,
            self.config.sync_max_bytes,
            "archive",
        )
        .await?;
        let report = self
            .cas
            .import(
                &space,
                tmp.path(),
                None,
                self.config.lease_ms,
                self.config.parallelism,
                None,
            )
            .await
            .map_err(client_invalid)?;
        let mut versions = Vec::with_capacity(report.roots.len());
        for root in &report.roots {
            let content = self.cas.read_svalue_node(&space, root).await?;
            let (v, _) = cas_format::svalue::decode(&content)
                .map_err(|e| HubError::invalid(format!("root {root}: {e}")))?;
            versions.push(parse_version(root, &v)?);
        }
        versions.sort_by_key(|v| v.0);
        let now_ms = ids::now_ms();
        let entry = NotebookEntry {
            id: ids::notebook_id(),
            title,
            description: String::new(),
            status: "active".into(),
            author: user.id.clone(),
            created_at: ids::rfc3339(now_ms),
            updated_at: ids::rfc3339(now_ms),
            tags: Vec::new(),
            source: Source::Local {
                entry_notebook: None,
            },
            status_before_delete: None,
        };
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
        self.add_notebook(user, pid, entry.clone(), None, "notebook.import")
            .await?;
        let committed = self.commit_new(&entry.id, Plan::default(), specs).await?;
        let row = self.notebook_row(&entry.id).await?;
        Ok(CreatedNotebook {
            notebook: self.notebook_view(pid, &entry, row.as_ref()),
            sync_token: None,
            revision: committed.into_iter().last(),
        })
    }
}

/// Reads an exported version node into (original revision, spec).
fn parse_version(root: &cas_format::Hash, v: &Value) -> HubResult<(i64, VersionSpec)> {
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
    let mut extra = BTreeMap::new();
    if let Some(id) = s("version_id") {
        extra.insert("imported_from".to_string(), id);
    }
    Ok((
        revision,
        VersionSpec {
            tree,
            stats: TreeStats {
                files: n("file_count").unwrap_or(0),
                bytes: n("size_bytes").unwrap_or(0),
            },
            author: s("author").unwrap_or_default(),
            message: s("message").unwrap_or_default(),
            kind: "import".into(),
            saved_at_ms,
            parent: Parent::None,
            extra,
        },
    ))
}
