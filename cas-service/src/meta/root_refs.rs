//! Root references: the updates of a batch applied in two round trips to the database, one
//! of lookups and one of writes (App-global revisions, counts, current balances, events,
//! idempotency records). The batch is planned in `root_ref_plan` and written by
//! `root_ref_writes`; reads are in `root_ref_reads`; on SQLite a batch that only adds is
//! written without its lookups (`root_ref_adding`), and on Postgres a batch whose nodes the
//! partition's memo holds is planned from it and written by a statement that checks the memo
//! is current (`root_ref_memo`).
//!
//! Balances are kept per (Space, domain, hash); a node's root ref count is their sum over
//! domains, read from them, not stored: its row is written only when the sum goes to or from
//! zero (its `rooted` flag). As the public contract has it, only that sum must stay at or above
//! zero: a domain's own balance may go below zero (one domain releasing what another took), and
//! every count stays within ±(2^53 − 1).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cas_format::{Hash, RefDomain, RequestId};
use sqlx::Row;

use super::root_ref_plan::{Found, Step, outcomes, plan};
use super::root_ref_writes::{
    Writes, balance_rows, balance_updates, delete_balances, event_parts, held_revision_part,
    revision_part,
};
use super::{Dialect, Partition, Statement, Value};

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

/// How many hashes the changes of one batch name at most: its writes bind at most seven values
/// for each (a count and a balance) and fourteen for each of its at most 256 updates, 31,586 in
/// all, within what one statement binds on both databases (SQLite 32,766, Postgres 65,535).
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
    /// few statements whatever their number (one that reads, one that writes: each a single
    /// round trip to the database; on SQLite a batch that only adds is written without being
    /// read, see `root_ref_adding`): each is checked against the counts the ones before it
    /// left, and one that is refused changes nothing and does not stop the others. The
    /// changes together name at most [`MAX_BATCH_HASHES`] hashes.
    pub async fn update_root_refs_many(
        &mut self,
        updates: &[RootRefChange<'_>],
        now: i64,
    ) -> Result<Vec<RootRefOutcome>, sqlx::Error> {
        if updates.is_empty() {
            return Ok(Vec::new());
        }
        if self.dialect == Dialect::Sqlite
            && let Some(outcomes) = self.try_adding(updates, now).await?
        {
            return Ok(outcomes);
        }
        self.apply_read_first(updates, now).await
    }

    /// [`Partition::update_root_refs_many`] by reading what the batch names, planning it,
    /// and writing what the plan accepts.
    pub(super) async fn apply_read_first(
        &mut self,
        updates: &[RootRefChange<'_>],
        now: i64,
    ) -> Result<Vec<RootRefOutcome>, sqlx::Error> {
        if let Some(outcomes) = self.apply_held(updates, now).await? {
            return Ok(outcomes);
        }
        // From here the operation fails alone, in a savepoint (a held write that found its
        // state stale wrote nothing).
        self.protect().await?;
        let found = self.lookups(updates).await?;
        let read = (self.dialect == Dialect::Postgres).then(|| found.clone());
        let prior = Prior::of(&found);
        let (planned, steps) = plan(updates, &found.requests, found.counts, found.balances);
        let accepted = steps.len() as i64;
        let base = if accepted == 0 {
            // Only replays and refusals: nothing to write.
            0
        } else {
            let after = self
                .write_steps(updates, &steps, &prior, now, None)
                .await?
                .ok_or_else(|| {
                    sqlx::Error::Protocol("the App's revision was not returned".into())
                })?;
            self.remember((after - accepted, after), read.as_ref(), updates, &steps);
            after - accepted
        };
        Ok(outcomes(planned, base))
    }

    /// Writes the accepted steps in one round trip: the App's revision, the `rooted` flags
    /// of the nodes whose counts went to or from zero, the current balances (those stored
    /// before the batch updated in place, the others inserted), an event and a request row
    /// for each (`prior`: what the batch was planned from). Returns the App's
    /// new revision. With `held` (Postgres; the revision the batch was planned at) it writes
    /// only if the App is still at that revision and none of the updates' request ids was
    /// used before, and returns `None` if it wrote nothing.
    pub(super) async fn write_steps(
        &mut self,
        updates: &[RootRefChange<'_>],
        steps: &[Step],
        prior: &Prior,
        now: i64,
        held: Option<i64>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (app, space) = (self.app.as_str(), self.space.as_str());
        // The final counts and balances (absolute: the gate is held).
        let mut finals: BTreeMap<Hash, i64> = BTreeMap::new();
        let mut balances: BTreeMap<(&RefDomain, Hash), i64> = BTreeMap::new();
        for step in steps {
            let domain = updates[step.update].domain;
            for r in &step.results {
                finals.insert(r.hash, r.count);
                balances.insert((domain, r.hash), r.balance);
            }
        }
        // Balances gone to zero, those stored before the batch, and new ones.
        let (mut gone, mut stored, mut new) = (Vec::new(), Vec::new(), Vec::new());
        for (&(domain, hash), &count) in &balances {
            if count == 0 {
                gone.push((domain, hash));
            } else if prior.is_stored(domain, &hash) {
                stored.push((domain, hash, count));
            } else {
                new.push((domain, hash, count));
            }
        }
        let accepted = steps.len() as i64;
        let mut w = Writes::new(self.statement());
        match held {
            Some(revision) => held_revision_part(&mut w, (app, space), accepted, revision, updates),
            None => revision_part(&mut w, app, accepted),
        }
        let flips: Vec<(Hash, bool)> = finals
            .iter()
            .map(|(hash, count)| (*hash, *count > 0))
            .filter(|(hash, now_rooted)| prior.rooted.get(hash) != Some(now_rooted))
            .collect();
        if !flips.is_empty() {
            w.next("").update_nodes(
                (app, space),
                "rooted = v.column2",
                flips
                    .iter()
                    .map(|(hash, r)| (*hash, vec![Value::Int(i64::from(*r))])),
            );
            w.guard();
        }
        if !stored.is_empty() {
            let rows = stored
                .iter()
                .map(|(domain, hash, count)| (*domain, hash, *count));
            balance_updates(&mut w, (app, space), rows);
        }
        if !new.is_empty() {
            let rows = new
                .iter()
                .map(|(domain, hash, count)| (*domain, hash, *count));
            balance_rows(&mut w, (app, space), rows);
            w.text(
                " ON CONFLICT (app_id, space_id, ref_domain, hash) \
                 DO UPDATE SET ref_count = excluded.ref_count",
            );
        }
        if !gone.is_empty() {
            delete_balances(w.next(""), (app, space), &gone);
            w.guard();
        }
        let order: Vec<usize> = steps.iter().map(|s| s.update).collect();
        event_parts(&mut w, (app, space), updates, &order, now);
        // All rows, not one: on SQLite a query that stops at its first row leaves the
        // statements after the first unrun.
        let rows = w.finish().fetch_all(&mut **self.tx()).await?;
        rows.first().map(|r| r.try_get("revision")).transpose()
    }

    /// What the batch's lookups find, in one statement: the earlier requests among the
    /// updates' ids, and the nodes they name with their current balances in every domain,
    /// whose sum is a node's count. The parts seek their indexes by (partition, domain, key)
    /// and (partition, key).
    async fn lookups(&mut self, updates: &[RootRefChange<'_>]) -> Result<Found, sqlx::Error> {
        let hashes: BTreeSet<Hash> = updates
            .iter()
            .flat_map(|u| u.changes.keys().copied())
            .collect();
        let ids = ids_of(updates);
        // One row of JSON for the whole batch: the driver's work is by row (a few
        // microseconds each, several times what the database spends finding it).
        let mut q = self.statement();
        q.text(match self.dialect {
            Dialect::Sqlite => {
                "SELECT CAST(json_group_array(json_array(kind, ref_domain, request_id, \
                 lower(hex(hash)), n, collecting_since, balance)) AS TEXT) AS found FROM ("
            }
            Dialect::Postgres => {
                "SELECT CAST(COALESCE(json_agg(json_build_array(kind, ref_domain, request_id, \
                 encode(hash, 'hex'), n, collecting_since, balance)), '[]') AS TEXT) AS found \
                 FROM ("
            }
        });
        let mut q = lookups_sql(
            q,
            (self.app.as_str(), self.space.as_str()),
            &domains_of(updates),
            &ids,
            &hashes,
        );
        q.text(") AS l");
        let json: String = q
            .query()
            .fetch_one(&mut **self.tx())
            .await?
            .try_get("found")?;
        let bad = |e: &dyn std::fmt::Display| sqlx::Error::ColumnDecode {
            index: "found".into(),
            source: e.to_string().into(),
        };
        let rows: Vec<LookupRow> = serde_json::from_str(&json).map_err(|e| bad(&e))?;
        let mut found = Found::default();
        for (kind, domain, request_id, hash, n, collecting, balance) in rows {
            let hash: Hash = hash.parse().map_err(|e| bad(&e))?;
            let domain = domain.map(|d| d.parse::<RefDomain>().map_err(|e| bad(&e)));
            if kind == LOOKUP_REQUEST {
                let (Some(domain), Some(id)) = (domain, request_id) else {
                    return Err(bad(&"a request without its domain or id"));
                };
                found
                    .requests
                    .insert((domain?, id), (hash.as_bytes().to_vec(), n));
                continue;
            }
            // A node's count is the sum of its balances, one row each (or one row without).
            let count = found
                .counts
                .entry(hash)
                .or_insert((0, collecting.is_none()));
            if let (Some(domain), Some(balance)) = (domain, balance) {
                count.0 = count.0.saturating_add(balance);
                found.balances.insert((domain?, hash), balance);
            }
        }
        Ok(found)
    }
}

/// What a batch was planned from, as its writes need it.
pub(super) struct Prior {
    /// Whether each node the lookups found was rooted (its count above zero).
    rooted: BTreeMap<Hash, bool>,
    /// The domains in which each node has a stored balance (zero balances are not stored).
    stored: HashMap<Hash, Vec<RefDomain>>,
}

impl Prior {
    pub(super) fn of(found: &Found) -> Self {
        let mut stored: HashMap<Hash, Vec<RefDomain>> = HashMap::new();
        for ((domain, hash), balance) in &found.balances {
            if *balance != 0 {
                stored.entry(*hash).or_default().push(domain.clone());
            }
        }
        let rooted = found
            .counts
            .iter()
            .map(|(h, (n, _))| (*h, *n > 0))
            .collect();
        Prior { rooted, stored }
    }

    /// Whether the balance of (`domain`, `hash`) has a row.
    fn is_stored(&self, domain: &RefDomain, hash: &Hash) -> bool {
        self.stored
            .get(hash)
            .is_some_and(|domains| domains.contains(domain))
    }
}

/// A row of [`lookups_sql`]: kind, domain, request id, hash (hex), revision (of a request),
/// when its collection began, balance.
type LookupRow = (
    i64,
    Option<String>,
    Option<String>,
    String,
    i64,
    Option<i64>,
    Option<i64>,
);

const LOOKUP_REQUEST: i64 = 0;
const LOOKUP_NODE: i64 = 1;

/// The statement of [`Partition::lookups`], in rows of one shape (`kind`, `ref_domain`,
/// `request_id`, `hash`, `n`, `collecting_since`, `balance`): the earlier requests among
/// `ids` in `domains`, then each node of `hashes` with its balance in each domain that has
/// one (a row a node, or one for each such domain: the driver's work is by row), whose sum is
/// its count. Each part names the partition and the keys (and the domains), and seeks its
/// index by them.
fn lookups_sql(
    mut q: Statement,
    (app, space): (&str, &str),
    domains: &BTreeSet<&str>,
    ids: &BTreeSet<&str>,
    hashes: &BTreeSet<Hash>,
) -> Statement {
    q.text(&format!(
        "SELECT CAST({LOOKUP_REQUEST} AS BIGINT) AS kind, ref_domain, request_id, \
         payload_hash AS hash, revision AS n, CAST(NULL AS BIGINT) AS collecting_since, \
         CAST(NULL AS BIGINT) AS balance FROM root_ref_requests WHERE "
    ));
    requests_among(&mut q, (app, space), domains, ids);
    if hashes.is_empty() {
        return q;
    }
    q.text(&format!(
        " UNION ALL SELECT {LOOKUP_NODE}, b.ref_domain, CAST(NULL AS TEXT), n.hash, \
         CAST(0 AS BIGINT), n.collecting_since, b.ref_count FROM nodes n \
         LEFT JOIN root_ref_balances b ON b.app_id = n.app_id AND b.space_id = n.space_id \
         AND b.hash = n.hash WHERE "
    ))
    .nodes_in("n.", (app, space), hashes);
    q
}

/// Appends the condition on `root_ref_requests` that finds a partition's requests among
/// `ids` in `domains` (it seeks the table's key).
pub(super) fn requests_among(
    q: &mut Statement,
    (app, space): (&str, &str),
    domains: &BTreeSet<&str>,
    ids: &BTreeSet<&str>,
) {
    let text = |s: &str| Value::Text(s.to_string());
    q.text("app_id = ")
        .value(text(app))
        .text(" AND space_id = ")
        .value(text(space))
        .text(" AND ref_domain IN ")
        .tuple(domains.iter().map(|d| text(d)))
        .text(" AND request_id IN ")
        .tuple(ids.iter().map(|id| text(id)));
}

/// The domains the updates belong to.
pub(super) fn domains_of<'a>(updates: &[RootRefChange<'a>]) -> BTreeSet<&'a str> {
    updates.iter().map(|u| u.domain.as_str()).collect()
}

/// The updates' request ids.
pub(super) fn ids_of<'a>(updates: &[RootRefChange<'a>]) -> BTreeSet<&'a str> {
    updates.iter().map(|u| u.request_id.as_str()).collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Each part of a batch's lookups, the update of its nodes' flags and of its stored
    /// balances, and the deletion of balances that reached zero seek their index by the whole
    /// key: without the domain the
    /// lookups would read every request and every balance the partition ever had, once per
    /// batch, and an update that binds the partition once is planned on SQLite as a scan of
    /// the partition's every node.
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
        let mut explain = Statement::new(Dialect::Sqlite);
        explain.text("EXPLAIN QUERY PLAN ");
        let hashes: BTreeSet<Hash> = (0..3u8).map(|i| Hash::digest(&[i])).collect();
        let lookups = lookups_sql(
            explain,
            ("app", "space"),
            &["default", "other"].into(),
            &["a", "b", "c"].into(),
            &hashes,
        );
        let plan = plan_of(&store, lookups.query()).await;
        let mut explain = Statement::new(Dialect::Sqlite);
        explain.text("EXPLAIN QUERY PLAN ");
        let default = RefDomain::default();
        let keys: Vec<(&RefDomain, Hash)> = hashes.iter().map(|h| (&default, *h)).collect();
        delete_balances(&mut explain, ("app", "space"), &keys);
        let deletion = plan_of(&store, explain.query()).await;
        let mut explain = Statement::new(Dialect::Sqlite);
        explain.text("EXPLAIN QUERY PLAN ").update_nodes(
            ("app", "space"),
            "rooted = v.column2",
            hashes.iter().map(|h| (*h, vec![Value::Int(1)])),
        );
        let update = plan_of(&store, explain.query()).await;
        let mut w = Writes::new(Statement::new(Dialect::Sqlite));
        w.text("EXPLAIN QUERY PLAN ");
        balance_updates(
            &mut w,
            ("app", "space"),
            keys.iter().map(|(d, h)| (*d, h, 1)),
        );
        let in_place = plan_of(&store, w.finish()).await;
        for (index, seek) in [
            ("root_ref_requests", "ref_domain=? AND request_id=?"),
            ("nodes", "space_id=? AND hash=?"),
        ] {
            assert!(
                plan.iter().any(|step| step
                    .contains(&format!("INDEX sqlite_autoindex_{index}_1 "))
                    && step.contains(seek)),
                "{index}: {plan:?}"
            );
        }
        // A node's balances in every domain, whose sum is its count, are read by its key.
        assert!(
            plan.iter().any(|step| step
                .contains("INDEX root_ref_balances_by_hash (app_id=? AND space_id=? AND hash=?)")),
            "balances: {plan:?}"
        );
        assert!(
            update
                .iter()
                .any(|step| step.contains("(app_id=? AND space_id=? AND hash=?)")),
            "node update: {update:?}"
        );
        assert!(
            deletion
                .iter()
                .any(|step| step.contains("ref_domain=? AND hash=?")),
            "deletion: {deletion:?}"
        );
        assert!(
            in_place
                .iter()
                .any(|step| step.contains("app_id=? AND space_id=? AND ref_domain=? AND hash=?")),
            "balance update: {in_place:?}"
        );
        store.pool().close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The steps of a statement's query plan (`explain`: an `EXPLAIN QUERY PLAN`).
    pub(in crate::meta) async fn plan_of(
        store: &super::super::MetaStore,
        explain: sqlx::query::Query<'static, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> Vec<String> {
        explain
            .fetch_all(store.pool())
            .await
            .expect("plan")
            .iter()
            .map(|r| r.try_get::<String, _>("detail").expect("detail"))
            .collect()
    }
}
