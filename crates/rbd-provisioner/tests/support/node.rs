//! The fuse data path for end-to-end tests: the node service of the same binary
//! (`rbd-provisioner csi --services=node --default-mounter=fuse`) stages and publishes a PV
//! exactly as the kubelet would (handle, attributes, the node-stage secret's data). Included
//! with `#[path = "support/node.rs"] mod node;` by the tests that read and write volume data.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::{Api, Client};
use rbd_csi::proto::csi::node_client::NodeClient;
use rbd_csi::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use rbd_csi::proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// The node plugin process; stopped (SIGTERM) on drop.
pub struct NodePlugin {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
    /// Set by [`NodePlugin::start_in_cluster`]: volumes are staged where a kubelet with this
    /// root directory stages them.
    kubelet_dir: Option<PathBuf>,
}

impl NodePlugin {
    pub fn start(dir: &Path) -> NodePlugin {
        NodePlugin::start_as(dir, "node-1")
    }

    /// The node plugin of the node `node_id`, its socket and runtime directory under `dir`.
    pub fn start_as(dir: &Path, node_id: &str) -> NodePlugin {
        NodePlugin::start_args(dir, node_id, &["--reclaim-space=false"], None)
    }

    /// The node plugin of `node_id` with Kubernetes API access through `kubeconfig` (so it
    /// answers ReclaimSpaceJobs' requests for its node); it stages volumes where a kubelet
    /// rooted at `<dir>/kubelet` would (`--kubelet-dir`).
    pub fn start_in_cluster(dir: &Path, node_id: &str, kubeconfig: &Path) -> NodePlugin {
        let kubelet = dir.join("kubelet");
        NodePlugin::start_args(
            dir,
            node_id,
            &[
                &format!("--kubeconfig={}", kubeconfig.display()),
                &format!("--kubelet-dir={}", kubelet.display()),
            ],
            Some(kubelet.clone()),
        )
    }

    /// The node plugin of `node_id` with extra `args`.
    pub fn start_args(
        dir: &Path,
        node_id: &str,
        args: &[&str],
        kubelet_dir: Option<PathBuf>,
    ) -> NodePlugin {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("csi.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .args(["csi", "--services=node", "--default-mounter=fuse"])
            .args(args)
            .arg(format!("--node-id={node_id}"))
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--runtime-dir={}", dir.join("run").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("node.log")).unwrap())
            .spawn()
            .unwrap();
        NodePlugin {
            child,
            socket,
            dir: dir.to_path_buf(),
            kubelet_dir,
        }
    }

    /// The plugin's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
    }

    pub async fn client(&self) -> NodeClient<Channel> {
        NodeClient::new(unix_channel(&self.socket).await)
    }

    /// Stages and publishes the CSI PV `pv` (fsType ext4), runs `f` on the mounted
    /// directory, then unpublishes and unstages it.
    pub async fn with_mounted<T>(
        &self,
        client: &Client,
        pv: &PersistentVolume,
        f: impl FnOnce(&Path) -> T,
    ) -> T {
        let target = self.mount(client, pv).await.unwrap();
        let result = f(&target);
        self.unmount(pv).await;
        result
    }

    /// The staging path and the publish target of the volume `handle`.
    pub fn paths(&self, handle: &str) -> (PathBuf, PathBuf) {
        let staging = match &self.kubelet_dir {
            Some(kubelet) => rbd_csi::node::reclaim::kubelet_staging_path(
                kubelet,
                rbd_csi::DEFAULT_DRIVER_NAME,
                handle,
            ),
            None => self.dir.join("staging"),
        };
        (staging, self.dir.join("pods/p1/volume"))
    }

    /// Stages and publishes the CSI PV `pv` (fsType ext4, single-node writer) as the kubelet
    /// does; returns the mounted target directory, or the refusal.
    pub async fn mount(
        &self,
        client: &Client,
        pv: &PersistentVolume,
    ) -> Result<PathBuf, tonic::Status> {
        let mut node = self.client().await;
        let csi = pv.spec.as_ref().unwrap().csi.clone().unwrap();
        let secrets = secret_data(client, pv).await;
        let cap = VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: csi.fs_type.clone().unwrap_or_else(|| "ext4".into()),
                ..Default::default()
            })),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        };
        let context: HashMap<String, String> = csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let handle = csi.volume_handle.clone();
        let (staging, target) = self.paths(&handle);
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: handle.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap.clone()),
            secrets,
            volume_context: context.clone(),
            ..Default::default()
        })
        .await?;
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: handle.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap),
            volume_context: context,
            ..Default::default()
        })
        .await?;
        assert!(mounted(&target), "{} not mounted", target.display());
        Ok(target)
    }

    /// Unpublishes and unstages what [`Self::mount`] mounted.
    pub async fn unmount(&self, pv: &PersistentVolume) {
        let node = self.client().await;
        let handle = volume_handle(pv);
        let (staging, target) = self.paths(&handle);
        // Retried while busy, as the kubelet retries: a process another test forks at that
        // moment holds a copy of the test's last file descriptor on the mount until its exec.
        let unpublish = NodeUnpublishVolumeRequest {
            volume_id: handle.clone(),
            target_path: target.display().to_string(),
        };
        retry_busy(|| {
            let (mut node, r) = (node.clone(), unpublish.clone());
            async move { node.node_unpublish_volume(r).await.map(drop) }
        })
        .await;
        let unstage = NodeUnstageVolumeRequest {
            volume_id: handle,
            staging_target_path: staging.display().to_string(),
        };
        retry_busy(|| {
            let (mut node, r) = (node.clone(), unstage.clone());
            async move { node.node_unstage_volume(r).await.map(drop) }
        })
        .await;
        assert!(!mounted(&target) && !mounted(&staging));
    }
}

impl Drop for NodePlugin {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

/// What the kubelet passes as node-stage secrets: the referenced Secret's data.
async fn secret_data(client: &Client, pv: &PersistentVolume) -> HashMap<String, String> {
    let r = pv
        .spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .node_stage_secret_ref
        .clone()
        .unwrap();
    let api: Api<Secret> = Api::namespaced(client.clone(), r.namespace.as_deref().unwrap());
    let secret = api.get(r.name.as_deref().unwrap()).await.unwrap();
    let mut data: HashMap<String, String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect();
    for (k, v) in secret.string_data.unwrap_or_default() {
        data.entry(k).or_insert(v);
    }
    data
}

pub fn mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*p))
}

/// Runs `call` until it succeeds; a "busy" failure is retried for up to 10 s, others panic.
async fn retry_busy<F, Fut>(mut call: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call().await {
            Ok(()) => return,
            Err(s) if s.message().contains("busy") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("{s:?}"),
        }
    }
}

/// A tonic channel over the unix socket at `socket`, once something listens there (10 s).
pub async fn unix_channel(socket: &Path) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::UnixStream::connect(socket).await.is_err() {
        assert!(Instant::now() < deadline, "the node plugin never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let path = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap()
}

/// `spec.csi.volumeHandle` of a CSI PV.
pub fn volume_handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle
        .clone()
}
