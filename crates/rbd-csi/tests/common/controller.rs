//! Controller test helpers: a server with Ceph credentials, requests, and image checks via the
//! `rbd` CLI.

use std::collections::HashMap;

use rbd_csi::proto::csi;
use rbd_csi::{ProbeCluster, Services};

use super::{TestServer, mount_cap, strings};

pub const MIB: i64 = 1 << 20;

pub async fn server() -> TestServer {
    let cluster = micro_ceph::cluster();
    TestServer::start(Services::All, |c| {
        c.probe = Some(ProbeCluster {
            monitors: cluster.monitors.clone(),
            user: "admin".into(),
            key: cluster.admin_key.clone(),
        });
    })
    .await
}

pub fn secrets() -> HashMap<String, String> {
    strings(&[
        ("userID", "admin"),
        ("userKey", &micro_ceph::cluster().admin_key),
    ])
}

pub fn params() -> HashMap<String, String> {
    let cluster = micro_ceph::cluster();
    strings(&[
        ("monitors", &cluster.monitors),
        ("pool", &cluster.pool),
        ("mounter", "fuse"),
        ("csi.storage.k8s.io/fstype", "ext4"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "apps"),
    ])
}

pub fn create_request(name: &str, required: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: (required > 0).then_some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap("ext4")],
        parameters: params(),
        secrets: secrets(),
        ..Default::default()
    }
}

/// Creates volume `name` of `size` bytes through `ctl` (see [`create_request`]).
pub async fn create_volume(
    ctl: &mut csi::controller_client::ControllerClient<tonic::transport::Channel>,
    name: &str,
    size: i64,
) -> csi::Volume {
    ctl.create_volume(create_request(name, size))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}

/// The image's metadata (`rbd image-meta list`), key to value.
pub fn image_meta(image: &str) -> HashMap<String, String> {
    let cluster = micro_ceph::cluster();
    let meta = cluster
        .rbd(&[
            "image-meta",
            "list",
            "--format",
            "json",
            &format!("{}/{image}", cluster.pool),
        ])
        .unwrap();
    if meta.trim().is_empty() {
        return HashMap::new();
    }
    serde_json::from_str(&meta).unwrap()
}

pub fn image_size(image: &str) -> Option<u64> {
    let cluster = micro_ceph::cluster();
    let out = cluster
        .rbd(&[
            "info",
            "--format",
            "json",
            &format!("{}/{image}", cluster.pool),
        ])
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["size"].as_u64()
}

pub fn remove_image(image: &str) {
    let cluster = micro_ceph::cluster();
    let _ = cluster.rbd(&["rm", "--no-progress", &format!("{}/{image}", cluster.pool)]);
}
