//! Push sync (seed 000 §4.6, push mode): an external workflow posts the complete workspace
//! tree as a tar archive with the notebook's sync token; it becomes a new immutable version.
//!
//! The body is streamed through a tar reader into a private temporary directory (bounded in
//! bytes and entries; only relative paths of valid components; regular files, directories and
//! symlinks, the latter created only after every file so nothing is written through one), then
//! stored as a tree: unchanged files and subtrees are already in the project's Space and cost
//! one lease, not an upload.

use std::io::Read;
use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use cas_client::TreeStats;
use serde::Serialize;
use tokio::io::AsyncRead;
use utoipa::ToSchema;

use crate::Hub;
use crate::auth::{SYNC_PREFIX, same, sync_hash};
use crate::catalog::Source;
use crate::error::{HubError, HubResult};
use crate::ids;
use crate::workspace::{
    Parent, VersionSpec, check_message, notebook_lock, parse_path, project_space,
};

/// Most entries one push may hold.
pub const MAX_ENTRIES: u64 = 200_000;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Synced {
    pub version_id: String,
    pub revision: i64,
    pub notebook_id: String,
    pub project_id: String,
    pub file_count: i64,
    pub size_bytes: i64,
    /// Bytes of the tar body received.
    pub received_bytes: u64,
    /// What had to be uploaded to the CAS (unchanged files cost nothing).
    pub uploaded_nodes: u64,
    pub uploaded_bytes: u64,
    pub tree: String,
}

/// What extraction found.
#[derive(Debug, Default)]
struct Extracted {
    stats: TreeStats,
    received: u64,
}

/// A reader that fails once more than `limit` bytes were read.
struct Limited<R> {
    inner: R,
    read: u64,
    limit: u64,
}

const TOO_LARGE: &str = "the body exceeds the sync size limit";

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read > self.limit {
            return Err(std::io::Error::other(TOO_LARGE));
        }
        Ok(n)
    }
}

fn tar_error(e: std::io::Error) -> HubError {
    if e.to_string().contains(TOO_LARGE) {
        HubError::too_large(TOO_LARGE)
    } else {
        HubError::invalid(format!("the body is not a valid tar archive: {e}"))
    }
}

/// Extracts a tar stream into `dest` (an empty directory). Blocking.
fn extract<R: Read>(reader: R, dest: &Path, limit: u64) -> HubResult<Extracted> {
    let mut limited = Limited {
        inner: reader,
        read: 0,
        limit,
    };
    let mut out = Extracted::default();
    let mut links: Vec<(PathBuf, String, String)> = Vec::new();
    let mut count = 0u64;
    {
        let mut archive = tar::Archive::new(&mut limited);
        for entry in archive.entries().map_err(tar_error)? {
            let mut entry = entry.map_err(tar_error)?;
            count += 1;
            if count > MAX_ENTRIES {
                return Err(HubError::too_large(format!(
                    "the archive holds more than {MAX_ENTRIES} entries"
                )));
            }
            let kind = entry.header().entry_type();
            if matches!(
                kind,
                tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
            ) {
                continue;
            }
            let raw = entry.path().map_err(tar_error)?.into_owned();
            let Some(raw) = raw.to_str().map(str::to_string) else {
                return Err(HubError::invalid(format!("{raw:?}: the path is not UTF-8")));
            };
            if raw.starts_with('/') {
                return Err(HubError::invalid(format!(
                    "{raw:?}: absolute paths are refused"
                )));
            }
            let trimmed = raw.trim_start_matches("./").trim_end_matches('/');
            if trimmed.is_empty() || trimmed == "." {
                continue; // the archive's root directory
            }
            let parts = parse_path(trimmed)
                .map_err(|e| HubError::invalid(format!("{raw:?}: {}", e.message)))?;
            let rel: PathBuf = parts.iter().collect();
            let path = dest.join(&rel);
            match kind {
                tar::EntryType::Directory => {
                    std::fs::create_dir_all(&path).map_err(|e| {
                        HubError::invalid(format!("{raw:?}: cannot be a directory here: {e}"))
                    })?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent).map_err(|e| {
                            HubError::invalid(format!(
                                "{raw:?}: its directory cannot be created: {e}"
                            ))
                        })?;
                    }
                    let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
                    let mut file = std::fs::File::create(&path).map_err(|e| {
                        HubError::invalid(format!("{raw:?}: cannot be a file here: {e}"))
                    })?;
                    let n = std::io::copy(&mut entry, &mut file).map_err(tar_error)?;
                    if executable {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                            .map_err(|e| HubError::internal("cannot set a file mode", e))?;
                    }
                    out.stats.files += 1;
                    out.stats.bytes += n as i64;
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(tar_error)?
                        .and_then(|t| t.to_str().map(str::to_string))
                        .ok_or_else(|| {
                            HubError::invalid(format!("{raw:?}: a symlink without a UTF-8 target"))
                        })?;
                    if target.is_empty() || target.len() > 4096 || target.contains('\0') {
                        return Err(HubError::invalid(format!(
                            "{raw:?}: invalid symlink target"
                        )));
                    }
                    links.push((path, target, raw));
                }
                tar::EntryType::Link => {
                    return Err(HubError::invalid(format!(
                        "{raw:?}: hard links are not supported; archive the file itself"
                    )));
                }
                other => {
                    return Err(HubError::invalid(format!(
                        "{raw:?}: entries of type {other:?} are not supported"
                    )));
                }
            }
        }
    }
    // Drain what follows the end marker, so the size limit covers the whole body.
    std::io::copy(&mut limited, &mut std::io::sink()).map_err(tar_error)?;
    for (path, target, raw) in links {
        if std::fs::symlink_metadata(&path).is_ok() {
            return Err(HubError::invalid(format!(
                "{raw:?} is a symlink and also a file or directory"
            )));
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| HubError::invalid(format!("{raw:?}: {e}")))?;
        }
        std::os::unix::fs::symlink(&target, &path)
            .map_err(|e| HubError::invalid(format!("{raw:?}: {e}")))?;
    }
    out.received = limited.read;
    Ok(out)
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
        if !ids::valid("nb-", nid) {
            return Err(unauthorized());
        }
        let nb = self.notebook_row(nid).await?.ok_or_else(unauthorized)?;
        match &nb.sync_token_hash {
            Some(h) if nb.state == "live" && same(h, &sync_hash(nid, secret)) => {}
            _ => return Err(unauthorized()),
        }
        let cat = self.catalog().await?;
        let entry = cat
            .project(&nb.project_id)
            .and_then(|p| p.notebook(nid))
            .ok_or_else(unauthorized)?;
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

        // Extract, streaming, into a private directory.
        let spool = self.config.spool_dir();
        tokio::fs::create_dir_all(&spool)
            .await
            .map_err(|e| HubError::internal("cannot create the spool directory", e))?;
        let dir = tempfile::Builder::new()
            .prefix("sync-")
            .tempdir_in(&spool)
            .map_err(|e| HubError::internal("cannot create a spool directory", e))?;
        let root = dir.path().join("tree");
        std::fs::create_dir(&root)
            .map_err(|e| HubError::internal("cannot create a spool directory", e))?;
        let bridge = tokio_util::io::SyncIoBridge::new(body);
        let limit = self.config.sync_max_bytes;
        let r = root.clone();
        let extracted = tokio::task::spawn_blocking(move || extract(bridge, &r, limit))
            .await
            .map_err(|e| HubError::internal("extraction failed", e))??;
        if let Some(entry) = &entry_notebook {
            // Checked inside the pushed tree: every component a real directory and the last a
            // regular file, so a pushed symlink cannot point the check outside the push.
            let parts: Vec<&str> = entry.split('/').collect();
            let mut at = root.clone();
            let mut present = true;
            for (i, part) in parts.iter().enumerate() {
                at.push(part);
                let last = i + 1 == parts.len();
                present = std::fs::symlink_metadata(&at)
                    .is_ok_and(|m| if last { m.is_file() } else { m.is_dir() });
                if !present {
                    break;
                }
            }
            if !present {
                return Err(HubError::invalid(format!(
                    "the push does not contain the entry notebook {entry:?}; nothing was stored"
                ))
                .with("entry_notebook", entry.as_str()));
            }
        }
        let space = project_space(&nb.project_id)?;
        let (tree, report, _) = self
            .cas
            .store_tree(
                &space,
                &root,
                self.config.lease_ms,
                self.config.parallelism,
                None,
            )
            .await
            .map_err(|e| match e {
                cas_client::ClientError::Invalid(m) => HubError::invalid(m),
                other => other.into(),
            })?;
        drop(dir);

        let guard = self.lock(&notebook_lock(nid)).await?;
        let result = async {
            self.settle(&notebook_lock(nid)).await?;
            let nb = match self.notebook_row(nid).await? {
                Some(nb) if nb.state == "live" => nb,
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
                stats: extracted.stats,
                author: format!("sync:{nid}"),
                message,
                kind: "sync".into(),
                saved_at_ms: ids::now_ms(),
                parent: nb.head_revision.map_or(Parent::None, Parent::Revision),
                extra,
            };
            self.commit_versions(&nb, cas_client::Plan::default(), vec![spec], true)
                .await
        }
        .await;
        guard.release().await;
        let mut committed = result?;
        let c = committed.remove(0);
        Ok(Synced {
            version_id: c.version_id,
            revision: c.revision,
            notebook_id: c.notebook_id,
            project_id: c.project_id,
            file_count: c.file_count,
            size_bytes: c.size_bytes,
            received_bytes: extracted.received,
            uploaded_nodes: report.uploaded_nodes + c.uploaded_nodes,
            uploaded_bytes: report.uploaded_bytes + c.uploaded_bytes,
            tree: c.tree,
        })
    }
}
