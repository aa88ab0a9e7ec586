//! Snapshot-based mirroring of an image through librbd's mirroring API, on one micro-ceph
//! cluster (no peer, no `rbd-mirror` daemon): a pool in `image` mode mirrors an image once it
//! is enabled on it; a primary copy takes mirror snapshots, a demoted one refuses them and is
//! promoted again; disabling leaves the image as it was. In a pool without mirroring the
//! enable is refused and changes nothing. Checked against the `rbd` CLI's view.

mod common;

use ceph_rbd::{MirrorImageState, MirrorMode};
use common::*;

/// A pool of its own for mirroring (the shared pool stays without it), in `image` mode.
async fn mirror_pool() -> String {
    let ceph = micro_ceph::cluster();
    let pool = "mirror-image".to_owned();
    ceph.ceph(&["osd", "pool", "create", &pool, "8"]).unwrap();
    ceph.rbd(&["pool", "init", &pool]).unwrap();
    connect()
        .await
        .set_mirror_mode(&pool, MirrorMode::Image)
        .await
        .unwrap();
    // a peer (never reached here): librbd takes mirror snapshots only for a pool with peers
    let info = ceph
        .rbd(&["mirror", "pool", "info", "--format", "json", &pool])
        .unwrap();
    if !info.contains("site-b") {
        ceph.rbd(&[
            "mirror",
            "pool",
            "peer",
            "add",
            &pool,
            "client.admin@site-b",
        ])
        .unwrap();
    }
    pool
}

/// The image's snapshots in the mirror namespace (`rbd snap ls --all`).
fn mirror_snapshots(pool: &str, image: &str) -> Vec<serde_json::Value> {
    cli_snapshots(pool, image)
        .into_iter()
        .filter(|s| s["namespace"]["type"] == "mirror")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_mirrored_by_snapshots_demoted_promoted_and_disabled() {
    let pool = mirror_pool().await;
    let cluster = connect().await;
    assert_eq!(cluster.mirror_mode(&pool).await.unwrap(), MirrorMode::Image);
    let image = unique("mirrored");
    cluster
        .create_image(&pool, &image, 8 << 20, &Default::default())
        .await
        .unwrap();
    let info = cluster.mirror_image_info(&pool, &image).await.unwrap();
    assert_eq!(info.state, MirrorImageState::Disabled);
    assert_eq!(info.snapshot_mode, None);

    cluster.mirror_image_enable(&pool, &image).await.unwrap();
    let info = cluster.mirror_image_info(&pool, &image).await.unwrap();
    assert_eq!(info.state, MirrorImageState::Enabled);
    assert!(info.primary);
    assert_eq!(info.snapshot_mode, Some(true));
    assert!(!info.global_id.is_empty());
    let cli: serde_json::Value = serde_json::from_str(
        &micro_ceph::cluster()
            .rbd(&["info", "--format", "json", &format!("{pool}/{image}")])
            .unwrap(),
    )
    .unwrap();
    assert_eq!(cli["mirroring"]["mode"], "snapshot", "{cli}");
    assert_eq!(cli["mirroring"]["global_id"], info.global_id.as_str());
    // enabling again changes nothing
    cluster.mirror_image_enable(&pool, &image).await.unwrap();

    let before = mirror_snapshots(&pool, &image).len();
    let id = cluster.mirror_image_snapshot(&pool, &image).await.unwrap();
    let snaps = mirror_snapshots(&pool, &image);
    assert_eq!(snaps.len(), before + 1, "{snaps:?}");
    assert!(snaps.iter().any(|s| s["id"] == id), "{snaps:?}");
    let ours = cluster.mirror_snapshots(&pool, &image).await.unwrap();
    assert_eq!(ours.len(), snaps.len());
    let taken = ours.iter().find(|s| s.id == id).unwrap();
    assert!(taken.primary && !taken.demoted, "{taken:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        now.abs_diff(u64::try_from(taken.created).unwrap()) < 120,
        "{taken:?}"
    );

    // without a daemon the status is the image's mirroring and no site up
    let status = cluster.mirror_image_status(&pool, &image).await.unwrap();
    assert_eq!(status.info, info);
    assert!(status.sites.iter().all(|s| !s.up), "{status:?}");

    cluster.mirror_image_demote(&pool, &image).await.unwrap();
    let info = cluster.mirror_image_info(&pool, &image).await.unwrap();
    assert!(!info.primary);
    let newest = cluster.mirror_snapshots(&pool, &image).await.unwrap();
    assert!(
        newest.last().is_some_and(|s| s.primary && s.demoted),
        "a demotion snapshot: {newest:?}"
    );
    assert!(
        cluster.mirror_image_snapshot(&pool, &image).await.is_err(),
        "a non-primary copy takes no mirror snapshot"
    );
    cluster
        .mirror_image_promote(&pool, &image, false)
        .await
        .unwrap();
    assert!(
        cluster
            .mirror_image_info(&pool, &image)
            .await
            .unwrap()
            .primary
    );
    assert!(
        cluster.mirror_image_resync(&pool, &image).await.is_err(),
        "a primary copy is not resynced"
    );

    cluster
        .mirror_image_disable(&pool, &image, false)
        .await
        .unwrap();
    let info = cluster.mirror_image_info(&pool, &image).await.unwrap();
    assert_eq!(info.state, MirrorImageState::Disabled);
    assert!(mirror_snapshots(&pool, &image).is_empty());
    cluster.remove_image(&pool, &image).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_mirroring_refuses_to_mirror_an_image() {
    let (cluster, pool, image) = with_image("unmirrored", 8 << 20).await;
    assert_eq!(
        cluster.mirror_mode(&pool).await.unwrap(),
        MirrorMode::Disabled
    );
    let err = cluster
        .mirror_image_enable(&pool, &image)
        .await
        .expect_err("enabling mirroring in a pool without it");
    assert!(err.to_string().contains(&image), "{err}");
    let info = cluster.mirror_image_info(&pool, &image).await.unwrap();
    assert_eq!(info.state, MirrorImageState::Disabled);
    assert!(mirror_snapshots(&pool, &image).is_empty());
    cluster.remove_image(&pool, &image).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_snapshot_without_a_peer_is_refused_saying_why() {
    let ceph = micro_ceph::cluster();
    let pool = "mirror-no-peer";
    ceph.ceph(&["osd", "pool", "create", pool, "8"]).unwrap();
    ceph.rbd(&["pool", "init", pool]).unwrap();
    let cluster = connect().await;
    cluster
        .set_mirror_mode(pool, MirrorMode::Image)
        .await
        .unwrap();
    let image = unique("peerless");
    cluster
        .create_image(pool, &image, 8 << 20, &Default::default())
        .await
        .unwrap();
    cluster.mirror_image_enable(pool, &image).await.unwrap();
    let before = mirror_snapshots(pool, &image);
    let err = cluster
        .mirror_image_snapshot(pool, &image)
        .await
        .expect_err("a mirror snapshot without a peer");
    assert!(err.to_string().contains("peer cluster"), "{err}");
    assert_eq!(mirror_snapshots(pool, &image), before);
    cluster
        .mirror_image_disable(pool, &image, false)
        .await
        .unwrap();
    cluster.remove_image(pool, &image).await.unwrap();
}
