//! Hundreds of concurrent watchers and many writers.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube_emulator::Emulator;
use serde_json::json;

const WATCHERS: usize = 300;
const WRITERS: usize = 10;
const PER_WRITER: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_watchers_each_see_every_write_from_ten_writers() {
    let emu = Emulator::builder().pv_controller(false).build();
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let rv = cms
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let stream = cms.watch(&WatchParams::default(), &rv).await.unwrap();
        watchers.push(tokio::spawn(async move {
            let mut stream = stream.boxed();
            let mut seen = 0;
            while seen < WRITERS * PER_WRITER {
                match tokio::time::timeout(Duration::from_secs(20), stream.try_next()).await {
                    Ok(Ok(Some(WatchEvent::Added(_)))) => seen += 1,
                    Ok(Ok(Some(WatchEvent::Bookmark(_)))) => {}
                    other => panic!("watcher stopped after {seen}: {other:?}"),
                }
            }
            seen
        }));
    }
    assert_eq!(emu.open_watches(), WATCHERS);
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let cms = cms.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..PER_WRITER {
                let cm: ConfigMap =
                    serde_json::from_value(json!({"metadata": {"name": format!("w{w}-{i}")}}))
                        .unwrap();
                cms.create(&PostParams::default(), &cm).await.unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let write_time = started.elapsed();
    for w in watchers {
        assert_eq!(w.await.unwrap(), WRITERS * PER_WRITER);
    }
    assert!(
        write_time < Duration::from_secs(20),
        "writers took {write_time:?}"
    );
    assert_eq!(
        emu.request_count("create", "configmaps"),
        (WRITERS * PER_WRITER) as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_binds_hundreds_of_claims_quickly() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    const N: usize = 300;
    let emu = Emulator::new();
    let client = emu.client();
    let scs: Api<StorageClass> = Api::all(client.clone());
    let sc =
        serde_json::from_value(json!({"metadata": {"name": "rbd"}, "provisioner": "ceph.com/rbd"}))
            .unwrap();
    scs.create(&PostParams::default(), &sc).await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..N {
        let (pvcs, pvs) = (pvcs.clone(), pvs.clone());
        tasks.push(tokio::spawn(async move {
            let claim = serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}, "spec": {
                "storageClassName": "rbd", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
            .unwrap();
            let claim: PersistentVolumeClaim = pvcs.create(&PostParams::default(), &claim).await.unwrap();
            let uid = claim.metadata.uid.unwrap();
            let pv = serde_json::from_value(json!({"metadata": {"name": format!("pvc-{uid}")}, "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "rbd",
                "claimRef": {"namespace": "default", "name": format!("c{i}"), "uid": uid},
                "csi": {"driver": "d", "volumeHandle": format!("h{i}")}}}))
            .unwrap();
            pvs.create(&PostParams::default(), &pv).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    loop {
        let bound = pvcs
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == N {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "only {bound}/{N} bound"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("{N} claims bound in {:?}", started.elapsed());
}
