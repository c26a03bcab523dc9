//! Publishing nodes: from validated generations whose objects have been written to node rows,
//! ordered edges, child counts, leases, usage and published generations. Several nodes are
//! published by the same few set-based statements, children before their parents; publishing
//! one node is the case of one.

use std::collections::{HashMap, HashSet};

use cas_format::Hash;

use super::generations::{Evidence, GenState, Generation};
use super::nodes::{FinalizeOutcome, NodeRow, StoredObject};
use super::usage::UsageDelta;
use super::{Partition, ROWS_PER_STATEMENT, Value, hb};
use crate::lease::lease_window;

/// A node to publish: its validated generation, what validation proved and how the object
/// written for it holds the content.
pub struct Publication<'a> {
    pub generation: &'a Generation,
    pub evidence: &'a Evidence,
    pub stored: StoredObject,
    /// The lease it starts, or extends when another request published the node first.
    pub lease_ms: i64,
}

impl Partition {
    /// Publishes a node from a validated generation whose object has been written: inserts the
    /// row and its ordered edges, counts each child once per occurrence, sets the lease,
    /// releases the reservation and marks the generation published. A row that GC marked for
    /// collection is made ready again instead (its edges are the same), and its previous
    /// object is queued for deletion.
    pub async fn finalize(
        &mut self,
        g: &Generation,
        evidence: &Evidence,
        stored: StoredObject,
        now: i64,
        lease_ms: i64,
    ) -> Result<FinalizeOutcome, sqlx::Error> {
        let one = Publication {
            generation: g,
            evidence,
            stored,
            lease_ms,
        };
        self.finalize_many(&[one], now)
            .await?
            .pop()
            .ok_or_else(|| sqlx::Error::Protocol("a publication went unanswered".into()))
    }

    /// Publishes many nodes as [`Partition::finalize`] publishes one, with one outcome each, in
    /// order. A node whose children are published by the same call counts them as ready.
    pub async fn finalize_many(
        &mut self,
        items: &[Publication<'_>],
        now: i64,
    ) -> Result<Vec<FinalizeOutcome>, sqlx::Error> {
        let looked_up: Vec<Hash> = items
            .iter()
            .flat_map(|p| std::iter::once(p.generation.hash).chain(p.stored.delta.map(|d| d.hash)))
            .collect();
        let mut rows = self.nodes(&looked_up).await?;
        let ids: Vec<&str> = items.iter().map(|p| p.generation.gen_id.as_str()).collect();
        let current = self.generations(&ids).await?;
        let mut outcomes: Vec<Option<FinalizeOutcome>> = vec![None; items.len()];
        // Leases of nodes ready before this call (or published by it for an earlier item).
        let mut leases: Vec<(Hash, i64, i64)> = Vec::new();
        let mut extend = |row: &mut NodeRow, lease_ms: i64| {
            let (started, expires) =
                lease_window(row.lease_started_at, row.lease_expires_at, now, lease_ms);
            if (started, expires) != (row.lease_started_at, row.lease_expires_at) {
                (row.lease_started_at, row.lease_expires_at) = (started, expires);
                leases.retain(|(h, _, _)| *h != row.hash);
                leases.push((row.hash, started, expires));
            }
            FinalizeOutcome::AlreadyReady { started, expires }
        };
        let mut waiting = Vec::new();
        for (i, p) in items.iter().enumerate() {
            if let Some(row) = rows.get_mut(&p.generation.hash).filter(|r| r.is_ready()) {
                outcomes[i] = Some(extend(row, p.lease_ms));
            } else if current
                .get(&p.generation.gen_id)
                .is_some_and(|g| g.state.is_active())
            {
                waiting.push(i);
            } else {
                outcomes[i] = Some(FinalizeOutcome::GenerationGone);
            }
        }
        let all_refs: Vec<Hash> = waiting
            .iter()
            .flat_map(|&i| items[i].evidence.refs.iter().copied())
            .collect();
        let not_ready: HashSet<Hash> = self
            .missing_children(&all_refs)
            .await?
            .into_iter()
            .collect();
        // In passes: a node waits for the children this call publishes in an earlier pass.
        let mut published: Vec<usize> = Vec::new();
        let mut published_rows: HashMap<Hash, NodeRow> = HashMap::new();
        loop {
            let before = published.len();
            let mut still = Vec::new();
            for i in waiting {
                let p = &items[i];
                let hash = p.generation.hash;
                if let Some(row) = published_rows.get_mut(&hash) {
                    outcomes[i] = Some(extend(row, p.lease_ms));
                    continue;
                }
                let missing: Vec<Hash> = p
                    .evidence
                    .distinct_refs()
                    .into_iter()
                    .filter(|h| not_ready.contains(h) && !published_rows.contains_key(h))
                    .collect();
                if !missing.is_empty() {
                    still.push((i, missing));
                    continue;
                }
                // A base that GC marked has its dependents listed after the mark: one
                // published now would be missed, and lose its base.
                if let Some(d) = p.stored.delta {
                    let ready = published_rows.contains_key(&d.hash)
                        || rows.get(&d.hash).is_some_and(|b| b.is_ready());
                    if !ready {
                        outcomes[i] = Some(FinalizeOutcome::DeltaBaseGone);
                        continue;
                    }
                }
                let (started, expires) = (now, now + p.lease_ms);
                published_rows.insert(hash, published_row(p, started, expires));
                outcomes[i] = Some(FinalizeOutcome::Published { started, expires });
                published.push(i);
            }
            if still.is_empty() || published.len() == before {
                for (i, missing) in still {
                    outcomes[i] = Some(FinalizeOutcome::MissingChildren(missing));
                }
                break;
            }
            waiting = still.into_iter().map(|(i, _)| i).collect();
        }
        self.write_publications(items, &published, &rows, &current, now)
            .await?;
        // After the rows: a lease may belong to a node published just now.
        self.set_leases(&leases).await?;
        outcomes
            .into_iter()
            .map(|o| o.ok_or_else(|| sqlx::Error::Protocol("a publication went unanswered".into())))
            .collect()
    }

    /// Writes what publishing `published` (indices into `items`, children first) changes.
    async fn write_publications(
        &mut self,
        items: &[Publication<'_>],
        published: &[usize],
        rows: &HashMap<Hash, NodeRow>,
        current: &HashMap<String, Generation>,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let mut usage = UsageDelta::default();
        let mut new_rows = Vec::new();
        for &i in published {
            let p = &items[i];
            usage += UsageDelta {
                ready_content_bytes: p.evidence.content_size,
                ready_stored_bytes: p.stored.stored_bytes,
                reserved_bytes: -current
                    .get(&p.generation.gen_id)
                    .map_or(0, |g| g.reserved_bytes),
                ..Default::default()
            };
            match rows.get(&p.generation.hash) {
                Some(row) => {
                    self.revive(p, row, now).await?;
                    usage.not_ready_node_count -= 1;
                }
                None => {
                    new_rows.push(p);
                    usage.node_count += 1;
                }
            }
        }
        self.insert_nodes(&new_rows, now).await?;
        let edges: Vec<(&Hash, usize, &Hash)> = new_rows
            .iter()
            .flat_map(|p| {
                let parent = &p.generation.hash;
                p.evidence
                    .refs
                    .iter()
                    .enumerate()
                    .map(move |(ord, child)| (parent, ord, child))
            })
            .collect();
        self.insert_edges(&edges).await?;
        let mut counts: HashMap<Hash, i64> = HashMap::new();
        for (_, _, child) in &edges {
            *counts.entry(**child).or_default() += 1;
        }
        let counts: Vec<(Hash, i64)> = counts.into_iter().collect();
        self.add_child_refs(&counts).await?;
        let ids: Vec<&str> = published
            .iter()
            .map(|&i| items[i].generation.gen_id.as_str())
            .collect();
        self.mark_published(&ids).await?;
        self.add_usage(usage).await?;
        // What other attempts of these uploads wrote (or, killed, left) goes with the next GC
        // pass; one still writing finds the node ready and deletes its object itself.
        for &i in published {
            let g = items[i].generation;
            let Some(attempts) = current.get(&g.gen_id) else {
                continue;
            };
            let mine = g.object_name();
            for other in attempts.attempt_objects().filter(|o| *o != mine) {
                self.retire_object(&g.hash, &other, now).await?;
            }
        }
        Ok(())
    }

    /// Makes a row that GC marked for collection ready again from a new object.
    async fn revive(
        &mut self,
        p: &Publication<'_>,
        row: &NodeRow,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        let stored = &p.stored;
        sqlx::query(
            "UPDATE nodes SET collecting_since = NULL, object_gen = $4, encoding = $5, \
             stored_bytes = $6, lease_started_at = $7, lease_expires_at = $8, \
             delta_base = $9, delta_depth = $10, pack_block_offset = NULL, \
             pack_block_bytes = NULL, pack_entry_offset = NULL, pack_entry_bytes = NULL, \
             held_bytes = $11, held = $12 WHERE app_id = $1 AND space_id = $2 AND hash = $3",
        )
        .bind(app.as_str())
        .bind(space.as_str())
        .bind(hb(&p.generation.hash))
        .bind(p.generation.object_name())
        .bind(stored.encoding.as_str())
        .bind(stored.stored_bytes)
        .bind(now)
        .bind(now + p.lease_ms)
        .bind(stored.base_column())
        .bind(stored.depth())
        .bind(stored.held_in_row())
        .bind(stored.held_flag())
        .execute(&mut **self.tx())
        .await?;
        self.replace_apart(row, stored.held_apart()).await?;
        self.release_object(row, now).await
    }

    /// Inserts the rows of new nodes, ready, with no child or root refs yet.
    async fn insert_nodes(
        &mut self,
        nodes: &[&Publication<'_>],
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for part in nodes.chunks(ROWS_PER_STATEMENT) {
            let mut b = self.binds();
            let values: Vec<String> = part
                .iter()
                .map(|_| format!("({}, 0, {})", b.list(11), b.list(5)))
                .collect();
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO nodes (app_id, space_id, hash, size, content_type, ref_count, \
                 object_gen, encoding, stored_bytes, lease_started_at, lease_expires_at, \
                 child_ref_count, created_at, delta_base, delta_depth, \
                 held_bytes, held) VALUES {}",
                values.join(", ")
            )));
            for p in part {
                let (g, e, s) = (p.generation, p.evidence, &p.stored);
                q = q
                    .bind(app.as_str())
                    .bind(space.as_str())
                    .bind(hb(&g.hash))
                    .bind(e.content_size)
                    .bind(e.content_type.as_str())
                    .bind(e.refs.len() as i64)
                    .bind(g.object_name())
                    .bind(s.encoding.as_str())
                    .bind(s.stored_bytes)
                    .bind(now)
                    .bind(now + p.lease_ms)
                    .bind(now)
                    .bind(s.base_column())
                    .bind(s.depth())
                    .bind(s.held_in_row())
                    .bind(s.held_flag());
            }
            q.execute(&mut **self.tx()).await?;
        }
        let apart: Vec<(&Hash, &[u8])> = nodes
            .iter()
            .filter_map(|p| Some((&p.generation.hash, p.stored.held_apart()?)))
            .collect();
        self.insert_apart(&apart).await
    }

    /// Inserts the held bytes kept apart of rows that have none yet, `(hash, bytes)`.
    async fn insert_apart(&mut self, held: &[(&Hash, &[u8])]) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for part in held.chunks(ROWS_PER_STATEMENT) {
            let values = self.binds().rows(part.len(), 4);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO held_apart (app_id, space_id, hash, bytes) VALUES {values}"
            )));
            for (hash, bytes) in part {
                q = q
                    .bind(app.as_str())
                    .bind(space.as_str())
                    .bind(hb(hash))
                    .bind(bytes.to_vec());
            }
            q.execute(&mut **self.tx()).await?;
        }
        Ok(())
    }

    /// Replaces the held bytes kept apart of an existing row, as it was read (`row`), with
    /// `bytes`, or none: a row that held nothing has nothing apart to delete. The caller sets
    /// the row's own held bytes and `held` flag to match in the same transaction.
    pub(super) async fn replace_apart(
        &mut self,
        row: &NodeRow,
        bytes: Option<&[u8]>,
    ) -> Result<(), sqlx::Error> {
        if row.held {
            let (app, space) = (self.app.clone(), self.space.clone());
            sqlx::query("DELETE FROM held_apart WHERE app_id = $1 AND space_id = $2 AND hash = $3")
                .bind(app.as_str())
                .bind(space.as_str())
                .bind(hb(&row.hash))
                .execute(&mut **self.tx())
                .await?;
        }
        match bytes {
            Some(bytes) => self.insert_apart(&[(&row.hash, bytes)]).await,
            None => Ok(()),
        }
    }

    /// Inserts edges `(parent, ord, child)`.
    async fn insert_edges(&mut self, edges: &[(&Hash, usize, &Hash)]) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for part in edges.chunks(ROWS_PER_STATEMENT) {
            let values = self.binds().rows(part.len(), 5);
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO edges (app_id, space_id, parent, ord, child) VALUES {values}"
            )));
            for (parent, ord, child) in part {
                q = q
                    .bind(app.as_str())
                    .bind(space.as_str())
                    .bind(hb(parent))
                    .bind(*ord as i64)
                    .bind(hb(child));
            }
            q.execute(&mut **self.tx()).await?;
        }
        Ok(())
    }

    /// Adds `n` (possibly negative) to the child ref count of each distinct node `(hash, n)`,
    /// a statement per thousand. The schema refuses a negative count, which aborts the
    /// transaction; a node without a row is an error.
    pub(super) async fn add_child_refs(
        &mut self,
        counts: &[(Hash, i64)],
    ) -> Result<(), sqlx::Error> {
        let (app, space) = (self.app.clone(), self.space.clone());
        for part in counts.chunks(ROWS_PER_STATEMENT) {
            let mut q = self.statement();
            q.update_nodes(
                (app.as_str(), space.as_str()),
                "child_ref_count = nodes.child_ref_count + v.column2",
                part.iter().map(|(child, n)| (*child, vec![Value::Int(*n)])),
            );
            let done = q.query().execute(&mut **self.tx()).await?;
            if done.rows_affected() != part.len() as u64 {
                return Err(sqlx::Error::Protocol(format!(
                    "{} of {} children of edges have no node row",
                    part.len() as u64 - done.rows_affected().min(part.len() as u64),
                    part.len()
                )));
            }
        }
        Ok(())
    }

    /// Marks active generations published and lets go of their reservations (the caller
    /// takes them out of the usage row).
    async fn mark_published(&mut self, ids: &[&str]) -> Result<(), sqlx::Error> {
        for part in ids.chunks(ROWS_PER_STATEMENT) {
            let mut b = self.binds();
            let (published, list) = (b.one(), b.list(part.len()));
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE upload_generations SET state = {published}, reserved_bytes = 0 \
                 WHERE gen_id IN ({list})"
            )))
            .bind(GenState::Published.as_str());
            for id in part {
                q = q.bind(*id);
            }
            q.execute(&mut **self.tx()).await?;
        }
        Ok(())
    }
}

/// The row a publication inserts, as later items of the same call see it.
fn published_row(p: &Publication<'_>, started: i64, expires: i64) -> NodeRow {
    NodeRow {
        hash: p.generation.hash,
        size: p.evidence.content_size,
        content_type: p.evidence.content_type.clone(),
        ref_count: p.evidence.refs.len() as i64,
        object_gen: p.generation.object_name(),
        encoding: p.stored.encoding,
        stored_bytes: p.stored.stored_bytes,
        lease_started_at: started,
        lease_expires_at: expires,
        child_ref_count: 0,
        rooted: false,
        collecting_since: None,
        delta: p.stored.delta,
        pack: None,
        held: p.stored.held.is_some(),
    }
}
