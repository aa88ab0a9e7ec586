//! Concurrent snapshot requests on one source volume queue for the image instead of being
//! refused: 16 CreateSnapshot calls at once all succeed at their first attempt (no ABORTED) and
//! leave no user snapshot on the source (each temporary snapshot is removed once its snapshot
//! image holds it), 16 DeleteSnapshot calls at once succeed too, and once the source is deleted
//! the pool holds exactly what it held before (images and trash). Own test binary: its micro-ceph
//! serves nothing else.

mod common;

use std::collections::BTreeSet;

use common::controller::{MIB, create_request, secrets, server};
use rbd_csi::proto::csi;

fn pool_contents() -> BTreeSet<String> {
    let cluster = micro_ceph::cluster();
    let images = cluster.rbd(&["ls", &cluster.pool]).unwrap();
    let trash = cluster.rbd(&["trash", "ls", &cluster.pool]).unwrap();
    images
        .lines()
        .map(|l| format!("image {l}"))
        .chain(trash.lines().map(|l| format!("trash {l}")))
        .collect()
}

#[tokio::test]
async fn sixteen_concurrent_snapshots_of_one_source_all_succeed_and_leave_nothing_behind() {
    const N: usize = 16;
    let server = server().await;
    let before = pool_contents();
    let mut ctl = server.controller().await;
    let source = ctl
        .create_volume(create_request("queue-source", 16 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    let creates = (0..N).map(|i| {
        let mut ctl = ctl.clone();
        let source = source.volume_id.clone();
        tokio::spawn(async move {
            ctl.create_snapshot(csi::CreateSnapshotRequest {
                name: format!("queue-snap-{i}"),
                source_volume_id: source,
                secrets: secrets(),
                parameters: Default::default(),
            })
            .await
        })
    });
    let mut snapshot_ids = Vec::new();
    for task in futures::future::join_all(creates).await {
        let snapshot = task
            .unwrap()
            .unwrap_or_else(|e| panic!("CreateSnapshot refused: {e:?}"))
            .into_inner()
            .snapshot
            .unwrap();
        assert!(snapshot.ready_to_use);
        snapshot_ids.push(snapshot.snapshot_id);
    }
    let distinct: BTreeSet<_> = snapshot_ids.iter().collect();
    assert_eq!(distinct.len(), N);
    let cluster = micro_ceph::cluster();
    let source_image = source.volume_id.rsplit('/').next().unwrap();
    let user_snapshots = cluster
        .rbd(&["snap", "ls", &format!("{}/{source_image}", cluster.pool)])
        .unwrap();
    assert_eq!(
        user_snapshots.trim(),
        "",
        "temporary snapshots left on the source"
    );

    let deletes = snapshot_ids.iter().map(|id| {
        let mut ctl = ctl.clone();
        let id = id.clone();
        tokio::spawn(async move {
            ctl.delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: id,
                secrets: secrets(),
            })
            .await
        })
    });
    for task in futures::future::join_all(deletes).await {
        task.unwrap()
            .unwrap_or_else(|e| panic!("DeleteSnapshot refused: {e:?}"));
    }
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: source.volume_id.clone(),
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert_eq!(pool_contents(), before);
}
