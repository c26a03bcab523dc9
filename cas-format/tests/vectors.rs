//! Every published vector of node format v1 and SValue v1, read from `tests/vectors/`.

use std::path::PathBuf;

use cas_format::node::{NodeRejectKind, NodeStreamValidator};
use cas_format::svalue::{self, SValueError};
use cas_format::{ContentType, Hash, NodeDescriptor, NodeLimits, Value, decode_portable};
use serde_json::Value as Json;

fn load(name: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/vectors")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hash(v: &Json) -> Hash {
    v.as_str().unwrap().parse().unwrap()
}

/// Interprets a content formula of the form
/// `length N; byte i = (i * A + B) mod M`, the only form the vectors use.
fn content_from_formula(formula: &str) -> Vec<u8> {
    let words: Vec<&str> = formula
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | '=' | '*' | '+'))
        .filter(|w| !w.is_empty())
        .collect();
    match words.as_slice() {
        ["length", n, "byte", "i", "i", a, b, "mod", m] => {
            let (n, a, b, m): (u64, u64, u64, u64) = (
                n.parse().unwrap(),
                a.parse().unwrap(),
                b.parse().unwrap(),
                m.parse().unwrap(),
            );
            (0..n).map(|i| ((i * a + b) % m) as u8).collect()
        }
        _ => panic!("unsupported content formula {formula:?}: extend content_from_formula"),
    }
}

#[test]
fn node_vectors_valid() {
    let doc = load("node-v1.json");
    let valid = doc["valid"].as_array().unwrap();
    assert!(!valid.is_empty());
    for v in valid {
        let name = v["name"].as_str().unwrap();
        let content = match (&v["contentHex"], &v["contentFormula"]) {
            (Json::String(h), _) => unhex(h),
            (_, Json::String(f)) => content_from_formula(f),
            _ => panic!("{name}: no content"),
        };
        let refs: Vec<Hash> = v["refs"].as_array().unwrap().iter().map(hash).collect();
        let ct = ContentType::new(v["contentType"].as_str().unwrap()).unwrap();
        let desc = NodeDescriptor::new(ct, refs, content.len() as u64);
        let bytes = desc.encode_portable(&content).unwrap();
        if let Json::String(h) = &v["canonicalHex"] {
            assert_eq!(bytes, unhex(h), "{name}: canonical bytes");
        }
        assert_eq!(
            bytes.len() as u64,
            v["canonicalLength"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(
            Hash::digest(&bytes),
            hash(&v["canonicalSha256OfBytes"]),
            "{name}"
        );
        let expected = hash(&v["hash"]);
        assert_eq!(
            desc.hash_of(&content).unwrap(),
            expected,
            "{name}: streaming hasher"
        );

        let node = cas_format::verify_portable(&bytes, &expected, &NodeLimits::default()).unwrap();
        assert_eq!(node.descriptor, desc, "{name}");
        assert_eq!(node.content, &content[..], "{name}");

        let mut stream = NodeStreamValidator::new(NodeLimits::default());
        let mut got = Vec::new();
        for chunk in bytes.chunks(4093) {
            got.extend_from_slice(stream.update(chunk).unwrap());
        }
        let (d, h) = stream.finish(Some(&expected)).unwrap();
        assert_eq!(
            (d, h, got),
            (desc, expected, content),
            "{name}: stream validator"
        );
    }
}

fn reject_kind(word: &str) -> NodeRejectKind {
    match word {
        "signature" => NodeRejectKind::Signature,
        "version" => NodeRejectKind::Version,
        "flags" => NodeRejectKind::Flags,
        "reserved" => NodeRejectKind::Reserved,
        "length" => NodeRejectKind::Length,
        "digest" => NodeRejectKind::Digest,
        "content type" => NodeRejectKind::ContentType,
        other => panic!("unknown reject category {other:?}"),
    }
}

#[test]
fn node_vectors_malformed() {
    let doc = load("node-v1.json");
    let malformed = doc["malformed"].as_array().unwrap();
    assert!(!malformed.is_empty());
    for v in malformed {
        let name = v["name"].as_str().unwrap();
        let bytes = unhex(v["canonicalHex"].as_str().unwrap());
        let expected = hash(&v["expectedHash"]);
        let want = reject_kind(v["reject"].as_str().unwrap());
        let err =
            cas_format::verify_portable(&bytes, &expected, &NodeLimits::default()).expect_err(name);
        assert_eq!(err.kind(), want, "{name}: {err}");

        let mut stream = NodeStreamValidator::new(NodeLimits::default());
        let streamed = stream
            .update(&bytes)
            .map(|_| ())
            .and_then(|_| stream.finish(Some(&expected)).map(|_| ()));
        assert_eq!(
            streamed.expect_err(name).kind(),
            want,
            "{name}: stream validator"
        );
    }
}

#[test]
fn svalue_vectors_encode() {
    let doc = load("svalue-v1.json");
    let content_type = ContentType::new(doc["contentType"].as_str().unwrap()).unwrap();
    assert!(content_type.is_svalue());
    let cases = doc["encode"].as_array().unwrap();
    assert!(!cases.is_empty());
    for v in cases {
        let name = v["name"].as_str().unwrap();
        let value: Value = serde_json::from_value(v["json"].clone()).unwrap();
        let encoded = svalue::encode(&value).unwrap();
        let cbor = unhex(v["cborHex"].as_str().unwrap());
        assert_eq!(encoded.bytes, cbor, "{name}: bytes");
        let refs: Vec<Hash> = v["refs"].as_array().unwrap().iter().map(hash).collect();
        assert_eq!(encoded.refs, refs, "{name}: refs");
        let desc = NodeDescriptor::new(content_type.clone(), refs.clone(), cbor.len() as u64);
        assert_eq!(
            desc.hash_of(&cbor).unwrap(),
            hash(&v["nodeHash"]),
            "{name}: node hash"
        );

        let (decoded, decoded_refs) = svalue::decode(&cbor).unwrap();
        assert_eq!(decoded, value, "{name}: decode");
        assert_eq!(decoded_refs, refs, "{name}: decoded refs");
        assert_eq!(
            svalue::extract_refs(&cbor, &Default::default()).unwrap(),
            refs
        );
        // The JSON form survives a round trip through text.
        let again = Value::from_json_str(&decoded.to_json_string()).unwrap();
        assert_eq!(
            svalue::encode(&again).unwrap().bytes,
            cbor,
            "{name}: json round trip"
        );
    }
}

/// The specific error each published reject reason must produce; an unlisted reason only has
/// to be rejected.
fn expected_error(why: &str, err: &SValueError) -> bool {
    use SValueError::*;
    match why {
        "non-shortest integer" => matches!(err, NonShortestHead { .. }),
        "integral value as float" | "integral float beyond the safe range" => {
            matches!(err, IntegralFloat { .. })
        }
        "undefined" | "simple value" => matches!(err, SimpleValue { .. }),
        "byte string outside SBlob" => matches!(err, ByteString { .. }),
        "unknown tag" => matches!(err, UnknownTag { .. }),
        "trailing bytes" => matches!(err, TrailingBytes { .. }),
        "SBlob not 32 bytes" => matches!(err, BlobLength { .. }),
        "map keys out of order" => matches!(err, KeyOrder { .. }),
        "duplicate key" => matches!(err, DuplicateKey { .. }),
        "indefinite length" => matches!(err, IndefiniteLength { .. }),
        "invalid UTF-8" => matches!(err, InvalidUtf8 { .. }),
        "NaN" | "infinity" => matches!(err, NonFiniteFloat { .. }),
        "non-string key" => matches!(err, NonStringKey { .. }),
        w if w.starts_with("non-shortest float") => matches!(err, NonShortestFloat { .. }),
        "integer beyond 2^53-1" => matches!(err, IntegerOutOfRange { .. }),
        _ => true,
    }
}

#[test]
fn svalue_vectors_reject() {
    let doc = load("svalue-v1.json");
    let cases = doc["reject"].as_array().unwrap();
    assert!(!cases.is_empty());
    for v in cases {
        let why = v["why"].as_str().unwrap();
        let bytes = unhex(v["cborHex"].as_str().unwrap());
        let err = svalue::decode(&bytes).expect_err(why);
        assert!(expected_error(why, &err), "{why}: got {err:?}");
        assert!(
            svalue::extract_refs(&bytes, &Default::default()).is_err(),
            "{why}"
        );
    }
}

/// The copies here must be the published vectors when those are at hand.
#[test]
fn vectors_match_the_published_copies_when_present() {
    let published = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors");
    if !published.is_dir() {
        return;
    }
    for name in ["node-v1.json", "svalue-v1.json"] {
        let ours = load(name);
        let theirs: Json =
            serde_json::from_str(&std::fs::read_to_string(published.join(name)).unwrap()).unwrap();
        assert_eq!(ours, theirs, "{name} differs from the published vectors");
    }
}

#[test]
fn decode_portable_rejects_short_input() {
    for n in 0..24 {
        let err = decode_portable(&vec![0x55; n], &NodeLimits::default()).unwrap_err();
        assert_eq!(err.kind(), NodeRejectKind::Length);
    }
}
