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

/// The tests of this file one at a time: a stage learns its node's client as the one client
/// that appeared with its mapping, and a test's rbd-fuse instance starting at that moment (it
/// opens every image of the pool) would leave it unknown (`access::new_watcher`), which the
/// race test's "the loser stays refused" depends on.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _serial = SERIAL.lock().await;
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
    assert_eq!(staged_by_node(&image).as_deref(), Some("node-a"));
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
    let _serial = SERIAL.lock().await;
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
                staged_by_node(&image).as_deref(),
                Some(winner),
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

/// Another node's rbd-fuse instance opens every image of its pool (its mount is `statfs`ed at
/// each loop attach) and so watches volumes it never staged: such a watcher is a reader, not a
/// writer, and does not keep a node from staging a fresh volume (nor a volume another node
/// staged and let go).
#[tokio::test]
async fn another_nodes_rbd_fuse_watching_the_pool_does_not_block_a_stage() {
    let _serial = SERIAL.lock().await;
    let (b, c) = (node("node-b").await, node("node-c").await);
    let fresh = TestImage::create("csi-rwo-fuse-watched", 64);
    // node-c stages a volume of its own: its rbd-fuse instance opens the pool's images
    let other = TestImage::create("csi-rwo-fuse-other", 64);
    let mut on_c = Volume::new(&c, &other, mount_cap("ext4")).await;
    on_c.stage().await.unwrap();
    let watchers = watcher_ids(&fresh);
    assert!(
        !watchers.is_empty(),
        "the test needs node-c's rbd-fuse to watch {} (it watches nothing)",
        fresh.name
    );

    let mut on_b = Volume::new(&b, &fresh, mount_cap("ext4")).await;
    on_b.stage().await.unwrap();
    assert_eq!(staged_by_node(&fresh).as_deref(), Some("node-b"));
    on_b.unstage().await.unwrap();
    on_c.unstage().await.unwrap();
    assert_nothing_left(&b);
    assert_nothing_left(&c);
}

/// A volume that no node of this driver recorded staging (staged by an older version, or
/// written by some other librbd client) and that another client is writing (it holds the
/// image's exclusive lock) is not staged read-write; once that client is gone, it is.
#[tokio::test]
async fn a_client_holding_the_exclusive_lock_of_an_unrecorded_volume_keeps_nodes_from_staging_it() {
    let _serial = SERIAL.lock().await;
    let b = node("node-b").await;
    let image = TestImage::create("csi-rwo-locked", 64);
    let mut writer = LockHolder::start(&image);
    let mut on_b = Volume::new(&b, &image, mount_cap("ext4")).await;
    let err = on_b.stage().await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("exclusive lock")
            && err.message().contains(&format!("client.{}", writer.client)),
        "{}",
        err.message()
    );
    assert!(staged_by_node(&image).is_none());
    assert_nothing_staged(&b);
    writer.stop();
    on_b.stage().await.unwrap();
    assert_eq!(staged_by_node(&image).as_deref(), Some("node-b"));
    on_b.unstage().await.unwrap();
    assert_nothing_left(&b);
}

/// A python-rbd (librbd) client that opened the image, wrote to it (so it holds the exclusive
/// lock) and keeps it open until stopped.
struct LockHolder {
    child: std::process::Child,
    client: u64,
}

impl LockHolder {
    fn start(image: &TestImage) -> LockHolder {
        use std::io::BufRead;
        let ceph = micro_ceph::cluster();
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
img = rbd.Image(io, sys.argv[3])
img.write(b'held', 32 << 20)
print(c.get_instance_id(), flush=True)
sys.stdin.read()
img.close(); io.close(); c.shutdown()
",
            ])
            .arg(&ceph.conf_path)
            .args([&image.pool, &image.name])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let client = line.trim().parse().unwrap_or_else(|_| panic!("{line:?}"));
        LockHolder { child, client }
    }

    fn stop(&mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The global IDs of the clients watching the image.
fn watcher_ids(image: &TestImage) -> Vec<u64> {
    let spec = format!("{}/{}", image.pool, image.name);
    let status = micro_ceph::cluster()
        .rbd(&["status", "--format", "json", &spec])
        .unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    status["watchers"]
        .as_array()
        .map(|ws| ws.iter().filter_map(|w| w["client"].as_u64()).collect())
        .unwrap_or_default()
}

/// The node the image's `staged-by` record names.
fn staged_by_node(image: &TestImage) -> Option<String> {
    let value = image_meta(&image.name)
        .get("provisioner.ceph.com/staged-by")
        .cloned()?;
    let record: serde_json::Value = serde_json::from_str(&value).unwrap();
    record["node"].as_str().map(str::to_owned)
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
