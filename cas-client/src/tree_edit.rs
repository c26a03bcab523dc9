//! Editing a stored tree: the tree that results from changes to some of its paths, re-planning
//! only the directories on those paths.

use std::collections::BTreeMap;

use cas_format::{Hash, SpaceId};

use crate::client::AppCasClient;
use crate::dag::Plan;
use crate::error::ClientError;
use crate::tree::{Entry, plan_entries, valid_name};
use crate::tree_check::TreeLimits;

/// A change to one path of a tree, for [`AppCasClient::plan_tree_edit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Put this entry at the path, replacing what was there.
    Put(Entry),
    /// Remove the entry at the path (a directory with everything below it).
    Remove,
}

/// Files and bytes a tree holds, or an edit added (negative: removed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeStats {
    pub files: i64,
    pub bytes: i64,
}

/// One entry of a walked tree: its `/`-separated path and the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkedEntry {
    pub path: String,
    pub entry: Entry,
}

type Changes = Vec<(Vec<String>, Change)>;

impl AppCasClient {
    /// Plans the tree that results from applying `changes` (path components → change) to the
    /// tree `base` (`None`: the empty tree). Only the directories on changed paths are read and
    /// re-planned; every other subtree keeps its node. Returns the new root and what the edit
    /// changed in files and bytes. A change below a file, or a removal of a path that does not
    /// exist, is refused with [`ClientError::Invalid`].
    pub async fn plan_tree_edit(
        &self,
        space: &SpaceId,
        plan: &mut Plan,
        base: Option<Hash>,
        changes: Vec<(Vec<String>, Change)>,
    ) -> Result<(Hash, TreeStats), ClientError> {
        let mut stats = TreeStats::default();
        let root = self
            .edit_dir(space, plan, base, changes, String::new(), &mut stats)
            .await?;
        Ok((root, stats))
    }

    fn edit_dir<'a>(
        &'a self,
        space: &'a SpaceId,
        plan: &'a mut Plan,
        base: Option<Hash>,
        changes: Changes,
        prefix: String,
        stats: &'a mut TreeStats,
    ) -> futures_util::future::BoxFuture<'a, Result<Hash, ClientError>> {
        Box::pin(async move {
            let mut entries = match base {
                Some(h) => self.read_dir(space, &h).await?,
                None => BTreeMap::new(),
            };
            let mut groups: BTreeMap<String, (Option<Change>, Changes)> = BTreeMap::new();
            for (mut path, change) in changes {
                if path.is_empty() {
                    return Err(ClientError::Invalid("an empty path".into()));
                }
                let name = path.remove(0);
                if !valid_name(&name) {
                    return Err(ClientError::Invalid(format!(
                        "invalid path component {name:?}"
                    )));
                }
                let g = groups.entry(name.clone()).or_default();
                if path.is_empty() {
                    if g.0.is_some() {
                        return Err(ClientError::Invalid(format!(
                            "{prefix}{name} is changed twice"
                        )));
                    }
                    g.0 = Some(change);
                } else {
                    g.1.push((path, change));
                }
            }
            for (name, (direct, nested)) in groups {
                let here = format!("{prefix}{name}");
                match direct {
                    Some(Change::Put(e)) => {
                        if !nested.is_empty() {
                            return Err(ClientError::Invalid(format!(
                                "{here} is set and also has changes below it"
                            )));
                        }
                        if let Some(old) = entries.insert(name.clone(), e.clone()) {
                            let s = self.entry_stats(space, &old).await?;
                            stats.files = stats.files.saturating_sub(s.files);
                            stats.bytes = stats.bytes.saturating_sub(s.bytes);
                        }
                        let s = self.entry_stats(space, &e).await?;
                        stats.files = stats.files.saturating_add(s.files);
                        stats.bytes = stats.bytes.saturating_add(s.bytes);
                    }
                    Some(Change::Remove) => match entries.remove(&name) {
                        Some(old) => {
                            let s = self.entry_stats(space, &old).await?;
                            stats.files = stats.files.saturating_sub(s.files);
                            stats.bytes = stats.bytes.saturating_sub(s.bytes);
                        }
                        None => {
                            return Err(ClientError::Invalid(format!("{here} does not exist")));
                        }
                    },
                    None => {}
                }
                if nested.is_empty() {
                    continue;
                }
                let sub_base = match entries.get(&name) {
                    Some(Entry::Dir { node }) => Some(*node),
                    None => None,
                    Some(_) => {
                        return Err(ClientError::Invalid(format!("{here} is not a directory")));
                    }
                };
                let node = self
                    .edit_dir(space, plan, sub_base, nested, format!("{here}/"), stats)
                    .await?;
                entries.insert(name, Entry::Dir { node });
            }
            plan_entries(plan, &entries)
        })
    }

    /// Files and bytes below one entry (a directory is walked, within [`TreeLimits`]).
    async fn entry_stats(&self, space: &SpaceId, e: &Entry) -> Result<TreeStats, ClientError> {
        Ok(match e {
            Entry::File { file, .. } => TreeStats {
                files: 1,
                bytes: i64::try_from(file.size).unwrap_or(i64::MAX),
            },
            Entry::Symlink { .. } => TreeStats::default(),
            Entry::Dir { node } => {
                let mut s = TreeStats::default();
                let mut walk = self.walk(space, node, TreeLimits::default()).await?;
                while let Some(w) = walk.next().await? {
                    if let Entry::File { file, .. } = w.entry {
                        s.files += 1;
                        s.bytes = s.bytes.saturating_add(file.size as i64);
                    }
                }
                s
            }
        })
    }
}
