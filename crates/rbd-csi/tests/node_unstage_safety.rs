//! NodeUnstageVolume never acts on what a tenant put at the root of its own filesystem: a
//! filesystem volume's staging path is that root, so an entry named `device` there (the name a
//! block volume's device file has) is the tenant's. A symlink `device -> <some host mount>` must
//! not make the plugin unmount that mount, a regular file `device` must survive, and a directory
//! `device` must not make unstage fail. Real data path (fuse-loop mapper, micro-ceph); runs as root.

mod common;

use std::path::Path;

use common::volume::{Volume, assert_nothing_left};
use common::{NodeCleanup, TestImage, TestServer, mount_cap};
use rbd_csi::Services;

/// Stages and publishes an ext4 volume, lets `tenant` create entries through the pod's view of
/// it, unpublishes, and returns the volume (still staged).
async fn staged_with<'a>(
    server: &TestServer,
    image: &'a TestImage,
    tenant: impl FnOnce(&Path),
) -> Volume<'a> {
    let mut vol = Volume::new(server, image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    tenant(&vol.target);
    vol.unpublish().await.unwrap();
    vol
}

#[tokio::test]
async fn unstage_does_not_follow_a_tenant_symlink_named_device() {
    // A mount of the host that the tenant points at (another pod's volume, the key tmpfs, ...).
    let victim_dir = tempfile::tempdir().unwrap();
    let _victim_cleanup = NodeCleanup {
        dirs: vec![victim_dir.path().to_path_buf()],
    };
    let victim = victim_dir.path().join("other-pod-volume");
    std::fs::create_dir(&victim).unwrap();
    rbd_csi::mount::mount_filesystem(Path::new("tmpfs"), &victim, "tmpfs", &["size=1m".into()])
        .unwrap();
    std::fs::write(victim.join("data"), "theirs").unwrap();

    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-unstage-symlink", 64);
    let mut vol = staged_with(&server, &image, |root| {
        std::os::unix::fs::symlink(&victim, root.join("device")).unwrap();
    })
    .await;
    vol.unstage().await.unwrap();

    assert!(
        rbd_csi::mount::mount_at(&victim).unwrap().is_some(),
        "the host mount the tenant's symlink points at was unmounted"
    );
    assert_eq!(
        std::fs::read_to_string(victim.join("data")).unwrap(),
        "theirs"
    );
    assert_nothing_left(&server);

    // The tenant's symlink is still in its filesystem.
    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    assert_eq!(
        std::fs::read_link(vol.target.join("device")).unwrap(),
        victim
    );
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert!(rbd_csi::mount::mount_at(&victim).unwrap().is_some());
    assert_nothing_left(&server);
    rbd_csi::mount::unmount(&victim).unwrap();
}

#[tokio::test]
async fn unstage_keeps_a_tenant_file_named_device() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-unstage-file", 64);
    let mut vol = staged_with(&server, &image, |root| {
        std::fs::write(root.join("device"), "tenant data\n").unwrap();
    })
    .await;
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);

    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(vol.target.join("device")).unwrap(),
        "tenant data\n",
        "unstage deleted the tenant's file"
    );
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn unstage_succeeds_with_a_tenant_directory_named_device() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-unstage-dir", 64);
    let mut vol = staged_with(&server, &image, |root| {
        std::fs::create_dir(root.join("device")).unwrap();
        std::fs::write(root.join("device/inside"), "x").unwrap();
    })
    .await;
    vol.unstage().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);

    vol.stage().await.unwrap();
    vol.publish(false).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(vol.target.join("device/inside")).unwrap(),
        "x"
    );
    vol.unpublish().await.unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}
