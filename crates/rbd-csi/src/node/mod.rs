//! The CSI Node service: stage (map + mkfs when blank + mount), publish (bind mount), unpublish,
//! unstage (unmount + unmap), expand, stats, capabilities and info; and, outside CSI, reclaiming
//! a staged volume's free space ([`reclaim`]).
//!
//! Every call is idempotent as the CSI specification requires, and calls on one volume are
//! serialised: a call arriving while another one for the same volume runs gets `ABORTED`
//! (the CO retries), calls on other volumes proceed ([`crate::locks`]).
//!
//! System calls that can block (`mount(2)`, `umount2(2)`, `statvfs(2)`, device ioctls, file
//! creation on a possibly hung mount) run on tokio's blocking pool ([`blocking`]) and helper
//! programs through `tokio::process`, never on the async worker threads: a stuck mount stalls
//! only the call that touches it, not every other call of the plugin.

pub mod access;
mod crypt;
mod publish;
pub mod reclaim;
pub mod record;
pub mod request;
mod stage;
mod stats;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::locks::VolumeLocks;
use crate::mapper::fuse_loop::FuseLoopMapper;
use crate::mapper::krbd::KrbdMapper;
use crate::mapper::nbd::NbdMapper;
use crate::mapper::{Mapper, MounterKind};
use crate::proto::csi::{self, node_server::Node, node_service_capability};

/// Settings of the node service.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's ID as `NodeGetInfo` reports it (the Kubernetes node name).
    pub node_id: String,
    /// Mapper for volumes whose context names none.
    pub default_mounter: MounterKind,
    /// Private directory for key files and rbd-fuse instances; should be on tmpfs.
    pub runtime_dir: PathBuf,
    /// `rbd map -o` options for the krbd mapper.
    pub krbd_map_options: Option<String>,
    /// `NodeGetInfo`'s `max_volumes_per_node` (0 = no limit).
    pub max_volumes_per_node: i64,
    /// The cluster config, for volumes of a `clusterID` class (their monitors are looked up
    /// when they are staged).
    pub cluster_config: Option<std::sync::Arc<rbd_volume::clusters::ClusterConfigFile>>,
    /// `NodeGetInfo`'s `accessible_topology` segments (`topology.<driver>/<domain>` to the
    /// node's label value); empty: none reported.
    pub topology: std::collections::BTreeMap<String, String>,
    /// Where the rbd-fuse and rbd-nbd daemons start, so that they outlive the plugin.
    pub daemons: crate::mapper::daemon::DaemonPlacement,
    /// The KMS configuration of encrypted volumes (ceph-csi's `config.json`), read when an
    /// encrypted volume is staged.
    pub kms_config: PathBuf,
    /// Kubernetes Secrets for the KMS entries that need them ([`crate::CsiConfig::secrets`]).
    pub secrets: Option<Arc<dyn rbd_volume::encryption::secrets::SecretStore>>,
}

/// The Node service.
#[derive(Clone)]
pub struct NodeService {
    config: NodeConfig,
    mappers: HashMap<MounterKind, Arc<dyn Mapper>>,
    locks: VolumeLocks,
    cluster: Arc<dyn access::ClusterCheck>,
    /// The Ceph clients of this node's own mappings ([`access::OwnClients`]).
    own_clients: access::OwnClients,
}

impl std::fmt::Debug for NodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NodeService {
    /// A node service with the three standard mappers. Sweeps key files a killed plugin left in
    /// the runtime directory first ([`sweep_runtime_dir`]).
    #[must_use]
    pub fn new(config: NodeConfig) -> Self {
        sweep_runtime_dir(&config.runtime_dir);
        warn_unless_in_memory(&config.runtime_dir);
        let keys = config.runtime_dir.join("keys");
        let mappers: Vec<Arc<dyn Mapper>> = vec![
            Arc::new(KrbdMapper::new(
                keys.clone(),
                config.krbd_map_options.clone(),
            )),
            Arc::new(NbdMapper::new(keys).with_placement(config.daemons.clone())),
            Arc::new(
                FuseLoopMapper::new(&config.runtime_dir).with_placement(config.daemons.clone()),
            ),
        ];
        Self::with_mappers(config, mappers)
    }

    /// A node service with the given mappers (one per kind; tests can substitute fakes).
    #[must_use]
    pub fn with_mappers(config: NodeConfig, mappers: Vec<Arc<dyn Mapper>>) -> Self {
        Self {
            mappers: mappers.into_iter().map(|m| (m.kind(), m)).collect(),
            locks: VolumeLocks::new(),
            cluster: Arc::new(access::CephCheck),
            own_clients: access::OwnClients::new(&config.runtime_dir),
            config,
        }
    }

    /// Replaces the check stage makes with the caller's key before mapping (tests without a
    /// cluster; the default asks Ceph, [`access::CephCheck`]).
    #[must_use]
    pub fn with_cluster_check(mut self, check: Arc<dyn access::ClusterCheck>) -> Self {
        self.cluster = check;
        self
    }

    fn mapper(&self, kind: MounterKind) -> Result<&Arc<dyn Mapper>, Status> {
        self.mappers.get(&kind).ok_or_else(|| {
            Status::invalid_argument(format!("mounter {kind} is not available on this node"))
        })
    }
}

/// Says so (a warning at start) when `runtime_dir`, where key files and rbd-fuse's keyrings
/// are written, is not on a tmpfs (or ramfs): keys written there could reach a disk.
fn warn_unless_in_memory(runtime_dir: &std::path::Path) {
    if let Some((on, magic)) = not_in_memory(runtime_dir) {
        tracing::warn!(
            runtime_dir = %runtime_dir.display(),
            on = %on.display(),
            fs_type = format!("{magic:#x}"),
            "the runtime directory is not on a tmpfs: the Ceph key files the node writes there \
             (for rbd-nbd, rbd-fuse, krbd) could reach a disk; mount a tmpfs there (--runtime-dir, \
             deploy/csi/node.yaml uses the host's /run/rbd-csi)"
        );
    }
}

/// The directory judged and its file system type when `dir` is not on a tmpfs or ramfs; a
/// directory not made yet is judged by the file system it will be made on.
fn not_in_memory(dir: &std::path::Path) -> Option<(&std::path::Path, libc::__fsword_t)> {
    /// `RAMFS_MAGIC` of `<linux/magic.h>` (not in libc).
    const RAMFS_MAGIC: libc::__fsword_t = 0x8584_58f6;
    let (on, magic) = dir
        .ancestors()
        .find_map(|d| crate::fs::fs_magic(d).ok().map(|magic| (d, magic)))?;
    (magic != libc::TMPFS_MAGIC && magic != RAMFS_MAGIC).then_some((on, magic))
}

/// Removes key material a killed plugin process left in `runtime_dir`: the transient key files of
/// `rbd map`/`rbd-nbd map` in `keys/` (named `<mapper>-<pid>-<n>`; those of this process are
/// kept), and the keyring, `ceph.conf` and log of every `rbd-fuse` instance directory in `fuse/`
/// whose mount point is not a FUSE mount any more (the instance is gone). A live instance keeps
/// its files: it serves volumes staged before the restart. Best effort: what cannot be removed is
/// logged.
pub fn sweep_runtime_dir(runtime_dir: &std::path::Path) {
    let own = format!("-{}-", std::process::id());
    for entry in read_dir_or_empty(&runtime_dir.join("keys")) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && !name.contains(&own) {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed a key file left by an earlier run");
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover key file");
                }
            }
        }
    }
    for entry in read_dir_or_empty(&runtime_dir.join("fuse")) {
        let dir = entry.path();
        let mnt = dir.join("mnt");
        let live = crate::mount::mount_at(&mnt)
            .ok()
            .flatten()
            .is_some_and(|m| m.fs_type.starts_with("fuse"));
        if live || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for name in ["keyring", "ceph.conf", "rbd-fuse.log"] {
            let path = dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed a file of an rbd-fuse instance that is gone");
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover instance file");
                }
            }
        }
        // Empty directories only: never anything under a mount point.
        let _ = std::fs::remove_dir(&mnt);
        let _ = std::fs::remove_dir(&dir);
    }
}

fn read_dir_or_empty(dir: &std::path::Path) -> Vec<std::fs::DirEntry> {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

/// Runs blocking node work on the blocking thread pool.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, Status> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("node task failed: {e}")))?
}

fn rpc_capability(kind: node_service_capability::rpc::Type) -> csi::NodeServiceCapability {
    csi::NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        stage::stage(self, request.into_inner()).await?;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        stage::unstage(self, request.into_inner()).await?;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let (node, req) = (self.clone(), request.into_inner());
        blocking(move || publish::publish(&node, &req)).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let (node, req) = (self.clone(), request.into_inner());
        blocking(move || publish::unpublish(&node, &req)).await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        Ok(Response::new(
            blocking(move || stats::volume_stats(&req)).await?,
        ))
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Ok(Response::new(
            stats::expand(self, request.into_inner()).await?,
        ))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: [
                Type::StageUnstageVolume,
                Type::GetVolumeStats,
                Type::VolumeCondition,
                Type::ExpandVolume,
            ]
            .into_iter()
            .map(rpc_capability)
            .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node,
            accessible_topology: (!self.config.topology.is_empty()).then(|| csi::Topology {
                segments: self
                    .config
                    .topology
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn a_runtime_directory_off_tmpfs_is_noticed_and_one_on_tmpfs_is_not() {
        // /dev/shm is a tmpfs on Linux; a directory not made yet is judged by its parent's
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(
                super::not_in_memory(Path::new("/dev/shm/rbd-csi/not-yet")),
                None
            );
        }
        let (on, magic) = super::not_in_memory(Path::new("/proc/self")).expect("procfs");
        assert_eq!(
            (on, magic),
            (Path::new("/proc/self"), libc::PROC_SUPER_MAGIC)
        );
    }
}
