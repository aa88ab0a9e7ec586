//! One writer per single-node volume, decided by node identity: two node plugins with different
//! node IDs on this one host (so behind one IP address, as nodes behind NAT are), each called
//! over its own CSI socket as the kubelet calls it, and a controller plugin recording
//! ControllerPublishVolume as the attach controller asks for it. Real data path (fuse-loop
//! mapper, micro-ceph); runs as root.

mod common;

use common::controller::{image_meta, secrets};
use common::volume::{Volume, assert_nothing_left};
use common::{TestImage, TestServer, mount_cap};
use rbd_csi::proto::csi;
use rbd_csi::{ProbeCluster, Services};
use tonic::Code;

/// A node plugin whose `NodeGetInfo` node ID is `node_id`.
async fn node(node_id: &str) -> TestServer {
    let node_id = node_id.to_owned();
    TestServer::start(Services::Node, move |c| c.node_id = node_id).await
}

/// A controller-only plugin (the attach controller's peer), with the admin key as probe key.
async fn controller() -> TestServer {
    let cluster = micro_ceph::cluster();
    TestServer::start(Services::Controller, |c| {
        c.probe = Some(ProbeCluster {
            monitors: cluster.monitors.clone(),
            user: "admin".into(),
            key: cluster.admin_key.clone(),
        });
    })
    .await
}

async fn controller_publish(ctl: &TestServer, image: &TestImage, node: &str) {
    ctl.controller()
        .await
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: image.volume_id(),
            node_id: node.into(),
            volume_capability: Some(mount_cap("ext4")),
            readonly: false,
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn controller_unpublish(ctl: &TestServer, image: &TestImage, node: &str) {
    ctl.controller()
        .await
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: image.volume_id(),
            node_id: node.into(),
            secrets: secrets(),
        })
        .await
        .unwrap();
}

fn assert_nothing_staged(server: &TestServer) {
    let dir = server.dir.path();
    assert!(
        common::mounts_under(dir).is_empty(),
        "mounts under {}",
        dir.display()
    );
    assert!(
        common::loops_under(dir).is_empty(),
        "loop devices under {}",
        dir.display()
    );
}

#[tokio::test]
async fn a_node_the_volume_was_not_published_to_does_not_stage_it_read_write() {
    let ctl = controller().await;
    let (a, b) = (node("node-a").await, node("node-b").await);
    let image = TestImage::create("csi-rwo-unattached", 64);
    controller_publish(&ctl, &image, "node-a").await;
    let mut on_a = Volume::new(&a, &image, mount_cap("ext4")).await;
    on_a.stage().await.unwrap();
    on_a.publish(false).await.unwrap();

    // Node B was never attached (attachRequired: false left on an old CSIDriver, or a race).
    let mut on_b = Volume::new(&b, &image, mount_cap("ext4")).await;
    let err = on_b.stage().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("published to node(s) node-a")
            && err.message().contains("this node node-b"),
        "{}",
        err.message()
    );
    assert_nothing_staged(&b);
    assert_nothing_left(&b);

    // Node A, the one it is published to, restages it (its own watch does not stop it).
    on_a.unpublish().await.unwrap();
    on_a.unstage().await.unwrap();
    on_a.stage().await.unwrap();
    assert_eq!(
        image_meta(&image.name)
            .get("provisioner.ceph.com/staged-by")
            .map(String::as_str),
        Some(r#"{"node":"node-a"}"#)
    );
    // While published to A, B stays refused, with A's mapping gone too.
    on_a.unstage().await.unwrap();
    let err = on_b.stage().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("published to node(s) node-a"),
        "{}",
        err.message()
    );
    assert_nothing_left(&a);
    assert_nothing_left(&b);
    controller_unpublish(&ctl, &image, "node-a").await;
}

#[tokio::test]
async fn two_nodes_staging_an_unpublished_single_node_volume_at_once_do_not_both_get_it() {
    let (a, b) = (node("node-a").await, node("node-b").await);
    let image = TestImage::create("csi-rwo-race", 64);
    let mut on_a = Volume::new(&a, &image, mount_cap("ext4")).await;
    let mut on_b = Volume::new(&b, &image, mount_cap("ext4")).await;
    for round in 0..3 {
        let (ra, rb) = tokio::join!(on_a.stage(), on_b.stage());
        let won: Vec<&str> = [("node-a", &ra), ("node-b", &rb)]
            .into_iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(n, _)| n)
            .collect();
        assert!(
            won.len() <= 1,
            "round {round}: both nodes staged the volume read-write"
        );
        for r in [&ra, &rb] {
            if let Err(e) = r {
                assert!(
                    matches!(e.code(), Code::FailedPrecondition | Code::Aborted),
                    "round {round}: {e:?}"
                );
            }
        }
        if let [winner] = won[..] {
            assert_eq!(
                image_meta(&image.name)
                    .get("provisioner.ceph.com/staged-by")
                    .cloned(),
                Some(format!(r#"{{"node":"{winner}"}}"#)),
                "round {round}"
            );
            // the loser stays refused while the winner has it
            let loser = if winner == "node-a" {
                &mut on_b
            } else {
                &mut on_a
            };
            let err = loser.stage().await.unwrap_err();
            assert_eq!(
                err.code(),
                Code::FailedPrecondition,
                "round {round}: {err:?}"
            );
        }
        on_a.unstage().await.unwrap();
        on_b.unstage().await.unwrap();
        assert_nothing_left(&a);
        assert_nothing_left(&b);
        // the next round starts when the exited rbd-fuse's watch is gone from the image
        wait_unwatched(&image).await;
    }
}

/// Waits (polling Ceph, up to 90 s: the OSD drops the watch of an exited client after its
/// watch timeout) until the image has no watcher.
async fn wait_unwatched(image: &TestImage) {
    let spec = format!("{}/{}", image.pool, image.name);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let status = micro_ceph::cluster()
            .rbd(&["status", "--format", "json", &spec])
            .unwrap();
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        if status["watchers"].as_array().is_none_or(Vec::is_empty) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still watched: {status}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
