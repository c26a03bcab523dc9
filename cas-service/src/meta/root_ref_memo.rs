//! What a partition's root refs stand at, held between batches (Postgres), so that a batch
//! whose nodes are all held is planned without its lookups' round trip.
//!
//! A memo holds, for the nodes of a partition whose root ref count is above zero, the count
//! and every domain's balance, as of one App revision. Such a node cannot be collected (GC
//! takes only unrooted nodes) and only root-ref updates change its balances, each of which
//! moves the App's revision. So a batch planned from the memo is written by a statement that
//! first checks, under the App row's lock, that the revision is still the memo's and that none
//! of the batch's request ids was used before; if either check fails the statement writes
//! nothing, the memo is dropped and the batch is read and planned as before.
//!
//! What a batch writes enters the memo at once, for the later operations of the same batch
//! (the same transaction: the revision check covers a rollback among them), and becomes
//! usable by other batches only once its commit succeeded, which the group commit says before
//! the partition's next batch begins. A failed commit drops the memo.

use std::collections::HashMap;
use std::sync::Mutex;

use cas_format::{AppId, Hash, RefDomain, SpaceId};

use super::root_ref_plan::{Found, Step, outcomes, plan};
use super::root_refs::{Prior, RootRefChange, RootRefOutcome};
use super::{Dialect, Partition};

/// Nodes one partition's memo holds at most: past it the memo starts over from what the
/// next batches read.
const NODES_HELD: usize = 4096;
/// Partitions held at most: past it another's memo is dropped.
const PARTITIONS_HELD: usize = 64;

/// A rooted node: its count (above zero) and its balance in every domain that has one.
#[derive(Debug, Clone)]
struct Rooted {
    count: i64,
    balances: Vec<(RefDomain, i64)>,
}

#[derive(Debug)]
struct Memo {
    /// The App's revision after the last batch the memo holds.
    revision: i64,
    /// That batch, until its commit is known to have succeeded: meanwhile only its own
    /// operations may use the memo.
    unconfirmed: Option<u64>,
    nodes: HashMap<Hash, Rooted>,
}

/// How a root-ref batch was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootRefCheck {
    /// Against the memo, without reading.
    Held,
    /// By its lookups.
    Read,
    /// Against the memo, found stale by the write (nothing written), then read.
    Stale,
}

/// The memos of a metadata store's partitions, and the last App revision each App was seen
/// at (a memo older than that is stale without asking the database).
#[derive(Debug, Default)]
pub(super) struct Memos {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    partitions: HashMap<(AppId, SpaceId), Memo>,
    apps: HashMap<AppId, i64>,
}

type Key = (AppId, SpaceId);

impl Memos {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the memo says of every node `updates` name, for an operation of `batch`, with the
    /// revision it holds; `None` unless it holds them all and may be used.
    pub(super) fn held(
        &self,
        key: &Key,
        batch: u64,
        updates: &[RootRefChange<'_>],
    ) -> Option<(i64, Found)> {
        let state = self.state();
        let memo = state.partitions.get(key)?;
        let usable = memo.unconfirmed.is_none_or(|b| b == batch)
            && state.apps.get(&key.0) == Some(&memo.revision);
        if !usable {
            return None;
        }
        let mut found = Found::default();
        for hash in updates.iter().flat_map(|u| u.changes.keys()) {
            let node = memo.nodes.get(hash)?;
            found.counts.insert(*hash, (node.count, true));
            for (domain, balance) in &node.balances {
                found.balances.insert((domain.clone(), *hash), *balance);
            }
        }
        Some((memo.revision, found))
    }

    /// Records a batch's writes: `steps` of `updates` moved the App's revision from `before`
    /// to `after` in `batch`; `read` is what the batch's lookups found, if it read. What the
    /// memo held is kept only if it was at `before` and may be used by `batch`.
    pub(super) fn record(
        &self,
        key: &Key,
        batch: u64,
        (before, after): (i64, i64),
        read: Option<&Found>,
        updates: &[RootRefChange<'_>],
        steps: &[Step],
    ) {
        let mut state = self.state();
        if !state.partitions.contains_key(key) && state.partitions.len() >= PARTITIONS_HELD {
            let other = state.partitions.keys().next().cloned();
            if let Some(other) = other {
                state.partitions.remove(&other);
            }
        }
        let memo = state.partitions.entry(key.clone()).or_insert(Memo {
            revision: before,
            unconfirmed: None,
            nodes: HashMap::new(),
        });
        let current = memo.revision == before && memo.unconfirmed.is_none_or(|b| b == batch);
        if !current || memo.nodes.len() > NODES_HELD {
            memo.nodes.clear();
        }
        if let Some(read) = read {
            // Every node read, ready, with all of its balances; those still unrooted after
            // the batch are dropped below.
            for (hash, (count, ready)) in &read.counts {
                if *ready {
                    memo.nodes.insert(
                        *hash,
                        Rooted {
                            count: *count,
                            balances: Vec::new(),
                        },
                    );
                } else {
                    memo.nodes.remove(hash);
                }
            }
            for ((domain, hash), balance) in &read.balances {
                if let Some(node) = memo.nodes.get_mut(hash) {
                    node.balances.push((domain.clone(), *balance));
                }
            }
        }
        for step in steps {
            let domain = updates[step.update].domain;
            for r in &step.results {
                let Some(node) = memo.nodes.get_mut(&r.hash) else {
                    continue;
                };
                node.count = r.count;
                node.balances.retain(|(d, _)| d != domain);
                if r.balance != 0 {
                    node.balances.push((domain.clone(), r.balance));
                }
            }
        }
        memo.nodes.retain(|_, node| node.count > 0);
        memo.revision = after;
        memo.unconfirmed = Some(batch);
        state.apps.insert(key.0.clone(), after);
        if state.apps.len() > PARTITIONS_HELD {
            let app = key.0.clone();
            state.apps.retain(|a, _| *a == app);
        }
    }

    /// Whether `batch`'s commit succeeded: its writes become usable by the partition's next
    /// batches, or the memo is dropped.
    pub(super) fn settle(&self, key: &Key, batch: u64, committed: bool) {
        let mut state = self.state();
        if !committed {
            state.partitions.remove(key);
            return;
        }
        if let Some(memo) = state.partitions.get_mut(key)
            && memo.unconfirmed == Some(batch)
        {
            memo.unconfirmed = None;
        }
    }

    /// Drops a partition's memo.
    pub(super) fn forget(&self, key: &Key) {
        self.state().partitions.remove(key);
    }
}

impl Partition {
    fn memo_key(&self) -> Key {
        (self.app.clone(), self.space.clone())
    }

    /// Applies `updates` as planned from the partition's memo (Postgres), if it holds every
    /// node they name and the write finds it current; `None` when they must be read first.
    pub(super) async fn apply_held(
        &mut self,
        updates: &[RootRefChange<'_>],
        now: i64,
    ) -> Result<Option<Vec<RootRefOutcome>>, sqlx::Error> {
        if self.dialect != Dialect::Postgres {
            return Ok(None);
        }
        self.checked = Some(RootRefCheck::Read);
        let key = self.memo_key();
        let Some(batch) = self.op.batch_id() else {
            return Ok(None);
        };
        let Some((revision, found)) = self.memos.held(&key, batch, updates) else {
            return Ok(None);
        };
        let prior = Prior::of(&found);
        let (planned, steps) = plan(updates, &found.requests, found.counts, found.balances);
        let accepted = steps.len() as i64;
        if accepted == 0 {
            // Nothing to write, so nothing would confirm the refusals: read them.
            return Ok(None);
        }
        match self
            .write_steps(updates, &steps, &prior, now, Some(revision))
            .await?
        {
            Some(after) => {
                self.memos
                    .record(&key, batch, (revision, after), None, updates, &steps);
                self.remembered = Some(batch);
                self.checked = Some(RootRefCheck::Held);
                Ok(Some(outcomes(planned, after - accepted)))
            }
            None => {
                self.memos.forget(&key);
                self.checked = Some(RootRefCheck::Stale);
                Ok(None)
            }
        }
    }

    /// Enters a batch that read before it wrote in the partition's memo (Postgres): `read` is
    /// what its lookups found, `revisions` the App's before and after its writes.
    pub(super) fn remember(
        &mut self,
        revisions: (i64, i64),
        read: Option<&Found>,
        updates: &[RootRefChange<'_>],
        steps: &[Step],
    ) {
        if let (Some(read), Some(batch)) = (read, self.op.batch_id()) {
            let key = self.memo_key();
            self.memos
                .record(&key, batch, revisions, Some(read), updates, steps);
            self.remembered = Some(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::root_ref_plan::StepResult;
    use super::*;

    fn key() -> Key {
        ("app".parse().unwrap(), "space".parse().unwrap())
    }

    /// One update of `changes` (hash, delta) in the default domain.
    struct Update {
        domain: RefDomain,
        id: cas_format::RequestId,
        changes: BTreeMap<Hash, i64>,
        payload: Hash,
    }

    fn update(id: &str, changes: &[(Hash, i64)]) -> Update {
        Update {
            domain: RefDomain::default(),
            id: id.parse().unwrap(),
            changes: changes.iter().copied().collect(),
            payload: Hash::digest(id.as_bytes()),
        }
    }

    fn change(u: &Update) -> RootRefChange<'_> {
        RootRefChange {
            domain: &u.domain,
            request_id: &u.id,
            changes: &u.changes,
            payload_hash: &u.payload,
            actor: "test",
        }
    }

    /// The step of update 0 leaving each (hash, count): its balance in the default domain.
    fn step(results: &[(Hash, i64)]) -> Step {
        Step {
            update: 0,
            results: results
                .iter()
                .map(|(hash, count)| StepResult {
                    hash: *hash,
                    count: *count,
                    balance: *count,
                })
                .collect(),
        }
    }

    fn read(nodes: &[(Hash, i64)]) -> Found {
        let mut found = Found::default();
        for (hash, count) in nodes {
            found.counts.insert(*hash, (*count, true));
            if *count != 0 {
                found.balances.insert((RefDomain::default(), *hash), *count);
            }
        }
        found
    }

    #[test]
    fn a_batch_is_usable_by_others_only_once_its_commit_succeeded() {
        let (memos, k) = (Memos::default(), key());
        let (x, y) = (Hash::digest(b"x"), Hash::digest(b"y"));
        let u = update("a", &[(x, 1)]);
        memos.record(
            &k,
            7,
            (0, 1),
            Some(&read(&[(x, 0), (y, 2)])),
            &[change(&u)],
            &[step(&[(x, 1)])],
        );
        // Batch 7 (its own later operations) may use it, batch 8 may not, yet.
        let (revision, found) = memos.held(&k, 7, &[change(&u)]).expect("held for batch 7");
        assert_eq!((revision, found.counts[&x]), (1, (1, true)));
        assert!(memos.held(&k, 8, &[change(&u)]).is_none());
        memos.settle(&k, 7, true);
        assert!(
            memos
                .held(&k, 8, &[change(&update("b", &[(x, 1), (y, 1)]))])
                .is_some()
        );
        // A failed commit drops the memo.
        memos.record(&k, 8, (1, 2), None, &[change(&u)], &[step(&[(x, 2)])]);
        memos.settle(&k, 8, false);
        assert!(memos.held(&k, 8, &[change(&u)]).is_none());
        assert!(memos.held(&k, 9, &[change(&u)]).is_none());
    }

    #[test]
    fn only_rooted_nodes_are_held_and_a_gap_in_revisions_starts_over() {
        let (memos, k) = (Memos::default(), key());
        let (x, y) = (Hash::digest(b"x"), Hash::digest(b"y"));
        let u = update("a", &[(x, -1)]);
        memos.record(
            &k,
            1,
            (0, 1),
            Some(&read(&[(x, 1), (y, 3)])),
            &[change(&u)],
            &[step(&[(x, 0)])],
        );
        memos.settle(&k, 1, true);
        // x went to zero: it may be collected, so it is not held; y is.
        assert!(
            memos
                .held(&k, 2, &[change(&update("b", &[(x, 1)]))])
                .is_none()
        );
        assert_eq!(
            memos
                .held(&k, 2, &[change(&update("c", &[(y, 1)]))])
                .map(|h| h.1.counts[&y]),
            Some((3, true))
        );
        // Another writer moved the revision (2 → 5): what was held before is dropped.
        let z = Hash::digest(b"z");
        let v = update("d", &[(z, 1)]);
        memos.record(
            &k,
            3,
            (4, 5),
            Some(&read(&[(z, 0)])),
            &[change(&v)],
            &[step(&[(z, 1)])],
        );
        memos.settle(&k, 3, true);
        assert!(
            memos
                .held(&k, 4, &[change(&update("e", &[(y, 1)]))])
                .is_none()
        );
        assert_eq!(memos.held(&k, 4, &[change(&v)]).map(|h| h.0), Some(5));
        // A write of another partition of the App (revision 6) leaves this one's memo stale.
        let other = (k.0.clone(), "elsewhere".parse().unwrap());
        memos.record(
            &other,
            5,
            (5, 6),
            Some(&read(&[(z, 0)])),
            &[change(&v)],
            &[step(&[(z, 1)])],
        );
        assert!(memos.held(&k, 6, &[change(&v)]).is_none());
    }
}
