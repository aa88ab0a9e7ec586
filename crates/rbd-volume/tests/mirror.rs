//! The volume core's mirroring steps refuse what cannot be mirrored by snapshots, naming the
//! reason and changing nothing: an image in a pool without mirroring, an image mirrored by
//! journaling. (Replication between two sites: `rbd-provisioner`'s `mirroring` test.)

mod common;

use ceph_rbd::{MirrorImageState, MirrorMode};
use common::*;
use rbd_volume::mirror::{self, MirrorError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_in_a_pool_without_mirroring_is_refused_and_left_alone() {
    let cluster = cluster().await;
    let image = "mirror-refused";
    cluster
        .create_image(pool(), image, 8 << 20, &plain())
        .await
        .unwrap();
    let err = mirror::enable(&cluster, pool(), image)
        .await
        .expect_err("a pool without mirroring");
    assert!(
        matches!(&err, MirrorError::PoolNotMirrored { pool: p, mode: "disabled" } if p == pool()),
        "{err}"
    );
    assert!(err.to_string().contains("rbd mirror pool enable"), "{err}");
    let info = cluster.mirror_image_info(pool(), image).await.unwrap();
    assert_eq!(info.state, MirrorImageState::Disabled);
    cluster.remove_image(pool(), image).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_mirrored_by_journaling_is_refused() {
    let ceph = micro_ceph::cluster();
    let pool = "mirror-journal";
    ceph.ceph(&["osd", "pool", "create", pool, "8"]).unwrap();
    ceph.rbd(&["pool", "init", pool]).unwrap();
    let cluster = cluster().await;
    cluster
        .set_mirror_mode(pool, MirrorMode::Image)
        .await
        .unwrap();
    let image = "journaled";
    ceph.rbd(&[
        "create",
        "--size",
        "8M",
        "--image-feature",
        "layering,exclusive-lock,journaling",
        &format!("{pool}/{image}"),
    ])
    .unwrap();
    ceph.rbd(&[
        "mirror",
        "image",
        "enable",
        &format!("{pool}/{image}"),
        "journal",
    ])
    .unwrap();
    let err = mirror::enable(&cluster, pool, image)
        .await
        .expect_err("journal-based mirroring");
    assert!(matches!(err, MirrorError::JournalMode { .. }), "{err}");
    let info = cluster.mirror_image_info(pool, image).await.unwrap();
    assert_eq!(
        info.snapshot_mode,
        Some(false),
        "still mirrored by journaling"
    );
    cluster
        .mirror_image_disable(pool, image, false)
        .await
        .unwrap();
    cluster.remove_image(pool, image).await.unwrap();
}
