//! Property tests of the codecs: round trips, canonical re-encoding, and rejection of every
//! single-byte corruption of an archive.

use std::collections::BTreeMap;

use cas_format::archive::{ArchiveLimits, ArchiveReader, ArchiveWriter};
use cas_format::svalue::{self, SValueLimits};
use cas_format::{ContentType, Hash, NodeDescriptor, NodeLimits, Value, decode_portable};
use proptest::prelude::*;

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        (-(1i64 << 53) + 1..(1i64 << 53)).prop_map(|i| i as f64),
        (-1000i64..1000).prop_map(|i| i as f64),
        any::<f64>().prop_filter("finite", |f| f.is_finite()
            && (f.fract() != 0.0 || f.abs() < 9.0e15)),
        any::<f32>()
            .prop_filter("finite", |f| f.is_finite() && f.fract() != 0.0)
            .prop_map(f64::from),
        (-1000i32..1000).prop_map(|i| i as f64 + 0.5),
    ]
}

fn hash() -> impl Strategy<Value = Hash> {
    any::<[u8; 32]>().prop_map(Hash::from_bytes)
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number().prop_map(Value::Number),
        ".{0,40}".prop_map(Value::String),
        hash().prop_map(Value::Blob),
    ];
    leaf.prop_recursive(6, 256, 12, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            prop::collection::btree_map(".{0,12}", inner, 0..12)
                .prop_map(|m: BTreeMap<String, Value>| Value::Map(m)),
        ]
    })
}

/// Corrupts an encoding in one of several ways.
fn mutate(mut bytes: Vec<u8>, kind: u8, at: usize, byte: u8) -> Vec<u8> {
    if bytes.is_empty() {
        return vec![byte];
    }
    let at = at % bytes.len();
    match kind % 4 {
        0 => bytes[at] ^= byte | 1,
        1 => bytes.insert(at, byte),
        2 => {
            bytes.remove(at);
        }
        _ => bytes.truncate(at),
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn accepted_values_decode_to_themselves(v in value()) {
        if let Ok(enc) = svalue::encode(&v) {
            let (back, refs) = svalue::decode(&enc.bytes).unwrap();
            prop_assert_eq!(&back, &v);
            prop_assert_eq!(&refs, &enc.refs);
            prop_assert_eq!(svalue::extract_refs(&enc.bytes, &SValueLimits::default()).unwrap(), refs);
            // The JSON form round-trips too.
            let json = back.to_json_string();
            prop_assert_eq!(Value::from_json_str(&json).unwrap(), v);
        }
    }

    #[test]
    fn accepted_bytes_reencode_identically(v in value(), kind: u8, at: usize, byte: u8) {
        let Ok(enc) = svalue::encode(&v) else { return Ok(()) };
        let bytes = mutate(enc.bytes, kind, at, byte);
        if let Ok((decoded, refs)) = svalue::decode(&bytes) {
            let again = svalue::encode(&decoded).unwrap();
            prop_assert_eq!(again.bytes, bytes);
            prop_assert_eq!(again.refs, refs);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_reencode_if_accepted(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok((decoded, _)) = svalue::decode(&bytes) {
            prop_assert_eq!(svalue::encode(&decoded).unwrap().bytes, bytes);
        }
    }

    #[test]
    fn our_encoding_means_the_same_to_ciborium(v in value()) {
        let Ok(enc) = svalue::encode(&v) else { return Ok(()) };
        let theirs: ciborium::Value = ciborium::from_reader(&enc.bytes[..]).unwrap();
        prop_assert!(same_meaning(&v, &theirs), "{v:?} vs {theirs:?}");
    }

    #[test]
    fn nodes_round_trip(
        ct in "[ -~]{1,64}",
        refs in prop::collection::vec(hash(), 0..8),
        content in prop::collection::vec(any::<u8>(), 0..512),
        split in any::<usize>(),
    ) {
        let desc = NodeDescriptor::new(ContentType::new(ct).unwrap(), refs, content.len() as u64);
        let bytes = desc.encode_portable(&content).unwrap();
        let node = decode_portable(&bytes, &NodeLimits::default()).unwrap();
        prop_assert_eq!(&node.descriptor, &desc);
        prop_assert_eq!(node.content, &content[..]);
        prop_assert_eq!(node.hash, desc.hash_of(&content).unwrap());
        let mut v = cas_format::NodeStreamValidator::new(NodeLimits::default());
        let at = split % (bytes.len() + 1);
        let mut got = v.update(&bytes[..at]).unwrap().to_vec();
        got.extend_from_slice(v.update(&bytes[at..]).unwrap());
        prop_assert_eq!(v.finish(Some(&node.hash)).unwrap(), (desc, node.hash));
        prop_assert_eq!(got, content);
    }

    #[test]
    fn corrupted_nodes_never_verify(
        content in prop::collection::vec(any::<u8>(), 0..64),
        kind: u8, at: usize, byte: u8,
    ) {
        let desc = NodeDescriptor::new(ContentType::octet_stream(), vec![Hash::digest(b"c")], content.len() as u64);
        let bytes = desc.encode_portable(&content).unwrap();
        let expected = Hash::digest(&bytes);
        let bad = mutate(bytes.clone(), kind, at, byte);
        prop_assume!(bad != bytes);
        prop_assert!(cas_format::verify_portable(&bad, &expected, &NodeLimits::default()).is_err());
    }
}

fn same_meaning(ours: &Value, theirs: &ciborium::Value) -> bool {
    use ciborium::Value as C;
    match (ours, theirs) {
        (Value::Null, C::Null) => true,
        (Value::Bool(a), C::Bool(b)) => a == b,
        (Value::Number(n), C::Integer(i)) => {
            let i: i128 = (*i).into();
            n.fract() == 0.0 && *n as i128 == i
        }
        (Value::Number(n), C::Float(f)) => n == f,
        (Value::String(a), C::Text(b)) => a == b,
        (Value::Array(a), C::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_meaning(x, y))
        }
        (Value::Map(a), C::Map(b)) => {
            a.len() == b.len()
                && b.iter().all(|(k, v)| match k {
                    C::Text(k) => a.get(k).is_some_and(|x| same_meaning(x, v)),
                    _ => false,
                })
        }
        (Value::Blob(h), C::Tag(65536, inner)) => {
            matches!(&**inner, C::Bytes(b) if b[..] == h.as_bytes()[..])
        }
        _ => false,
    }
}

/// A small DAG: leaves, a middle SValue node referencing them, and a root.
fn sample_dag(seed: u8, leaves: usize) -> (Vec<Vec<u8>>, Vec<Hash>) {
    let mut nodes = Vec::new();
    let mut leaf_hashes = Vec::new();
    for i in 0..leaves {
        let content = vec![seed.wrapping_add(i as u8); i * 3 + 1];
        let d = NodeDescriptor::new(ContentType::octet_stream(), vec![], content.len() as u64);
        let bytes = d.encode_portable(&content).unwrap();
        leaf_hashes.push(Hash::digest(&bytes));
        nodes.push(bytes);
    }
    let value = Value::map([(
        "chunks",
        Value::Array(leaf_hashes.iter().map(|h| Value::Blob(*h)).collect()),
    )]);
    let enc = svalue::encode(&value).unwrap();
    let d = NodeDescriptor::new(
        ContentType::svalue(),
        enc.refs.clone(),
        enc.bytes.len() as u64,
    );
    let middle = d.encode_portable(&enc.bytes).unwrap();
    let middle_hash = Hash::digest(&middle);
    nodes.push(middle);
    let d = NodeDescriptor::new(
        ContentType::new("application/x-root").unwrap(),
        vec![middle_hash],
        2,
    );
    let root = d.encode_portable(b"ok").unwrap();
    let root_hash = Hash::digest(&root);
    nodes.push(root);
    (nodes, vec![root_hash])
}

fn write_archive(nodes: &[Vec<u8>], roots: &[Hash]) -> Vec<u8> {
    let mut w = ArchiveWriter::new(Vec::new(), roots, ArchiveLimits::default()).unwrap();
    for n in nodes {
        w.write_node(n).unwrap();
    }
    w.finish().unwrap().0
}

fn read_all(
    bytes: &[u8],
) -> Result<(Vec<Vec<u8>>, cas_format::archive::ArchiveSummary), cas_format::archive::ArchiveError>
{
    let mut r = ArchiveReader::new(bytes, ArchiveLimits::default())?;
    let mut nodes = Vec::new();
    while let Some(n) = r.next_node()? {
        nodes.push(n.bytes);
    }
    Ok((nodes, r.summary().cloned().unwrap()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn archives_round_trip(seed: u8, leaves in 0usize..6) {
        let (nodes, roots) = sample_dag(seed, leaves);
        let bytes = write_archive(&nodes, &roots);
        let (back, summary) = read_all(&bytes).unwrap();
        prop_assert_eq!(back, nodes.clone());
        prop_assert_eq!(summary.roots, roots);
        prop_assert_eq!(summary.node_count, nodes.len() as u64);
        prop_assert!(summary.external_refs.is_empty());
        prop_assert_eq!(summary.bytes, bytes.len() as u64);
    }

    #[test]
    fn every_flipped_or_truncated_byte_is_rejected(seed: u8, leaves in 0usize..4, mask in 1u8..) {
        let (nodes, roots) = sample_dag(seed, leaves);
        let bytes = write_archive(&nodes, &roots);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= mask;
            prop_assert!(read_all(&bad).is_err(), "flip of byte {} accepted", i);
            prop_assert!(read_all(&bytes[..i]).is_err(), "truncation to {} accepted", i);
        }
    }
}

#[test]
fn archive_rules_are_enforced() {
    use cas_format::archive::ArchiveError;
    let (nodes, roots) = sample_dag(7, 3);
    // Parent before child.
    let mut w = ArchiveWriter::new(Vec::new(), &roots, ArchiveLimits::default()).unwrap();
    let n = nodes.len();
    w.write_node(&nodes[n - 1]).unwrap();
    assert!(matches!(
        w.write_node(&nodes[n - 2]),
        Err(ArchiveError::ChildAfterParent { .. })
    ));
    // Duplicate node.
    let mut w = ArchiveWriter::new(Vec::new(), &roots, ArchiveLimits::default()).unwrap();
    w.write_node(&nodes[0]).unwrap();
    assert!(matches!(
        w.write_node(&nodes[0]),
        Err(ArchiveError::DuplicateNode { .. })
    ));
    // Missing root.
    let w = ArchiveWriter::new(Vec::new(), &roots, ArchiveLimits::default()).unwrap();
    assert!(matches!(w.finish(), Err(ArchiveError::MissingRoot { .. })));
    // External refs are reported: an archive of the root alone.
    let mut w = ArchiveWriter::new(Vec::new(), &roots, ArchiveLimits::default()).unwrap();
    w.write_node(&nodes[n - 1]).unwrap();
    let (bytes, summary) = w.finish().unwrap();
    assert_eq!(summary.external_refs.len(), 1);
    let (_, read) = read_all(&bytes).unwrap();
    assert_eq!(read.external_refs, summary.external_refs);
    // Trailing bytes.
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(matches!(
        read_all(&trailing),
        Err(ArchiveError::TrailingBytes { .. })
    ));
    // A node record longer than the node limit is refused before reading it.
    let mut huge = bytes[..16 + 32].to_vec();
    huge.push(b'N');
    huge.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        read_all(&huge),
        Err(ArchiveError::NodeTooLarge { .. })
    ));
}

#[test]
fn svalue_limits_are_enforced_before_allocation() {
    use cas_format::svalue::SValueError;
    // An array that declares 2^32 items in five bytes.
    let err = svalue::decode(&[0x9a, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
    assert!(matches!(err, SValueError::Limit { .. }), "{err:?}");
    // Depth beyond the limit.
    let deep = [vec![0x81u8; 200], vec![0xf6]].concat();
    assert!(matches!(
        svalue::decode(&deep),
        Err(SValueError::Limit { .. })
    ));
    let limits = SValueLimits {
        max_refs: 1,
        ..Default::default()
    };
    let two = Value::Array(vec![
        Value::Blob(Hash::digest(b"a")),
        Value::Blob(Hash::digest(b"b")),
    ]);
    assert!(svalue::encode_with_limits(&two, &limits).is_err());
    let bytes = svalue::encode(&two).unwrap().bytes;
    assert!(svalue::decode_with_limits(&bytes, &limits).is_err());
    // Integral values outside the safe range are not SValues.
    assert!(svalue::encode(&Value::Number(9007199254740992.0)).is_err());
    assert!(svalue::encode(&Value::Number(f64::NAN)).is_err());
    assert!(Value::from_json_str("9007199254740992").is_err());
    assert!(Value::from_json_str("{\"a\":1,\"a\":2}").is_err());
    assert!(Value::from_json_str("{\"$blob\":\"00\"}").is_err());
    assert!(
        Value::from_json_str(&format!("{{\"$blob\":\"{}\",\"x\":1}}", "0".repeat(64))).is_err()
    );
}
