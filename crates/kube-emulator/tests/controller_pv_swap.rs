//! A bound claim's PV object deleted and created again with the same name and the claim's uid
//! in `claimRef` (how a volume source is changed, e.g. an in-tree `rbd` PV replaced by a CSI
//! one), as kube-controller-manager's pv_controller.go does it:
//! - the PV's deletion requeues the claim: `syncBoundClaim` finds no volume -> `Lost`
//!   (`ClaimLost`, access modes and capacity cleared);
//! - the new PV: `syncVolume` sees the claim's `volumeName` is this volume -> PV `Bound`, the
//!   claim is not requeued;
//! - the claim's next sync (an update of it, or the periodic resync) takes the bound path
//!   (`bind-completed` is kept): claimRef uid matches -> `bind` -> claim `Bound` again, same uid.

mod common;

use std::time::Duration;

use common::eventually;
use common::pv_env::{WAIT, bound_claim, env, env_with, events_for};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Deletes the PV and drops its pv-protection finalizer (it is Bound, so the finalizer would
/// hold it forever), then waits until it is gone.
async fn remove_pv(env: &common::pv_env::Env, name: &str) {
    env.pvs
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    env.pvs
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually("PV gone", WAIT, || async {
        env.pvs.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

/// The same PV without server-set fields, with another volume source.
fn replacement(old: &PersistentVolume) -> PersistentVolume {
    let mut v = serde_json::to_value(old).unwrap();
    let meta = v["metadata"].as_object_mut().unwrap();
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "finalizers",
        "managedFields",
    ] {
        meta.remove(k);
    }
    v.as_object_mut().unwrap().remove("status");
    v["spec"]["csi"] = json!({"driver": "other.example.com", "volumeHandle": "rbd/img1-swapped"});
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn a_claim_whose_pv_is_recreated_goes_lost_then_bound_on_its_next_sync() {
    let env = env().await; // resync 60 s: only the claim update below can bind it again in time
    let (claim, pv) = bound_claim(&env, "swap", "rbd-immediate").await;
    let name = pv.metadata.name.clone().unwrap();
    let uid = claim.metadata.uid.clone().unwrap();
    remove_pv(&env, &name).await;

    let lost = eventually("claim Lost", WAIT, || async {
        let c = env.pvcs.get("swap").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Lost")).then_some(c)
    })
    .await;
    let status = lost.status.unwrap();
    assert!(status.capacity.is_none() && status.access_modes.is_none());
    assert_eq!(lost.spec.unwrap().volume_name.as_deref(), Some(&*name));
    let events = events_for(&env, "swap").await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ClaimLost")),
        "{events:?}"
    );

    env.pvs
        .create(&PostParams::default(), &replacement(&pv))
        .await
        .unwrap();
    eventually("new PV Bound", WAIT, || async {
        let p = env.pvs.get(&name).await.unwrap();
        (p.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await;
    // syncVolume does not requeue the claim: it stays Lost until its own next sync
    let c = env.pvcs.get("swap").await.unwrap();
    assert_eq!(c.status.unwrap().phase.as_deref(), Some("Lost"));

    // any update of the claim is such a sync
    env.pvcs
        .patch(
            "swap",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"example.com/touched": "yes"}}})),
        )
        .await
        .unwrap();
    let bound = eventually("claim Bound again", WAIT, || async {
        let c = env.pvcs.get("swap").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert_eq!(bound.metadata.uid.as_deref(), Some(&*uid));
    assert_eq!(bound.spec.unwrap().volume_name.as_deref(), Some(&*name));
    let status = bound.status.unwrap();
    assert_eq!(status.capacity.unwrap()["storage"].0, "1Gi");
    assert_eq!(status.access_modes.unwrap(), ["ReadWriteOnce"]);
    let pv = env.pvs.get(&name).await.unwrap();
    assert_eq!(pv.spec.unwrap().csi.unwrap().driver, "other.example.com");
}

#[tokio::test]
async fn the_periodic_resync_binds_a_lost_claim_to_its_recreated_pv() {
    let env = env_with(Duration::from_millis(500)).await;
    let (claim, pv) = bound_claim(&env, "resync", "rbd-immediate").await;
    let name = pv.metadata.name.clone().unwrap();
    remove_pv(&env, &name).await;
    eventually("claim Lost", WAIT, || async {
        let c = env.pvcs.get("resync").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Lost")).then_some(())
    })
    .await;
    env.pvs
        .create(&PostParams::default(), &replacement(&pv))
        .await
        .unwrap();
    let bound = eventually("claim Bound again", WAIT, || async {
        let c = env.pvcs.get("resync").await.unwrap();
        (c.status.as_ref()?.phase.as_deref() == Some("Bound")).then_some(c)
    })
    .await;
    assert_eq!(bound.metadata.uid, claim.metadata.uid);
}

#[tokio::test]
async fn a_recreated_pv_of_another_claim_uid_leaves_the_claim_lost_as_misbound() {
    let env = env_with(Duration::from_millis(500)).await;
    let (_, pv) = bound_claim(&env, "misbound", "rbd-immediate").await;
    let name = pv.metadata.name.clone().unwrap();
    remove_pv(&env, &name).await;
    let mut other = replacement(&pv);
    other.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid =
        Some("11111111-2222-3333-4444-555555555555".into());
    env.pvs
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    // several resyncs later it is still Lost, and the PV (whose claim uid matches nothing) Released
    eventually("PV Released", WAIT, || async {
        let p = env.pvs.get(&name).await.unwrap();
        (p.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // two resync periods: nothing binds
    let c = env.pvcs.get("misbound").await.unwrap();
    assert_eq!(c.status.unwrap().phase.as_deref(), Some("Lost"));
}
