//! The PV controller's binding side: pre-bound volumes, Released volumes, protection finalizers.

mod common;

use std::time::Duration;

use common::pv_env::{WAIT, bound_claim, env, events_for, wait_annotated};
use common::{eventually, prebound_pv, pvc};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

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
async fn available_volume_is_statically_bound_to_a_matching_claim() {
    let env = env().await;
    let static_pv = |name: &str, size: &str| -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "rbd-immediate",
                     "csi": {"driver": "rbd.example.com", "volumeHandle": name}}
        }))
        .unwrap()
    };
    env.pvs
        .create(&PostParams::default(), &static_pv("big", "10Gi"))
        .await
        .unwrap();
    env.pvs
        .create(&PostParams::default(), &static_pv("fit", "2Gi"))
        .await
        .unwrap();
    let claim = env
        .pvcs
        .create(
            &PostParams::default(),
            &pvc("static", Some("rbd-immediate"), "1Gi"),
        )
        .await
        .unwrap();
    let bound = eventually("claim bound", WAIT, || async {
        let c = env.pvcs.get("static").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("fit")
    );
    let ann = bound.metadata.annotations.unwrap();
    assert_eq!(ann["pv.kubernetes.io/bound-by-controller"], "yes");
    assert!(
        !ann.contains_key("volume.kubernetes.io/storage-provisioner"),
        "no provisioning for a matched claim"
    );
    let pv = env.pvs.get("fit").await.unwrap();
    assert_eq!(
        pv.metadata.annotations.unwrap()["pv.kubernetes.io/bound-by-controller"],
        "yes"
    );
    assert_eq!(pv.spec.unwrap().claim_ref.unwrap().uid, claim.metadata.uid);
    assert_eq!(
        env.pvs
            .get("big")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Available")
    );
}
