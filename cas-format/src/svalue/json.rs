//! The JSON form of an SValue: ordinary JSON, with an SBlob written as `{"$blob": "<64 hex>"}`.
//! A map whose only key is `$blob` is reserved for SBlobs; `$blob` beside other keys is refused,
//! as are duplicate keys and numbers that are not SValue numbers.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{MAX_SAFE_INTEGER, Value};
use crate::hash::Hash;

/// The reserved key of the JSON form of an SBlob.
pub const BLOB_KEY: &str = "$blob";

/// Why a JSON text is not the JSON form of an SValue.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

impl Value {
    /// Parses the JSON form (strict: no duplicate keys, `$blob` reserved, numbers within range).
    pub fn from_json_str(s: &str) -> Result<Value, JsonError> {
        serde_json::from_str(s).map_err(|e| JsonError(e.to_string()))
    }

    /// Parses the JSON form from bytes.
    pub fn from_json_slice(s: &[u8]) -> Result<Value, JsonError> {
        serde_json::from_slice(s).map_err(|e| JsonError(e.to_string()))
    }

    /// The compact JSON form.
    pub fn to_json_string(&self) -> String {
        // Serializing a Value into a String cannot fail: every number is finite by construction
        // of the decoder, and a non-finite one (possible only in a hand-built value) becomes null.
        serde_json::to_string(self).unwrap_or_else(|_| "null".to_string())
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Number(n) => match self.as_i64() {
                Some(i) => s.serialize_i64(i),
                None => s.serialize_f64(*n),
            },
            Value::String(v) => s.serialize_str(v),
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
            Value::Blob(h) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry(BLOB_KEY, &h.to_hex())?;
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

fn number<E: de::Error>(n: f64) -> Result<Value, E> {
    if !n.is_finite() {
        return Err(E::custom("numbers must be finite"));
    }
    if n.fract() == 0.0 && n.abs() > MAX_SAFE_INTEGER as f64 {
        return Err(E::custom(format_args!("integer {n} is beyond ±(2^53 − 1)")));
    }
    Ok(Value::Number(n))
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an SValue in JSON form")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Value::deserialize(d)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Value, E> {
        if i.unsigned_abs() > MAX_SAFE_INTEGER as u64 {
            return Err(E::custom(format_args!("integer {i} is beyond ±(2^53 − 1)")));
        }
        Ok(Value::Number(i as f64))
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Value, E> {
        if u > MAX_SAFE_INTEGER as u64 {
            return Err(E::custom(format_args!("integer {u} is beyond 2^53 − 1")));
        }
        Ok(Value::Number(u as f64))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        number(n)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if entries.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            let value = map.next_value::<Value>()?;
            entries.insert(key, value);
        }
        match entries.remove(BLOB_KEY) {
            None => Ok(Value::Map(entries)),
            Some(Value::String(hex)) if entries.is_empty() => hex
                .parse::<Hash>()
                .map(Value::Blob)
                .map_err(|e| de::Error::custom(format_args!("invalid $blob: {e}"))),
            Some(_) if entries.is_empty() => Err(de::Error::custom(
                "$blob must be a string of 64 lowercase hex characters",
            )),
            Some(_) => Err(de::Error::custom(
                "$blob is reserved for SBlobs and cannot stand beside other keys",
            )),
        }
    }
}
