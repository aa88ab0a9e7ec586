//! VolumeAttributesClass on claims, end to end (binary + emulator + micro-ceph), the way
//! external-resizer's modify controller does it: naming a class sets its librbd QoS limits on
//! the image (read back through librbd: `rbd config image get`), then the PV's
//! `spec.volumeAttributesClassName` and the claim's `status.currentVolumeAttributesClassName`;
//! a missing class is `Pending` until it exists; bad parameters are `Infeasible` (the key
//! named, nothing written) until a valid class is named; an in-tree `rbd` PV is `Infeasible`;
//! a claim created with a class gets it once bound; a crash before or after the image is
//! modified (crash points `before-modify`, `after-modify`) is finished by a restart.
//!
//! `cargo test -p rbd-provisioner --test modify`

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Harness, unique_prefix};

const WAIT: Duration = Duration::from_secs(30);

async fn create_vac(h: &Harness, name: &str, parameters: serde_json::Value) {
    let api: Api<VolumeAttributesClass> = Api::all(h.client.clone());
    let class = serde_json::from_value(json!({
        "metadata": {"name": name},
        "driverName": "rbd.provisioner.ceph.io",
        "parameters": parameters,
    }))
    .unwrap();
    api.create(&PostParams::default(), &class).await.unwrap();
}

async fn name_class(h: &Harness, claim: &str, class: &str) {
    let patch = json!({"spec": {"volumeAttributesClassName": class}});
    h.claims()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Waits until the claim's current class is `class` with no modification status left.
async fn wait_current(h: &Harness, claim: &str, class: &str) -> PersistentVolumeClaim {
    h.until(&format!("{claim} modified to {class}"), WAIT, || async {
        let c = h.claims().get(claim).await.ok()?;
        let status = c.status.as_ref()?;
        (status.current_volume_attributes_class_name.as_deref() == Some(class)
            && status.modify_volume_status.is_none())
        .then_some(c)
    })
    .await
}

/// Waits until the claim's modification status is `{target, status}`; returns the claim.
async fn wait_status(
    h: &Harness,
    claim: &str,
    target: &str,
    status: &str,
) -> PersistentVolumeClaim {
    h.until(&format!("{claim}: {status} to {target}"), WAIT, || async {
        let c = h.claims().get(claim).await.ok()?;
        let m = c.status.as_ref()?.modify_volume_status.as_ref()?;
        (m.status == status && m.target_volume_attributes_class_name.as_deref() == Some(target))
            .then_some(c)
    })
    .await
}

/// What librbd resolves for `option` on the image (image configuration).
fn librbd_value(h: &Harness, image: &str, option: &str) -> String {
    h.ceph
        .rbd(&[
            "config",
            "image",
            "get",
            &format!("{}/{image}", h.ceph.pool),
            option,
        ])
        .unwrap()
        .trim()
        .to_owned()
}

fn condition_message(claim: &PersistentVolumeClaim, kind: &str) -> Option<String> {
    claim
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)?
        .message
        .clone()
}

/// A class provisioning PVs with `pv_source` (`csi` or `rbd`), the provisioner, and a bound
/// claim `claim` in it: its PV, image and the image name prefix.
async fn bound_claim(
    h: &Harness,
    pv_source: &str,
    claim: &str,
) -> (
    support::Process,
    k8s_openapi::api::core::v1::PersistentVolume,
    String,
    String,
) {
    let prefix = unique_prefix("vac");
    let mut params = h.params();
    params.push(("pvSource".into(), pv_source.into()));
    h.create_class(pv_source, &params, "Delete").await;
    let p = spawn(h, &prefix, &[]);
    h.create_claim(claim, pv_source, "8Mi", false).await;
    let (_, pv) = h.wait_bound(claim).await;
    let image = Harness::image_name(&pv);
    (p, pv, image, prefix)
}

/// The provisioner with fast retries, naming images with `prefix`.
fn spawn(h: &Harness, prefix: &str, env: &[(&str, &str)]) -> support::Process {
    h.spawn(
        &[
            "--leader-elect=false",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
            "--image-name-prefix",
            prefix,
        ],
        env,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_modified_to_their_volume_attributes_class() {
    let h = Harness::start().await;
    let (_p, pv, image, _) = bound_claim(&h, "csi", "q").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    assert!(pv.spec.as_ref().unwrap().csi.is_some(), "a CSI PV");

    // a class: its limits land on the image, then on the PV and the claim
    create_vac(
        &h,
        "gold",
        json!({"rbd_qos_iops_limit": "500", "rbd_qos_bps_limit": "10Mi"}),
    )
    .await;
    name_class(&h, "q", "gold").await;
    let claim = wait_current(&h, "q", "gold").await;
    assert_eq!(librbd_value(&h, &image, "rbd_qos_iops_limit"), "500");
    assert_eq!(librbd_value(&h, &image, "rbd_qos_bps_limit"), "10485760");
    let pv = h.volumes().get(&pv_name).await.unwrap();
    assert_eq!(
        pv.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    assert_eq!(condition_message(&claim, "ModifyingVolume"), None);
    let started = h.wait_event("q", "VolumeModify").await;
    assert!(started.contains("gold"), "{started}");
    let done = h.wait_event("q", "VolumeModifySuccessful").await;
    assert!(done.contains(&pv_name) && done.contains("gold"), "{done}");

    // a class that does not exist yet: Pending, then applied once it exists; keys it does not
    // name stay as they were
    name_class(&h, "q", "platinum").await;
    wait_status(&h, "q", "platinum", "Pending").await;
    let missing = h.wait_event("q", "VolumeModifyFailed").await;
    assert_eq!(missing, "VAC \"platinum\" does not exist.");
    create_vac(&h, "platinum", json!({"rbd_qos_iops_limit": "900"})).await;
    wait_current(&h, "q", "platinum").await;
    assert_eq!(librbd_value(&h, &image, "rbd_qos_iops_limit"), "900");
    assert_eq!(librbd_value(&h, &image, "rbd_qos_bps_limit"), "10485760");

    // bad parameters: Infeasible, the key named, nothing written, the current class kept
    create_vac(
        &h,
        "broken",
        json!({"rbd_qos_iops_limit": "1", "rbd_qos_write_iops_limitt": "5"}),
    )
    .await;
    name_class(&h, "q", "broken").await;
    let claim = wait_status(&h, "q", "broken", "Infeasible").await;
    let why = condition_message(&claim, "ModifyingVolume").unwrap_or_default();
    assert!(why.contains("rbd_qos_write_iops_limitt"), "{why}");
    assert_eq!(
        claim
            .status
            .as_ref()
            .unwrap()
            .current_volume_attributes_class_name
            .as_deref(),
        Some("platinum")
    );
    // the event is written after the status, asynchronously: wait for it
    h.wait_event_containing("q", "VolumeModifyFailed", &["rbd_qos_write_iops_limitt"])
        .await;
    assert_eq!(librbd_value(&h, &image, "rbd_qos_iops_limit"), "900");

    // a valid class again: modified, the infeasible status gone
    name_class(&h, "q", "gold").await;
    let claim = wait_current(&h, "q", "gold").await;
    assert_eq!(condition_message(&claim, "ModifyingVolume"), None);
    assert_eq!(librbd_value(&h, &image, "rbd_qos_iops_limit"), "500");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_tree_rbd_volume_cannot_be_modified() {
    let h = Harness::start().await;
    let (_p, pv, image, _) = bound_claim(&h, "rbd", "old").await;
    assert!(pv.spec.as_ref().unwrap().rbd.is_some(), "an in-tree PV");
    create_vac(&h, "gold", json!({"rbd_qos_iops_limit": "500"})).await;
    name_class(&h, "old", "gold").await;
    let claim = wait_status(&h, "old", "gold", "Infeasible").await;
    let why = condition_message(&claim, "ModifyingVolume").unwrap_or_default();
    assert!(why.contains("in-tree rbd"), "{why}");
    assert!(
        h.ceph
            .rbd(&[
                "config",
                "image",
                "get",
                &format!("{}/{image}", h.ceph.pool),
                "rbd_qos_iops_limit",
            ])
            .is_err(),
        "a limit was set on an in-tree volume's image"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_created_with_a_class_gets_it_once_bound() {
    let h = Harness::start().await;
    let (_p, _, _, _) = bound_claim(&h, "csi", "first").await;
    create_vac(&h, "silver", json!({"rbd_qos_write_bps_limit": "1Mi"})).await;
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "born-silver", "namespace": "default"},
        "spec": {
            "storageClassName": "csi",
            "accessModes": ["ReadWriteOnce"],
            "volumeAttributesClassName": "silver",
            "resources": {"requests": {"storage": "8Mi"}},
        }
    }))
    .unwrap();
    h.claims()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let (_, pv) = h.wait_bound("born-silver").await;
    wait_current(&h, "born-silver", "silver").await;
    let image = Harness::image_name(&pv);
    assert_eq!(
        librbd_value(&h, &image, "rbd_qos_write_bps_limit"),
        "1048576"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modification_cut_by_a_crash_is_finished_after_a_restart() {
    let h = Harness::start().await;
    let (mut p, pv, image, prefix) = bound_claim(&h, "csi", "c").await;
    create_vac(&h, "one", json!({"rbd_qos_iops_limit": "100"})).await;
    create_vac(&h, "two", json!({"rbd_qos_iops_limit": "200"})).await;
    let pv_name = pv.metadata.name.clone().unwrap();
    for (step, class, applied) in [
        ("after-modify", "one", true),
        ("before-modify", "two", false),
    ] {
        p.kill();
        let mut crashing = spawn(&h, &prefix, &[("RBD_PROVISIONER_CRASH_AT", step)]);
        name_class(&h, "c", class).await;
        assert!(
            crashing.wait_exit(WAIT).is_some(),
            "no crash at {step}:\n{}",
            crashing.log_text()
        );
        // cut: InProgress recorded, the PV and the claim's current class not yet
        let claim = h.claims().get("c").await.unwrap();
        let m = claim
            .status
            .as_ref()
            .unwrap()
            .modify_volume_status
            .clone()
            .unwrap();
        assert_eq!(
            (
                m.status.as_str(),
                m.target_volume_attributes_class_name.as_deref()
            ),
            ("InProgress", Some(class)),
            "{step}"
        );
        let on_image = librbd_value(&h, &image, "rbd_qos_iops_limit");
        let wanted = if class == "one" { "100" } else { "200" };
        assert_eq!(on_image == wanted, applied, "{step}: image has {on_image}");
        let pv_class = h
            .volumes()
            .get(&pv_name)
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_attributes_class_name;
        assert_ne!(pv_class.as_deref(), Some(class), "{step}");
        // restarted: finished
        p = spawn(&h, &prefix, &[]);
        wait_current(&h, "c", class).await;
        assert_eq!(
            librbd_value(&h, &image, "rbd_qos_iops_limit"),
            wanted,
            "{step}"
        );
        let pv_class = h
            .volumes()
            .get(&pv_name)
            .await
            .unwrap()
            .spec
            .unwrap()
            .volume_attributes_class_name;
        assert_eq!(pv_class.as_deref(), Some(class), "{step}");
    }
}
