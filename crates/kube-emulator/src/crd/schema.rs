//! Structural-schema handling of custom resources: pruning of unknown fields on decode, and
//! validation (OpenAPI keywords plus the CEL subset of [`super::cel`]) with kube-apiserver's
//! field paths and messages.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Map, Value};

use super::{Custom, cel};
use crate::resources::ResourceInfo;
use crate::status::{ApiError, Cause};
use crate::util;

fn preserves(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

fn nullable(schema: &Value) -> bool {
    schema.get("nullable").and_then(Value::as_bool) == Some(true)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Drops what the schema does not know (recording the paths) and non-nullable nulls.
fn prune(v: &mut Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let child_path = join(path, &k);
                let child_schema = props
                    .and_then(|p| p.get(&k))
                    .or_else(|| additional.filter(|a| a.is_object()));
                match child_schema {
                    Some(cs) => {
                        if map.get(&k).is_some_and(Value::is_null) && !nullable(cs) {
                            map.remove(&k);
                            continue;
                        }
                        if let Some(child) = map.get_mut(&k) {
                            prune(child, cs, &child_path, unknown);
                        }
                    }
                    None if preserves(schema) || additional == Some(&Value::Bool(true)) => {}
                    None => {
                        if map.remove(&k).is_some_and(|v| !v.is_null()) {
                            unknown.push(child_path);
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item, item_schema, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// Structural defaulting: a property with a `default` that is absent from an object present
/// in the body gets it (after pruning, so dropped nulls are defaulted too).
fn apply_defaults(v: &mut Value, schema: &Value) {
    match v {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    if !map.contains_key(k)
                        && let Some(d) = ps.get("default")
                    {
                        map.insert(k.clone(), d.clone());
                    }
                }
                for (k, child) in map.iter_mut() {
                    if let Some(ps) = props.get(k) {
                        apply_defaults(child, ps);
                    }
                }
            } else if let Some(add) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in map.values_mut() {
                    apply_defaults(child, add);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for item in items {
                    apply_defaults(item, is);
                }
            }
        }
        _ => {}
    }
}

/// Decodes a custom resource body: `metadata` through `ObjectMeta` (unknown metadata fields
/// dropped), the rest pruned with the version's schema. Returns the object and the unknown
/// field paths.
pub(crate) fn decode_custom(
    res: &ResourceInfo,
    custom: &Custom,
    mut body: Value,
) -> Result<(Value, Vec<String>), ApiError> {
    let mut unknown = Vec::new();
    let Some(map) = body.as_object_mut() else {
        return Err(ApiError::cannot_handle(res, "expected an object"));
    };
    if let Some(meta) = map.remove("metadata") {
        let typed: ObjectMeta = serde_json::from_value(meta.clone())
            .map_err(|e| ApiError::cannot_handle(res, &format!("error decoding metadata: {e}")))?;
        let out = serde_json::to_value(&typed).unwrap_or(Value::Object(Map::new()));
        if let (Some(i), Some(o)) = (meta.as_object(), out.as_object()) {
            for (k, v) in i {
                if !v.is_null() && !o.contains_key(k) {
                    unknown.push(format!("metadata.{k}"));
                }
            }
        }
        map.insert("metadata".into(), out);
    }
    if !custom.schema.is_null() {
        let mut rest: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut rest_value = Value::Object(std::mem::take(&mut rest));
        prune(&mut rest_value, &custom.schema, "", &mut unknown);
        apply_defaults(&mut rest_value, &custom.schema);
        map.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
        if let Value::Object(pruned) = rest_value {
            map.extend(pruned);
        }
    }
    Ok((body, unknown))
}

/// JSON type name as kube-openapi's validator reports it.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(ty: &str, v: &Value, schema: &Value) -> bool {
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    if int_or_string {
        return matches!(v, Value::String(_)) || v.is_i64() || v.is_u64();
    }
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => true,
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

/// OpenAPI keyword validation (the subset the snapshot CRDs use, plus a few common ones).
fn check(v: &Value, schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    let field = if path.is_empty() { "<root>" } else { path };
    if v.is_null() {
        if !nullable(schema) && schema.get("type").is_some() {
            causes.push(Cause::invalid(
                field,
                "\"null\"",
                &format!(
                    "{field} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    if let Some(ty) = schema.get("type").and_then(Value::as_str)
        && !type_ok(ty, v, schema)
    {
        let actual = type_name(v);
        causes.push(Cause::invalid(
            field,
            &format!("\"{actual}\""),
            &format!("{field} in body must be of type {ty}: \"{actual}\""),
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        let supported: Vec<String> = options
            .iter()
            .map(|o| {
                o.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| o.to_string())
            })
            .collect();
        let refs: Vec<&str> = supported.iter().map(String::as_str).collect();
        causes.push(Cause::not_supported(
            field,
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
                .as_str(),
            &refs,
        ));
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64())
        && n < min
    {
        causes.push(Cause::invalid(
            field,
            &shown(v),
            &format!("{field} in body should be greater than or equal to {min}"),
        ));
    }
    if let (Some(max), Some(n)) = (schema.get("maximum").and_then(Value::as_f64), v.as_f64())
        && n > max
    {
        causes.push(Cause::invalid(
            field,
            &shown(v),
            &format!("{field} in body should be less than or equal to {max}"),
        ));
    }
    if let (Some(max), Some(s)) = (schema.get("maxLength").and_then(Value::as_u64), v.as_str())
        && s.chars().count() as u64 > max
    {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {max} bytes"),
            field: field.to_string(),
        });
    }
    match v {
        Value::Object(map) => {
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !map.contains_key(req) {
                    causes.push(Cause::required(&join(path, req), ""));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in map {
                if let Some(cs) = props.and_then(|p| p.get(k)).or(additional) {
                    check(child, cs, &join(path, k), causes);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item, is, &format!("{path}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
}

/// Runs the CEL rules of `schema` (and of its children) on `v`, with `old` for transition
/// rules (which run only where the old value exists too).
fn check_rules(
    v: &Value,
    old: Option<&Value>,
    schema: &Value,
    path: &str,
    causes: &mut Vec<Cause>,
) {
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        for rule in rules {
            let Some(text) = rule.get("rule").and_then(Value::as_str) else {
                continue;
            };
            let Ok(expr) = cel::parse(text) else {
                tracing::debug!(
                    rule = text,
                    "CEL rule outside the emulated subset; not enforced"
                );
                continue;
            };
            if expr.uses_old_self() && old.is_none() {
                continue;
            }
            if cel::eval(&expr, v, old) == Some(false) {
                let message = rule
                    .get("message")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("failed rule: {text}"));
                let field = if path.is_empty() { "<root>" } else { path };
                let field = match rule.get("fieldPath").and_then(Value::as_str) {
                    Some(fp) => format!("{field}{fp}"),
                    None => field.to_string(),
                };
                causes.push(Cause::invalid(
                    &field,
                    &format!("\"{}\"", type_name(v)),
                    &message,
                ));
            }
        }
    }
    match v {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in map {
                if let Some(cs) = props.and_then(|p| p.get(k)).or(additional) {
                    let old_child = old.and_then(|o| o.get(k));
                    check_rules(child, old_child, cs, &join(path, k), causes);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    // Old items are correlated by index only for atomic lists here.
                    let old_item = old.and_then(|o| o.get(i));
                    check_rules(item, old_item, is, &format!("{path}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
}

/// Validates a custom resource against its version's schema (422 with every cause).
pub(crate) fn validate_custom(
    res: &ResourceInfo,
    custom: &Custom,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), ApiError> {
    if custom.schema.is_null() {
        return Ok(());
    }
    let strip = |v: &Value| -> Value {
        let mut m = v.as_object().cloned().unwrap_or_default();
        for k in ["apiVersion", "kind", "metadata"] {
            m.remove(k);
        }
        Value::Object(m)
    };
    let body = strip(new);
    let old_body = old.map(strip);
    let mut schema = custom.schema.clone();
    // metadata is validated by the API machinery, not by the schema.
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.remove("metadata");
        props.remove("apiVersion");
        props.remove("kind");
    }
    let mut causes = Vec::new();
    check(&body, &schema, "", &mut causes);
    if causes.is_empty() {
        check_rules(&body, old_body.as_ref(), &schema, "", &mut causes);
    }
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid_with(
        &format!("{}.{}", res.kind, res.group),
        util::name_of(new),
        Some(res),
        res.kind,
        causes,
    ))
}
