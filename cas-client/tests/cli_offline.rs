//! The offline `unicas` commands, run as a real process against the published vectors.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use cas_format::archive::{ArchiveLimits, ArchiveWriter};
use cas_format::{ContentType, Hash, NodeDescriptor};
use serde_json::Value as Json;

fn unicas(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_unicas"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn vectors(name: &str) -> Json {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../cas-format/tests/vectors")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A failure prints nothing on stdout and exactly one line on stderr.
fn assert_clean_failure(o: &Output) {
    assert!(!o.status.success());
    assert!(
        o.stdout.is_empty(),
        "stdout: {:?}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(err.starts_with("unicas: "), "stderr: {err}");
}

#[test]
fn hash_matches_node_vectors() {
    let doc = vectors("node-v1.json");
    for v in doc["valid"].as_array().unwrap() {
        let Some(hex) = v["contentHex"].as_str() else {
            continue;
        };
        let mut args = vec!["hash", "--content-type", v["contentType"].as_str().unwrap()];
        for r in v["refs"].as_array().unwrap() {
            args.extend(["--ref", r.as_str().unwrap()]);
        }
        let out = unicas(&args, &unhex(hex));
        assert_eq!(
            stdout(&out).trim(),
            v["hash"].as_str().unwrap(),
            "{}",
            v["name"]
        );
        let portable = unhex(v["canonicalHex"].as_str().unwrap());
        let out = unicas(&["hash", "--portable"], &portable);
        assert_eq!(
            stdout(&out).trim(),
            v["hash"].as_str().unwrap(),
            "{}",
            v["name"]
        );
    }
    for v in doc["malformed"].as_array().unwrap() {
        let out = unicas(
            &["hash", "--portable"],
            &unhex(v["canonicalHex"].as_str().unwrap()),
        );
        if v["reject"] == "digest" {
            // Structurally valid: it simply has another hash than the one expected.
            assert_ne!(stdout(&out).trim(), v["expectedHash"].as_str().unwrap());
        } else {
            assert_clean_failure(&out);
        }
    }
}

#[test]
fn hash_of_a_file_argument() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.txt");
    std::fs::write(&path, b"hello, unicas\n").unwrap();
    let out = unicas(
        &[
            "hash",
            "--content-type",
            "text/plain",
            path.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(
        stdout(&out).trim(),
        "8d7c77a04452ece5159b303b275bb83a64752dbfc98c8e1706531728af393faa"
    );
    let out = unicas(
        &[
            "--json",
            "hash",
            "--content-type",
            "text/plain",
            path.to_str().unwrap(),
        ],
        b"",
    );
    let j: Json = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        j["hash"],
        "8d7c77a04452ece5159b303b275bb83a64752dbfc98c8e1706531728af393faa"
    );
    assert_clean_failure(&unicas(
        &["hash", "--content-type", "text/plain", "/nonexistent/x"],
        b"",
    ));
    assert_clean_failure(&unicas(&["hash", "--content-type", "bad\u{1}type"], b""));
}

#[test]
fn svalue_commands_match_vectors() {
    let doc = vectors("svalue-v1.json");
    for v in doc["encode"].as_array().unwrap() {
        let json = serde_json::to_vec(&v["json"]).unwrap();
        let cbor = unhex(v["cborHex"].as_str().unwrap());
        let out = unicas(&["svalue", "encode"], &json);
        assert!(out.status.success());
        assert_eq!(out.stdout, cbor, "{}", v["name"]);
        let out = unicas(&["svalue", "hash"], &json);
        assert_eq!(stdout(&out).trim(), v["nodeHash"].as_str().unwrap());
        let out = unicas(&["svalue", "decode"], &cbor);
        let back: Json = serde_json::from_str(&stdout(&out)).unwrap();
        let again = unicas(&["svalue", "encode"], back.to_string().as_bytes());
        assert_eq!(again.stdout, cbor, "{}", v["name"]);
    }
    for v in doc["reject"].as_array().unwrap() {
        assert_clean_failure(&unicas(
            &["svalue", "decode"],
            &unhex(v["cborHex"].as_str().unwrap()),
        ));
    }
    for bad in [
        "{\"a\":1,\"a\":2}",
        "9007199254740992",
        "{\"$blob\":\"xyz\"}",
        "[1,",
        "",
    ] {
        assert_clean_failure(&unicas(&["svalue", "encode"], bad.as_bytes()));
        assert_clean_failure(&unicas(&["svalue", "hash"], bad.as_bytes()));
    }
}

fn leaf(content: &[u8]) -> (Hash, Vec<u8>) {
    let d = NodeDescriptor::new(ContentType::octet_stream(), vec![], content.len() as u64);
    let bytes = d.encode_portable(content).unwrap();
    (Hash::digest(&bytes), bytes)
}

#[test]
fn archive_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (child, child_bytes) = leaf(b"child");
    let d = NodeDescriptor::new(
        ContentType::new("application/x-parent").unwrap(),
        vec![child],
        1,
    );
    let parent_bytes = d.encode_portable(b"p").unwrap();
    let parent = Hash::digest(&parent_bytes);

    let mut w = ArchiveWriter::new(Vec::new(), &[parent], ArchiveLimits::default()).unwrap();
    w.write_node(&child_bytes).unwrap();
    w.write_node(&parent_bytes).unwrap();
    let (bytes, _) = w.finish().unwrap();
    let good = dir.path().join("good.ucar");
    std::fs::write(&good, &bytes).unwrap();
    let out = unicas(&["archive", "verify", good.to_str().unwrap()], b"");
    assert_eq!(stdout(&out), format!("root {parent}\nnodes 2\n"));
    let out = unicas(
        &["--json", "archive", "verify", good.to_str().unwrap()],
        b"",
    );
    let j: Json = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(j["nodeCount"], 2);
    assert_eq!(j["roots"][0], parent.to_string());

    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let bad = dir.path().join("bad.ucar");
    std::fs::write(&bad, &flipped).unwrap();
    assert_clean_failure(&unicas(&["archive", "verify", bad.to_str().unwrap()], b""));
    std::fs::write(&bad, &bytes[..bytes.len() - 1]).unwrap();
    assert_clean_failure(&unicas(&["archive", "verify", bad.to_str().unwrap()], b""));

    // The parent alone: its child is outside the archive.
    let mut w = ArchiveWriter::new(Vec::new(), &[parent], ArchiveLimits::default()).unwrap();
    w.write_node(&parent_bytes).unwrap();
    let (partial, _) = w.finish().unwrap();
    let p = dir.path().join("partial.ucar");
    std::fs::write(&p, &partial).unwrap();
    assert_clean_failure(&unicas(&["archive", "verify", p.to_str().unwrap()], b""));
    let out = unicas(
        &["archive", "verify", "--allow-external", p.to_str().unwrap()],
        b"",
    );
    assert_eq!(
        stdout(&out),
        format!("root {parent}\nnodes 1\nexternal {child}\n")
    );
}
