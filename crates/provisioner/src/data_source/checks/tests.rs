//! The checks on typed objects, with a backend whose snapshot handles are `snap:NAME` and whose
//! volumes are CSI volumes of `our.csi.io`.

use super::*;
use serde_json::{Value, json};

const DRIVER: &str = "our.csi.io";
const LEGACY_DRIVER: &str = "example.com/ours";
const SNAPSHOT: &str = "spec.dataSource: VolumeSnapshot ns/snap";
const CLAIM: &str = "spec.dataSource: PersistentVolumeClaim ns/src";

struct Backend;

impl SourceBackend for Backend {
    type Snapshot = String;
    type Volume = String;

    fn snapshot_drivers(&self) -> Vec<&str> {
        vec![DRIVER, LEGACY_DRIVER]
    }

    fn snapshot(&self, handle: &str) -> Result<String, String> {
        handle
            .strip_prefix("snap:")
            .map(str::to_owned)
            .ok_or_else(|| format!("{handle:?} does not start with \"snap:\""))
    }

    fn volume(&self, pv: &PersistentVolume) -> Result<String, String> {
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .filter(|c| c.driver == DRIVER)
            .map(|c| c.volume_handle.clone())
            .ok_or_else(|| format!("no csi source of driver {DRIVER}"))
    }
}

/// `value` with `patch` merged in (objects merged key by key, `null` removes).
fn merged(mut value: Value, patch: &Value) -> Value {
    merge(&mut value, patch);
    value
}

fn merge(value: &mut Value, patch: &Value) {
    match (value, patch) {
        (Value::Object(v), Value::Object(p)) => {
            for (key, p) in p {
                if p.is_null() {
                    v.remove(key);
                } else {
                    merge(v.entry(key.clone()).or_insert(Value::Null), p);
                }
            }
        }
        (v, p) => *v = p.clone(),
    }
}

fn claim(size: &str, mode: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "new", "namespace": "ns", "uid": "u-new"},
        "spec": {
            "storageClassName": "fast",
            "volumeMode": mode,
            "resources": {"requests": {"storage": size}},
        },
    }))
    .unwrap()
}

fn vs_with(patch: &Value) -> VolumeSnapshot {
    let vs = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "snap", "namespace": "ns", "uid": "u-vs"},
        "spec": {"source": {"persistentVolumeClaimName": "src"}},
        "status": {"readyToUse": true, "boundVolumeSnapshotContentName": "c", "restoreSize": "1Gi"},
    });
    serde_json::from_value(merged(vs, patch)).unwrap()
}

fn vs() -> VolumeSnapshot {
    vs_with(&json!({}))
}

fn content_with(patch: &Value) -> VolumeSnapshotContent {
    let content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": "c"},
        "spec": {
            "driver": DRIVER,
            "deletionPolicy": "Delete",
            "source": {"volumeHandle": "vol-1"},
            "sourceVolumeMode": "Filesystem",
            "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u-vs"},
        },
        "status": {"snapshotHandle": "snap:s1", "readyToUse": true},
    });
    serde_json::from_value(merged(content, patch)).unwrap()
}

fn content() -> VolumeSnapshotContent {
    content_with(&json!({}))
}

fn restore(
    claim: &PersistentVolumeClaim,
    vs: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
) -> Result<ResolvedBy<Backend>, String> {
    check_snapshot(&Backend, claim, vs, content, SNAPSHOT)
}

fn restore_refusal(
    claim: &PersistentVolumeClaim,
    vs: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
) -> String {
    match restore(claim, vs, content) {
        Ok(r) => panic!("restore accepted: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_ready_snapshot_of_our_driver_restores_into_an_equal_or_larger_claim() {
    assert_eq!(snapshot_ready(&vs(), SNAPSHOT).unwrap(), "c");
    for size in ["1Gi", "2Gi"] {
        match restore(&claim(size, "Filesystem"), &vs(), &content()).unwrap() {
            Resolved::Snapshot {
                vs,
                handle,
                snapshot,
            } => {
                assert_eq!(
                    (vs.as_str(), handle.as_str(), snapshot.as_str()),
                    ("snap", "snap:s1", "s1")
                );
            }
            other @ Resolved::Volume { .. } => panic!("{other:?}"),
        }
    }
    let legacy = content_with(&json!({"spec": {"driver": LEGACY_DRIVER}}));
    let resolved = restore(&claim("1Gi", "Filesystem"), &vs(), &legacy).unwrap();
    assert_eq!(resolved.data_source(), DataSource::Snapshot("snap".into()));
}

#[test]
fn a_snapshot_being_deleted_unready_or_unbound_is_refused() {
    let deleting = vs_with(&json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}));
    assert_eq!(
        snapshot_ready(&deleting, SNAPSHOT).unwrap_err(),
        format!("{SNAPSHOT} is being deleted")
    );
    let unready = vs_with(&json!({"status": {"readyToUse": false}}));
    assert_eq!(
        snapshot_ready(&unready, SNAPSHOT).unwrap_err(),
        format!("{SNAPSHOT} is not ready to use (status.readyToUse is not true)")
    );
    let unbound = vs_with(&json!({"status": {"boundVolumeSnapshotContentName": null}}));
    assert_eq!(
        snapshot_ready(&unbound, SNAPSHOT).unwrap_err(),
        format!("{SNAPSHOT} is not bound to a VolumeSnapshotContent")
    );
}

#[test]
fn a_content_bound_to_another_snapshot_is_refused_naming_its_snapshot_ref() {
    for patch in [
        json!({"spec": {"volumeSnapshotRef": {"uid": "u-old"}}}),
        json!({"spec": {"volumeSnapshotRef": {"name": "other"}}}),
        json!({"spec": {"volumeSnapshotRef": {"namespace": "other"}}}),
    ] {
        let e = restore_refusal(&claim("1Gi", "Filesystem"), &vs(), &content_with(&patch));
        assert_eq!(
            e,
            format!(
                "{SNAPSHOT}: VolumeSnapshotContent c is bound to another snapshot \
                 (spec.volumeSnapshotRef does not name it)"
            ),
            "{patch}"
        );
    }
}

#[test]
fn a_content_of_another_driver_is_refused_naming_spec_driver() {
    let other = content_with(&json!({"spec": {"driver": "other.csi.io"}}));
    assert_eq!(
        restore_refusal(&claim("1Gi", "Filesystem"), &vs(), &other),
        format!(
            "{SNAPSHOT}: VolumeSnapshotContent c has spec.driver \"other.csi.io\", not ours \
             ({DRIVER} or {LEGACY_DRIVER})"
        )
    );
}

#[test]
fn a_content_without_a_handle_or_with_one_the_backend_cannot_read_is_refused() {
    let no_handle = content_with(&json!({"status": {"snapshotHandle": null}}));
    assert_eq!(
        restore_refusal(&claim("1Gi", "Filesystem"), &vs(), &no_handle),
        format!("{SNAPSHOT}: VolumeSnapshotContent c has no status.snapshotHandle")
    );
    let foreign = content_with(&json!({"status": {"snapshotHandle": "x-1"}}));
    assert_eq!(
        restore_refusal(&claim("1Gi", "Filesystem"), &vs(), &foreign),
        format!(
            "{SNAPSHOT}: VolumeSnapshotContent c status.snapshotHandle: \"x-1\" does not start \
             with \"snap:\""
        )
    );
}

#[test]
fn a_claim_smaller_than_the_restore_size_is_refused_naming_its_request() {
    assert_eq!(
        restore_refusal(&claim("512Mi", "Filesystem"), &vs(), &content()),
        format!(
            "spec.resources.requests.storage (536870912 bytes) is smaller than the restore size \
             of {SNAPSHOT} (1073741824 bytes)"
        )
    );
    // without the snapshot's restoreSize, the content's (bytes) counts
    let no_size = vs_with(&json!({"status": {"restoreSize": null}}));
    let sized = content_with(&json!({"status": {"restoreSize": 2_147_483_648_i64}}));
    let e = restore_refusal(&claim("1Gi", "Filesystem"), &no_size, &sized);
    assert!(
        e.starts_with("spec.resources.requests.storage (1073741824 bytes)")
            && e.ends_with("(2147483648 bytes)"),
        "{e}"
    );
    assert!(restore(&claim("1Gi", "Filesystem"), &no_size, &content()).is_ok());
}

#[test]
fn another_volume_mode_is_refused_unless_the_content_allows_the_change() {
    assert_eq!(
        restore_refusal(&claim("1Gi", "Block"), &vs(), &content()),
        format!(
            "spec.volumeMode \"Block\" differs from the volume mode \"Filesystem\" {SNAPSHOT} was \
             taken from (set the annotation {ANN_ALLOW_MODE_CHANGE}: \"true\" on \
             VolumeSnapshotContent c to allow it)"
        )
    );
    let allowed =
        content_with(&json!({"metadata": {"annotations": {ANN_ALLOW_MODE_CHANGE: "true"}}}));
    assert!(restore(&claim("1Gi", "Block"), &vs(), &allowed).is_ok());
    let not_allowed =
        content_with(&json!({"metadata": {"annotations": {ANN_ALLOW_MODE_CHANGE: "yes"}}}));
    assert!(restore(&claim("1Gi", "Block"), &vs(), &not_allowed).is_err());
    // a content that does not record the source's mode allows any
    let unrecorded = content_with(&json!({"spec": {"sourceVolumeMode": null}}));
    assert!(restore(&claim("1Gi", "Block"), &vs(), &unrecorded).is_ok());
}

fn source_with(patch: &Value) -> PersistentVolumeClaim {
    let source = json!({
        "metadata": {"name": "src", "namespace": "ns", "uid": "u-src"},
        "spec": {
            "storageClassName": "fast", "volumeMode": "Filesystem", "volumeName": "pv-src",
            "resources": {"requests": {"storage": "1Gi"}},
        },
        "status": {"phase": "Bound"},
    });
    serde_json::from_value(merged(source, patch)).unwrap()
}

fn source() -> PersistentVolumeClaim {
    source_with(&json!({}))
}

fn pv_with(patch: &Value) -> PersistentVolume {
    let pv = json!({
        "metadata": {"name": "pv-src"},
        "spec": {
            "claimRef": {"name": "src", "namespace": "ns", "uid": "u-src"},
            "csi": {"driver": DRIVER, "volumeHandle": "vol-src"},
        },
        "status": {"phase": "Bound"},
    });
    serde_json::from_value(merged(pv, patch)).unwrap()
}

fn clone_refusal(source: &PersistentVolumeClaim) -> String {
    match check_source_claim(&claim("1Gi", "Filesystem"), source, CLAIM) {
        Ok(pv) => panic!("clone accepted: {pv}"),
        Err(e) => e,
    }
}

#[test]
fn a_bound_claim_of_ours_clones_into_an_equal_or_larger_claim() {
    for size in ["1Gi", "2Gi"] {
        assert_eq!(
            check_source_claim(&claim(size, "Filesystem"), &source(), CLAIM).unwrap(),
            "pv-src"
        );
    }
    match check_source_volume(&Backend, &source(), &pv_with(&json!({})), CLAIM).unwrap() {
        Resolved::Volume { claim, volume } => {
            assert_eq!((claim.as_str(), volume.as_str()), ("src", "vol-src"));
        }
        other @ Resolved::Snapshot { .. } => panic!("{other:?}"),
    }
}

#[test]
fn a_source_claim_being_deleted_unbound_or_without_a_class_is_refused() {
    let deleting = source_with(&json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}));
    assert_eq!(
        clone_refusal(&deleting),
        format!("{CLAIM} is being deleted")
    );
    let pending = source_with(&json!({"status": {"phase": "Pending"}}));
    assert_eq!(clone_refusal(&pending), format!("{CLAIM} is not Bound"));
    let classless = source_with(&json!({"spec": {"storageClassName": ""}}));
    assert_eq!(
        clone_refusal(&classless),
        format!("{CLAIM} names no StorageClass (spec.storageClassName)")
    );
    let unnamed = source_with(&json!({"spec": {"volumeName": null}}));
    assert_eq!(
        clone_refusal(&unnamed),
        format!("{CLAIM} has no spec.volumeName")
    );
}

#[test]
fn a_clone_smaller_than_its_source_or_of_another_volume_mode_is_refused_naming_the_field() {
    assert_eq!(
        check_source_claim(&claim("100Mi", "Filesystem"), &source(), CLAIM).unwrap_err(),
        format!(
            "spec.resources.requests.storage (104857600 bytes) is smaller than the request of \
             {CLAIM} (1073741824 bytes)"
        )
    );
    assert_eq!(
        check_source_claim(&claim("1Gi", "Block"), &source(), CLAIM).unwrap_err(),
        format!("spec.volumeMode \"Block\" differs from the volume mode \"Filesystem\" of {CLAIM}")
    );
    // no volumeMode is Filesystem
    let unset = source_with(&json!({"spec": {"volumeMode": null}}));
    assert_eq!(
        check_source_claim(&claim("1Gi", "Filesystem"), &unset, CLAIM).unwrap(),
        "pv-src"
    );
}

#[test]
fn a_source_volume_not_bound_to_the_claim_or_not_ours_is_refused() {
    let not_bound =
        format!("{CLAIM}: its PersistentVolume pv-src is not Bound to it (spec.claimRef)");
    for patch in [
        json!({"spec": {"claimRef": {"uid": "u-other"}}}),
        json!({"spec": {"claimRef": {"namespace": "other"}}}),
        json!({"spec": {"claimRef": null}}),
        json!({"status": {"phase": "Released"}}),
    ] {
        assert_eq!(
            check_source_volume(&Backend, &source(), &pv_with(&patch), CLAIM).unwrap_err(),
            not_bound,
            "{patch}"
        );
    }
    let other = pv_with(&json!({"spec": {"csi": {"driver": "other.csi.io"}}}));
    assert_eq!(
        check_source_volume(&Backend, &source(), &other, CLAIM).unwrap_err(),
        format!(
            "{CLAIM}: its PersistentVolume pv-src is not one of ours (no csi source of driver \
             {DRIVER})"
        )
    );
}
