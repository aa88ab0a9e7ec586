//! A slice of the snapshot-controller (kubernetes-csi/external-snapshotter v8.3
//! `pkg/common-controller`): VolumeSnapshot -> VolumeSnapshotContent creation and binding,
//! status propagation from the content, the protection finalizers, deletion by policy, and
//! pre-provisioned contents. The CSI side (creating the storage snapshot, filling the content's
//! status, removing the content's finalizer on deletion) is the driver's csi-snapshotter or our
//! provisioner, not this controller.
//!
//! Flow: like the PV controller slice it subscribes to store changes. A change of a snapshot
//! syncs it; a content change syncs the content and the snapshot it names; class, claim and
//! volume changes re-sync the snapshots that are not ready yet (upstream retries those with a
//! 1 s..5 min backoff instead); everything is re-synced every resync period. Each sync does what
//! upstream's `syncSnapshot`/`syncContent` do, and the notification of its own write drives
//! the next step, as upstream's informers do. It does nothing until the snapshot CRDs exist.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::store::{Action, Change, EventType, Origin, Store, Written};
use crate::util::{self, annotation, finalizers, is_terminating, now_nanos, now_time, str_at};

const SNAPSHOTS: &str = "volumesnapshots.snapshot.storage.k8s.io";
const CONTENTS: &str = "volumesnapshotcontents.snapshot.storage.k8s.io";
const CLASSES: &str = "volumesnapshotclasses.snapshot.storage.k8s.io";
const PVCS: &str = "persistentvolumeclaims";
const PVS: &str = "persistentvolumes";
const API_VERSION: &str = "snapshot.storage.k8s.io/v1";

pub(crate) const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
pub(crate) const BOUND_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
pub(crate) const SOURCE_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
pub(crate) const PVC_FINALIZER: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";
const ANN_BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
const ANN_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
const ANN_SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
const PARAM_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-secret-name";
const PARAM_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-secret-namespace";
const DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
const COMPONENT: &str = "snapshot-controller";
const UPDATE_FAIL: &str = "snapshot controller failed to update";

struct Controller {
    store: Arc<Store>,
    /// (object uid, type, reason, message) -> (namespace, event name), for aggregation.
    events: HashMap<(String, String, String, String), (String, String)>,
}

fn key(v: &Value) -> String {
    format!("{}/{}", util::ns_of(v), util::name_of(v))
}

fn uid(v: &Value) -> &str {
    util::meta_str(v, "uid").unwrap_or_default()
}

fn has_finalizer(v: &Value, f: &str) -> bool {
    finalizers(v).iter().any(|x| x == f)
}

fn is_ready(vs: &Value) -> bool {
    vs.pointer("/status/readyToUse").and_then(Value::as_bool) == Some(true)
}

fn bound_name(vs: &Value) -> Option<&str> {
    str_at(vs, "/status/boundVolumeSnapshotContentName").filter(|s| !s.is_empty())
}

fn is_deletion_candidate(vs: &Value) -> bool {
    is_terminating(vs)
        && (has_finalizer(vs, SOURCE_FINALIZER) || has_finalizer(vs, BOUND_FINALIZER))
}

/// `IsVolumeSnapshotRefSet`: the content points at this snapshot, uid included.
fn ref_set(vs: &Value, content: &Value) -> bool {
    str_at(content, "/spec/volumeSnapshotRef/name") == Some(util::name_of(vs))
        && str_at(content, "/spec/volumeSnapshotRef/namespace") == Some(util::ns_of(vs))
        && str_at(content, "/spec/volumeSnapshotRef/uid").unwrap_or_default() == uid(vs)
}

fn pvc_source(vs: &Value) -> Option<&str> {
    str_at(vs, "/spec/source/persistentVolumeClaimName")
}

fn content_source(vs: &Value) -> Option<&str> {
    str_at(vs, "/spec/source/volumeSnapshotContentName")
}

/// A quantity as `resource.NewQuantity(n, BinarySI).String()` prints it.
fn binary_quantity(n: i64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    if n == 0 {
        return "0".into();
    }
    for (suffix, shift) in SUFFIXES {
        let unit = 1i64 << shift;
        if n % unit == 0 {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// `metav1.Time` of a Unix time in nanoseconds (second precision, UTC).
fn time_of_nanos(ns: i64) -> Option<String> {
    let t = chrono::DateTime::from_timestamp(ns.div_euclid(1_000_000_000), 0)?;
    Some(t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// `os.Expand` of a secret template; `Err` names the unknown tokens.
fn resolve_template(template: &str, params: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::new();
    let mut missing = Vec::new();
    let mut rest = template;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        let (name, tail) = if let Some(inner) = after.strip_prefix('{') {
            match inner.find('}') {
                Some(end) => (&inner[..end], &inner[end + 1..]),
                None => (inner, ""),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        match params.iter().find(|(k, _)| *k == name) {
            Some((_, v)) => out.push_str(v),
            None => missing.push(format!("\"{name}\"")),
        }
        rest = tail;
    }
    out.push_str(rest);
    if missing.is_empty() {
        Ok(out)
    } else {
        missing.sort();
        Err(format!("invalid tokens: [{}]", missing.join(" ")))
    }
}

/// `GetSecretReference(SnapshotterSecretParams, ...)`: the deletion secret of a new content.
fn secret_ref(
    params: Option<&Value>,
    content_name: &str,
    vs: &Value,
) -> Result<Option<(String, String)>, String> {
    let get = |k: &str| params.and_then(|p| p.get(k)).and_then(Value::as_str);
    let (name_t, ns_t) = match (get(PARAM_SECRET_NAME), get(PARAM_SECRET_NAMESPACE)) {
        (None, None) => return Ok(None),
        (Some(n), Some(ns)) if !n.is_empty() && !ns.is_empty() => (n, ns),
        (Some(_), Some(_)) => {
            return Err("failed to get name and namespace template from params: snapshotter secrets specified in parameters but value of either namespace or name is empty".into());
        }
        _ => {
            return Err("failed to get name and namespace template from params: either name and namespace for snapshotter secrets specified, Both must be specified".into());
        }
    };
    let ns_params = [
        ("volumesnapshotcontent.name", content_name),
        ("volumesnapshot.namespace", util::ns_of(vs)),
    ];
    let ns = resolve_template(ns_t, &ns_params)
        .map_err(|e| format!("error resolving value \"{ns_t}\": {e}"))?;
    if !util::is_dns1123_label(&ns) {
        return Err(if ns != ns_t {
            format!("\"{ns_t}\" resolved to \"{ns}\" which is not a valid namespace name")
        } else {
            format!("\"{ns_t}\" is not a valid namespace name")
        });
    }
    let name_params = [
        ("volumesnapshotcontent.name", content_name),
        ("volumesnapshot.name", util::name_of(vs)),
        ("volumesnapshot.namespace", util::ns_of(vs)),
    ];
    let name = resolve_template(name_t, &name_params)
        .map_err(|e| format!("error resolving value \"{name_t}\": {e}"))?;
    if !util::is_dns1123_subdomain(&name) {
        return Err(if name != name_t {
            format!("\"{name_t}\" resolved to \"{name}\" which is not a valid secret name")
        } else {
            format!("\"{name_t}\" is not a valid secret name")
        });
    }
    Ok(Some((name, ns)))
}

impl Controller {
    fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.store.get(storage, ns, name)
    }

    /// Applies `f` to the current object and stores the result (as a client update would).
    fn modify(
        &self,
        storage: &'static str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Arc<Value>> {
        let key = (ns.to_string(), name.to_string());
        let result = self
            .store
            .write(storage, &key, Origin::Controller, |_, existing| {
                let Some(old) = existing else {
                    return Ok(Action::Abort);
                };
                let mut next = (**old).clone();
                f(&mut next);
                if storage == SNAPSHOTS || storage == CONTENTS {
                    crate::crd::bump_generation(true, old, &mut next);
                }
                Ok(Action::Put(next))
            });
        match result {
            Ok(Written::Aborted) => None,
            Ok(w) => w.object().cloned(),
            Err(e) => {
                tracing::warn!(resource = storage, namespace = ns, name, error = %e, "snapshot-controller write failed");
                None
            }
        }
    }

    fn event(&mut self, obj: &Value, ty: &str, reason: &str, message: &str) {
        let ns = match util::ns_of(obj) {
            "" => "default".to_string(),
            n => n.to_string(),
        };
        let cache_key = (
            uid(obj).to_string(),
            ty.to_string(),
            reason.to_string(),
            message.to_string(),
        );
        let now = now_time();
        if let Some((ens, ename)) = self.events.get(&cache_key).cloned() {
            let bumped = self.modify("events", &ens, &ename, |e| {
                let count = e.get("count").and_then(Value::as_i64).unwrap_or(1);
                e["count"] = json!(count + 1);
                e["lastTimestamp"] = json!(now);
            });
            if bumped.is_some() {
                return;
            }
        }
        let name = format!("{}.{:x}", util::name_of(obj), now_nanos());
        let ev = json!({
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now},
            "involvedObject": {
                "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
                "namespace": util::meta_str(obj, "namespace"),
                "name": util::name_of(obj),
                "uid": uid(obj),
                "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
                "resourceVersion": util::meta_str(obj, "resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "source": {"component": COMPONENT},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": ty,
            "eventTime": null,
            "reportingComponent": COMPONENT,
            "reportingInstance": "",
        });
        let key = (ns.clone(), name.clone());
        if self
            .store
            .write("events", &key, Origin::Controller, |_, _| {
                Ok(Action::Put(ev))
            })
            .is_ok()
        {
            self.events.insert(cache_key, (ns, name));
        }
    }

    /// `updateSnapshotErrorStatusWithEvent`.
    fn error_status(&mut self, vs: &Value, ready_false: bool, reason: &str, message: &str) {
        if str_at(vs, "/status/error/message") == Some(message) {
            return;
        }
        let updated = self.modify(SNAPSHOTS, util::ns_of(vs), util::name_of(vs), |v| {
            if !v.get("status").is_some_and(Value::is_object) {
                v["status"] = json!({});
            }
            v["status"]["error"] = json!({"time": now_time(), "message": message});
            if ready_false {
                v["status"]["readyToUse"] = json!(false);
            }
        });
        self.event(updated.as_deref().unwrap_or(vs), "Warning", reason, message);
    }

    fn on_change(&mut self, ch: &Change) {
        let obj = &ch.object;
        match ch.storage {
            SNAPSHOTS => {
                if ch.kind == EventType::Deleted {
                    // The claim may have lost its last unready snapshot.
                    if let Some(pvc) = pvc_source(obj) {
                        self.check_remove_pvc_finalizer(util::ns_of(obj), pvc, None);
                    }
                } else {
                    self.sync_snapshot(util::ns_of(obj), util::name_of(obj));
                }
            }
            CONTENTS => {
                if ch.kind != EventType::Deleted {
                    self.sync_content(util::name_of(obj));
                }
                if let (Some(ns), Some(name)) = (
                    str_at(obj, "/spec/volumeSnapshotRef/namespace"),
                    str_at(obj, "/spec/volumeSnapshotRef/name"),
                ) {
                    self.sync_snapshot(ns, name);
                }
            }
            CLASSES | PVCS | PVS if ch.origin == Origin::Client => {
                let ns = (ch.storage == PVCS).then(|| util::ns_of(obj).to_string());
                self.sync_unready(ns.as_deref());
            }
            _ => {}
        }
    }

    fn sync_unready(&mut self, ns: Option<&str>) {
        let (list, _) = self.store.list(SNAPSHOTS, ns);
        for vs in list
            .iter()
            .filter(|v| !is_ready(v) || bound_name(v).is_none() || is_terminating(v))
        {
            self.sync_snapshot(util::ns_of(vs), util::name_of(vs));
        }
    }

    fn resync_all(&mut self) {
        let (contents, _) = self.store.list(CONTENTS, None);
        for c in &contents {
            self.sync_content(util::name_of(c));
        }
        let (snapshots, _) = self.store.list(SNAPSHOTS, None);
        for vs in &snapshots {
            self.sync_snapshot(util::ns_of(vs), util::name_of(vs));
        }
    }

    // ---- VolumeSnapshotContent ----

    /// `syncContent`.
    fn sync_content(&mut self, name: &str) {
        let Some(content) = self.get(CONTENTS, "", name) else {
            return;
        };
        let vh = str_at(&content, "/spec/source/volumeHandle").is_some();
        let sh = str_at(&content, "/spec/source/snapshotHandle").is_some();
        if vh == sh {
            self.event(
                &content,
                "Warning",
                "ContentValidationError",
                "Exactly one of VolumeHandle and SnapshotHandle should be specified",
            );
            return;
        }
        let ref_uid = str_at(&content, "/spec/volumeSnapshotRef/uid").unwrap_or_default();
        if ref_uid.is_empty() {
            return;
        }
        if !is_terminating(&content) && !has_finalizer(&content, CONTENT_FINALIZER) {
            self.modify(CONTENTS, "", name, |c| {
                let mut f = finalizers(c);
                f.push(CONTENT_FINALIZER.to_string());
                util::set_finalizers(c, f);
            });
            return;
        }
        let snapshot = self
            .get(
                SNAPSHOTS,
                str_at(&content, "/spec/volumeSnapshotRef/namespace").unwrap_or_default(),
                str_at(&content, "/spec/volumeSnapshotRef/name").unwrap_or_default(),
            )
            .filter(|vs| uid(vs) == ref_uid);
        if let Some(vs) = snapshot
            && is_deletion_candidate(&vs)
        {
            self.set_being_deleted(&content);
        }
    }

    fn set_being_deleted(&self, content: &Value) -> Option<Arc<Value>> {
        if annotation(content, ANN_BEING_DELETED).is_some() {
            return None;
        }
        self.modify(CONTENTS, "", util::name_of(content), |c| {
            util::set_annotation(c, ANN_BEING_DELETED, "yes");
        })
    }

    // ---- VolumeSnapshot ----

    /// `syncSnapshotByKey` + `syncSnapshot`.
    fn sync_snapshot(&mut self, ns: &str, name: &str) {
        let Some(vs) = self.get(SNAPSHOTS, ns, name) else {
            return;
        };
        // checkAndUpdateSnapshotClass runs first.
        let Some(vs) = self.check_class(&vs) else {
            return;
        };
        if let Some(pvc) = pvc_source(&vs) {
            self.check_remove_pvc_finalizer(ns, pvc, None);
        }
        if is_terminating(&vs) {
            self.process_deletion(&vs);
            return;
        }
        if pvc_source(&vs).is_some() == content_source(&vs).is_some() {
            self.error_status(
                &vs,
                true,
                "SnapshotValidationError",
                "Exactly one of PersistentVolumeClaimName and VolumeSnapshotContentName should be specified",
            );
            return;
        }
        if self.add_finalizers(&vs) {
            return;
        }
        if !is_ready(&vs) || bound_name(&vs).is_none() {
            self.sync_unready_snapshot(&vs);
        } else {
            self.sync_ready_snapshot(&vs);
        }
    }

    /// `checkAndUpdateSnapshotClass`: the named class must exist; without one, the default class
    /// of the source volume's driver is written into the spec. `None` stops the sync.
    fn check_class(&mut self, vs: &Arc<Value>) -> Option<Arc<Value>> {
        if let Some(class) = str_at(vs, "/spec/volumeSnapshotClassName") {
            if self.get(CLASSES, "", class).is_none() {
                let msg = format!(
                    "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io \"{class}\" not found"
                );
                if is_terminating(vs) {
                    return Some(vs.clone());
                }
                self.error_status(vs, false, "GetSnapshotClassFailed", &msg);
                return None;
            }
            return Some(vs.clone());
        }
        if content_source(vs).is_some() || is_terminating(vs) {
            return Some(vs.clone());
        }
        let default = self.volume_of(vs).and_then(|pv| {
            let driver = str_at(&pv, "/spec/csi/driver")
                .ok_or_else(|| {
                    format!(
                        "snapshotting non-CSI volumes is not supported, snapshot:{}/{}",
                        util::ns_of(vs),
                        util::name_of(vs)
                    )
                })?
                .to_string();
            let (classes, _) = self.store.list(CLASSES, None);
            let defaults: Vec<&Arc<Value>> = classes
                .iter()
                .filter(|c| {
                    annotation(c, DEFAULT_CLASS) == Some("true")
                        && str_at(c, "/driver") == Some(driver.as_str())
                })
                .collect();
            match defaults.as_slice() {
                [] => Err("cannot find default snapshot class".to_string()),
                [one] => Ok(util::name_of(one).to_string()),
                many => Err(format!(
                    "{} default snapshot classes were found",
                    many.len()
                )),
            }
        });
        match default {
            Ok(class) => {
                self.modify(SNAPSHOTS, util::ns_of(vs), util::name_of(vs), |v| {
                    v["spec"]["volumeSnapshotClassName"] = json!(class);
                });
                // The write's notification syncs the snapshot again.
                None
            }
            Err(e) => {
                let msg = format!("Failed to set default snapshot class with error {e}");
                self.error_status(vs, false, "SetDefaultSnapshotClassFailed", &msg);
                None
            }
        }
    }

    /// `getVolumeFromVolumeSnapshot`: the bound PV of the source claim.
    fn volume_of(&self, vs: &Value) -> Result<Arc<Value>, String> {
        let claim_name = pvc_source(vs)
            .filter(|n| !n.is_empty())
            .ok_or("the snapshot source PVC name is not specified")?;
        let ns = util::ns_of(vs);
        let pvc = self.get(PVCS, ns, claim_name).ok_or_else(|| {
            format!(
                "failed to retrieve PVC {claim_name} from the lister: \"persistentvolumeclaim \\\"{claim_name}\\\" not found\""
            )
        })?;
        if str_at(&pvc, "/status/phase") != Some("Bound") {
            return Err(format!(
                "the PVC {claim_name} is not yet bound to a PV, will not attempt to take a snapshot"
            ));
        }
        let pv_name = str_at(&pvc, "/spec/volumeName").unwrap_or_default();
        let pv = self.get(PVS, "", pv_name).ok_or_else(|| {
            format!(
                "failed to retrieve PV {pv_name} from the API server: \"persistentvolumes \\\"{pv_name}\\\" not found\""
            )
        })?;
        let claim_ok = str_at(&pv, "/spec/claimRef/name") == Some(claim_name)
            && str_at(&pv, "/spec/claimRef/namespace") == Some(ns)
            && str_at(&pv, "/spec/claimRef/uid").is_none_or(|u| u.is_empty() || u == uid(&pvc));
        if !claim_ok {
            return Err("claim in dataSource not bound or invalid".into());
        }
        Ok(pv)
    }

    /// The content of a snapshot checked as upstream's `get*ContentFromStore` do (a mismatch
    /// is written to the snapshot's status). `Err` stops the sync.
    fn content_of(&mut self, vs: &Value) -> Result<Option<Arc<Value>>, ()> {
        if let Some(name) = content_source(vs) {
            if name.is_empty() {
                return Err(());
            }
            let Some(content) = self.get(CONTENTS, "", name) else {
                return Ok(None);
            };
            if str_at(&content, "/spec/source/snapshotHandle").is_none() {
                self.error_status(vs, true, "SnapshotContentMismatch", "VolumeSnapshotContent is dynamically provisioned while expecting a pre-provisioned one");
                return Err(());
            }
            let ref_uid = str_at(&content, "/spec/volumeSnapshotRef/uid").unwrap_or_default();
            if str_at(&content, "/spec/volumeSnapshotRef/name") != Some(util::name_of(vs))
                || str_at(&content, "/spec/volumeSnapshotRef/namespace") != Some(util::ns_of(vs))
                || (!ref_uid.is_empty() && ref_uid != uid(vs))
            {
                let msg =
                    format!("VolumeSnapshotContent [{name}] is bound to a different snapshot");
                self.error_status(vs, true, "SnapshotContentMisbound", &msg);
                return Err(());
            }
            return Ok(Some(content));
        }
        let name = format!("snapcontent-{}", uid(vs));
        let Some(content) = self.get(CONTENTS, "", &name) else {
            return Ok(None);
        };
        if str_at(&content, "/spec/source/volumeHandle").is_none() {
            let msg = format!(
                "VolumeSnapshotContent {name} is pre-provisioned while expecting a dynamically provisioned one"
            );
            self.error_status(vs, true, "SnapshotContentMismatch", &msg);
            return Err(());
        }
        if !ref_set(vs, &content) {
            let msg = format!("VolumeSnapshotContent [{name}] is bound to a different snapshot");
            self.error_status(vs, true, "SnapshotContentMisbound", &msg);
            return Err(());
        }
        Ok(Some(content))
    }

    /// `checkandAddSnapshotFinalizers`; true when it wrote.
    fn add_finalizers(&mut self, vs: &Value) -> bool {
        let Ok(content) = self.content_of(vs) else {
            return true;
        };
        let add_source = !is_terminating(vs) && !has_finalizer(vs, SOURCE_FINALIZER);
        let add_bound = content.is_some_and(|c| {
            str_at(&c, "/spec/deletionPolicy") == Some("Delete")
                && !is_terminating(vs)
                && !has_finalizer(vs, BOUND_FINALIZER)
                && bound_name(vs).is_some()
        });
        if !add_source && !add_bound {
            return false;
        }
        self.modify(SNAPSHOTS, util::ns_of(vs), util::name_of(vs), |v| {
            let mut f = finalizers(v);
            if add_source {
                f.push(SOURCE_FINALIZER.to_string());
            }
            if add_bound {
                f.push(BOUND_FINALIZER.to_string());
            }
            util::set_finalizers(v, f);
        });
        true
    }

    /// `syncReadySnapshot`.
    fn sync_ready_snapshot(&mut self, vs: &Value) {
        let Some(name) = bound_name(vs) else {
            return;
        };
        match self.get(CONTENTS, "", name) {
            None => self.error_status(
                vs,
                true,
                "SnapshotContentMissing",
                "VolumeSnapshotContent is missing",
            ),
            Some(c) if !ref_set(vs, &c) => self.error_status(
                vs,
                true,
                "SnapshotMisbound",
                "VolumeSnapshotContent is not bound to the VolumeSnapshot correctly",
            ),
            Some(_) => {}
        }
    }

    /// `syncUnreadySnapshot`.
    fn sync_unready_snapshot(&mut self, vs: &Value) {
        let snapshot_key = key(vs);
        if let Some(content_name) = content_source(vs) {
            let Ok(content) = self.content_of(vs) else {
                return;
            };
            let Some(content) = content else {
                self.error_status(
                    vs,
                    true,
                    "SnapshotContentMissing",
                    "VolumeSnapshotContent is missing",
                );
                return;
            };
            // checkandBindSnapshotContent: the uid (and class) go into the content first.
            let ref_uid = str_at(&content, "/spec/volumeSnapshotRef/uid").unwrap_or_default();
            if ref_uid.is_empty() || str_at(&content, "/spec/volumeSnapshotClassName").is_none() {
                let class = str_at(vs, "/spec/volumeSnapshotClassName").map(str::to_string);
                let vs_uid = uid(vs).to_string();
                let bound = self.modify(CONTENTS, "", content_name, |c| {
                    c["spec"]["volumeSnapshotRef"]["uid"] = json!(vs_uid);
                    if let Some(class) = class {
                        c["spec"]["volumeSnapshotClassName"] = json!(class);
                    }
                });
                if let Some(bound) = bound {
                    self.update_status(vs, &bound);
                }
                return;
            }
            self.update_status(vs, &content);
            return;
        }
        let Ok(existing) = self.content_of(vs) else {
            return;
        };
        if let Some(content) = existing {
            self.update_status(vs, &content);
            return;
        }
        if pvc_source(vs).is_none() {
            let msg = format!("PVC source for snapshot {snapshot_key} is missing");
            self.error_status(vs, true, "SnapshotPVCSourceMissing", &msg);
            return;
        }
        match self.create_content(vs) {
            Ok(content) => self.update_status(vs, &content),
            Err(e) => {
                let msg = format!("Failed to create snapshot content with error {e}");
                self.error_status(vs, true, "SnapshotContentCreationFailed", &msg);
            }
        }
    }

    /// `ensurePVCFinalizer`.
    fn ensure_pvc_finalizer(&self, vs: &Value) -> Result<(), String> {
        let Some(claim) = pvc_source(vs) else {
            return Ok(());
        };
        let ns = util::ns_of(vs);
        let pvc = self.get(PVCS, ns, claim).ok_or_else(|| {
            format!(
                "{UPDATE_FAIL} {} on API server: cannot get claim from snapshot",
                util::name_of(vs)
            )
        })?;
        if has_finalizer(&pvc, PVC_FINALIZER) {
            return Ok(());
        }
        if is_terminating(&pvc) {
            return Err(format!(
                "{UPDATE_FAIL} {claim} on API server: cannot add finalizer on claim because it is being deleted"
            ));
        }
        self.modify(PVCS, ns, claim, |p| {
            let mut f = finalizers(p);
            f.push(PVC_FINALIZER.to_string());
            util::set_finalizers(p, f);
        });
        Ok(())
    }

    /// `checkandRemovePVCFinalizer`: the claim's finalizer goes once no unready snapshot
    /// (other than `skip`) takes it as source.
    fn check_remove_pvc_finalizer(&self, ns: &str, claim: &str, skip: Option<&str>) {
        let Some(pvc) = self.get(PVCS, ns, claim) else {
            return;
        };
        if !has_finalizer(&pvc, PVC_FINALIZER) {
            return;
        }
        let (snapshots, _) = self.store.list(SNAPSHOTS, Some(ns));
        let in_use = snapshots.iter().any(|s| {
            Some(util::name_of(s)) != skip && pvc_source(s) == Some(claim) && !is_ready(s)
        });
        if !in_use {
            self.modify(PVCS, ns, claim, |p| {
                let f: Vec<String> = finalizers(p)
                    .into_iter()
                    .filter(|f| f != PVC_FINALIZER)
                    .collect();
                util::set_finalizers(p, f);
            });
        }
    }

    /// `createSnapshotContent`.
    fn create_content(&mut self, vs: &Value) -> Result<Arc<Value>, String> {
        self.ensure_pvc_finalizer(vs)?;
        let input_err = |e: String| {
            format!(
                "failed to get input parameters to create snapshot {}: {e:?}",
                util::name_of(vs)
            )
        };
        let class_name = str_at(vs, "/spec/volumeSnapshotClassName").ok_or_else(|| {
            input_err(format!(
                "failed to take snapshot {} without a snapshot class",
                util::name_of(vs)
            ))
        })?;
        let class = self.get(CLASSES, "", class_name).ok_or_else(|| {
            input_err(format!(
                "volumesnapshotclass.snapshot.storage.k8s.io \"{class_name}\" not found"
            ))
        })?;
        let pv = self.volume_of(vs).map_err(input_err)?;
        let content_name = format!("snapcontent-{}", uid(vs));
        let secret = secret_ref(class.get("parameters"), &content_name, vs).map_err(input_err)?;
        let Some(handle) = str_at(&pv, "/spec/csi/volumeHandle") else {
            return Err(format!(
                "cannot find CSI PersistentVolumeSource for volume {}",
                util::name_of(&pv)
            ));
        };
        let mut metadata = json!({
            "name": content_name,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": now_time(),
            "generation": 1,
        });
        if let Some((name, ns)) = secret {
            metadata["annotations"] = json!({ANN_SECRET_NAME: name, ANN_SECRET_NAMESPACE: ns});
        }
        let mut spec = json!({
            "volumeSnapshotRef": {
                "kind": "VolumeSnapshot",
                "namespace": util::ns_of(vs),
                "name": util::name_of(vs),
                "uid": uid(vs),
                "apiVersion": API_VERSION,
                "resourceVersion": util::meta_str(vs, "resourceVersion"),
            },
            "source": {"volumeHandle": handle},
            "volumeSnapshotClassName": class_name,
            "deletionPolicy": class.get("deletionPolicy").cloned().unwrap_or(Value::Null),
            "driver": class.get("driver").cloned().unwrap_or(Value::Null),
        });
        if let Some(mode) = str_at(&pv, "/spec/volumeMode") {
            spec["sourceVolumeMode"] = json!(mode);
        }
        let content = json!({
            "apiVersion": API_VERSION,
            "kind": "VolumeSnapshotContent",
            "metadata": metadata,
            "spec": spec,
        });
        let key = (String::new(), content_name.clone());
        let written = self
            .store
            .write(CONTENTS, &key, Origin::Controller, |_, existing| {
                Ok(match existing {
                    // AlreadyExists counts as success upstream.
                    Some(_) => Action::Keep,
                    None => Action::Put(content),
                })
            })
            .map_err(|e| {
                let msg = format!(
                    "Error creating volume snapshot content object for snapshot {}: {e}.",
                    key_of(vs)
                );
                format!("{UPDATE_FAIL} {} on API server: {msg}", key_of(vs))
            })?;
        let created = written
            .object()
            .cloned()
            .ok_or_else(|| "content create stored nothing".to_string())?;
        let msg = format!(
            "Waiting for a snapshot {} to be created by the CSI driver.",
            key_of(vs)
        );
        self.event(vs, "Normal", "CreatingSnapshot", &msg);
        Ok(created)
    }

    /// `updateSnapshotStatus`: the content's status copied to the snapshot's.
    fn update_status(&mut self, vs: &Value, content: &Value) {
        let Some(current) = self.get(SNAPSHOTS, util::ns_of(vs), util::name_of(vs)) else {
            return;
        };
        let content_name = util::name_of(content).to_string();
        let created_at = content
            .pointer("/status/creationTime")
            .and_then(Value::as_i64)
            .and_then(time_of_nanos);
        let size = content
            .pointer("/status/restoreSize")
            .and_then(Value::as_i64);
        let ready = content
            .pointer("/status/readyToUse")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let error = content
            .pointer("/status/error")
            .filter(|e| !e.is_null())
            .cloned();
        let old_status = current.get("status").filter(|s| s.is_object()).cloned();
        let mut status = old_status.clone().unwrap_or_else(|| json!({}));
        match &old_status {
            None => {
                status =
                    json!({"boundVolumeSnapshotContentName": content_name, "readyToUse": ready});
                if let Some(t) = &created_at {
                    status["creationTime"] = json!(t);
                }
                if let Some(n) = size {
                    status["restoreSize"] = json!(binary_quantity(n));
                }
                if let Some(e) = &error {
                    status["error"] = e.clone();
                }
            }
            Some(_) => {
                if str_at(&status, "/boundVolumeSnapshotContentName").is_none() {
                    status["boundVolumeSnapshotContentName"] = json!(content_name);
                }
                if status.get("creationTime").is_none_or(Value::is_null)
                    && let Some(t) = &created_at
                {
                    status["creationTime"] = json!(t);
                }
                if status.get("readyToUse").and_then(Value::as_bool) != Some(ready) {
                    status["readyToUse"] = json!(ready);
                    if ready && let Some(m) = status.as_object_mut() {
                        m.remove("error");
                    }
                }
                let zero_size = status
                    .get("restoreSize")
                    .and_then(|q| {
                        q.as_str()
                            .map(str::to_string)
                            .or_else(|| q.as_i64().map(|n| n.to_string()))
                    })
                    .is_some_and(|q| kube_quantity::parse(&q).is_ok_and(|q| q.is_zero()));
                if let Some(n) = size
                    && (status.get("restoreSize").is_none_or(Value::is_null)
                        || (zero_size && n > 0))
                {
                    status["restoreSize"] = json!(binary_quantity(n));
                }
                let has_error = status.get("error").is_some_and(|e| !e.is_null());
                match (&error, has_error) {
                    (Some(e), _) => {
                        if status.get("error") != Some(e) {
                            status["error"] = e.clone();
                        }
                    }
                    (None, true) => {
                        if let Some(m) = status.as_object_mut() {
                            m.remove("error");
                        }
                    }
                    (None, false) => {}
                }
            }
        }
        if old_status.as_ref() == Some(&status) {
            return;
        }
        let created_before = current
            .pointer("/status/creationTime")
            .is_some_and(|v| !v.is_null());
        let ready_before = is_ready(&current);
        let updated = self.modify(SNAPSHOTS, util::ns_of(vs), util::name_of(vs), |v| {
            v["status"] = status;
        });
        if let Some(updated) = updated {
            let snapshot_key = key(&updated);
            if !created_before && updated.pointer("/status/creationTime").is_some() {
                let msg =
                    format!("Snapshot {snapshot_key} was successfully created by the CSI driver.");
                self.event(&updated, "Normal", "SnapshotCreated", &msg);
            }
            if !ready_before && is_ready(&updated) {
                let msg = format!("Snapshot {snapshot_key} is ready to use.");
                self.event(&updated, "Normal", "SnapshotReady", &msg);
            }
        }
    }

    /// `processSnapshotWithDeletionTimestamp` and
    /// `checkandRemoveSnapshotFinalizersAndCheckandDeleteContent`.
    fn process_deletion(&mut self, vs: &Value) {
        let content_name = bound_name(vs)
            .map(str::to_string)
            .or_else(|| pvc_source(vs).map(|_| format!("snapcontent-{}", uid(vs))));
        let mut content = content_name.and_then(|n| self.get(CONTENTS, "", &n));
        let mut delete_content = false;
        match &content {
            Some(c) if ref_set(vs, c) => {
                delete_content = str_at(c, "/spec/deletionPolicy") == Some("Delete");
            }
            _ => content = None,
        }
        if !is_deletion_candidate(vs) {
            return;
        }
        if content.is_some() && self.being_restored(vs) {
            self.event(
                vs,
                "Warning",
                "SnapshotDeletePending",
                "Snapshot is being used to restore a PVC",
            );
            return;
        }
        if let Some(c) = &content {
            self.set_being_deleted(c);
            if delete_content {
                let key = (String::new(), util::name_of(c).to_string());
                let _ = self
                    .store
                    .write(CONTENTS, &key, Origin::Controller, |_, existing| {
                        let Some(old) = existing else {
                            return Ok(Action::Abort);
                        };
                        if finalizers(old).is_empty() {
                            return Ok(Action::Remove);
                        }
                        if is_terminating(old) {
                            return Ok(Action::Keep);
                        }
                        let mut next = (**old).clone();
                        next["metadata"]["deletionTimestamp"] = json!(now_time());
                        next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                        Ok(Action::Put(next))
                    });
            }
        }
        let remove_bound = !(content.is_some() && delete_content);
        if let Some(pvc) = pvc_source(vs) {
            self.check_remove_pvc_finalizer(util::ns_of(vs), pvc, Some(util::name_of(vs)));
        }
        self.modify(SNAPSHOTS, util::ns_of(vs), util::name_of(vs), |v| {
            let f: Vec<String> = finalizers(v)
                .into_iter()
                .filter(|f| f != SOURCE_FINALIZER && !(remove_bound && f == BOUND_FINALIZER))
                .collect();
            util::set_finalizers(v, f);
        });
    }

    /// `isVolumeBeingCreatedFromSnapshot`: a Pending claim restores from this snapshot.
    fn being_restored(&self, vs: &Value) -> bool {
        let (claims, _) = self.store.list(PVCS, Some(util::ns_of(vs)));
        claims.iter().any(|c| {
            str_at(c, "/spec/dataSource/name") == Some(util::name_of(vs))
                && str_at(c, "/spec/dataSource/kind") == Some("VolumeSnapshot")
                && str_at(c, "/spec/dataSource/apiGroup") == Some("snapshot.storage.k8s.io")
                && str_at(c, "/status/phase") == Some("Pending")
        })
    }
}

fn key_of(vs: &Value) -> String {
    key(vs)
}

/// Runs the snapshot-controller slice until the store's subscription ends (or it is aborted).
pub(crate) async fn run(
    store: Arc<Store>,
    mut rx: mpsc::UnboundedReceiver<Arc<Change>>,
    resync: Duration,
) {
    let mut ctl = Controller {
        store,
        events: HashMap::new(),
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
    loop {
        tokio::select! {
            ch = rx.recv() => match ch {
                Some(ch) => ctl.on_change(&ch),
                None => return,
            },
            _ = tick.tick() => ctl.resync_all(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_sizes_print_as_binary_quantities() {
        assert_eq!(binary_quantity(0), "0");
        assert_eq!(binary_quantity(1 << 30), "1Gi");
        assert_eq!(binary_quantity(1536 * 1024 * 1024), "1536Mi");
        assert_eq!(binary_quantity(1000), "1000");
    }

    #[test]
    fn secret_templates_resolve_like_os_expand() {
        let vs = json!({"metadata": {"name": "snap", "namespace": "team"}});
        let params = json!({PARAM_SECRET_NAME: "${volumesnapshot.name}-secret", PARAM_SECRET_NAMESPACE: "${volumesnapshot.namespace}"});
        assert_eq!(
            secret_ref(Some(&params), "snapcontent-1", &vs),
            Ok(Some(("snap-secret".into(), "team".into())))
        );
        let only_name = json!({PARAM_SECRET_NAME: "s"});
        assert!(secret_ref(Some(&only_name), "c", &vs).is_err());
        let bad = json!({PARAM_SECRET_NAME: "${pvc.name}", PARAM_SECRET_NAMESPACE: "ns"});
        assert_eq!(
            secret_ref(Some(&bad), "c", &vs),
            Err("error resolving value \"${pvc.name}\": invalid tokens: [\"pvc.name\"]".into())
        );
        assert_eq!(secret_ref(None, "c", &vs), Ok(None));
    }
}
