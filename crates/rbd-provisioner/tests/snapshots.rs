//! Snapshots and clones end to end: the binary (built-in provisioner with CSI PVs, its
//! VolumeSnapshotContent controller), the emulator's snapshot-controller slice, micro-ceph, and
//! the fuse data path of the node service. Data is written before a snapshot or clone and read
//! back from the restored or cloned volume.

#[path = "support/node.rs"]
mod node;
#[path = "support/snapshots.rs"]
mod snap;
mod support;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, PostParams};
use node::NodePlugin;
use rbd_volume::snapshot::{
    MAX_CHAIN_DEPTH, META_DEPTH, clone_intermediate_name, snapshot_image_name,
};
use serde_json::{Value, json};
use snap::{
    WAIT, contents, create_claim_from, create_snapshot, delete_claim, finalizers, setup, snapshots,
    trash, wait_gone, wait_ready,
};
use support::Harness;

async fn read(plugin: &NodePlugin, h: &Harness, claim: &str, file: &str) -> String {
    let (_, pv) = h.wait_bound(claim).await;
    plugin
        .with_mounted(&h.client, &pv, |dir| {
            std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| format!("<{e}>"))
        })
        .await
}

async fn write(plugin: &NodePlugin, h: &Harness, claim: &str, file: &str, text: &str) {
    let (_, pv) = h.wait_bound(claim).await;
    plugin
        .with_mounted(&h.client, &pv, |dir| {
            std::fs::write(dir.join(file), text).unwrap();
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_into_a_new_claim_with_the_data_of_its_moment() {
    let (h, _p) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = NodePlugin::start(dir.path());
    h.create_claim("src", "csi", "64Mi", false).await;
    write(&plugin, &h, "src", "a.txt", "before the snapshot").await;

    create_snapshot(&h, "snap", "src").await;
    let vs = wait_ready(&h, "snap").await;
    let uid = vs.metadata.uid.clone().unwrap();
    let content = contents(&h)
        .get(&format!("snapcontent-{uid}"))
        .await
        .unwrap();
    let status = &content.data["status"];
    let handle = status["snapshotHandle"].as_str().unwrap().to_owned();
    assert!(handle.starts_with("s1/"), "{status}");
    assert_eq!(status["restoreSize"], json!(64u64 << 20), "{status}");
    assert!(status["creationTime"].as_i64().unwrap() > 1_600_000_000_000_000_000);
    assert_eq!(vs.data["status"]["restoreSize"], json!("64Mi"));
    let snap_image = snapshot_image_name(&format!("snapshot-{uid}"));
    assert!(handle.ends_with(&snap_image), "{handle}");
    assert!(h.images().contains(&snap_image));
    // the being-created annotation goes after the status is filled: in a write of its own, as
    // external-snapshotter's sidecar does, so the snapshot may be ready a moment before
    let api = contents(&h);
    let name = format!("snapcontent-{uid}");
    h.until(
        "the being-created annotation removed",
        std::time::Duration::from_secs(30),
        || {
            let (api, name) = (api.clone(), name.clone());
            async move {
                let content = api.get(&name).await.ok()?;
                let annotations = content.metadata.annotations.unwrap_or_default();
                (!annotations
                    .contains_key("snapshot.storage.kubernetes.io/volumesnapshot-being-created"))
                .then_some(())
            }
        },
    )
    .await;

    // the source changes after the snapshot; the restore has the snapshot's moment
    write(&plugin, &h, "src", "a.txt", "after the snapshot").await;
    create_claim_from(&h, "restored", "128Mi", "VolumeSnapshot", "snap").await;
    let (_, pv) = h.wait_bound("restored").await;
    let restored_image = Harness::image_name(&pv);
    assert_eq!(
        h.image_size(&restored_image),
        128 << 20,
        "grown to the request"
    );
    assert_eq!(
        read(&plugin, &h, "restored", "a.txt").await,
        "before the snapshot"
    );
    assert_eq!(
        read(&plugin, &h, "src", "a.txt").await,
        "after the snapshot"
    );
    // the provisioner's protection finalizer is off the snapshot once the restore is done
    let api = snapshots(&h);
    h.until("snapshot protection finalizer removed", WAIT, || {
        let api = api.clone();
        async move {
            let vs = api.get("snap").await.ok()?;
            let f = finalizers(&serde_json::to_value(&vs).ok()?);
            (!f.iter()
                .any(|f| f.starts_with("provisioner.storage.kubernetes.io/")))
            .then_some(())
        }
    })
    .await;

    // the snapshot is deleted while the restore exists: content, snapshot image go; the
    // restore keeps its data
    api.delete("snap", &DeleteParams::default()).await.unwrap();
    wait_gone(&h, &api, "snap").await;
    wait_gone(&h, &contents(&h), &format!("snapcontent-{uid}")).await;
    h.until("snapshot image removed or trashed", WAIT, || async {
        (!h.images().contains(&snap_image)).then_some(())
    })
    .await;
    assert_eq!(
        read(&plugin, &h, "restored", "a.txt").await,
        "before the snapshot"
    );

    // the source goes, then the restore: nothing of ours is left, trash included
    delete_claim(&h, "src").await;
    assert_eq!(
        read(&plugin, &h, "restored", "a.txt").await,
        "before the snapshot"
    );
    delete_claim(&h, "restored").await;
    let images = h.images();
    assert!(!images.contains(&restored_image) && !images.contains(&snap_image));
    assert!(!trash(&h).contains(&snap_image), "{}", trash(&h));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_clones_another_and_outlives_its_source() {
    let (h, _p) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = NodePlugin::start(dir.path());
    h.create_claim("origin", "csi", "64Mi", false).await;
    write(&plugin, &h, "origin", "b.txt", "cloned content").await;

    create_claim_from(&h, "copy", "96Mi", "PersistentVolumeClaim", "origin").await;
    let (_, pv) = h.wait_bound("copy").await;
    let copy_image = Harness::image_name(&pv);
    assert_eq!(h.image_size(&copy_image), 96 << 20);
    let intermediate = clone_intermediate_name(&h.ceph.pool, &copy_image);
    assert!(h.images().contains(&intermediate));
    assert_eq!(read(&plugin, &h, "copy", "b.txt").await, "cloned content");
    // the clone is independent of later writes to the source
    write(&plugin, &h, "origin", "b.txt", "changed").await;
    assert_eq!(read(&plugin, &h, "copy", "b.txt").await, "cloned content");
    // the cloning-protection finalizer is off the source once the clone is done
    h.until("cloning protection removed", WAIT, || async {
        let c = h.claims().get("origin").await.ok()?;
        let f = c.metadata.finalizers.clone().unwrap_or_default();
        (!f.iter()
            .any(|f| f == "provisioner.storage.kubernetes.io/cloning-protection"))
        .then_some(())
    })
    .await;

    // the source is deleted while its clone exists; the clone keeps its data
    let (_, origin_pv) = h.wait_bound("origin").await;
    let origin_image = Harness::image_name(&origin_pv);
    delete_claim(&h, "origin").await;
    assert!(!h.images().contains(&origin_image));
    assert_eq!(read(&plugin, &h, "copy", "b.txt").await, "cloned content");
    delete_claim(&h, "copy").await;
    let images = h.images();
    assert!(
        !images.contains(&copy_image) && !images.contains(&intermediate),
        "{images:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_deep_chain_of_clones_stays_readable_and_short() {
    let (h, _p) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = NodePlugin::start(dir.path());
    h.create_claim("gen0", "csi", "64Mi", false).await;
    write(&plugin, &h, "gen0", "c.txt", "generation zero").await;
    let mut images = Vec::new();
    for i in 1..=10 {
        let (name, parent) = (format!("gen{i}"), format!("gen{}", i - 1));
        create_claim_from(&h, &name, "64Mi", "PersistentVolumeClaim", &parent).await;
        let (_, pv) = h.wait_bound(&name).await;
        let image = Harness::image_name(&pv);
        let depth: u32 = h
            .image_meta(&image, META_DEPTH)
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
        assert!(depth <= MAX_CHAIN_DEPTH, "{name}: depth {depth}");
        images.push(image);
    }
    // the chain as Ceph sees it: never more than MAX_CHAIN_DEPTH parents above the last one
    let mut parents = 0;
    let mut spec = format!("{}/{}", h.ceph.pool, images[9]);
    while let Ok(info) = h.ceph.rbd(&["info", "--format", "json", &spec]) {
        let v: Value = serde_json::from_str(&info).unwrap();
        let Some(parent) = v.get("parent") else { break };
        parents += 1;
        spec = format!(
            "{}/{}",
            parent["pool"].as_str().unwrap(),
            parent["image"].as_str().unwrap()
        );
    }
    assert!(
        parents <= MAX_CHAIN_DEPTH as usize,
        "{parents} parents above gen10"
    );
    assert_eq!(read(&plugin, &h, "gen10", "c.txt").await, "generation zero");
    assert_eq!(read(&plugin, &h, "gen5", "c.txt").await, "generation zero");
    // deleting from the root down leaves every later generation readable
    for i in 0..10 {
        delete_claim(&h, &format!("gen{i}")).await;
    }
    assert_eq!(read(&plugin, &h, "gen10", "c.txt").await, "generation zero");
    delete_claim(&h, "gen10").await;
    let left = h.images();
    for image in &images {
        assert!(!left.contains(image), "{image} left");
        assert!(
            !left.contains(&clone_intermediate_name(&h.ceph.pool, image)),
            "intermediate of {image} left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_data_sources_are_refused_with_the_field_named() {
    let (h, _p) = setup().await;
    h.create_claim("base", "csi", "64Mi", false).await;
    h.wait_bound("base").await;
    create_claim_from(&h, "no-such-snap", "64Mi", "VolumeSnapshot", "missing").await;
    let m = h.wait_event("no-such-snap", "ProvisioningFailed").await;
    assert!(
        m.contains("spec.dataSource: VolumeSnapshot default/missing not found"),
        "{m}"
    );
    create_claim_from(&h, "too-small", "32Mi", "PersistentVolumeClaim", "base").await;
    let m = h.wait_event("too-small", "ProvisioningFailed").await;
    assert!(
        m.contains("spec.resources.requests.storage") && m.contains("smaller"),
        "{m}"
    );
    create_snapshot(&h, "base-snap", "base").await;
    wait_ready(&h, "base-snap").await;
    create_claim_from(&h, "small-restore", "32Mi", "VolumeSnapshot", "base-snap").await;
    let m = h.wait_event("small-restore", "ProvisioningFailed").await;
    assert!(m.contains("smaller than the restore size"), "{m}");
    // a block claim from a filesystem snapshot
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "as-block", "namespace": "default"},
        "spec": {
            "storageClassName": "csi",
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "resources": {"requests": {"storage": "64Mi"}},
            "dataSource": {"kind": "VolumeSnapshot", "name": "base-snap", "apiGroup": "snapshot.storage.k8s.io"},
        }
    }))
    .unwrap();
    h.claims()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let m = h.wait_event("as-block", "ProvisioningFailed").await;
    assert!(m.contains("spec.volumeMode \"Block\""), "{m}");
    for name in ["no-such-snap", "too-small", "small-restore", "as-block"] {
        let c = h.claims().get(name).await.unwrap();
        assert_ne!(
            c.status.and_then(|s| s.phase).as_deref(),
            Some("Bound"),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protection_finalizer_no_pending_claim_needs_comes_off() {
    use kube::api::{Patch, PatchParams};
    let (h, _p) = setup().await;
    h.create_claim("held", "csi", "16Mi", false).await;
    h.wait_bound("held").await;
    create_snapshot(&h, "held-snap", "held").await;
    wait_ready(&h, "held-snap").await;
    // what a crash between taking the finalizer and the clone's end leaves, with the Pending
    // claim deleted meanwhile
    let patch = |f: &str| json!({"metadata": {"finalizers": [f]}});
    h.claims()
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(&patch(
                "provisioner.storage.kubernetes.io/cloning-protection",
            )),
        )
        .await
        .unwrap();
    let vs_finalizer = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
    let current = snapshots(&h).get("held-snap").await.unwrap();
    let mut list = current.metadata.finalizers.clone().unwrap_or_default();
    list.push(vs_finalizer.to_owned());
    snapshots(&h)
        .patch(
            "held-snap",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": list}})),
        )
        .await
        .unwrap();
    h.until("both protection finalizers removed", WAIT, || async {
        let c = h.claims().get("held").await.ok()?;
        let vs = snapshots(&h).get("held-snap").await.ok()?;
        let claim_held = c
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f.starts_with("provisioner.storage.kubernetes.io/"));
        let vs_held = vs
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == vs_finalizer);
        (!claim_held && !vs_held).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_snapshot_reports_its_error_on_the_content_and_the_snapshot() {
    let (h, _p) = setup().await;
    h.create_claim("err-src", "csi", "16Mi", false).await;
    h.wait_bound("err-src").await;
    snap::create_snapshot_class(&h, "bad-params", snap::DRIVER, json!({"pool": "elsewhere"})).await;
    let vs = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {
            "volumeSnapshotClassName": "bad-params",
            "source": {"persistentVolumeClaimName": "err-src"},
        },
    });
    snapshots(&h)
        .create(&PostParams::default(), &serde_json::from_value(vs).unwrap())
        .await
        .unwrap();
    let api = snapshots(&h);
    let message = h
        .until("the error on the VolumeSnapshot", WAIT, || {
            let api = api.clone();
            async move {
                let vs = api.get("bad").await.ok()?;
                vs.data
                    .pointer("/status/error/message")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }
        })
        .await;
    assert!(
        message.starts_with("Failed to create snapshot: ") && message.contains("\"pool\""),
        "{message}"
    );
    let vs = api.get("bad").await.unwrap();
    assert_eq!(vs.data["status"]["readyToUse"], json!(false));
    let content = format!("snapcontent-{}", vs.metadata.uid.unwrap());
    let event = h.wait_event(&content, "SnapshotCreationFailed").await;
    assert_eq!(event, message);
    // deleting the failed snapshot leaves nothing behind
    api.delete("bad", &DeleteParams::default()).await.unwrap();
    wait_gone(&h, &api, "bad").await;
    wait_gone(&h, &contents(&h), &content).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_provisioned_snapshot_is_verified_in_ceph_and_restores() {
    use support::{ADMIN_SECRET, ADMIN_SECRET_NS};
    let (h, _p) = setup().await;
    h.create_claim("pp-src", "csi", "16Mi", false).await;
    h.wait_bound("pp-src").await;
    create_snapshot(&h, "pp-dynamic", "pp-src").await;
    let vs = wait_ready(&h, "pp-dynamic").await;
    let content_name = format!("snapcontent-{}", vs.metadata.uid.unwrap());
    let handle = contents(&h).get(&content_name).await.unwrap().data["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_owned();
    // an existing snapshot imported by hand (Retain), and one whose handle names nothing
    let secret_annotations = json!({
        "snapshot.storage.kubernetes.io/deletion-secret-name": ADMIN_SECRET,
        "snapshot.storage.kubernetes.io/deletion-secret-namespace": ADMIN_SECRET_NS,
    });
    for (content, vs, snapshot_handle) in [
        ("pp-static", "pp-imported", handle.clone()),
        (
            "pp-missing",
            "pp-missing",
            handle.replace("csi-snap-", "csi-snap-0"),
        ),
    ] {
        let c = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContent",
            "metadata": {"name": content, "annotations": secret_annotations},
            "spec": {
                "driver": snap::DRIVER,
                "deletionPolicy": "Retain",
                "source": {"snapshotHandle": snapshot_handle},
                "volumeSnapshotRef": {"name": vs, "namespace": "default"},
            },
        });
        contents(&h)
            .create(&PostParams::default(), &serde_json::from_value(c).unwrap())
            .await
            .unwrap();
        let v = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": vs, "namespace": "default"},
            "spec": {"source": {"volumeSnapshotContentName": content}},
        });
        snapshots(&h)
            .create(&PostParams::default(), &serde_json::from_value(v).unwrap())
            .await
            .unwrap();
    }
    let imported = wait_ready(&h, "pp-imported").await;
    assert_eq!(imported.data["status"]["restoreSize"], json!("16Mi"));
    let status = contents(&h).get("pp-static").await.unwrap().data["status"].clone();
    assert_eq!(status["snapshotHandle"], json!(handle), "{status}");
    let message = h
        .wait_event("pp-missing", "SnapshotContentCheckandUpdateFailed")
        .await;
    assert!(message.contains("spec.source.snapshotHandle"), "{message}");
    create_claim_from(&h, "pp-restored", "16Mi", "VolumeSnapshot", "pp-imported").await;
    let (_, pv) = h.wait_bound("pp-restored").await;
    let image = Harness::image_name(&pv);
    assert_eq!(
        h.image_meta(&image, "provisioner.ceph.com/content-source")
            .as_deref(),
        Some(handle.as_str())
    );
}

/// deploy/examples/snapshots/ as written (after deploy/examples' claim data-fs) works: the
/// snapshot becomes ready, the restore and the clone Bind at their sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_manifests_snapshot_restore_and_clone() {
    use kube::api::{Api, DynamicObject};
    let (h, _p) = setup().await;
    h.create_secret(
        support::ADMIN_SECRET_NS,
        "ceph-admin-secret",
        &[("key", &h.ceph.admin_key)],
    )
    .await;
    let mut params: Vec<(String, String)> = h
        .params()
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "adminSecretName" | "userSecretName" => (k, "ceph-admin-secret".to_string()),
            _ => (k, v),
        })
        .collect();
    params.push(("pvSource".into(), "csi".into()));
    h.create_class("rbd", &params, "Delete").await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples");
    let docs = |file: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    };
    let data_fs = docs("pvcs.yaml")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "data-fs")
        .unwrap();
    h.claims()
        .create(
            &PostParams::default(),
            &serde_json::from_value(data_fs).unwrap(),
        )
        .await
        .unwrap();
    h.wait_bound("data-fs").await;
    let class: Api<DynamicObject> = Api::all_with(
        h.client.clone(),
        &snap::resource("VolumeSnapshotClass", "volumesnapshotclasses"),
    );
    for doc in docs("snapshots/volumesnapshotclass.yaml") {
        class
            .create(
                &PostParams::default(),
                &serde_json::from_value(doc).unwrap(),
            )
            .await
            .unwrap();
    }
    for doc in docs("snapshots/snapshot.yaml") {
        if doc["kind"] == "VolumeSnapshot" {
            snapshots(&h)
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(doc).unwrap(),
                )
                .await
                .unwrap();
        } else {
            h.claims()
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(doc).unwrap(),
                )
                .await
                .unwrap();
        }
    }
    wait_ready(&h, "data-fs-snap").await;
    for (claim, size) in [("data-fs-restored", 2u64 << 30), ("data-fs-clone", 1 << 30)] {
        let (_, pv) = h.wait_bound(claim).await;
        assert_eq!(h.image_size(&Harness::image_name(&pv)), size, "{claim}");
    }
}

/// Two replicas with leader election: only the leader fills contents; when it is killed, the
/// new leader takes the next snapshot and finishes nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_content_controller_follows_the_leader() {
    let h = snap::harness().await;
    let args = [
        "--pv-source=csi",
        "--leader-elect=true",
        "--leader-election-namespace=default",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=500ms",
        "--retry-interval-start=200ms",
        "--retry-interval-max=2s",
    ];
    let mut replicas = vec![h.spawn(&args, &[]), h.spawn(&args, &[])];
    h.create_claim("ha-src", "csi", "16Mi", false).await;
    h.wait_bound("ha-src").await;
    create_snapshot(&h, "ha-1", "ha-src").await;
    wait_ready(&h, "ha-1").await;
    let leader = h
        .until("a leader", WAIT, || {
            let l = Harness::leader(&mut replicas);
            async move { l }
        })
        .await;
    let standby = 1 - leader;
    assert!(
        !replicas[standby].log_text().contains("snapshot ready"),
        "the standby took a snapshot"
    );
    replicas[leader].kill();
    create_snapshot(&h, "ha-2", "ha-src").await;
    wait_ready(&h, "ha-2").await;
    // the line is logged after the status write the snapshot's readiness comes from
    let survivor = &replicas[standby];
    h.until("the new leader's \"snapshot ready\" line", WAIT, || {
        let done = survivor.log_text().contains("snapshot ready");
        async move { done.then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_stays_protected_until_its_clone_is_bound() {
    const PROTECTION: &str = "provisioner.storage.kubernetes.io/cloning-protection";
    let (h, _p) = setup().await;
    h.create_claim("src", "csi", "16Mi", false).await;
    h.wait_bound("src").await;
    // the clone's PV save takes 4 s (a slow API server): the clone exists, the claim is Pending
    h.emu.faults().delay_next(
        "create",
        "persistentvolumes",
        1,
        std::time::Duration::from_secs(4),
    );
    create_claim_from(&h, "copy", "16Mi", "PersistentVolumeClaim", "src").await;
    let uid = h.claims().get("copy").await.unwrap().metadata.uid.unwrap();
    let image = format!("kubernetes-dynamic-pvc-{uid}");
    let protected = || async {
        let src = h.claims().get("src").await.unwrap();
        src.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == PROTECTION)
    };
    let checked_after_clone = std::sync::atomic::AtomicUsize::new(0);
    h.until("the clone Bound", WAIT, || async {
        // in this order: a claim once Bound stays Bound, so a copy read as not Bound after the
        // finalizer was read as missing was not Bound when it was missing either
        let recorded = h.image_meta(&image, "provisioner.ceph.com/pv").is_some();
        let kept = protected().await;
        let copy = h.claims().get("copy").await.ok()?;
        if copy.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
            return Some(());
        }
        // the clone made and recorded: only the PV save is left
        if recorded {
            assert!(
                kept,
                "the source lost its protection while its clone is Pending"
            );
            checked_after_clone.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        None
    })
    .await;
    assert!(
        checked_after_clone.into_inner() > 0,
        "never saw the clone before its PV"
    );
    h.until("the protection released", WAIT, || async {
        (!protected().await).then_some(())
    })
    .await;
    for claim in ["copy", "src"] {
        delete_claim(&h, claim).await;
    }
}
