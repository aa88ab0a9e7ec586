//! Server-side `Table` output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), which
//! `kubectl get` asks for.

use serde_json::{Value, json};

use crate::resources::ResourceInfo;
use crate::util::{Query, meta_str, str_at};

fn age(ts: Option<&str>) -> String {
    let Some(t) = ts.and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok()) else {
        return "<unknown>".into();
    };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn access_modes(v: Option<&Value>) -> String {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| match m {
                    "ReadWriteOnce" => "RWO",
                    "ReadOnlyMany" => "ROX",
                    "ReadWriteMany" => "RWX",
                    "ReadWriteOncePod" => "RWOP",
                    other => other,
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn s(obj: &Value, ptr: &str) -> Value {
    json!(str_at(obj, ptr).unwrap_or_default())
}

type Columns = Vec<(&'static str, &'static str)>;

fn columns_and_cells(res: &ResourceInfo, obj: &Value) -> (Columns, Vec<Value>) {
    let name = json!(meta_str(obj, "name").unwrap_or_default());
    let created = age(meta_str(obj, "creationTimestamp"));
    match (res.group, res.kind) {
        ("", "PersistentVolumeClaim") => (
            vec![
                ("Name", "string"),
                ("Status", "string"),
                ("Volume", "string"),
                ("Capacity", "string"),
                ("Access Modes", "string"),
                ("StorageClass", "string"),
                ("VolumeAttributesClass", "string"),
                ("Age", "string"),
            ],
            vec![
                name,
                s(obj, "/status/phase"),
                s(obj, "/spec/volumeName"),
                s(obj, "/status/capacity/storage"),
                json!(access_modes(obj.pointer("/status/accessModes"))),
                s(obj, "/spec/storageClassName"),
                json!("<unset>"),
                json!(created),
            ],
        ),
        ("", "PersistentVolume") => {
            let claim = match (
                str_at(obj, "/spec/claimRef/namespace"),
                str_at(obj, "/spec/claimRef/name"),
            ) {
                (Some(ns), Some(n)) => format!("{ns}/{n}"),
                _ => String::new(),
            };
            (
                vec![
                    ("Name", "string"),
                    ("Capacity", "string"),
                    ("Access Modes", "string"),
                    ("Reclaim Policy", "string"),
                    ("Status", "string"),
                    ("Claim", "string"),
                    ("StorageClass", "string"),
                    ("VolumeAttributesClass", "string"),
                    ("Reason", "string"),
                    ("Age", "string"),
                ],
                vec![
                    name,
                    s(obj, "/spec/capacity/storage"),
                    json!(access_modes(obj.pointer("/spec/accessModes"))),
                    s(obj, "/spec/persistentVolumeReclaimPolicy"),
                    s(obj, "/status/phase"),
                    json!(claim),
                    s(obj, "/spec/storageClassName"),
                    json!("<unset>"),
                    s(obj, "/status/reason"),
                    json!(created),
                ],
            )
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => (
            vec![("Name", "string"), ("Created At", "date")],
            vec![
                name,
                json!(meta_str(obj, "creationTimestamp").unwrap_or_default()),
            ],
        ),
        ("storage.k8s.io", "StorageClass") => (
            vec![
                ("Name", "string"),
                ("Provisioner", "string"),
                ("ReclaimPolicy", "string"),
                ("VolumeBindingMode", "string"),
                ("AllowVolumeExpansion", "string"),
                ("Age", "string"),
            ],
            vec![
                name,
                s(obj, "/provisioner"),
                s(obj, "/reclaimPolicy"),
                s(obj, "/volumeBindingMode"),
                json!(
                    obj.get("allowVolumeExpansion")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                        .to_string()
                ),
                json!(created),
            ],
        ),
        ("", "Event") | ("events.k8s.io", "Event") => {
            let (regarding, message, last) = if res.group.is_empty() {
                ("/involvedObject", "/message", "/lastTimestamp")
            } else {
                ("/regarding", "/note", "/deprecatedLastTimestamp")
            };
            let object = format!(
                "{}/{}",
                str_at(obj, &format!("{regarding}/kind"))
                    .unwrap_or_default()
                    .to_lowercase(),
                str_at(obj, &format!("{regarding}/name")).unwrap_or_default()
            );
            (
                vec![
                    ("Last Seen", "string"),
                    ("Type", "string"),
                    ("Reason", "string"),
                    ("Object", "string"),
                    ("Message", "string"),
                ],
                vec![
                    json!(age(str_at(obj, last))),
                    s(obj, "/type"),
                    s(obj, "/reason"),
                    json!(object),
                    s(obj, message),
                ],
            )
        }
        _ => match res.custom.filter(|c| !c.columns.is_empty()) {
            Some(custom) => custom_columns(custom, obj, name),
            None => (
                vec![("Name", "string"), ("Age", "string")],
                vec![name, json!(created)],
            ),
        },
    }
}

/// A CRD's `additionalPrinterColumns` (simple `.a.b` JSONPaths; `date` cells as ages).
fn custom_columns(
    custom: &'static crate::crd::Custom,
    obj: &Value,
    name: Value,
) -> (Columns, Vec<Value>) {
    let mut cols: Columns = vec![("Name", "string")];
    let mut cells = vec![name];
    for c in &custom.columns {
        cols.push((c.name.as_str(), c.ty.as_str()));
        let pointer = c.json_path.replace('.', "/");
        let v = obj.pointer(&pointer).cloned().unwrap_or(Value::Null);
        cells.push(match (c.ty.as_str(), &v) {
            ("date", Value::String(ts)) => json!(age(Some(ts))),
            _ => v,
        });
    }
    (cols, cells)
}

/// A `meta.k8s.io/v1` Table for `items` (already in the endpoint's view).
pub(crate) fn render(res: &ResourceInfo, items: &[Value], rv: u64, query: &Query) -> Value {
    let include_object = query.get("includeObject") == Some("Object");
    let mut columns: Columns = columns_and_cells(res, &json!({})).0;
    let rows: Vec<Value> = items
        .iter()
        .map(|obj| {
            let (cols, cells) = columns_and_cells(res, obj);
            columns = cols;
            let object = if include_object {
                obj.clone()
            } else {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))})
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    let defs: Vec<Value> = columns
        .iter()
        .map(|(name, ty)| {
            let format = if *name == "Name" { "name" } else { "" };
            json!({"name": name, "type": ty, "format": format, "description": name, "priority": 0})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": defs,
        "rows": rows
    })
}
