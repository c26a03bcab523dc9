//! The bytes of a pack object: entries cut into blocks of about `pack_block_bytes`, each block
//! one checksummed zstd frame, and each entry's place in it and share of its bytes.

use bytes::Bytes;

use crate::meta::PackSpan;

/// An entry's place in a pack, and its share of its block's bytes.
pub type Placed = (PackSpan, i64);

/// Cuts `entries` into blocks of about `block_bytes` (a block takes at least one entry),
/// compresses each block as one checksummed zstd frame, and answers the pack object with each
/// entry's place and its share of its block's bytes (the shares of a block sum to its bytes).
pub fn build_pack(
    entries: &[Bytes],
    block_bytes: usize,
    level: i32,
) -> std::io::Result<(Vec<u8>, Vec<Placed>)> {
    let mut object = Vec::new();
    let mut spans = Vec::with_capacity(entries.len());
    let mut compressor = zstd::bulk::Compressor::new(level)?;
    compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    let mut i = 0;
    while i < entries.len() {
        let start = i;
        let mut len = 0;
        while i < entries.len() && (i == start || len + entries[i].len() <= block_bytes) {
            len += entries[i].len();
            i += 1;
        }
        let block = &entries[start..i];
        let mut content = Vec::with_capacity(len);
        for e in block {
            content.extend_from_slice(e);
        }
        let frame = compressor.compress(&content)?;
        let (block_offset, frame_bytes) = (object.len() as i64, frame.len() as i64);
        object.extend_from_slice(&frame);
        // Shares by content (plus one, so that an empty node has a share too).
        let total: i64 = block.iter().map(|e| e.len() as i64 + 1).sum();
        let (mut given, mut entry_offset) = (0i64, 0i64);
        for (k, e) in block.iter().enumerate() {
            let share = if k + 1 == block.len() {
                frame_bytes - given
            } else {
                frame_bytes * (e.len() as i64 + 1) / total
            };
            given += share;
            spans.push((
                PackSpan {
                    block_offset,
                    block_bytes: frame_bytes,
                    entry_offset,
                    entry_bytes: e.len() as i64,
                },
                share,
            ));
            entry_offset += e.len() as i64;
        }
    }
    Ok((object, spans))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::pack::BLOCK_MAX;

    #[test]
    fn a_pack_holds_every_entry_and_its_shares_sum_to_it() {
        let entries: Vec<Bytes> = (0..50u32)
            .map(|i| Bytes::from(format!("cell {i}\n").repeat((i as usize % 7) * 40)))
            .collect();
        let (object, spans) = build_pack(&entries, 4096, 3).unwrap();
        assert_eq!(spans.len(), entries.len());
        assert_eq!(
            spans.iter().map(|(_, s)| s).sum::<i64>(),
            object.len() as i64
        );
        let blocks: HashSet<i64> = spans.iter().map(|(s, _)| s.block_offset).collect();
        assert!(blocks.len() > 1, "cut into blocks");
        for (e, (span, share)) in entries.iter().zip(&spans) {
            assert!(*share >= 0);
            let start = span.block_offset as usize;
            let frame = &object[start..start + span.block_bytes as usize];
            let block = zstd::bulk::decompress(frame, BLOCK_MAX).unwrap();
            let at = span.entry_offset as usize;
            assert_eq!(&block[at..at + span.entry_bytes as usize], &e[..]);
        }
        // A damaged frame does not decode (the checksum).
        let mut damaged = object.clone();
        let (first, _) = spans[0];
        damaged[first.block_bytes as usize / 2] ^= 0x40;
        let frame = &damaged[..first.block_bytes as usize];
        assert!(zstd::bulk::decompress(frame, BLOCK_MAX).is_err());
    }
}
