//! The SValue decoder on arbitrary bytes: no panic; accepted bytes re-encode to themselves and
//! the ref-only walk agrees with the full decode.
#![no_main]

use cas_format::svalue::{self, SValueLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = SValueLimits::default();
    let full = svalue::decode_with_limits(data, &limits);
    let refs = svalue::extract_refs(data, &limits);
    match (full, refs) {
        (Ok((value, refs)), Ok(walked)) => {
            assert_eq!(refs, walked);
            let again = svalue::encode_with_limits(&value, &limits).unwrap();
            assert_eq!(again.bytes, data);
            assert_eq!(again.refs, refs);
        }
        (Err(_), Err(_)) => {}
        (a, b) => panic!("decoders disagree: {a:?} vs {b:?}"),
    }
});
