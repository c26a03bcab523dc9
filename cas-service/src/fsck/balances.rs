//! `fsck` of root refs: each domain's balance against the sum of its events; each node's count
//! (the sum of its balances over domains) at or above zero, held by a node that has a row, and
//! agreeing with its `rooted` flag.

use std::collections::BTreeSet;

use cas_format::{Hash, RefDomain};

use super::{FsckOptions, FsckReport};
use crate::Service;
use crate::meta::sum_over_domains;

impl Service {
    /// Check 3.
    pub(super) async fn check_balances(
        &self,
        opts: &FsckOptions,
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        let in_scope = |space: &str| opts.space.as_ref().is_none_or(|s| s.as_str() == space);
        let events = self.meta.event_sums(&opts.app).await?;
        let balances = self.meta.current_balances(&opts.app).await?;
        // Each domain's balance is the sum of its events.
        let keys: BTreeSet<&(String, RefDomain, Hash)> =
            events.keys().chain(balances.keys()).collect();
        for key in keys.into_iter().filter(|k| in_scope(&k.0)) {
            let e = events.get(key).copied().unwrap_or(0);
            let b = balances.get(key).copied().unwrap_or(0);
            if e != b {
                report.bad(
                    "root-ref-balance",
                    format!(
                        "{}/{} in domain {}: events sum to {e}, the projection holds {b}",
                        key.0, key.2, key.1
                    ),
                );
            }
        }
        // A node's count, the sum of its balances over domains, is never below zero.
        for (key, b) in sum_over_domains(&balances) {
            if b < 0 && in_scope(&key.0) {
                report.bad(
                    "root-ref-balance",
                    format!(
                        "{}/{}: the domains' balances sum to {b}, below zero",
                        key.0, key.1
                    ),
                );
            }
        }
        // A referenced node is never collected.
        for (key, b) in self.meta.root_counts_without_node(&opts.app).await? {
            if in_scope(&key.0) {
                report.bad(
                    "root-ref-balance",
                    format!("{}/{}: root ref count {b} but no node row", key.0, key.1),
                );
            }
        }
        // Garbage collection reads whether a node is rooted from its flag.
        for m in self.meta.rooted_mismatches(&opts.app).await? {
            if in_scope(m.space.as_str()) {
                report.bad(
                    "root-ref-balance",
                    format!(
                        "{}/{}: root ref count {} but rooted flag {}",
                        m.space, m.hash, m.counted, m.recorded
                    ),
                );
            }
        }
        Ok(())
    }
}
