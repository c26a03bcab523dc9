//! The archive reader on arbitrary bytes: no panic, bounded allocation, and an accepted archive
//! re-written node by node gives the same bytes.
#![no_main]

use cas_format::archive::{ArchiveLimits, ArchiveReader, ArchiveWriter};
use cas_format::NodeLimits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = ArchiveLimits {
        node: NodeLimits { max_content_size: 1 << 20, max_canonical_size: 1 << 20, ..NodeLimits::default() },
        max_nodes: 10_000,
        ..ArchiveLimits::default()
    };
    let Ok(mut reader) = ArchiveReader::new(data, limits) else { return };
    let roots = reader.roots().to_vec();
    let mut nodes = Vec::new();
    loop {
        match reader.next_node() {
            Ok(Some(n)) => nodes.push(n.bytes),
            Ok(None) => break,
            Err(_) => return,
        }
    }
    let mut w = ArchiveWriter::new(Vec::new(), &roots, limits).unwrap();
    for n in &nodes {
        w.write_node(n).unwrap();
    }
    let (bytes, summary) = w.finish().unwrap();
    assert_eq!(bytes, data);
    assert_eq!(Some(&summary), reader.summary());
});
