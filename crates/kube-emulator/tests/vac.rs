//! `storage.k8s.io/v1` VolumeAttributesClass through the kube-rs client (typed
//! `k8s_openapi` objects): created, listed, driver name required, parameters and driver name
//! immutable with kube-apiserver's messages; a bound claim's `spec.volumeAttributesClassName`,
//! `status.currentVolumeAttributesClassName` and `status.modifyVolumeStatus`, and a PV's
//! `spec.volumeAttributesClassName` round-trip; an unknown modify status is refused.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use common::{api_err, eventually, prebound_pv, pvc, pvcs, storage_class};

fn class(name: &str, iops: &str) -> VolumeAttributesClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "driverName": "rbd.provisioner.ceph.io",
        "parameters": {"rbd_qos_iops_limit": iops},
    }))
    .unwrap()
}

#[tokio::test]
async fn classes_are_served_and_immutable() {
    let emu = kube_emulator::Emulator::new();
    let api: Api<VolumeAttributesClass> = Api::all(emu.client());
    let made = api
        .create(&PostParams::default(), &class("gold", "1000"))
        .await
        .unwrap();
    assert_eq!(made.driver_name, "rbd.provisioner.ceph.io");
    assert_eq!(
        made.parameters,
        Some(BTreeMap::from([(
            "rbd_qos_iops_limit".to_owned(),
            "1000".to_owned()
        )]))
    );
    let names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(names, vec!["gold".to_owned()]);

    let mut nameless: VolumeAttributesClass = class("nameless", "1");
    nameless.driver_name = String::new();
    let err = api_err(
        api.create(&PostParams::default(), &nameless)
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .ends_with("\"nameless\" is invalid: driverName: Required value"),
        "{}",
        err.message
    );

    let patch = json!({"parameters": {"rbd_qos_iops_limit": "5"}});
    let err = api_err(
        api.patch("gold", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.ends_with(
            "\"gold\" is invalid: parameters: Forbidden: updates to parameters are forbidden."
        ),
        "{}",
        err.message
    );
    let patch = json!({"driverName": "other.example.com"});
    let err = api_err(
        api.patch("gold", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_err(),
    );
    assert!(
        err.message
            .ends_with("driverName: Invalid value: \"other.example.com\": field is immutable"),
        "{}",
        err.message
    );
    // metadata stays mutable
    let patch = json!({"metadata": {"labels": {"tier": "gold"}}});
    api.patch("gold", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn claim_and_volume_fields_round_trip() {
    let emu = kube_emulator::Emulator::new();
    let classes: Api<StorageClass> = Api::all(emu.client());
    classes
        .create(&PostParams::default(), &storage_class("fast", false, false))
        .await
        .unwrap();
    let claims = pvcs(&emu);
    let claim = claims
        .create(&PostParams::default(), &pvc("data", Some("fast"), "1Gi"))
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(emu.client());
    let pv = volumes
        .create(&PostParams::default(), &prebound_pv(&claim, "fast", "1Gi"))
        .await
        .unwrap();
    let pv_name = pv.metadata.name.clone().unwrap();
    eventually("the claim bound", Duration::from_secs(10), || async {
        let c = claims.get("data").await.unwrap();
        (c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(())
    })
    .await;

    let spec = json!({"spec": {"volumeAttributesClassName": "gold"}});
    let claim: PersistentVolumeClaim = claims
        .patch("data", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    assert_eq!(
        claim.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    let status = json!({"status": {"modifyVolumeStatus": {
        "targetVolumeAttributesClassName": "gold", "status": "InProgress"}}});
    let claim = claims
        .patch_status("data", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let modify = claim.status.unwrap().modify_volume_status.unwrap();
    assert_eq!(
        (
            modify.status.as_str(),
            modify.target_volume_attributes_class_name.as_deref()
        ),
        ("InProgress", Some("gold"))
    );

    let bad = json!({"status": {"modifyVolumeStatus": {"status": "Done"}}});
    let err = api_err(
        claims
            .patch_status("data", &PatchParams::default(), &Patch::Merge(&bad))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.ends_with(
            "status.modifyVolumeStatus.status: Unsupported value: \"Done\": supported values: \"InProgress\", \"Infeasible\", \"Pending\""
        ),
        "{}",
        err.message
    );

    let pv_spec = json!({"spec": {"volumeAttributesClassName": "gold"}});
    let pv = volumes
        .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&pv_spec))
        .await
        .unwrap();
    assert_eq!(
        pv.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    let done =
        json!({"status": {"currentVolumeAttributesClassName": "gold", "modifyVolumeStatus": null}});
    let claim = claims
        .patch_status("data", &PatchParams::default(), &Patch::Merge(&done))
        .await
        .unwrap();
    let status = claim.status.unwrap();
    assert_eq!(
        status.current_volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    assert!(status.modify_volume_status.is_none());
}
