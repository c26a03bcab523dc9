//! Packs: small nodes stored together, many to one object.
//!
//! A node of at most `pack_max_node_bytes` is first stored as an object of its own. GC passes
//! pack a partition's loose small nodes (once there are `pack_min_nodes`, or the oldest is
//! `pack_delay_ms` old) into a pack object: blocks of about `pack_block_bytes` of content, each
//! one checksummed zstd frame, entries in chain order (a node follows the node it was stored as
//! a delta against), so that versions of one cell share a block and compress against each
//! other. An entry holds the node's content as it is, or, when its delta base is not in the
//! same pack, its delta frame. The index is in the node rows: the pack, the block's byte range,
//! the entry's range in the block. A read fetches one block with a ranged GET, decodes it
//! (decoded blocks are cached with the delta bases) and verifies the node's hash.
//!
//! The same pass rewrites packs whose collected entries hold `repack_dead_percent` of them,
//! and merges packs smaller than `pack_merge_bytes` with newer nodes, in tiers (a pack joins
//! while it is at most twice what is written with it). One packer per partition
//! at a time (a lock row with an expiry). Every step is crash-safe: the pack row is recorded
//! `writing` before its object is written, the rows move to it in one transaction (which checks
//! that each row still names the object it was read from), and what a crash leaves (a
//! `writing` pack, superseded objects, packs nothing points at) is deleted by the next pass.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use cas_format::{AppId, Hash, SpaceId};

use crate::blob::{Encoding, pack_key};
use crate::delta::{ContentError, integrity};
use crate::error::{ApiError, ApiResult};
use crate::meta::{NodeRow, PackRow, PackSpan, PackState, PackedEntry};
use crate::pack_object::build_pack;
use crate::{Service, failpoint, now_ms};

/// Most nodes one pack takes.
const MAX_ENTRIES: usize = 8192;

/// Largest decoded block a read accepts: a block holds at most `pack_block_bytes` (4 MiB at
/// most) or one entry (1 MiB at most).
pub(crate) const BLOCK_MAX: usize = 4 << 20;

/// What one packing step did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PackOutcome {
    /// Rows that now point at a new pack.
    pub packed: u64,
    pub packs_written: u64,
    /// Pack objects deleted: left by a crash, or nothing points at them any more.
    pub packs_deleted: u64,
}

/// A node's entry, ready to be placed.
struct Entry {
    row: NodeRow,
    bytes: Bytes,
    encoding: Encoding,
    /// Kept when the base is outside the pack (the entry is then the delta frame).
    delta: Option<crate::meta::DeltaBase>,
}

impl Service {
    /// A packed row's entry: its block, read with one ranged GET and decoded (or cached),
    /// sliced. Without `cached` the block is read again (what `fsck` does).
    pub(crate) async fn pack_entry(
        &self,
        app: &AppId,
        space: &SpaceId,
        row: &NodeRow,
        span: PackSpan,
        cached: bool,
    ) -> Result<Bytes, ContentError> {
        let pack = &row.object_gen;
        let hit = cached
            .then(|| self.bases.block(app, space, pack, span.block_offset))
            .flatten();
        let block = match hit {
            Some(b) => b,
            None => {
                let b = self.read_block(app, space, pack, span).await?;
                self.bases
                    .put_block(app, space, pack, span.block_offset, b.clone());
                b
            }
        };
        let (start, len) = (span.entry_offset, span.entry_bytes);
        let end = start.checked_add(len).filter(|e| *e <= block.len() as i64);
        match end {
            Some(end) if start >= 0 && len >= 0 => Ok(block.slice(start as usize..end as usize)),
            _ => Err(integrity(format!(
                "the entry of {} ({start}+{len}) is outside its block of {} bytes in pack {pack}",
                row.hash,
                block.len()
            ))
            .into()),
        }
    }

    async fn read_block(
        &self,
        app: &AppId,
        space: &SpaceId,
        pack: &str,
        span: PackSpan,
    ) -> Result<Bytes, ContentError> {
        use tokio::io::AsyncReadExt;
        if span.block_offset < 0 || span.block_bytes <= 0 || span.block_bytes as usize > BLOCK_MAX {
            return Err(integrity(format!(
                "pack {pack}: a block at {} of {} bytes",
                span.block_offset, span.block_bytes
            ))
            .into());
        }
        let (start, len) = (span.block_offset as u64, span.block_bytes as u64);
        let key = pack_key(app, space, pack);
        let Some((reader, _)) = self
            .blobs
            .get(&key, Some((start, start + len)))
            .await
            .map_err(|e| ApiError::storage_unavailable("reading a pack", e))?
        else {
            return Err(ContentError::Moved);
        };
        let mut frame = Vec::with_capacity(len as usize);
        reader
            .take(len)
            .read_to_end(&mut frame)
            .await
            .map_err(|e| ApiError::storage_unavailable("reading a pack", e))?;
        if frame.len() as u64 != len {
            return Err(integrity(format!(
                "pack {pack} ends inside the block at {start} ({} of {len} bytes)",
                frame.len()
            ))
            .into());
        }
        let block = tokio::task::spawn_blocking(move || zstd::bulk::decompress(&frame, BLOCK_MAX))
            .await
            .map_err(|e| ApiError::internal("decoding a pack block", e))?
            .map_err(|e| integrity(format!("the block at {start} of pack {pack}: {e}")))?;
        Ok(Bytes::from(block))
    }

    /// One packing step over a partition (each GC pass runs one): deletes what a crashed
    /// packer left and packs nothing points at, then writes at most one pack, of loose small
    /// nodes and of the live entries of packs worth rewriting.
    pub async fn pack_pass(&self, app: &AppId, space: &SpaceId) -> ApiResult<PackOutcome> {
        if self.config.pack_max_node_bytes == 0 {
            return Ok(PackOutcome::default());
        }
        let holder = ulid::Ulid::generate().to_string();
        let now = now_ms();
        let mut p = self.meta.gate(app, space).await?;
        let acquired = p
            .acquire_packer(&holder, now, now + self.config.gc_stale_mark_ms as i64)
            .await?;
        p.commit().await?;
        let Some(leftovers) = acquired else {
            return Ok(PackOutcome::default());
        };
        let outcome = self.pack_locked(app, space, &holder, leftovers).await;
        let mut p = self.meta.gate(app, space).await?;
        p.release_packer(&holder).await?;
        p.commit().await?;
        if let Ok(o) = &outcome
            && *o != PackOutcome::default()
        {
            tracing::info!(app = %app, space = %space, packed = o.packed, written = o.packs_written, deleted = o.packs_deleted, "pack pass");
        }
        outcome
    }

    async fn pack_locked(
        &self,
        app: &AppId,
        space: &SpaceId,
        holder: &str,
        leftovers: Vec<String>,
    ) -> ApiResult<PackOutcome> {
        let mut outcome = PackOutcome {
            packs_deleted: self.drop_packs(app, space, leftovers).await?
                + self.drop_dead_packs(app, space).await?,
            ..Default::default()
        };
        let Some(rows) = self.pack_work(app, space).await? else {
            return Ok(outcome);
        };
        let pack_id = ulid::Ulid::generate().to_string();
        let mut p = self.meta.gate(app, space).await?;
        p.begin_pack(&pack_id, now_ms()).await?;
        p.commit().await?;
        if failpoint::hit("pack.after_begin").await {
            return Err(failed("pack.after_begin"));
        }
        let _permit = self.in_memory_permit().await?;
        let mut entries = self.pack_entries(app, space, rows).await?;
        if entries.is_empty() {
            outcome.packs_deleted += self.drop_packs(app, space, vec![pack_id]).await?;
            return Ok(outcome);
        }
        let (level, block_bytes) = (
            self.config.pack_level,
            self.config.pack_block_bytes as usize,
        );
        // Contents are stored with their base64 decoded (linear scans) and compressed, off the
        // async runtime.
        let contents: Vec<(Bytes, Encoding)> = entries
            .iter()
            .map(|e| (e.bytes.clone(), e.encoding))
            .collect();
        let (contents, object, spans) = tokio::task::spawn_blocking(move || {
            let contents: Vec<(Bytes, Encoding)> = contents
                .into_iter()
                .map(|(bytes, encoding)| match encoding {
                    Encoding::Identity => crate::base64_runs::contract_entry(bytes),
                    _ => (bytes, encoding),
                })
                .collect();
            let bytes: Vec<Bytes> = contents.iter().map(|(b, _)| b.clone()).collect();
            build_pack(&bytes, block_bytes, level).map(|(o, s)| (contents, o, s))
        })
        .await
        .map_err(|e| ApiError::internal("building a pack", e))?
        .map_err(|e| ApiError::internal("building a pack", e))?;
        for (e, (bytes, encoding)) in entries.iter_mut().zip(contents) {
            (e.bytes, e.encoding) = (bytes, encoding);
        }
        let object_bytes = object.len() as i64;
        let key = pack_key(app, space, &pack_id);
        self.put_bytes(&key, Bytes::from(object)).await?;
        if failpoint::hit("pack.after_object").await {
            return Err(failed("pack.after_object"));
        }
        let placed: Vec<PackedEntry> = entries
            .iter()
            .zip(spans)
            .map(|(e, (span, share))| PackedEntry {
                hash: e.row.hash,
                old_gen: e.row.object_gen.clone(),
                encoding: e.encoding,
                delta: e.delta,
                span,
                share,
            })
            .collect();
        let mut p = self.meta.gate(app, space).await?;
        if !p.holds_packer(holder).await? {
            // Another packer took over and deletes this pack's row; its object goes too.
            drop(p);
            self.delete_logged(&key).await;
            return Err(ApiError::unavailable(
                "the packer's lock was taken over while it packed",
            ));
        }
        let moved = p
            .commit_pack(&pack_id, object_bytes, &placed, now_ms())
            .await?;
        p.commit().await?;
        if failpoint::hit("pack.after_commit").await {
            return Err(failed("pack.after_commit"));
        }
        outcome.packed = moved as u64;
        outcome.packs_written = 1;
        outcome.packs_deleted += self.drop_dead_packs(app, space).await?;
        Ok(outcome)
    }

    /// The rows to pack now, or `None` when nothing is worth a pack: packs whose dead entries
    /// reached `repack_dead_percent`, then the tier of packs under `pack_merge_bytes` that
    /// [`merge_tier`] takes, then loose small nodes (oldest first), within `pack_max_bytes`.
    async fn pack_work(&self, app: &AppId, space: &SpaceId) -> ApiResult<Option<Vec<NodeRow>>> {
        let c = &self.config;
        let now = now_ms();
        let max_bytes = c.pack_max_bytes as i64;
        let packs = self.meta.packs(app, Some(space)).await?;
        let live = packs
            .iter()
            .filter(|p| p.state == PackState::Live && p.live_nodes > 0);
        let heavy = |p: &PackRow| {
            (p.object_bytes - p.live_bytes) * 100 >= c.repack_dead_percent as i64 * p.object_bytes
        };
        let (heavy, small): (Vec<&PackRow>, Vec<&PackRow>) = live
            .filter(|p| heavy(p) || p.object_bytes < c.pack_merge_bytes as i64)
            .partition(|p| heavy(p));
        let loose = self
            .meta
            .loose_nodes(app, space, c.pack_max_node_bytes as i64, MAX_ENTRIES as i64)
            .await?;
        let loose_due = loose.len() as u64 >= c.pack_min_nodes.max(1)
            || loose
                .first()
                .is_some_and(|(_, created)| *created <= now - c.pack_delay_ms as i64);
        let merged = merge_tier(
            small,
            if loose_due {
                loose.iter().map(|(r, _)| r.stored_bytes).sum()
            } else {
                0
            },
        );
        if heavy.is_empty() && !loose_due && merged.is_empty() {
            return Ok(None);
        }
        let mut rows: Vec<NodeRow> = Vec::new();
        let mut seen: HashSet<Hash> = HashSet::new();
        let mut total = 0i64;
        let mut sources = 0;
        for p in heavy.iter().chain(merged.iter()) {
            let members = self.meta.pack_members(app, space, &p.pack_id).await?;
            let size: i64 = members.iter().map(|r| r.size).sum();
            if !rows.is_empty()
                && (total + size > max_bytes || rows.len() + members.len() > MAX_ENTRIES)
            {
                continue;
            }
            total += size;
            sources += 1;
            rows.extend(members.into_iter().filter(|r| seen.insert(r.hash)));
        }
        let before_loose = rows.len();
        for (r, _) in loose {
            if rows.len() >= MAX_ENTRIES || (!rows.is_empty() && total + r.size > max_bytes) {
                break;
            }
            if seen.insert(r.hash) {
                total += r.size;
                rows.push(r);
            }
        }
        // A lone pack rewritten with nothing else is only worth it for its dead entries.
        let lone = sources == 1 && rows.len() == before_loose && heavy.is_empty();
        if rows.is_empty() || lone {
            return Ok(None);
        }
        Ok(Some(rows))
    }

    /// The entries of `rows` in chain order, read and verified: a node's content as it is, or
    /// its delta frame when its base stays outside the pack. Rows that moved or were collected
    /// meanwhile are left out, as are rows that cannot be read (logged; `fsck` reports them).
    async fn pack_entries(
        &self,
        app: &AppId,
        space: &SpaceId,
        rows: Vec<NodeRow>,
    ) -> ApiResult<Vec<Entry>> {
        let in_pack: HashSet<Hash> = rows.iter().map(|r| r.hash).collect();
        let mut entries = Vec::with_capacity(rows.len());
        for row in chain_order(rows, &in_pack) {
            let keep = row.delta.filter(|d| !in_pack.contains(&d.hash));
            // The content is rebuilt and verified either way: a damaged node is not packed.
            let got = match self.stored_content(app, space, &row).await {
                Ok(content) => match keep {
                    // (Its base64 runs are decoded where the pack is built.)
                    None => Ok((content, Encoding::Identity)),
                    Some(_) => self
                        .object_bytes(app, space, &row, true)
                        .await
                        .map(|frame| (frame, Encoding::ZstdDelta)),
                },
                Err(e) => Err(e),
            };
            match got {
                Ok((bytes, encoding)) => entries.push(Entry {
                    row,
                    bytes,
                    encoding,
                    delta: keep,
                }),
                Err(ContentError::Moved) => {}
                Err(ContentError::Failed(e)) => {
                    tracing::warn!(app = %app, space = %space, node = %row.hash, error = %e.message, "a node could not be read for packing; it stays where it is");
                }
            }
        }
        Ok(entries)
    }

    /// Deletes the objects of packs (`writing` ones, or live ones nothing points at) and then
    /// their rows; answers how many went.
    async fn drop_packs(&self, app: &AppId, space: &SpaceId, ids: Vec<String>) -> ApiResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let gone = self
            .delete_objects(ids, |id| pack_key(app, space, id))
            .await;
        let mut p = self.meta.gate(app, space).await?;
        p.forget_packs(&gone).await?;
        p.commit().await?;
        Ok(gone.len() as u64)
    }

    async fn drop_dead_packs(&self, app: &AppId, space: &SpaceId) -> ApiResult<u64> {
        let mut p = self.meta.gate(app, space).await?;
        let dead = p.dead_packs().await?;
        p.commit().await?;
        self.drop_packs(app, space, dead).await
    }
}

/// The small packs to merge with `written` bytes of new nodes: smallest first, each while it
/// is at most twice what is written with it, so that a pack grows geometrically and a node is
/// rewritten a logarithmic number of times rather than at every pass. Without new nodes, the
/// smallest pack starts the merge, which is only worth it for two packs or more.
fn merge_tier(mut small: Vec<&PackRow>, written: i64) -> Vec<&PackRow> {
    small.sort_by_key(|p| p.object_bytes);
    let mut merged = Vec::new();
    let mut acc = written;
    for p in small {
        if acc == 0 || p.object_bytes <= 2 * acc {
            acc += p.object_bytes;
            merged.push(p);
        } else {
            break;
        }
    }
    if written == 0 && merged.len() < 2 {
        merged.clear();
    }
    merged
}

fn failed(point: &str) -> ApiError {
    ApiError::storage_unavailable("packing", format!("failpoint {point}"))
}

/// `rows` ordered so that a node comes right after the node it is a delta against (when that
/// one is among them), depth first from the others in their order.
fn chain_order(rows: Vec<NodeRow>, in_pack: &HashSet<Hash>) -> Vec<NodeRow> {
    let mut children: HashMap<Hash, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match r
            .delta
            .filter(|d| d.hash != r.hash && in_pack.contains(&d.hash))
        {
            Some(d) => children.entry(d.hash).or_default().push(i),
            None => roots.push(i),
        }
    }
    let mut placed = vec![false; rows.len()];
    let mut order = Vec::with_capacity(rows.len());
    for root in roots {
        let mut stack = vec![root];
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut placed[i], true) {
                continue;
            }
            order.push(i);
            if let Some(c) = children.get(&rows[i].hash) {
                stack.extend(c.iter().rev());
            }
        }
    }
    // Rows on a cycle (which no store writes) go last.
    order.extend((0..rows.len()).filter(|i| !placed[*i]));
    let mut slots: Vec<Option<NodeRow>> = rows.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::DeltaBase;

    fn row(i: u8, base: Option<u8>) -> NodeRow {
        NodeRow {
            hash: Hash::digest(&[i]),
            size: 1,
            content_type: "application/octet-stream".into(),
            ref_count: 0,
            object_gen: "g".into(),
            encoding: Encoding::Identity,
            stored_bytes: 1,
            lease_started_at: 0,
            lease_expires_at: 0,
            child_ref_count: 0,
            rooted: false,
            collecting_since: None,
            delta: base.map(|b| DeltaBase {
                hash: Hash::digest(&[b]),
                depth: 1,
            }),
            pack: None,
            held: false,
        }
    }

    #[test]
    fn small_packs_merge_in_tiers() {
        let pack = |id: &str, bytes: i64| PackRow {
            space: "s".parse().unwrap(),
            pack_id: id.into(),
            state: PackState::Live,
            object_bytes: bytes,
            live_nodes: 1,
            live_bytes: bytes,
            created_at: 0,
        };
        let (a, b, c) = (pack("a", 100), pack("b", 180), pack("c", 1000));
        let ids = |m: Vec<&PackRow>| m.iter().map(|p| p.pack_id.clone()).collect::<Vec<_>>();
        // 100 new bytes take the 100-byte pack, then (200 written) the 180-byte one; not 1000.
        assert_eq!(ids(merge_tier(vec![&c, &b, &a], 100)), ["a", "b"]);
        // Few new bytes: the packs stay as they are.
        assert!(merge_tier(vec![&c, &b, &a], 40).is_empty());
        // No new bytes: two packs of a tier merge; one alone, or one far larger, does not.
        assert_eq!(ids(merge_tier(vec![&b, &a], 0)), ["a", "b"]);
        assert!(merge_tier(vec![&c], 0).is_empty());
        assert!(merge_tier(vec![&c, &a], 0).is_empty());
    }

    #[test]
    fn versions_follow_their_bases() {
        // 3 -> 1, 2 -> 0, 4 -> 3, 5 -> 9 (outside)
        let rows = vec![
            row(0, None),
            row(1, None),
            row(2, Some(0)),
            row(3, Some(1)),
            row(4, Some(3)),
            row(5, Some(9)),
        ];
        let in_pack: HashSet<Hash> = rows.iter().map(|r| r.hash).collect();
        let order: Vec<Hash> = chain_order(rows, &in_pack).iter().map(|r| r.hash).collect();
        let h = |i: u8| Hash::digest(&[i]);
        assert_eq!(order, vec![h(0), h(2), h(1), h(3), h(4), h(5)]);
    }
}
