//! Delta-base suggestions: for the new nodes of a planned tree that take the place of nodes of
//! an earlier tree (the same directory, the same file, the same stretch of a chunked file),
//! the node they replace, which the service may store them as a delta against.
//!
//! Only the directories on changed paths and the indexes of changed chunked files are
//! compared; the earlier ones are read from the Space, the new ones from the plan. A new file
//! at a path the earlier tree does not have (added, copied or moved) is paired with an earlier
//! file of the same name elsewhere in the tree, as git's packer pairs blobs by name: the
//! earlier tree's directories are then read, at most [`NAME_SEARCH_DIRS`] of them. A
//! suggestion is advisory: a wrong one costs the service one compression that it then does
//! not keep.

use std::collections::{BTreeMap, HashMap, VecDeque};

use cas_format::svalue::{self, SValueLimits};
use cas_format::{Hash, NodeLimits, SpaceId, decode_portable};
use futures_util::future::BoxFuture;

use crate::client::AppCasClient;
use crate::dag::{Plan, Source};
use crate::error::ClientError;
use crate::files::{FileRef, parse_index};
use crate::tree::{DirNode, Entry, MAX_PART_LEVELS, MAX_PATH_DEPTH, parse_dir_node};

/// How many directories of the earlier tree a search for files by name reads at most.
pub const NAME_SEARCH_DIRS: usize = 256;

/// For each chunk of `new` that `old` does not hold, the chunk of `old` it most probably
/// replaces. Chunks are `(hash, length)` in file order. Chunks both hold (in order) anchor the
/// two lists; a changed chunk between two anchors pairs with the old chunk between the same
/// anchors whose bytes overlap its own most (measured from the preceding anchor, so an edit
/// that moves content-defined boundaries still pairs chunks holding the same stretch), with
/// the last of those when it reaches past them, and with the next old chunk for a pure
/// insertion.
pub fn pair_chunks(old: &[(Hash, u64)], new: &[(Hash, u64)]) -> Vec<(Hash, Hash)> {
    let mut positions: HashMap<Hash, Vec<usize>> = HashMap::new();
    for (i, (h, _)) in old.iter().enumerate() {
        positions.entry(*h).or_default().push(i);
    }
    // Anchors: (new index, old index), increasing in both.
    let mut anchors: Vec<(usize, usize)> = Vec::new();
    let mut next_old = 0usize;
    for (j, (h, _)) in new.iter().enumerate() {
        if let Some(i) = positions
            .get(h)
            .and_then(|ps| ps.iter().copied().find(|&i| i >= next_old))
        {
            anchors.push((j, i));
            next_old = i + 1;
        }
    }
    let mut pairs = Vec::new();
    let (mut new_from, mut old_from) = (0usize, 0usize);
    let ends = anchors
        .iter()
        .copied()
        .chain(std::iter::once((new.len(), old.len())));
    for (new_to, old_to) in ends {
        let replaced = &old[old_from..old_to];
        let mut at = 0u64;
        for (h, len) in &new[new_from..new_to] {
            let base = most_overlapping(replaced, at, at.saturating_add(*len))
                .or_else(|| old.get(old_to).map(|(b, _)| b))
                .or_else(|| {
                    old_to
                        .checked_sub(1)
                        .and_then(|i| old.get(i))
                        .map(|(b, _)| b)
                });
            at = at.saturating_add(*len);
            if let Some(b) = base
                && b != h
            {
                pairs.push((*h, *b));
            }
        }
        new_from = new_to + 1;
        old_from = old_to + 1;
    }
    pairs
}

/// Of `chunks` laid end to end from 0, the one that overlaps `start..end` most (the first of
/// equals), or the last when none does.
fn most_overlapping(chunks: &[(Hash, u64)], start: u64, end: u64) -> Option<&Hash> {
    let mut best: Option<(&Hash, u64)> = None;
    let mut at = 0u64;
    for (h, len) in chunks {
        let (a, b) = (at, at.saturating_add(*len));
        at = b;
        let overlap = end.min(b).saturating_sub(start.max(a));
        if overlap > 0 && best.is_none_or(|(_, o)| overlap > o) {
            best = Some((h, overlap));
        }
    }
    best.map(|(h, _)| h).or(chunks.last().map(|(h, _)| h))
}

/// The SValue content of a node the plan holds in memory.
fn planned_svalue(plan: &Plan, hash: &Hash) -> Option<svalue::Value> {
    let Source::Portable(bytes) = &plan.nodes.get(hash)?.source else {
        return None;
    };
    let node = decode_portable(bytes, &NodeLimits::format_max()).ok()?;
    let (value, _) = svalue::decode_with_limits(node.content, &SValueLimits::default()).ok()?;
    Some(value)
}

impl AppCasClient {
    /// Suggests delta bases for the planned tree `root` against the `earlier` tree, ready in
    /// the Space (see the module documentation). Returns how many nodes got one.
    pub async fn suggest_bases(
        &self,
        space: &SpaceId,
        plan: &mut Plan,
        root: Hash,
        earlier: Hash,
    ) -> Result<usize, ClientError> {
        let before = plan.delta_bases.len();
        let mut unmatched = Vec::new();
        self.suggest_dir(space, plan, root, earlier, 0, &mut unmatched)
            .await?;
        if !unmatched.is_empty() {
            let by_name = self.files_by_name(space, earlier).await?;
            for (name, file) in unmatched {
                if let Some(before) = by_name.get(&name) {
                    self.suggest_file(space, plan, &file, before).await?;
                }
            }
        }
        Ok(plan.delta_bases.len() - before)
    }

    /// Pairs a planned file with the earlier file it most probably replaces, and their chunks.
    async fn suggest_file(
        &self,
        space: &SpaceId,
        plan: &mut Plan,
        file: &FileRef,
        before: &FileRef,
    ) -> Result<(), ClientError> {
        if file.node == before.node {
            return Ok(());
        }
        plan.suggest_base(file.node, before.node);
        if file.chunked && before.chunked {
            self.suggest_chunks(space, plan, file.node, before.node)
                .await?;
        }
        Ok(())
    }

    /// The files of the tree `root` by name (the shallowest of each name, then the first in
    /// path order), reading at most [`NAME_SEARCH_DIRS`] directories breadth first.
    async fn files_by_name(
        &self,
        space: &SpaceId,
        root: Hash,
    ) -> Result<HashMap<String, FileRef>, ClientError> {
        let mut found: HashMap<String, FileRef> = HashMap::new();
        let mut queue = VecDeque::from([(root, 0usize)]);
        let mut read = 0usize;
        while let Some((dir, depth)) = queue.pop_front() {
            if read == NAME_SEARCH_DIRS {
                break;
            }
            read += 1;
            for (name, entry) in self.read_dir(space, &dir).await? {
                match entry {
                    Entry::File { file, .. } => {
                        found.entry(name).or_insert(file);
                    }
                    Entry::Dir { node } if depth < MAX_PATH_DEPTH => {
                        queue.push_back((node, depth + 1))
                    }
                    _ => {}
                }
            }
        }
        Ok(found)
    }

    fn suggest_dir<'a>(
        &'a self,
        space: &'a SpaceId,
        plan: &'a mut Plan,
        new: Hash,
        old: Hash,
        depth: usize,
        unmatched: &'a mut Vec<(String, FileRef)>,
    ) -> BoxFuture<'a, Result<(), ClientError>> {
        Box::pin(async move {
            if new == old || depth > MAX_PATH_DEPTH || !plan.nodes.contains_key(&new) {
                return Ok(());
            }
            plan.suggest_base(new, old);
            let Some(new_entries) = planned_entries(plan, &new, 0) else {
                return Ok(());
            };
            let old_entries = self.read_dir(space, &old).await?;
            for (name, n) in new_entries {
                match (n, old_entries.get(&name)) {
                    (Entry::Dir { node }, Some(Entry::Dir { node: before })) => {
                        self.suggest_dir(space, plan, node, *before, depth + 1, unmatched)
                            .await?;
                    }
                    (Entry::File { file, .. }, Some(Entry::File { file: before, .. })) => {
                        self.suggest_file(space, plan, &file, before).await?;
                    }
                    (Entry::File { file, .. }, _) if plan.nodes.contains_key(&file.node) => {
                        unmatched.push((name, file))
                    }
                    (Entry::Dir { node }, _) => planned_files(plan, node, depth + 1, unmatched),
                    _ => {}
                }
            }
            Ok(())
        })
    }

    /// Pairs the chunks of a planned chunked file with those of the file it replaces (single
    /// level indexes; a deeper index is only paired as a whole).
    async fn suggest_chunks(
        &self,
        space: &SpaceId,
        plan: &mut Plan,
        new: Hash,
        old: Hash,
    ) -> Result<(), ClientError> {
        let Some(Source::Portable(bytes)) = plan.nodes.get(&new).map(|n| &n.source) else {
            return Ok(());
        };
        let Ok(node) = decode_portable(bytes, &NodeLimits::format_max()) else {
            return Ok(());
        };
        let new_index = parse_index(&new, node.content)?;
        let old_index = parse_index(&old, &self.read_svalue_node(space, &old).await?)?;
        if new_index.depth != 0 || old_index.depth != 0 {
            return Ok(());
        }
        for (n, o) in pair_chunks(&old_index.entries, &new_index.entries) {
            plan.suggest_base(n, o);
        }
        Ok(())
    }
}

/// The files of a planned directory that the earlier tree does not have, by name: its
/// subdirectories that are in the plan are walked, the others hold only earlier files.
fn planned_files(plan: &Plan, dir: Hash, depth: usize, out: &mut Vec<(String, FileRef)>) {
    if depth > MAX_PATH_DEPTH {
        return;
    }
    for (name, entry) in planned_entries(plan, &dir, 0).unwrap_or_default() {
        match entry {
            Entry::File { file, .. } if plan.nodes.contains_key(&file.node) => {
                out.push((name, file))
            }
            Entry::Dir { node } => planned_files(plan, node, depth + 1, out),
            _ => {}
        }
    }
}

/// The entries of a directory node the plan holds (its parts too), or `None` when some of it
/// is not in the plan.
fn planned_entries(plan: &Plan, hash: &Hash, level: usize) -> Option<BTreeMap<String, Entry>> {
    let value = planned_svalue(plan, hash)?;
    match parse_dir_node(hash, &value).ok()? {
        DirNode::Entries(entries) => Some(entries),
        DirNode::Parts(parts) if level < MAX_PART_LEVELS => {
            let mut merged = BTreeMap::new();
            for p in parts {
                merged.extend(planned_entries(plan, &p, level + 1)?);
            }
            Some(merged)
        }
        DirNode::Parts(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> Hash {
        Hash::digest(&[i])
    }

    /// Chunks of ten bytes each.
    fn c(ids: &[u8]) -> Vec<(Hash, u64)> {
        ids.iter().map(|&i| (h(i), 10)).collect()
    }

    #[test]
    fn changed_chunks_pair_with_what_they_replace() {
        let old = c(&[1, 2, 3, 4]);
        // One chunk edited in the middle.
        assert_eq!(pair_chunks(&old, &c(&[1, 20, 3, 4])), vec![(h(20), h(2))]);
        // Two edited, one after the other.
        assert_eq!(
            pair_chunks(&old, &c(&[1, 20, 30, 4])),
            vec![(h(20), h(2)), (h(30), h(3))]
        );
        // An insertion pairs with the chunk after it; an edit of the last with the last.
        assert_eq!(
            pair_chunks(&old, &c(&[1, 9, 2, 3, 40])),
            vec![(h(9), h(2)), (h(40), h(4))]
        );
        // More new chunks than replaced: the extra ones pair with the last replaced.
        assert_eq!(
            pair_chunks(&old, &c(&[1, 20, 21, 22, 3, 4])),
            vec![(h(20), h(2)), (h(21), h(2)), (h(22), h(2))]
        );
        // Nothing shared: in order.
        assert_eq!(
            pair_chunks(&c(&[1, 2]), &c(&[5, 6, 7])),
            vec![(h(5), h(1)), (h(6), h(2)), (h(7), h(2))]
        );
        // Boundaries moved: each pairs with the old chunk that held most of its bytes.
        let moved = [(h(1), 10), (h(20), 4), (h(21), 4), (h(30), 12), (h(4), 10)];
        assert_eq!(
            pair_chunks(&old, &moved),
            vec![(h(20), h(2)), (h(21), h(2)), (h(30), h(3))]
        );
        // Unchanged: nothing.
        assert!(pair_chunks(&old, &old).is_empty());
        assert!(pair_chunks(&[], &c(&[1])).is_empty());
    }
}
