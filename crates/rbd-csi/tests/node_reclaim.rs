//! Reclaiming space on the node through the fuse-loop mapper against a private Ceph cluster:
//! a filesystem volume is trimmed (its remaining files read back unchanged) and the trim's
//! limit on this path is pinned (rbd-fuse passes no discards to RADOS: the image's used size
//! stays); a block volume is left alone. Runs as root.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::volume::Volume;
use common::{TestImage, TestServer, block_cap, mount_cap};
use rbd_csi::Services;
use rbd_csi::node::NodeService;
use rbd_csi::node::reclaim::NodeReclaimed;
use sha2::{Digest, Sha256};

const MIB: u64 = 1 << 20;

async fn used_bytes(image: &TestImage) -> u64 {
    let ceph = micro_ceph::cluster();
    let cluster = ceph_rbd::ConnectionPool::new(ceph_rbd::PoolOptions::default())
        .get(&ceph_rbd::ClusterConfig::new(
            &ceph.monitors,
            "admin",
            ceph_rbd::Secret::new(ceph.admin_key.clone()),
        ))
        .await
        .unwrap();
    cluster.used_bytes(&image.pool, &image.name).await.unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 251).unwrap() ^ seed)
        .collect()
}

#[tokio::test]
async fn a_staged_filesystem_is_trimmed_and_its_files_stay() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let node = NodeService::new(server.config.node_config());
    let image = TestImage::create("csi-reclaim-ext4", 256);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    let kept = pattern(1 << 20, 9);
    std::fs::write(vol.target.join("kept.bin"), &kept).unwrap();
    let mut big = std::fs::File::create(vol.target.join("big.bin")).unwrap();
    for i in 0..64u8 {
        big.write_all(&pattern(1 << 20, i)).unwrap();
    }
    big.sync_all().unwrap();
    drop(big);
    std::fs::remove_file(vol.target.join("big.bin")).unwrap();
    sync_filesystem(&vol.target);
    let before = used_bytes(&image).await;
    assert!(before >= 64 * MIB, "64 MiB written: {before}");

    let reclaimed = node
        .reclaim_space(&image.volume_id(), &vol.staging)
        .await
        .unwrap();

    let NodeReclaimed::Trimmed {
        bytes,
        reaches_rados,
    } = reclaimed
    else {
        panic!("expected a trim, got {reclaimed:?}");
    };
    assert!(
        bytes >= 64 * MIB,
        "the freed 64 MiB were discarded: {bytes}"
    );
    assert!(
        !reaches_rados,
        "the fuse-loop mapping passes no discards on"
    );
    assert!(reclaimed.describe().contains("rbd-fuse"));
    // rbd-fuse implements no fallocate: the loop device's discards never reach RADOS
    assert!(used_bytes(&image).await >= before - 4 * MIB);
    let read_back = std::fs::read(vol.target.join("kept.bin")).unwrap();
    assert_eq!(Sha256::digest(&read_back), Sha256::digest(&kept));

    // another volume's ID at this staging path is refused
    let other = node
        .reclaim_space("v1/other/rbd/x", &vol.staging)
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::FailedPrecondition);
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    let gone = node
        .reclaim_space(&image.volume_id(), &vol.staging)
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn a_staged_block_volume_is_not_discarded_on_the_node() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let node = NodeService::new(server.config.node_config());
    let image = TestImage::create("csi-reclaim-block", 16);
    let mut vol = Volume::new(&server, &image, block_cap()).await;
    vol.target = server.dir.path().join("pods/p1/volumeDevices/dev1");
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    let data = pattern(4 << 20, 3);
    {
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&vol.target)
            .unwrap();
        dev.seek(SeekFrom::Start(4 << 20)).unwrap();
        dev.write_all(&data).unwrap();
        dev.sync_all().unwrap();
    }
    let before = used_bytes(&image).await;

    let reclaimed = node
        .reclaim_space(&image.volume_id(), &vol.staging)
        .await
        .unwrap();

    assert_eq!(reclaimed, NodeReclaimed::BlockVolume);
    assert!(reclaimed.describe().starts_with("nothing discarded"));
    assert_eq!(used_bytes(&image).await, before);
    let mut read_back = vec![0; data.len()];
    let mut dev = std::fs::File::open(&vol.target).unwrap();
    dev.seek(SeekFrom::Start(4 << 20)).unwrap();
    dev.read_exact(&mut read_back).unwrap();
    assert_eq!(read_back, data);
    drop(dev);
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
}

/// `syncfs` on the filesystem of `path`: the deletion reaches the device before the trim.
fn sync_filesystem(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path).unwrap();
    // SAFETY: syncfs on an open fd.
    assert_eq!(unsafe { libc::syncfs(dir.as_raw_fd()) }, 0);
}
