//! `fsck`: checks that the metadata and the objects agree, and reports every disagreement with
//! its evidence. It never changes a count to make it match. With `repair_orphans` it adopts an
//! object without a row when an upload's validation evidence proves it (publishing the row the
//! crashed upload would have), and deletes other orphans once their grace period is over.
//!
//! Checks:
//! 1. every node row has its object, and (with `verify_content`) the object's content hashes to
//!    the node;
//! 2. every `childRefCount` equals the edges pointing at the node, every `ref_count` its own
//!    edges, and no edge dangles;
//! 3. root-ref balances equal the sum of events, and equal the nodes' root ref counts;
//! 4. every usage row equals a recount;
//! 5. objects without a row (node objects, pack objects and upload temporaries) are reported;
//! 6. every live pack's object has the size its row says, its counts equal the rows that point
//!    at it, and every packed row's entry lies in it (with `verify_content`, decodes and
//!    hashes to the node).

use std::collections::{BTreeMap, BTreeSet};

use cas_format::node::NodeHasher;
use cas_format::{AppId, ContentType, Hash, NodeDescriptor, NodeError, SpaceId};
use serde::Serialize;
use tokio::io::AsyncReadExt;

use crate::blob::{
    Encoding, ListedObject, ObjectReader, content_reader, node_key, node_prefix, pack_key,
    parse_node_key, parse_pack_key, upload_key,
};
use crate::delta::ContentError;
use crate::meta::{
    DeltaBase, Evidence, FinalizeOutcome, GenState, NodeRow, StoredObject, parse_object_name,
};
use crate::{Service, now_ms};

mod balances;
mod packs;

use packs::PackIndex;

/// What to check.
#[derive(Debug, Clone)]
pub struct FsckOptions {
    pub app: AppId,
    pub space: Option<SpaceId>,
    pub repair_orphans: bool,
    /// Read every object and check its hash (slow on large stores).
    pub verify_content: bool,
}

/// One finding. `inconsistent` ones make fsck fail.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub inconsistent: bool,
    pub kind: &'static str,
    pub detail: String,
}

/// The outcome of a check.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsckReport {
    pub nodes_checked: u64,
    pub objects_listed: u64,
    pub findings: Vec<Finding>,
    pub orphans_adopted: u64,
    pub orphans_deleted: u64,
}

impl FsckReport {
    pub fn is_consistent(&self) -> bool {
        !self.findings.iter().any(|f| f.inconsistent)
    }

    fn bad(&mut self, kind: &'static str, detail: String) {
        self.findings.push(Finding {
            inconsistent: true,
            kind,
            detail,
        });
    }

    fn note(&mut self, kind: &'static str, detail: String) {
        self.findings.push(Finding {
            inconsistent: false,
            kind,
            detail,
        });
    }
}

impl Service {
    /// Runs the checks; store errors abort with an error rather than a report.
    pub async fn fsck(&self, opts: &FsckOptions) -> anyhow::Result<FsckReport> {
        let mut report = FsckReport::default();
        let app = &opts.app;
        let space = opts.space.as_ref();
        let packs = PackIndex::load(self, opts).await?;
        let rows = self.check_nodes(opts, &packs, &mut report).await?;
        self.check_packs(opts, &packs, &mut report).await?;
        for m in self.meta.child_count_mismatches(app, space).await? {
            report.bad(
                "child-ref-count",
                format!(
                    "{}/{}: childRefCount {} but {} edges point at it",
                    m.space, m.hash, m.recorded, m.counted
                ),
            );
        }
        for m in self.meta.ref_count_mismatches(app, space).await? {
            report.bad(
                "ref-count",
                format!(
                    "{}/{}: ref_count {} but {} edges",
                    m.space, m.hash, m.recorded, m.counted
                ),
            );
        }
        for e in self.meta.dangling_edges(app, space).await? {
            report.bad(
                "dangling-edge",
                format!(
                    "{}: edge {} -> {} has no {} row",
                    e.space, e.parent, e.child, e.missing
                ),
            );
        }
        self.check_balances(opts, &mut report).await?;
        let spaces = match space {
            Some(s) => vec![s.clone()],
            None => self.meta.spaces(app).await?,
        };
        for s in &spaces {
            let row = self.meta.usage_row(app, s).await?;
            let recount = self.meta.recount_usage(app, s).await?;
            if row != recount {
                report.bad(
                    "usage",
                    format!("{s}: usage row {row:?} but a recount gives {recount:?}"),
                );
            }
        }
        self.check_orphans(opts, &rows, &packs, &mut report).await?;
        Ok(report)
    }

    /// Check 1; returns every row's (space, hash) → object generation.
    async fn check_nodes(
        &self,
        opts: &FsckOptions,
        packs: &PackIndex,
        report: &mut FsckReport,
    ) -> anyhow::Result<BTreeMap<(SpaceId, Hash), String>> {
        let mut rows = BTreeMap::new();
        let mut after: Option<(SpaceId, Hash)> = None;
        loop {
            let page = self
                .meta
                .nodes_page(
                    &opts.app,
                    opts.space.as_ref(),
                    after.as_ref().map(|(s, h)| (s, h)),
                    500,
                )
                .await?;
            let Some((last_space, last)) = page.last() else {
                break;
            };
            after = Some((last_space.clone(), last.hash));
            for (space, row) in page {
                report.nodes_checked += 1;
                if row.child_ref_count < 0 {
                    report.bad(
                        "negative-count",
                        format!("{space}/{}: negative count", row.hash),
                    );
                }
                rows.insert((space.clone(), row.hash), row.object_gen.clone());
                if row.pack.is_some() {
                    if row.is_ready() {
                        self.check_packed(opts, packs, &space, &row, report).await?;
                    }
                    continue;
                }
                if row.held {
                    if row.is_ready() {
                        let missing = ("held-bytes", "its held bytes are missing");
                        self.check_rebuilt(opts, &space, &row, missing, report)
                            .await?;
                    }
                    continue;
                }
                let key = node_key(&opts.app, &space, &row.hash, &row.object_gen);
                let found = self.blobs.get(&key, None).await?;
                let Some((reader, stored)) = found else {
                    if row.is_ready() {
                        report.bad(
                            "missing-object",
                            format!("{space}/{}: ready row without its object {key}", row.hash),
                        );
                    }
                    continue;
                };
                if !row.is_ready() {
                    continue;
                }
                if stored as i64 != row.stored_bytes {
                    report.bad(
                        "stored-size",
                        format!(
                            "{space}/{}: object holds {stored} bytes, the row says {}",
                            row.hash, row.stored_bytes
                        ),
                    );
                }
                if let Some(d) = row.delta {
                    self.check_delta(opts, &space, &row, d, report).await?;
                    continue;
                }
                if opts.verify_content {
                    let refs = self.meta.node_refs(&opts.app, &space, &row.hash).await?;
                    let ct = ContentType::new(row.content_type.clone())?;
                    let hasher = NodeDescriptor::new(ct, refs, row.size as u64).hasher()?;
                    let offset = row.content_offset();
                    let finished = match hash_stored(hasher, row.encoding, reader, offset).await {
                        Ok(finished) => finished,
                        Err(e) => {
                            // A damaged object: a finding, not the end of the check.
                            report.bad(
                                "object-hash",
                                format!("{space}/{}: the object does not decode: {e}", row.hash),
                            );
                            continue;
                        }
                    };
                    match finished {
                        Ok(h) if h == row.hash => {}
                        Ok(h) => report.bad(
                            "object-hash",
                            format!("{space}/{}: the object hashes to {h}", row.hash),
                        ),
                        Err(e) => report.bad("object-hash", format!("{space}/{}: {e}", row.hash)),
                    }
                }
            }
        }
        Ok(rows)
    }

    /// A ready delta row: its base has a row in the partition, its chain is not deeper than
    /// the row says, and (verifying content) the chain rebuilds the node's content.
    /// A row read in memory (packed or held): its delta chain, else (with `verify_content`)
    /// its content; `missing` names the finding when its bytes are gone.
    async fn check_rebuilt(
        &self,
        opts: &FsckOptions,
        space: &SpaceId,
        row: &NodeRow,
        missing: (&'static str, &str),
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        if let Some(d) = row.delta {
            return self.check_delta(opts, space, row, d, report).await;
        }
        if opts.verify_content {
            match self.rebuild(&opts.app, space, row, false).await {
                Ok(_) => {}
                Err(ContentError::Moved) => {
                    report.bad(missing.0, format!("{space}/{}: {}", row.hash, missing.1))
                }
                Err(ContentError::Failed(e)) => report.bad(
                    "object-hash",
                    format!("{space}/{}: {}", row.hash, e.message),
                ),
            }
        }
        Ok(())
    }

    async fn check_delta(
        &self,
        opts: &FsckOptions,
        space: &SpaceId,
        row: &NodeRow,
        base: DeltaBase,
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        let app = &opts.app;
        let mut depth = 0;
        let mut next = Some(base.hash);
        while let Some(h) = next {
            depth += 1;
            if depth > base.depth || depth > 64 {
                report.bad(
                    "delta-chain",
                    format!(
                        "{space}/{}: the delta chain is deeper than its recorded {}",
                        row.hash, base.depth
                    ),
                );
                return Ok(());
            }
            match self.meta.node(app, space, &h).await? {
                Some(b) => next = b.delta.map(|d| d.hash),
                None => {
                    report.bad(
                        "delta-base",
                        format!("{space}/{}: its delta base {h} has no row", row.hash),
                    );
                    return Ok(());
                }
            }
        }
        if opts.verify_content {
            match self.rebuild(app, space, row, false).await {
                Ok(_) => {}
                Err(ContentError::Moved) => report.bad(
                    "delta-base",
                    format!(
                        "{space}/{}: an object of its delta chain is missing",
                        row.hash
                    ),
                ),
                Err(ContentError::Failed(e)) => report.bad(
                    "object-hash",
                    format!("{space}/{}: {}", row.hash, e.message),
                ),
            }
        }
        Ok(())
    }

    /// Check 5, and the repairs.
    async fn check_orphans(
        &self,
        opts: &FsckOptions,
        rows: &BTreeMap<(SpaceId, Hash), String>,
        packs: &PackIndex,
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        let app = &opts.app;
        let now = now_ms();
        let grace = self.config.orphan_grace_ms as i64;
        let generations = self.meta.generations(app, opts.space.as_ref()).await?;
        let queued: BTreeSet<(SpaceId, Hash, String)> = self
            .meta
            .queued_object_deletions(app)
            .await?
            .into_iter()
            .collect();
        let mut objects = self
            .blobs
            .list(&node_prefix(app, opts.space.as_ref()))
            .await?;
        if let Some(space) = &opts.space {
            objects.extend(self.blobs.list(&pack_key(app, space, "")).await?);
        }
        report.objects_listed += objects.len() as u64;
        for o in objects {
            if let Some((_, space, pack)) = parse_pack_key(&o.key) {
                if !packs.has(&space, &pack) {
                    let in_grace = now - o.modified_ms < grace;
                    self.orphan(opts, &o, "pack without a row", in_grace, report)
                        .await?;
                }
                continue;
            }
            let Some((_, space, hash, object_gen)) = parse_node_key(&o.key) else {
                report.bad(
                    "unknown-object",
                    format!("{}: not a node object key", o.key),
                );
                continue;
            };
            if rows.get(&(space.clone(), hash)) == Some(&object_gen) {
                continue;
            }
            if queued.contains(&(space.clone(), hash, object_gen.clone())) {
                report.note(
                    "queued-deletion",
                    format!("{}: superseded, GC deletes it", o.key),
                );
                continue;
            }
            let in_grace = now - o.modified_ms < grace;
            // Evidence: a generation of this node whose bytes were validated.
            // (Each publication attempt writes an object of its own: `<generation>[.<k>]`.)
            let evidence = parse_object_name(&object_gen).and_then(|(gen_id, attempt)| {
                let (s, g) = generations.get(gen_id)?;
                (*s == space
                    && g.hash == hash
                    && g.state == GenState::Validated
                    && attempt <= g.attempt.max(1))
                .then(|| crate::meta::Generation {
                    attempt,
                    ..g.clone()
                })
            });
            if opts.repair_orphans
                && !rows.contains_key(&(space.clone(), hash))
                && let Some(g) = evidence
                && self.adopt(app, &space, &g, o.size).await?
            {
                report.orphans_adopted += 1;
                report.note(
                    "orphan-adopted",
                    format!("{}: published from upload {}", o.key, g.gen_id),
                );
                continue;
            }
            self.orphan(
                opts,
                &o,
                "object without a row or upload evidence",
                in_grace,
                report,
            )
            .await?;
        }
        let uploads = self.blobs.list(&format!("uploads/app.{app}/")).await?;
        report.objects_listed += uploads.len() as u64;
        for o in uploads {
            let generation = o.key.rsplit('/').next().unwrap_or("");
            let known = generations
                .get(generation)
                .is_some_and(|(space, g)| upload_key(app, space, &g.gen_id) == o.key);
            if known
                || opts.space.as_ref().is_some_and(|s| {
                    !o.key
                        .contains(&format!("/{}/", crate::blob::space_component(s)))
                })
            {
                continue;
            }
            if now - o.modified_ms < grace {
                report.note(
                    "orphan-upload-in-grace",
                    format!(
                        "{}: upload without a generation, inside its grace period",
                        o.key
                    ),
                );
            } else if opts.repair_orphans {
                self.blobs.delete(&o.key).await?;
                report.orphans_deleted += 1;
                report.note(
                    "orphan-deleted",
                    format!("{}: upload without a generation; deleted", o.key),
                );
            } else {
                report.bad(
                    "orphan-upload",
                    format!(
                        "{}: upload without a generation, past its grace period",
                        o.key
                    ),
                );
            }
        }
        Ok(())
    }

    /// An object nothing accounts for (`what` says which): noted inside its grace period,
    /// deleted after it with `repair_orphans`, an inconsistency otherwise.
    pub(super) async fn orphan(
        &self,
        opts: &FsckOptions,
        o: &ListedObject,
        what: &str,
        in_grace: bool,
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        if in_grace {
            report.note(
                "orphan-in-grace",
                format!("{}: {what}; inside its grace period", o.key),
            );
        } else if opts.repair_orphans {
            self.blobs.delete(&o.key).await?;
            report.orphans_deleted += 1;
            report.note("orphan-deleted", format!("{}: {what}; deleted", o.key));
        } else {
            report.bad(
                "orphan",
                format!("{}: {what}, past its grace period", o.key),
            );
        }
        Ok(())
    }

    /// Publishes the row of an orphan object whose upload was validated. Returns whether it did.
    async fn adopt(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &crate::meta::Generation,
        stored: u64,
    ) -> anyhow::Result<bool> {
        let Some(evidence) = g.evidence.clone() else {
            return Ok(false);
        };
        let Some(encoding) = self.object_encoding(app, space, g, &evidence).await? else {
            return Ok(false);
        };
        let mut p = self.meta.gate(app, space).await?;
        let outcome = p
            .finalize(
                g,
                &evidence,
                StoredObject {
                    encoding,
                    stored_bytes: stored as i64,
                    delta: None,
                    held: None,
                },
                now_ms(),
                self.config.lease_min_ms as i64,
            )
            .await?;
        p.commit().await?;
        Ok(matches!(outcome, FinalizeOutcome::Published { .. }))
    }

    /// Whether an orphan object holds the node's content, raw or compressed.
    async fn object_encoding(
        &self,
        app: &AppId,
        space: &SpaceId,
        g: &crate::meta::Generation,
        evidence: &Evidence,
    ) -> anyhow::Result<Option<Encoding>> {
        let key = node_key(app, space, &g.hash, &g.object_name());
        let d = NodeDescriptor::new(
            ContentType::new(evidence.content_type.clone())?,
            evidence.refs.clone(),
            evidence.content_size as u64,
        );
        for encoding in Encoding::STANDALONE {
            let Some((reader, len)) = self.blobs.get(&key, None).await? else {
                return Ok(None);
            };
            // A portable object is the node's header and then its content.
            let offset = match encoding {
                Encoding::Portable => match len.checked_sub(evidence.content_size as u64) {
                    Some(header) if header > 0 => header,
                    _ => continue,
                },
                _ => 0,
            };
            let found = hash_stored(d.hasher()?, encoding, reader, offset).await;
            if matches!(found, Ok(Ok(h)) if h == g.hash) {
                return Ok(Some(encoding));
            }
        }
        Ok(None)
    }
}

/// Finishes `hasher` over the content of `object`, stored as `encoding` with the content from
/// `offset` on: `Err` when the object does not decode, else what the hasher answers (an
/// error when the content's length is not the node's).
async fn hash_stored(
    mut hasher: NodeHasher,
    encoding: Encoding,
    object: ObjectReader,
    offset: u64,
) -> std::io::Result<Result<Hash, NodeError>> {
    let mut content = content_reader(encoding, object, offset).await?;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        match content.read(&mut buf).await? {
            0 => return Ok(hasher.finish()),
            n => hasher.update(&buf[..n]),
        }
    }
}
