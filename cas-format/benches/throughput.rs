//! Throughput of node validation and the SValue codec, each beside a baseline from the same run.
//!
//! Run with `cargo bench -p cas-format --bench throughput`. Prints MB/s (10^6 bytes per second,
//! median of the runs) and the ratios:
//! - node validation (streaming validator, slice decoder, descriptor hasher) on a 32 MiB node,
//!   against raw SHA-256 of the same bytes with the same `sha2` crate, and `openssl dgst -sha256`
//!   of the same bytes in a file;
//! - SValue encode and decode of a large nested value.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use cas_format::node::NodeStreamValidator;
use cas_format::svalue::{self, SValueLimits};
use cas_format::{ContentType, Hash, NodeDescriptor, NodeLimits, Value, decode_portable};
use sha2::{Digest, Sha256};

const RUNS: usize = 15;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn measure(mut f: impl FnMut()) -> Duration {
    f(); // warm-up
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn mbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn main() {
    // Cargo passes `--bench`; ignore arguments.
    let content_len = 32 << 20;
    let content: Vec<u8> = (0..content_len as u64)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let desc = NodeDescriptor::new(
        ContentType::octet_stream(),
        vec![Hash::digest(b"a"), Hash::digest(b"b")],
        content.len() as u64,
    );
    let node = desc.encode_portable(&content).unwrap();
    let limits = NodeLimits {
        max_content_size: 64 << 20,
        max_canonical_size: 64 << 20,
        ..NodeLimits::default()
    };
    let n = node.len();

    let raw = measure(|| {
        black_box(Sha256::digest(black_box(&node)));
    });
    let stream = measure(|| {
        let mut v = NodeStreamValidator::new(limits);
        for chunk in node.chunks(1 << 20) {
            black_box(v.update(chunk).unwrap());
        }
        black_box(v.finish(None).unwrap());
    });
    let slice = measure(|| {
        black_box(decode_portable(black_box(&node), &limits).unwrap());
    });
    let hasher = measure(|| {
        black_box(desc.hash_of(black_box(&content)).unwrap());
    });
    let openssl = openssl_dgst(&node);

    println!(
        "node validation, {} MiB node, median of {RUNS} runs",
        n >> 20
    );
    println!(
        "  {:<44} {:>9.0} MB/s",
        "raw SHA-256 (sha2, same bytes)",
        mbps(n, raw)
    );
    for (name, d) in [
        ("streaming validator, 1 MiB chunks", stream),
        ("slice decoder (decode_portable)", slice),
        ("descriptor hasher (hash_of)", hasher),
    ] {
        println!(
            "  {:<44} {:>9.0} MB/s   ratio to raw {:.3}",
            name,
            mbps(n, d),
            raw.as_secs_f64() / d.as_secs_f64()
        );
    }
    match openssl {
        Some(d) => println!(
            "  {:<44} {:>9.0} MB/s   (process + file read included; raw/openssl {:.3})",
            "openssl dgst -sha256 (same bytes, file)",
            mbps(n, d),
            d.as_secs_f64() / raw.as_secs_f64()
        ),
        None => println!("  openssl dgst -sha256: openssl not found"),
    }
    println!(
        "  SHA-NI available: {}",
        std::arch::is_x86_feature_detected!("sha")
    );

    let value = large_value();
    let limits = SValueLimits {
        max_refs: u64::MAX,
        ..SValueLimits::default()
    };
    let encoded = svalue::encode_with_limits(&value, &limits).unwrap();
    let bytes = encoded.bytes.len();
    let enc = measure(|| {
        black_box(svalue::encode_with_limits(black_box(&value), &limits).unwrap());
    });
    let dec = measure(|| {
        black_box(svalue::decode_with_limits(black_box(&encoded.bytes), &limits).unwrap());
    });
    let refs = measure(|| {
        black_box(svalue::extract_refs(black_box(&encoded.bytes), &limits).unwrap());
    });
    let raw_small = measure(|| {
        black_box(Sha256::digest(black_box(&encoded.bytes)));
    });
    println!(
        "SValue codec, nested value of {:.1} MB ({} refs), median of {RUNS} runs",
        bytes as f64 / 1e6,
        encoded.refs.len()
    );
    for (name, d) in [
        ("encode", enc),
        ("decode (build value)", dec),
        ("validate and extract refs", refs),
        ("raw SHA-256 of the encoding (baseline)", raw_small),
    ] {
        println!("  {:<44} {:>9.0} MB/s", name, mbps(bytes, d));
    }
}

/// `openssl dgst -sha256` of the bytes written to a temporary file; median wall time.
fn openssl_dgst(bytes: &[u8]) -> Option<Duration> {
    let dir = std::env::temp_dir().join(format!("cas-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let path = dir.join("node.bin");
    std::fs::File::create(&path).ok()?.write_all(bytes).ok()?;
    let expected = Hash::digest(bytes).to_hex();
    let mut samples = Vec::new();
    for _ in 0..RUNS + 1 {
        let t = Instant::now();
        let out = Command::new("openssl")
            .args(["dgst", "-sha256", "-r"])
            .arg(&path)
            .output()
            .ok()?;
        samples.push(t.elapsed());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with(&expected), "openssl disagrees: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    samples.remove(0);
    Some(median(samples))
}

/// About 20 MB: a tree of directories whose entries carry metadata, numbers, text and SBlobs.
fn large_value() -> Value {
    let mut dirs = BTreeMap::new();
    for d in 0..400u32 {
        let mut entries = BTreeMap::new();
        for f in 0..250u32 {
            let i = d * 1000 + f;
            entries.insert(
                format!("file-{f:04}.py"),
                Value::map([
                    ("kind", Value::from("file")),
                    ("node", Value::Blob(Hash::digest(&i.to_le_bytes()))),
                    ("size", Value::from(i as i64 * 37)),
                    ("mtime", Value::Number(1.7e12 + i as f64 + 0.25)),
                    ("executable", Value::Bool(i % 7 == 0)),
                    ("note", Value::from(format!("generated entry number {i}"))),
                ]),
            );
        }
        dirs.insert(format!("dir-{d:03}"), Value::Map(entries));
    }
    Value::map([
        ("entries", Value::Map(dirs)),
        ("version", Value::from(1i64)),
    ])
}
