//! The public UniCAS Space API's OpenAPI document (a copy of the public project's
//! `app-space-v1.openapi.json` in `tests/openapi/`) as a checker of this server's answers: an
//! answer's status must be one its operation lists, its documented headers must be present and
//! match their schemas, and a JSON body must validate against the response schema (JSON Schema
//! 2020-12, as OpenAPI 3.1 has it). Node bytes are not validated: a content read answers with
//! the node's own `Content-Type`, which the contract allows any of.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, anyhow, bail};
use reqwest::header::HeaderMap;
use serde_json::Value;

/// One checked answer: the operation, its status, and the `error` code of a JSON error body.
pub type Seen = (String, u16, Option<String>);

/// The document, and what was checked against it.
pub struct Contract {
    doc: Value,
    seen: std::sync::Mutex<Vec<Seen>>,
}

impl Contract {
    /// Loads the copy of the upstream document.
    pub fn load() -> anyhow::Result<Self> {
        let path = format!(
            "{}/openapi/upstream-app-space-v1.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let doc: Value = serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("parsing {path}"))?;
        Ok(Contract {
            doc,
            seen: Default::default(),
        })
    }

    /// Every operation of the document: operation id to (method, path).
    pub fn operations(&self) -> BTreeMap<String, (String, String)> {
        let mut out = BTreeMap::new();
        for (path, item) in self.doc["paths"].as_object().into_iter().flatten() {
            for (method, op) in item.as_object().into_iter().flatten() {
                if let Some(id) = op["operationId"].as_str() {
                    out.insert(id.to_string(), (method.clone(), path.clone()));
                }
            }
        }
        out
    }

    /// The statuses an operation lists.
    pub fn statuses(&self, operation: &str) -> anyhow::Result<BTreeSet<u16>> {
        let op = self.operation(operation)?;
        Ok(op["responses"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(s, _)| s.parse().ok())
            .collect())
    }

    fn operation(&self, id: &str) -> anyhow::Result<&Value> {
        self.doc["paths"]
            .as_object()
            .into_iter()
            .flatten()
            .flat_map(|(_, item)| item.as_object().into_iter().flatten())
            .map(|(_, op)| op)
            .find(|op| op["operationId"] == id)
            .ok_or_else(|| anyhow!("the contract has no operation {id}"))
    }

    /// Checks one answer of `operation`; returns its JSON body (`Null` for node bytes).
    pub fn check(
        &self,
        operation: &str,
        status: u16,
        headers: &HeaderMap,
        body: &[u8],
    ) -> anyhow::Result<Value> {
        let op = self.operation(operation)?;
        let response = op["responses"].get(status.to_string()).ok_or_else(|| {
            anyhow!("{operation} answered {status}, which the contract does not list")
        })?;
        let response = self.resolve(response, 0)?;
        for (name, header) in response["headers"].as_object().into_iter().flatten() {
            let header = self.resolve(header, 0)?;
            let value = match headers.get(name.as_str()) {
                Some(v) => v.to_str().context("a header that is not text")?,
                None if header["required"] == true => {
                    bail!("{operation} {status}: the required header {name} is missing")
                }
                None => continue,
            };
            validate(&header["schema"], &Value::String(value.to_string()))
                .with_context(|| format!("{operation} {status}: header {name}: {value:?}"))?;
        }
        let content = response["content"].as_object();
        let json_schema = content.and_then(|c| c.get("application/json"));
        let value = match json_schema {
            Some(media) => {
                let ct = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                if !ct.starts_with("application/json") {
                    bail!("{operation} {status}: Content-Type {ct:?}, the contract says JSON");
                }
                let value: Value = serde_json::from_slice(body).with_context(|| {
                    format!(
                        "{operation} {status}: the body is not JSON: {}",
                        String::from_utf8_lossy(body)
                    )
                })?;
                validate(&media["schema"], &value)
                    .with_context(|| format!("{operation} {status}: {value}"))?;
                value
            }
            None => Value::Null,
        };
        let code = value["error"].as_str().map(str::to_string);
        self.seen.lock().map_err(|_| anyhow!("poisoned"))?.push((
            operation.to_string(),
            status,
            code,
        ));
        Ok(value)
    }

    /// What was checked so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// `v` with every local `$ref` replaced by what it names (a bounded depth: the document
    /// has no recursive schemas).
    fn resolve(&self, v: &Value, depth: usize) -> anyhow::Result<Value> {
        if depth > 32 {
            bail!("references nest too deep");
        }
        Ok(match v {
            Value::Object(map) => {
                if let Some(target) = map.get("$ref").and_then(Value::as_str) {
                    let pointer = target
                        .strip_prefix('#')
                        .ok_or_else(|| anyhow!("a reference outside the document: {target}"))?;
                    let named = self
                        .doc
                        .pointer(pointer)
                        .ok_or_else(|| anyhow!("a reference to nothing: {target}"))?;
                    return self.resolve(named, depth + 1);
                }
                let mut out = serde_json::Map::new();
                for (k, v) in map {
                    out.insert(k.clone(), self.resolve(v, depth + 1)?);
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|i| self.resolve(i, depth + 1))
                    .collect::<anyhow::Result<_>>()?,
            ),
            other => other.clone(),
        })
    }
}

/// Validates `instance` against `schema` (already free of references).
fn validate(schema: &Value, instance: &Value) -> anyhow::Result<()> {
    let validator = jsonschema::draft202012::new(schema)
        .map_err(|e| anyhow!("the contract's schema does not compile: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("does not match the contract: {}", errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::{HeaderMap, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    /// The checker refuses what the contract does not allow.
    #[test]
    fn answers_outside_the_contract_are_refused() -> anyhow::Result<()> {
        let c = Contract::load()?;
        let json = headers(&[("content-type", "application/json")]);
        let page = br#"{"refDomain": "docs", "revision": 1, "items": [], "nextCursor": null}"#;
        c.check("listRootRefs", 200, &json, page)?;
        // A missing required field, a code the status does not list, a status no operation
        // lists, a body that is not JSON.
        let no_domain = br#"{"revision": 1, "items": [], "nextCursor": null}"#;
        assert!(c.check("listRootRefs", 200, &json, no_domain).is_err());
        assert!(
            c.check("getUsage", 429, &json, br#"{"error": "RATE_LIMITED"}"#)
                .is_err()
        );
        assert!(c.check("getUsage", 418, &json, b"{}").is_err());
        assert!(c.check("getUsage", 200, &json, b"not json").is_err());
        // Node bytes need their headers, and the children's header is checked.
        let read = [
            ("accept-ranges", "bytes"),
            ("content-length", "3"),
            ("content-type", "text/plain"),
            ("x-cas-refs", ""),
        ];
        c.check("readContent", 200, &headers(&read), b"abc")?;
        assert!(
            c.check("readContent", 200, &headers(&read[..3]), b"abc")
                .is_err()
        );
        let mut bad_refs = read;
        bad_refs[3] = ("x-cas-refs", "not-a-hash");
        assert!(
            c.check("readContent", 200, &headers(&bad_refs), b"abc")
                .is_err()
        );
        assert_eq!(
            c.seen().len(),
            2,
            "only the answers that passed are counted"
        );
        Ok(())
    }
}
