//! Field ownership for server-side apply, reduced to what matters in tests: each apply
//! manager owns the leaf fields it applied (recorded in `metadata.managedFields` as FieldsV1),
//! and applying a different value to a field another apply manager owns is a 409 conflict
//! unless `force=true` (which takes the field over). Lists are owned as a whole; updates by
//! PUT/PATCH do not record ownership.

use serde_json::{Map, Value, json};

use crate::status::ApiError;

type Path = Vec<String>;

const IGNORED_TOP: &[&str] = &["apiVersion", "kind"];
const IGNORED_META: &[&str] = &[
    "name",
    "namespace",
    "resourceVersion",
    "uid",
    "managedFields",
];

fn leaf_paths(v: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let skip = (prefix.is_empty() && IGNORED_TOP.contains(&k.as_str()))
                    || (prefix.len() == 1
                        && prefix[0] == "metadata"
                        && IGNORED_META.contains(&k.as_str()));
                if skip {
                    continue;
                }
                prefix.push(k.clone());
                leaf_paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            if !prefix.is_empty() {
                out.push(prefix.clone());
            }
        }
    }
}

fn to_fields_v1(paths: &[Path]) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut cur = &mut root;
        for seg in p {
            let entry = cur
                .entry(format!("f:{seg}"))
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            match entry.as_object_mut() {
                Some(m) => cur = m,
                None => break,
            }
        }
    }
    Value::Object(root)
}

fn from_fields_v1(v: &Value, prefix: &mut Path, out: &mut Vec<Path>) {
    let Some(m) = v.as_object() else {
        return;
    };
    let children: Vec<(&String, &Value)> = m.iter().filter(|(k, _)| k.starts_with("f:")).collect();
    if children.is_empty() {
        if !prefix.is_empty() {
            out.push(prefix.clone());
        }
        return;
    }
    for (k, child) in children {
        prefix.push(k[2..].to_string());
        from_fields_v1(child, prefix, out);
        prefix.pop();
    }
}

fn value_at<'a>(v: &'a Value, path: &Path) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, seg| cur.get(seg))
}

fn dotted(p: &Path) -> String {
    format!(".{}", p.join("."))
}

/// Checks `applied` by `manager` against the ownership recorded in `live` and returns the new
/// `managedFields` list (or the 409 conflict).
pub(crate) fn apply_ownership(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    api_version: &str,
    now: &str,
) -> Result<Value, ApiError> {
    let mut applied_paths = Vec::new();
    leaf_paths(applied, &mut Vec::new(), &mut applied_paths);
    let existing: Vec<Value> = live
        .and_then(|l| l.pointer("/metadata/managedFields"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut conflicts: Vec<(String, Path)> = Vec::new();
    let mut kept = Vec::new();
    let fields = to_fields_v1(&applied_paths);
    let mut time = now.to_string();
    for entry in existing {
        let owner = entry
            .get("manager")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if owner == manager && entry.get("operation").and_then(Value::as_str) == Some("Apply") {
            // An unchanged field set keeps its timestamp, so a no-op apply stays a no-op.
            if entry.get("fieldsV1") == Some(&fields)
                && let Some(t) = entry.get("time").and_then(Value::as_str)
            {
                time = t.to_string();
            }
            continue;
        }
        let mut owned = Vec::new();
        if let Some(f) = entry.get("fieldsV1") {
            from_fields_v1(f, &mut Vec::new(), &mut owned);
        }
        let mut remaining = Vec::new();
        for p in owned {
            let contested = applied_paths.contains(&p)
                && live.and_then(|l| value_at(l, &p)) != value_at(applied, &p);
            if contested && !force {
                conflicts.push((owner.clone(), p.clone()));
            }
            if !(contested && force) {
                remaining.push(p);
            }
        }
        if !remaining.is_empty() {
            let mut e = entry.clone();
            e["fieldsV1"] = to_fields_v1(&remaining);
            kept.push(e);
        }
    }
    if !conflicts.is_empty() {
        return Err(conflict_error(&conflicts));
    }
    kept.push(json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": time,
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    }));
    Ok(Value::Array(kept))
}

fn conflict_error(conflicts: &[(String, Path)]) -> ApiError {
    let message = if let [(owner, path)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with \"{owner}\": {}",
            dotted(path)
        )
    } else {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(o, p)| format!("conflict with \"{o}\": {}", dotted(p)))
            .collect();
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(o, p)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{o}\""), "field": dotted(p)}))
        .collect();
    ApiError {
        details: Some(json!({"causes": causes})),
        ..ApiError::new(409, "Conflict", message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_manager_conflicts_unless_forced() {
        let applied_a = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "n", "labels": {"owner": "a"}}});
        let mf = apply_ownership(None, &applied_a, "manager-a", false, "v1", "t").unwrap();
        assert_eq!(
            mf[0]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:owner": {}}}})
        );
        let live =
            json!({"metadata": {"name": "n", "labels": {"owner": "a"}, "managedFields": mf}});
        let applied_b = json!({"metadata": {"name": "n", "labels": {"owner": "b"}}});
        let err =
            apply_ownership(Some(&live), &applied_b, "manager-b", false, "v1", "t").unwrap_err();
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"manager-a\": .metadata.labels.owner"
        );
        let forced =
            apply_ownership(Some(&live), &applied_b, "manager-b", true, "v1", "t").unwrap();
        assert_eq!(forced.as_array().map(Vec::len), Some(1));
        // Same value: shared ownership, no conflict.
        let same = json!({"metadata": {"name": "n", "labels": {"owner": "a"}}});
        assert!(apply_ownership(Some(&live), &same, "manager-b", false, "v1", "t").is_ok());
    }
}
