//! Walking stored trees within bounds, and checking what they claim.
//!
//! A tree that comes from elsewhere (an imported archive, an old deployment) is data: its
//! depth, its path lengths and its entry count (every path counted, so a DAG that references
//! one subtree many times cannot hide a combinatorial number of paths) are bounded by
//! [`TreeLimits`], and every size it claims for a file is checked against the nodes. Walks
//! yield one entry at a time ([`TreeWalk`]) and hold one directory per level, never the list
//! of every path. [`ArchiveTreeCheck`] does the same bottom-up over an archive's nodes before
//! anything of it is stored.

use std::collections::{BTreeMap, HashMap};

use cas_format::archive::ArchiveNode;
use cas_format::{Hash, SpaceId, Value};

use crate::client::AppCasClient;
use crate::error::ClientError;
use crate::files::FileRef;
use crate::tree::{Entry, MAX_PATH_BYTES, MAX_PATH_DEPTH, TreeStats, WalkedEntry};

impl AppCasClient {
    /// Every entry below the tree `root`, depth first in name order, directories before what
    /// they hold; at most `limit` entries (an error beyond).
    pub async fn walk_tree(
        &self,
        space: &SpaceId,
        root: &Hash,
        limit: usize,
    ) -> Result<Vec<WalkedEntry>, ClientError> {
        let limits = TreeLimits {
            max_entries: limit as u64,
            ..TreeLimits::default()
        };
        let mut walk = self.walk(space, root, limits).await?;
        let mut out = Vec::new();
        while let Some(w) = walk.next().await? {
            out.push(w);
        }
        Ok(out)
    }

    /// A walk over the tree `root` that yields one entry at a time (see [`TreeWalk`]).
    pub async fn walk<'a>(
        &'a self,
        space: &'a SpaceId,
        root: &Hash,
        limits: TreeLimits,
    ) -> Result<TreeWalk<'a>, ClientError> {
        let top = self.read_dir(space, root).await?;
        Ok(TreeWalk {
            client: self,
            space,
            limits,
            stack: vec![(0, top.into_iter())],
            path: String::new(),
            visited: 0,
        })
    }

    /// Walks the tree `root` within `limits` (depth, path lengths, entries counted once per
    /// path) and sums what its entries state. Directories already summarised are not read
    /// again, so a tree that references one subtree many times costs what its distinct nodes
    /// cost. Sizes are taken as the tree states them: use it on trees this deployment built
    /// or checked; an archive is checked with [`ArchiveTreeCheck`] before it is stored.
    pub async fn check_tree(
        &self,
        space: &SpaceId,
        root: &Hash,
        limits: &TreeLimits,
    ) -> Result<TreeSummary, ClientError> {
        self.verify_dir(space, *root, 1, 0, limits, &mut HashMap::new())
            .await
    }

    fn verify_dir<'a>(
        &'a self,
        space: &'a SpaceId,
        hash: Hash,
        depth: usize,
        prefix: usize,
        limits: &'a TreeLimits,
        memo: &'a mut HashMap<Hash, TreeSummary>,
    ) -> futures_util::future::BoxFuture<'a, Result<TreeSummary, ClientError>> {
        Box::pin(async move {
            let too_deep = || {
                ClientError::Invalid(format!(
                    "the tree is deeper than {} directories",
                    limits.max_depth
                ))
            };
            let too_long = || {
                ClientError::Invalid(format!(
                    "the tree has a path longer than {} bytes",
                    limits.max_path_bytes
                ))
            };
            let sep = usize::from(prefix > 0);
            if let Some(s) = memo.get(&hash) {
                if s.entries > 0 && depth - 1 + s.depth > limits.max_depth {
                    return Err(too_deep());
                }
                if s.entries > 0 && prefix + sep + s.path_bytes > limits.max_path_bytes {
                    return Err(too_long());
                }
                return Ok(*s);
            }
            // Relative to this directory: `path_bytes` and `depth` count from its entries.
            let mut summary = TreeSummary::default();
            for (name, entry) in self.read_dir(space, &hash).await? {
                if depth > limits.max_depth {
                    return Err(too_deep());
                }
                let own = prefix + sep + name.len();
                if own > limits.max_path_bytes {
                    return Err(too_long());
                }
                let child = match entry {
                    Entry::File { file, .. } => Child::File(file.size),
                    Entry::Symlink { .. } => Child::Symlink,
                    Entry::Dir { node } => Child::Dir(
                        self.verify_dir(space, node, depth + 1, own, limits, memo)
                            .await?,
                    ),
                };
                summary.add(&name, child);
                limits.check(&summary)?;
            }
            memo.insert(hash, summary);
            Ok(summary)
        })
    }
}

fn check_claim(file: &FileRef, actual: u64) -> Result<u64, ClientError> {
    if actual != file.size {
        return Err(ClientError::Invalid(format!(
            "a tree entry claims {} bytes for file node {}, which holds {actual}",
            file.size, file.node
        )));
    }
    Ok(actual)
}

/// Bounds of a walk: entries visited (a subtree referenced twice counts twice), depth in
/// directories, and bytes of a `/`-separated path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeLimits {
    pub max_entries: u64,
    pub max_depth: usize,
    pub max_path_bytes: usize,
}

impl Default for TreeLimits {
    fn default() -> Self {
        TreeLimits {
            max_entries: 200_000,
            max_depth: MAX_PATH_DEPTH,
            max_path_bytes: MAX_PATH_BYTES,
        }
    }
}

impl TreeLimits {
    /// Refuses a (relative) summary that is beyond the limits wherever it stands.
    fn check(&self, s: &TreeSummary) -> Result<(), ClientError> {
        if s.entries > self.max_entries {
            return Err(ClientError::Invalid(format!(
                "the tree holds more than {} entries",
                self.max_entries
            )));
        }
        if s.depth > self.max_depth {
            return Err(ClientError::Invalid(format!(
                "the tree is deeper than {} directories",
                self.max_depth
            )));
        }
        if s.path_bytes > self.max_path_bytes {
            return Err(ClientError::Invalid(format!(
                "the tree has a path longer than {} bytes",
                self.max_path_bytes
            )));
        }
        Ok(())
    }
}

/// What a verified tree holds, and how deep and long its paths go (relative to its root).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeSummary {
    pub stats: TreeStats,
    /// Entries below, counted once per path.
    pub entries: u64,
    /// Components of the deepest path below.
    pub depth: usize,
    /// Bytes of the longest path below.
    pub path_bytes: usize,
}

/// What one entry of a directory contributes to its summary.
enum Child {
    File(u64),
    Symlink,
    Dir(TreeSummary),
}

impl TreeSummary {
    /// Adds the entry `name` of this directory.
    fn add(&mut self, name: &str, child: Child) {
        self.entries = self.entries.saturating_add(1);
        self.depth = self.depth.max(1);
        self.path_bytes = self.path_bytes.max(name.len());
        match child {
            Child::File(size) => {
                self.stats.files = self.stats.files.saturating_add(1);
                self.stats.bytes = self
                    .stats
                    .bytes
                    .saturating_add(i64::try_from(size).unwrap_or(i64::MAX));
            }
            Child::Symlink => {}
            Child::Dir(sub) => {
                self.entries = self.entries.saturating_add(sub.entries);
                self.stats.files = self.stats.files.saturating_add(sub.stats.files);
                self.stats.bytes = self.stats.bytes.saturating_add(sub.stats.bytes);
                if sub.entries > 0 {
                    self.depth = self.depth.max(1 + sub.depth);
                    self.path_bytes = self.path_bytes.max(name.len() + 1 + sub.path_bytes);
                }
            }
        }
    }

    /// Adds the entries of another part of the same directory.
    fn merge(&mut self, part: &TreeSummary) {
        self.entries = self.entries.saturating_add(part.entries);
        self.stats.files = self.stats.files.saturating_add(part.stats.files);
        self.stats.bytes = self.stats.bytes.saturating_add(part.stats.bytes);
        self.depth = self.depth.max(part.depth);
        self.path_bytes = self.path_bytes.max(part.path_bytes);
    }
}

/// A walk over a tree, one entry at a time, depth first in name order (a directory, then what
/// it holds). It holds one directory's entries per level and the current path, never the list
/// of every path, and refuses to go beyond its [`TreeLimits`].
pub struct TreeWalk<'a> {
    client: &'a AppCasClient,
    space: &'a SpaceId,
    limits: TreeLimits,
    /// Per open directory: the length of its path in `path`, and its entries not yet visited.
    stack: Vec<(usize, std::collections::btree_map::IntoIter<String, Entry>)>,
    path: String,
    visited: u64,
}

impl TreeWalk<'_> {
    /// The next entry, or `None` at the end.
    pub async fn next(&mut self) -> Result<Option<WalkedEntry>, ClientError> {
        loop {
            let depth = self.stack.len();
            let Some((base, entries)) = self.stack.last_mut() else {
                return Ok(None);
            };
            let base = *base;
            let Some((name, entry)) = entries.next() else {
                self.stack.pop();
                continue;
            };
            self.visited += 1;
            if self.visited > self.limits.max_entries {
                return Err(ClientError::Invalid(format!(
                    "the tree holds more than {} entries",
                    self.limits.max_entries
                )));
            }
            if depth > self.limits.max_depth {
                return Err(ClientError::Invalid(format!(
                    "the tree is deeper than {} directories",
                    self.limits.max_depth
                )));
            }
            self.path.truncate(base);
            if base > 0 {
                self.path.push('/');
            }
            self.path.push_str(&name);
            if self.path.len() > self.limits.max_path_bytes {
                return Err(ClientError::Invalid(format!(
                    "the tree has a path longer than {} bytes",
                    self.limits.max_path_bytes
                )));
            }
            if let Entry::Dir { node } = &entry {
                let sub = self.client.read_dir(self.space, node).await?;
                self.stack.push((self.path.len(), sub.into_iter()));
            }
            return Ok(Some(WalkedEntry {
                path: self.path.clone(),
                entry,
            }));
        }
    }
}

/// Summaries of the trees in an archive, computed bottom-up as its nodes stream by (an archive
/// holds children before parents): a directory from its entries' summaries, a chunked file's
/// index checked against its chunks. Anything beyond the limits is refused at the first node
/// that shows it, before anything is stored. Every node a tree references must be in the
/// archive. Memory: one small record per directory and file node.
#[derive(Debug)]
pub struct ArchiveTreeCheck {
    limits: TreeLimits,
    /// Directory nodes (and parts): their summary and how many part levels they stack.
    dirs: HashMap<Hash, (TreeSummary, usize)>,
    /// Leaves: their size.
    leaves: HashMap<Hash, u64>,
    /// Chunked-file indexes: their checked size and depth.
    indexes: HashMap<Hash, (u64, u32)>,
    /// The root nodes of the archive that are SValues, decoded.
    roots: BTreeMap<Hash, Value>,
    wanted: Vec<Hash>,
}

impl ArchiveTreeCheck {
    /// A check of trees within `limits`, keeping the decoded content of the nodes `roots`.
    pub fn new(limits: TreeLimits, roots: &[Hash]) -> Self {
        ArchiveTreeCheck {
            limits,
            dirs: HashMap::new(),
            leaves: HashMap::new(),
            indexes: HashMap::new(),
            roots: BTreeMap::new(),
            wanted: roots.to_vec(),
        }
    }

    /// The decoded root nodes seen so far.
    pub fn roots(&self) -> &BTreeMap<Hash, Value> {
        &self.roots
    }

    /// The summary of the tree `root`, if the archive holds it as a directory.
    pub fn summary(&self, root: &Hash) -> Option<TreeSummary> {
        self.dirs.get(root).map(|(s, _)| *s)
    }

    fn missing(hash: &Hash, what: &str) -> ClientError {
        ClientError::Invalid(format!(
            "the archive's trees refer to {hash} as {what}, but the archive holds no such node"
        ))
    }

    /// Takes the next node of the archive.
    pub fn visit(&mut self, node: &ArchiveNode) -> Result<(), ClientError> {
        let hash = node.hash;
        if !node.descriptor.content_type.is_svalue() {
            self.leaves.insert(hash, node.descriptor.content_size);
            return Ok(());
        }
        let (value, _) = cas_format::svalue::decode(node.content())
            .map_err(|e| ClientError::Invalid(format!("node {hash}: {e}")))?;
        match value.get("kind").and_then(Value::as_str) {
            Some("dir") | Some("dir-parts") => {
                let (summary, level) = match crate::tree::parse_dir_node(&hash, &value)? {
                    crate::tree::DirNode::Entries(entries) => {
                        let mut summary = TreeSummary::default();
                        for (name, entry) in entries {
                            let child = match entry {
                                Entry::File { file, .. } => Child::File(self.file_size(&file)?),
                                Entry::Symlink { .. } => Child::Symlink,
                                Entry::Dir { node } => Child::Dir(
                                    self.dirs
                                        .get(&node)
                                        .map(|(s, _)| *s)
                                        .ok_or_else(|| Self::missing(&node, "a directory"))?,
                                ),
                            };
                            summary.add(&name, child);
                            self.limits.check(&summary)?;
                        }
                        (summary, 0)
                    }
                    crate::tree::DirNode::Parts(parts) => {
                        let (mut summary, mut level) = (TreeSummary::default(), 0);
                        for p in parts {
                            let (part, l) = self
                                .dirs
                                .get(&p)
                                .ok_or_else(|| Self::missing(&p, "a directory part"))?;
                            summary.merge(part);
                            level = level.max(l + 1);
                            self.limits.check(&summary)?;
                        }
                        if level > crate::tree::MAX_PART_LEVELS {
                            return Err(ClientError::Invalid(format!(
                                "directory {hash}: parts nested more than {} deep",
                                crate::tree::MAX_PART_LEVELS
                            )));
                        }
                        (summary, level)
                    }
                };
                self.dirs.insert(hash, (summary, level));
            }
            Some(crate::files::CHUNKED_FILE) => {
                let index = crate::files::parse_index(&hash, node.content())
                    .map_err(|e| ClientError::Invalid(e.to_string()))?;
                let mut total = 0u64;
                for (child, listed) in &index.entries {
                    let actual = if index.depth == 0 {
                        *self
                            .leaves
                            .get(child)
                            .ok_or_else(|| Self::missing(child, "a chunk"))?
                    } else {
                        match self.indexes.get(child) {
                            Some((size, d)) if *d + 1 == index.depth => *size,
                            Some(_) => {
                                return Err(ClientError::Invalid(format!(
                                    "chunked file index {hash}: {child} has the wrong depth"
                                )));
                            }
                            None => return Err(Self::missing(child, "an index")),
                        }
                    };
                    if actual != *listed {
                        return Err(ClientError::Invalid(format!(
                            "chunked file index {hash} lists {listed} bytes for {child}, which holds {actual}"
                        )));
                    }
                    total = total.saturating_add(actual);
                }
                if total != index.size {
                    return Err(ClientError::Invalid(format!(
                        "chunked file index {hash} states {} bytes, its chunks hold {total}",
                        index.size
                    )));
                }
                self.indexes.insert(hash, (total, index.depth));
            }
            _ => {}
        }
        if self.wanted.contains(&hash) {
            self.roots.insert(hash, value);
        }
        Ok(())
    }

    fn file_size(&self, file: &FileRef) -> Result<u64, ClientError> {
        let actual = if file.chunked {
            self.indexes.get(&file.node).map(|(s, _)| *s)
        } else {
            self.leaves.get(&file.node).copied()
        }
        .ok_or_else(|| Self::missing(&file.node, "a file"))?;
        check_claim(file, actual)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use bytes::Bytes;
    use cas_format::archive::{ArchiveLimits, ArchiveWriter};
    use cas_format::{ContentType, NodeDescriptor};

    use super::*;
    use crate::files::svalue_node;

    fn leaf(content: &[u8]) -> Bytes {
        let d = NodeDescriptor::new(
            ContentType::octet_stream(),
            Vec::new(),
            content.len() as u64,
        );
        Bytes::from(d.encode_portable(content).expect("leaf"))
    }

    fn file(node: Hash, size: u64) -> Value {
        Value::map([
            ("kind", Value::from("file")),
            ("node", Value::Blob(node)),
            ("size", Value::from(size as i64)),
            ("chunked", Value::Bool(false)),
            ("executable", Value::Bool(false)),
        ])
    }

    fn dir(entries: Vec<(&str, Value)>) -> Value {
        Value::map([
            ("kind", Value::from("dir")),
            (
                "entries",
                Value::Map(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect(),
                ),
            ),
        ])
    }

    fn sub(node: Hash) -> Value {
        Value::map([("kind", Value::from("dir")), ("node", Value::Blob(node))])
    }

    /// An archive of `nodes` (children first) whose root is the last one.
    fn check(nodes: &[Bytes]) -> Result<(Hash, ArchiveTreeCheck), ClientError> {
        let root = Hash::digest(nodes.last().expect("a node"));
        let mut w =
            ArchiveWriter::new(Vec::new(), &[root], ArchiveLimits::default()).expect("writer");
        for n in nodes {
            w.write_node(n).expect("node");
        }
        let (bytes, _) = w.finish().expect("finish");
        let mut f = tempfile::tempfile().expect("file");
        f.write_all(&bytes).expect("write");
        let (_, c) = crate::transfer::check_archive(&f, TreeLimits::default(), 10_000)?;
        Ok((root, c))
    }

    #[test]
    fn an_honest_tree_is_summarised() {
        let a = leaf(b"hello");
        let inner = svalue_node(&dir(vec![("a.txt", file(Hash::digest(&a), 5))])).expect("dir");
        let top = svalue_node(&dir(vec![
            ("d", sub(Hash::digest(&inner))),
            ("e", sub(Hash::digest(&inner))),
        ]))
        .expect("dir");
        let (root, c) = check(&[a, inner, top]).expect("accepted");
        let s = c.summary(&root).expect("summary");
        assert_eq!(
            (s.stats.files, s.stats.bytes, s.entries, s.depth),
            (2, 10, 4, 2)
        );
        assert_eq!(s.path_bytes, "d/a.txt".len());
    }

    #[test]
    fn lies_depth_and_path_bombs_are_refused() {
        let a = leaf(b"hello");
        // A size that is not the node's.
        let lying = svalue_node(&dir(vec![("a", file(Hash::digest(&a), 1 << 50))])).expect("dir");
        assert!(check(&[a.clone(), lying]).is_err());
        // Deeper than the limit.
        let mut nodes = vec![a.clone()];
        let mut d = svalue_node(&dir(vec![("f", file(Hash::digest(&a), 5))])).expect("dir");
        for _ in 0..100 {
            nodes.push(d.clone());
            d = svalue_node(&dir(vec![("d", sub(Hash::digest(&d)))])).expect("dir");
        }
        nodes.push(d);
        let e = check(&nodes).expect_err("too deep");
        assert!(e.to_string().contains("deeper"), "{e}");
        // Paths that double at every level: 2^40 of them from 41 nodes.
        let mut nodes = vec![a.clone()];
        let mut d = svalue_node(&dir(vec![("f", file(Hash::digest(&a), 5))])).expect("dir");
        for _ in 0..40 {
            nodes.push(d.clone());
            let h = Hash::digest(&d);
            d = svalue_node(&dir(vec![("x", sub(h)), ("y", sub(h))])).expect("dir");
        }
        nodes.push(d);
        let e = check(&nodes).expect_err("too many paths");
        assert!(e.to_string().contains("entries"), "{e}");
        // A tree that refers to a node the archive does not hold.
        let outside =
            svalue_node(&dir(vec![("a", file(Hash::digest(b"elsewhere"), 5))])).expect("dir");
        assert!(check(&[outside]).is_err());
    }
}
