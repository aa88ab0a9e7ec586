//! Mutating admission and defaulting, per kind, as kube-apiserver 1.36 runs them with its
//! default plugins: protection finalizers, DefaultStorageClass, scheme defaults.

use serde_json::{Map, Value, json};

use crate::resources::ResourceInfo;
use crate::store::StoreView;
use crate::util::{self, annotation, base64_encode, finalizers, now_time, obj_mut};

pub(crate) use crate::validation::{validate_create, validate_update};

pub(crate) const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub(crate) const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const DEFAULT_CLASS_BETA: &str = "storageclass.beta.kubernetes.io/is-default-class";

fn set_default(obj: &mut Value, section: &str, key: &str, value: Value) {
    if let Some(m) = obj_mut(obj, section) {
        m.entry(key.to_string()).or_insert(value);
    }
}

fn add_finalizer(obj: &mut Value, f: &str) {
    let mut list = finalizers(obj);
    if !list.iter().any(|x| x == f) {
        list.push(f.to_string());
        util::set_finalizers(obj, list);
    }
}

/// The default StorageClass: the newest class annotated as default.
fn default_class(view: &StoreView<'_>) -> Option<String> {
    let mut best: Option<(String, String)> = None;
    for sc in view.list("storageclasses") {
        let is_default = annotation(&sc, DEFAULT_CLASS) == Some("true")
            || annotation(&sc, DEFAULT_CLASS_BETA) == Some("true");
        if !is_default {
            continue;
        }
        let created = util::meta_str(&sc, "creationTimestamp")
            .unwrap_or_default()
            .to_string();
        let name = util::name_of(&sc).to_string();
        if best
            .as_ref()
            .is_none_or(|(c, n)| (&created, &name) > (c, n))
        {
            best = Some((created, name));
        }
    }
    best.map(|(_, n)| n)
}

/// Mutating admission and defaulting on create. Returns warnings.
pub(crate) fn on_create(res: &ResourceInfo, obj: &mut Value, view: &StoreView<'_>) -> Vec<String> {
    let mut warnings = Vec::new();
    match (res.group, res.kind) {
        ("", "PersistentVolumeClaim") => {
            add_finalizer(obj, PVC_PROTECTION);
            let has_class = obj
                .pointer("/spec/storageClassName")
                .is_some_and(|v| !v.is_null())
                || annotation(obj, "volume.beta.kubernetes.io/storage-class").is_some();
            if !has_class && let Some(class) = default_class(view) {
                set_default(obj, "spec", "storageClassName", json!(class));
            }
            if let Some(m) = obj.as_object_mut() {
                m.insert("status".into(), json!({"phase": "Pending"}));
            }
        }
        ("", "PersistentVolume") => {
            add_finalizer(obj, PV_PROTECTION);
            set_default(obj, "spec", "volumeMode", json!("Filesystem"));
            set_default(
                obj,
                "spec",
                "persistentVolumeReclaimPolicy",
                json!("Retain"),
            );
            if let Some(m) = obj.as_object_mut() {
                m.insert(
                    "status".into(),
                    json!({"phase": "Pending", "lastPhaseTransitionTime": now_time()}),
                );
            }
            if obj.pointer("/spec/rbd").is_some() {
                warnings.push("spec.rbd: deprecated in v1.28, non-functional in v1.31+".into());
            }
        }
        ("", "Pod") => {
            if let Some(m) = obj.as_object_mut() {
                m.insert("status".into(), json!({"phase": "Pending"}));
            }
        }
        ("", "Namespace") => {
            set_default(obj, "spec", "finalizers", json!(["kubernetes"]));
            if let Some(m) = obj.as_object_mut() {
                m.insert("status".into(), json!({"phase": "Active"}));
            }
        }
        ("storage.k8s.io", "VolumeAttachment") => {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crate::crd::on_create_crd(obj),
        _ if res.custom.is_some() => crate::crd::on_create_custom(res, obj),
        _ => {}
    }
    normalize(res, obj);
    warnings
}

/// Defaulting and normalisation applied on every write (create and update), like the
/// scheme defaulters that run on every decode.
pub(crate) fn normalize(res: &ResourceInfo, obj: &mut Value) {
    match (res.group, res.kind) {
        ("", "PersistentVolumeClaim") => {
            set_default(obj, "spec", "volumeMode", json!("Filesystem"));
        }
        ("", "PersistentVolume") => {
            set_default(obj, "spec", "volumeMode", json!("Filesystem"));
            set_default(
                obj,
                "spec",
                "persistentVolumeReclaimPolicy",
                json!("Retain"),
            );
        }
        ("storage.k8s.io", "StorageClass") => {
            if let Some(m) = obj.as_object_mut() {
                m.entry("reclaimPolicy").or_insert(json!("Delete"));
                m.entry("volumeBindingMode").or_insert(json!("Immediate"));
            }
        }
        ("storage.k8s.io", "CSIDriver") => {
            for (k, v) in [
                ("attachRequired", json!(true)),
                ("fsGroupPolicy", json!("ReadWriteOnceWithFSType")),
                ("podInfoOnMount", json!(false)),
                ("requiresRepublish", json!(false)),
                ("seLinuxMount", json!(false)),
                ("storageCapacity", json!(false)),
                ("volumeLifecycleModes", json!(["Persistent"])),
            ] {
                set_default(obj, "spec", k, v);
            }
        }

        ("", "Secret") => {
            if let Some(m) = obj.as_object_mut() {
                m.entry("type").or_insert(json!("Opaque"));
            }
            let string_data = obj.as_object_mut().and_then(|m| m.remove("stringData"));
            if let Some(Value::Object(sd)) = string_data
                && let Some(data) = obj_mut(obj, "data")
            {
                for (k, v) in sd {
                    let text = v.as_str().unwrap_or_default().to_string();
                    data.insert(k, json!(base64_encode(text.as_bytes(), false)));
                }
            }
        }
        ("", "Event") => {
            if let Some(m) = obj.as_object_mut() {
                m.entry("eventTime").or_insert(Value::Null);
                m.entry("reportingComponent").or_insert(json!(""));
                m.entry("reportingInstance").or_insert(json!(""));
            }
        }
        _ => {}
    }
    crate::schema::canonicalize_quantities(res, obj);
}

/// The metadata fields a write may not change (copied from the stored object).
pub(crate) fn carry_immutable_metadata(old: &Value, new: &mut Value) {
    let Some(old_meta) = old.get("metadata").and_then(Value::as_object) else {
        return;
    };
    let old_meta: Map<String, Value> = old_meta.clone();
    if let Some(meta) = obj_mut(new, "metadata") {
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
            "generateName",
            "managedFields",
        ] {
            match old_meta.get(f) {
                Some(v) => {
                    meta.insert(f.into(), v.clone());
                }
                None => {
                    meta.remove(f);
                }
            }
        }
        meta.remove("selfLink");
    }
}
