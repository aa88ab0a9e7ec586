//! Helpers the rbd-volume test binaries share: the binary's micro-ceph cluster, python-rbd
//! writes (librbd, not our code), digests of `rbd export`, and the volume core's calls with
//! the arguments the tests use. Each binary uses a part of them.
#![allow(dead_code)]

use std::sync::Arc;

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, Features, PoolOptions, Secret};
use rbd_volume::snapshot::snapshot_image_name;
use rbd_volume::{
    Claimant, Deleted, Ensured, Fit, Hooks, NewClone, NewImage, NewSnapshot, Owner, Snapshot,
    SnapshotOwner, Source,
};
use sha2::{Digest, Sha256};

pub const MIB: u64 = 1 << 20;
pub const DRIVER: &str = "rbd.provisioner.ceph.io";

/// A connection to the binary's cluster as `client.admin`.
pub async fn cluster() -> Arc<ceph_rbd::Cluster> {
    let ceph = micro_ceph::cluster();
    let pool = ConnectionPool::new(PoolOptions::default());
    pool.get(&ClusterConfig::new(
        &ceph.monitors,
        "admin",
        Secret::new(ceph.admin_key.clone()),
    ))
    .await
    .unwrap()
}

pub fn pool() -> &'static str {
    &micro_ceph::cluster().pool
}

pub fn spec(image: &str) -> String {
    format!("{}/{image}", pool())
}

/// The features the provisioner's classes ask for by default, all of which the RADOS-level
/// create, clone and snapshot handle.
pub fn plain() -> CreateOptions {
    CreateOptions {
        features: Some(
            Features::parse("layering,exclusive-lock,object-map,fast-diff,deep-flatten").unwrap(),
        ),
        ..CreateOptions::default()
    }
}

/// Writes `text` at `offset` of `image` through python-rbd (librbd, not our code).
pub fn write(image: &str, offset: u64, text: &str) {
    let ceph = micro_ceph::cluster();
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    img.write(sys.argv[5].encode(), int(sys.argv[4]))
io.close(); c.shutdown()
",
        ])
        .arg(&ceph.conf_path)
        .args([pool(), image, &offset.to_string(), text])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes `len` bytes of `byte` at `offset` of `image` through python-rbd (librbd, not our
/// code).
pub fn fill(image: &str, offset: u64, len: u64, byte: u8) {
    micro_ceph::cluster()
        .fill_image(pool(), image, offset, len, byte)
        .unwrap();
}

/// SHA-256 of `rbd export` of `at` (`image` or `image@snap`).
pub fn digest(at: &str) -> String {
    let ceph = micro_ceph::cluster();
    let dir = std::env::temp_dir().join(format!("rbd-volume-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(at.replace(['/', '@'], "_"));
    let _ = std::fs::remove_file(&file);
    ceph.rbd(&["export", "--no-progress", &spec(at), file.to_str().unwrap()])
        .unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    rbd_volume::hex(&Sha256::digest(&bytes)[..])
}

pub fn owner(pv: &str) -> Owner {
    Owner {
        pv: pv.into(),
        claim: format!("ns/{pv}"),
        provisioner: DRIVER.into(),
        kube_cluster: String::new(),
    }
}

pub fn volume_id(image: &str) -> String {
    format!("v1/{}/{}/{image}", micro_ceph::cluster().monitors, pool())
}

/// A plain volume of `size` bytes.
pub async fn ensure(
    cluster: &ceph_rbd::Cluster,
    image: &str,
    size: u64,
) -> Result<Ensured, rbd_volume::Error> {
    rbd_volume::ensure(
        cluster,
        &NewImage {
            pool: pool(),
            image,
            size,
            options: &plain(),
            owner: &owner(image),
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
}

pub fn snapshot_owner(source: &str, name: &str) -> SnapshotOwner {
    SnapshotOwner {
        name: name.into(),
        source: volume_id(source),
        driver: DRIVER.into(),
        kube_cluster: String::new(),
    }
}

/// The snapshot `name` of `source`.
pub async fn snapshot(
    cluster: &ceph_rbd::Cluster,
    source: &str,
    name: &str,
) -> Result<Snapshot, rbd_volume::SnapshotError> {
    rbd_volume::create_snapshot(
        cluster,
        &NewSnapshot {
            pool: pool(),
            source_image: source,
            image: &snapshot_image_name(name),
            owner: &snapshot_owner(source, name),
        },
    )
    .await
}

/// A volume `image` of `size` bytes restored from `snap`.
pub async fn restore(
    cluster: &ceph_rbd::Cluster,
    image: &str,
    size: u64,
    snap: &Snapshot,
) -> Result<Ensured, rbd_volume::SnapshotError> {
    let id = format!("snapshot {}", snap.image);
    rbd_volume::clone_volume(
        cluster,
        &NewClone {
            pool: pool(),
            image,
            size,
            options: &CreateOptions::default(),
            owner: &owner(image),
            fit: Fit::Within {
                required: size,
                limit: 0,
            },
            source: Source::Snapshot {
                pool: &snap.pool,
                image: &snap.image,
            },
            source_id: &id,
            driver: DRIVER,
        },
    )
    .await
}

pub async fn delete_volume(cluster: &ceph_rbd::Cluster, image: &str) {
    let deleted = rbd_volume::delete_volume(
        cluster,
        pool(),
        image,
        &Claimant::image(),
        &Hooks::default(),
    )
    .await
    .unwrap();
    assert_eq!(deleted, Deleted::Removed, "{image}");
}
