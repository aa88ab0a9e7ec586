//! Access modes on the node: a reader-only volume is mapped and mounted read-only, never
//! formatted, checked or grown; a single-node-writer volume is not staged while a client of
//! another node has the image open (its Ceph watchers). Real data path (fuse-loop mapper,
//! micro-ceph); runs as root. The "other node" runs in this process with its own node ID and
//! runtime directory (its own rbd-fuse), on this host's addresses: nodes are told apart by
//! identity, not by address.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::volume::{Volume, assert_nothing_left, bytes_usage};
use common::{NodeCleanup, TestImage, TestServer, mount_cap};
use rbd_csi::node::{NodeConfig, NodeService};
use rbd_csi::proto::csi::volume_capability::access_mode::Mode;
use rbd_csi::proto::csi::{self, node_server::Node, volume_usage::Unit};
use rbd_csi::{MounterKind, Services};
use tonic::Request;

/// The one-writer test runs alone: a stage learns its node's client as the one client that
/// appeared with its mapping, and another test's rbd-fuse instance starting at that moment (it
/// opens every image of the pool) would leave it unknown, and the record with it.
static ONE_WRITER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn with_mode(mut cap: csi::VolumeCapability, mode: Mode) -> csi::VolumeCapability {
    cap.access_mode = Some(csi::volume_capability::AccessMode { mode: mode as i32 });
    cap
}

/// The loop device staged at `staging` is read-only in the kernel.
fn staged_device_read_only(staging: &Path) -> bool {
    let record = rbd_csi::node::record::read(staging).unwrap().unwrap();
    let name = record.mapped.device.file_name().unwrap().to_owned();
    let ro = std::fs::read_to_string(Path::new("/sys/block").join(name).join("ro")).unwrap();
    ro.trim() == "1"
}

#[tokio::test]
async fn a_reader_only_volume_is_mapped_and_mounted_read_only_and_never_grown() {
    let _shared = ONE_WRITER.read().await;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-rox-ext4", 64);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    std::fs::write(vol.target.join("shared.txt"), "for readers").unwrap();
    let written_size = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    // The image grows: a read-write stage would run e2fsck + resize2fs now.
    image.resize(128);

    vol.cap = with_mode(mount_cap("ext4"), Mode::MultiNodeReaderOnly);
    vol.stage().await.unwrap();
    vol.stage().await.unwrap(); // idempotent
    let staged = rbd_csi::mount::mount_at(&vol.staging).unwrap().unwrap();
    assert!(
        staged.read_only(),
        "staging mount options: {}",
        staged.options
    );
    assert!(
        staged_device_read_only(&vol.staging),
        "the loop device is writable"
    );
    vol.publish(true).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(vol.target.join("shared.txt")).unwrap(),
        "for readers"
    );
    let err = std::fs::write(vol.staging.join("x"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    let size = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;
    assert_eq!(
        size, written_size,
        "the filesystem was grown (resize2fs ran)"
    );
    let err = vol.expand(128 << 20).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("read-only"), "{}", err.message());
    let size = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;
    assert_eq!(
        size, written_size,
        "NodeExpandVolume grew a read-only volume"
    );
    // The same staging path asked for read-write is another staging.
    let mut rw = Volume::new(&server, &image, mount_cap("ext4")).await;
    assert_eq!(
        rw.stage().await.unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn a_reader_only_stage_of_a_blank_image_is_refused_and_writes_nothing() {
    let _shared = ONE_WRITER.read().await;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-rox-blank", 64);
    let mut vol = Volume::new(
        &server,
        &image,
        with_mode(mount_cap("ext4"), Mode::SingleNodeReaderOnly),
    )
    .await;
    let err = vol.stage().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("read-only"), "{}", err.message());
    assert_nothing_left(&server);
    // Still blank: nothing was written to the image.
    let du = micro_ceph::cluster()
        .rbd(&[
            "du",
            "--format",
            "json",
            &format!("{}/{}", image.pool, image.name),
        ])
        .unwrap();
    let du: serde_json::Value = serde_json::from_str(&du).unwrap();
    assert_eq!(du["images"][0]["used_size"], 0, "image has data: {du}");
}

#[tokio::test]
async fn a_read_only_stage_over_a_read_write_mapping_is_refused() {
    let _shared = ONE_WRITER.read().await;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-ro-over-rw", 64);
    let mut writer = Volume::new(&server, &image, mount_cap("ext4")).await;
    writer.stage().await.unwrap();
    writer.publish(false).await.unwrap();

    // The same image staged read-only at another staging path of this node (a second PV of
    // the image, a ReadOnlyMany claim of it): it must not get the writer's loop device.
    let mut reader = Volume::new(
        &server,
        &image,
        with_mode(mount_cap("ext4"), Mode::MultiNodeReaderOnly),
    )
    .await;
    reader.staging = server.dir.path().join("ro").join("globalmount");
    reader.target = server.dir.path().join("ro").join("pod");
    let err = reader.stage().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("mapped read-write") && err.message().contains("/dev/loop"),
        "{}",
        err.message()
    );
    assert!(rbd_csi::mount::mount_at(&reader.staging).unwrap().is_none());
    assert!(
        rbd_csi::node::record::read(&reader.staging)
            .unwrap()
            .is_none()
    );
    // The writer's device was left alone.
    std::fs::write(writer.target.join("still-writable"), "yes").unwrap();
    writer.unpublish().await.unwrap();
    writer.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn map_options_asking_for_a_writable_mapping_are_refused_on_a_read_only_stage() {
    let _shared = ONE_WRITER.read().await;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-ro-rw-option", 64);
    let mut context = image.context();
    context.insert("mounter".into(), "krbd".into());
    context.insert("mapOptions".into(), "krbd:queue_depth=8,rw".into());
    let err = server
        .node()
        .await
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: image.volume_id(),
            staging_target_path: server.dir.path().join("globalmount").display().to_string(),
            volume_capability: Some(with_mode(mount_cap("ext4"), Mode::SingleNodeReaderOnly)),
            secrets: image.secrets(),
            volume_context: context,
            publish_context: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("volume_context.mapOptions") && err.message().contains("\"rw\""),
        "{}",
        err.message()
    );
    assert_nothing_left(&server);
}

/// A second node, served in this process: its own node ID and runtime directory (its own
/// rbd-fuse), the same addresses as the first.
struct OtherNode {
    node: NodeService,
    dir: tempfile::TempDir,
    _cleanup: NodeCleanup,
}

impl OtherNode {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeService::new(NodeConfig {
            node_id: "test-node-2".into(),
            default_mounter: MounterKind::FuseLoop,
            runtime_dir: dir.path().join("run"),
            krbd_map_options: None,
            max_volumes_per_node: 0,
            cluster_config: None,
            topology: Default::default(),
            daemons: Default::default(),
            kms_config: Default::default(),
            secrets: None,
        });
        let cleanup = NodeCleanup {
            dirs: vec![dir.path().to_path_buf()],
        };
        Self {
            node,
            dir,
            _cleanup: cleanup,
        }
    }

    fn staging(&self) -> PathBuf {
        self.dir.path().join("globalmount")
    }

    async fn stage(
        &self,
        image: &TestImage,
        cap: csi::VolumeCapability,
    ) -> Result<(), tonic::Status> {
        self.node
            .node_stage_volume(Request::new(csi::NodeStageVolumeRequest {
                volume_id: image.volume_id(),
                staging_target_path: self.staging().display().to_string(),
                volume_capability: Some(cap),
                secrets: image.secrets(),
                volume_context: image.context(),
                publish_context: HashMap::new(),
            }))
            .await
            .map(drop)
    }

    async fn unstage(&self, image: &TestImage) {
        self.node
            .node_unstage_volume(Request::new(csi::NodeUnstageVolumeRequest {
                volume_id: image.volume_id(),
                staging_target_path: self.staging().display().to_string(),
            }))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_single_node_writer_volume_open_on_another_node_is_not_staged() {
    let _alone = ONE_WRITER.write().await;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-rwo-watchers", 64);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();

    let other = OtherNode::new();
    let err = other.stage(&image, mount_cap("ext4")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("is staged read-write on node")
            && err.message().contains("rbd-fuse instance"),
        "{}",
        err.message()
    );
    assert!(common::mounts_under(other.dir.path()).is_empty());
    assert!(common::loops_under(other.dir.path()).is_empty());
    // Readers are not refused: a reader-only stage maps read-only and writes nothing.
    other
        .stage(
            &image,
            with_mode(mount_cap("ext4"), Mode::MultiNodeReaderOnly),
        )
        .await
        .unwrap();
    assert!(staged_device_read_only(&other.staging()));
    other.unstage(&image).await;

    // The first node's own restage is not refused by its own watch.
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    vol.stage().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);

    // Once the first node let go, the other node stages it (after the OSD dropped the watch of
    // the exited rbd-fuse, if it had not closed the image).
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match other.stage(&image, mount_cap("ext4")).await {
            Ok(()) => break,
            Err(e) if e.code() == tonic::Code::FailedPrecondition && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("stage on the other node: {e:?}"),
        }
    }
    other.unstage(&image).await;
    assert!(common::mounts_under(other.dir.path()).is_empty());
}
