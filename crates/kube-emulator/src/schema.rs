//! Decoding request bodies the way kube-apiserver does: typed decode (via k8s-openapi) so that
//! type errors are 400s, unknown fields are found (warning, or 400 with `fieldValidation=Strict`),
//! quantities and Lease MicroTimes are checked, and the stored object is normalised.

use k8s_openapi::api::{coordination, core, events, storage};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::resources::ResourceInfo;
use crate::status::ApiError;

/// A decoded body: the normalised object and the unknown fields that were dropped.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub object: Value,
    pub unknown: Vec<String>,
}

fn roundtrip<T: DeserializeOwned + Serialize>(v: Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(v).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

fn typed_roundtrip(res: &ResourceInfo, v: Value) -> Result<Value, String> {
    match (res.group, res.kind) {
        ("", "ConfigMap") => roundtrip::<core::v1::ConfigMap>(v),
        ("", "Event") => roundtrip::<core::v1::Event>(v),
        ("", "Namespace") => roundtrip::<core::v1::Namespace>(v),
        ("", "Node") => roundtrip::<core::v1::Node>(v),
        ("", "PersistentVolumeClaim") => roundtrip::<core::v1::PersistentVolumeClaim>(v),
        ("", "PersistentVolume") => roundtrip::<core::v1::PersistentVolume>(v),
        ("", "Pod") => roundtrip::<core::v1::Pod>(v),
        ("", "Secret") => roundtrip::<core::v1::Secret>(v),
        ("coordination.k8s.io", "Lease") => roundtrip::<coordination::v1::Lease>(v),
        ("events.k8s.io", "Event") => roundtrip::<events::v1::Event>(v),
        ("storage.k8s.io", "CSIDriver") => roundtrip::<storage::v1::CSIDriver>(v),
        ("storage.k8s.io", "CSINode") => roundtrip::<storage::v1::CSINode>(v),
        ("storage.k8s.io", "StorageClass") => roundtrip::<storage::v1::StorageClass>(v),
        ("storage.k8s.io", "VolumeAttachment") => roundtrip::<storage::v1::VolumeAttachment>(v),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => roundtrip::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(v),
        _ => Ok(v),
    }
}

/// Collects paths present (non-null) in `input` but missing from `output`.
fn unknown_fields(input: &Value, output: &Value, path: &str, out: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                if v.is_null() {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match o.get(k) {
                    None => out.push(p),
                    Some(ov) => unknown_fields(v, ov, &p, out),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (idx, (iv, ov)) in i.iter().zip(o.iter()).enumerate() {
                unknown_fields(iv, ov, &format!("{path}[{idx}]"), out);
            }
        }
        _ => {}
    }
}

/// JSON pointers of the quantity maps of a kind (values are checked and canonicalised).
fn quantity_maps(res: &ResourceInfo) -> &'static [&'static str] {
    match (res.group, res.kind) {
        ("", "PersistentVolumeClaim") => &[
            "/spec/resources/requests",
            "/spec/resources/limits",
            "/status/capacity",
            "/status/allocatedResources",
        ],
        ("", "PersistentVolume") => &["/spec/capacity"],
        _ => &[],
    }
}

fn check_quantities(res: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    for ptr in quantity_maps(res) {
        let Some(map) = obj.pointer_mut(ptr).and_then(Value::as_object_mut) else {
            continue;
        };
        for v in map.values_mut() {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => continue,
            };
            if let Err(error) = kube_quantity::parse(&text) {
                return Err(ApiError::cannot_handle(res, &error.to_string()));
            }
            *v = Value::String(text);
        }
    }
    Ok(())
}

/// Rewrites quantities into the form kube-apiserver stores (`1024Mi` -> `1Gi`, `16Ei` ->
/// `9223372036854775807`; `10G` and `954Mi` stay as written).
pub(crate) fn canonicalize_quantities(res: &ResourceInfo, obj: &mut Value) {
    for ptr in quantity_maps(res) {
        let Some(map) = obj.pointer_mut(ptr).and_then(Value::as_object_mut) else {
            continue;
        };
        for v in map.values_mut() {
            if let Some(c) = v.as_str().and_then(|s| kube_quantity::canonicalize(s).ok()) {
                *v = Value::String(c);
            }
        }
    }
}

/// Go's `time.Parse` with layout `2006-01-02T15:04:05.000000Z07:00`, error text included.
fn check_micro_time(s: &str) -> Result<(), String> {
    let layout = "2006-01-02T15:04:05.000000Z07:00";
    let fail = |rest: &str, elem: &str| {
        Err(format!(
            "parsing time \"{s}\" as \"{layout}\": cannot parse \"{rest}\" as \"{elem}\""
        ))
    };
    if s.len() < 19 || chrono::NaiveDateTime::parse_from_str(&s[..19], "%Y-%m-%dT%H:%M:%S").is_err()
    {
        return fail(s, "2006");
    }
    let rest = &s[19..];
    let digits = rest
        .strip_prefix('.')
        .map(|r| r.bytes().take_while(u8::is_ascii_digit).count())
        .unwrap_or(0);
    if digits < 6 {
        return fail(rest, ".000000");
    }
    let zone = &rest[7..];
    let zone_ok = zone == "Z"
        || (zone.len() == 6
            && (zone.starts_with('+') || zone.starts_with('-'))
            && zone.as_bytes()[3] == b':');
    if !zone_ok {
        return fail(zone, "Z07:00");
    }
    Ok(())
}

fn check_lease_times(res: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if res.kind != "Lease" {
        return Ok(());
    }
    for f in ["acquireTime", "renewTime"] {
        if let Some(s) = obj.pointer(&format!("/spec/{f}")).and_then(Value::as_str) {
            check_micro_time(s).map_err(|e| ApiError::cannot_handle(res, &e))?;
        }
    }
    Ok(())
}

/// Decodes `body` as an object of `res`. `strict` turns unknown fields into a 400.
pub(crate) fn decode(
    res: &ResourceInfo,
    mut body: Value,
    strict: bool,
) -> Result<Decoded, ApiError> {
    let Some(map) = body.as_object_mut() else {
        return Err(ApiError::cannot_handle(
            res,
            "json: cannot unmarshal non-object into Go value",
        ));
    };
    let api_version = res.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("apiVersion".into(), json!(api_version));
        }
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
        Some(_) => {}
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            map.insert("kind".into(), json!(res.kind));
        }
        Some(k) if k != res.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                res.kind
            )));
        }
        Some(_) => {}
    }
    if !map.contains_key("metadata") {
        map.insert("metadata".into(), Value::Object(Map::new()));
    }
    // managedFields are not emulated; drop them before decoding.
    if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    check_quantities(res, &mut body)?;
    check_lease_times(res, &body)?;
    let (output, unknown) = match res.custom {
        Some(custom) => crate::crd::decode_custom(res, custom, body)?,
        None => {
            let output =
                typed_roundtrip(res, body.clone()).map_err(|e| ApiError::cannot_handle(res, &e))?;
            let mut unknown = Vec::new();
            unknown_fields(&body, &output, "", &mut unknown);
            (output, unknown)
        }
    };
    if strict && !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|u| format!("unknown field \"{u}\""))
            .collect();
        return Err(ApiError::cannot_handle(
            res,
            &format!("strict decoding error: {}", list.join(", ")),
        ));
    }
    Ok(Decoded {
        object: output,
        unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_time_errors_match_go() {
        assert!(check_micro_time("2026-01-01T00:00:00.000000Z").is_ok());
        assert!(
            check_micro_time("2026-01-01T00:00:00Z")
                .is_err_and(|e| e.ends_with("cannot parse \"Z\" as \".000000\""))
        );
        assert!(
            check_micro_time("2026-01-01T00:00:00.5Z")
                .is_err_and(|e| e.ends_with("cannot parse \".5Z\" as \".000000\""))
        );
        assert!(
            check_micro_time("2026-01-01T00:00:00.123456789Z")
                .is_err_and(|e| e.ends_with("cannot parse \"789Z\" as \"Z07:00\""))
        );
    }
}
