//! Images an interrupted attempt left half-made, found again by the retry, against a private
//! Ceph cluster: each state built by hand (an image of the right name with a header and no
//! parent, with and without its record; a volume without its object map) or left by a crash
//! at each step of a clone made without librbd (`ceph_rbd::steps`: after the header, after
//! `parent_attach`, after `child_attach`; the crash is a panic in the Ceph call, which skips
//! every undo, as a killed process would). The retry must end with the source's bytes (a
//! digest of `rbd export`), valid object maps (`rbd object-map check`) and the parent
//! snapshot counting the clone as a child (`rbd children`); never an empty restore or
//! snapshot reported done.

mod common;

use std::sync::Arc;

use common::{
    MIB, cluster, delete_volume, digest, owner, plain, pool, snapshot, snapshot_owner, spec, write,
};
use rbd_volume::owner::{META_CLAIM, META_PROVISIONER, META_PV};
use rbd_volume::snapshot::{META_CONTENT_SOURCE, snapshot_image_name};
use rbd_volume::{Claimant, Deleted, Ensured, Hooks, Outcome, Snapshot};

const SIZE: u64 = 16 * MIB;

fn object_map_check(image: &str) {
    let ceph = micro_ceph::cluster();
    ceph.rbd(&["object-map", "check", &spec(image)])
        .unwrap_or_else(|e| panic!("rbd object-map check {image}: {e}"));
    let info = ceph
        .rbd(&["info", "--format", "json", &spec(image)])
        .unwrap();
    assert!(info.contains("\"flags\":[]"), "{image}: {info}");
}

/// Whether `rbd children --all` of `parent@snap` (trashed snapshots included) lists `image`.
fn is_child(parent: &str, image: &str) -> bool {
    let children = micro_ceph::cluster()
        .rbd(&["children", "--all", "--format", "json", &spec(parent)])
        .unwrap();
    children.contains(&format!("\"image\":\"{image}\""))
}

async fn ensure(cluster: &ceph_rbd::Cluster, image: &str) -> Result<Ensured, rbd_volume::Error> {
    common::ensure(cluster, image, SIZE).await
}
fn source_id(snap: &Snapshot) -> String {
    format!("snapshot {}", snap.image)
}

async fn restore(
    cluster: &ceph_rbd::Cluster,
    image: &str,
    snap: &Snapshot,
) -> Result<Ensured, rbd_volume::SnapshotError> {
    common::restore(cluster, image, SIZE, snap).await
}
async fn delete_snapshot(cluster: &ceph_rbd::Cluster, snap: &Snapshot) {
    rbd_volume::delete_snapshot(cluster, pool(), &snap.image)
        .await
        .unwrap();
}

/// A crash (a panic in the Ceph call, no undo) the first time `step` is reached for `image`,
/// until dropped.
fn crash_at(step: &'static str, image: &str) -> ceph_rbd::steps::Installed {
    let target = spec(image);
    let crashed = std::sync::atomic::AtomicBool::new(false);
    ceph_rbd::steps::install(Arc::new(move |reached, at| {
        if reached == step
            && at == target
            && !crashed.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("crash injected at {step} for {target}");
        }
    }))
}

/// A source volume with data in two objects; its digest.
async fn source_with_data(cluster: &ceph_rbd::Cluster, image: &str) -> String {
    ensure(cluster, image).await.unwrap();
    write(image, 0, &format!("the bytes of {image}"));
    write(image, 9 * MIB, "and more of them");
    digest(image)
}

const CLONE_STEPS: [&str; 3] = [
    ceph_rbd::steps::CLONE_AFTER_HEADER,
    ceph_rbd::steps::CLONE_AFTER_PARENT_ATTACH,
    ceph_rbd::steps::CLONE_AFTER_CHILD_ATTACH,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_at_each_step_of_its_clone_is_completed_with_the_snapshots_bytes() {
    let cluster = cluster().await;
    let source = "half-restore-src";
    let want = source_with_data(&cluster, source).await;
    let snap = snapshot(&cluster, source, "half-restore-snap")
        .await
        .unwrap();
    // the source changes after the snapshot: a restore must not see it
    write(source, 0, "written after the snapshot");

    for (n, step) in CLONE_STEPS.into_iter().enumerate() {
        let image = format!("half-restore-{n}");
        {
            let _crash = crash_at(step, &image);
            let first = restore(&cluster, &image, &snap).await;
            assert!(first.is_err(), "{step}: {first:?}");
        }
        // what the crash left
        let parent = cluster.parent(pool(), &image).await.unwrap();
        assert_eq!(
            parent.is_some(),
            step != ceph_rbd::steps::CLONE_AFTER_HEADER,
            "{step}"
        );
        assert_eq!(
            is_child(&snap.image, &image),
            step == ceph_rbd::steps::CLONE_AFTER_CHILD_ATTACH,
            "{step}"
        );

        let again = restore(&cluster, &image, &snap).await.unwrap();
        let outcome = if step == ceph_rbd::steps::CLONE_AFTER_HEADER {
            Outcome::Recreated
        } else {
            Outcome::Adopted
        };
        assert_eq!(
            again,
            Ensured {
                outcome,
                size: SIZE
            },
            "{step}"
        );
        assert_eq!(
            digest(&image),
            want,
            "{step}: the restore holds the snapshot's bytes"
        );
        object_map_check(&image);
        assert!(is_child(&snap.image, &image), "{step}: counted as a child");
        // a second retry reuses it as it is
        let reused = restore(&cluster, &image, &snap).await.unwrap();
        assert_eq!(reused.outcome, Outcome::Reused);
        delete_volume(&cluster, &image).await;
    }
    delete_snapshot(&cluster, &snap).await;
    delete_volume(&cluster, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_cut_at_each_step_of_its_clone_is_completed_at_its_point_in_time() {
    let cluster = cluster().await;
    let source = "half-snap-src";
    source_with_data(&cluster, source).await;

    for (n, step) in CLONE_STEPS.into_iter().enumerate() {
        let want = digest(source);
        let name = format!("half-snap-{n}");
        let image = snapshot_image_name(&name);
        {
            let _crash = crash_at(step, &image);
            let first = snapshot(&cluster, source, &name).await;
            assert!(first.is_err(), "{step}: {first:?}");
        }
        // the source is written between the crash and the retry: the retry completes the
        // snapshot the first attempt took (its temporary snapshot), without this write
        write(source, 0, "written between the crash and the retry");
        let snap = snapshot(&cluster, source, &name).await.unwrap();
        assert_eq!(snap.owner, snapshot_owner(source, &name));
        assert_eq!(
            digest(&format!("{image}@{image}")),
            want,
            "{step}: the snapshot holds the source's bytes when it was taken"
        );
        object_map_check(&image);
        let restored = format!("half-snap-restored-{n}");
        restore(&cluster, &restored, &snap).await.unwrap();
        assert_eq!(digest(&restored), want, "{step}: its restore too");
        delete_volume(&cluster, &restored).await;
        delete_snapshot(&cluster, &snap).await;
        assert!(!cluster.image_exists(pool(), &image).await.unwrap());
    }
    delete_volume(&cluster, source).await;
}

/// An image of the restore's (or snapshot image's) name, size and features, made by hand
/// without a parent, as a clone cut after its header leaves it; with `record`, the record the
/// retry would otherwise write itself (`entries`).
async fn header_without_parent(cluster: &ceph_rbd::Cluster, image: &str, record: &[(&str, &str)]) {
    cluster
        .create_image(pool(), image, SIZE, &plain())
        .await
        .unwrap();
    if !record.is_empty() {
        let entries = record
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        cluster
            .metadata_set_many(pool(), image, entries, None)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_or_snapshot_found_without_its_parent_is_made_again_not_adopted_empty() {
    let cluster = cluster().await;
    let source = "parentless-src";
    let want = source_with_data(&cluster, source).await;
    let snap = snapshot(&cluster, source, "parentless-snap").await.unwrap();
    assert_eq!(digest(&format!("{0}@{0}", snap.image)), want);

    // restores: a header without parent, without and with the volume's record
    for (n, recorded) in [false, true].into_iter().enumerate() {
        let image = format!("parentless-restore-{n}");
        let owner = owner(&image);
        let id = source_id(&snap);
        let mut record = owner.entries();
        record.push((META_CONTENT_SOURCE, &id));
        header_without_parent(&cluster, &image, if recorded { &record } else { &[] }).await;
        let restored = restore(&cluster, &image, &snap).await.unwrap();
        assert_eq!(restored.outcome, Outcome::Recreated, "recorded: {recorded}");
        assert_eq!(
            digest(&image),
            want,
            "recorded: {recorded}: the restore holds the snapshot's bytes"
        );
        object_map_check(&image);
        assert!(is_child(&snap.image, &image));
        delete_volume(&cluster, &image).await;
    }

    // snapshot images: the same, without and with the snapshot's record
    for (n, recorded) in [false, true].into_iter().enumerate() {
        let name = format!("parentless-snap-{n}");
        let image = snapshot_image_name(&name);
        let snapshot_owner = snapshot_owner(source, &name);
        let mut record = vec![(META_PROVISIONER, "-"), (META_CLAIM, ""), (META_PV, "")];
        record.extend(snapshot_owner.entries());
        header_without_parent(&cluster, &image, if recorded { &record } else { &[] }).await;
        let taken = snapshot(&cluster, source, &name).await.unwrap();
        assert_eq!(
            digest(&format!("{image}@{image}")),
            want,
            "recorded: {recorded}: the snapshot holds the source's bytes"
        );
        object_map_check(&image);
        let restored = format!("parentless-snap-restored-{n}");
        restore(&cluster, &restored, &taken).await.unwrap();
        assert_eq!(digest(&restored), want);
        delete_volume(&cluster, &restored).await;
        delete_snapshot(&cluster, &taken).await;
    }

    // without its source there is nothing to clone again: refused, and the image is kept
    let orphan = "parentless-orphan";
    header_without_parent(&cluster, orphan, &[]).await;
    delete_snapshot(&cluster, &snap).await;
    let refused = restore(&cluster, orphan, &snap).await.unwrap_err();
    assert!(
        matches!(refused, rbd_volume::SnapshotError::NotFound(_)),
        "{refused}"
    );
    assert!(cluster.image_exists(pool(), orphan).await.unwrap());
    cluster.remove_image(pool(), orphan).await.unwrap();
    delete_volume(&cluster, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_found_without_its_object_map_gets_it_rebuilt_from_its_objects() {
    let cluster = cluster().await;
    let ceph = micro_ceph::cluster();

    // a create cut between the header and the object map
    let cut = "no-map-cut";
    {
        let _crash = crash_at(ceph_rbd::steps::CREATE_AFTER_HEADER, cut);
        assert!(ensure(&cluster, cut).await.is_err());
    }
    let object_map = format!("rbd_object_map.{}", image_id(cut));
    assert!(
        ceph.rados(&["-p", pool(), "stat", &object_map]).is_err(),
        "the crash left no object map"
    );
    let again = ensure(&cluster, cut).await.unwrap();
    assert_eq!(again.outcome, Outcome::Adopted);
    object_map_check(cut);
    write(cut, 5 * MIB, "written after the repair");
    object_map_check(cut);
    delete_volume(&cluster, cut).await;

    // a volume with data whose object map object is gone
    let lost = "no-map-lost";
    let want = source_with_data(&cluster, lost).await;
    let object_map = format!("rbd_object_map.{}", image_id(lost));
    ceph.rados(&["-p", pool(), "rm", &object_map]).unwrap();
    let again = ensure(&cluster, lost).await.unwrap();
    assert_eq!(again.outcome, Outcome::Reused);
    object_map_check(lost);
    assert_eq!(
        digest(lost),
        want,
        "rebuilt from the objects: every byte kept"
    );

    // opened by librbd meanwhile, which makes an empty map and flags it invalid
    ceph.rados(&["-p", pool(), "rm", &object_map]).unwrap();
    write(lost, 12 * MIB, "written through the invalid map");
    let want = digest(lost);
    let info = ceph
        .rbd(&["info", "--format", "json", &spec(lost)])
        .unwrap();
    assert!(info.contains("object map invalid"), "{info}");
    let again = ensure(&cluster, lost).await.unwrap();
    assert_eq!(again.outcome, Outcome::Reused);
    object_map_check(lost);
    assert_eq!(digest(lost), want);
    delete_volume(&cluster, lost).await;
}

/// The ID of `image`, from `rbd info`.
fn image_id(image: &str) -> String {
    let info = micro_ceph::cluster()
        .rbd(&["info", "--format", "json", &spec(image)])
        .unwrap();
    info.split("\"id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned()
}

/// Every object of the image whose ID is `id`, and its ID object.
fn objects_of(image: &str, id: &str) -> Vec<String> {
    micro_ceph::cluster()
        .rados(&["-p", pool(), "ls"])
        .unwrap()
        .lines()
        .filter(|l| l.contains(id) || *l == format!("rbd_id.{image}"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_cut_after_the_data_or_the_header_is_finished_by_the_retry() {
    let cluster = cluster().await;
    for step in [
        ceph_rbd::steps::REMOVE_PROBED,
        ceph_rbd::steps::REMOVE_AFTER_DATA,
        ceph_rbd::steps::REMOVE_AFTER_HEADER,
    ] {
        let image = format!("cut-removal-{}", step.rsplit('-').next().unwrap());
        source_with_data(&cluster, &image).await;
        let id = image_id(&image);
        {
            let _crash = crash_at(step, &image);
            let first = rbd_volume::delete_volume(
                &cluster,
                pool(),
                &image,
                &Claimant::image(),
                &Hooks::default(),
            )
            .await;
            assert!(first.is_err(), "{step}: {first:?}");
        }
        assert!(
            !objects_of(&image, &id).is_empty(),
            "{step}: something is left"
        );
        let again = rbd_volume::delete_volume(
            &cluster,
            pool(),
            &image,
            &Claimant::image(),
            &Hooks::default(),
        )
        .await
        .unwrap();
        assert!(
            matches!(again, Deleted::Removed | Deleted::AlreadyGone),
            "{step}: {again:?}"
        );
        assert_eq!(
            objects_of(&image, &id),
            Vec::<String>::new(),
            "{step}: left behind"
        );
        assert!(
            !cluster.list_images(pool()).await.unwrap().contains(&image),
            "{step}: still listed"
        );
    }
}
