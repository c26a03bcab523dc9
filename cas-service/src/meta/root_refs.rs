//! Root references: one transaction per accepted update (idempotency, App-global revision,
//! counts, event, versioned balance projection), and reads of balances and events at one
//! revision.

use std::collections::BTreeMap;

use cas_format::{AppId, Hash, RequestId, SpaceId};
use sqlx::Row;

use super::{MetaStore, Partition, hash_col, hb, id_col, placeholders};

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

impl Partition {
    /// Applies one root-ref update, or replays it. Returns `(revision, idempotent)`.
    pub async fn update_root_refs(
        &mut self,
        request_id: &RequestId,
        changes: &BTreeMap<Hash, i64>,
        payload_hash: &Hash,
        actor: &str,
        now: i64,
    ) -> Result<Result<(i64, bool), RootRefRejection>, sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        if let Some(row) = sqlx::query(
            "SELECT payload_hash, revision FROM root_ref_requests \
             WHERE app_id = $1 AND space_id = $2 AND request_id = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(request_id.as_str())
        .fetch_optional(&mut **self.tx())
        .await?
        {
            let stored: Vec<u8> = row.try_get("payload_hash")?;
            let revision: i64 = row.try_get("revision")?;
            return Ok(if stored == payload_hash.as_bytes() {
                Ok((revision, true))
            } else {
                Err(RootRefRejection::IdempotencyConflict)
            });
        }
        // Up to 1000 changes: a handful of statements, not a few per hash.
        let hashes: Vec<Hash> = changes.keys().copied().collect();
        let current: BTreeMap<Hash, (i64, bool)> = {
            let sql = format!(
                "SELECT hash, root_ref_count, collecting_since FROM nodes \
                 WHERE app_id = $1 AND space_id = $2 AND hash IN ({})",
                placeholders(3, hashes.len())
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(app.as_str())
                .bind(space.as_str());
            for h in &hashes {
                q = q.bind(hb(h));
            }
            q.fetch_all(&mut **self.tx())
                .await?
                .iter()
                .map(|r| {
                    let collecting: Option<i64> = r.try_get("collecting_since")?;
                    Ok((
                        hash_col(r, "hash")?,
                        (r.try_get("root_ref_count")?, collecting.is_none()),
                    ))
                })
                .collect::<Result<_, sqlx::Error>>()?
        };
        let mut results = Vec::with_capacity(changes.len());
        for (hash, delta) in changes {
            let Some((count, ready)) = current.get(hash).copied() else {
                return Ok(Err(RootRefRejection::UnknownNode(*hash)));
            };
            if *delta > 0 && !ready {
                return Ok(Err(RootRefRejection::NotReady(*hash)));
            }
            let result = count + delta;
            if result < 0 {
                return Ok(Err(RootRefRejection::Negative {
                    hash: *hash,
                    result,
                }));
            }
            if result > MAX_ROOT_REF_COUNT {
                return Ok(Err(RootRefRejection::Overflow(*hash)));
            }
            results.push((*hash, result));
        }
        let revision: i64 = sqlx::query(
            "UPDATE apps SET revision = revision + 1 WHERE app_id = $1 RETURNING revision",
        )
        .bind(app.as_str())
        .fetch_one(&mut **self.tx())
        .await?
        .try_get("revision")?;
        // The new counts (absolute: the gate is held), from a VALUES list.
        let values = (0..results.len())
            .map(|i| format!("(${}, ${})", 3 + 2 * i, 4 + 2 * i))
            .collect::<Vec<_>>()
            .join(", ");
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE nodes SET root_ref_count = v.column2 FROM (VALUES {values}) AS v \
             WHERE nodes.app_id = $1 AND nodes.space_id = $2 AND nodes.hash = v.column1"
        )))
        .bind(app.as_str())
        .bind(space.as_str());
        for (hash, count) in &results {
            q = q.bind(hb(hash)).bind(*count);
        }
        q.execute(&mut **self.tx()).await?;
        let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE root_ref_balances SET revision_to = $3 WHERE app_id = $1 AND space_id = $2 \
             AND revision_to IS NULL AND hash IN ({})",
            placeholders(4, hashes.len())
        )))
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(revision);
        for h in &hashes {
            q = q.bind(hb(h));
        }
        q.execute(&mut **self.tx()).await?;
        let positive: Vec<&(Hash, i64)> = results.iter().filter(|(_, c)| *c > 0).collect();
        if !positive.is_empty() {
            let values = (0..positive.len())
                .map(|i| format!("($1, $2, ${}, ${}, $3)", 4 + 2 * i, 5 + 2 * i))
                .collect::<Vec<_>>()
                .join(", ");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO root_ref_balances (app_id, space_id, hash, ref_count, revision_from) VALUES {values}"
            )))
            .bind(app.as_str())
            .bind(space.as_str())
            .bind(revision);
            for (hash, count) in positive {
                q = q.bind(hb(hash)).bind(*count);
            }
            q.execute(&mut **self.tx()).await?;
        }
        let changes_json = serde_json::to_string(changes).unwrap_or_else(|_| "{}".to_string());
        sqlx::query(
            "INSERT INTO root_ref_events (app_id, revision, space_id, request_id, changes, actor, applied_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(app.as_str())
        .bind(revision)
        .bind(space.as_str())
        .bind(request_id.as_str())
        .bind(changes_json)
        .bind(actor)
        .bind(now)
        .execute(&mut **self.tx())
        .await?;
        sqlx::query(
            "INSERT INTO root_ref_requests (app_id, space_id, request_id, payload_hash, revision) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(request_id.as_str())
        .bind(hb(payload_hash))
        .bind(revision)
        .execute(&mut **self.tx())
        .await?;
        Ok(Ok((revision, false)))
    }
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
