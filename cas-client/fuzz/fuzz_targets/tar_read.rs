//! The push-sync tar reader on arbitrary bytes: no panic, bounded memory, and an accepted
//! archive gives a tree whose every path parses and whose planned nodes hash to themselves.
#![no_main]

use cas_client::TreeBuilder;
use cas_client::tarball::{TarLimits, read_tar};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(spool) = tempfile::tempfile() else { return };
    let mut builder = TreeBuilder::new(spool, 1_000);
    let limits = TarLimits { max_bytes: 1 << 20 };
    let Ok(summary) = read_tar(data, &limits, &mut builder) else { return };
    assert_eq!(summary.received, data.len() as u64);
    let files = builder.stats().files;
    let (plan, root, stats) = builder.finish().expect("an accepted archive plans");
    assert_eq!(stats.files, files);
    assert!(plan.nodes.contains_key(&root));
});
