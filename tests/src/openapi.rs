//! Whether an OpenAPI document keeps everything a published one promised: every path,
//! operation, parameter, schema and property of the old document is in the new one with the
//! same types and constraints; the new one may add. Prose (`description`, `summary`, examples)
//! may change. References are resolved before comparing, so naming an inline schema (a
//! `$ref` to an equivalent component) is not a change, and `oneOf [null, X]` reads as `X`
//! that may be null.

use serde_json::{Map, Value};

const PROSE: &[&str] = &["description", "summary", "title", "example", "examples"];

/// What the new document dropped or changed, one line each; empty when it only adds.
pub fn breaking_changes(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let cx = Docs { old, new };
    cx.compare(old, new, "#", 0, &mut out);
    out
}

struct Docs<'a> {
    old: &'a Value,
    new: &'a Value,
}

impl Docs<'_> {
    fn compare(&self, old: &Value, new: &Value, at: &str, depth: usize, out: &mut Vec<String>) {
        if depth > 64 {
            return;
        }
        let old = normalize(self.old, resolve(self.old, old));
        let new = normalize(self.new, resolve(self.new, new));
        match (&old, &new) {
            (Value::Object(o), Value::Object(n)) => {
                self.compare_objects(o, n, at, depth, out);
            }
            (Value::Array(o), Value::Array(n)) => {
                for (i, item) in o.iter().enumerate() {
                    match n.get(i) {
                        Some(m) => self.compare(item, m, &format!("{at}/{i}"), depth + 1, out),
                        None => out.push(format!("{at}/{i}: removed")),
                    }
                }
            }
            _ if old == new => {}
            _ => out.push(format!("{at}: {old} became {new}")),
        }
    }

    fn compare_objects(
        &self,
        o: &Map<String, Value>,
        n: &Map<String, Value>,
        at: &str,
        depth: usize,
        out: &mut Vec<String>,
    ) {
        for (k, ov) in o {
            if PROSE.contains(&k.as_str()) {
                continue;
            }
            // Accepting fields that were refused before takes nothing away.
            if k == "additionalProperties" && *ov == Value::Bool(false) {
                continue;
            }
            let here = format!("{at}/{k}");
            let Some(nv) = n.get(k) else {
                out.push(format!("{here}: removed"));
                continue;
            };
            match k.as_str() {
                "type" if as_set(ov) != as_set(nv) => {
                    out.push(format!("{here}: {ov} became {nv}"));
                }
                "type" => {}
                "enum" => {
                    for v in as_set(ov) {
                        if !as_set(nv).contains(&v) {
                            out.push(format!("{here}: {v} removed"));
                        }
                    }
                }
                // A tag is its name; its description is prose.
                "tags" => {
                    let names = |v: &Value| -> std::collections::BTreeSet<String> {
                        v.as_array()
                            .into_iter()
                            .flatten()
                            .map(|t| t.get("name").unwrap_or(t).to_string())
                            .collect()
                    };
                    for v in names(ov).difference(&names(nv)) {
                        out.push(format!("{here}: {v} removed"));
                    }
                }
                "required" => {
                    // A property newly required must be a new property.
                    let old_props = o.get("properties").and_then(Value::as_object);
                    let (ov, nv) = (as_set(ov), as_set(nv));
                    for v in ov.difference(&nv) {
                        out.push(format!("{here}: {v} no longer required"));
                    }
                    for v in nv.difference(&ov) {
                        if old_props.is_some_and(|p| p.contains_key(v.trim_matches('"'))) {
                            out.push(format!("{here}: {v} became required"));
                        }
                    }
                }
                "parameters" => self.compare_parameters(ov, nv, &here, depth, out),
                _ => self.compare(ov, nv, &here, depth + 1, out),
            }
        }
    }

    /// Parameters match by name and place, not by position.
    fn compare_parameters(
        &self,
        old: &Value,
        new: &Value,
        at: &str,
        depth: usize,
        out: &mut Vec<String>,
    ) {
        let key = |p: &Value| format!("{}:{}", p["in"], p["name"]);
        let new_params: Vec<&Value> = new.as_array().into_iter().flatten().collect();
        for p in old.as_array().into_iter().flatten() {
            let p = resolve(self.old, p);
            match new_params
                .iter()
                .find(|q| key(resolve(self.new, q)) == key(p))
            {
                Some(q) => self.compare(p, q, &format!("{at}[{}]", key(p)), depth + 1, out),
                None => out.push(format!("{at}[{}]: removed", key(p))),
            }
        }
    }
}

/// Where a served document is not compatible with a contract it implements: an operation of
/// the contract not served, a parameter missing or required on one side only, a string
/// parameter the served document bounds more tightly, a success status missing, or a property
/// of a success answer or of the request body that the served schema does not know.
pub fn incompatibilities(contract: &Value, served: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (path, item) in contract["paths"].as_object().into_iter().flatten() {
        for (method, op) in item.as_object().into_iter().flatten() {
            if op.get("responses").is_none() {
                continue;
            }
            let at = format!("{} {path}", method.to_uppercase());
            let Some(ours) = served["paths"].get(path).and_then(|i| i.get(method)) else {
                out.push(format!("{at}: not served"));
                continue;
            };
            let ours_params = parameters(served, &served["paths"][path], ours);
            for p in parameters(contract, item, op) {
                let (place, name) = (&p["in"], &p["name"]);
                // Header names are case-insensitive.
                let same_name = |q: &Value| match (q["name"].as_str(), name.as_str()) {
                    (Some(a), Some(b)) if place == "header" => a.eq_ignore_ascii_case(b),
                    _ => &q["name"] == name,
                };
                let Some(q) = ours_params
                    .iter()
                    .find(|q| &q["in"] == place && same_name(q))
                else {
                    out.push(format!("{at}: parameter {name} in {place} missing"));
                    continue;
                };
                if p["required"].as_bool().unwrap_or(false)
                    != q["required"].as_bool().unwrap_or(false)
                {
                    out.push(format!(
                        "{at}: parameter {name} is required on one side only"
                    ));
                }
                let (ps, qs) = (
                    resolve(contract, &p["schema"]),
                    resolve(served, &q["schema"]),
                );
                if let (Some(want), Some(have)) =
                    (ps["maxLength"].as_u64(), qs["maxLength"].as_u64())
                    && have < want
                {
                    out.push(format!(
                        "{at}: parameter {name} is at most {have} long, the contract allows {want}"
                    ));
                }
            }
            if let Some(body) = json_schema(contract, &op["requestBody"]) {
                let have = json_schema(served, &ours["requestBody"])
                    .map(|s| properties(served, s))
                    .unwrap_or_default();
                for prop in properties(contract, body).difference(&have) {
                    out.push(format!("{at}: the request body's {prop} is unknown"));
                }
            }
            for (status, response) in op["responses"].as_object().into_iter().flatten() {
                if !status.starts_with('2') {
                    continue;
                }
                let Some(served_response) = ours["responses"].get(status) else {
                    out.push(format!("{at}: status {status} missing"));
                    continue;
                };
                let Some(schema) = json_schema(contract, response) else {
                    continue;
                };
                let have = json_schema(served, served_response)
                    .map(|s| properties(served, s))
                    .unwrap_or_default();
                for prop in required(contract, schema).difference(&have) {
                    out.push(format!(
                        "{at} {status}: the answer's {prop} is not described"
                    ));
                }
            }
        }
    }
    out
}

/// The parameters of an operation, with those of its path item.
fn parameters(doc: &Value, item: &Value, op: &Value) -> Vec<Value> {
    [&item["parameters"], &op["parameters"]]
        .into_iter()
        .flat_map(|ps| ps.as_array().into_iter().flatten())
        .map(|p| resolve(doc, p).clone())
        .collect()
}

/// The JSON schema of a request body or a response, if it has one.
fn json_schema<'a>(doc: &'a Value, holder: &'a Value) -> Option<&'a Value> {
    let holder = resolve(doc, holder);
    let schema = holder["content"].get("application/json")?.get("schema")?;
    Some(resolve(doc, schema))
}

/// The alternatives a schema stands for (`anyOf`/`oneOf`/`allOf` members, or itself).
fn variants<'a>(doc: &'a Value, schema: &'a Value) -> Vec<&'a Value> {
    let schema = resolve(doc, schema);
    let mut out = vec![schema];
    for combinator in ["anyOf", "oneOf", "allOf"] {
        for alt in schema[combinator].as_array().into_iter().flatten() {
            out.extend(variants(doc, alt));
        }
    }
    out
}

/// Every property a schema (any of its alternatives) names.
fn properties(doc: &Value, schema: &Value) -> std::collections::BTreeSet<String> {
    variants(doc, schema)
        .into_iter()
        .flat_map(|v| v["properties"].as_object().into_iter().flatten())
        .map(|(k, _)| k.clone())
        .collect()
}

/// Every property a schema (any of its alternatives) requires.
fn required(doc: &Value, schema: &Value) -> std::collections::BTreeSet<String> {
    variants(doc, schema)
        .into_iter()
        .flat_map(|v| v["required"].as_array().into_iter().flatten())
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect()
}

/// Follows local references (`#/components/...`), a bounded number of times.
fn resolve<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..16 {
        let Some(r) = v.get("$ref").and_then(Value::as_str) else {
            return v;
        };
        match r.strip_prefix('#').and_then(|p| doc.pointer(p)) {
            Some(target) => v = target,
            None => return v,
        }
    }
    v
}

/// `oneOf`/`anyOf` of `null` and one schema reads as that schema with `null` among its types.
fn normalize(doc: &Value, v: &Value) -> Value {
    for combinator in ["oneOf", "anyOf"] {
        if let Some(alts) = v.get(combinator).and_then(Value::as_array)
            && alts.len() == 2
            && let Some(i) = alts
                .iter()
                .position(|a| a == &serde_json::json!({"type": "null"}))
        {
            let mut other = resolve(doc, &alts[1 - i]).clone();
            let mut types = as_set(other.get("type").unwrap_or(&Value::Null));
            types.insert("\"null\"".into());
            if let Some(o) = other.as_object_mut() {
                o.insert(
                    "type".into(),
                    Value::Array(
                        types
                            .iter()
                            .filter_map(|t| serde_json::from_str(t).ok())
                            .collect(),
                    ),
                );
                if let Some(outer) = v.as_object() {
                    for (k, val) in outer {
                        if k != combinator {
                            o.entry(k.clone()).or_insert_with(|| val.clone());
                        }
                    }
                }
            }
            return other;
        }
    }
    v.clone()
}

fn as_set(v: &Value) -> std::collections::BTreeSet<String> {
    match v {
        Value::Array(a) => a.iter().map(Value::to_string).collect(),
        Value::Null => Default::default(),
        other => [other.to_string()].into(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::breaking_changes;

    fn doc(schema: serde_json::Value, components: serde_json::Value) -> serde_json::Value {
        json!({
            "paths": {"/things/{id}": {"get": {
                "parameters": [{"in": "path", "name": "id", "schema": {"type": "string"}}],
                "responses": {"200": {"content": {"application/json": {"schema": schema}}}}
            }}},
            "components": {"schemas": components}
        })
    }

    fn thing(id_schema: serde_json::Value) -> serde_json::Value {
        json!({"type": "object", "required": ["id"], "properties": {
            "id": id_schema,
            "note": {"type": ["string", "null"]}
        }})
    }

    #[test]
    fn naming_a_schema_and_adding_constraints_are_additions() {
        let old = doc(thing(json!({"type": "string"})), json!({}));
        let mut named = thing(json!({"$ref": "#/components/schemas/Id"}));
        named["properties"]["note"] =
            json!({"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/Id"}]});
        named["properties"]["extra"] = json!({"type": "integer"});
        let new = doc(
            named,
            json!({"Id": {"type": "string", "pattern": "^x$", "description": "An id."}}),
        );
        assert_eq!(breaking_changes(&old, &new), Vec::<String>::new());
        // Accepting unknown fields that were refused takes nothing away.
        let mut strict = thing(json!({"type": "string"}));
        strict["additionalProperties"] = json!(false);
        let strict = doc(strict, json!({}));
        assert_eq!(breaking_changes(&strict, &old), Vec::<String>::new());
    }

    #[test]
    fn removals_and_type_changes_are_reported() {
        let old = doc(thing(json!({"type": "string"})), json!({}));
        let mut changed = thing(json!({"type": "integer"}));
        changed["properties"]
            .as_object_mut()
            .map(|p| p.remove("note"));
        let new = doc(changed, json!({}));
        let found = breaking_changes(&old, &new);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().any(|f| f.contains("/id/type")), "{found:?}");
        assert!(
            found.iter().any(|f| f.ends_with("/note: removed")),
            "{found:?}"
        );
        let mut no_param = old.clone();
        no_param["paths"]["/things/{id}"]["get"]["parameters"] = json!([]);
        assert_eq!(breaking_changes(&old, &no_param).len(), 1);
        let mut no_path = old.clone();
        no_path["paths"] = json!({});
        assert_eq!(
            breaking_changes(&old, &no_path),
            vec!["#/paths//things/{id}: removed"]
        );
    }
}
