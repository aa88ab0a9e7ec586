//! `ListVolumes` and `ControllerModifyVolume` over a real unix socket against a private Ceph
//! cluster: only this driver's volumes are listed (never snapshot images), pages continue after
//! a deleted token, a broken image is listed as abnormal, bad tokens are ABORTED; QoS limits
//! land in the image's librbd configuration (`rbd config image get`), only the keys given
//! change, and unknown keys or bad values are INVALID_ARGUMENT naming them, with nothing
//! created or changed.

mod common;

use common::controller::{MIB, create_request, secrets, server};
use rbd_csi::proto::csi;
use rbd_csi::proto::csi::controller_client::ControllerClient;
use tonic::Code;
use tonic::transport::Channel;

async fn volume(ctl: &mut ControllerClient<Channel>, name: &str) -> String {
    ctl.create_volume(create_request(name, 4 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

async fn delete(ctl: &mut ControllerClient<Channel>, volume_id: &str) {
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: volume_id.into(),
        secrets: secrets(),
    })
    .await
    .unwrap();
}

/// One page of at most `max_entries` (0: all) after `starting_token`, and the next token.
async fn page(
    ctl: &mut ControllerClient<Channel>,
    max_entries: i32,
    starting_token: &str,
) -> (Vec<csi::list_volumes_response::Entry>, String) {
    let resp = ctl
        .list_volumes(csi::ListVolumesRequest {
            max_entries,
            starting_token: starting_token.into(),
        })
        .await
        .unwrap()
        .into_inner();
    (resp.entries, resp.next_token)
}

fn id_of(entry: &csi::list_volumes_response::Entry) -> &str {
    &entry.volume.as_ref().unwrap().volume_id
}

fn image_of(volume_id: &str) -> &str {
    volume_id.rsplit('/').next().unwrap()
}

/// The IDs of the listed volumes whose image starts with `prefix`, in listing order.
async fn all_ids(ctl: &mut ControllerClient<Channel>, prefix: &str) -> Vec<String> {
    let (entries, _) = page(ctl, 0, "").await;
    entries
        .iter()
        .map(id_of)
        .filter(|id| image_of(id).starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn list_volumes_lists_our_volumes_in_pages_that_survive_deletions() {
    let srv = server().await;
    let mut ctl = srv.controller().await;
    let pool = micro_ceph::cluster().pool.clone();
    let mut ids = Vec::new();
    for name in ["lv-a", "lv-b", "lv-c", "lv-d"] {
        ids.push(volume(&mut ctl, name).await);
    }
    // a snapshot of one: its snapshot image is no volume
    let snapshot = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: ids[0].clone(),
            name: "lv-snap".into(),
            secrets: secrets(),
            parameters: Default::default(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    // an image of another provisioner is not ours
    micro_ceph::cluster()
        .rbd(&["create", "--size", "4M", &format!("{pool}/lv-foreign")])
        .unwrap();
    micro_ceph::cluster()
        .rbd(&[
            "image-meta",
            "set",
            &format!("{pool}/lv-foreign"),
            "provisioner.ceph.com/pv",
            "pv-x",
        ])
        .unwrap();

    assert_eq!(all_ids(&mut ctl, "lv-").await, ids);
    let (entries, _) = page(&mut ctl, 0, "").await;
    for entry in entries
        .iter()
        .filter(|e| image_of(id_of(e)).starts_with("lv-"))
    {
        let volume = entry.volume.as_ref().unwrap();
        assert_eq!(volume.capacity_bytes, 4 * MIB);
        assert_eq!(
            volume.volume_context["imageName"],
            image_of(&volume.volume_id)
        );
        let condition = entry
            .status
            .as_ref()
            .and_then(|s| s.volume_condition.as_ref())
            .unwrap();
        assert!(!condition.abnormal, "{condition:?}");
    }
    assert!(
        !entries
            .iter()
            .any(|e| image_of(id_of(e)).starts_with("csi-snap-")),
        "a snapshot image was listed"
    );

    // pages of 2 over our 4 (other tests' volumes may sit before, between or after them):
    // follow the tokens, deleting each page's last volume (the token) before the next page
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut deleted = Vec::new();
    loop {
        let (entries, next) = page(&mut ctl, 2, &token).await;
        assert!(entries.len() <= 2);
        for e in &entries {
            assert!(
                !seen.contains(&id_of(e).to_owned()),
                "listed twice: {}",
                id_of(e)
            );
            assert!(
                !deleted.contains(&id_of(e).to_owned()),
                "deleted but listed"
            );
            seen.push(id_of(e).to_owned());
        }
        if next.is_empty() {
            break;
        }
        assert_eq!(next, id_of(entries.last().unwrap()));
        if image_of(&next).starts_with("lv-") && deleted.len() < 2 {
            delete(&mut ctl, &next).await;
            deleted.push(next.clone());
        }
        token = next;
    }
    for id in &ids {
        assert!(seen.contains(id), "{id} never listed");
    }

    // a volume whose header object is gone is listed, abnormal (not the snapshot's source:
    // the snapshot image would not open without its parent)
    let broken = ids[1..]
        .iter()
        .find(|id| !deleted.contains(id))
        .unwrap()
        .clone();
    let info = micro_ceph::cluster()
        .rbd(&[
            "info",
            "--format",
            "json",
            &format!("{pool}/{}", image_of(&broken)),
        ])
        .unwrap();
    let image_id = serde_json::from_str::<serde_json::Value>(&info).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let status = micro_ceph::cluster()
        .cli("rados")
        .args(["-p", &pool, "rm", &format!("rbd_header.{image_id}")])
        .status()
        .unwrap();
    assert!(status.success());
    let (entries, _) = page(&mut ctl, 0, "").await;
    let entry = entries
        .iter()
        .find(|e| id_of(e) == broken)
        .expect("the broken volume is listed");
    let condition = entry
        .status
        .as_ref()
        .and_then(|s| s.volume_condition.as_ref())
        .unwrap();
    assert!(condition.abnormal, "{condition:?}");
    assert!(
        condition.message.contains("cannot be read"),
        "{condition:?}"
    );

    // bad tokens and sizes
    let err = ctl
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: "invalid-token".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    let err = ctl
        .list_volumes(csi::ListVolumesRequest {
            max_entries: -1,
            starting_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");

    micro_ceph::cluster()
        .rbd(&[
            "rm",
            "--no-progress",
            &format!("{pool}/{}", image_of(&broken)),
        ])
        .unwrap();
    micro_ceph::cluster()
        .rbd(&["rm", "--no-progress", &format!("{pool}/lv-foreign")])
        .unwrap();
    ctl.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snapshot.snapshot_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    for id in ids
        .iter()
        .filter(|id| !deleted.contains(id) && **id != broken)
    {
        delete(&mut ctl, id).await;
    }
    assert_eq!(all_ids(&mut ctl, "lv-").await, Vec::<String>::new());
}

/// librbd's value of `option` for the test pool's `image` (`rbd config image get`).
fn qos(image: &str, option: &str) -> String {
    let cluster = micro_ceph::cluster();
    cluster
        .rbd(&[
            "config",
            "image",
            "get",
            &format!("{}/{image}", cluster.pool),
            option,
        ])
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

fn modify(volume_id: &str, params: &[(&str, &str)]) -> csi::ControllerModifyVolumeRequest {
    csi::ControllerModifyVolumeRequest {
        volume_id: volume_id.into(),
        secrets: secrets(),
        mutable_parameters: common::strings(params),
    }
}

#[tokio::test]
async fn modify_volume_sets_librbd_qos_limits_and_refuses_unknown_keys() {
    let srv = server().await;
    let mut ctl = srv.controller().await;

    // CreateVolume applies mutable_parameters; a bad key creates nothing
    let mut req = create_request("qos-vol", 4 * MIB);
    req.mutable_parameters = common::strings(&[("rbd_qos_iops_limit", "500")]);
    let id = ctl
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    let image = image_of(&id).to_owned();
    assert_eq!(qos(&image, "rbd_qos_iops_limit"), "500");
    let mut req = create_request("qos-vol-bad", 4 * MIB);
    req.mutable_parameters = common::strings(&[("iops", "500")]);
    let err = ctl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("\"iops\""), "{err:?}");
    assert_eq!(common::controller::image_size("qos-vol-bad"), None);

    // only the keys given change
    ctl.controller_modify_volume(modify(&id, &[("rbd_qos_bps_limit", "10Mi")]))
        .await
        .unwrap();
    assert_eq!(qos(&image, "rbd_qos_bps_limit"), "10485760");
    assert_eq!(qos(&image, "rbd_qos_iops_limit"), "500");
    // idempotent
    ctl.controller_modify_volume(modify(&id, &[("rbd_qos_bps_limit", "10Mi")]))
        .await
        .unwrap();
    ctl.controller_modify_volume(modify(
        &id,
        &[
            ("rbd_qos_iops_limit", "0"),
            ("rbd_qos_write_iops_limit", "100"),
        ],
    ))
    .await
    .unwrap();
    assert_eq!(qos(&image, "rbd_qos_iops_limit"), "0");
    assert_eq!(qos(&image, "rbd_qos_write_iops_limit"), "100");

    // refused, naming the key (and the value), with nothing changed
    let cases: [(csi::ControllerModifyVolumeRequest, Code, &str); 5] = [
        (
            modify(&id, &[("XXX_FakeKey", "1"), ("rbd_qos_bps_limit", "1")]),
            Code::InvalidArgument,
            "XXX_FakeKey",
        ),
        (
            modify(&id, &[("rbd_qos_bps_limit", "-5")]),
            Code::InvalidArgument,
            "rbd_qos_bps_limit",
        ),
        (
            modify("", &[("rbd_qos_bps_limit", "1")]),
            Code::InvalidArgument,
            "volume_id",
        ),
        (
            modify("non-existing-volume-id", &[("rbd_qos_bps_limit", "1")]),
            Code::NotFound,
            "volume_id",
        ),
        (
            modify(
                &id.replace("qos-vol", "qos-vol-missing"),
                &[("rbd_qos_bps_limit", "1")],
            ),
            Code::NotFound,
            "qos-vol-missing",
        ),
    ];
    for (req, code, needle) in cases {
        let err = ctl.controller_modify_volume(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{err:?}");
        assert!(err.message().contains(needle), "{needle}: {err:?}");
    }
    assert_eq!(qos(&image, "rbd_qos_bps_limit"), "10485760");
    delete(&mut ctl, &id).await;
}
