//! The PV controller slice, checked against the recorded kube-controller-manager behaviour.

mod common;

use std::time::Duration;

use common::{eventually, prebound_pv, pvc, storage_class};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube_emulator::Emulator;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(5);

struct Env {
    emu: Emulator,
    pvcs: Api<PersistentVolumeClaim>,
    pvs: Api<PersistentVolume>,
    events: Api<Event>,
}

async fn env_with(resync: Duration) -> Env {
    let emu = Emulator::builder().resync_period(resync).build();
    let client = emu.client();
    let scs: Api<StorageClass> = Api::all(client.clone());
    scs.create(
        &PostParams::default(),
        &storage_class("rbd-immediate", false, true),
    )
    .await
    .unwrap();
    scs.create(
        &PostParams::default(),
        &storage_class("rbd-wffc", true, false),
    )
    .await
    .unwrap();
    Env {
        pvcs: Api::default_namespaced(client.clone()),
        pvs: Api::all(client.clone()),
        events: Api::default_namespaced(client),
        emu,
    }
}

async fn env() -> Env {
    env_with(Duration::from_secs(60)).await
}

fn rv(o: &Option<String>) -> u64 {
    o.as_deref().unwrap().parse().unwrap()
}

async fn events_for(env: &Env, name: &str) -> Vec<Event> {
    env.events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap()
        .items
}

async fn wait_annotated(env: &Env, name: &str) -> PersistentVolumeClaim {
    eventually("storage-provisioner annotation", WAIT, || async {
        let c = env.pvcs.get(name).await.unwrap();
        c.metadata
            .annotations
            .as_ref()?
            .get("volume.kubernetes.io/storage-provisioner")?;
        Some(c)
    })
    .await
}

/// A claim bound to a pre-bound CSI PV.
async fn bound_claim(
    env: &Env,
    name: &str,
    class: &str,
) -> (PersistentVolumeClaim, PersistentVolume) {
    let mut claim = pvc(name, Some(class), "1Gi");
    if class == "rbd-wffc" {
        claim.metadata.annotations = Some(
            [(
                "volume.kubernetes.io/selected-node".to_string(),
                "node1".to_string(),
            )]
            .into(),
        );
    }
    let claim = env
        .pvcs
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let pv = env
        .pvs
        .create(&PostParams::default(), &prebound_pv(&claim, class, "1Gi"))
        .await
        .unwrap();
    let bound = eventually("claim bound", WAIT, || async {
        let c = env.pvcs.get(name).await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    let pv = env
        .pvs
        .get(pv.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    (bound, pv)
}

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
async fn prebound_pv_binds_with_two_claim_writes_and_no_events() {
    let env = env().await;
    let claim = env
        .pvcs
        .create(
            &PostParams::default(),
            &pvc("pvc-imm", Some("rbd-immediate"), "1Gi"),
        )
        .await
        .unwrap();
    let claim = {
        let _ = claim;
        wait_annotated(&env, "pvc-imm").await
    };
    let events_before = events_for(&env, "pvc-imm").await;
    let mut watch = env
        .pvcs
        .watch(
            &WatchParams::default(),
            claim.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let pv = env
        .pvs
        .create(
            &PostParams::default(),
            &prebound_pv(&claim, "rbd-immediate", "1Gi"),
        )
        .await
        .unwrap();
    let mut writes = Vec::new();
    while writes.len() < 2 {
        match tokio::time::timeout(WAIT, watch.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Modified(c) => writes.push(c),
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let pv_name = pv.metadata.name.clone().unwrap();
    let first = &writes[0];
    assert_eq!(
        first.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );
    let ann = first.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["pv.kubernetes.io/bind-completed"], "yes");
    assert_eq!(ann["pv.kubernetes.io/bound-by-controller"], "yes");
    assert_eq!(
        first.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    let second = writes[1].status.as_ref().unwrap();
    assert_eq!(second.phase.as_deref(), Some("Bound"));
    assert_eq!(second.capacity.as_ref().unwrap()["storage"].0, "1Gi");
    assert_eq!(second.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    let pv = env.pvs.get(&pv_name).await.unwrap();
    assert_eq!(pv.status.unwrap().phase.as_deref(), Some("Bound"));
    assert_eq!(
        pv.metadata.annotations.unwrap().len(),
        1,
        "no annotation added to a pre-bound PV"
    );
    assert_eq!(
        pv.metadata.finalizers.unwrap(),
        ["kubernetes.io/pv-protection"]
    );
    let after = events_for(&env, "pvc-imm").await;
    assert_eq!(after.len(), events_before.len());
    assert!(events_for(&env, &pv_name).await.is_empty());
}

#[tokio::test]
async fn claim_side_prebinding_fills_claim_ref_and_marks_the_pv() {
    let env = env().await;
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "static-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "rbd-immediate",
                 "csi": {"driver": "rbd.example.com", "volumeHandle": "rbd/static"}}
    }))
    .unwrap();
    env.pvs.create(&PostParams::default(), &pv).await.unwrap();
    eventually("PV Available", WAIT, || async {
        let p = env.pvs.get("static-pv").await.unwrap();
        (p.status?.phase.as_deref() == Some("Available")).then_some(())
    })
    .await;
    let mut claim = pvc("pvc-static", Some("rbd-immediate"), "1Gi");
    claim.spec.as_mut().unwrap().volume_name = Some("static-pv".into());
    let claim = env
        .pvcs
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let bound = eventually("claim bound", WAIT, || async {
        let c = env.pvcs.get("pvc-static").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    let ann = bound.metadata.annotations.unwrap();
    assert_eq!(
        ann.get("pv.kubernetes.io/bind-completed")
            .map(String::as_str),
        Some("yes")
    );
    assert!(!ann.contains_key("pv.kubernetes.io/bound-by-controller"));
    let pv = env.pvs.get("static-pv").await.unwrap();
    assert_eq!(
        pv.metadata.annotations.unwrap()["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    let claim_ref = pv.spec.unwrap().claim_ref.unwrap();
    assert_eq!(claim_ref.uid, claim.metadata.uid);
    assert_eq!(claim_ref.resource_version, claim.metadata.resource_version);
}

#[tokio::test]
async fn deleted_claim_releases_its_volume_keeping_the_claim_ref_uid() {
    let env = env().await;
    let (claim, pv) = bound_claim(&env, "rel", "rbd-immediate").await;
    let pv_name = pv.metadata.name.unwrap();
    let deleted = env
        .pvcs
        .delete("rel", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(deleted.metadata.deletion_timestamp.is_some());
    eventually("claim gone", WAIT, || async {
        env.pvcs
            .get_opt("rel")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let released = eventually("PV Released", WAIT, || async {
        let p = env.pvs.get(&pv_name).await.unwrap();
        (p.status.as_ref()?.phase.as_deref() == Some("Released")).then_some(p)
    })
    .await;
    assert_eq!(
        released.spec.unwrap().claim_ref.unwrap().uid,
        claim.metadata.uid
    );
    // pv-protection goes only after the PV is deleted, and only because it is not Bound.
    assert_eq!(
        released.metadata.finalizers.as_ref().unwrap(),
        &["kubernetes.io/pv-protection"]
    );
    let add = json!({"metadata": {"finalizers": ["kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"]}});
    env.pvs
        .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&add))
        .await
        .unwrap();
    env.pvs
        .delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    let held = eventually("pv-protection removed", WAIT, || async {
        let p = env.pvs.get(&pv_name).await.unwrap();
        (p.metadata.finalizers.as_ref()?.len() == 1).then_some(p)
    })
    .await;
    assert_eq!(
        held.metadata.finalizers.unwrap(),
        ["external-provisioner.volume.kubernetes.io/finalizer"]
    );
}

#[tokio::test]
async fn bound_pv_keeps_pv_protection_while_deleting() {
    let env = env().await;
    let (_, pv) = bound_claim(&env, "keep", "rbd-immediate").await;
    let name = pv.metadata.name.unwrap();
    env.pvs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let p = env.pvs.get(&name).await.unwrap();
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        ["kubernetes.io/pv-protection"]
    );
}

#[tokio::test]
async fn pv_whose_claim_uid_does_not_exist_is_released() {
    let env = env().await;
    let mut ghost = pvc("ghost", Some("rbd-immediate"), "1Gi");
    ghost.metadata.uid = Some("11111111-2222-3333-4444-555555555555".into());
    let pv = env
        .pvs
        .create(
            &PostParams::default(),
            &prebound_pv(&ghost, "rbd-immediate", "1Gi"),
        )
        .await
        .unwrap();
    let name = pv.metadata.name.unwrap();
    eventually("PV Released", WAIT, || async {
        let p = env.pvs.get(&name).await.unwrap();
        (p.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn pvc_protection_waits_for_pods_using_the_claim_and_is_readded_if_dropped() {
    let env = env().await;
    env.pvcs
        .create(
            &PostParams::default(),
            &pvc("used", Some("rbd-immediate"), "1Gi"),
        )
        .await
        .unwrap();
    // A PUT without finalizers drops it; the controller puts it back.
    let mut c = wait_annotated(&env, "used").await;
    c.metadata.finalizers = None;
    let dropped = env
        .pvcs
        .replace("used", &PostParams::default(), &c)
        .await
        .unwrap();
    assert!(dropped.metadata.finalizers.is_none());
    eventually("finalizer re-added", WAIT, || async {
        env.pvcs
            .get("used")
            .await
            .unwrap()
            .metadata
            .finalizers
            .map(|_| ())
    })
    .await;
    let pods: Api<Pod> = Api::default_namespaced(env.emu.client());
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "user"}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}],
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "used"}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    env.pvcs
        .delete("used", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        env.pvcs.get_opt("used").await.unwrap().is_some(),
        "a pod still uses the claim"
    );
    pods.delete("user", &DeleteParams::default()).await.unwrap();
    eventually("claim gone", WAIT, || async {
        env.pvcs
            .get_opt("used")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
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
