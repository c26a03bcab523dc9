//! Reads of root references: balances of the versioned projection at one revision, the
//! App-global event stream, and the sums the consistency checks compare.

use std::collections::BTreeMap;

use cas_format::{AppId, Hash, RefDomain, SpaceId};
use sqlx::Row;

use super::{MetaStore, hash_col, hb, id_col};

/// One event of the App-global root-ref stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootRefEvent {
    pub revision: i64,
    pub space_id: SpaceId,
    pub ref_domain: RefDomain,
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
    pub domain: Option<&'a RefDomain>,
    pub hash: Option<&'a Hash>,
}

enum Bind {
    Text(String),
    Bytes(Vec<u8>),
}

/// Where a page of balances continues: after (space, domain, hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceCursor {
    pub space: SpaceId,
    pub domain: RefDomain,
    pub hash: Hash,
}

/// One balance of the projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Balance {
    pub space: SpaceId,
    pub domain: RefDomain,
    pub hash: Hash,
    pub ref_count: i64,
}

impl Balance {
    /// The cursor of a page that ends with this balance.
    pub fn cursor(&self) -> BalanceCursor {
        BalanceCursor {
            space: self.space.clone(),
            domain: self.domain.clone(),
            hash: self.hash,
        }
    }
}

/// Balances keyed by (space, domain, hash), as the consistency checks compare them.
pub type BalanceMap = BTreeMap<(String, RefDomain, Hash), i64>;

/// The sum over domains of each (space, hash) of `balances`: what the nodes' counts must be.
pub fn sum_over_domains(balances: &BalanceMap) -> BTreeMap<(String, Hash), i64> {
    let mut sums: BTreeMap<(String, Hash), i64> = BTreeMap::new();
    for ((space, _, hash), count) in balances {
        *sums.entry((space.clone(), *hash)).or_default() += count;
    }
    sums.retain(|_, v| *v != 0);
    sums
}

fn event_from_row(r: &sqlx::any::AnyRow) -> Result<RootRefEvent, sqlx::Error> {
    Ok(RootRefEvent {
        revision: r.try_get("revision")?,
        space_id: id_col(r, "space_id")?,
        ref_domain: id_col(r, "ref_domain")?,
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

    /// Balances as they were at `revision`, ordered by (space, domain, hash), after `cursor`,
    /// filtered.
    pub async fn balances_at(
        &self,
        app: &AppId,
        filter: RefFilter<'_>,
        revision: i64,
        cursor: Option<&BalanceCursor>,
        limit: i64,
    ) -> Result<Vec<Balance>, sqlx::Error> {
        let mut sql = String::from(
            "SELECT space_id, ref_domain, hash, ref_count FROM root_ref_balances \
             WHERE app_id = $1 AND revision_from <= $2 AND (revision_to IS NULL OR revision_to > $2)",
        );
        let mut n = 3;
        let mut binds: Vec<Bind> = Vec::new();
        if let Some(space) = filter.space {
            sql.push_str(&format!(" AND space_id = ${n}"));
            binds.push(Bind::Text(space.as_str().to_string()));
            n += 1;
        }
        if let Some(domain) = filter.domain {
            sql.push_str(&format!(" AND ref_domain = ${n}"));
            binds.push(Bind::Text(domain.as_str().to_string()));
            n += 1;
        }
        if let Some(hash) = filter.hash {
            sql.push_str(&format!(" AND hash = ${n}"));
            binds.push(Bind::Bytes(hb(hash)));
            n += 1;
        }
        if let Some(c) = cursor {
            sql.push_str(&format!(
                " AND (space_id, ref_domain, hash) > (${n}, ${}, ${})",
                n + 1,
                n + 2
            ));
            binds.push(Bind::Text(c.space.as_str().to_string()));
            binds.push(Bind::Text(c.domain.as_str().to_string()));
            binds.push(Bind::Bytes(hb(&c.hash)));
            n += 3;
        }
        sql.push_str(&format!(" ORDER BY space_id, ref_domain, hash LIMIT ${n}"));
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
                Ok(Balance {
                    space: id_col(r, "space_id")?,
                    domain: id_col(r, "ref_domain")?,
                    hash: hash_col(r, "hash")?,
                    ref_count: r.try_get("ref_count")?,
                })
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
            "SELECT revision, space_id, ref_domain, request_id, changes, actor, applied_at \
             FROM root_ref_events WHERE app_id = $1 AND revision > $2 AND revision <= $3",
        );
        let mut n = 4;
        let mut binds = Vec::new();
        if let Some(space) = filter.space {
            sql.push_str(&format!(" AND space_id = ${n}"));
            binds.push(space.as_str().to_string());
            n += 1;
        }
        if let Some(domain) = filter.domain {
            sql.push_str(&format!(" AND ref_domain = ${n}"));
            binds.push(domain.as_str().to_string());
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

    /// The sum of every event's delta per (space, domain, hash) of an App (for consistency
    /// checks).
    pub async fn event_sums(&self, app: &AppId) -> Result<BalanceMap, sqlx::Error> {
        let mut sums = BalanceMap::new();
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
                        .entry((e.space_id.as_str().to_string(), e.ref_domain.clone(), h))
                        .or_default() += d;
                }
            }
        }
        sums.retain(|_, v| *v != 0);
        Ok(sums)
    }
}
