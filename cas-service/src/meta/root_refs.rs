//! Root references: one transaction per accepted update (idempotency, App-global revision,
//! counts, event, versioned balance projection), and reads of balances and events at one
//! revision.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cas_format::{AppId, Hash, RequestId, SpaceId};
use sqlx::Row;

use super::{MetaStore, Partition, hash_col, hb, id_col, placeholders, value_rows};

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

/// One event of the App-global root-ref stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootRefEvent {
    pub revision: i64,
    pub space_id: SpaceId,
    pub request_id: String,
    /// JSON object of hash to delta.
    pub changes: String,
    pub actor: String,
    pub applied_at: i64,
}

/// Which balances or events to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct RefFilter<'a> {
    pub space: Option<&'a SpaceId>,
    pub hash: Option<&'a Hash>,
}

enum Bind {
    Text(String),
    Bytes(Vec<u8>),
}

/// Where a page of balances continues: after (space, hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceCursor {
    pub space: Option<SpaceId>,
    pub hash: Hash,
}

/// One root-ref update of a batch that [`Partition::update_root_refs_many`] applies together.
#[derive(Debug, Clone, Copy)]
pub struct RootRefChange<'a> {
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

/// How many hashes one combined statement names at most (both databases bind far more).
pub const MAX_BATCH_HASHES: usize = 4000;

impl Partition {
    /// Applies one root-ref update, or replays it. Returns `(revision, idempotent)`.
    pub async fn update_root_refs(
        &mut self,
        request_id: &RequestId,
        changes: &BTreeMap<Hash, i64>,
        payload_hash: &Hash,
        actor: &str,
        now: i64,
    ) -> Result<RootRefOutcome, sqlx::Error> {
        let change = RootRefChange {
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
        let (planned, steps) = plan(updates, &earlier, counts);
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
        // The final counts (absolute: the gate is held), from a VALUES list.
        let mut finals: BTreeMap<Hash, i64> = BTreeMap::new();
        // Each hash's balance history in this batch: (revision, count after it).
        let mut history: BTreeMap<Hash, Vec<(i64, i64)>> = BTreeMap::new();
        for (k, step) in steps.iter().enumerate() {
            for (hash, count) in &step.results {
                finals.insert(*hash, *count);
                history
                    .entry(*hash)
                    .or_default()
                    .push((base + 1 + k as i64, *count));
            }
        }
        let values = value_rows(3, 2, finals.len(), |p| format!("({})", p.join(", ")));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE nodes SET root_ref_count = v.column2 FROM (VALUES {values}) AS v \
             WHERE nodes.app_id = $1 AND nodes.space_id = $2 AND nodes.hash = v.column1"
        )))
        .bind(app.as_str())
        .bind(space.as_str());
        for (hash, count) in &finals {
            q = q.bind(hb(hash)).bind(*count);
        }
        q.execute(&mut **self.tx()).await?;
        // The open balance of each hash closes at the first revision that changes it.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE root_ref_balances SET revision_to = v.column2 FROM (VALUES {values}) AS v \
             WHERE root_ref_balances.app_id = $1 AND root_ref_balances.space_id = $2 \
             AND root_ref_balances.revision_to IS NULL AND root_ref_balances.hash = v.column1"
        )))
        .bind(app.as_str())
        .bind(space.as_str());
        for (hash, revisions) in &history {
            q = q.bind(hb(hash)).bind(revisions[0].0);
        }
        q.execute(&mut **self.tx()).await?;
        // Then one row per positive count, open until the next revision that changes it.
        let rows: Vec<(&Hash, i64, i64, Option<i64>)> = history
            .iter()
            .flat_map(|(hash, revisions)| {
                revisions
                    .iter()
                    .enumerate()
                    .filter_map(move |(i, (from, count))| {
                        let to = revisions.get(i + 1).map(|(next, _)| *next);
                        (*count > 0).then_some((hash, *count, *from, to))
                    })
            })
            .collect();
        if !rows.is_empty() {
            let values = value_rows(3, 4, rows.len(), |p| format!("($1, $2, {})", p.join(", ")));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO root_ref_balances \
                 (app_id, space_id, hash, ref_count, revision_from, revision_to) VALUES {values}"
            )))
            .bind(app.as_str())
            .bind(space.as_str());
            for (hash, count, from, to) in rows {
                q = q.bind(hb(hash)).bind(count).bind(from).bind(to);
            }
            q.execute(&mut **self.tx()).await?;
        }
        let values = value_rows(4, 4, steps.len(), |p| {
            format!("($1, {}, $2, {}, {}, {}, $3)", p[0], p[1], p[2], p[3])
        });
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO root_ref_events \
             (app_id, revision, space_id, request_id, changes, actor, applied_at) VALUES {values}"
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(now);
        for (k, step) in steps.iter().enumerate() {
            let u = &updates[step.update];
            let changes_json =
                serde_json::to_string(u.changes).unwrap_or_else(|_| "{}".to_string());
            q = q
                .bind(base + 1 + k as i64)
                .bind(u.request_id.as_str())
                .bind(changes_json)
                .bind(u.actor);
        }
        q.execute(&mut **self.tx()).await?;
        let values = value_rows(3, 3, steps.len(), |p| format!("($1, $2, {})", p.join(", ")));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO root_ref_requests (app_id, space_id, request_id, payload_hash, revision) \
             VALUES {values}"
        )))
        .bind(app.as_str())
        .bind(space.as_str());
        for (k, step) in steps.iter().enumerate() {
            let u = &updates[step.update];
            q = q
                .bind(u.request_id.as_str())
                .bind(hb(u.payload_hash))
                .bind(base + 1 + k as i64);
        }
        q.execute(&mut **self.tx()).await?;
        Ok(finish(planned, base))
    }

    /// The rows that `select` (a `SELECT … FROM table`) finds in this partition whose
    /// `column` is one of `keys`.
    async fn rows_in<T>(
        &mut self,
        select: &str,
        column: &str,
        keys: Vec<T>,
    ) -> Result<Vec<sqlx::any::AnyRow>, sqlx::Error>
    where
        T: for<'q> sqlx::Encode<'q, sqlx::Any> + sqlx::Type<sqlx::Any> + Send + 'static,
    {
        let sql = format!(
            "{select} WHERE app_id = $1 AND space_id = $2 AND {column} IN ({})",
            placeholders(3, keys.len())
        );
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(self.app.as_str().to_string())
            .bind(self.space.as_str().to_string());
        for key in keys {
            q = q.bind(key);
        }
        q.fetch_all(&mut **self.tx()).await
    }

    /// The requests of this partition among the updates' ids that were applied before:
    /// request id to (payload hash, revision).
    async fn earlier_requests(
        &mut self,
        updates: &[RootRefChange<'_>],
    ) -> Result<HashMap<String, (Vec<u8>, i64)>, sqlx::Error> {
        let ids: BTreeSet<&str> = updates.iter().map(|u| u.request_id.as_str()).collect();
        self.rows_in(
            "SELECT request_id, payload_hash, revision FROM root_ref_requests",
            "request_id",
            ids.into_iter().map(str::to_string).collect(),
        )
        .await?
        .iter()
        .map(|r| {
            Ok((
                r.try_get("request_id")?,
                (r.try_get("payload_hash")?, r.try_get("revision")?),
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
            "SELECT hash, root_ref_count, collecting_since FROM nodes",
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

/// An accepted update: which one, and the counts it leaves.
struct Step {
    update: usize,
    results: Vec<(Hash, i64)>,
}

/// Decides every update in order against the running counts: replays (of earlier requests or
/// of one earlier in the batch), refusals, and the accepted steps in revision order.
fn plan(
    updates: &[RootRefChange<'_>],
    earlier: &HashMap<String, (Vec<u8>, i64)>,
    mut counts: HashMap<Hash, (i64, bool)>,
) -> (Vec<Planned>, Vec<Step>) {
    let mut steps: Vec<Step> = Vec::new();
    // Request ids accepted in this batch: payload hash and step number (1..).
    let mut in_batch: HashMap<&str, (&Hash, i64)> = HashMap::new();
    let planned = updates
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let id = u.request_id.as_str();
            if let Some((stored, revision)) = earlier.get(id) {
                return Planned::Done(if stored.as_slice() == u.payload_hash.as_bytes() {
                    Ok((*revision, true))
                } else {
                    Err(RootRefRejection::IdempotencyConflict)
                });
            }
            if let Some((payload, k)) = in_batch.get(id) {
                return if *payload == u.payload_hash {
                    Planned::Replayed(*k)
                } else {
                    Planned::Done(Err(RootRefRejection::IdempotencyConflict))
                };
            }
            match check(u.changes, &counts) {
                Err(rejection) => Planned::Done(Err(rejection)),
                Ok(results) => {
                    for (hash, count) in &results {
                        if let Some(c) = counts.get_mut(hash) {
                            c.0 = *count;
                        }
                    }
                    steps.push(Step { update: i, results });
                    let k = steps.len() as i64;
                    in_batch.insert(id, (u.payload_hash, k));
                    Planned::Applied(k)
                }
            }
        })
        .collect();
    (planned, steps)
}

/// The counts one update leaves, or why it is refused.
fn check(
    changes: &BTreeMap<Hash, i64>,
    counts: &HashMap<Hash, (i64, bool)>,
) -> Result<Vec<(Hash, i64)>, RootRefRejection> {
    let mut results = Vec::with_capacity(changes.len());
    for (hash, delta) in changes {
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
        if result > MAX_ROOT_REF_COUNT {
            return Err(RootRefRejection::Overflow(*hash));
        }
        results.push((*hash, result));
    }
    Ok(results)
}

fn event_from_row(r: &sqlx::any::AnyRow) -> Result<RootRefEvent, sqlx::Error> {
    Ok(RootRefEvent {
        revision: r.try_get("revision")?,
        space_id: id_col(r, "space_id")?,
        request_id: r.try_get("request_id")?,
        changes: r.try_get("changes")?,
        actor: r.try_get("actor")?,
        applied_at: r.try_get("applied_at")?,
    })
}

impl MetaStore {
    /// The App's current revision, or `None` for an unknown App.
    pub async fn app_revision(&self, app: &AppId) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query("SELECT revision FROM apps WHERE app_id = $1")
            .bind(app.as_str())
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get("revision"))
            .transpose()
    }

    /// Balances as they were at `revision`, ordered by (space, hash), after `cursor`, filtered.
    pub async fn balances_at(
        &self,
        app: &AppId,
        filter: RefFilter<'_>,
        revision: i64,
        cursor: Option<&BalanceCursor>,
        limit: i64,
    ) -> Result<Vec<(SpaceId, Hash, i64)>, sqlx::Error> {
        let mut sql = String::from(
            "SELECT space_id, hash, ref_count FROM root_ref_balances WHERE app_id = $1 \
             AND revision_from <= $2 AND (revision_to IS NULL OR revision_to > $2)",
        );
        let mut n = 3;
        let mut binds: Vec<Bind> = Vec::new();
        if let Some(space) = filter.space {
            sql.push_str(&format!(" AND space_id = ${n}"));
            binds.push(Bind::Text(space.as_str().to_string()));
            n += 1;
        }
        if let Some(hash) = filter.hash {
            sql.push_str(&format!(" AND hash = ${n}"));
            binds.push(Bind::Bytes(hb(hash)));
            n += 1;
        }
        if let Some(c) = cursor {
            let space = c
                .space
                .as_ref()
                .or(filter.space)
                .map(|s| s.as_str().to_string())
                .unwrap_or_default();
            sql.push_str(&format!(
                " AND (space_id > ${n} OR (space_id = ${n} AND hash > ${}))",
                n + 1
            ));
            binds.push(Bind::Text(space));
            binds.push(Bind::Bytes(hb(&c.hash)));
            n += 2;
        }
        sql.push_str(&format!(" ORDER BY space_id, hash LIMIT ${n}"));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(app.as_str())
            .bind(revision);
        for b in binds {
            q = match b {
                Bind::Text(t) => q.bind(t),
                Bind::Bytes(v) => q.bind(v),
            };
        }
        q.bind(limit)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| {
                Ok((
                    id_col(r, "space_id")?,
                    hash_col(r, "hash")?,
                    r.try_get("ref_count")?,
                ))
            })
            .collect()
    }

    /// Events with `after < revision <= upto`, ascending, filtered (a hash filter keeps the
    /// events whose changes name it).
    pub async fn events(
        &self,
        app: &AppId,
        filter: RefFilter<'_>,
        after: i64,
        upto: i64,
        limit: i64,
    ) -> Result<Vec<RootRefEvent>, sqlx::Error> {
        let mut sql = String::from(
            "SELECT revision, space_id, request_id, changes, actor, applied_at FROM root_ref_events \
             WHERE app_id = $1 AND revision > $2 AND revision <= $3",
        );
        let mut n = 4;
        let mut binds = Vec::new();
        if let Some(space) = filter.space {
            sql.push_str(&format!(" AND space_id = ${n}"));
            binds.push(space.as_str().to_string());
            n += 1;
        }
        if let Some(hash) = filter.hash {
            sql.push_str(&format!(" AND changes LIKE ${n}"));
            binds.push(format!("%\"{hash}\"%"));
            n += 1;
        }
        sql.push_str(&format!(" ORDER BY revision LIMIT ${n}"));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(app.as_str())
            .bind(after)
            .bind(upto);
        for b in binds {
            q = q.bind(b);
        }
        q.bind(limit)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(event_from_row)
            .collect()
    }

    /// The sum of every event's delta per (space, hash) of an App (for consistency checks).
    pub async fn event_sums(
        &self,
        app: &AppId,
    ) -> Result<BTreeMap<(String, Hash), i64>, sqlx::Error> {
        let mut sums: BTreeMap<(String, Hash), i64> = BTreeMap::new();
        let mut after = 0;
        loop {
            let batch = self
                .events(app, RefFilter::default(), after, i64::MAX, 1000)
                .await?;
            let Some(last) = batch.last() else { break };
            after = last.revision;
            for e in &batch {
                let changes: BTreeMap<Hash, i64> = serde_json::from_str(&e.changes)
                    .map_err(|err| sqlx::Error::Decode(Box::new(err)))?;
                for (h, d) in changes {
                    *sums
                        .entry((e.space_id.as_str().to_string(), h))
                        .or_default() += d;
                }
            }
        }
        sums.retain(|_, v| *v != 0);
        Ok(sums)
    }
}
