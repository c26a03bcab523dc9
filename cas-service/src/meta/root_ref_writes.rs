//! The writes of a root-ref batch, in one round trip: the App's revision, the nodes' `rooted`
//! flags, the balances, an event and a request row for each update (see `root_refs`).

use cas_format::{Hash, RefDomain};

use super::root_refs::{RootRefChange, domains_of, ids_of, requests_among};
use super::{Dialect, Statement, Value, hb};

/// Appends the first part of a batch's writes: the App's revision moved by `accepted`, which
/// the later parts read as `a`.
pub(super) fn revision_part(w: &mut Writes, app: &str, accepted: i64) {
    revision_update(w, app, accepted).text(" RETURNING revision");
}

/// As [`revision_part`], for a batch planned from what the partition's memo held at
/// `revision`: the App's revision moves only if it is still that one and none of the
/// updates' request ids was used before (else `a` is empty and every later part, guarded by
/// [`Writes::guard`] or reading `a`, writes nothing).
pub(super) fn held_revision_part(
    w: &mut Writes,
    (app, space): (&str, &str),
    accepted: i64,
    revision: i64,
    updates: &[RootRefChange<'_>],
) {
    w.guarded = true;
    let q = revision_update(w, app, accepted)
        .text(" AND revision = ")
        .value(Value::Int(revision))
        .text(" AND NOT EXISTS (SELECT 1 FROM root_ref_requests WHERE ");
    requests_among(q, (app, space), &domains_of(updates), &ids_of(updates));
    q.text(") RETURNING revision");
}

/// The App's revision moved by `accepted`, up to the end of its condition.
fn revision_update<'w>(w: &'w mut Writes, app: &str, accepted: i64) -> &'w mut Statement {
    w.next("UPDATE apps SET revision = revision + ")
        .value(Value::Int(accepted))
        .text(" WHERE app_id = ")
        .value(Value::Text(app.to_string()))
}

/// Appends the next part: an insert of the balances `rows` of a partition, each a (domain,
/// hash) and its count; the caller says what a conflict does.
pub(super) fn balance_rows<'a>(
    w: &mut Writes,
    (app, space): (&str, &str),
    rows: impl Iterator<Item = (&'a RefDomain, &'a Hash, i64)>,
) {
    let text = |s: &str| Value::Text(s.to_string());
    let guarded = w.guarded;
    w.next("INSERT INTO root_ref_balances (app_id, space_id, ref_domain, hash, ref_count) ")
        .text(if guarded {
            "SELECT * FROM (VALUES "
        } else {
            "VALUES "
        });
    for (i, (domain, hash, count)) in rows.enumerate() {
        w.comma(i).tuple([
            text(app),
            text(space),
            text(domain.as_str()),
            Value::Bytes(hb(hash)),
            Value::Int(count),
        ]);
    }
    if guarded {
        w.text(") AS v WHERE EXISTS (SELECT 1 FROM a)");
    }
}

/// Appends the next part: the update in place of the stored balances `rows` of a partition,
/// each a (domain, hash) and its new count, found by their whole key. (An update is one write
/// of a row where an insert that meets its row checks the key, locks the row and then writes
/// it.)
pub(super) fn balance_updates<'a>(
    w: &mut Writes,
    partition: (&str, &str),
    rows: impl Iterator<Item = (&'a RefDomain, &'a Hash, i64)>,
) {
    let rows = rows.map(|(domain, hash, count)| {
        vec![
            Value::Text(domain.as_str().to_string()),
            Value::Bytes(hb(hash)),
            Value::Int(count),
        ]
    });
    w.next("").update_keyed(
        "root_ref_balances",
        partition,
        &["ref_domain", "hash"],
        "ref_count = v.column3",
        rows,
    );
    w.guard();
}

/// Appends the event and the request row of each update of `order` (indexes into
/// `updates`, in revision order): the k-th (1..) gets the App's new revision less
/// `order.len()` plus k.
pub(super) fn event_parts(
    w: &mut Writes,
    (app, space): (&str, &str),
    updates: &[RootRefChange<'_>],
    order: &[usize],
    now: i64,
) {
    let text = |s: &str| Value::Text(s.to_string());
    let offset = |k: usize| Value::Int(k as i64 + 1 - order.len() as i64);
    w.next(
        "INSERT INTO root_ref_events (app_id, space_id, revision, ref_domain, request_id, \
         changes, actor, applied_at) SELECT v.column1, v.column2, a.revision + v.column3, \
         v.column4, v.column5, v.column6, v.column7, v.column8 FROM (VALUES ",
    );
    for (k, &i) in order.iter().enumerate() {
        let u = &updates[i];
        let changes = serde_json::to_string(u.changes).unwrap_or_else(|_| "{}".to_string());
        w.comma(k).tuple([
            text(app),
            text(space),
            offset(k),
            text(u.domain.as_str()),
            text(u.request_id.as_str()),
            Value::Text(changes),
            text(u.actor),
            Value::Int(now),
        ]);
    }
    w.text(") AS v, ");
    w.revision_of(app);
    w.next(
        "INSERT INTO root_ref_requests (app_id, space_id, ref_domain, request_id, \
         payload_hash, revision) SELECT v.column1, v.column2, v.column3, v.column4, \
         v.column5, a.revision + v.column6 FROM (VALUES ",
    );
    for (k, &i) in order.iter().enumerate() {
        let u = &updates[i];
        w.comma(k).tuple([
            text(app),
            text(space),
            text(u.domain.as_str()),
            text(u.request_id.as_str()),
            Value::Bytes(hb(u.payload_hash)),
            offset(k),
        ]);
    }
    w.text(") AS v, ");
    w.revision_of(app);
}

/// The writes of a batch, in one round trip: on SQLite, statements one after the other in
/// one text (run in order; an `INSERT … SELECT` reads the App's revision the first one
/// wrote); on Postgres, one statement of data-modifying parts that read the App's new
/// revision from the first one's `RETURNING`.
pub(super) struct Writes {
    statement: Statement,
    parts: usize,
    /// The first part may update no row (see [`held_revision_part`]).
    pub(super) guarded: bool,
}

impl Writes {
    pub(super) fn new(statement: Statement) -> Self {
        Writes {
            statement,
            parts: 0,
            guarded: false,
        }
    }

    /// Ends the condition of the part just written so that it changes nothing when the
    /// first part updated no row (Postgres, for a batch planned from the memo).
    pub(super) fn guard(&mut self) {
        if self.guarded {
            self.statement.text(" AND EXISTS (SELECT 1 FROM a)");
        }
    }

    /// Starts the next part with `sql`. The first part is the App's revision update, which
    /// the others read as `a`.
    pub(super) fn next(&mut self, sql: &str) -> &mut Statement {
        let sep = match (self.statement.dialect(), self.parts) {
            (Dialect::Postgres, 0) => "WITH a AS (".to_string(),
            (Dialect::Postgres, n) => format!("), w{n} AS ("),
            (Dialect::Sqlite, 0) => String::new(),
            (Dialect::Sqlite, _) => "; ".to_string(),
        };
        self.parts += 1;
        self.statement.text(&sep).text(sql)
    }

    /// The App's new revision as `a`: on Postgres the first part's `RETURNING`, on SQLite the
    /// row the first statement updated.
    fn revision_of(&mut self, app: &str) {
        match self.statement.dialect() {
            Dialect::Postgres => {
                self.statement.text("a");
            }
            Dialect::Sqlite => {
                self.statement
                    .text("(SELECT revision FROM apps WHERE app_id = ")
                    .value(Value::Text(app.to_string()))
                    .text(") AS a");
            }
        }
    }

    /// The text and values of the whole.
    pub(super) fn finish(
        mut self,
    ) -> sqlx::query::Query<'static, sqlx::Any, sqlx::any::AnyArguments> {
        if self.statement.dialect() == Dialect::Postgres {
            self.statement.text(") SELECT revision FROM a");
        }
        self.statement.query()
    }
}

impl std::ops::Deref for Writes {
    type Target = Statement;
    fn deref(&self) -> &Statement {
        &self.statement
    }
}

impl std::ops::DerefMut for Writes {
    fn deref_mut(&mut self) -> &mut Statement {
        &mut self.statement
    }
}

/// Appends the deletion of the balances of (domain, hash) `keys` of a partition.
pub(super) fn delete_balances(
    q: &mut Statement,
    (app, space): (&str, &str),
    keys: &[(&RefDomain, Hash)],
) {
    q.text("DELETE FROM root_ref_balances WHERE app_id = ")
        .value(Value::Text(app.to_string()))
        .text(" AND space_id = ")
        .value(Value::Text(space.to_string()))
        .text(" AND (ref_domain, hash) IN (VALUES ");
    for (i, (domain, hash)) in keys.iter().enumerate() {
        q.comma(i).tuple([
            Value::Text(domain.as_str().to_string()),
            Value::Bytes(hb(hash)),
        ]);
    }
    q.text(")");
}
