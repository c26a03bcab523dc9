//! Delta-base suggestions: for the new nodes of a planned tree that take the place of nodes of
//! an earlier tree (the same directory, the same file, the same stretch of a chunked file),
//! the node they replace, which the service may store them as a delta against.
//!
//! Only the directories on changed paths and the indexes of changed chunked files are
//! compared; the earlier ones are read from the Space, the new ones from the plan. A
//! suggestion is advisory: a wrong one costs the service one compression that it then does
//! not keep.

use std::collections::{BTreeMap, HashMap};

use cas_format::svalue::{self, SValueLimits};
use cas_format::{Hash, NodeLimits, SpaceId, decode_portable};
use futures_util::future::BoxFuture;

use crate::client::AppCasClient;
use crate::dag::{Plan, Source};
use crate::error::ClientError;
use crate::files::parse_index;
use crate::tree::{DirNode, Entry, MAX_PART_LEVELS, MAX_PATH_DEPTH, parse_dir_node};

/// For each chunk of `new` that `old` does not hold, the chunk of `old` it most probably
/// replaces: chunks both hold (in order) anchor the two lists, and the changed chunks between
/// two anchors are paired in order with the old chunks between the same anchors (the last of
/// those for any extra new ones, the next old chunk for a pure insertion).
pub fn pair_chunks(old: &[Hash], new: &[Hash]) -> Vec<(Hash, Hash)> {
    let mut positions: HashMap<Hash, Vec<usize>> = HashMap::new();
    for (i, h) in old.iter().enumerate() {
        positions.entry(*h).or_default().push(i);
    }
    // Anchors: (new index, old index), increasing in both.
    let mut anchors: Vec<(usize, usize)> = Vec::new();
    let mut next_old = 0usize;
    for (j, h) in new.iter().enumerate() {
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
        for (k, h) in new[new_from..new_to].iter().enumerate() {
            let base = replaced
                .get(k)
                .or(replaced.last())
                .or_else(|| old.get(old_to))
                .or_else(|| old_to.checked_sub(1).and_then(|i| old.get(i)));
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
        self.suggest_dir(space, plan, root, earlier, 0).await?;
        Ok(plan.delta_bases.len() - before)
    }

    fn suggest_dir<'a>(
        &'a self,
        space: &'a SpaceId,
        plan: &'a mut Plan,
        new: Hash,
        old: Hash,
        depth: usize,
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
                        self.suggest_dir(space, plan, node, *before, depth + 1)
                            .await?;
                    }
                    (Entry::File { file, .. }, Some(Entry::File { file: before, .. }))
                        if file.node != before.node =>
                    {
                        plan.suggest_base(file.node, before.node);
                        if file.chunked && before.chunked {
                            self.suggest_chunks(space, plan, file.node, before.node)
                                .await?;
                        }
                    }
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
        let old_chunks: Vec<Hash> = old_index.entries.iter().map(|(h, _)| *h).collect();
        let new_chunks: Vec<Hash> = new_index.entries.iter().map(|(h, _)| *h).collect();
        for (n, o) in pair_chunks(&old_chunks, &new_chunks) {
            plan.suggest_base(n, o);
        }
        Ok(())
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

    #[test]
    fn changed_chunks_pair_with_what_they_replace() {
        let old = [h(1), h(2), h(3), h(4)];
        // One chunk edited in the middle.
        assert_eq!(
            pair_chunks(&old, &[h(1), h(20), h(3), h(4)]),
            vec![(h(20), h(2))]
        );
        // Two edited, one after the other.
        assert_eq!(
            pair_chunks(&old, &[h(1), h(20), h(30), h(4)]),
            vec![(h(20), h(2)), (h(30), h(3))]
        );
        // An insertion pairs with the chunk after it; an edit of the last with the last.
        assert_eq!(
            pair_chunks(&old, &[h(1), h(9), h(2), h(3), h(40)]),
            vec![(h(9), h(2)), (h(40), h(4))]
        );
        // More new chunks than replaced: the extra ones pair with the last replaced.
        assert_eq!(
            pair_chunks(&old, &[h(1), h(20), h(21), h(22), h(3), h(4)]),
            vec![(h(20), h(2)), (h(21), h(2)), (h(22), h(2))]
        );
        // Nothing shared: in order.
        assert_eq!(
            pair_chunks(&[h(1), h(2)], &[h(5), h(6), h(7)]),
            vec![(h(5), h(1)), (h(6), h(2)), (h(7), h(2))]
        );
        // Unchanged: nothing.
        assert!(pair_chunks(&old, &old).is_empty());
        assert!(pair_chunks(&[], &[h(1)]).is_empty());
    }
}
