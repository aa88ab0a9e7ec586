//! Volume group snapshots through the GroupController service over a real unix socket against a
//! private Ceph cluster, data checked with python-rbd (librbd, not our code): every member holds
//! its source's data of the one instant, restores from members read it, the sources end in no
//! RBD group, retries are idempotent, another source set under the same name is ALREADY_EXISTS,
//! `snapshot_ids` mismatches are INVALID_ARGUMENT, and the delete removes every member while
//! restores keep working.

mod common;

use common::controller::{MIB, create_request, secrets, server};
use common::data::{read, write};
use rbd_csi::proto::csi;
use rbd_csi::proto::csi::controller_client::ControllerClient;
use rbd_csi::proto::csi::group_controller_client::GroupControllerClient;
use tonic::Code;
use tonic::transport::Channel;

async fn volume(ctl: &mut ControllerClient<Channel>, name: &str) -> csi::Volume {
    ctl.create_volume(create_request(name, 8 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

fn image_of(volume_id: &str) -> &str {
    volume_id.rsplit('/').next().unwrap()
}

fn create_request_for(name: &str, sources: &[&str]) -> csi::CreateVolumeGroupSnapshotRequest {
    csi::CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: sources.iter().map(|s| (*s).to_owned()).collect(),
        secrets: secrets(),
        parameters: Default::default(),
    }
}

fn get_request(id: &str, snapshot_ids: &[String]) -> csi::GetVolumeGroupSnapshotRequest {
    csi::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: snapshot_ids.to_vec(),
        secrets: secrets(),
    }
}

fn delete_request(id: &str, snapshot_ids: &[String]) -> csi::DeleteVolumeGroupSnapshotRequest {
    csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.into(),
        snapshot_ids: snapshot_ids.to_vec(),
        secrets: secrets(),
    }
}

fn restore_request(name: &str, snapshot_id: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, 8 * MIB);
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot_id.into(),
            },
        )),
    });
    req
}

fn rbd_lines(args: &[&str]) -> Vec<String> {
    micro_ceph::cluster()
        .rbd(args)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_group_snapshot_holds_one_instant_of_every_volume_and_restores_from_it() {
    let srv = server().await;
    let mut ctl = srv.controller().await;
    let mut groups = GroupControllerClient::new(srv.channel().await);
    let pool = micro_ceph::cluster().pool.clone();

    let caps = groups
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert_eq!(caps.len(), 1, "{caps:?}");

    let a = volume(&mut ctl, "grp-src-a").await.volume_id;
    let b = volume(&mut ctl, "grp-src-b").await.volume_id;
    write(image_of(&a), 4096, "a-before");
    write(image_of(&b), 3 * MIB as u64, "b-before");

    let group = groups
        .create_volume_group_snapshot(create_request_for("group-1", &[&a, &b]))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert!(group.group_snapshot_id.starts_with("g1/"), "{group:?}");
    assert!(group.ready_to_use && group.creation_time.is_some());
    assert_eq!(group.snapshots.len(), 2);
    let mut sources: Vec<&str> = group
        .snapshots
        .iter()
        .map(|s| s.source_volume_id.as_str())
        .collect();
    sources.sort_unstable();
    assert_eq!(sources, [a.as_str(), b.as_str()]);
    for s in &group.snapshots {
        assert_eq!(s.group_snapshot_id, group.group_snapshot_id);
        assert!(s.ready_to_use && s.snapshot_id.starts_with("s1/"));
        assert_eq!(s.size_bytes, 8 * MIB);
    }
    let member_of = |source: &str| -> String {
        group
            .snapshots
            .iter()
            .find(|s| s.source_volume_id == source)
            .unwrap()
            .snapshot_id
            .clone()
    };
    let snapshot_ids: Vec<String> = group
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect();

    // written after the group snapshot: in the sources only
    write(image_of(&a), 4096, "a-after!");
    write(image_of(&b), 3 * MIB as u64, "b-after!");
    // the sources are in no RBD group and keep no snapshot; no group is left (of this test's:
    // the other test of this file makes groups in the same pool at the same time)
    let rbd_group = rbd_volume::group::group_name("group-1");
    assert!(!rbd_lines(&["group", "ls", &pool]).contains(&rbd_group));
    for source in [&a, &b] {
        let spec = format!("{pool}/{}", image_of(source));
        assert_eq!(
            rbd_lines(&["snap", "ls", "--all", &spec]),
            Vec::<String>::new()
        );
    }

    // a retry returns the same group snapshot; other sources under the name are refused
    let again = groups
        .create_volume_group_snapshot(create_request_for("group-1", &[&b, &a]))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again.group_snapshot_id, group.group_snapshot_id);
    let mut again_ids: Vec<String> = again
        .snapshots
        .iter()
        .map(|s| s.snapshot_id.clone())
        .collect();
    again_ids.sort();
    let mut ids_sorted = snapshot_ids.clone();
    ids_sorted.sort();
    assert_eq!(again_ids, ids_sorted);
    let err = groups
        .create_volume_group_snapshot(create_request_for("group-1", &[&a]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // each member restores its source's data of the instant
    let ra = ctl
        .create_volume(restore_request("grp-restore-a", &member_of(&a)))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let rb = ctl
        .create_volume(restore_request("grp-restore-b", &member_of(&b)))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    assert_eq!(read(image_of(&ra), 4096, 8), "a-before");
    assert_eq!(read(image_of(&rb), 3 * MIB as u64, 8), "b-before");
    assert_eq!(read(image_of(&a), 4096, 8), "a-after!");

    // Get: with the members' IDs, without, and a mismatch
    let got = groups
        .get_volume_group_snapshot(get_request(&group.group_snapshot_id, &snapshot_ids))
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(got.group_snapshot_id, group.group_snapshot_id);
    assert!(got.ready_to_use && got.snapshots.len() == 2);
    let err = groups
        .get_volume_group_snapshot(get_request(&group.group_snapshot_id, &snapshot_ids[..1]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    // Delete: a list missing a member is refused and deletes nothing
    let err = groups
        .delete_volume_group_snapshot(delete_request(&group.group_snapshot_id, &snapshot_ids[1..]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("csi-snap-"), "{err:?}");
    groups
        .get_volume_group_snapshot(get_request(&group.group_snapshot_id, &[]))
        .await
        .unwrap();
    groups
        .delete_volume_group_snapshot(delete_request(&group.group_snapshot_id, &snapshot_ids))
        .await
        .unwrap();
    let err = groups
        .get_volume_group_snapshot(get_request(&group.group_snapshot_id, &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    groups
        .delete_volume_group_snapshot(delete_request(&group.group_snapshot_id, &snapshot_ids))
        .await
        .unwrap();
    for id in &snapshot_ids {
        let image = image_of(id).to_owned();
        assert!(
            !rbd_lines(&["ls", &pool]).contains(&image),
            "member {image} still listed"
        );
    }
    // the restores keep their data
    assert_eq!(read(image_of(&ra), 4096, 8), "a-before");
    assert_eq!(read(image_of(&rb), 3 * MIB as u64, 8), "b-before");

    for id in [&ra, &rb, &a, &b] {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            secrets: secrets(),
        })
        .await
        .unwrap();
    }
    let leftovers: Vec<String> = rbd_lines(&["trash", "ls", &pool])
        .into_iter()
        .filter(|l| l.contains("csi-snap-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn bad_group_snapshot_input_is_refused_naming_the_field() {
    let srv = server().await;
    let mut ctl = srv.controller().await;
    let mut groups = GroupControllerClient::new(srv.channel().await);
    let a = volume(&mut ctl, "grp-bad-a").await.volume_id;
    let pool = micro_ceph::cluster().pool.clone();
    let other_pool = a.replace(&format!("/{pool}/"), "/other-pool/");
    let cases: Vec<(csi::CreateVolumeGroupSnapshotRequest, Code, &str)> = vec![
        (create_request_for("", &[&a]), Code::InvalidArgument, "name"),
        (
            create_request_for("g-bad", &[]),
            Code::InvalidArgument,
            "source_volume_ids",
        ),
        (
            create_request_for("g-bad", &[&a, &a]),
            Code::InvalidArgument,
            "source_volume_ids[1]",
        ),
        (
            create_request_for("g-bad", &[&a, "not-a-volume-id"]),
            Code::NotFound,
            "source_volume_ids[1]",
        ),
        (
            create_request_for("g-bad", &[&a, &a.replace("grp-bad-a", "grp-bad-missing")]),
            Code::NotFound,
            "grp-bad-missing",
        ),
        (
            create_request_for("g-bad", &[&a, &other_pool]),
            Code::FailedPrecondition,
            "one pool",
        ),
        (
            csi::CreateVolumeGroupSnapshotRequest {
                parameters: [("color".to_owned(), "blue".to_owned())].into(),
                ..create_request_for("g-bad", &[&a])
            },
            Code::InvalidArgument,
            "\"color\"",
        ),
    ];
    for (req, code, needle) in cases {
        let err = groups.create_volume_group_snapshot(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{err:?}");
        assert!(err.message().contains(needle), "{needle}: {err:?}");
    }
    // nothing was left by the refused calls: no group (the other test of this file makes its
    // own in the same pool at the same time), no member
    let rbd_group = rbd_volume::group::group_name("g-bad");
    assert!(!rbd_lines(&["group", "ls", &pool]).contains(&rbd_group));
    let err = groups
        .get_volume_group_snapshot(get_request("", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = groups
        .get_volume_group_snapshot(get_request("g1/m/rbd/pvc-1", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = groups
        .delete_volume_group_snapshot(delete_request("", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    groups
        .delete_volume_group_snapshot(delete_request("not-a-group-id", &[]))
        .await
        .unwrap();
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: a,
        secrets: secrets(),
    })
    .await
    .unwrap();
}
