//! A PV-controller test environment: an emulator with two StorageClasses and helpers.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube_emulator::Emulator;

use super::{eventually, prebound_pv, pvc, storage_class};

pub const WAIT: Duration = Duration::from_secs(5);

pub struct Env {
    pub emu: Emulator,
    pub pvcs: Api<PersistentVolumeClaim>,
    pub pvs: Api<PersistentVolume>,
    pub events: Api<Event>,
}

pub async fn env_with(resync: Duration) -> Env {
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

pub async fn env() -> Env {
    env_with(Duration::from_secs(60)).await
}

pub fn rv(o: &Option<String>) -> u64 {
    o.as_deref().unwrap().parse().unwrap()
}

pub async fn events_for(env: &Env, name: &str) -> Vec<Event> {
    env.events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap()
        .items
}

pub async fn wait_annotated(env: &Env, name: &str) -> PersistentVolumeClaim {
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
pub async fn bound_claim(
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
