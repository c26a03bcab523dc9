//! Reads of root references: balances at one revision (the current ones, less the changes of
//! later events), the App-global event stream, and the sums the consistency checks compare.

use std::collections::BTreeMap;

use cas_format::{AppId, Hash, RefDomain, SpaceId};
use sqlx::Row;

use super::{MetaStore, Value, bind_all, hash_col, hb, id_col};

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

/// A balance's place in the order of pages: (space, domain, hash).
type PageKey = (SpaceId, RefDomain, Hash);

impl BalanceCursor {
    fn key(&self) -> PageKey {
        (self.space.clone(), self.domain.clone(), self.hash)
    }
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

/// How many changes of later events a read of balances at an earlier revision undoes at most
/// (a page read at the revision of a first page that many changes ago must start again).
pub const MAX_UNDONE_CHANGES: usize = 100_000;

/// Why balances could not be read at a revision.
#[derive(Debug)]
pub enum BalanceReadError {
    Database(sqlx::Error),
    /// More changes than [`MAX_UNDONE_CHANGES`] were made since `revision`.
    TooFarBehind {
        revision: i64,
        current: i64,
    },
}

impl From<sqlx::Error> for BalanceReadError {
    fn from(e: sqlx::Error) -> Self {
        BalanceReadError::Database(e)
    }
}

impl std::fmt::Display for BalanceReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BalanceReadError::Database(e) => write!(f, "{e}"),
            BalanceReadError::TooFarBehind { revision, current } => write!(
                f,
                "revision {revision} is more than {MAX_UNDONE_CHANGES} changes behind the \
                 current revision {current}; read again from the first page"
            ),
        }
    }
}

impl std::error::Error for BalanceReadError {}

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
        revision_of(&mut *self.pool.acquire().await?, app).await
    }

    /// Balances as they were at `revision`, ordered by (space, domain, hash), after `cursor`,
    /// filtered, at most `limit`. Only current balances are stored: one at an earlier revision
    /// is the current one less the changes of the events after it, all read in one snapshot of
    /// the database; a read that would undo more than [`MAX_UNDONE_CHANGES`] changes is
    /// refused ([`BalanceReadError::TooFarBehind`]).
    pub async fn balances_at(
        &self,
        app: &AppId,
        filter: RefFilter<'_>,
        revision: i64,
        cursor: Option<&BalanceCursor>,
        limit: i64,
    ) -> Result<Vec<Balance>, BalanceReadError> {
        let mut tx = self.sql.snapshot().await?;
        let current = revision_of(&mut tx, app).await?.unwrap_or(0);
        let after = cursor.map(BalanceCursor::key);
        let mut undo = if revision < current {
            changes_since(&mut tx, app, filter, revision, current, after.as_ref()).await?
        } else {
            BTreeMap::new()
        };
        let limit = usize::try_from(limit).unwrap_or(0);
        let mut out = Vec::new();
        let mut from = cursor.cloned();
        while out.len() < limit {
            let rows = current_balances(&mut tx, app, filter, from.as_ref(), limit as i64).await?;
            // Past the last row read, the next read decides; with no more rows, nothing does.
            let last = (rows.len() >= limit)
                .then(|| rows.last().map(Balance::cursor))
                .flatten();
            let mut page: BTreeMap<PageKey, i64> = rows
                .into_iter()
                .map(|b| (b.cursor().key(), b.ref_count))
                .collect();
            // The changes undone up to that row, and those beyond it for the next read.
            let mut undone = std::mem::take(&mut undo);
            if let Some(upto) = last.as_ref().map(BalanceCursor::key) {
                undo = undone.split_off(&upto);
                if let Some(delta) = undo.remove(&upto) {
                    undone.insert(upto, delta);
                }
            }
            for (key, delta) in undone {
                *page.entry(key).or_default() -= delta;
            }
            out.extend(page.into_iter().filter(|(_, count)| *count != 0).map(
                |((space, domain, hash), ref_count)| Balance {
                    space,
                    domain,
                    hash,
                    ref_count,
                },
            ));
            match last {
                Some(c) => from = Some(c),
                None => break,
            }
        }
        out.truncate(limit);
        tx.rollback().await?;
        Ok(out)
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
        let mut conn = self.pool.acquire().await?;
        events_in(&mut conn, app, filter, after, upto, limit).await
    }

    /// The sum of every event's delta per (space, domain, hash) of an App (for consistency
    /// checks).
    pub async fn event_sums(&self, app: &AppId) -> Result<BalanceMap, BalanceReadError> {
        let mut conn = self.pool.acquire().await?;
        let sums = sum_events(
            &mut conn,
            app,
            RefFilter::default(),
            0,
            i64::MAX,
            None,
            |_| true,
        );
        Ok(sums
            .await?
            .into_iter()
            .map(|((space, domain, hash), sum)| ((space.as_str().to_string(), domain, hash), sum))
            .collect())
    }
}

/// The App's current revision, on one connection (`None` for an unknown App).
async fn revision_of(
    conn: &mut sqlx::AnyConnection,
    app: &AppId,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query("SELECT revision FROM apps WHERE app_id = $1")
        .bind(app.as_str())
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| r.try_get("revision"))
        .transpose()
}

/// [`MetaStore::events`] on one connection (a snapshot's, for [`MetaStore::balances_at`]).
async fn events_in(
    conn: &mut sqlx::AnyConnection,
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
    let mut binds = Vec::new();
    let mut n = push_scope(&mut sql, &mut binds, 4, filter);
    if let Some(hash) = filter.hash {
        sql.push_str(&format!(" AND changes LIKE ${n}"));
        binds.push(Value::Text(format!("%\"{hash}\"%")));
        n += 1;
    }
    sql.push_str(&format!(" ORDER BY revision LIMIT ${n}"));
    let q = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(app.as_str())
        .bind(after)
        .bind(upto);
    bind_all(q, binds)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(event_from_row)
        .collect()
}

/// Appends the Space and domain conditions of `filter` to `sql`, numbered from `n`, and their
/// values to `binds`; returns the next number.
fn push_scope(
    sql: &mut String,
    binds: &mut Vec<Value>,
    mut n: usize,
    filter: RefFilter<'_>,
) -> usize {
    if let Some(space) = filter.space {
        sql.push_str(&format!(" AND space_id = ${n}"));
        binds.push(Value::Text(space.as_str().to_string()));
        n += 1;
    }
    if let Some(domain) = filter.domain {
        sql.push_str(&format!(" AND ref_domain = ${n}"));
        binds.push(Value::Text(domain.as_str().to_string()));
        n += 1;
    }
    n
}

/// The current balances that `filter` selects, ordered by (space, domain, hash), after
/// `cursor`, at most `limit`.
async fn current_balances(
    conn: &mut sqlx::AnyConnection,
    app: &AppId,
    filter: RefFilter<'_>,
    cursor: Option<&BalanceCursor>,
    limit: i64,
) -> Result<Vec<Balance>, sqlx::Error> {
    let mut sql = String::from(
        "SELECT space_id, ref_domain, hash, ref_count FROM root_ref_balances WHERE app_id = $1",
    );
    let mut binds = Vec::new();
    let mut n = push_scope(&mut sql, &mut binds, 2, filter);
    if let Some(hash) = filter.hash {
        sql.push_str(&format!(" AND hash = ${n}"));
        binds.push(Value::Bytes(hb(hash)));
        n += 1;
    }
    if let Some(c) = cursor {
        sql.push_str(&format!(
            " AND (space_id, ref_domain, hash) > (${n}, ${}, ${})",
            n + 1,
            n + 2
        ));
        binds.push(Value::Text(c.space.as_str().to_string()));
        binds.push(Value::Text(c.domain.as_str().to_string()));
        binds.push(Value::Bytes(hb(&c.hash)));
        n += 3;
    }
    sql.push_str(&format!(" ORDER BY space_id, ref_domain, hash LIMIT ${n}"));
    let q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(app.as_str());
    bind_all(q, binds)
        .bind(limit)
        .fetch_all(&mut *conn)
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

/// The changes of the events in `(since, upto]` beyond `after` that `filter` selects, summed
/// per (space, domain, hash); refuses to undo more than [`MAX_UNDONE_CHANGES`].
async fn changes_since(
    conn: &mut sqlx::AnyConnection,
    app: &AppId,
    filter: RefFilter<'_>,
    since: i64,
    upto: i64,
    after: Option<&PageKey>,
) -> Result<BTreeMap<PageKey, i64>, BalanceReadError> {
    let beyond = |key: &PageKey| after.is_none_or(|a| key > a);
    sum_events(
        conn,
        app,
        filter,
        since,
        upto,
        Some(MAX_UNDONE_CHANGES),
        beyond,
    )
    .await
}

/// The changes of the events in `(since, upto]` that `filter` selects and `keep` keeps,
/// summed per (space, domain, hash), zero sums left out. With `most`, refuses once the events
/// read hold more changes than that.
async fn sum_events(
    conn: &mut sqlx::AnyConnection,
    app: &AppId,
    filter: RefFilter<'_>,
    since: i64,
    upto: i64,
    most: Option<usize>,
    keep: impl Fn(&PageKey) -> bool,
) -> Result<BTreeMap<PageKey, i64>, BalanceReadError> {
    let mut sums = BTreeMap::new();
    let mut read = 0usize;
    let mut from = since;
    loop {
        let batch = events_in(conn, app, filter, from, upto, 1000).await?;
        let Some(last) = batch.last() else { break };
        from = last.revision;
        for e in &batch {
            let changes: BTreeMap<Hash, i64> = serde_json::from_str(&e.changes)
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))?;
            read += changes.len();
            if most.is_some_and(|most| read > most) {
                return Err(BalanceReadError::TooFarBehind {
                    revision: since,
                    current: upto,
                });
            }
            for (hash, delta) in changes {
                if filter.hash.is_some_and(|h| *h != hash) {
                    continue;
                }
                let key = (e.space_id.clone(), e.ref_domain.clone(), hash);
                if keep(&key) {
                    *sums.entry(key).or_default() += delta;
                }
            }
        }
    }
    sums.retain(|_, v| *v != 0);
    Ok(sums)
}

#[cfg(test)]
mod tests {
    use super::super::{MetaStore, RootRefChange};
    use super::*;

    /// Balances at an earlier revision are the current ones less the later events' changes,
    /// up to [`MAX_UNDONE_CHANGES`] of them; further back the read is refused.
    #[tokio::test]
    async fn earlier_revisions_are_read_back_through_the_events() {
        let dir = std::env::temp_dir().join(format!("unicas-undo-{}", std::process::id()));
        let config = crate::config::Config {
            data_dir: dir.clone(),
            ..Default::default()
        };
        let store = MetaStore::connect(&config).await.expect("store");
        store.migrate().await.expect("migrate");
        let (app, space): (AppId, SpaceId) = ("a".parse().unwrap(), "s".parse().unwrap());
        sqlx::query("INSERT INTO apps (app_id, issuer, created_at) VALUES ('a', 'i', 0)")
            .execute(store.pool())
            .await
            .expect("app");
        let hashes: Vec<Hash> = (0..1000u32)
            .map(|i| Hash::digest(&i.to_le_bytes()))
            .collect();
        let mut tx = store.pool().begin().await.expect("begin");
        for h in &hashes {
            sqlx::query(
                "INSERT INTO nodes (app_id, space_id, hash, size, content_type, ref_count, \
                 object_gen, encoding, stored_bytes, lease_started_at, lease_expires_at, \
                 created_at) VALUES ('a', 's', $1, 1, 'raw', 0, 'g', 'identity', 1, 0, 0, 0)",
            )
            .bind(hb(h))
            .execute(&mut *tx)
            .await
            .expect("node");
        }
        tx.commit().await.expect("commit");
        let domain = RefDomain::default();
        let apply = |changes: BTreeMap<Hash, i64>, id: String| {
            let (store, app, space, domain) = (&store, &app, &space, &domain);
            async move {
                let mut p = store.gate(app, space).await.expect("gate");
                let request_id = id.parse().unwrap();
                let change = RootRefChange {
                    domain,
                    request_id: &request_id,
                    changes: &changes,
                    payload_hash: &Hash::digest(id.as_bytes()),
                    actor: "t",
                };
                let outcome = p.update_root_refs_many(&[change], 0).await.expect("update");
                assert!(outcome[0].is_ok(), "{outcome:?}");
                p.commit().await.expect("commit");
            }
        };
        // Revision 1: the first half at 1. Revision 2: the first half released, the second
        // taken. Then 99 updates that add 1 to every hash.
        let (first, second) = hashes.split_at(500);
        apply(first.iter().map(|h| (*h, 1)).collect(), "r1".into()).await;
        let swap = first
            .iter()
            .map(|h| (*h, -1))
            .chain(second.iter().map(|h| (*h, 1)))
            .collect();
        apply(swap, "r2".into()).await;
        for i in 3..=101 {
            apply(hashes.iter().map(|h| (*h, 1)).collect(), format!("r{i}")).await;
        }
        let all = RefFilter::default();
        let at = |revision: i64, limit: i64| {
            let (store, app) = (&store, &app);
            async move { store.balances_at(app, all, revision, None, limit).await }
        };
        let counts = |page: Vec<Balance>| -> BTreeMap<Hash, i64> {
            page.into_iter().map(|b| (b.hash, b.ref_count)).collect()
        };
        let now = counts(at(101, 2000).await.expect("now"));
        assert_eq!(now.len(), 1000);
        assert!(
            now.iter()
                .all(|(h, c)| *c == if first.contains(h) { 99 } else { 100 })
        );
        // 99,000 changes back: the second half at 1, the first half absent (zero).
        let r2 = counts(at(2, 2000).await.expect("revision 2"));
        assert_eq!(r2, second.iter().map(|h| (*h, 1)).collect());
        // In pages of 7, each continuing after the last: the same.
        let mut paged = BTreeMap::new();
        let mut cursor: Option<BalanceCursor> = None;
        loop {
            let page = store
                .balances_at(&app, all, 2, cursor.as_ref(), 7)
                .await
                .expect("page");
            let Some(last) = page.last() else { break };
            cursor = Some(last.cursor());
            paged.extend(counts(page));
        }
        assert_eq!(paged, r2);
        // One hash, at revision 1 (100,000 changes back, the most a read undoes).
        let h = first[0];
        let one = RefFilter {
            hash: Some(&h),
            ..RefFilter::default()
        };
        let r1 = store.balances_at(&app, one, 1, None, 10).await;
        assert_eq!(counts(r1.expect("revision 1")), [(h, 1)].into());
        // Revision 0 is 100,500 changes back: refused, with what to do.
        let e = store.balances_at(&app, one, 0, None, 10).await.unwrap_err();
        assert!(
            matches!(
                e,
                BalanceReadError::TooFarBehind {
                    revision: 0,
                    current: 101
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("read again from the first page"),
            "{e}"
        );
        store.pool().close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}
