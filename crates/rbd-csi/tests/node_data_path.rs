//! The real data path with the fuse-loop mapper against a private Ceph cluster (micro-ceph):
//! stage -> publish -> write -> unpublish -> unstage -> stage again -> read back, for ext4, xfs
//! and raw block; expansion; stats; and nothing left behind after unstage. Runs as root.

mod common;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};

use common::volume::{Volume, assert_nothing_left, bytes_usage};
use common::{TestImage, TestServer, block_cap, mount_cap};
use rbd_csi::Services;
use rbd_csi::proto::csi::{self, volume_usage::Unit};
use sha2::{Digest, Sha256};

fn random_bytes(len: usize, seed: u8) -> Vec<u8> {
    // A cheap deterministic pseudo-random pattern (xorshift), distinct per seed.
    let mut x: u32 = 0x9E37_79B9 ^ u32::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect()
}

fn sha(bytes: &[u8]) -> Vec<u8> {
    Sha256::digest(bytes).to_vec()
}

async fn filesystem_round_trip(fs_type: &str, image_name: &str, size_mib: u64) {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create(image_name, size_mib);
    let mut vol = Volume::new(&server, &image, mount_cap(fs_type)).await;

    vol.stage().await.unwrap();
    vol.stage().await.unwrap(); // idempotent
    let staged = rbd_csi::mount::mount_at(&vol.staging)
        .unwrap()
        .expect("staging mounted");
    assert_eq!(staged.fs_type, fs_type);
    vol.publish(false).await.unwrap();
    vol.publish(false).await.unwrap(); // idempotent

    let data = random_bytes(8 << 20, 7);
    std::fs::write(vol.target.join("hello.txt"), format!("hello {fs_type}\n")).unwrap();
    let mut f = std::fs::File::create(vol.target.join("rand.bin")).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);

    let stats = vol.stats().await.unwrap();
    assert!(!stats.volume_condition.as_ref().unwrap().abnormal);
    let bytes = bytes_usage(&stats, Unit::Bytes);
    let image_size = i64::try_from(size_mib << 20).unwrap();
    assert!(
        bytes.total > image_size / 2 && bytes.total <= image_size,
        "{bytes:?}"
    );
    assert!(
        bytes.used >= 8 << 20,
        "used {} after writing 8 MiB",
        bytes.used
    );
    assert!(bytes.available > 0 && bytes.available < bytes.total);
    let inodes = bytes_usage(&stats, Unit::Inodes);
    assert!(inodes.total > 0 && inodes.used >= 2, "{inodes:?}");

    vol.unpublish().await.unwrap();
    vol.unpublish().await.unwrap(); // idempotent
    assert!(!vol.target.exists());
    vol.unstage().await.unwrap();
    vol.unstage().await.unwrap(); // idempotent
    assert_nothing_left(&server);

    // Stage again through a fresh rbd-fuse: the same bytes come back.
    vol.stage().await.unwrap();
    vol.publish(true).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(vol.target.join("hello.txt")).unwrap(),
        format!("hello {fs_type}\n")
    );
    assert_eq!(
        sha(&std::fs::read(vol.target.join("rand.bin")).unwrap()),
        sha(&data)
    );
    let err = std::fs::write(vol.target.join("new.txt"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "read-only publish");
    // A second publish with another readonly flag conflicts.
    assert_eq!(
        vol.publish(false).await.unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn ext4_data_survives_unstage_and_restage() {
    filesystem_round_trip("ext4", "csi-node-ext4", 64).await;
}

#[tokio::test]
async fn xfs_data_survives_unstage_and_restage() {
    // mkfs.xfs refuses filesystems below 300 MiB.
    filesystem_round_trip("xfs", "csi-node-xfs", 320).await;
}

/// A copy of an xfs volume (a restore, a clone: the same filesystem UUID) stages and reads on the
/// node where its source is staged (xfs refuses a second mount of one UUID without `nouuid`).
#[tokio::test]
async fn an_xfs_copy_stages_beside_its_source() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let source = TestImage::create("csi-node-xfs-source", 320);
    let mut vol = Volume::new(&server, &source, mount_cap("xfs")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    let mut file = std::fs::File::create(vol.target.join("kept.txt")).unwrap();
    file.write_all(b"from the source").unwrap();
    file.sync_all().unwrap();
    drop(file);
    std::fs::File::open(&vol.target)
        .unwrap()
        .sync_all()
        .unwrap();
    vol.unpublish().await.unwrap(); // the source stays staged
    // a full copy of the image: the same filesystem, UUID and all (removed on drop). Made by
    // `rbd cp` to a name not taken: an image just created could not be removed at once, as any
    // rbd-fuse serving the pool may open it when it lists the pool.
    let cluster = micro_ceph::cluster();
    let copy = TestImage {
        pool: source.pool.clone(),
        name: format!("csi-node-xfs-copy-{}", std::process::id()),
    };
    let spec = |image: &TestImage| format!("{}/{}", image.pool, image.name);
    cluster
        .rbd(&["cp", "--no-progress", &spec(&source), &spec(&copy)])
        .unwrap();

    let mut copied = Volume::new(&server, &copy, mount_cap("xfs")).await;
    copied.stage().await.unwrap();
    copied.publish(false).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(copied.target.join("kept.txt")).unwrap(),
        "from the source"
    );
    copied.unpublish().await.unwrap();
    copied.unstage().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn block_volume_writes_and_reads_the_device() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-block", 32);
    let mut vol = Volume::new(&server, &image, block_cap()).await;
    vol.target = server.dir.path().join("pods/p1/volumeDevices/dev1");
    vol.stage().await.unwrap();
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    vol.publish(false).await.unwrap();

    let data = random_bytes(1 << 20, 3);
    {
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&vol.target)
            .unwrap();
        dev.seek(SeekFrom::Start(4 << 20)).unwrap();
        dev.write_all(&data).unwrap();
        dev.sync_all().unwrap();
    }
    let stats = vol.stats().await.unwrap();
    assert_eq!(bytes_usage(&stats, Unit::Bytes).total, 32 << 20);
    assert_eq!(stats.usage.len(), 1, "block volumes report size only");

    vol.unpublish().await.unwrap();
    assert!(!vol.target.exists());
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);

    vol.stage().await.unwrap();
    vol.publish(true).await.unwrap();
    let mut back = vec![0u8; data.len()];
    {
        let mut dev = std::fs::File::open(&vol.target).unwrap();
        dev.seek(SeekFrom::Start(4 << 20)).unwrap();
        dev.read_exact(&mut back).unwrap();
    }
    assert_eq!(sha(&back), sha(&data));
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn xfs_grows_online_after_the_image_is_resized() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-xfs-grow", 320);
    let mut vol = Volume::new(&server, &image, mount_cap("xfs")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    std::fs::write(vol.target.join("keep.txt"), "kept").unwrap();
    let before = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;

    image.resize(480);
    let capacity = vol.expand(480 << 20).await.unwrap();
    assert_eq!(capacity, 480 << 20);
    let after = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;
    assert!(
        after > before + (100 << 20),
        "xfs grew from {before} to {after}"
    );
    assert_eq!(
        std::fs::read_to_string(vol.target.join("keep.txt")).unwrap(),
        "kept"
    );
    // Idempotent: expanding again to the same size is fine.
    vol.expand(480 << 20).await.unwrap();

    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn ext4_grows_online_or_says_to_restage_and_grows_on_restage() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-ext4-grow", 64);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    std::fs::write(vol.target.join("keep.txt"), "kept").unwrap();
    let before = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;

    image.resize(128);
    match vol.expand(128 << 20).await {
        Ok(capacity) => assert_eq!(capacity, 128 << 20),
        Err(status) => {
            // This sandbox refuses online ext4 resize: a clear error, then a re-stage grows it.
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
            assert!(status.message().contains("unstage"), "{}", status.message());
            vol.unpublish().await.unwrap();
            vol.unstage().await.unwrap();
            vol.stage().await.unwrap();
            vol.publish(false).await.unwrap();
        }
    }
    let after = bytes_usage(&vol.stats().await.unwrap(), Unit::Bytes).total;
    assert!(
        after > before + (50 << 20),
        "ext4 grew from {before} to {after}"
    );
    assert_eq!(
        std::fs::read_to_string(vol.target.join("keep.txt")).unwrap(),
        "kept"
    );
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn staging_a_missing_image_is_not_found_and_leaves_nothing() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-missing", 8);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    let ghost = TestImage {
        pool: image.pool.clone(),
        name: "csi-node-does-not-exist".into(),
    };
    vol.image = &ghost;
    let err = vol.stage().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert_nothing_left(&server);
}

#[tokio::test]
async fn provisioner_style_attributes_and_in_tree_secret_stage() {
    // What the built-in provisioner's `csi` PVs carry: monitors/pool/imageName/userID attributes,
    // no mounter (node default), and a user secret with only `key`.
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-provisioner-style", 16);
    let cluster = micro_ceph::cluster();
    let staging = server.dir.path().join("pv1/globalmount");
    let mut node = server.node().await;
    let mut context = image.context();
    context.remove("mounter");
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: image.volume_id(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap("")),
        secrets: common::strings(&[("key", &cluster.admin_key)]),
        volume_context: context,
        publish_context: HashMap::new(),
    })
    .await
    .unwrap();
    let mounted = rbd_csi::mount::mount_at(&staging).unwrap().unwrap();
    assert_eq!(mounted.fs_type, "ext4", "empty fsType means ext4");
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: image.volume_id(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn ext4_staged_but_unpublished_grows_even_where_online_grow_is_refused() {
    // Kubelet expands right after NodeStageVolume, before any publish: volume_path = staging.
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-ext4-stage-grow", 64);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    std::fs::write(vol.staging.join("keep.txt"), "kept").unwrap();
    let before = rbd_csi::fs::usage(&vol.staging).unwrap().total_bytes;
    image.resize(128);
    vol.target = vol.staging.clone();
    let capacity = vol.expand(128 << 20).await.unwrap();
    assert_eq!(capacity, 128 << 20);
    let after = rbd_csi::fs::usage(&vol.staging).unwrap().total_bytes;
    assert!(
        after > before + (50 << 20),
        "ext4 grew from {before} to {after}"
    );
    assert!(rbd_csi::mount::is_mount_point(&vol.staging).unwrap());
    assert_eq!(
        std::fs::read_to_string(vol.staging.join("keep.txt")).unwrap(),
        "kept"
    );
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn mount_flags_apply_and_access_type_conflicts_are_already_exists() {
    use rbd_csi::proto::csi::volume_capability::AccessType;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-flags", 16);
    let mut cap = mount_cap("ext4");
    if let Some(AccessType::Mount(m)) = &mut cap.access_type {
        m.mount_flags = vec!["noatime".into(), "nodev".into()];
    }
    let mut vol = Volume::new(&server, &image, cap).await;
    vol.stage().await.unwrap();
    let staged = rbd_csi::mount::mount_at(&vol.staging).unwrap().unwrap();
    assert!(
        staged.options.split(',').any(|o| o == "noatime"),
        "{}",
        staged.options
    );
    assert!(
        staged.options.split(',').any(|o| o == "nodev"),
        "{}",
        staged.options
    );

    let mut as_block = Volume::new(&server, &image, block_cap()).await;
    as_block.staging = vol.staging.clone();
    assert_eq!(
        as_block.stage().await.unwrap_err().code(),
        tonic::Code::AlreadyExists
    );

    // A staging record whose mount vanished (e.g. unmounted by hand) is not published.
    rbd_csi::mount::unmount(&vol.staging).unwrap();
    assert_eq!(
        vol.publish(false).await.unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    // Staging again repairs it.
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}
