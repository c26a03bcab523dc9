//! The planning of a batch of root-ref updates, in memory: each update checked in order
//! against the counts and balances that the batch's lookups found and the updates before it
//! left.

use std::collections::HashMap;

use cas_format::{Hash, RefDomain};

use super::root_refs::{MAX_ROOT_REF_COUNT, RootRefChange, RootRefOutcome, RootRefRejection};

/// An update accepted in memory, numbered 1.. within its batch until the batch's revisions
/// are known.
pub(super) enum Planned {
    Done(RootRefOutcome),
    /// Applied as the batch's `k`-th new revision.
    Applied(i64),
    /// A replay of the batch's `k`-th new revision.
    Replayed(i64),
}

/// Earlier requests: (domain, request id) to (payload hash, revision).
pub(super) type Requests = HashMap<(RefDomain, String), (Vec<u8>, i64)>;

/// The outcome of each planned update, the batch's `k`-th new revision being `base + k`.
pub(super) fn outcomes(planned: Vec<Planned>, base: i64) -> Vec<RootRefOutcome> {
    planned
        .into_iter()
        .map(|p| match p {
            Planned::Done(o) => o,
            Planned::Applied(k) => Ok((base + k, false)),
            Planned::Replayed(k) => Ok((base + k, true)),
        })
        .collect()
}

/// What a batch's lookups found.
#[derive(Default, Clone)]
pub(super) struct Found {
    pub requests: Requests,
    /// A node's root ref count, and whether it is ready (not being collected). Nodes that do
    /// not exist are absent.
    pub counts: HashMap<Hash, (i64, bool)>,
    /// The current balance of a (domain, hash).
    pub balances: HashMap<(RefDomain, Hash), i64>,
}

/// What an accepted update leaves for one hash: the node's count and the domain's balance.
pub(super) struct StepResult {
    pub hash: Hash,
    pub count: i64,
    pub balance: i64,
}

/// An accepted update: which one, and what it leaves.
pub(super) struct Step {
    pub update: usize,
    pub results: Vec<StepResult>,
}

/// Decides every update in order against the running counts and balances: replays (of earlier
/// requests or of one earlier in the batch), refusals, and the accepted steps in revision
/// order. Request ids are scoped to their domain.
pub(super) fn plan(
    updates: &[RootRefChange<'_>],
    earlier: &Requests,
    mut counts: HashMap<Hash, (i64, bool)>,
    mut balances: HashMap<(RefDomain, Hash), i64>,
) -> (Vec<Planned>, Vec<Step>) {
    let mut steps: Vec<Step> = Vec::new();
    // Requests accepted in this batch: payload hash and step number (1..).
    let mut in_batch: HashMap<(&RefDomain, &str), (&Hash, i64)> = HashMap::new();
    let planned = updates
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let id = u.request_id.as_str();
            if let Some((stored, revision)) = earlier.get(&(u.domain.clone(), id.to_string())) {
                return Planned::Done(if stored.as_slice() == u.payload_hash.as_bytes() {
                    Ok((*revision, true))
                } else {
                    Err(RootRefRejection::IdempotencyConflict)
                });
            }
            if let Some((payload, k)) = in_batch.get(&(u.domain, id)) {
                return if *payload == u.payload_hash {
                    Planned::Replayed(*k)
                } else {
                    Planned::Done(Err(RootRefRejection::IdempotencyConflict))
                };
            }
            match check(u, &counts, &balances) {
                Err(rejection) => Planned::Done(Err(rejection)),
                Ok(results) => {
                    for r in &results {
                        if let Some(c) = counts.get_mut(&r.hash) {
                            c.0 = r.count;
                        }
                        balances.insert((u.domain.clone(), r.hash), r.balance);
                    }
                    steps.push(Step { update: i, results });
                    let k = steps.len() as i64;
                    in_batch.insert((u.domain, id), (u.payload_hash, k));
                    Planned::Applied(k)
                }
            }
        })
        .collect();
    (planned, steps)
}

/// What one update leaves, or why it is refused.
fn check(
    u: &RootRefChange<'_>,
    counts: &HashMap<Hash, (i64, bool)>,
    balances: &HashMap<(RefDomain, Hash), i64>,
) -> Result<Vec<StepResult>, RootRefRejection> {
    let mut results = Vec::with_capacity(u.changes.len());
    for (hash, delta) in u.changes {
        let Some((count, ready)) = counts.get(hash).copied() else {
            return Err(RootRefRejection::UnknownNode(*hash));
        };
        if *delta > 0 && !ready {
            return Err(RootRefRejection::NotReady(*hash));
        }
        let result = count + delta;
        if result < 0 {
            return Err(RootRefRejection::Negative {
                hash: *hash,
                result,
            });
        }
        let balance = balances
            .get(&(u.domain.clone(), *hash))
            .copied()
            .unwrap_or(0)
            + delta;
        if result > MAX_ROOT_REF_COUNT || balance.abs() > MAX_ROOT_REF_COUNT {
            return Err(RootRefRejection::Overflow(*hash));
        }
        results.push(StepResult {
            hash: *hash,
            count: result,
            balance,
        });
    }
    Ok(results)
}
