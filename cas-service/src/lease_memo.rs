//! What this process last saw of ready nodes' leases, so that a renewal a running lease already
//! covers is answered without reading the metadata store.
//!
//! Sound across replicas and restarts because of two invariants of the store: a ready node's
//! lease is never shortened, and GC takes a node only once its lease has expired. A node seen
//! ready with its lease running until `E` is therefore ready, with a lease running until `E` or
//! later, in every replica until `E`. An entry is only ever used while its lease runs and only
//! for a claim the lease already covers (see [`crate::lease::lease_window`]); anything else goes
//! to the store, which refreshes the entry.
//!
//! Bounded: [`SHARDS`] maps of at most [`PER_SHARD`] entries; a full shard drops its lapsed
//! entries, and all of them when none has lapsed.

use std::collections::HashMap;
use std::sync::Mutex;

use cas_format::{AppId, Hash, SpaceId};

const SHARDS: usize = 16;
const PER_SHARD: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    app: AppId,
    space: SpaceId,
    hash: Hash,
}

/// Per-process memo of ready nodes' lease windows.
#[derive(Debug, Default)]
pub struct LeaseMemo {
    shards: [Mutex<HashMap<Key, (i64, i64)>>; SHARDS],
}

impl LeaseMemo {
    fn shard(&self, hash: &Hash) -> &Mutex<HashMap<Key, (i64, i64)>> {
        &self.shards[hash.as_bytes()[0] as usize % SHARDS]
    }

    /// The lease window `(started, expires)` last seen for the ready node, if it still runs at
    /// `now`.
    pub fn get(&self, app: &AppId, space: &SpaceId, hash: &Hash, now: i64) -> Option<(i64, i64)> {
        let shard = self.shard(hash).lock().unwrap_or_else(|p| p.into_inner());
        // Looking up by a borrowed key would need a second key type; the clones are short
        // strings and one hash, cheaper than the store read they save.
        let key = Key {
            app: app.clone(),
            space: space.clone(),
            hash: *hash,
        };
        shard
            .get(&key)
            .copied()
            .filter(|&(_, expires)| expires > now)
    }

    /// Records that the node is ready with its lease running over `(started, expires)`.
    pub fn remember(
        &self,
        app: &AppId,
        space: &SpaceId,
        hash: &Hash,
        window: (i64, i64),
        now: i64,
    ) {
        if window.1 <= now {
            return;
        }
        let mut shard = self.shard(hash).lock().unwrap_or_else(|p| p.into_inner());
        if shard.len() >= PER_SHARD {
            shard.retain(|_, &mut (_, expires)| expires > now);
            if shard.len() >= PER_SHARD {
                shard.clear();
            }
        }
        let key = Key {
            app: app.clone(),
            space: space.clone(),
            hash: *hash,
        };
        let entry = shard.entry(key).or_insert(window);
        // Leases only grow: keep the later of two windows seen out of order.
        if window.1 > entry.1 {
            *entry = window;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (AppId, SpaceId) {
        ("memo-app".parse().unwrap(), "memo-space".parse().unwrap())
    }

    #[test]
    fn answers_only_running_leases_of_its_partition() {
        let (app, space) = ids();
        let other: SpaceId = "other".parse().unwrap();
        let h = Hash::digest(b"node");
        let memo = LeaseMemo::default();
        memo.remember(&app, &space, &h, (10, 100), 20);
        assert_eq!(memo.get(&app, &space, &h, 50), Some((10, 100)));
        assert_eq!(memo.get(&app, &other, &h, 50), None);
        assert_eq!(
            memo.get(&app, &space, &h, 100),
            None,
            "a lapsed lease is not answered"
        );
        // An older window seen late never replaces a later one.
        memo.remember(&app, &space, &h, (5, 80), 20);
        assert_eq!(memo.get(&app, &space, &h, 50), Some((10, 100)));
        memo.remember(&app, &space, &h, (60, 200), 60);
        assert_eq!(memo.get(&app, &space, &h, 150), Some((60, 200)));
        // A lapsed window is not remembered at all.
        let g = Hash::digest(b"lapsed");
        memo.remember(&app, &space, &g, (1, 2), 3);
        assert_eq!(memo.get(&app, &space, &g, 1), None);
    }

    #[test]
    fn stays_bounded() {
        let (app, space) = ids();
        let memo = LeaseMemo::default();
        for i in 0..(SHARDS * PER_SHARD * 3) as u64 {
            memo.remember(&app, &space, &Hash::digest(&i.to_le_bytes()), (0, 1_000), 0);
        }
        let total: usize = memo.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= SHARDS * PER_SHARD, "{total} entries");
        // Lapsed entries make room before live ones are dropped.
        let h = Hash::digest(b"late");
        memo.remember(&app, &space, &h, (2_000, 3_000), 2_000);
        assert_eq!(memo.get(&app, &space, &h, 2_500), Some((2_000, 3_000)));
    }
}
