//! The strict decoder: accepts exactly the bytes the encoder produces and nothing else.
//!
//! Each rule is checked where the item is read, so errors carry the item's offset. Declared
//! lengths are checked against the limits and against the bytes that remain before anything is
//! allocated. [`extract_refs`] walks the same rules without building the value, so a service
//! can check a large node's refs in memory proportional to its nesting, not its size.

use std::collections::BTreeMap;

use super::{MAX_SAFE_INTEGER, SBLOB_TAG, SValueError, SValueLimit, SValueLimits, Value};
use crate::hash::Hash;

/// Decodes under the default limits; returns the value and its refs in encoded preorder.
pub fn decode(bytes: &[u8]) -> Result<(Value, Vec<Hash>), SValueError> {
    decode_with_limits(bytes, &SValueLimits::default())
}

/// Decodes under `limits`; returns the value and its refs in encoded preorder.
pub fn decode_with_limits(
    bytes: &[u8],
    limits: &SValueLimits,
) -> Result<(Value, Vec<Hash>), SValueError> {
    let mut d = Decoder::new(bytes, limits)?;
    let v = d.value::<true>(1)?;
    d.end()?;
    Ok((v, d.refs))
}

/// Checks that `bytes` are a canonical SValue under `limits` and returns its refs, without
/// building the value.
pub fn extract_refs(bytes: &[u8], limits: &SValueLimits) -> Result<Vec<Hash>, SValueError> {
    let mut d = Decoder::new(bytes, limits)?;
    d.value::<false>(1)?;
    d.end()?;
    Ok(d.refs)
}

struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: &'a SValueLimits,
    refs: Vec<Hash>,
}

/// A decoded head: major type, additional information, argument, and where it started.
struct Head {
    major: u8,
    info: u8,
    arg: u64,
    at: usize,
}

impl<'a> Decoder<'a> {
    fn new(buf: &'a [u8], limits: &'a SValueLimits) -> Result<Self, SValueError> {
        if buf.len() as u64 > limits.max_bytes {
            return Err(SValueError::Limit {
                what: SValueLimit::Bytes,
                value: buf.len() as u64,
                limit: limits.max_bytes,
                offset: 0,
            });
        }
        Ok(Decoder {
            buf,
            pos: 0,
            limits,
            refs: Vec::new(),
        })
    }

    fn end(&self) -> Result<(), SValueError> {
        if self.pos != self.buf.len() {
            return Err(SValueError::TrailingBytes {
                offset: self.pos as u64,
            });
        }
        Ok(())
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, item_at: usize) -> Result<&'a [u8], SValueError> {
        if n > self.remaining() {
            return Err(SValueError::Truncated {
                offset: item_at as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn be(&mut self, n: u64, at: usize) -> Result<u64, SValueError> {
        Ok(self
            .take(n, at)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | *b as u64))
    }

    /// Reads a head of major types 0..=6, requiring the shortest form and a definite length.
    fn head(&mut self) -> Result<Head, SValueError> {
        let at = self.pos;
        let initial = self.take(1, at)?[0];
        let major = initial >> 5;
        let info = initial & 0x1f;
        let offset = at as u64;
        let arg = match info {
            0..=23 => info as u64,
            24..=27 if major == 7 => 0, // floats and one-byte simple values: see `value`
            24 => self.be(1, at)?,
            25 => self.be(2, at)?,
            26 => self.be(4, at)?,
            27 => self.be(8, at)?,
            28..=30 => return Err(SValueError::ReservedHead { offset, info }),
            _ => return Err(SValueError::IndefiniteLength { offset }),
        };
        let minimum = match info {
            24 => 24,
            25 => 1 << 8,
            26 => 1 << 16,
            27 => 1 << 32,
            _ => 0,
        };
        if major != 7 && arg < minimum {
            return Err(SValueError::NonShortestHead { offset });
        }
        Ok(Head {
            major,
            info,
            arg,
            at,
        })
    }

    fn limit(
        &self,
        what: SValueLimit,
        value: u64,
        limit: u64,
        at: usize,
    ) -> Result<(), SValueError> {
        if value > limit {
            return Err(SValueError::Limit {
                what,
                value,
                limit,
                offset: at as u64,
            });
        }
        Ok(())
    }

    fn text(&mut self, h: &Head) -> Result<&'a str, SValueError> {
        self.limit(
            SValueLimit::StringBytes,
            h.arg,
            self.limits.max_string_bytes,
            h.at,
        )?;
        let bytes = self.take(h.arg, h.at)?;
        std::str::from_utf8(bytes).map_err(|_| SValueError::InvalidUtf8 {
            offset: h.at as u64,
        })
    }

    /// Decodes one item. With `BUILD = false` it validates only and returns `Value::Null`.
    fn value<const BUILD: bool>(&mut self, depth: u32) -> Result<Value, SValueError> {
        let h = self.head()?;
        let offset = h.at as u64;
        self.limit(
            SValueLimit::Depth,
            depth as u64,
            self.limits.max_depth as u64,
            h.at,
        )?;
        match h.major {
            0 => {
                if h.arg > MAX_SAFE_INTEGER as u64 {
                    return Err(SValueError::IntegerOutOfRange { offset });
                }
                Ok(Value::Number(h.arg as f64))
            }
            1 => {
                // The value is -1 - arg; its magnitude arg + 1 must stay within 2^53 - 1.
                if h.arg >= MAX_SAFE_INTEGER as u64 {
                    return Err(SValueError::IntegerOutOfRange { offset });
                }
                Ok(Value::Number(-1.0 - h.arg as f64))
            }
            2 => Err(SValueError::ByteString { offset }),
            3 => {
                let s = self.text(&h)?;
                Ok(if BUILD {
                    Value::String(s.to_owned())
                } else {
                    Value::Null
                })
            }
            4 => {
                self.limit(
                    SValueLimit::ArrayLength,
                    h.arg,
                    self.limits.max_array_len,
                    h.at,
                )?;
                // Every item takes at least one byte.
                if h.arg > self.remaining() {
                    return Err(SValueError::Truncated { offset });
                }
                let mut items = Vec::with_capacity(if BUILD { h.arg as usize } else { 0 });
                for _ in 0..h.arg {
                    let item = self.value::<BUILD>(depth + 1)?;
                    if BUILD {
                        items.push(item);
                    }
                }
                Ok(if BUILD {
                    Value::Array(items)
                } else {
                    Value::Null
                })
            }
            5 => self.map::<BUILD>(&h, depth),
            6 => {
                if h.arg != SBLOB_TAG {
                    return Err(SValueError::UnknownTag { offset, tag: h.arg });
                }
                let inner = self.head()?;
                if inner.major != 2 {
                    return Err(SValueError::BlobLength {
                        offset: inner.at as u64,
                        len: 0,
                    });
                }
                if inner.arg != 32 {
                    return Err(SValueError::BlobLength {
                        offset: inner.at as u64,
                        len: inner.arg,
                    });
                }
                self.limit(
                    SValueLimit::Refs,
                    self.refs.len() as u64 + 1,
                    self.limits.max_refs,
                    h.at,
                )?;
                let bytes = self.take(32, inner.at)?;
                let hash = Hash::from_slice(bytes).ok_or(SValueError::Truncated { offset })?;
                self.refs.push(hash);
                Ok(Value::Blob(hash))
            }
            _ => self.simple_or_float(&h),
        }
    }

    fn map<const BUILD: bool>(&mut self, h: &Head, depth: u32) -> Result<Value, SValueError> {
        self.limit(
            SValueLimit::MapEntries,
            h.arg,
            self.limits.max_map_entries,
            h.at,
        )?;
        // Every entry takes at least two bytes.
        if h.arg > self.remaining() / 2 {
            return Err(SValueError::Truncated {
                offset: h.at as u64,
            });
        }
        let mut entries = BTreeMap::new();
        let mut previous: Option<&'a [u8]> = None;
        for _ in 0..h.arg {
            let key_head = self.head()?;
            if key_head.major != 3 {
                return Err(SValueError::NonStringKey {
                    offset: key_head.at as u64,
                });
            }
            let key = self.text(&key_head)?;
            let encoded_key = &self.buf[key_head.at..self.pos];
            if let Some(prev) = previous {
                match prev.cmp(encoded_key) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => {
                        return Err(SValueError::DuplicateKey {
                            offset: key_head.at as u64,
                            key: key.to_owned(),
                        });
                    }
                    std::cmp::Ordering::Greater => {
                        return Err(SValueError::KeyOrder {
                            offset: key_head.at as u64,
                        });
                    }
                }
            }
            previous = Some(encoded_key);
            let item = self.value::<BUILD>(depth + 1)?;
            if BUILD {
                entries.insert(key.to_owned(), item);
            }
        }
        Ok(if BUILD {
            Value::Map(entries)
        } else {
            Value::Null
        })
    }

    fn simple_or_float(&mut self, h: &Head) -> Result<Value, SValueError> {
        let offset = h.at as u64;
        let n = match h.info {
            20 => return Ok(Value::Bool(false)),
            21 => return Ok(Value::Bool(true)),
            22 => return Ok(Value::Null),
            0..=19 | 23 => {
                return Err(SValueError::SimpleValue {
                    offset,
                    value: h.info as u64,
                });
            }
            24 => {
                let value = self.be(1, h.at)?;
                return Err(SValueError::SimpleValue { offset, value });
            }
            25 => half::f16::from_bits(self.be(2, h.at)? as u16).to_f64(),
            26 => f32::from_bits(self.be(4, h.at)? as u32) as f64,
            _ => f64::from_bits(self.be(8, h.at)?),
        };
        if !n.is_finite() {
            return Err(SValueError::NonFiniteFloat { offset });
        }
        if n.fract() == 0.0 {
            return Err(SValueError::IntegralFloat { offset });
        }
        let shorter_exists = match h.info {
            26 => half::f16::from_f64(n).to_f64() == n,
            27 => (n as f32) as f64 == n,
            _ => false,
        };
        if shorter_exists {
            return Err(SValueError::NonShortestFloat { offset });
        }
        Ok(Value::Number(n))
    }
}
