//! Building a tree from a stream of entries (an archive) without a filesystem path in between.
//!
//! File contents are appended to one spool file that the caller opened (anonymous, already
//! unlinked) and are read back only through that handle; the directory structure lives in
//! memory. Nothing an entry names is ever created, opened or followed on disk, so a hostile
//! archive cannot point a later entry outside the spool. A symlink is kept as a link entry
//! whose target is data. An entry whose path passes through a symlink entry or a file of the
//! same archive, or that names a path twice, is refused.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use cas_format::Hash;

use crate::dag::Plan;
use crate::error::ClientError;
use crate::files::{FileRef, plan_spooled};
use crate::tree::{Entry, TreeStats, plan_entries};

/// Longest symlink target kept, in bytes.
pub const MAX_LINK_TARGET: usize = 4096;

enum Node {
    Dir(BTreeMap<String, Node>),
    File { file: FileRef, executable: bool },
    Symlink(String),
}

/// A tree being read from a stream.
pub struct TreeBuilder {
    spool: Arc<File>,
    spooled: u64,
    root: BTreeMap<String, Node>,
    plan: Plan,
    stats: TreeStats,
    entries: u64,
    max_entries: u64,
}

fn shown(path: &[String]) -> String {
    path.join("/")
}

impl TreeBuilder {
    /// A builder appending file contents to `spool` (an empty file opened for reading and
    /// writing), refusing more than `max_entries` entries.
    pub fn new(spool: File, max_entries: u64) -> Self {
        TreeBuilder {
            spool: Arc::new(spool),
            spooled: 0,
            root: BTreeMap::new(),
            plan: Plan::default(),
            stats: TreeStats::default(),
            entries: 0,
            max_entries,
        }
    }

    /// Files and bytes added so far.
    pub fn stats(&self) -> TreeStats {
        self.stats
    }

    fn count(&mut self) -> Result<(), ClientError> {
        self.entries += 1;
        if self.entries > self.max_entries {
            return Err(ClientError::Invalid(format!(
                "the archive holds more than {} entries",
                self.max_entries
            )));
        }
        Ok(())
    }

    /// The directory that holds `path`'s last component, creating the directories above it.
    /// Refuses a path that passes through a symlink or a file.
    fn parent_of(&mut self, path: &[String]) -> Result<&mut BTreeMap<String, Node>, ClientError> {
        let (_, dirs) = path
            .split_last()
            .ok_or_else(|| ClientError::Invalid("an empty path".into()))?;
        let mut cur = &mut self.root;
        for (i, name) in dirs.iter().enumerate() {
            let node = cur
                .entry(name.clone())
                .or_insert_with(|| Node::Dir(BTreeMap::new()));
            cur = match node {
                Node::Dir(m) => m,
                Node::Symlink(_) => {
                    return Err(ClientError::Invalid(format!(
                        "{:?} passes through {:?}, a symlink of the same archive",
                        shown(path),
                        shown(&path[..=i])
                    )));
                }
                Node::File { .. } => {
                    return Err(ClientError::Invalid(format!(
                        "{:?} lies below {:?}, which is a file",
                        shown(path),
                        shown(&path[..=i])
                    )));
                }
            };
        }
        Ok(cur)
    }

    /// Adds a directory (again is fine).
    pub fn add_dir(&mut self, path: &[String]) -> Result<(), ClientError> {
        self.count()?;
        let name = path.last().cloned().unwrap_or_default();
        let parent = self.parent_of(path)?;
        match parent.get(&name) {
            None => {
                parent.insert(name, Node::Dir(BTreeMap::new()));
                Ok(())
            }
            Some(Node::Dir(_)) => Ok(()),
            Some(_) => Err(ClientError::Invalid(format!(
                "{:?} is both a directory and another kind of entry",
                shown(path)
            ))),
        }
    }

    /// Adds a symlink whose target is kept as data.
    pub fn add_symlink(&mut self, path: &[String], target: &str) -> Result<(), ClientError> {
        self.count()?;
        if target.is_empty() || target.len() > MAX_LINK_TARGET || target.contains('\0') {
            return Err(ClientError::Invalid(format!(
                "{:?}: a symlink target is 1..={MAX_LINK_TARGET} bytes without NUL",
                shown(path)
            )));
        }
        let name = path.last().cloned().unwrap_or_default();
        let parent = self.parent_of(path)?;
        if parent.contains_key(&name) {
            return Err(ClientError::Invalid(format!(
                "{:?} appears twice in the archive",
                shown(path)
            )));
        }
        parent.insert(name, Node::Symlink(target.to_string()));
        Ok(())
    }

    /// Adds a regular file, copying `content` into the spool. Blocking.
    pub fn add_file(
        &mut self,
        path: &[String],
        content: &mut dyn Read,
        executable: bool,
    ) -> Result<u64, ClientError> {
        use std::os::unix::fs::FileExt;
        self.count()?;
        let name = path.last().cloned().unwrap_or_default();
        if self.parent_of(path)?.contains_key(&name) {
            return Err(ClientError::Invalid(format!(
                "{:?} appears twice in the archive",
                shown(path)
            )));
        }
        let start = self.spooled;
        let mut buf = vec![0u8; 256 << 10];
        let mut at = start;
        loop {
            let n = content
                .read(&mut buf)
                .map_err(|e| ClientError::io("cannot read the archive entry", e))?;
            if n == 0 {
                break;
            }
            self.spool
                .write_all_at(&buf[..n], at)
                .map_err(|e| ClientError::io("cannot write the spool file", e))?;
            at += n as u64;
        }
        let len = at - start;
        self.spooled = at;
        let file = plan_spooled(&mut self.plan, &self.spool, start, len)?;
        self.stats.files += 1;
        self.stats.bytes = self.stats.bytes.saturating_add(len as i64);
        self.parent_of(path)?
            .insert(name, Node::File { file, executable });
        Ok(len)
    }

    /// Whether `path` names a regular file of the tree (never through a symlink: no path
    /// through one was admitted).
    pub fn is_file(&self, path: &[String]) -> bool {
        let Some((last, dirs)) = path.split_last() else {
            return false;
        };
        let mut cur = &self.root;
        for name in dirs {
            match cur.get(name) {
                Some(Node::Dir(m)) => cur = m,
                _ => return false,
            }
        }
        matches!(cur.get(last), Some(Node::File { .. }))
    }

    /// The plan of every node of the tree, its root and what it holds.
    pub fn finish(self) -> Result<(Plan, Hash, TreeStats), ClientError> {
        fn plan_dir(plan: &mut Plan, dir: BTreeMap<String, Node>) -> Result<Hash, ClientError> {
            let mut entries = BTreeMap::new();
            for (name, node) in dir {
                let entry = match node {
                    Node::Dir(sub) => Entry::Dir {
                        node: plan_dir(plan, sub)?,
                    },
                    Node::File { file, executable } => Entry::File { file, executable },
                    Node::Symlink(target) => Entry::Symlink { target },
                };
                entries.insert(name, entry);
            }
            plan_entries(plan, &entries)
        }
        let TreeBuilder {
            mut plan,
            root,
            stats,
            ..
        } = self;
        let hash = plan_dir(&mut plan, root)?;
        Ok((plan, hash, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        s.split('/').map(str::to_string).collect()
    }

    fn builder() -> TreeBuilder {
        TreeBuilder::new(tempfile::tempfile().expect("spool"), 100)
    }

    #[test]
    fn a_path_through_a_symlink_is_refused() {
        let mut b = builder();
        b.add_symlink(&p("esc"), "/etc").expect("link");
        let e = b.add_file(&p("esc/x"), &mut &b"x"[..], false);
        assert!(matches!(e, Err(ClientError::Invalid(m)) if m.contains("symlink")));
        assert!(b.add_dir(&p("esc/newdir")).is_err());
        assert!(b.add_symlink(&p("esc/y"), "z").is_err());
        assert!(!b.is_file(&p("esc/x")));
    }

    #[test]
    fn twice_below_a_file_and_kinds_are_refused() {
        let mut b = builder();
        b.add_file(&p("a/b"), &mut &b"1"[..], false).expect("file");
        assert!(b.add_file(&p("a/b"), &mut &b"2"[..], false).is_err());
        assert!(b.add_file(&p("a/b/c"), &mut &b"3"[..], false).is_err());
        assert!(b.add_dir(&p("a/b")).is_err());
        assert!(b.add_symlink(&p("a"), "x").is_err());
        b.add_dir(&p("a")).expect("a directory named again");
        assert!(b.is_file(&p("a/b")));
        assert!(!b.is_file(&p("a")));
    }

    #[test]
    fn the_entry_limit_holds() {
        let mut b = TreeBuilder::new(tempfile::tempfile().expect("spool"), 2);
        b.add_dir(&p("a")).expect("1");
        b.add_dir(&p("b")).expect("2");
        assert!(b.add_dir(&p("c")).is_err());
    }

    #[test]
    fn the_tree_equals_one_planned_from_the_same_directory() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("lib")).expect("mkdir");
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("lib/big.bin"), &big).expect("write");
        std::fs::write(dir.path().join("a.py"), b"print(1)\n").expect("write");
        std::os::unix::fs::symlink("lib/big.bin", dir.path().join("link")).expect("link");
        let mut expected = Plan::default();
        let want = crate::tree::plan_dir(&mut expected, dir.path()).expect("plan");

        let mut b = builder();
        b.add_file(&p("a.py"), &mut &b"print(1)\n"[..], false)
            .expect("a");
        b.add_file(&p("lib/big.bin"), &mut &big[..], false)
            .expect("big");
        b.add_symlink(&p("link"), "lib/big.bin").expect("link");
        let (plan, root, stats) = b.finish().expect("finish");
        assert_eq!(root, want);
        assert_eq!(stats.files, 2);
        assert_eq!(stats.bytes, big.len() as i64 + 9);
        let mut got: Vec<_> = plan.nodes.keys().collect();
        let mut exp: Vec<_> = expected.nodes.keys().collect();
        got.sort();
        exp.sort();
        assert_eq!(got, exp);
    }
}
