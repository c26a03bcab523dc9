//! `fsck` of packs: pack rows against their objects and the rows that point at them, packed
//! rows against their entries, and pack objects without a row.

use std::collections::BTreeMap;

use cas_format::SpaceId;

use super::{FsckOptions, FsckReport};
use crate::Service;
use crate::blob::pack_key;
use crate::meta::{NodeRow, PackRow, PackState};

/// The pack rows of what is checked, by (Space, pack id).
pub(super) struct PackIndex(BTreeMap<(SpaceId, String), PackRow>);

impl PackIndex {
    pub(super) async fn load(svc: &Service, opts: &FsckOptions) -> anyhow::Result<PackIndex> {
        Ok(PackIndex(
            svc.meta
                .packs(&opts.app, opts.space.as_ref())
                .await?
                .into_iter()
                .map(|p| ((p.space.clone(), p.pack_id.clone()), p))
                .collect(),
        ))
    }

    pub(super) fn has(&self, space: &SpaceId, pack: &str) -> bool {
        self.0.contains_key(&(space.clone(), pack.to_string()))
    }
}

impl Service {
    /// A ready packed row: its pack is live and holds its block; with `verify_content`, the
    /// entry (through its delta chain, if any) rebuilds the node's content.
    pub(super) async fn check_packed(
        &self,
        opts: &FsckOptions,
        packs: &PackIndex,
        space: &SpaceId,
        row: &NodeRow,
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        let Some(span) = row.pack else {
            return Ok(());
        };
        let pack = packs.0.get(&(space.clone(), row.object_gen.clone()));
        let Some(pack) = pack.filter(|p| p.state == PackState::Live) else {
            report.bad(
                "missing-pack",
                format!(
                    "{space}/{}: packed in {}, which is not a live pack",
                    row.hash, row.object_gen
                ),
            );
            return Ok(());
        };
        if span.block_offset < 0
            || span.block_bytes <= 0
            || span.block_offset + span.block_bytes > pack.object_bytes
        {
            report.bad(
                "pack-index",
                format!(
                    "{space}/{}: its block {}+{} is outside pack {} of {} bytes",
                    row.hash, span.block_offset, span.block_bytes, pack.pack_id, pack.object_bytes
                ),
            );
            return Ok(());
        }
        self.check_rebuilt(
            opts,
            space,
            row,
            ("missing-pack", "its pack object is missing"),
            report,
        )
        .await
    }

    /// Every live pack's object exists with its recorded size, and its counts equal the rows
    /// that point at it; rows pointing at a pack without a row are reported per node.
    pub(super) async fn check_packs(
        &self,
        opts: &FsckOptions,
        packs: &PackIndex,
        report: &mut FsckReport,
    ) -> anyhow::Result<()> {
        let counted: BTreeMap<(SpaceId, String), (i64, i64)> = self
            .meta
            .pack_recount(&opts.app, opts.space.as_ref())
            .await?
            .into_iter()
            .map(|(space, pack, nodes, bytes)| ((space, pack), (nodes, bytes)))
            .collect();
        for ((space, id), p) in &packs.0 {
            if p.state == PackState::Writing {
                report.note(
                    "pack-writing",
                    format!("{space}/{id}: being written, or left by a packer that stopped; the next packer of the Space deletes it"),
                );
                continue;
            }
            let key = pack_key(&opts.app, space, id);
            match self.blobs.get(&key, None).await? {
                // A packer stopped between deleting a dead pack's object and its row.
                None if p.live_nodes == 0 => report.note(
                    "dead-pack",
                    format!("{key}: no row points at it and its object is gone; the next packer forgets it"),
                ),
                None => report.bad(
                    "missing-pack",
                    format!("{key}: live pack without its object"),
                ),
                Some((_, len)) if len as i64 != p.object_bytes => report.bad(
                    "pack-size",
                    format!("{key}: holds {len} bytes, its row says {}", p.object_bytes),
                ),
                Some(_) => {}
            }
            let (nodes, bytes) = counted
                .get(&(space.clone(), id.clone()))
                .copied()
                .unwrap_or((0, 0));
            if (nodes, bytes) != (p.live_nodes, p.live_bytes) {
                report.bad(
                    "pack-count",
                    format!(
                        "{space}/{id}: counts {} nodes of {} bytes, but {nodes} rows of {bytes} bytes point at it",
                        p.live_nodes, p.live_bytes
                    ),
                );
            }
        }
        Ok(())
    }
}
