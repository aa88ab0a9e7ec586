//! A volume driven through the node service, and checks that nothing is left behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rbd_csi::proto::csi::{self, node_client::NodeClient, volume_usage::Unit};
use tonic::transport::Channel;

use super::{TestImage, TestServer, fuse_processes_under, loops_under, mounts_under};

pub struct Volume<'a> {
    pub node: NodeClient<Channel>,
    pub image: &'a TestImage,
    pub cap: csi::VolumeCapability,
    pub staging: PathBuf,
    pub target: PathBuf,
}

impl<'a> Volume<'a> {
    pub async fn new(
        server: &TestServer,
        image: &'a TestImage,
        cap: csi::VolumeCapability,
    ) -> Self {
        let root = server.dir.path().join(&image.name);
        Self {
            node: server.node().await,
            image,
            cap,
            staging: root.join("globalmount"),
            target: root.join("pod").join("mount"),
        }
    }

    pub async fn stage(&mut self) -> Result<(), tonic::Status> {
        self.node
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: self.image.volume_id(),
                staging_target_path: self.staging.display().to_string(),
                volume_capability: Some(self.cap.clone()),
                secrets: self.image.secrets(),
                volume_context: self.image.context(),
                publish_context: HashMap::new(),
            })
            .await
            .map(drop)
    }

    pub async fn publish(&mut self, readonly: bool) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: self.image.volume_id(),
                staging_target_path: self.staging.display().to_string(),
                target_path: self.target.display().to_string(),
                volume_capability: Some(self.cap.clone()),
                readonly,
                secrets: HashMap::new(),
                volume_context: self.image.context(),
                publish_context: HashMap::new(),
            })
            .await
            .map(drop)
    }

    pub async fn unpublish(&mut self) -> Result<(), tonic::Status> {
        self.node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: self.image.volume_id(),
                target_path: self.target.display().to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn unstage(&mut self) -> Result<(), tonic::Status> {
        self.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: self.image.volume_id(),
                staging_target_path: self.staging.display().to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn stats(&mut self) -> Result<csi::NodeGetVolumeStatsResponse, tonic::Status> {
        self.node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: self.image.volume_id(),
                volume_path: self.target.display().to_string(),
                staging_target_path: self.staging.display().to_string(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn expand(&mut self, bytes: i64) -> Result<i64, tonic::Status> {
        self.node
            .node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: self.image.volume_id(),
                volume_path: self.target.display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                staging_target_path: self.staging.display().to_string(),
                volume_capability: Some(self.cap.clone()),
                secrets: HashMap::new(),
            })
            .await
            .map(|r| r.into_inner().capacity_bytes)
    }
}

pub fn assert_nothing_left(server: &TestServer) {
    let dir = server.dir.path();
    assert_eq!(mounts_under(dir), Vec::<PathBuf>::new(), "mounts left");
    assert_eq!(loops_under(dir), Vec::<PathBuf>::new(), "loop devices left");
    assert_eq!(
        fuse_processes_under(dir),
        Vec::<String>::new(),
        "rbd-fuse processes left"
    );
    let key_files: Vec<_> = walk(&server.config.runtime_dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n == "keyring" || n == "ceph.conf")
        })
        .collect();
    assert!(key_files.is_empty(), "key files left: {key_files:?}");
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

pub fn bytes_usage(stats: &csi::NodeGetVolumeStatsResponse, unit: Unit) -> &csi::VolumeUsage {
    stats
        .usage
        .iter()
        .find(|u| u.unit == unit as i32)
        .unwrap_or_else(|| panic!("no {unit:?} usage in {stats:?}"))
}
