//! The `events.k8s.io/v1` view of core/v1 Events: same objects, renamed fields.

use serde_json::{Map, Value, json};

/// (core field, events.k8s.io field)
const RENAMES: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

const SAME: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "reason",
    "type",
    "action",
    "related",
    "reportingInstance",
];

fn non_empty(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Number(n) => n.as_i64() != Some(0),
        _ => true,
    }
}

/// core/v1 Event -> events.k8s.io/v1 Event.
pub(crate) fn core_to_v1(core: &Value) -> Value {
    let mut out = Map::new();
    out.insert("kind".into(), json!("Event"));
    out.insert("apiVersion".into(), json!("events.k8s.io/v1"));
    out.insert(
        "eventTime".into(),
        core.get("eventTime").cloned().unwrap_or(Value::Null),
    );
    for f in SAME {
        if *f == "eventTime" {
            continue;
        }
        if let Some(v) = core.get(*f).filter(|v| non_empty(v)) {
            out.insert((*f).into(), v.clone());
        }
    }
    for (c, e) in RENAMES {
        if let Some(v) = core.get(*c).filter(|v| non_empty(v)) {
            out.insert((*e).into(), v.clone());
        }
    }
    Value::Object(out)
}

/// events.k8s.io/v1 Event -> core/v1 Event.
pub(crate) fn v1_to_core(ev: &Value) -> Value {
    let mut out = Map::new();
    out.insert("kind".into(), json!("Event"));
    out.insert("apiVersion".into(), json!("v1"));
    for f in SAME {
        if let Some(v) = ev.get(*f) {
            out.insert((*f).into(), v.clone());
        }
    }
    for (c, e) in RENAMES {
        if let Some(v) = ev.get(*e) {
            out.insert((*c).into(), v.clone());
        }
    }
    if !out.contains_key("reportingInstance") {
        out.insert("reportingInstance".into(), json!(""));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_recorded_event() {
        let core = json!({"kind": "Event", "apiVersion": "v1",
            "metadata": {"name": "pvc-imm.18eca3eb7972ec90", "namespace": "default"},
            "involvedObject": {"kind": "PersistentVolumeClaim", "name": "pvc-imm"},
            "reason": "ExternalProvisioning", "message": "m", "source": {"component": "persistentvolume-controller"},
            "firstTimestamp": "2026-11-29T22:16:23Z", "lastTimestamp": "2026-11-29T22:16:23Z", "count": 1,
            "type": "Normal", "eventTime": null, "reportingComponent": "persistentvolume-controller", "reportingInstance": ""});
        let v1 = core_to_v1(&core);
        assert_eq!(v1["note"], "m");
        assert_eq!(v1["deprecatedCount"], 1);
        assert_eq!(v1["reportingController"], "persistentvolume-controller");
        assert!(v1.get("reportingInstance").is_none());
        assert!(v1["eventTime"].is_null());
        let back = v1_to_core(&v1);
        assert_eq!(back["message"], "m");
        assert_eq!(back["involvedObject"]["name"], "pvc-imm");
    }
}
