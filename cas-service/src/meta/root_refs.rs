//! Root references: one transaction per accepted update (idempotency, App-global revision,
//! counts, event, current balances). Reads are in `root_ref_reads`.
//!
//! Balances are kept per (Space, domain, hash); a node's `root_ref_count` is their sum over
//! domains. As the public contract has it, only that sum must stay at or above zero: a domain's
//! own balance may go below zero (one domain releasing what another took), and every count
//! stays within ±(2^53 − 1).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cas_format::{Hash, RefDomain, RequestId};
use sqlx::Row;

use super::{Binds, Partition, hash_col, hb, id_col};

/// Largest root ref count a node may reach (the JSON-safe integer range).
pub const MAX_ROOT_REF_COUNT: i64 = (1 << 53) - 1;

/// Why an update was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootRefRejection {
    /// The request id was used before with other changes.
    IdempotencyConflict,
    UnknownNode(Hash),
    /// A positive delta targets a node that is being collected.
    NotReady(Hash),
    Negative {
        hash: Hash,
        result: i64,
    },
    Overflow(Hash),
}

/// One root-ref update of a batch that [`Partition::update_root_refs_many`] applies together.
#[derive(Debug, Clone, Copy)]
pub struct RootRefChange<'a> {
    pub domain: &'a RefDomain,
    pub request_id: &'a RequestId,
    pub changes: &'a BTreeMap<Hash, i64>,
    pub payload_hash: &'a Hash,
    pub actor: &'a str,
}

/// What became of one update: `(revision, idempotent)`, or why it was refused.
pub type RootRefOutcome = Result<(i64, bool), RootRefRejection>;

/// An update accepted in memory, numbered 1.. within its batch until the batch's revisions
/// are known.
enum Planned {
    Done(RootRefOutcome),
    /// Applied as the batch's `k`-th new revision.
    Applied(i64),
    /// A replay of the batch's `k`-th new revision.
    Replayed(i64),
}

/// How many hashes one combined statement names at most: with at most five values bound for
/// each (a balance row), within what both databases bind (SQLite 32,766, Postgres 65,535).
pub const MAX_BATCH_HASHES: usize = 4000;

impl Partition {
    /// Applies one root-ref update, or replays it. Returns `(revision, idempotent)`.
    pub async fn update_root_refs(
        &mut self,
        domain: &RefDomain,
        request_id: &RequestId,
        changes: &BTreeMap<Hash, i64>,
        payload_hash: &Hash,
        actor: &str,
        now: i64,
    ) -> Result<RootRefOutcome, sqlx::Error> {
        let change = RootRefChange {
            domain,
            request_id,
            changes,
            payload_hash,
            actor,
        };
        self.update_root_refs_many(&[change], now)
            .await?
            .pop()
            .ok_or_else(|| sqlx::Error::Protocol("an update was left without an outcome".into()))
    }

    /// Applies (or replays) several updates in order, each with a revision of its own, in a
    /// handful of statements whatever their number: each is checked against the counts the
    /// ones before it left, and one that is refused changes nothing and does not stop the
    /// others. The changes together name at most [`MAX_BATCH_HASHES`] hashes.
    pub async fn update_root_refs_many(
        &mut self,
        updates: &[RootRefChange<'_>],
        now: i64,
    ) -> Result<Vec<RootRefOutcome>, sqlx::Error> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        let (app, space) = (self.app.clone(), self.space.clone());
        let earlier = self.earlier_requests(updates).await?;
        let counts = self.current_counts(updates).await?;
        let balances = self.open_balances(updates).await?;
        let (planned, steps) = plan(updates, &earlier, counts, balances);
        let accepted = steps.len() as i64;
        let finish = |planned: Vec<Planned>, base: i64| -> Vec<RootRefOutcome> {
            planned
                .into_iter()
                .map(|p| match p {
                    Planned::Done(o) => o,
                    Planned::Applied(k) => Ok((base + k, false)),
                    Planned::Replayed(k) => Ok((base + k, true)),
                })
                .collect()
        };
        if accepted == 0 {
            // Only replays and refusals: nothing to write.
            return Ok(finish(planned, 0));
        }
        let last: i64 = sqlx::query(
            "UPDATE apps SET revision = revision + $2 WHERE app_id = $1 RETURNING revision",
        )
        .bind(app.as_str())
        .bind(accepted)
        .fetch_one(&mut **self.tx())
        .await?
        .try_get("revision")?;
        let base = last - accepted;
        // The final counts and balances (absolute: the gate is held).
        let mut finals: BTreeMap<Hash, i64> = BTreeMap::new();
        let mut balances: BTreeMap<(&RefDomain, Hash), i64> = BTreeMap::new();
        for step in &steps {
            let domain = updates[step.update].domain;
            for r in &step.results {
                finals.insert(r.hash, r.count);
                balances.insert((domain, r.hash), r.balance);
            }
        }
        // Every statement binds its values in the order of its text (see `Binds`).
        let mut b = self.binds();
        let values = b.rows(finals.len(), 2);
        let (a, s) = (b.one(), b.one());
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE nodes SET root_ref_count = v.column2, \
             rooted = CASE WHEN v.column2 > 0 THEN 1 ELSE 0 END FROM (VALUES {values}) AS v \
             WHERE nodes.app_id = {a} AND nodes.space_id = {s} AND nodes.hash = v.column1"
        )));
        for (hash, count) in &finals {
            q = q.bind(hb(hash)).bind(*count);
        }
        q.bind(app.as_str())
            .bind(space.as_str())
            .execute(&mut **self.tx())
            .await?;
        self.write_balances(&balances).await?;
        let values = self.binds().rows(steps.len(), 8);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO root_ref_events (app_id, space_id, revision, ref_domain, request_id, \
             changes, actor, applied_at) VALUES {values}"
        )));
        for (k, step) in steps.iter().enumerate() {
            let u = &updates[step.update];
            let changes_json =
                serde_json::to_string(u.changes).unwrap_or_else(|_| "{}".to_string());
            q = q
                .bind(app.as_str())
                .bind(space.as_str())
                .bind(base + 1 + k as i64)
                .bind(u.domain.as_str())
                .bind(u.request_id.as_str())
                .bind(changes_json)
                .bind(u.actor)
                .bind(now);
        }
        q.execute(&mut **self.tx()).await?;
        let values = self.binds().rows(steps.len(), 6);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO root_ref_requests \
             (app_id, space_id, ref_domain, request_id, payload_hash, revision) VALUES {values}"
        )));
        for (k, step) in steps.iter().enumerate() {
            let u = &updates[step.update];
            q = q
                .bind(app.as_str())
                .bind(space.as_str())
                .bind(u.domain.as_str())
                .bind(u.request_id.as_str())
                .bind(hb(u.payload_hash))
                .bind(base + 1 + k as i64);
        }
        q.execute(&mut **self.tx()).await?;
        Ok(finish(planned, base))
    }

    /// Writes the current balance of each (domain, hash): a row for each non-zero one (only
    /// the current value is kept; earlier ones are read back through the events), none for
    /// zero.
    async fn write_balances(
        &mut self,
        balances: &BTreeMap<(&RefDomain, Hash), i64>,
    ) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let (kept, zero): (Vec<_>, Vec<_>) = balances.iter().partition(|(_, count)| **count != 0);
        if !kept.is_empty() {
            let values = self.binds().rows(kept.len(), 5);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO root_ref_balances (app_id, space_id, ref_domain, hash, ref_count) \
                 VALUES {values} ON CONFLICT (app_id, space_id, ref_domain, hash) \
                 DO UPDATE SET ref_count = excluded.ref_count"
            )));
            for ((domain, hash), count) in kept {
                q = q
                    .bind(app.as_str())
                    .bind(space.as_str())
                    .bind(domain.as_str())
                    .bind(hb(hash))
                    .bind(*count);
            }
            q.execute(&mut **self.tx()).await?;
        }
        if !zero.is_empty() {
            let mut b = self.binds();
            let (a, s) = (b.one(), b.one());
            let values = b.rows(zero.len(), 2);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM root_ref_balances WHERE app_id = {a} AND space_id = {s} \
                 AND (ref_domain, hash) IN (VALUES {values})"
            )))
            .bind(app.as_str())
            .bind(space.as_str());
            for ((domain, hash), _) in zero {
                q = q.bind(domain.as_str()).bind(hb(hash));
            }
            q.execute(&mut **self.tx()).await?;
        }
        Ok(())
    }

    /// The rows that `select` (a `SELECT … FROM table WHERE <condition>`) finds in this
    /// partition whose `column` is one of `keys` and, for a table keyed by domain, whose
    /// `ref_domain` is one of `domains`: naming the domains lets both databases seek the
    /// (partition, domain, key) index instead of reading every row of the partition.
    async fn rows_in<T>(
        &mut self,
        select: &str,
        domains: Option<BTreeSet<&str>>,
        column: &str,
        keys: Vec<T>,
    ) -> Result<Vec<sqlx::any::AnyRow>, sqlx::Error>
    where
        T: for<'q> sqlx::Encode<'q, sqlx::Any> + sqlx::Type<sqlx::Any> + Send + 'static,
    {
        let sql = rows_in_sql(
            self.binds(),
            select,
            domains.as_ref().map_or(0, BTreeSet::len),
            column,
            keys.len(),
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(self.app.as_str().to_string())
            .bind(self.space.as_str().to_string());
        for domain in domains.into_iter().flatten() {
            q = q.bind(domain.to_string());
        }
        for key in keys {
            q = q.bind(key);
        }
        q.fetch_all(&mut **self.tx()).await
    }

    /// The requests of this partition among the updates' ids that were applied before:
    /// (domain, request id) to (payload hash, revision).
    async fn earlier_requests(
        &mut self,
        updates: &[RootRefChange<'_>],
    ) -> Result<HashMap<(RefDomain, String), (Vec<u8>, i64)>, sqlx::Error> {
        let ids: BTreeSet<&str> = updates.iter().map(|u| u.request_id.as_str()).collect();
        self.rows_in(
            EARLIER_REQUESTS,
            Some(domains_of(updates)),
            "request_id",
            ids.into_iter().map(str::to_string).collect(),
        )
        .await?
        .iter()
        .map(|r| {
            Ok((
                (id_col(r, "ref_domain")?, r.try_get("request_id")?),
                (r.try_get("payload_hash")?, r.try_get("revision")?),
            ))
        })
        .collect()
    }

    /// The current balance of every (domain, hash) among the hashes the updates name.
    async fn open_balances(
        &mut self,
        updates: &[RootRefChange<'_>],
    ) -> Result<HashMap<(RefDomain, Hash), i64>, sqlx::Error> {
        let hashes: BTreeSet<Hash> = updates
            .iter()
            .flat_map(|u| u.changes.keys().copied())
            .collect();
        self.rows_in(
            OPEN_BALANCES,
            Some(domains_of(updates)),
            "hash",
            hashes.iter().map(hb).collect(),
        )
        .await?
        .iter()
        .map(|r| {
            Ok((
                (id_col(r, "ref_domain")?, hash_col(r, "hash")?),
                r.try_get("ref_count")?,
            ))
        })
        .collect()
    }

    /// The root ref count of every node the updates name, and whether it is ready (not being
    /// collected). Nodes that do not exist are absent.
    async fn current_counts(
        &mut self,
        updates: &[RootRefChange<'_>],
    ) -> Result<HashMap<Hash, (i64, bool)>, sqlx::Error> {
        let hashes: BTreeSet<Hash> = updates
            .iter()
            .flat_map(|u| u.changes.keys().copied())
            .collect();
        self.rows_in(
            "SELECT hash, root_ref_count, collecting_since FROM nodes WHERE TRUE",
            None,
            "hash",
            hashes.iter().map(hb).collect(),
        )
        .await?
        .iter()
        .map(|r| {
            let collecting: Option<i64> = r.try_get("collecting_since")?;
            Ok((
                hash_col(r, "hash")?,
                (r.try_get("root_ref_count")?, collecting.is_none()),
            ))
        })
        .collect()
    }
}

/// The earlier requests among a batch's (for [`Partition::rows_in`], by `request_id`).
const EARLIER_REQUESTS: &str =
    "SELECT ref_domain, request_id, payload_hash, revision FROM root_ref_requests WHERE TRUE";
/// The current balances of a batch's hashes (for [`Partition::rows_in`], by `hash`).
const OPEN_BALANCES: &str = "SELECT ref_domain, hash, ref_count FROM root_ref_balances WHERE TRUE";

/// The statement of [`Partition::rows_in`]: the partition, then `domains` domains (none: the
/// table has no domain) and `keys` keys.
fn rows_in_sql(mut b: Binds, select: &str, domains: usize, column: &str, keys: usize) -> String {
    let (a, s) = (b.one(), b.one());
    let by_domain = match domains {
        0 => String::new(),
        n => format!(" AND ref_domain IN ({})", b.list(n)),
    };
    let keys = b.list(keys);
    format!("{select} AND app_id = {a} AND space_id = {s}{by_domain} AND {column} IN ({keys})")
}

/// The domains the updates belong to.
fn domains_of<'a>(updates: &[RootRefChange<'a>]) -> BTreeSet<&'a str> {
    updates.iter().map(|u| u.domain.as_str()).collect()
}

/// What an accepted update leaves for one hash: the node's count and the domain's balance.
struct StepResult {
    hash: Hash,
    count: i64,
    balance: i64,
}

/// An accepted update: which one, and what it leaves.
struct Step {
    update: usize,
    results: Vec<StepResult>,
}

/// Decides every update in order against the running counts and balances: replays (of earlier
/// requests or of one earlier in the batch), refusals, and the accepted steps in revision
/// order. Request ids are scoped to their domain.
fn plan(
    updates: &[RootRefChange<'_>],
    earlier: &HashMap<(RefDomain, String), (Vec<u8>, i64)>,
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

#[cfg(test)]
mod tests {
    use super::super::Dialect;
    use super::*;

    /// The idempotency and balance lookups of a batch seek their index by (partition, domain,
    /// key): without the domain they would read every request and every open balance the
    /// partition ever had, once per batch.
    #[tokio::test]
    async fn batch_lookups_seek_by_domain_and_key() {
        let dir = std::env::temp_dir().join(format!("unicas-plan-{}", std::process::id()));
        let config = crate::config::Config {
            data_dir: dir.clone(),
            ..Default::default()
        };
        let store = super::super::MetaStore::connect(&config)
            .await
            .expect("store");
        store.migrate().await.expect("migrate");
        for (select, column, seek) in [
            (
                EARLIER_REQUESTS,
                "request_id",
                "ref_domain=? AND request_id=?",
            ),
            (OPEN_BALANCES, "hash", "ref_domain=? AND hash=?"),
        ] {
            let sql = rows_in_sql(Binds::new(Dialect::Sqlite), select, 2, column, 3);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            for _ in 0..7 {
                q = q.bind("x");
            }
            let plan: Vec<String> = q
                .fetch_all(store.pool())
                .await
                .expect("plan")
                .iter()
                .map(|r| r.try_get::<String, _>("detail").expect("detail"))
                .collect();
            assert!(
                plan.iter().any(|step| step.contains(seek)),
                "{column}: {plan:?}"
            );
        }
        store.pool().close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
