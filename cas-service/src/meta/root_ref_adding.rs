//! A root-ref batch on SQLite that only adds, written without being read first.
//!
//! When every change of a batch is positive (the usual case: references taken), no update of
//! it can be refused for a count going below zero, and one that is refused for another reason
//! (a node absent or being collected, a count or balance past the limit, a balance brought to
//! zero, which is not stored) is one that the statement can find as it writes. So the batch's
//! changes are summed per (domain, node) and added in one round trip, inside a savepoint of its
//! own, each balance only where it stays valid, with the App's revision, the events and the
//! request rows, each request only if its id is new (one used before is a replay or a
//! conflict, which the full path answers), and the nodes named are counted where they are
//! there, not being collected, and their counts (the sums of their balances, as added to) in
//! range. When every balance and request was written and every node counted, the nodes whose
//! counts left zero get their `rooted` flags in the round trip that releases the savepoint,
//! and the batch is exactly what the full path would have written. When one was not, the
//! savepoint is rolled back and the full path (`Partition::apply_read_first`) decides, so
//! every outcome is the one the full path gives. A batch with a negative change goes to the
//! full path at once.
//! Nothing is read first, not even the earlier requests: a retried request costs the round
//! trip of the additions it undoes, and every other one saves the round trip of the read.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cas_format::{Hash, RefDomain};
use sqlx::Row;

use super::root_ref_plan::{Planned, Requests, outcomes, plan};
use super::root_ref_writes::{Writes, balance_rows, event_parts, revision_part};
use super::root_refs::{MAX_ROOT_REF_COUNT, RootRefChange, RootRefOutcome, RootRefRejection};
use super::{Partition, Statement};

/// The savepoint the additions are made in.
const SAVEPOINT: &str = "unicas_root_refs";

/// What the additions wrote: the App's new revision, how many balance and request rows, how
/// many of the nodes named are there to take them, and how many of those are not rooted yet.
struct Written {
    revision: i64,
    nodes: i64,
    unrooted: i64,
    balances: i64,
    requests: i64,
}

impl Partition {
    /// Applies `updates` as additions when every change is positive and every row could be
    /// written; `None`, with nothing changed, otherwise (or when the batch has nothing to
    /// write), for the full path to decide.
    pub(super) async fn try_adding(
        &mut self,
        updates: &[RootRefChange<'_>],
        now: i64,
    ) -> Result<Option<Vec<RootRefOutcome>>, sqlx::Error> {
        if updates.iter().any(|u| u.changes.values().any(|d| *d <= 0)) {
            return Ok(None);
        }
        // Planned from nothing, as if no id was used before, every update that is not a replay
        // of one earlier in the batch is accepted (a sum past the limit aside, which the rows
        // refuse as well): the outcomes, if every row is written.
        let counts = updates
            .iter()
            .flat_map(|u| u.changes.keys())
            .map(|h| (*h, (0, true)))
            .collect();
        let (planned, steps) = plan(updates, &Requests::new(), counts, HashMap::new());
        let order: Vec<usize> = steps.iter().map(|s| s.update).collect();
        let refused = planned.iter().any(
            |p| matches!(p, Planned::Done(Err(r)) if *r != RootRefRejection::IdempotencyConflict),
        );
        if order.is_empty() || refused {
            return Ok(None);
        }
        let mut nodes: BTreeSet<Hash> = BTreeSet::new();
        let mut by_balance: BTreeMap<(&RefDomain, Hash), i64> = BTreeMap::new();
        for &i in &order {
            for (hash, delta) in updates[i].changes {
                nodes.insert(*hash);
                *by_balance.entry((updates[i].domain, *hash)).or_default() += delta;
            }
        }
        let written = match self.add(updates, &order, &nodes, &by_balance, now).await {
            Ok(written) => written,
            // The full path decides (and meets the failure again if it lasts), unless the
            // savepoint is gone with the transaction.
            Err(e) => return self.roll_back().await.map(|()| None).map_err(|_| e),
        };
        if written.nodes != nodes.len() as i64
            || written.balances != by_balance.len() as i64
            || written.requests != order.len() as i64
        {
            return self.roll_back().await.map(|()| None);
        }
        // The flags of the nodes whose counts leave zero, in the round trip that releases the
        // savepoint (most batches add to nodes already referenced, and write no node row).
        let mut q = self.statement();
        if written.unrooted > 0 {
            rooted_nodes(&mut q, (self.app.as_str(), self.space.as_str()), &nodes);
            q.text("; ");
        }
        q.text(&format!("RELEASE {SAVEPOINT}"));
        q.query().execute(&mut **self.tx()).await?;
        Ok(Some(outcomes(
            planned,
            written.revision - order.len() as i64,
        )))
    }

    /// Opens the savepoint and adds the batch's sums where each row stays valid, with the
    /// App's revision, the events and the requests whose ids are new; returns the App's new
    /// revision and how many rows were written.
    async fn add(
        &mut self,
        updates: &[RootRefChange<'_>],
        order: &[usize],
        nodes: &BTreeSet<Hash>,
        by_balance: &BTreeMap<(&RefDomain, Hash), i64>,
        now: i64,
    ) -> Result<Written, sqlx::Error> {
        let (app, space) = (self.app.as_str(), self.space.as_str());
        let mut q = self.statement();
        q.text(&format!("SAVEPOINT {SAVEPOINT}; "));
        let mut w = Writes::new(q);
        revision_part(&mut w, app, order.len() as i64);
        let rows = by_balance
            .iter()
            .map(|((domain, hash), d)| (*domain, hash, *d));
        balance_rows(&mut w, (app, space), rows);
        // A balance is written only while it stays in range and does not reach zero (a
        // balance below zero is one domain releasing what another took).
        w.text(&format!(
            " ON CONFLICT (app_id, space_id, ref_domain, hash) DO UPDATE SET ref_count = \
             root_ref_balances.ref_count + excluded.ref_count \
             WHERE root_ref_balances.ref_count + excluded.ref_count <> 0 \
             AND root_ref_balances.ref_count <= {MAX_ROOT_REF_COUNT} - excluded.ref_count; \
             SELECT changes() AS balances_written; "
        ));
        counted_nodes(&mut w, (app, space), nodes);
        event_parts(&mut w, (app, space), updates, order, now);
        // The request rows' part ends the text; `WHERE true` keeps SQLite from reading the
        // upsert's `ON` as a join's.
        w.text(
            " WHERE true ON CONFLICT (app_id, space_id, ref_domain, request_id) DO NOTHING; \
             SELECT changes() AS requests_written",
        );
        // All rows: on SQLite a query that stops at its first row leaves the later
        // statements unrun.
        let rows = w.finish().fetch_all(&mut **self.tx()).await?;
        let (mut revision, mut nodes, mut balances, mut requests) = (None, None, None, None);
        for r in &rows {
            if let Ok(n) = r.try_get::<i64, _>("revision") {
                revision = Some(n);
            } else if let Ok(n) = r.try_get::<i64, _>("nodes_written") {
                nodes = Some((n, r.try_get::<i64, _>("nodes_unrooted")?));
            } else if let Ok(n) = r.try_get::<i64, _>("balances_written") {
                balances = Some(n);
            } else if let Ok(n) = r.try_get::<i64, _>("requests_written") {
                requests = Some(n);
            }
        }
        match (revision, nodes, balances, requests) {
            (Some(revision), Some((nodes, unrooted)), Some(balances), Some(requests)) => {
                Ok(Written {
                    revision,
                    nodes,
                    unrooted,
                    balances,
                    requests,
                })
            }
            _ => Err(sqlx::Error::Protocol(
                "the additions of a root-ref batch did not report their rows".into(),
            )),
        }
    }

    /// Undoes the additions.
    async fn roll_back(&mut self) -> Result<(), sqlx::Error> {
        let sql = format!("ROLLBACK TO {SAVEPOINT}; RELEASE {SAVEPOINT}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut **self.tx())
            .await
            .map(|_| ())
    }
}

/// Appends the setting of the `rooted` flag of the nodes among `nodes` that are not rooted
/// and not being collected.
fn rooted_nodes(q: &mut Statement, partition: (&str, &str), nodes: &BTreeSet<Hash>) {
    q.text("UPDATE nodes SET rooted = 1 WHERE ")
        .nodes_in("", partition, nodes)
        .text(" AND rooted = 0 AND collecting_since IS NULL");
}

/// Appends the count of the nodes among `nodes` that are there, not being collected, with
/// their counts (the sums of their balances, as the batch added to them) in range, as
/// `nodes_written`, and of those not rooted yet, as `nodes_unrooted`.
fn counted_nodes(q: &mut Statement, partition: (&str, &str), nodes: &BTreeSet<Hash>) {
    q.text(&format!(
        "SELECT COUNT(*) AS nodes_written, \
         COALESCE(SUM(CASE WHEN n.rooted = 0 THEN 1 ELSE 0 END), 0) AS nodes_unrooted \
         FROM nodes n WHERE n.collecting_since IS NULL \
         AND (SELECT SUM(t.ref_count) FROM root_ref_balances t WHERE t.app_id = n.app_id \
         AND t.space_id = n.space_id AND t.hash = n.hash) <= {MAX_ROOT_REF_COUNT} AND "
    ))
    .nodes_in("n.", partition, nodes);
}

#[cfg(test)]
mod tests {
    use super::super::{Dialect, MetaStore, Statement, Value, hb};
    use super::*;
    use cas_format::{AppId, RequestId, SpaceId};
    use rand::{Rng, SeedableRng};
    use sqlx::Connection;

    /// Where a test store lives: a folder (SQLite) or a database of its own on the test
    /// Postgres (`UNICAS_TEST_PG_URL`, by default the local server), dropped afterwards.
    enum Place {
        Sqlite(std::path::PathBuf),
        Postgres(String),
    }

    fn pg_admin_url() -> String {
        std::env::var("UNICAS_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
    }

    async fn pg_admin(sql: String) {
        let mut conn = sqlx::postgres::PgConnection::connect(&pg_admin_url())
            .await
            .expect("the test Postgres (UNICAS_TEST_PG_URL)");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("admin statement");
        let _ = conn.close().await;
    }

    impl Place {
        async fn remove(self) {
            match self {
                Place::Sqlite(dir) => {
                    let _ = std::fs::remove_dir_all(dir);
                }
                Place::Postgres(name) => {
                    pg_admin(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await
                }
            }
        }
    }

    /// A store of `dialect` with one App and `nodes` nodes in partition (a, s), every
    /// fifteenth being collected.
    async fn store(dialect: Dialect, name: &str, nodes: &[Hash]) -> (MetaStore, Place) {
        let tag = format!("unicas_adding_{}_{name}", std::process::id());
        let (config, place) = match dialect {
            Dialect::Sqlite => {
                let dir = std::env::temp_dir().join(&tag);
                let config = crate::config::Config {
                    data_dir: dir.clone(),
                    ..Default::default()
                };
                (config, Place::Sqlite(dir))
            }
            Dialect::Postgres => {
                pg_admin(format!("DROP DATABASE IF EXISTS {tag} WITH (FORCE)")).await;
                pg_admin(format!("CREATE DATABASE {tag}")).await;
                let admin = pg_admin_url();
                let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
                let config = crate::config::Config {
                    database_url: Some(format!("{base}/{tag}")),
                    database_max_connections: 2,
                    ..Default::default()
                };
                (config, Place::Postgres(tag))
            }
        };
        let store = MetaStore::connect(&config).await.expect("store");
        store.migrate().await.expect("migrate");
        sqlx::query("INSERT INTO apps (app_id, issuer, created_at) VALUES ('a', 'i', 0)")
            .execute(store.pool())
            .await
            .expect("app");
        for (k, chunk) in nodes.chunks(500).enumerate() {
            let mut q = Statement::new(dialect);
            q.text(
                "INSERT INTO nodes (app_id, space_id, hash, size, content_type, ref_count, \
                 object_gen, encoding, stored_bytes, lease_started_at, lease_expires_at, \
                 created_at, collecting_since) SELECT 'a', 's', v.column1, 1, 'raw', 0, 'g', \
                 'identity', 1, 0, 0, 0, CASE WHEN v.column2 = 1 THEN 1 END FROM (VALUES ",
            );
            for (i, h) in chunk.iter().enumerate() {
                let collecting = (k * 500 + i) % 15 == 14;
                q.comma(i)
                    .tuple([Value::Bytes(hb(h)), Value::Int(collecting as i64)]);
            }
            q.text(") AS v");
            q.query().execute(store.pool()).await.expect("nodes");
        }
        (store, place)
    }

    /// Everything a root-ref batch writes, as text rows, in a fixed order.
    async fn state(store: &MetaStore) -> Vec<String> {
        let queries = [
            "SELECT 'app', revision FROM apps",
            "SELECT 'node', hash, CAST(rooted AS BIGINT) FROM nodes ORDER BY hash",
            "SELECT 'balance', ref_domain, hash, ref_count FROM root_ref_balances \
             ORDER BY ref_domain, hash",
            "SELECT 'event', revision, ref_domain, request_id, changes, actor, applied_at \
             FROM root_ref_events ORDER BY revision",
            "SELECT 'request', ref_domain, request_id, payload_hash, revision \
             FROM root_ref_requests ORDER BY ref_domain, request_id",
        ];
        let mut out = Vec::new();
        for q in queries {
            for row in sqlx::query(q).fetch_all(store.pool()).await.expect("state") {
                let cells: Vec<String> = (0..row.len())
                    .map(|i| {
                        if let Ok(n) = row.try_get::<Option<i64>, _>(i) {
                            format!("{n:?}")
                        } else if let Ok(t) = row.try_get::<String, _>(i) {
                            t
                        } else {
                            format!("{:?}", row.try_get::<Vec<u8>, _>(i).expect("cell"))
                        }
                    })
                    .collect();
                out.push(cells.join(" "));
            }
        }
        out
    }

    /// Random batches (replays of earlier and of in-batch requests, the same id with another
    /// payload, two domains, releases to zero and below and additions back from there, nodes
    /// unknown or being collected, counts past the limit) give the same outcomes and leave
    /// the same rows whether a batch that only adds is written without being read or every
    /// batch is read first; and both ways are taken.
    #[tokio::test]
    async fn adding_without_reading_gives_what_reading_first_gives() {
        let dialect = Dialect::Sqlite;
        let nodes: Vec<Hash> = (0..30u32).map(|i| Hash::digest(&i.to_le_bytes())).collect();
        let unknown = Hash::digest(b"not stored");
        let ((first, first_place), (second, second_place)) = (
            store(dialect, "w", &nodes).await,
            store(dialect, "r", &nodes).await,
        );
        let (app, space): (AppId, SpaceId) = ("a".parse().unwrap(), "s".parse().unwrap());
        let domains: [RefDomain; 2] = [RefDomain::default(), "other".parse().unwrap()];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (mut added, mut read) = (0, 0);
        for batch in 0..400 {
            let n = rng.random_range(1..8);
            // Half the batches only add.
            let adding = rng.random_bool(0.5);
            let fresh = rng.random_bool(0.5);
            let mut ids = Vec::new();
            let mut changes = Vec::new();
            let mut payloads = Vec::new();
            let mut doms = Vec::new();
            for _ in 0..n {
                // Ids repeat within batches, and across them in half the batches.
                let id = match fresh {
                    true => format!("f{batch}-{}", rng.random_range(0..n)),
                    false => format!("r{}", rng.random_range(0..(batch + 3))),
                };
                ids.push(id.parse::<RequestId>().unwrap());
                let mut c = BTreeMap::new();
                for _ in 0..rng.random_range(1..4) {
                    let hash = if rng.random_bool(0.02) {
                        unknown
                    } else {
                        nodes[rng.random_range(0..nodes.len())]
                    };
                    let delta = match rng.random_range(0..100) {
                        0..3 => MAX_ROOT_REF_COUNT,
                        1..40 if !adding => -1,
                        40..45 if !adding => -2,
                        45..50 => 2,
                        _ => 1,
                    };
                    c.insert(hash, delta);
                }
                payloads.push(Hash::digest(format!("{c:?}").as_bytes()));
                changes.push(c);
                doms.push(rng.random_range(0..2));
            }
            let updates: Vec<RootRefChange> = (0..n)
                .map(|k| RootRefChange {
                    domain: &domains[doms[k]],
                    request_id: &ids[k],
                    changes: &changes[k],
                    payload_hash: &payloads[k],
                    actor: "t",
                })
                .collect();
            let mut p = first.gate(&app, &space).await.expect("gate");
            let got = match p.try_adding(&updates, batch as i64).await.expect("write") {
                Some(outcomes) => {
                    added += 1;
                    outcomes
                }
                None => {
                    read += 1;
                    p.apply_read_first(&updates, batch as i64)
                        .await
                        .expect("read")
                }
            };
            p.commit().await.expect("commit");
            let mut p = second.gate(&app, &space).await.expect("gate");
            let want = p
                .apply_read_first(&updates, batch as i64)
                .await
                .expect("read");
            p.commit().await.expect("commit");
            assert_eq!(got, want, "batch {batch}");
        }
        assert_eq!(state(&first).await, state(&second).await);
        assert!(
            added > 50 && read > 50,
            "{added} added without reading, {read} read first"
        );
        first.pool().close().await;
        second.pool().close().await;
        first_place.remove().await;
        second_place.remove().await;
    }

    /// The flags and the count of a batch's nodes seek each node (and its balances) by the
    /// whole key, so that their cost does not grow with the partition.
    #[tokio::test]
    async fn the_nodes_of_additions_are_sought_by_key() {
        let (store, place) = store(Dialect::Sqlite, "plan", &[]).await;
        let nodes: BTreeSet<Hash> = (0..3u8).map(|i| Hash::digest(&[i])).collect();
        let node_seek = "INDEX sqlite_autoindex_nodes_1 (app_id=? AND space_id=? AND hash=?)";
        let balance_seek = "INDEX root_ref_balances_by_hash (app_id=? AND space_id=? AND hash=?)";
        type Part = fn(&mut Statement, (&str, &str), &BTreeSet<Hash>);
        let parts: [(Part, &[&str]); 2] = [
            (rooted_nodes, &[node_seek]),
            (counted_nodes, &[node_seek, balance_seek]),
        ];
        for (part, seeks) in parts {
            let mut q = Statement::new(Dialect::Sqlite);
            q.text("EXPLAIN QUERY PLAN ");
            part(&mut q, ("a", "s"), &nodes);
            let plan = super::super::root_refs::tests::plan_of(&store, q.query()).await;
            for seek in seeks {
                assert!(plan.iter().any(|s| s.contains(seek)), "{seek}: {plan:?}");
            }
            assert!(
                !plan.iter().any(|s| s.starts_with("SCAN n")),
                "no scan of the nodes: {plan:?}"
            );
        }
        store.pool().close().await;
        place.remove().await;
    }

    #[tokio::test]
    async fn a_full_batch_fits_its_statements_on_sqlite() {
        a_full_batch_fits_its_statements(Dialect::Sqlite).await
    }

    #[tokio::test]
    async fn a_full_batch_fits_its_statements_on_postgres() {
        a_full_batch_fits_its_statements(Dialect::Postgres).await
    }

    /// A batch naming as many hashes as one may ([`MAX_BATCH_HASHES`]) is within what one
    /// statement binds, on either path: one that only adds (on SQLite, written without being
    /// read), then two with releases among their additions (read first, balances kept and
    /// balances brought to zero).
    async fn a_full_batch_fits_its_statements(dialect: Dialect) {
        use super::super::root_refs::MAX_BATCH_HASHES;
        let per = cas_format::wire::MAX_CHANGES;
        // Every fifteenth node is being collected: the others are the batch's.
        let all: Vec<Hash> = (0..(MAX_BATCH_HASHES * 15 / 14 + 1) as u32)
            .map(|i| Hash::digest(&i.to_le_bytes()))
            .collect();
        let (store, place) = store(dialect, "full", &all).await;
        let nodes: Vec<Hash> = (0..all.len())
            .filter(|i| i % 15 != 14)
            .map(|i| all[i])
            .take(MAX_BATCH_HASHES)
            .collect();
        assert_eq!(nodes.len(), MAX_BATCH_HASHES);
        let (app, space): (AppId, SpaceId) = ("a".parse().unwrap(), "s".parse().unwrap());
        let domain = RefDomain::default();
        for (round, deltas) in [(0, [1, 1]), (1, [1, -1]), (2, [-1, 1])] {
            let changes: Vec<BTreeMap<Hash, i64>> = nodes
                .chunks(per)
                .map(|c| {
                    c.iter()
                        .enumerate()
                        .map(|(i, h)| (*h, deltas[usize::from(i == 0)]))
                        .collect()
                })
                .collect();
            let ids: Vec<RequestId> = (0..changes.len())
                .map(|i| format!("full{round}-{i}").parse().unwrap())
                .collect();
            let payload = Hash::digest(b"p");
            let updates: Vec<RootRefChange> = changes
                .iter()
                .zip(&ids)
                .map(|(c, id)| RootRefChange {
                    domain: &domain,
                    request_id: id,
                    changes: c,
                    payload_hash: &payload,
                    actor: "t",
                })
                .collect();
            let mut p = store.gate(&app, &space).await.expect("gate");
            let got = p.update_root_refs_many(&updates, 1).await.expect("batch");
            p.commit().await.expect("commit");
            assert!(got.iter().all(|o| o.is_ok()), "round {round}: {got:?}");
        }
        store.pool().close().await;
        place.remove().await;
    }
}
