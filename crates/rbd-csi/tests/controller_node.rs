//! The controller together with Identity and Node: Probe reflects Ceph reachability, and a
//! volume created by CreateVolume stages on the node with the returned context.

mod common;

use std::collections::HashMap;

use common::controller::{MIB, create_request, image_size, remove_image, secrets, server};
use common::{TestServer, fuse_processes_under, loops_under, mount_cap, mounts_under};
use rbd_csi::proto::csi;
use rbd_csi::{ProbeCluster, Services};
use tonic::Code;

#[tokio::test]
async fn probe_reports_ceph_reachability() {
    let ready = server()
        .await
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ready.ready, Some(true));
    // A cluster that does not answer: not ready (no hang: bounded by the probe's timeouts).
    let unreachable = TestServer::start(Services::Controller, |c| {
        c.probe = Some(ProbeCluster {
            monitors: "127.0.0.1:1".into(),
            user: "admin".into(),
            key: micro_ceph::cluster().admin_key.clone(),
        });
    })
    .await;
    let probe = unreachable
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(false));
}

#[tokio::test]
async fn created_volume_stages_on_the_node_and_delete_refuses_while_mapped() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let mut node = server.node().await;
    remove_image("pvc-ctl-e2e");
    let vol = ctl
        .create_volume(create_request("pvc-ctl-e2e", 16 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let staging = server.dir.path().join("e2e/globalmount");
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap("ext4")),
        secrets: secrets(),
        volume_context: vol.volume_context.clone(),
        publish_context: HashMap::new(),
    })
    .await
    .unwrap();
    std::fs::write(staging.join("f"), "x").unwrap();

    let err = ctl
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("watcher"), "{}", err.message());

    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert!(mounts_under(server.dir.path()).is_empty());
    assert!(loops_under(server.dir.path()).is_empty());
    assert!(fuse_processes_under(server.dir.path()).is_empty());
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert_eq!(image_size("pvc-ctl-e2e"), None);
}
