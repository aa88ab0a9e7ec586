//! `--librbd-only` (`ceph_rbd::set_librbd_only`): every create, clone, snapshot and removal goes
//! through librbd, none through the RADOS-level paths, and the images are what they would be.
//! In a test binary of its own: the switch is process-wide.

mod common;

use ceph_rbd::{
    CloneJob, CloneRecord, CreateOptions, Features, cloned_without_librbd, created_without_librbd,
    removed_without_librbd,
};
use common::*;

#[tokio::test]
async fn with_the_switch_on_nothing_bypasses_librbd() {
    ceph_rbd::set_librbd_only(true);
    assert!(ceph_rbd::librbd_only());
    let ceph = micro_ceph::cluster();
    let cluster = connect().await;
    let pool = pool_name();
    let source = unique("librbd-only-src");
    let copy = unique("librbd-only-snap");
    let opts = CreateOptions {
        features: Some(
            Features::parse("layering,exclusive-lock,object-map,fast-diff,deep-flatten").unwrap(),
        ),
        ..CreateOptions::default()
    };
    let before = (
        created_without_librbd(),
        cloned_without_librbd(),
        removed_without_librbd(),
    );
    cluster
        .create_image(&pool, &source, 8 << 20, &opts)
        .await
        .unwrap();
    ceph.rbd(&[
        "bench",
        "--io-type",
        "write",
        "--io-size",
        "64K",
        "--io-total",
        "1M",
        &format!("{pool}/{source}"),
    ])
    .unwrap();
    // a snapshot image: temporary snapshot of the source, clone, its own snapshot
    let job = CloneJob {
        parent_pool: pool.clone(),
        parent: source.clone(),
        snap: "tmp".into(),
        temporary: true,
        pool: pool.clone(),
        image: copy.clone(),
        options: opts.clone(),
        snapshot: Some(copy.clone()),
    };
    let cloned = cluster
        .clone_recorded(job, |_| CloneRecord::default())
        .await
        .unwrap();
    assert!(cloned.snapshot.is_some());
    for image in [&source, &copy] {
        ceph.rbd(&["object-map", "check", &format!("{pool}/{image}")])
            .unwrap();
    }
    let diff = ceph
        .rbd(&["diff", "--format", "json", &format!("{pool}/{copy}@{copy}")])
        .unwrap();
    assert_ne!(
        diff.trim(),
        "[]",
        "the snapshot image reads the source's data"
    );
    cluster.snap_remove(&pool, &copy, &copy).await.unwrap();
    cluster.remove_image(&pool, &copy).await.unwrap();
    cluster.remove_image(&pool, &source).await.unwrap();
    assert_eq!(
        (
            created_without_librbd(),
            cloned_without_librbd(),
            removed_without_librbd(),
        ),
        before,
        "an operation bypassed librbd"
    );
    ceph_rbd::set_librbd_only(false);
}
