//! The snapshot-controller slice end to end, with the CSI side (what csi-snapshotter or our
//! provisioner does: fill the content's status, drop the content's finalizer once the storage
//! snapshot is deleted) played by the test.

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube_emulator::Emulator;
use serde_json::{Value, json};

use common::{eventually, prebound_pv, pvc, storage_class};

const DRIVER: &str = "rbd.example.com";
const WAIT: Duration = Duration::from_secs(10);
const SOURCE_FIN: &str = "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
const BOUND_FIN: &str = "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
const CONTENT_FIN: &str = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
const PVC_FIN: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";

struct Env {
    emu: Emulator,
    classes: Api<DynamicObject>,
    contents: Api<DynamicObject>,
    snapshots: Api<DynamicObject>,
    pvcs: Api<PersistentVolumeClaim>,
}

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

fn obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

async fn env() -> Env {
    let emu = Emulator::new();
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    for text in [
        include_str!("../../../deploy/snapshot-crds/volumesnapshotclasses.yaml"),
        include_str!("../../../deploy/snapshot-crds/volumesnapshotcontents.yaml"),
        include_str!("../../../deploy/snapshot-crds/volumesnapshots.yaml"),
    ] {
        let crd: CustomResourceDefinition = serde_yaml::from_str(text).unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let c = emu.client();
    Env {
        classes: Api::all_with(
            c.clone(),
            &ar("VolumeSnapshotClass", "volumesnapshotclasses"),
        ),
        contents: Api::all_with(
            c.clone(),
            &ar("VolumeSnapshotContent", "volumesnapshotcontents"),
        ),
        snapshots: Api::namespaced_with(
            c.clone(),
            "default",
            &ar("VolumeSnapshot", "volumesnapshots"),
        ),
        pvcs: Api::default_namespaced(c),
        emu,
    }
}

impl Env {
    /// A claim bound to a CSI volume of `DRIVER` (handle `rbd/img1`), as after provisioning.
    async fn bound_claim(&self, name: &str) -> PersistentVolumeClaim {
        let scs: Api<StorageClass> = Api::all(self.emu.client());
        let _ = scs
            .create(&PostParams::default(), &storage_class("fast", false, false))
            .await;
        let claim = self
            .pvcs
            .create(&PostParams::default(), &pvc(name, Some("fast"), "1Gi"))
            .await
            .unwrap();
        let pvs: Api<PersistentVolume> = Api::all(self.emu.client());
        pvs.create(&PostParams::default(), &prebound_pv(&claim, "fast", "1Gi"))
            .await
            .unwrap();
        let pvcs = self.pvcs.clone();
        let name = name.to_string();
        eventually("claim bound", WAIT, || {
            let pvcs = pvcs.clone();
            let name = name.clone();
            async move {
                let c = pvcs.get(&name).await.unwrap();
                (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
            }
        })
        .await
    }

    async fn class(&self, name: &str, policy: &str, default: bool) {
        let mut c = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": name},
            "driver": DRIVER, "deletionPolicy": policy,
            "parameters": {
                "pool": "rbd",
                "csi.storage.k8s.io/snapshotter-secret-name": "${volumesnapshot.name}-creds",
                "csi.storage.k8s.io/snapshotter-secret-namespace": "${volumesnapshot.namespace}"
            }
        });
        if default {
            c["metadata"]["annotations"] =
                json!({"snapshot.storage.kubernetes.io/is-default-class": "true"});
        }
        self.classes
            .create(&PostParams::default(), &obj(c))
            .await
            .unwrap();
    }

    async fn snapshot(&self, name: &str, source: Value, class: Option<&str>) -> DynamicObject {
        let mut spec = json!({"source": source});
        if let Some(c) = class {
            spec["volumeSnapshotClassName"] = json!(c);
        }
        self.snapshots
            .create(
                &PostParams::default(),
                &obj(json!({
                    "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                    "metadata": {"name": name}, "spec": spec
                })),
            )
            .await
            .unwrap()
    }

    /// Waits until `f` holds for the named object of `api`, returning it.
    async fn wait_for(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        what: &str,
        f: impl Fn(&DynamicObject) -> bool,
    ) -> DynamicObject {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let current = api.get_opt(name).await.unwrap();
            if let Some(o) = &current
                && f(o)
            {
                return o.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last seen: {current:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_gone(&self, api: &Api<DynamicObject>, name: &str) {
        let api = api.clone();
        let name = name.to_string();
        eventually("object gone", WAIT, || {
            let api = api.clone();
            let name = name.clone();
            async move { api.get_opt(&name).await.unwrap().is_none().then_some(()) }
        })
        .await;
    }

    /// What the CSI side does after CreateSnapshot succeeds.
    async fn csi_created(&self, content: &str, ready: bool) {
        self.contents
            .patch_status(
                content,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "snapshotHandle": "rbd/img1@snap", "readyToUse": ready,
                    "creationTime": 1_764_547_200_000_000_000_i64, "restoreSize": 1_073_741_824_i64
                }})),
            )
            .await
            .unwrap();
    }

    /// What the CSI side does once DeleteSnapshot succeeded for a terminating content.
    async fn csi_deleted(&self, content: &str) {
        let c = self.contents.get(content).await.unwrap();
        assert!(c.metadata.deletion_timestamp.is_some());
        let rest: Vec<String> = c
            .metadata
            .finalizers
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != CONTENT_FIN)
            .collect();
        self.contents
            .patch(
                content,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": rest}})),
            )
            .await
            .unwrap();
    }

    async fn event_reasons(&self, name: &str) -> Vec<String> {
        let events: Api<Event> = Api::default_namespaced(self.emu.client());
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .filter_map(|e| e.reason)
            .collect()
    }
}

fn fins(o: &DynamicObject) -> Vec<String> {
    o.metadata.finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn dynamic_snapshot_binds_becomes_ready_and_is_deleted_with_its_content() {
    let env = env().await;
    let claim = env.bound_claim("data").await;
    env.class("csi-rbd", "Delete", false).await;
    let vs = env
        .snapshot(
            "snap1",
            json!({"persistentVolumeClaimName": "data"}),
            Some("csi-rbd"),
        )
        .await;
    let vs_uid = vs.metadata.uid.clone().unwrap();
    let content_name = format!("snapcontent-{vs_uid}");

    // The content the controller creates for the snapshot.
    let content = env
        .wait_for(
            &env.contents,
            &content_name,
            "content with finalizer",
            |c| fins(c).contains(&CONTENT_FIN.to_string()),
        )
        .await;
    let spec = &content.data["spec"];
    assert_eq!(spec["source"], json!({"volumeHandle": "rbd/img1"}));
    assert_eq!(spec["driver"], DRIVER);
    assert_eq!(spec["deletionPolicy"], "Delete");
    assert_eq!(spec["volumeSnapshotClassName"], "csi-rbd");
    assert_eq!(spec["sourceVolumeMode"], "Filesystem");
    assert_eq!(spec["volumeSnapshotRef"]["uid"], json!(vs_uid));
    assert_eq!(spec["volumeSnapshotRef"]["name"], "snap1");
    assert_eq!(spec["volumeSnapshotRef"]["namespace"], "default");
    assert_eq!(spec["volumeSnapshotRef"]["kind"], "VolumeSnapshot");
    assert_eq!(
        spec["volumeSnapshotRef"]["apiVersion"],
        "snapshot.storage.k8s.io/v1"
    );
    let ann = content.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get("snapshot.storage.kubernetes.io/deletion-secret-name")
            .map(String::as_str),
        Some("snap1-creds")
    );
    assert_eq!(
        ann.get("snapshot.storage.kubernetes.io/deletion-secret-namespace")
            .map(String::as_str),
        Some("default")
    );
    assert!(content.data.get("status").is_none());

    // Bound but not ready; both snapshot finalizers; the claim is protected meanwhile.
    let vs = env
        .wait_for(&env.snapshots, "snap1", "snapshot bound", |v| {
            v.data["status"]["boundVolumeSnapshotContentName"] == json!(content_name)
                && fins(v).contains(&BOUND_FIN.to_string())
        })
        .await;
    assert_eq!(vs.data["status"]["readyToUse"], false);
    assert!(fins(&vs).contains(&SOURCE_FIN.to_string()));
    let claim_now = env.pvcs.get("data").await.unwrap();
    assert!(
        claim_now
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&PVC_FIN.to_string())
    );
    assert_eq!(claim_now.metadata.uid, claim.metadata.uid);

    // The CSI side reports the snapshot: the snapshot's status follows.
    env.csi_created(&content_name, true).await;
    let vs = env
        .wait_for(&env.snapshots, "snap1", "snapshot ready", |v| {
            v.data["status"]["readyToUse"] == true
        })
        .await;
    assert_eq!(vs.data["status"]["restoreSize"], "1Gi");
    assert_eq!(vs.data["status"]["creationTime"], "2025-12-01T00:00:00Z");
    assert!(vs.data["status"].get("error").is_none());
    let pvcs = env.pvcs.clone();
    eventually("claim finalizer released", WAIT, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await.unwrap();
            (!c.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&PVC_FIN.to_string()))
            .then_some(())
        }
    })
    .await;
    let reasons = env.event_reasons("snap1").await;
    for r in ["CreatingSnapshot", "SnapshotCreated", "SnapshotReady"] {
        assert!(reasons.contains(&r.to_string()), "{r} in {reasons:?}");
    }

    // Deleting the snapshot deletes the content (policy Delete), which waits for the CSI side.
    env.snapshots
        .delete("snap1", &DeleteParams::default())
        .await
        .unwrap();
    let content = env
        .wait_for(&env.contents, &content_name, "content terminating", |c| {
            c.metadata.deletion_timestamp.is_some()
        })
        .await;
    assert_eq!(
        content
            .metadata
            .annotations
            .unwrap_or_default()
            .get("snapshot.storage.kubernetes.io/volumesnapshot-being-deleted")
            .map(String::as_str),
        Some("yes")
    );
    let vs = env
        .wait_for(&env.snapshots, "snap1", "source finalizer dropped", |v| {
            !fins(v).contains(&SOURCE_FIN.to_string())
        })
        .await;
    assert_eq!(fins(&vs), vec![BOUND_FIN.to_string()]);
    env.csi_deleted(&content_name).await;
    env.wait_gone(&env.contents, &content_name).await;
    env.wait_gone(&env.snapshots, "snap1").await;
}

#[tokio::test]
async fn retain_policy_keeps_the_content() {
    let env = env().await;
    env.bound_claim("data").await;
    env.class("keep", "Retain", false).await;
    let vs = env
        .snapshot(
            "snap1",
            json!({"persistentVolumeClaimName": "data"}),
            Some("keep"),
        )
        .await;
    let content_name = format!("snapcontent-{}", vs.metadata.uid.unwrap());
    env.wait_for(&env.contents, &content_name, "content", |_| true)
        .await;
    env.csi_created(&content_name, true).await;
    let vs = env
        .wait_for(&env.snapshots, "snap1", "ready", |v| {
            v.data["status"]["readyToUse"] == true
        })
        .await;
    // No bound finalizer under Retain.
    assert_eq!(fins(&vs), vec![SOURCE_FIN.to_string()]);
    env.snapshots
        .delete("snap1", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone(&env.snapshots, "snap1").await;
    let content = env.contents.get(&content_name).await.unwrap();
    assert!(content.metadata.deletion_timestamp.is_none());
    assert_eq!(content.data["status"]["readyToUse"], true);
}

#[tokio::test]
async fn errors_and_readiness_propagate_from_the_content() {
    let env = env().await;
    env.bound_claim("data").await;
    env.class("csi-rbd", "Delete", false).await;
    let vs = env
        .snapshot(
            "snap1",
            json!({"persistentVolumeClaimName": "data"}),
            Some("csi-rbd"),
        )
        .await;
    let content_name = format!("snapcontent-{}", vs.metadata.uid.unwrap());
    env.wait_for(&env.contents, &content_name, "content", |_| true)
        .await;
    env.contents
        .patch_status(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"readyToUse": false,
                "error": {"message": "Failed to check and update snapshot content: rpc error: code = Internal", "time": "2025-12-01T00:00:00Z"}}})),
        )
        .await
        .unwrap();
    let vs = env
        .wait_for(&env.snapshots, "snap1", "error copied", |v| {
            v.data["status"]["error"]["message"].is_string()
        })
        .await;
    assert_eq!(
        vs.data["status"]["error"]["message"],
        "Failed to check and update snapshot content: rpc error: code = Internal"
    );
    assert_eq!(vs.data["status"]["readyToUse"], false);
    // Ready later: the error goes.
    env.contents
        .patch_status(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"error": null}})),
        )
        .await
        .unwrap();
    env.csi_created(&content_name, true).await;
    let vs = env
        .wait_for(&env.snapshots, "snap1", "ready", |v| {
            v.data["status"]["readyToUse"] == true
        })
        .await;
    assert!(vs.data["status"].get("error").is_none(), "{:?}", vs.data);
}

#[tokio::test]
async fn unbound_claim_and_missing_class_are_reported_then_recovered() {
    let env = env().await;
    let scs: Api<StorageClass> = Api::all(env.emu.client());
    scs.create(&PostParams::default(), &storage_class("fast", false, false))
        .await
        .unwrap();
    let claim = env
        .pvcs
        .create(&PostParams::default(), &pvc("late", Some("fast"), "1Gi"))
        .await
        .unwrap();
    // The class does not exist yet.
    env.snapshot(
        "snap1",
        json!({"persistentVolumeClaimName": "late"}),
        Some("gold"),
    )
    .await;
    let vs = env
        .wait_for(&env.snapshots, "snap1", "class error", |v| {
            v.data["status"]["error"]["message"].is_string()
        })
        .await;
    assert_eq!(
        vs.data["status"]["error"]["message"],
        "Failed to get snapshot class with error volumesnapshotclass.snapshot.storage.k8s.io \"gold\" not found"
    );
    // With the class, the claim is not bound yet.
    env.class("gold", "Delete", false).await;
    let vs = env
        .wait_for(&env.snapshots, "snap1", "unbound-claim error", |v| {
            v.data["status"]["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not yet bound"))
        })
        .await;
    assert_eq!(
        vs.data["status"]["error"]["message"],
        "Failed to create snapshot content with error failed to get input parameters to create snapshot snap1: \"the PVC late is not yet bound to a PV, will not attempt to take a snapshot\""
    );
    assert_eq!(vs.data["status"]["readyToUse"], false);
    // Once the claim binds, the content is created.
    let pvs: Api<PersistentVolume> = Api::all(env.emu.client());
    pvs.create(&PostParams::default(), &prebound_pv(&claim, "fast", "1Gi"))
        .await
        .unwrap();
    let content_name = format!("snapcontent-{}", vs.metadata.uid.clone().unwrap());
    env.wait_for(
        &env.contents,
        &content_name,
        "content after binding",
        |_| true,
    )
    .await;
}

#[tokio::test]
async fn default_class_of_the_volume_driver_is_filled_in() {
    let env = env().await;
    env.bound_claim("data").await;
    env.class("not-default", "Delete", false).await;
    env.class("the-default", "Retain", true).await;
    env.snapshot("snap1", json!({"persistentVolumeClaimName": "data"}), None)
        .await;
    let vs = env
        .wait_for(&env.snapshots, "snap1", "default class", |v| {
            v.data["spec"]["volumeSnapshotClassName"] == "the-default"
        })
        .await;
    assert_eq!(vs.metadata.generation, Some(2));
    let content_name = format!("snapcontent-{}", vs.metadata.uid.unwrap());
    let content = env
        .wait_for(&env.contents, &content_name, "content", |_| true)
        .await;
    assert_eq!(content.data["spec"]["deletionPolicy"], "Retain");
}

#[tokio::test]
async fn preprovisioned_content_binds_to_the_snapshot_it_names() {
    let env = env().await;
    env.contents
        .create(
            &PostParams::default(),
            &obj(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                "metadata": {"name": "imported"},
                "spec": {"deletionPolicy": "Retain", "driver": DRIVER,
                         "source": {"snapshotHandle": "rbd/img9@backup"},
                         "volumeSnapshotRef": {"name": "restored", "namespace": "default"}}
            })),
        )
        .await
        .unwrap();
    // Without a snapshot naming it (uid unset), the content is left alone.
    let untouched = env.contents.get("imported").await.unwrap();
    assert!(untouched.metadata.finalizers.is_none());
    let vs = env
        .snapshot(
            "restored",
            json!({"volumeSnapshotContentName": "imported"}),
            None,
        )
        .await;
    let uid = vs.metadata.uid.clone().unwrap();
    let content = env
        .wait_for(&env.contents, "imported", "content bound", |c| {
            c.data["spec"]["volumeSnapshotRef"]["uid"] == json!(uid)
                && fins(c).contains(&CONTENT_FIN.to_string())
        })
        .await;
    assert!(
        content.data["spec"]
            .get("volumeSnapshotClassName")
            .is_none()
    );
    let vs = env
        .wait_for(&env.snapshots, "restored", "snapshot bound", |v| {
            v.data["status"]["boundVolumeSnapshotContentName"] == "imported"
        })
        .await;
    assert_eq!(vs.data["status"]["readyToUse"], false);
    // The CSI side confirms the snapshot (ListSnapshots): ready, with its size.
    env.csi_created("imported", true).await;
    let vs = env
        .wait_for(&env.snapshots, "restored", "ready", |v| {
            v.data["status"]["readyToUse"] == true
        })
        .await;
    assert_eq!(vs.data["status"]["restoreSize"], "1Gi");
    // A second snapshot naming the same content is refused: it is bound to another uid.
    env.snapshot(
        "intruder",
        json!({"volumeSnapshotContentName": "imported"}),
        None,
    )
    .await;
    let intruder = env
        .wait_for(&env.snapshots, "intruder", "misbound error", |v| {
            v.data["status"]["error"]["message"].is_string()
        })
        .await;
    assert_eq!(
        intruder.data["status"]["error"]["message"],
        "VolumeSnapshotContent [imported] is bound to a different snapshot"
    );
}

#[tokio::test]
async fn snapshot_crds_can_be_installed_at_start() {
    let emu = Emulator::builder().snapshot_crds(true).build();
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    let names: Vec<String> = crds
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(
        names,
        [
            "volumesnapshotclasses.snapshot.storage.k8s.io",
            "volumesnapshotcontents.snapshot.storage.k8s.io",
            "volumesnapshots.snapshot.storage.k8s.io"
        ]
    );
    assert_eq!(kube_emulator::SNAPSHOT_CRDS.len(), 3);
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        emu.client(),
        "default",
        &ar("VolumeSnapshot", "volumesnapshots"),
    );
    assert!(
        snapshots
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // They are ordinary CRDs: deleting one stops serving it.
    crds.delete(
        "volumesnapshots.snapshot.storage.k8s.io",
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    let gone = eventually("CRD deleted", WAIT, || {
        let snapshots = snapshots.clone();
        async move { snapshots.list(&ListParams::default()).await.err() }
    })
    .await;
    assert!(matches!(gone, kube::Error::Api(s) if s.code == 404));
}
