//! Validation (422) and the validating admission plugins (PersistentVolumeClaimResize: 403),
//! per kind, with kube-apiserver's messages.

use serde_json::{Value, json};

use crate::resources::ResourceInfo;
use crate::status::{ApiError, Cause};
use crate::store::StoreView;
use crate::util::{
    self, DNS1123_LABEL_MSG, DNS1123_SUBDOMAIN_MSG, finalizers, is_dns1123_label,
    is_dns1123_subdomain, str_at,
};
use kube_quantity::Quantity;

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const RESIZE_STATUSES: &[&str] = &[
    "ControllerResizeInProgress",
    "ControllerResizeInfeasible",
    "NodeResizeInProgress",
    "NodeResizeInfeasible",
    "NodeResizePending",
];
const PV_SOURCES: &[&str] = &[
    "csi",
    "rbd",
    "hostPath",
    "local",
    "nfs",
    "iscsi",
    "fc",
    "cephfs",
    "flexVolume",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cinder",
    "glusterfs",
    "portworxVolume",
    "quobyte",
    "scaleIO",
    "storageos",
    "vsphereVolume",
    "photonPersistentDisk",
    "flocker",
];

fn name_causes(res: &ResourceInfo, obj: &Value, causes: &mut Vec<Cause>) {
    let name = util::name_of(obj);
    let generate = util::meta_str(obj, "generateName").unwrap_or_default();
    let (ok, msg): (fn(&str) -> bool, &str) = if res.kind == "Namespace" {
        (is_dns1123_label, DNS1123_LABEL_MSG)
    } else {
        (is_dns1123_subdomain, DNS1123_SUBDOMAIN_MSG)
    };
    if !generate.is_empty() {
        let masked = match generate.strip_suffix('-') {
            Some(p) => format!("{p}a"),
            None => generate.to_string(),
        };
        if !ok(&masked) {
            causes.push(Cause::invalid(
                "metadata.generateName",
                &format!("\"{generate}\""),
                msg,
            ));
        }
    }
    if name.is_empty() {
        causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if !ok(name) {
        causes.push(Cause::invalid("metadata.name", &format!("\"{name}\""), msg));
    }
}

fn access_mode_causes(
    obj: &Value,
    field: &str,
    ptr: &str,
    required_msg: &str,
    causes: &mut Vec<Cause>,
) {
    let modes = obj.pointer(ptr).and_then(Value::as_array);
    match modes {
        None => causes.push(Cause::required(field, required_msg)),
        Some(m) if m.is_empty() => causes.push(Cause::required(field, required_msg)),
        Some(m) => {
            for v in m.iter().filter_map(Value::as_str) {
                if !ACCESS_MODES.contains(&v) {
                    causes.push(Cause::not_supported(field, v, ACCESS_MODES));
                }
            }
        }
    }
}

fn storage_causes(obj: &Value, ptr: &str, field: &str, causes: &mut Vec<Cause>) {
    match obj.pointer(ptr).and_then(Value::as_str) {
        None => causes.push(Cause::required(field, "")),
        Some(s) => {
            if kube_quantity::parse(s).map_or(true, |q| !q.is_positive()) {
                causes.push(Cause::invalid(
                    field,
                    &format!("\"{s}\""),
                    "must be greater than zero",
                ));
            }
        }
    }
}

fn spec_causes(res: &ResourceInfo, obj: &Value, causes: &mut Vec<Cause>) {
    match (res.group, res.kind) {
        ("", "PersistentVolumeClaim") => {
            access_mode_causes(
                obj,
                "spec.accessModes",
                "/spec/accessModes",
                "at least 1 access mode is required",
                causes,
            );
            storage_causes(
                obj,
                "/spec/resources/requests/storage",
                "spec.resources[storage]",
                causes,
            );
            if let Some(m) = str_at(obj, "/spec/volumeMode")
                && !["Block", "Filesystem"].contains(&m)
            {
                causes.push(Cause::not_supported(
                    "spec.volumeMode",
                    m,
                    &["Block", "Filesystem"],
                ));
            }
        }
        ("", "PersistentVolume") => {
            access_mode_causes(
                obj,
                "spec.accessModes",
                "/spec/accessModes",
                "must specify at least 1 access mode",
                causes,
            );
            if obj.pointer("/spec/capacity").is_none() {
                causes.push(Cause::required("spec.capacity", ""));
            } else {
                storage_causes(
                    obj,
                    "/spec/capacity/storage",
                    "spec.capacity[storage]",
                    causes,
                );
            }
            let spec = obj.get("spec").and_then(Value::as_object);
            if !PV_SOURCES
                .iter()
                .any(|s| spec.is_some_and(|m| m.contains_key(*s)))
            {
                causes.push(Cause::required("spec", "must specify a volume type"));
            }
            if let Some(p) = str_at(obj, "/spec/persistentVolumeReclaimPolicy")
                && !["Delete", "Recycle", "Retain"].contains(&p)
            {
                causes.push(Cause::not_supported(
                    "spec.persistentVolumeReclaimPolicy",
                    p,
                    &["Delete", "Recycle", "Retain"],
                ));
            }
        }
        ("storage.k8s.io", "VolumeAttributesClass") => crate::vac::class_causes(None, obj, causes),
        ("storage.k8s.io", "StorageClass") => {
            if str_at(obj, "/provisioner").is_none_or(str::is_empty) {
                causes.push(Cause::required("provisioner", ""));
            }
            if let Some(m) = str_at(obj, "/volumeBindingMode")
                && !["Immediate", "WaitForFirstConsumer"].contains(&m)
            {
                causes.push(Cause::not_supported(
                    "volumeBindingMode",
                    m,
                    &["Immediate", "WaitForFirstConsumer"],
                ));
            }
        }
        _ => {}
    }
}

fn status_causes(res: &ResourceInfo, obj: &Value, causes: &mut Vec<Cause>) {
    if res.kind != "PersistentVolumeClaim" || !res.group.is_empty() {
        return;
    }
    crate::vac::claim_status_causes(obj, causes);
    if let Some(m) = obj
        .pointer("/status/allocatedResourceStatuses")
        .and_then(Value::as_object)
    {
        for (k, v) in m {
            if !v.as_str().is_some_and(|s| RESIZE_STATUSES.contains(&s)) {
                causes.push(Cause::not_supported(
                    "status.allocatedResourceStatuses",
                    k,
                    RESIZE_STATUSES,
                ));
            }
        }
    }
}

fn fail(res: &ResourceInfo, obj: &Value, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(res, util::name_of(obj), causes))
    }
}

/// Validation of a new object (422 on failure).
pub(crate) fn validate_create(res: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if res.kind == "CustomResourceDefinition" && res.group == "apiextensions.k8s.io" {
        crate::crd::validate_crd(obj, None)?;
    }
    if let Some(custom) = res.custom {
        crate::crd::validate_custom(res, custom, None, obj)?;
    }
    let mut causes = Vec::new();
    name_causes(res, obj, &mut causes);
    spec_causes(res, obj, &mut causes);
    fail(res, obj, causes)
}

fn storage_of(obj: &Value, ptr: &str) -> Option<Quantity> {
    str_at(obj, ptr).and_then(|s| kube_quantity::parse(s).ok())
}

/// A Go-struct-diff-like rendering of the changed PVC spec fields (for the immutability error).
fn spec_diff(old: &Value, new: &Value) -> String {
    let mut out = String::new();
    if let (Some(o), Some(n)) = (
        old.get("spec").and_then(Value::as_object),
        new.get("spec").and_then(Value::as_object),
    ) {
        let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
        for k in keys {
            if o.get(k) != n.get(k) {
                out.push_str(&format!(
                    "-  {k}: {}\n+  {k}: {}\n",
                    o.get(k).map(Value::to_string).unwrap_or_default(),
                    n.get(k).map(Value::to_string).unwrap_or_default()
                ));
            }
        }
    }
    out
}

fn pvc_update(
    res: &ResourceInfo,
    old: &Value,
    new: &Value,
    view: &StoreView<'_>,
) -> Result<(), ApiError> {
    let name = util::name_of(new);
    let bound = str_at(old, "/status/phase") == Some("Bound");
    let old_req = storage_of(old, "/spec/resources/requests/storage");
    let new_req = storage_of(new, "/spec/resources/requests/storage");
    let growing = matches!((&old_req, &new_req), (Some(o), Some(n)) if n > o);
    // PersistentVolumeClaimResize admission: only bound claims of expandable classes grow.
    if bound && growing {
        let class = str_at(old, "/spec/storageClassName").unwrap_or_default();
        let allowed = view.get("storageclasses", "", class).is_some_and(|sc| {
            sc.get("allowVolumeExpansion").and_then(Value::as_bool) == Some(true)
        });
        if !allowed {
            return Err(ApiError::forbidden(
                res,
                name,
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            ));
        }
    }
    let mut causes = Vec::new();
    spec_causes(res, new, &mut causes);
    // Spec immutability, except what is allowed to change.
    let mut o = old.get("spec").cloned().unwrap_or(json!({}));
    let mut n = new.get("spec").cloned().unwrap_or(json!({}));
    for spec in [&mut o, &mut n] {
        if let Some(m) = spec.as_object_mut() {
            m.remove("volumeAttributesClassName");
            if bound && let Some(r) = m.get_mut("resources").and_then(Value::as_object_mut) {
                r.remove("requests");
            }
        }
    }
    if str_at(old, "/spec/volumeName").is_none_or(str::is_empty)
        && let (Some(om), Some(nm)) = (o.as_object_mut(), n.as_object_mut())
    {
        om.remove("volumeName");
        nm.remove("volumeName");
    }
    if str_at(old, "/spec/storageClassName").is_none()
        && let (Some(om), Some(nm)) = (o.as_object_mut(), n.as_object_mut())
    {
        om.remove("storageClassName");
        nm.remove("storageClassName");
    }
    if o != n {
        let msg = format!(
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n{}",
            spec_diff(&json!({"spec": o}), &json!({"spec": n}))
        );
        causes.push(Cause::forbidden("spec", &msg));
    } else if bound
        && let (Some(req), Some(cap)) = (&new_req, storage_of(old, "/status/capacity/storage"))
        && *req < cap
        && old_req != new_req
    {
        causes.push(Cause::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    status_causes(res, new, &mut causes);
    fail(res, new, causes)
}

/// Admission and validation of an update. `old`/`new` are full stored objects.
pub(crate) fn validate_update(
    res: &ResourceInfo,
    old: &Value,
    new: &Value,
    view: &StoreView<'_>,
) -> Result<(), ApiError> {
    // No new finalizers once an object is terminating.
    if util::is_terminating(old) {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let list: Vec<String> = added.iter().map(|f| format!("\"{f}\"")).collect();
            return Err(ApiError::invalid(
                res,
                util::name_of(new),
                vec![Cause::forbidden(
                    "metadata.finalizers",
                    &format!(
                        "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                        list.join(", ")
                    ),
                )],
            ));
        }
    }
    if let Some(custom) = res.custom {
        crate::crd::validate_custom(res, custom, Some(old), new)?;
    }
    match (res.group, res.kind) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            crate::crd::validate_crd(new, Some(old))
        }
        ("", "PersistentVolumeClaim") => pvc_update(res, old, new, view),
        ("storage.k8s.io", "VolumeAttributesClass") => {
            let mut causes = Vec::new();
            crate::vac::class_causes(Some(old), new, &mut causes);
            fail(res, new, causes)
        }
        ("storage.k8s.io", "StorageClass") => {
            let mut causes = Vec::new();
            for f in [
                "parameters",
                "provisioner",
                "reclaimPolicy",
                "volumeBindingMode",
            ] {
                if old.get(f) != new.get(f) {
                    causes.push(Cause::forbidden(
                        f,
                        &format!("updates to {f} are forbidden."),
                    ));
                }
            }
            fail(res, new, causes)
        }
        _ => {
            let mut causes = Vec::new();
            spec_causes(res, new, &mut causes);
            status_causes(res, new, &mut causes);
            fail(res, new, causes)
        }
    }
}
