//! `rbd-provisioner gc`: deliberately orphaned images (a PV object deleted behind the
//! provisioner's back, images with an owner record naming a PV that never existed) are listed
//! by the dry run, exactly them; `--delete` removes exactly them and refuses a watched one.
//! Snapshot images no VolumeSnapshotContent refers to and clone intermediates whose clone is
//! gone are listed and removed likewise; a snapshot image a restore needs goes to the trash
//! (the restore reads on), a live clone's intermediate is never listed, an orphaned volume's
//! snapshot survives its removal, and without the snapshot CRDs nothing is judged.
//!
//! `cargo test -p rbd-provisioner --test gc`

#[path = "support/snapshots.rs"]
mod snapshots;
mod support;

use std::collections::BTreeSet;
use std::process::Output;
use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use micro_ceph::ImageHolder;
use support::{Harness, claim_names, unique_prefix};

/// `gc` with no minimum age (the test's orphans are seconds old).
fn gc(h: &Harness, identity: &str, delete: bool) -> (Output, String) {
    gc_with(h, identity, delete, &["--min-age=0s"])
}

fn gc_with(h: &Harness, identity: &str, delete: bool, extra: &[&str]) -> (Output, String) {
    let mut args = vec!["--id", identity];
    args.extend_from_slice(extra);
    if delete {
        args.push("--delete");
    }
    gc_run(h, &args)
}

/// `rbd-provisioner gc ARGS` against `h`'s emulator, at default flags otherwise.
fn gc_run(h: &Harness, args: &[&str]) -> (Output, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
        .arg("gc")
        .args(args)
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .env_remove("RUST_LOG")
        .env_remove("PROVISIONER_NAME")
        .env_remove("KUBE_CLUSTER_ID")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// Image names of `prefix` that the gc output lists.
fn listed(text: &str, prefix: &str) -> BTreeSet<String> {
    text.split_whitespace()
        .filter_map(|w| {
            let w = w.rsplit('/').next().unwrap_or(w);
            w.starts_with(prefix).then(|| w.to_string())
        })
        .collect()
}

/// An image with an owner record, as our provisioner (`identity`) in the Kubernetes cluster
/// `kube_cluster` writes it (empty: as versions before the cluster was recorded wrote it).
fn owned_image(h: &Harness, image: &str, pv: &str, identity: &str, kube_cluster: &str) {
    let spec = format!("{}/{image}", h.ceph.pool);
    h.ceph.rbd(&["create", &spec, "--size", "8M"]).unwrap();
    record_owner(h, image, pv, identity, kube_cluster);
}

/// The owner record our provisioner (`identity`) in `kube_cluster` (empty: none recorded)
/// writes, on an existing image.
fn record_owner(h: &Harness, image: &str, pv: &str, identity: &str, kube_cluster: &str) {
    let spec = format!("{}/{image}", h.ceph.pool);
    let mut keys = vec![
        ("provisioner.ceph.com/pv", pv),
        ("provisioner.ceph.com/claim", "default/gone"),
        ("provisioner.ceph.com/provisioner", identity),
    ];
    if !kube_cluster.is_empty() {
        keys.push(("provisioner.ceph.com/kube-cluster", kube_cluster));
    }
    for (key, value) in keys {
        h.ceph
            .rbd(&["image-meta", "set", &spec, key, value])
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_lists_exactly_the_orphans_and_deletes_only_unwatched_ones() {
    let h = Harness::start().await;
    let prefix = unique_prefix("gc");
    // an identity of this test only: other tests' images in the shared pool are not ours
    let identity = format!("gc-test-{}", &prefix[5..13]);
    let kube_cluster = h.kube_cluster_id().await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let names = claim_names("gc", 3);
    let mut p = h.spawn(
        &[
            "--leader-elect=false",
            "--id",
            &identity,
            "--image-name-prefix",
            &prefix,
        ],
        &[],
    );
    h.create_claims("rbd", &names, "8Mi").await;
    h.wait_all_bound(&names, Duration::from_secs(30)).await;
    let (_, nothing) = gc(&h, &identity, false);
    assert!(nothing.contains("no orphaned images"), "{nothing}");

    // orphan 1: a PV object deleted while the provisioner is stopped
    p.kill();
    let (_, victim) = h.wait_bound(&names[0]).await;
    let victim_pv = victim.metadata.name.clone().unwrap();
    let victim_image = Harness::image_name(&victim);
    // what an admin's `kubectl delete pv --force` with the finalizers stripped does
    h.claims()
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    h.volumes()
        .patch(&victim_pv, &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .unwrap();
    h.volumes()
        .delete(&victim_pv, &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&victim_pv).await;
    // orphan 2: an owner record naming a PV that never existed
    let made_up = format!("{prefix}made-up");
    owned_image(
        &h,
        &made_up,
        "pvc-00000000-0000-0000-0000-000000000000",
        &identity,
        &kube_cluster,
    );
    // orphan 3: the same, but mapped somewhere (a watcher)
    let watched = format!("{prefix}watched");
    owned_image(
        &h,
        &watched,
        "pvc-11111111-0000-0000-0000-000000000000",
        &identity,
        &kube_cluster,
    );
    let holder = ImageHolder::open(h.ceph, &h.ceph.pool, &watched).unwrap();
    // not orphans: another provisioner's image, and an image with no owner record
    let foreign = format!("{prefix}foreign");
    owned_image(
        &h,
        &foreign,
        "pvc-22222222-0000-0000-0000-000000000000",
        "someone-else",
        &kube_cluster,
    );
    let unowned = format!("{prefix}unowned");
    h.ceph
        .rbd(&[
            "create",
            &format!("{}/{unowned}", h.ceph.pool),
            "--size",
            "8M",
        ])
        .unwrap();

    let orphans: BTreeSet<String> = [victim_image.clone(), made_up.clone(), watched.clone()]
        .into_iter()
        .collect();
    let before: BTreeSet<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with(&prefix))
        .collect();
    let (out, text) = gc(&h, &identity, false);
    assert!(out.status.success(), "{text}");
    assert_eq!(listed(&text, &prefix), orphans, "dry run:\n{text}");
    assert!(
        text.contains(&victim_pv),
        "the dry run names the missing PV:\n{text}"
    );
    assert!(text.contains("3 orphaned image(s)"), "{text}");
    let after_dry: BTreeSet<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with(&prefix))
        .collect();
    assert_eq!(before, after_dry, "the dry run removed something");

    // --delete: the two unwatched orphans go, the watched one is refused and reported
    let (out, text) = gc(&h, &identity, true);
    assert!(
        !out.status.success(),
        "a refused orphan must fail the run:\n{text}"
    );
    assert!(
        text.contains("1 orphaned image(s) could not be removed"),
        "{text}"
    );
    let now: BTreeSet<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with(&prefix))
        .collect();
    let expected: BTreeSet<String> = before
        .iter()
        .filter(|i| **i != victim_image && **i != made_up)
        .cloned()
        .collect();
    assert_eq!(now, expected, "--delete removed the wrong images:\n{text}");
    assert!(now.contains(&watched) && now.contains(&foreign) && now.contains(&unowned));

    // released: the next run removes it and finds nothing more
    drop(holder);
    let (out, text) = gc(&h, &identity, true);
    assert!(out.status.success(), "{text}");
    assert!(!h.images().contains(&watched));
    let (_, text2) = gc(&h, &identity, false);
    assert!(text2.contains("no orphaned images"), "{text2}");
    for image in [foreign, unowned] {
        h.ceph
            .rbd(&["rm", &format!("{}/{image}", h.ceph.pool)])
            .unwrap();
    }
    // live volumes untouched
    let live = &names[1..];
    // (the owner records name our test identity, not ceph.com/rbd: checked on the PV key only)
    h.assert_converged_pv_owner(&prefix, live, 8 << 20).await;
    assert!(!text.contains(&h.ceph.admin_key) && !text2.contains(&h.ceph.admin_key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_spares_the_image_of_a_volume_being_provisioned() {
    let h = Harness::start().await;
    let prefix = unique_prefix("gr");
    let identity = format!("gc-race-{}", &prefix[5..13]);
    h.create_class("rbd", &h.params(), "Delete").await;
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--id",
            &identity,
            "--image-name-prefix",
            &prefix,
        ],
        &[],
    );
    // the PV save takes 5 s (a slow API server): the image exists, its PV not yet
    h.emu
        .faults()
        .delay_next("create", "persistentvolumes", 1, Duration::from_secs(5));
    let claim = h.create_claim("racy", "rbd", "8Mi", false).await;
    let image = format!("{prefix}{}", claim.metadata.uid.unwrap());
    h.until("the image created", Duration::from_secs(10), || async {
        let records = h.image_records(&prefix);
        records
            .get(&image)
            .is_some_and(|r| r.meta.contains_key("provisioner.ceph.com/provisioner"))
            .then_some(())
    })
    .await;
    // the default minimum age (10 min) protects it
    let (_, text) = gc_with(&h, &identity, true, &[]);
    h.wait_all_bound(&["racy".to_string()], Duration::from_secs(30))
        .await;
    assert!(
        h.images().contains(&image),
        "gc removed the image of a volume being provisioned; the PV is Bound to nothing:\n{text}"
    );
}

/// `gc` with the test's snapshot driver name.
fn gc_snap(h: &Harness, identity: &str, driver: &str, delete: bool) -> (Output, String) {
    gc_with(
        h,
        identity,
        delete,
        &["--min-age=0s", "--csi-driver-name", driver],
    )
}

/// Internal image names (`csi-snap-`, `csi-clone-`) of `made` that the gc output lists.
fn listed_internal(text: &str, made: &BTreeSet<String>) -> BTreeSet<String> {
    text.split_whitespace()
        .map(|w| w.rsplit('/').next().unwrap_or(w).to_string())
        .filter(|w| made.contains(w))
        .collect()
}

/// A static PV (in-tree rbd source) that refers to `image`: the image is a live volume.
async fn static_pv(h: &Harness, name: &str, image: &str) {
    let pv = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "8Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "rbd": {"monitors": [h.ceph.monitors.clone()], "pool": h.ceph.pool.clone(), "image": image},
        }
    }))
    .unwrap();
    h.volumes().create(&Default::default(), &pv).await.unwrap();
}

/// A pre-provisioned VolumeSnapshotContent whose handle names `image`.
async fn content(h: &Harness, name: &str, driver: &str, image: &str) {
    let handle = rbd_volume::SnapshotId::new(&h.ceph.monitors, &h.ceph.pool, image)
        .encode()
        .unwrap();
    let obj: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {
            "deletionPolicy": "Retain",
            "driver": driver,
            "source": {"snapshotHandle": handle},
            "volumeSnapshotRef": {"name": name, "namespace": "default"},
        }
    }))
    .unwrap();
    contents(h).create(&Default::default(), &obj).await.unwrap();
}

fn contents(h: &Harness) -> kube::Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
        "volumesnapshotcontents",
    );
    kube::Api::all_with(h.client.clone(), &resource)
}

/// Bytes 0..1 MiB of `image`, through the rbd CLI (librbd, not our code).
fn read_head(h: &Harness, image: &str) -> Vec<u8> {
    let out = h.dir.path().join(format!("{image}.head"));
    let _ = std::fs::remove_file(&out);
    h.ceph
        .rbd(&[
            "export",
            &format!("{}/{image}", h.ceph.pool),
            out.to_str().unwrap(),
        ])
        .unwrap();
    let mut data = std::fs::read(&out).unwrap();
    data.truncate(1 << 20);
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_covers_snapshot_images_and_clone_intermediates() {
    use rbd_volume::snapshot::{self, NewClone, NewSnapshot, SnapshotOwner, Source};
    use rbd_volume::{Fit, Owner};

    let h = Harness::start_on(
        kube_emulator::Emulator::builder()
            .snapshot_crds(true)
            .snapshot_controller(false)
            .build(),
    )
    .await;
    let prefix = unique_prefix("gs");
    let identity = format!("gc-snap-{}", &prefix[5..13]);
    let driver = format!("driver-{}", &prefix[5..13]);
    let kube_cluster = h.kube_cluster_id().await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let cluster = h.ceph_cluster().await;
    let pool = h.ceph.pool.as_str();

    // the source volume, with data, live (a PV refers to it)
    let source = format!("{prefix}source");
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let file = h.dir.path().join("data");
    std::fs::write(&file, &data).unwrap();
    h.ceph
        .rbd(&[
            "import",
            file.to_str().unwrap(),
            &format!("{pool}/{source}"),
        ])
        .unwrap();
    record_owner(&h, &source, "pv-source", &identity, &kube_cluster);
    static_pv(&h, "pv-source", &source).await;
    let source_id = format!("v1/{}/{pool}/{source}", h.ceph.monitors);

    let snap = |name: &'static str, driver: String| {
        let (cluster, source, source_id) = (cluster.clone(), source.clone(), source_id.clone());
        let kube_cluster = kube_cluster.clone();
        async move {
            let image = snapshot::snapshot_image_name(&format!("{name}-{source}"));
            let owner = SnapshotOwner {
                name: name.into(),
                source: source_id,
                driver,
                kube_cluster,
            };
            snapshot::create_snapshot(
                &cluster,
                &NewSnapshot {
                    pool: micro_ceph::cluster().pool.as_str(),
                    source_image: &source,
                    image: &image,
                    owner: &owner,
                },
            )
            .await
            .unwrap();
            image
        }
    };
    let kept = snap("kept", driver.clone()).await; // a content refers to it
    let orphan = snap("orphan", driver.clone()).await; // none does
    let restored_from = snap("restored-from", driver.clone()).await; // none, but a restore needs it
    let theirs = snap("theirs", "another.driver".into()).await; // not our driver
    content(&h, "content-kept", &driver, &kept).await;

    let clone = |image: String, from: Source<'static>, pv: &'static str| {
        let (cluster, driver, identity) = (cluster.clone(), driver.clone(), identity.clone());
        let kube_cluster = kube_cluster.clone();
        let source_id = match from {
            Source::Snapshot { image, .. } => format!("s1/x/{image}"),
            Source::Volume { .. } => source_id.clone(),
        };
        async move {
            let owner = Owner {
                pv: pv.into(),
                claim: "default/c".into(),
                provisioner: identity,
                kube_cluster,
            };
            snapshot::clone_volume(
                &cluster,
                &NewClone {
                    pool: micro_ceph::cluster().pool.as_str(),
                    image: &image,
                    size: 1 << 20,
                    options: &ceph_rbd::CreateOptions::default(),
                    owner: &owner,
                    fit: Fit::Grow,
                    source: from,
                    source_id: &source_id,
                    driver: &driver,
                },
            )
            .await
            .unwrap();
        }
    };
    let leak = |s: &str| -> &'static str { Box::leak(s.to_owned().into_boxed_str()) };
    let pool_static = leak(pool);
    // a restore of `restored_from`, live
    let restore = format!("{prefix}restore");
    clone(
        restore.clone(),
        Source::Snapshot {
            pool: pool_static,
            image: leak(&restored_from),
        },
        "pv-restore",
    )
    .await;
    static_pv(&h, "pv-restore", &restore).await;
    // a volume clone, live: its intermediate is not reported
    let cloned = format!("{prefix}clone");
    clone(
        cloned.clone(),
        Source::Volume {
            pool: pool_static,
            image: leak(&source),
        },
        "pv-clone",
    )
    .await;
    static_pv(&h, "pv-clone", &cloned).await;
    let live_intermediate = snapshot::clone_intermediate_name(pool, &cloned);
    // a volume clone whose image went without its intermediate (a crash between the two)
    let vanished = format!("{prefix}vanished");
    clone(
        vanished.clone(),
        Source::Volume {
            pool: pool_static,
            image: leak(&source),
        },
        "pv-vanished",
    )
    .await;
    cluster.remove_image(pool, &vanished).await.unwrap();
    let lost_intermediate = snapshot::clone_intermediate_name(pool, &vanished);

    let made: BTreeSet<String> = [
        &kept,
        &orphan,
        &restored_from,
        &theirs,
        &live_intermediate,
        &lost_intermediate,
    ]
    .into_iter()
    .cloned()
    .collect();
    assert!(made.iter().all(|i| h.images().contains(i)), "{made:?}");

    // dry run: exactly the unreferenced snapshot images and the lost intermediate
    let (out, text) = gc_snap(&h, &identity, &driver, false);
    assert!(out.status.success(), "{text}");
    let expected: BTreeSet<String> = [&orphan, &restored_from, &lost_intermediate]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(listed_internal(&text, &made), expected, "dry run:\n{text}");
    assert!(text.contains("3 orphaned image(s)"), "{text}");
    assert!(
        text.contains("\"orphan\""),
        "the snapshot's name is shown:\n{text}"
    );

    // --delete: the orphan goes, the restore's parent goes to the trash, the restore reads on
    let (out, text) = gc_snap(&h, &identity, &driver, true);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("moved to the trash"), "{text}");
    let now: BTreeSet<String> = h.images().into_iter().collect();
    for gone in &expected {
        assert!(!now.contains(gone), "{gone} still listed:\n{text}");
    }
    for stays in [
        &kept,
        &theirs,
        &live_intermediate,
        &source,
        &restore,
        &cloned,
    ] {
        assert!(now.contains(stays), "{stays} removed:\n{text}");
    }
    let trash = h.ceph.rbd(&["trash", "ls", pool]).unwrap();
    assert!(trash.contains(&restored_from), "{trash}");
    assert_eq!(read_head(&h, &restore), data, "the restore lost its data");
    assert_eq!(read_head(&h, &cloned), data, "the clone lost its data");

    // the content deleted: its snapshot image is an orphan now
    contents(&h)
        .delete("content-kept", &Default::default())
        .await
        .unwrap();
    let (_, text) = gc_snap(&h, &identity, &driver, false);
    assert_eq!(
        listed_internal(&text, &made),
        BTreeSet::from([kept.clone()]),
        "{text}"
    );

    // an orphaned volume with a snapshot: removed, its snapshot (a content refers to it) kept
    // and readable
    let doomed = format!("{prefix}doomed");
    h.ceph
        .rbd(&[
            "import",
            file.to_str().unwrap(),
            &format!("{pool}/{doomed}"),
        ])
        .unwrap();
    record_owner(&h, &doomed, "pv-never-existed", &identity, &kube_cluster);
    let doomed_snap = snapshot::snapshot_image_name(&format!("doomed-{doomed}"));
    snapshot::create_snapshot(
        &cluster,
        &NewSnapshot {
            pool,
            source_image: &doomed,
            image: &doomed_snap,
            owner: &SnapshotOwner {
                name: "doomed".into(),
                source: format!("v1/{}/{pool}/{doomed}", h.ceph.monitors),
                driver: driver.clone(),
                kube_cluster: kube_cluster.clone(),
            },
        },
    )
    .await
    .unwrap();
    content(&h, "content-doomed", &driver, &doomed_snap).await;
    let (out, text) = gc_snap(&h, &identity, &driver, true);
    assert!(out.status.success(), "{text}");
    let now: BTreeSet<String> = h.images().into_iter().collect();
    assert!(!now.contains(&doomed), "{text}");
    assert!(now.contains(&doomed_snap), "{text}");
    assert_eq!(
        read_head(&h, &doomed_snap),
        data,
        "the snapshot lost its data"
    );

    // a cluster without the snapshot CRDs: snapshot images are unknown, never orphans
    let bare = Harness::start().await;
    bare.create_class("rbd", &bare.params(), "Delete").await;
    let (out, text) = gc_snap(&bare, &identity, &driver, false);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("snapshot image(s) not checked"), "{text}");
    assert!(
        !text.contains(&doomed_snap),
        "a snapshot image was judged without the snapshot API:\n{text}"
    );

    // clean up what this test made (children before parents)
    for (image, pv) in [
        (&restore, "pv-restore"),
        (&cloned, "pv-clone"),
        (&source, "pv-source"),
    ] {
        snapshot::delete_volume(
            &cluster,
            pool,
            image,
            &rbd_volume::Claimant::volume(pv),
            &rbd_volume::Hooks::default(),
        )
        .await
        .unwrap();
    }
    for image in [&kept, &theirs, &doomed_snap] {
        snapshot::delete_snapshot(&cluster, pool, image)
            .await
            .unwrap();
    }
}

/// `gc --min-age=0s` at default flags (identity, driver and Kubernetes cluster identity).
fn gc_defaults(h: &Harness, delete: bool) -> (Output, String) {
    gc_run(
        h,
        if delete {
            &["--min-age=0s", "--delete"]
        } else {
            &["--min-age=0s"]
        },
    )
}

/// The snapshot image of the ready VolumeSnapshot `name`.
async fn snapshot_image(h: &Harness, name: &str) -> String {
    let vs = snapshots::wait_ready(h, name).await;
    let content = vs
        .data
        .pointer("/status/boundVolumeSnapshotContentName")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    let content = snapshots::contents(h).get(&content).await.unwrap();
    let handle = content
        .data
        .pointer("/status/snapshotHandle")
        .and_then(|v| v.as_str())
        .unwrap();
    rbd_volume::SnapshotId::parse(handle).unwrap().image
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_in_one_kubernetes_cluster_removes_nothing_of_another_sharing_the_pool() {
    // two Kubernetes clusters (emulators), one Ceph pool, both provisioners at default flags
    let (a, _pa) = snapshots::setup().await;
    let (b, _pb) = snapshots::setup().await;
    let (ka, kb) = (a.kube_cluster_id().await, b.kube_cluster_id().await);
    assert_ne!(ka, kb);
    let pool = a.ceph.pool.clone();
    // in each: a volume, a ready snapshot of it and a clone of it (through an intermediate)
    let mut b_images = Vec::new();
    for (h, images) in [(&a, &mut Vec::new()), (&b, &mut b_images)] {
        h.create_claim("vol", "csi", "16Mi", false).await;
        let (_, vol) = h.wait_bound("vol").await;
        snapshots::create_snapshot(h, "snap", "vol").await;
        images.push(snapshot_image(h, "snap").await);
        snapshots::create_claim_from(h, "clone", "16Mi", "PersistentVolumeClaim", "vol").await;
        let (_, clone) = h.wait_bound("clone").await;
        let clone = Harness::image_name(&clone);
        images.push(rbd_volume::snapshot::clone_intermediate_name(&pool, &clone));
        images.extend([Harness::image_name(&vol), clone]);
    }
    // B: a volume and its snapshot as made before the Kubernetes cluster was recorded
    b.create_claim("old", "csi", "16Mi", false).await;
    let (_, old) = b.wait_bound("old").await;
    snapshots::create_snapshot(&b, "old-snap", "old").await;
    let old_snap = snapshot_image(&b, "old-snap").await;
    let old = Harness::image_name(&old);
    for image in [&old, &old_snap] {
        assert_eq!(
            b.image_meta(image, "provisioner.ceph.com/kube-cluster"),
            Some(kb.clone()),
            "{image}"
        );
        b.ceph
            .rbd(&[
                "image-meta",
                "remove",
                &format!("{pool}/{image}"),
                "provisioner.ceph.com/kube-cluster",
            ])
            .unwrap();
    }
    b_images.extend([old.clone(), old_snap.clone()]);
    // A: a real orphan of its own (a record naming a PV that never existed)
    let prefix = unique_prefix("gk");
    let a_orphan = format!("{prefix}orphan");
    owned_image(
        &a,
        &a_orphan,
        "pvc-33333333-0000-0000-0000-000000000000",
        "ceph.com/rbd",
        &ka,
    );

    let (out, text) = gc_defaults(&a, false);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        listed(&text, &prefix),
        BTreeSet::from([a_orphan.clone()]),
        "{text}"
    );
    for image in &b_images[..b_images.len() - 2] {
        assert!(
            !text.contains(image.as_str()),
            "B's {image} judged:\n{text}"
        );
    }
    for image in [&old, &old_snap] {
        assert!(
            text.lines()
                .any(|l| l.contains("owner cluster unknown") && l.contains(image.as_str())),
            "B's image made before the change not reported as of unknown cluster:\n{text}"
        );
    }
    let (out, text) = gc_defaults(&a, true);
    assert!(out.status.success(), "{text}");
    let now: BTreeSet<String> = a.images().into_iter().collect();
    assert!(!now.contains(&a_orphan), "A's orphan kept:\n{text}");
    for image in &b_images {
        assert!(now.contains(image), "gc in A removed B's {image}:\n{text}");
    }

    // B's snapshots and claims then delete cleanly, old records included
    for h in [&a, &b] {
        snapshots::delete_claim(h, "clone").await;
        snapshots::snapshots(h)
            .delete("snap", &Default::default())
            .await
            .unwrap();
        snapshots::wait_gone(h, &snapshots::snapshots(h), "snap").await;
    }
    snapshots::snapshots(&b)
        .delete("old-snap", &Default::default())
        .await
        .unwrap();
    snapshots::wait_gone(&b, &snapshots::snapshots(&b), "old-snap").await;
    for (h, claim) in [(&a, "vol"), (&b, "vol"), (&b, "old")] {
        snapshots::delete_claim(h, claim).await;
    }
    b.until("B's images removed", Duration::from_secs(30), || async {
        let now: BTreeSet<String> = b.images().into_iter().collect();
        b_images.iter().all(|i| !now.contains(i)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_images_a_pv_came_to_refer_to_during_the_run() {
    let h = Harness::start_on(
        kube_emulator::Emulator::builder()
            .record_requests(true)
            .build(),
    )
    .await;
    let prefix = unique_prefix("gp");
    let identity = format!("gc-pv-{}", &prefix[5..13]);
    let kube_cluster = h.kube_cluster_id().await;
    h.create_class("rbd", &h.params(), "Delete").await;
    // candidates whose record names no PV: one without a record (--include-unrecorded) and one
    // whose record was cut before its PV key
    let unrecorded = format!("{prefix}unrecorded");
    h.ceph
        .rbd(&[
            "create",
            &format!("{}/{unrecorded}", h.ceph.pool),
            "--size",
            "8M",
        ])
        .unwrap();
    let cut = format!("{prefix}cut");
    owned_image(&h, &cut, "pv-x", &identity, &kube_cluster);
    h.ceph
        .rbd(&[
            "image-meta",
            "remove",
            &format!("{}/{cut}", h.ceph.pool),
            "provisioner.ceph.com/pv",
        ])
        .unwrap();
    // gc pauses after its scan listed the PVs; PVs referring to both are saved meanwhile
    // (the admin key is read after the PVs are listed, before any removal)
    h.emu
        .faults()
        .delay_next("get", "secrets", 1, Duration::from_secs(3));
    let gc = std::process::Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
        .args(["gc", "--delete", "--min-age=0s", "--include-unrecorded"])
        .args(["--id", &identity, "--image-name-prefix", &prefix])
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .env_remove("RUST_LOG")
        .env_remove("KUBE_CLUSTER_ID")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    h.until("gc's scan", Duration::from_secs(10), || async {
        h.emu
            .requests()
            .iter()
            .any(|r| r.verb == "get" && r.resource == "secrets")
            .then_some(())
    })
    .await;
    static_pv(&h, "pv-unrecorded", &unrecorded).await;
    static_pv(&h, "pv-cut", &cut).await;
    let out = gc.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let now = h.images();
    for image in [&unrecorded, &cut] {
        assert!(
            now.contains(image),
            "gc removed {image}, which a PV refers to now:\n{text}"
        );
        assert!(
            text.contains(&format!("kept {}/{image}", h.ceph.pool)),
            "{text}"
        );
    }
    assert!(out.status.success(), "{text}");
    for (pv, image) in [("pv-unrecorded", &unrecorded), ("pv-cut", &cut)] {
        h.volumes().delete(pv, &Default::default()).await.unwrap();
        h.ceph
            .rbd(&["rm", &format!("{}/{image}", h.ceph.pool)])
            .unwrap();
    }
}

/// A retained image whose old PV was deleted while attached (its detach could not unpublish)
/// and that a static PV now refers to: its record still names the dead node, which would refuse
/// the volume to every other node. gc lists exactly that node; `--delete` removes it and keeps
/// the node a VolumeAttachment names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_lists_publications_to_nodes_without_a_volume_attachment_and_delete_removes_them() {
    let h = Harness::start().await;
    let prefix = unique_prefix("gcpub");
    let identity = format!("gc-pub-{}", &prefix[8..16]);
    h.create_class("rbd", &h.params(), "Delete").await;
    let image = format!("{prefix}retained");
    let spec = format!("{}/{image}", h.ceph.pool);
    h.ceph.rbd(&["create", &spec, "--size", "8M"]).unwrap();
    let entry =
        |node: &str| format!(r#"{{"node":"{node}","sharing":"multi-node","readonly":true}}"#);
    let record = |nodes: &[&str]| {
        format!(
            "[{}]",
            nodes.iter().map(|n| entry(n)).collect::<Vec<_>>().join(",")
        )
    };
    let key = "provisioner.ceph.com/published-nodes";
    h.ceph
        .rbd(&[
            "image-meta",
            "set",
            &spec,
            key,
            &record(&["node-a", "dead-node"]),
        ])
        .unwrap();
    static_pv(&h, &format!("{prefix}static"), &image).await;
    let vas: kube::Api<k8s_openapi::api::storage::v1::VolumeAttachment> =
        kube::Api::all(h.client.clone());
    let va = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{prefix}va")},
        "spec": {"attacher": "rbd.provisioner.ceph.io", "nodeName": "node-a",
                 "source": {"persistentVolumeName": format!("{prefix}static")}},
    }))
    .unwrap();
    vas.create(&Default::default(), &va).await.unwrap();
    let meta = || {
        serde_json::from_str::<serde_json::Value>(
            h.ceph
                .rbd(&["image-meta", "get", &spec, key])
                .unwrap()
                .trim(),
        )
        .unwrap()
    };

    let (out, text) = gc(&h, &identity, false);
    assert!(out.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains(&image))
        .unwrap_or_else(|| panic!("{image} not listed: {text}"));
    assert!(
        line.split_whitespace().last() == Some("dead-node"),
        "only the dead node is stale: {line}"
    );
    assert!(text.contains("run with --delete"), "{text}");
    assert_eq!(
        meta(),
        serde_json::from_str::<serde_json::Value>(&record(&["node-a", "dead-node"])).unwrap(),
        "the dry run changed the record"
    );

    let (out, text) = gc(&h, &identity, true);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("unpublished {spec} from node dead-node")),
        "{text}"
    );
    assert_eq!(
        meta(),
        serde_json::from_str::<serde_json::Value>(&record(&["node-a"])).unwrap()
    );
    let (_, text) = gc(&h, &identity, false);
    assert!(!text.contains(&image), "{text}");
    h.ceph.rbd(&["rm", "--no-progress", &spec]).unwrap();
}
