//! Snapshots and clones through the Controller service over a real unix socket against a
//! private Ceph cluster, data checked with python-rbd (librbd, not our code): snapshot IDs,
//! idempotency and ALREADY_EXISTS, restore and clone with the source's data, a larger restore
//! grown, listing by ID / source / all with pagination that survives a deletion between pages,
//! deleting the source or the snapshot while dependents exist, and the input errors.

mod common;

use common::controller::{MIB, create_request, image_size, secrets, server};
use common::data::{read, write};
use common::strings;
use rbd_csi::proto::csi;
use rbd_csi::proto::csi::controller_client::ControllerClient;
use tonic::Code;
use tonic::transport::Channel;

async fn volume(ctl: &mut ControllerClient<Channel>, name: &str, size: i64) -> csi::Volume {
    ctl.create_volume(create_request(name, size))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

fn snapshot_request(name: &str, source: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        name: name.into(),
        source_volume_id: source.into(),
        secrets: secrets(),
        parameters: Default::default(),
    }
}

async fn snapshot(ctl: &mut ControllerClient<Channel>, name: &str, source: &str) -> csi::Snapshot {
    ctl.create_snapshot(snapshot_request(name, source))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

fn from_snapshot(name: &str, size: i64, snapshot_id: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, size);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot_id.into(),
            },
        )),
    });
    req
}

fn from_volume(name: &str, size: i64, volume_id: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, size);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: volume_id.into(),
            },
        )),
    });
    req
}

async fn list(
    ctl: &mut ControllerClient<Channel>,
    req: csi::ListSnapshotsRequest,
) -> (Vec<String>, String) {
    let resp = ctl
        .list_snapshots(csi::ListSnapshotsRequest {
            secrets: secrets(),
            ..req
        })
        .await
        .unwrap()
        .into_inner();
    (
        resp.entries
            .into_iter()
            .map(|e| e.snapshot.unwrap().snapshot_id)
            .collect(),
        resp.next_token,
    )
}

async fn delete_volume(ctl: &mut ControllerClient<Channel>, volume_id: &str) {
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: volume_id.into(),
        secrets: secrets(),
    })
    .await
    .unwrap();
}

async fn delete_snapshot(ctl: &mut ControllerClient<Channel>, snapshot_id: &str) {
    ctl.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snapshot_id.into(),
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn snapshot_restore_and_clone_keep_the_data_and_survive_deleting_their_sources() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let ceph = micro_ceph::cluster();
    let source = volume(&mut ctl, "pvc-snap-src", 8 * MIB).await;
    write("pvc-snap-src", 0, "written before the snapshot");

    let snap = snapshot(&mut ctl, "snapshot-grpc-1", &source.volume_id).await;
    assert!(snap.ready_to_use);
    assert_eq!(snap.size_bytes, 8 * MIB);
    assert_eq!(snap.source_volume_id, source.volume_id);
    assert!(snap.creation_time.is_some_and(|t| t.seconds > 0));
    assert!(
        snap.snapshot_id
            .starts_with(&format!("s1/{}/{}/csi-snap-", ceph.monitors, ceph.pool)),
        "{}",
        snap.snapshot_id
    );
    assert!(snap.snapshot_id.len() <= 128);
    // idempotent; the same name for another source is ALREADY_EXISTS
    assert_eq!(
        snapshot(&mut ctl, "snapshot-grpc-1", &source.volume_id).await,
        snap
    );
    let other = volume(&mut ctl, "pvc-snap-other", 8 * MIB).await;
    let err = ctl
        .create_snapshot(snapshot_request("snapshot-grpc-1", &other.volume_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    write("pvc-snap-src", 0, "WRITTEN AFTER  the snapshot");
    // a restore larger than the source is grown, and says where it came from
    let restored = ctl
        .create_volume(from_snapshot(
            "pvc-snap-restore",
            16 * MIB,
            &snap.snapshot_id,
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(restored.capacity_bytes, 16 * MIB);
    assert_eq!(image_size("pvc-snap-restore"), Some(16 << 20));
    assert!(matches!(
        restored.content_source.as_ref().and_then(|s| s.r#type.as_ref()),
        Some(csi::volume_content_source::Type::Snapshot(s)) if s.snapshot_id == snap.snapshot_id
    ));
    assert_eq!(
        read("pvc-snap-restore", 0, 27),
        "written before the snapshot"
    );
    // a volume clone has the source's current data
    let cloned = ctl
        .create_volume(from_volume("pvc-snap-clone", 8 * MIB, &source.volume_id))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(cloned.content_source.is_some());
    assert_eq!(read("pvc-snap-clone", 0, 27), "WRITTEN AFTER  the snapshot");

    // the source goes while a snapshot, a restore and a clone of it exist
    delete_volume(&mut ctl, &source.volume_id).await;
    assert_eq!(image_size("pvc-snap-src"), None);
    let (found, _) = list(
        &mut ctl,
        csi::ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(found, std::slice::from_ref(&snap.snapshot_id));
    assert_eq!(
        read("pvc-snap-restore", 0, 27),
        "written before the snapshot"
    );
    assert_eq!(read("pvc-snap-clone", 0, 27), "WRITTEN AFTER  the snapshot");
    let late = volume_from(&mut ctl, "pvc-snap-late", &snap.snapshot_id).await;
    assert_eq!(read("pvc-snap-late", 0, 27), "written before the snapshot");

    // the snapshot goes while restores of it exist: they keep their data
    delete_snapshot(&mut ctl, &snap.snapshot_id).await;
    let (found, _) = list(
        &mut ctl,
        csi::ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert!(found.is_empty(), "{found:?}");
    let err = ctl
        .create_volume(from_snapshot("pvc-snap-gone", 8 * MIB, &snap.snapshot_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert_eq!(
        read("pvc-snap-restore", 0, 27),
        "written before the snapshot"
    );
    delete_snapshot(&mut ctl, &snap.snapshot_id).await;

    for v in [&restored, &cloned, &late, &other] {
        delete_volume(&mut ctl, &v.volume_id).await;
    }
    // nothing of this test is left: no image, no snapshot image, no trash entry
    let snap_image = snap.snapshot_id.rsplit('/').next().unwrap().to_owned();
    let ours =
        |i: &str| i.starts_with("pvc-snap-") || i == snap_image || i.starts_with("csi-clone-");
    let images = ceph.rbd(&["ls", &ceph.pool]).unwrap();
    let left: Vec<&str> = images.lines().filter(|i| ours(i)).collect();
    assert!(left.is_empty(), "images left: {left:?}");
    let trash = ceph.rbd(&["trash", "ls", &ceph.pool]).unwrap();
    let left: Vec<&str> = trash
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|i| ours(i))
        .collect();
    assert!(left.is_empty(), "trash left: {left:?}");
}

async fn volume_from(
    ctl: &mut ControllerClient<Channel>,
    name: &str,
    snapshot_id: &str,
) -> csi::Volume {
    ctl.create_volume(from_snapshot(name, 0, snapshot_id))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

#[tokio::test]
async fn listing_filters_and_pages_survive_a_deletion_between_pages() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let a = volume(&mut ctl, "pvc-list-a", 4 * MIB).await;
    let b = volume(&mut ctl, "pvc-list-b", 4 * MIB).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            snapshot(&mut ctl, &format!("list-a-{i}"), &a.volume_id)
                .await
                .snapshot_id,
        );
    }
    let on_b = snapshot(&mut ctl, "list-b-0", &b.volume_id)
        .await
        .snapshot_id;
    ids.sort();

    let (by_source, _) = list(
        &mut ctl,
        csi::ListSnapshotsRequest {
            source_volume_id: a.volume_id.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(by_source, ids);
    let (all, token) = list(&mut ctl, csi::ListSnapshotsRequest::default()).await;
    assert!(token.is_empty());
    for id in ids.iter().chain([&on_b]) {
        assert!(all.contains(id), "{id} missing from {all:?}");
    }
    // unknown IDs list nothing
    for req in [
        csi::ListSnapshotsRequest {
            snapshot_id: "none-exist-id".into(),
            ..Default::default()
        },
        csi::ListSnapshotsRequest {
            source_volume_id: format!(
                "v1/{}/{}/pvc-no-such-volume",
                micro_ceph::cluster().monitors,
                micro_ceph::cluster().pool
            ),
            ..Default::default()
        },
    ] {
        assert!(list(&mut ctl, req).await.0.is_empty());
    }

    // page 1 of size 1, then its last entry is deleted: page 2 starts after it anyway
    let (page1, token) = list(
        &mut ctl,
        csi::ListSnapshotsRequest {
            source_volume_id: a.volume_id.clone(),
            max_entries: 1,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(page1, ids[..1]);
    assert_eq!(token, ids[0]);
    delete_snapshot(&mut ctl, &ids[0]).await;
    let (page2, token) = list(
        &mut ctl,
        csi::ListSnapshotsRequest {
            source_volume_id: a.volume_id.clone(),
            starting_token: token,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(page2, ids[1..]);
    assert!(token.is_empty());
    let err = ctl
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: "not-a-token".into(),
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    let err = ctl
        .list_snapshots(csi::ListSnapshotsRequest {
            max_entries: -1,
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("max_entries"), "{err:?}");

    for id in &ids[1..] {
        delete_snapshot(&mut ctl, id).await;
    }
    delete_snapshot(&mut ctl, &on_b).await;
    delete_volume(&mut ctl, &a.volume_id).await;
    delete_volume(&mut ctl, &b.volume_id).await;
}

#[tokio::test]
async fn bad_snapshot_and_content_source_input_is_refused_naming_the_field() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let cases = [
        (
            snapshot_request("", "v1/m/p/i"),
            Code::InvalidArgument,
            "name",
        ),
        (
            snapshot_request("s", ""),
            Code::InvalidArgument,
            "source_volume_id",
        ),
        (
            snapshot_request("s", "not-a-volume"),
            Code::NotFound,
            "source_volume_id",
        ),
        (
            csi::CreateSnapshotRequest {
                parameters: strings(&[("pool", "x")]),
                ..snapshot_request("s", "v1/m/p/i")
            },
            Code::InvalidArgument,
            "\"pool\"",
        ),
    ];
    for (req, code, field) in cases {
        let err = ctl.create_snapshot(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{err:?}");
        assert!(err.message().contains(field), "{err:?}");
    }
    let err = ctl
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: String::new(),
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("snapshot_id"));
    // an ID that is not ours: nothing to delete
    delete_snapshot(&mut ctl, "reallyfakesnapshotid").await;

    let err = ctl
        .create_volume(from_snapshot("pvc-bad-src", 4 * MIB, ""))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("volume_content_source.snapshot.snapshot_id")
    );
    let ceph = micro_ceph::cluster();
    let missing_snap = format!(
        "s1/{}/{}/csi-snap-00000000000000000000000000000000",
        ceph.monitors, ceph.pool
    );
    let missing_volume = format!("v1/{}/{}/pvc-no-such-source", ceph.monitors, ceph.pool);
    for req in [
        from_snapshot("pvc-bad-src", 4 * MIB, &missing_snap),
        from_snapshot("pvc-bad-src", 4 * MIB, "non-existing-snapshot-id"),
        from_volume("pvc-bad-src", 4 * MIB, &missing_volume),
    ] {
        let err = ctl.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err:?}");
    }
    assert_eq!(image_size("pvc-bad-src"), None, "nothing was created");

    use csi::controller_service_capability::{Type, rpc};
    let caps: Vec<i32> = ctl
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(r)| r.r#type))
        .collect();
    for want in [
        rpc::Type::CreateDeleteSnapshot,
        rpc::Type::ListSnapshots,
        rpc::Type::CloneVolume,
    ] {
        assert!(caps.contains(&(want as i32)), "missing {want:?}");
    }
}
