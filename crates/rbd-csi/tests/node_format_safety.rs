//! NodeStageVolume creates a filesystem only on a provably blank device: a device holding only a
//! partition table, or data no probe recognises, is refused with FAILED_PRECONDITION and left
//! byte for byte as it was. Real data path (fuse-loop mapper, micro-ceph); runs as root.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::volume::{Volume, assert_nothing_left};
use common::{TestImage, TestServer, block_cap, mount_cap};
use rbd_csi::Services;

/// A DOS (MBR) partition table with one Linux partition, as `fdisk` would write it.
fn mbr() -> Vec<u8> {
    let mut sector = vec![0u8; 512];
    sector[440..444].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    sector[446 + 4] = 0x83; // partition type: Linux
    sector[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    sector[446 + 12..446 + 16].copy_from_slice(&8192u32.to_le_bytes());
    sector[510] = 0x55;
    sector[511] = 0xAA;
    sector
}

/// Writes `bytes` at `offset` of the image through a raw block stage, and leaves it unstaged.
async fn write_raw(vol: &mut Volume<'_>, offset: u64, bytes: &[u8]) {
    vol.cap = block_cap();
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    let mut dev = std::fs::OpenOptions::new()
        .write(true)
        .open(&vol.target)
        .unwrap();
    dev.seek(SeekFrom::Start(offset)).unwrap();
    dev.write_all(bytes).unwrap();
    dev.sync_all().unwrap();
    drop(dev);
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
}

/// Reads `len` bytes at `offset` of the image through a read-only raw block stage.
async fn read_raw(vol: &mut Volume<'_>, offset: u64, len: usize) -> Vec<u8> {
    vol.cap = block_cap();
    vol.stage().await.unwrap();
    vol.publish(true).await.unwrap();
    let mut dev = std::fs::File::open(&vol.target).unwrap();
    dev.seek(SeekFrom::Start(offset)).unwrap();
    let mut back = vec![0u8; len];
    dev.read_exact(&mut back).unwrap();
    drop(dev);
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    back
}

async fn refused_and_untouched(name: &str, offset: u64, bytes: &[u8], expect: &str) {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create(name, 64);
    let mut vol = Volume::new(&server, &image, block_cap()).await;
    vol.target = server.dir.path().join("pods/p1/volumeDevices/dev1");
    write_raw(&mut vol, offset, bytes).await;

    vol.cap = mount_cap("ext4");
    let err = vol.stage().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(expect), "{}", err.message());
    assert_nothing_left(&server);

    // Not formatted: the bytes are still there, and no ext4 superblock (1024 + 0x38: magic) was
    // written.
    assert_eq!(read_raw(&mut vol, offset, bytes.len()).await, bytes);
    assert_eq!(read_raw(&mut vol, 1024 + 0x38, 2).await, [0, 0]);
    assert_nothing_left(&server);
}

#[tokio::test]
async fn a_device_with_only_a_partition_table_is_not_formatted() {
    refused_and_untouched("csi-format-mbr", 0, &mbr(), "dos partition table").await;
}

#[tokio::test]
async fn unrecognised_data_is_not_formatted() {
    // Raw application data (a database written to a block volume, say): no signature at all.
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
    refused_and_untouched("csi-format-raw", 64 << 10, &data, "not all zero").await;
}
