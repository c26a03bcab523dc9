//! The deterministic encoder: shortest heads, canonically ordered map keys, shortest exact
//! floats, integral numbers as integers.

use super::{MAX_SAFE_INTEGER, SBLOB_TAG, SValueError, SValueLimit, SValueLimits, Value};
use crate::hash::Hash;

/// Canonical bytes of a value and the SBlob hashes met in encoded preorder (its refs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub refs: Vec<Hash>,
}

/// Encodes under the default limits.
pub fn encode(value: &Value) -> Result<Encoded, SValueError> {
    encode_with_limits(value, &SValueLimits::default())
}

/// Encodes, refusing values that a decoder with the same `limits` would refuse.
pub fn encode_with_limits(value: &Value, limits: &SValueLimits) -> Result<Encoded, SValueError> {
    let mut e = Encoder {
        out: Vec::new(),
        refs: Vec::new(),
        limits,
    };
    e.value(value, 1)?;
    check(SValueLimit::Bytes, e.out.len() as u64, limits.max_bytes)?;
    Ok(Encoded {
        bytes: e.out,
        refs: e.refs,
    })
}

fn check(what: SValueLimit, value: u64, limit: u64) -> Result<(), SValueError> {
    if value > limit {
        Err(SValueError::EncodeLimit { what, value, limit })
    } else {
        Ok(())
    }
}

struct Encoder<'l> {
    out: Vec<u8>,
    refs: Vec<Hash>,
    limits: &'l SValueLimits,
}

pub(super) fn write_head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        out.push(m | arg as u8);
    } else if arg <= u8::MAX as u64 {
        out.extend_from_slice(&[m | 24, arg as u8]);
    } else if arg <= u16::MAX as u64 {
        out.push(m | 25);
        out.extend_from_slice(&(arg as u16).to_be_bytes());
    } else if arg <= u32::MAX as u64 {
        out.push(m | 26);
        out.extend_from_slice(&(arg as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&arg.to_be_bytes());
    }
}

/// Order of map keys: the bytewise order of their encodings, which for text strings with
/// shortest heads is length first, then bytes.
pub(super) fn canonical_key_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

impl Encoder<'_> {
    fn value(&mut self, v: &Value, depth: u32) -> Result<(), SValueError> {
        check(
            SValueLimit::Depth,
            depth as u64,
            self.limits.max_depth as u64,
        )?;
        match v {
            Value::Null => self.out.push(0xf6),
            Value::Bool(false) => self.out.push(0xf4),
            Value::Bool(true) => self.out.push(0xf5),
            Value::Number(n) => self.number(*n)?,
            Value::String(s) => self.string(s)?,
            Value::Array(items) => {
                check(
                    SValueLimit::ArrayLength,
                    items.len() as u64,
                    self.limits.max_array_len,
                )?;
                write_head(&mut self.out, 4, items.len() as u64);
                for item in items {
                    self.value(item, depth + 1)?;
                }
            }
            Value::Map(entries) => {
                check(
                    SValueLimit::MapEntries,
                    entries.len() as u64,
                    self.limits.max_map_entries,
                )?;
                write_head(&mut self.out, 5, entries.len() as u64);
                let mut sorted: Vec<(&String, &Value)> = entries.iter().collect();
                sorted.sort_unstable_by(|a, b| canonical_key_order(a.0, b.0));
                for (k, item) in sorted {
                    self.string(k)?;
                    self.value(item, depth + 1)?;
                }
            }
            Value::Blob(h) => {
                check(
                    SValueLimit::Refs,
                    self.refs.len() as u64 + 1,
                    self.limits.max_refs,
                )?;
                write_head(&mut self.out, 6, SBLOB_TAG);
                write_head(&mut self.out, 2, 32);
                self.out.extend_from_slice(h.as_bytes());
                self.refs.push(*h);
            }
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<(), SValueError> {
        check(
            SValueLimit::StringBytes,
            s.len() as u64,
            self.limits.max_string_bytes,
        )?;
        write_head(&mut self.out, 3, s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn number(&mut self, n: f64) -> Result<(), SValueError> {
        if !n.is_finite() {
            return Err(SValueError::NonFiniteNumber);
        }
        if n.fract() == 0.0 {
            if n.abs() > MAX_SAFE_INTEGER as f64 {
                return Err(SValueError::UnsafeInteger { value: n });
            }
            let i = n as i64;
            if i >= 0 {
                write_head(&mut self.out, 0, i as u64);
            } else {
                write_head(&mut self.out, 1, (-1 - i) as u64);
            }
            return Ok(());
        }
        let single = n as f32;
        if single as f64 == n {
            let h = half::f16::from_f32(single);
            if h.to_f64() == n {
                self.out.push(0xf9);
                self.out.extend_from_slice(&h.to_bits().to_be_bytes());
            } else {
                self.out.push(0xfa);
                self.out.extend_from_slice(&single.to_bits().to_be_bytes());
            }
        } else {
            self.out.push(0xfb);
            self.out.extend_from_slice(&n.to_bits().to_be_bytes());
        }
        Ok(())
    }
}
