//! A deterministic instance of a JSON schema: what the simulated model "writes" under structured
//! output (`response_format`) or as a tool call's arguments. Enough of JSON Schema for the shapes
//! clients send — `object` (its `required` properties, or every property when none is required),
//! `array` (`minItems` items, at least one), `string` (`format` date, date-time, email, uri), `number`,
//! `integer` (within `minimum`/`maximum`), `boolean`, `null`, `enum`, `const`, and the first branch of
//! `anyOf`/`oneOf`/`allOf`; a schema it does not understand yields a string.

use serde_json::{json, Map, Value};

/// Nesting beyond this yields `null`: a recursive or hostile schema must not recurse forever.
const MAX_DEPTH: usize = 16;

/// A value satisfying `schema`'s required properties and types.
pub(crate) fn instance(schema: &Value) -> Value {
    at(schema, "value", 0)
}

/// `name` is the property the value is for: strings take it as a plausible hint.
fn at(schema: &Value, name: &str, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return Value::Null;
    }
    let Some(s) = schema.as_object() else { return json!(format!("sample {name}")) };
    if let Some(v) = s.get("const") {
        return v.clone();
    }
    if let Some(first) = s.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
        return first.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = s.get(key).and_then(Value::as_array).and_then(|b| b.first()) {
            return at(first, name, depth + 1);
        }
    }
    match type_of(s) {
        "object" => object(s, depth),
        "array" => array(s, name, depth),
        "integer" => integer(s),
        "number" => number(s),
        "boolean" => json!(true),
        "null" => Value::Null,
        _ => string(s, name),
    }
}

/// The schema's type: the first non-null one of a list, else inferred from its keywords.
fn type_of(s: &Map<String, Value>) -> &str {
    match s.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("null"),
        _ if s.contains_key("properties") => "object",
        _ if s.contains_key("items") => "array",
        _ => "string",
    }
}

fn object(s: &Map<String, Value>, depth: usize) -> Value {
    let empty = Map::new();
    let props = s.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> = match s.get("required").and_then(Value::as_array) {
        Some(names) => names.iter().filter_map(Value::as_str).collect(),
        None => props.keys().map(String::as_str).collect(),
    };
    let out = required
        .into_iter()
        .map(|key| {
            let value = props.get(key).map_or_else(|| json!(format!("sample {key}")), |p| at(p, key, depth + 1));
            (key.to_owned(), value)
        })
        .collect();
    Value::Object(out)
}

fn array(s: &Map<String, Value>, name: &str, depth: usize) -> Value {
    let count = s.get("minItems").and_then(Value::as_u64).unwrap_or(1).clamp(1, 8);
    let item = s.get("items").map_or_else(|| json!(format!("sample {name}")), |i| at(i, name, depth + 1));
    Value::Array(vec![item; count as usize])
}

fn integer(s: &Map<String, Value>) -> Value {
    let min = s.get("minimum").and_then(Value::as_i64);
    let max = s.get("maximum").and_then(Value::as_i64);
    match (min, max) {
        (Some(lo), _) => json!(lo),
        (None, Some(hi)) => json!(hi.min(1)),
        (None, None) => json!(1),
    }
}

fn number(s: &Map<String, Value>) -> Value {
    let min = s.get("minimum").and_then(Value::as_f64);
    let max = s.get("maximum").and_then(Value::as_f64);
    match (min, max) {
        (Some(lo), _) => json!(lo),
        (None, Some(hi)) => json!(hi.min(1.5)),
        (None, None) => json!(1.5),
    }
}

fn string(s: &Map<String, Value>, name: &str) -> Value {
    let text = match s.get("format").and_then(Value::as_str) {
        Some("date") => "2024-01-01".to_owned(),
        Some("date-time") => "2024-01-01T00:00:00Z".to_owned(),
        Some("email") => "someone@example.com".to_owned(),
        Some("uri" | "url") => "https://example.com/".to_owned(),
        _ => format!("sample {name}"),
    };
    let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    let padded = text.len() as u64 >= min;
    json!(if padded { text } else { format!("{text}{}", "x".repeat((min - text.len() as u64) as usize)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_hold_their_required_properties_with_their_types() {
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 3},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "when": {"type": "string", "format": "date"},
                "ok": {"type": "boolean"},
                "score": {"type": ["number", "null"]},
                "optional": {"type": "string"}
            },
            "required": ["city", "days", "unit", "tags", "when", "ok", "score"]
        });
        let v = instance(&schema);
        assert_eq!(v["city"], "sample city");
        assert_eq!(v["days"], 3);
        assert_eq!(v["unit"], "celsius");
        assert_eq!(v["tags"], json!(["sample tags"]));
        assert_eq!(v["when"], "2024-01-01");
        assert_eq!(v["ok"], true);
        assert!(v["score"].is_f64());
        assert!(v.get("optional").is_none(), "only required properties: {v}");
    }

    #[test]
    fn without_required_every_property_and_nesting_is_bounded() {
        let v = instance(&json!({"properties": {"a": {"properties": {"b": {"type": "number"}}}}}));
        assert_eq!(v, json!({"a": {"b": 1.5}}));
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"type": "array", "items": deep});
        }
        assert!(instance(&deep).is_array(), "a deep schema ends in null, not a stack overflow");
        assert_eq!(instance(&json!({"const": 7})), 7);
        assert_eq!(instance(&json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})), 1);
        assert_eq!(instance(&json!({"type": "string", "minLength": 20})).as_str().map(str::len), Some(20));
    }
}
