//! PATCH bodies: JSON merge patch, JSON patch, strategic merge patch and (simplified)
//! server-side apply.
//!
//! Strategic merge follows the Kubernetes patch strategies of the fields that matter here:
//! maps merge, `metadata.finalizers` merges (patch items first, then the live ones), lists of
//! objects with a known merge key merge by that key, every other list is replaced. The
//! directives `$patch: delete|replace`, `$deleteFromPrimitiveList/<field>`, `$retainKeys` are
//! honoured; `$setElementOrder/<field>` is accepted and ignored.

use serde_json::{Map, Value};

use crate::status::ApiError;

/// The kinds of PATCH the API accepts (by Content-Type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<PatchKind> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// Merge key of a list field, by the field name (covers the core types we serve).
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "drivers" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "ports" => Some("containerPort"),
        "ownerReferences" => Some("uid"),
        "conditions" | "addresses" => Some("type"),
        "taints" => Some("key"),
        "hostAliases" => Some("ip"),
        _ => None,
    }
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_primitive_list(target: &[Value], patch: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for v in patch.iter().chain(target.iter()) {
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    out
}

fn merge_keyed_list(target: &mut Vec<Value>, patch: &[Value], key: &str, delete_nulls: bool) {
    for item in patch {
        let k = item.get(key).cloned();
        let directive = item.get("$patch").and_then(Value::as_str);
        let pos = k
            .as_ref()
            .and_then(|k| target.iter().position(|t| t.get(key) == Some(k)));
        match (directive, pos) {
            (Some("delete"), Some(p)) => {
                target.remove(p);
            }
            (Some("delete"), None) => {}
            (_, Some(p)) => merge_value(&mut target[p], item, delete_nulls),
            (_, None) => target.push(strip_directives(item)),
        }
    }
}

fn merge_value(target: &mut Value, patch: &Value, delete_nulls: bool) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => merge_map(t, p, delete_nulls),
        _ => *target = strip_directives(patch),
    }
}

fn merge_map(target: &mut Map<String, Value>, patch: &Map<String, Value>, delete_nulls: bool) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = match strip_directives(&Value::Object(patch.clone())) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        return;
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        target.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (target.get_mut(field), v.as_array())
            {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null if delete_nulls => {
                target.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    target.remove(k);
                } else if let Some(Value::Object(tm)) = target.get_mut(k) {
                    merge_map(tm, pm, delete_nulls);
                } else {
                    target.insert(k.clone(), strip_directives(v));
                }
            }
            Value::Array(pa) => {
                let existing = target.get_mut(k).and_then(Value::as_array_mut);
                match (existing, k.as_str(), merge_key(k)) {
                    (Some(t), "finalizers", _) => {
                        let merged = merge_primitive_list(t, pa);
                        *t = merged;
                    }
                    (Some(t), _, Some(key)) if pa.iter().all(Value::is_object) => {
                        merge_keyed_list(t, pa, key, delete_nulls);
                    }
                    _ => {
                        target.insert(k.clone(), strip_directives(v));
                    }
                }
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
}

/// Applies a strategic merge patch to `doc`.
pub(crate) fn strategic_merge(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Some(p) = patch.as_object() else {
        return Err(ApiError::bad_request(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    };
    match doc.as_object_mut() {
        Some(d) => merge_map(d, p, true),
        None => *doc = strip_directives(patch),
    }
    Ok(())
}

/// Server-side apply, simplified: the applied configuration is merged into the live object
/// with strategic-merge semantics (no field ownership, so no conflicts are detected).
pub(crate) fn apply(doc: &mut Value, applied: &Value) -> Result<(), ApiError> {
    let Some(p) = applied.as_object() else {
        return Err(ApiError::bad_request("apply patch must be an object"));
    };
    if let Some(d) = doc.as_object_mut() {
        merge_map(d, p, false);
    }
    Ok(())
}

/// Applies a JSON patch (RFC 6902). A failed `test` is the generic 422 kube-apiserver answers.
pub(crate) fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    json_patch::patch(doc, &ops).map_err(|e| match e.kind {
        json_patch::PatchErrorKind::TestFailed => ApiError {
            details: Some(serde_json::json!({})),
            ..ApiError::new(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            )
        },
        other => ApiError {
            details: Some(serde_json::json!({})),
            ..ApiError::new(
                422,
                "Invalid",
                format!("the server rejected our request due to an error in our request: {other}"),
            )
        },
    })
}

/// Applies a JSON merge patch (RFC 7386).
pub(crate) fn merge_patch(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_merges_finalizers_patch_first() {
        let mut doc = json!({"metadata": {"finalizers": ["kubernetes.io/pvc-protection"]}});
        strategic_merge(
            &mut doc,
            &json!({"metadata": {"finalizers": ["example.com/a"]}}),
        )
        .unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            json!(["example.com/a", "kubernetes.io/pvc-protection"])
        );
    }

    #[test]
    fn strategic_merge_replaces_plain_lists_and_merges_keyed_lists() {
        let mut doc = json!({"spec": {"accessModes": ["ReadWriteOnce"], "containers": [{"name": "a", "image": "x"}]}});
        strategic_merge(
            &mut doc,
            &json!({"spec": {"accessModes": ["ReadOnlyMany"], "containers": [{"name": "a", "image": "y"}, {"name": "b"}]}}),
        )
        .unwrap();
        assert_eq!(doc["spec"]["accessModes"], json!(["ReadOnlyMany"]));
        assert_eq!(
            doc["spec"]["containers"],
            json!([{"name": "a", "image": "y"}, {"name": "b"}])
        );
    }

    #[test]
    fn strategic_merge_directives() {
        let mut doc =
            json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]}});
        strategic_merge(
            &mut doc,
            &json!({"metadata": {"labels": {"a": null}, "$deleteFromPrimitiveList/finalizers": ["x"], "$setElementOrder/finalizers": ["y"]}}),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"labels": {"b": "2"}, "finalizers": ["y"]}})
        );
    }

    #[test]
    fn failed_json_patch_test_is_generic_422() {
        let mut doc = json!({"metadata": {"finalizers": ["a"]}});
        let err = json_patch(
            &mut doc,
            &json!([{"op": "test", "path": "/metadata/finalizers/0", "value": "b"}]),
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "the server rejected our request due to an error in our request"
        );
    }
}
