//! The path normaliser on arbitrary strings: no panic, and a parsed path is a bounded list of
//! plain components that parses again to itself, so it can only name something below a root.
#![no_main]

use cas_client::parse_path;
use cas_client::tree::{MAX_PATH_BYTES, MAX_PATH_DEPTH, valid_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let Ok(parts) = parse_path(s) else { return };
    assert!(!parts.is_empty() && parts.len() <= MAX_PATH_DEPTH);
    assert!(parts.iter().all(|p| valid_name(p) && p != ".." && p != "." && !p.contains('/')));
    let joined = parts.join("/");
    assert!(joined.len() <= MAX_PATH_BYTES);
    assert_eq!(parse_path(&joined).expect("a parsed path parses again"), parts);
});
