//! The node decoders on arbitrary bytes: no panic, and the slice decoder, the streaming
//! validator (fed in two parts) and re-encoding all agree.
#![no_main]

use cas_format::{NodeLimits, NodeStreamValidator, decode_portable};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = NodeLimits { max_content_size: 1 << 20, max_canonical_size: 1 << 20, ..NodeLimits::default() };
    let whole = decode_portable(data, &limits);
    let split = data.first().map_or(0, |b| *b as usize % (data.len() + 1));
    let mut v = NodeStreamValidator::new(limits);
    let streamed = v
        .update(&data[..split])
        .map(|c| c.to_vec())
        .and_then(|mut c| {
            c.extend_from_slice(v.update(&data[split..])?);
            Ok(c)
        })
        .and_then(|c| v.finish(None).map(|(d, h)| (d, h, c)));
    match (whole, streamed) {
        (Ok(node), Ok((d, h, content))) => {
            assert_eq!(node.descriptor, d);
            assert_eq!(node.hash, h);
            assert_eq!(node.content, &content[..]);
            assert_eq!(node.descriptor.encode_portable(node.content).unwrap(), data);
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("decoders disagree: {a:?} vs {b:?}"),
    }
});
