//! The PV controller's provisioning side: annotations, aggregated events, WaitForFirstConsumer,
//! expansion events and resize rules, checked against the recordings.

mod common;

use std::time::Duration;

use common::eventually;
use common::pv_env::{WAIT, bound_claim, env, env_with, events_for, rv, wait_annotated};
use common::pvc;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn immediate_claim_gets_both_provisioner_annotations_in_one_write_and_an_event() {
    let env = env().await;
    let created = env
        .pvcs
        .create(
            &PostParams::default(),
            &pvc("pvc-imm", Some("rbd-immediate"), "1Gi"),
        )
        .await
        .unwrap();
    let annotated = wait_annotated(&env, "pvc-imm").await;
    assert_eq!(
        rv(&annotated.metadata.resource_version),
        rv(&created.metadata.resource_version) + 1
    );
    let ann = annotated.metadata.annotations.unwrap();
    assert_eq!(
        ann["volume.beta.kubernetes.io/storage-provisioner"],
        "ceph.com/rbd"
    );
    assert_eq!(
        ann["volume.kubernetes.io/storage-provisioner"],
        "ceph.com/rbd"
    );
    assert_eq!(annotated.status.unwrap().phase.as_deref(), Some("Pending"));
    let events = eventually("ExternalProvisioning event", WAIT, || async {
        let e = events_for(&env, "pvc-imm").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    let e = &events[0];
    assert!(e.metadata.name.as_deref().unwrap().starts_with("pvc-imm."));
    assert_eq!(e.reason.as_deref(), Some("ExternalProvisioning"));
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(e.count, Some(1));
    assert_eq!(
        e.source.as_ref().unwrap().component.as_deref(),
        Some("persistentvolume-controller")
    );
    assert_eq!(e.reporting_instance.as_deref(), Some(""));
    assert!(e.event_time.is_none());
    assert_eq!(
        e.involved_object.resource_version,
        annotated.metadata.resource_version
    );
    assert_eq!(
        e.message.as_deref(),
        Some(
            "Waiting for a volume to be created either by the external provisioner 'ceph.com/rbd' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
        )
    );
}

#[tokio::test]
async fn external_provisioning_event_is_aggregated_on_resync() {
    let env = env_with(Duration::from_millis(200)).await;
    env.pvcs
        .create(
            &PostParams::default(),
            &pvc("agg", Some("rbd-immediate"), "1Gi"),
        )
        .await
        .unwrap();
    let events = eventually("count >= 3", WAIT, || async {
        let e = events_for(&env, "agg").await;
        (e.len() == 1 && e[0].count >= Some(3)).then_some(e)
    })
    .await;
    assert_eq!(events.len(), 1, "the same Event object is updated");
}

#[tokio::test]
async fn claim_update_bumps_the_aggregated_event() {
    let env = env().await;
    env.pvcs
        .create(
            &PostParams::default(),
            &pvc("upd", Some("rbd-immediate"), "1Gi"),
        )
        .await
        .unwrap();
    eventually("first event", WAIT, || async {
        (events_for(&env, "upd").await.len() == 1).then_some(())
    })
    .await;
    env.pvcs
        .patch(
            "upd",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    eventually("count 2", WAIT, || async {
        let e = events_for(&env, "upd").await;
        (e.len() == 1 && e[0].count == Some(2)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn wait_for_first_consumer_annotates_only_after_selected_node_and_never_checks_the_node() {
    let env = env().await;
    env.pvcs
        .create(
            &PostParams::default(),
            &pvc("pvc-wffc", Some("rbd-wffc"), "1Gi"),
        )
        .await
        .unwrap();
    let events = eventually("WaitForFirstConsumer event", WAIT, || async {
        let e = events_for(&env, "pvc-wffc").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(events[0].reason.as_deref(), Some("WaitForFirstConsumer"));
    assert_eq!(
        events[0].message.as_deref(),
        Some("waiting for first consumer to be created before binding")
    );
    let c = env.pvcs.get("pvc-wffc").await.unwrap();
    assert!(c.metadata.annotations.is_none());
    let sel =
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "ghost-node"}}});
    env.pvcs
        .patch("pvc-wffc", &PatchParams::default(), &Patch::Merge(&sel))
        .await
        .unwrap();
    let annotated = wait_annotated(&env, "pvc-wffc").await;
    assert_eq!(
        annotated.metadata.annotations.unwrap()["volume.beta.kubernetes.io/storage-provisioner"],
        "ceph.com/rbd"
    );
}

#[tokio::test]
async fn expansion_of_a_csi_claim_emits_one_external_expanding_event() {
    let env = env_with(Duration::from_millis(200)).await;
    bound_claim(&env, "grow", "rbd-immediate").await;
    let big = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    let resized = env
        .pvcs
        .patch("grow", &PatchParams::default(), &Patch::Merge(&big))
        .await
        .unwrap();
    assert_eq!(
        resized.status.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "1Gi"
    );
    let ev = eventually("ExternalExpanding", WAIT, || async {
        events_for(&env, "grow")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ExternalExpanding"))
    })
    .await;
    assert_eq!(
        ev.message.as_deref(),
        Some("waiting for an external controller to expand this PVC")
    );
    assert_eq!(
        ev.source.unwrap().component.as_deref(),
        Some("volume_expand")
    );
    tokio::time::sleep(Duration::from_millis(700)).await; // several resyncs
    let again = events_for(&env, "grow")
        .await
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("ExternalExpanding"))
        .unwrap();
    assert_eq!(again.count, Some(1), "not repeated");
    let claim = env.pvcs.get("grow").await.unwrap();
    assert!(claim.status.unwrap().conditions.is_none());
    // Shrinking below status.capacity is refused.
    let small = json!({"spec": {"resources": {"requests": {"storage": "512Mi"}}}});
    let e = env
        .pvcs
        .patch("grow", &PatchParams::default(), &Patch::Merge(&small))
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("field can not be less than status.capacity")),
        "{e:?}"
    );
}

#[tokio::test]
async fn resize_rules_follow_admission_and_validation() {
    let env = env().await;
    bound_claim(&env, "fixed", "rbd-wffc").await;
    let big = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    let e = env
        .pvcs
        .patch("fixed", &PatchParams::default(), &Patch::Merge(&big))
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 403 && s.message == "persistentvolumeclaims \"fixed\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"),
        "{e:?}"
    );
    env.pvcs
        .create(
            &PostParams::default(),
            &pvc("unbound", Some("rbd-wffc"), "1Gi"),
        )
        .await
        .unwrap();
    let e = env
        .pvcs
        .patch("unbound", &PatchParams::default(), &Patch::Merge(&big))
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 422 && s.message.contains("spec is immutable after creation except resources.requests")),
        "{e:?}"
    );
}

#[tokio::test]
async fn status_validation_rejects_unknown_allocated_resource_statuses() {
    let env = env().await;
    bound_claim(&env, "st", "rbd-immediate").await;
    let good = json!({"status": {"allocatedResources": {"storage": "2Gi"}, "allocatedResourceStatuses": {"storage": "NodeResizePending"}}});
    env.pvcs
        .patch_status("st", &PatchParams::default(), &Patch::Merge(&good))
        .await
        .unwrap();
    let bad = json!({"status": {"allocatedResourceStatuses": {"storage": "Bogus"}}});
    let e = env
        .pvcs
        .patch_status("st", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .unwrap_err();
    assert!(
        matches!(e, kube::Error::Api(ref s) if s.code == 422 && s.message == "PersistentVolumeClaim \"st\" is invalid: status.allocatedResourceStatuses: Unsupported value: \"storage\": supported values: \"ControllerResizeInProgress\", \"ControllerResizeInfeasible\", \"NodeResizeInProgress\", \"NodeResizeInfeasible\", \"NodeResizePending\""),
        "{e:?}"
    );
}
