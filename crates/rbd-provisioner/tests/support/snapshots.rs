//! Snapshot helpers for end-to-end tests: the emulator with the snapshot CRDs, a fuse ext4
//! class `csi` and a VolumeSnapshotClass of our driver, VolumeSnapshots and claims with a data
//! source. Included with `#[path = "support/snapshots.rs"] mod snapshots;` next to `mod support;`.

#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use kube_emulator::Emulator;
use serde_json::{Value, json};

use crate::support::{ADMIN_SECRET, ADMIN_SECRET_NS, Harness, Process};

pub const DRIVER: &str = rbd_csi::DEFAULT_DRIVER_NAME;
pub const SNAPSHOT_CLASS: &str = "test-snapshots";
pub const WAIT: Duration = Duration::from_secs(60);

pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

pub fn snapshots(h: &Harness) -> Api<DynamicObject> {
    Api::namespaced_with(
        h.client.clone(),
        "default",
        &resource("VolumeSnapshot", "volumesnapshots"),
    )
}

pub fn contents(h: &Harness) -> Api<DynamicObject> {
    Api::all_with(
        h.client.clone(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    )
}

/// Emulator with the snapshot CRDs, provisioner (CSI PVs), a fuse ext4 class and a
/// VolumeSnapshotClass of our driver whose snapshotter secret is the admin secret.
pub async fn setup() -> (Harness, Process) {
    let h = harness().await;
    let p = h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ],
        &[],
    );
    (h, p)
}

/// The harness with the classes, no provisioner.
pub async fn harness() -> Harness {
    let h = Harness::start_on(Emulator::builder().snapshot_crds(true).build()).await;
    let mut params = h.params();
    params.push(("fsType".into(), "ext4".into()));
    params.push(("mounter".into(), "fuse".into()));
    h.create_class("csi", &params, "Delete").await;
    create_snapshot_class(
        &h,
        SNAPSHOT_CLASS,
        DRIVER,
        json!({
            "csi.storage.k8s.io/snapshotter-secret-name": ADMIN_SECRET,
            "csi.storage.k8s.io/snapshotter-secret-namespace": ADMIN_SECRET_NS,
        }),
    )
    .await;
    h
}

/// A VolumeSnapshotClass `name` of `driver` (policy Delete) with `parameters`.
pub async fn create_snapshot_class(h: &Harness, name: &str, driver: &str, parameters: Value) {
    let classes: Api<DynamicObject> = Api::all_with(
        h.client.clone(),
        &resource("VolumeSnapshotClass", "volumesnapshotclasses"),
    );
    let class = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": name},
        "driver": driver,
        "deletionPolicy": "Delete",
        "parameters": parameters,
    });
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(class).unwrap(),
        )
        .await
        .unwrap();
}

pub async fn create_snapshot(h: &Harness, name: &str, claim: &str) {
    let vs = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "volumeSnapshotClassName": SNAPSHOT_CLASS,
            "source": {"persistentVolumeClaimName": claim},
        },
    });
    snapshots(h)
        .create(&PostParams::default(), &serde_json::from_value(vs).unwrap())
        .await
        .unwrap();
}

pub async fn wait_ready(h: &Harness, name: &str) -> DynamicObject {
    let api = snapshots(h);
    h.until(&format!("VolumeSnapshot {name} readyToUse"), WAIT, || {
        let api = api.clone();
        async move {
            let vs = api.get(name).await.ok()?;
            (vs.data.pointer("/status/readyToUse") == Some(&json!(true))).then_some(vs)
        }
    })
    .await
}

/// A claim of class `csi` whose `spec.dataSource` is `kind`/`source`.
pub async fn create_claim_from(h: &Harness, name: &str, size: &str, kind: &str, source: &str) {
    create_claim_of_class_from(h, name, "csi", size, kind, source).await;
}

/// A claim of `class` whose `spec.dataSource` is `kind`/`source`.
pub async fn create_claim_of_class_from(
    h: &Harness,
    name: &str,
    class: &str,
    size: &str,
    kind: &str,
    source: &str,
) {
    let group = (kind == "VolumeSnapshot").then_some("snapshot.storage.k8s.io");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "storageClassName": class,
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": size}},
            "dataSource": {"kind": kind, "name": source, "apiGroup": group},
        }
    }))
    .unwrap();
    h.claims()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

pub async fn delete_claim(h: &Harness, name: &str) {
    let (_, pv) = h.wait_bound(name).await;
    h.claims()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
}

pub async fn wait_gone(h: &Harness, api: &Api<DynamicObject>, name: &str) {
    h.until(&format!("{name} deleted"), WAIT, || {
        let api = api.clone();
        async move { matches!(api.get_opt(name).await, Ok(None)).then_some(()) }
    })
    .await;
}

pub fn trash(h: &Harness) -> String {
    h.ceph.rbd(&["trash", "ls", &h.ceph.pool]).unwrap()
}

/// Finalizers of the VolumeSnapshot or claim `name`.
pub fn finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
