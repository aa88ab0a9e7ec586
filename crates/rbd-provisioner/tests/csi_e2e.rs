//! The whole chain on this machine: the provisioner (csi PV mode) makes a PV, and the node
//! service of the same binary (`rbd-provisioner csi --services node`, fuse-loop mapper) stages
//! and publishes exactly what that PV says, as the kubelet would: volume handle, volume
//! attributes, fsType, and the data of the node-stage secret.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::Api;
use rbd_csi::proto::csi::node_client::NodeClient;
use rbd_csi::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use rbd_csi::proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use support::Harness;
use tonic::transport::{Channel, Endpoint, Uri};

/// The node plugin process; stopped on drop.
struct NodePlugin {
    child: Child,
    socket: PathBuf,
}

impl NodePlugin {
    fn start(dir: &Path) -> NodePlugin {
        NodePlugin::start_with(
            dir,
            &[
                "--services=node",
                "--default-mounter=fuse",
                "--node-id=node-1",
            ],
        )
    }

    /// `rbd-provisioner csi ARGS` serving on a socket in `dir`.
    fn start_with(dir: &Path, args: &[&str]) -> NodePlugin {
        let socket = dir.join("csi.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .arg("csi")
            .args(args)
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--runtime-dir={}", dir.join("run").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("node.log")).unwrap())
            .spawn()
            .unwrap();
        NodePlugin { child, socket }
    }

    async fn client(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel().await)
    }

    async fn channel(&self) -> Channel {
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::UnixStream::connect(&self.socket).await.is_err() {
            assert!(Instant::now() < deadline, "the node plugin never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let path = self.socket.clone();
        Endpoint::try_from("http://[::]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .unwrap()
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
async fn secret_data(h: &Harness, pv: &PersistentVolume) -> HashMap<String, String> {
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
    let api: Api<Secret> = Api::namespaced(h.client.clone(), r.namespace.as_deref().unwrap());
    let secret = api.get(r.name.as_deref().unwrap()).await.unwrap();
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

fn mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*p))
}

/// The four node requests the kubelet sends for one CSI PV made by the provisioner, staged
/// under `dir/staging` and published at `dir/pods/p1/volume`.
struct NodeRequests {
    stage: NodeStageVolumeRequest,
    publish: NodePublishVolumeRequest,
    unpublish: NodeUnpublishVolumeRequest,
    unstage: NodeUnstageVolumeRequest,
    staging: PathBuf,
    target: PathBuf,
}

/// A Bound fuse-mapped ext4 CSI PV for a new claim `claim`, and the node requests for it.
async fn fuse_volume(h: &Harness, claim: &str, dir: &Path) -> (PersistentVolume, NodeRequests) {
    let mut params = h.params();
    params.push(("fsType".into(), "ext4".into()));
    params.push(("mounter".into(), "fuse".into()));
    h.create_class("csi", &params, "Delete").await;
    h.create_claim(claim, "csi", "64Mi", false).await;
    let (_, pv) = h.wait_bound(claim).await;
    let csi = pv.spec.as_ref().unwrap().csi.clone().unwrap();
    let secrets = secret_data(h, &pv).await;
    let staging = dir.join("staging");
    let target = dir.join("pods/p1/volume");
    let cap = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: csi.fs_type.clone().unwrap(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let stage = NodeStageVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets,
        volume_context: csi.volume_attributes.clone().unwrap().into_iter().collect(),
        ..Default::default()
    };
    let publish = NodePublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        volume_context: stage.volume_context.clone(),
        ..Default::default()
    };
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        target_path: target.display().to_string(),
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        staging_target_path: staging.display().to_string(),
    };
    let requests = NodeRequests {
        stage,
        publish,
        unpublish,
        unstage,
        staging,
        target,
    };
    (pv, requests)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csi_pv_from_the_provisioner_stages_publishes_and_keeps_its_data() {
    let h = Harness::start().await;
    let _p = h.spawn(&["--leader-elect=false", "--pv-source=csi"], &[]);
    let dir = tempfile::tempdir().unwrap();
    let (pv, r) = fuse_volume(&h, "app-data", dir.path()).await;
    let NodeRequests {
        stage,
        publish,
        unpublish,
        unstage,
        staging,
        target,
    } = r;
    let plugin = NodePlugin::start(dir.path());
    let mut node = plugin.client().await;

    node.node_stage_volume(stage.clone()).await.unwrap();
    node.node_publish_volume(publish.clone()).await.unwrap();
    assert!(mounted(&target));
    std::fs::write(
        target.join("hello.txt"),
        b"written through the CSI node service",
    )
    .unwrap();
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    assert!(!mounted(&target) && !mounted(&staging));

    // a second stage (another "node") finds the filesystem and the file: no mkfs over data
    node.node_stage_volume(stage).await.unwrap();
    node.node_publish_volume(publish).await.unwrap();
    assert_eq!(
        std::fs::read(target.join("hello.txt")).unwrap(),
        b"written through the CSI node service"
    );
    node.node_unpublish_volume(unpublish).await.unwrap();
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(!mounted(&target) && !mounted(&staging));

    // the image is not in use anymore: deleting the claim removes it
    let image = Harness::image_name(&pv);
    h.claims()
        .delete("app-data", &Default::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    assert!(!h.images().contains(&image));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_and_capacity_use_the_configured_cluster() {
    use rbd_csi::proto::csi::controller_client::ControllerClient;
    use rbd_csi::proto::csi::identity_client::IdentityClient;
    let ceph = micro_ceph::cluster();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("probe.key");
    std::fs::write(&key_file, &ceph.admin_key).unwrap();
    let monitors = format!("--monitors={}", ceph.monitors);
    let key_arg = format!("--probe-key-file={}", key_file.display());
    let plugin =
        NodePlugin::start_with(dir.path(), &["--services=controller", &monitors, &key_arg]);
    let channel = plugin.channel().await;
    let probe = IdentityClient::new(channel.clone())
        .probe(rbd_csi::proto::csi::ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    let capacity = ControllerClient::new(channel)
        .get_capacity(rbd_csi::proto::csi::GetCapacityRequest {
            parameters: [("pool".to_string(), ceph.pool.clone())].into(),
            ..Default::default()
        })
        .await;
    assert!(capacity.is_ok(), "{capacity:?}");
}

/// `rbd-provisioner csi` ends with status 0 on SIGTERM, 20 times in a row, with its Ceph
/// connection open (Probe and GetCapacity just used it) and a volume staged and published
/// through the fuse mapper; the mounts stay usable for the next instance, which unpublishes and
/// unstages them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_csi_plugin_exits_cleanly_on_sigterm_and_leaves_its_mounts() {
    use rbd_csi::proto::csi::controller_client::ControllerClient;
    use rbd_csi::proto::csi::identity_client::IdentityClient;
    use std::os::unix::process::ExitStatusExt;
    let h = Harness::start().await;
    let _p = h.spawn(&["--leader-elect=false", "--pv-source=csi"], &[]);
    let dir = tempfile::tempdir().unwrap();
    let (_, r) = fuse_volume(&h, "kept-mounted", dir.path()).await;
    let key_file = dir.path().join("probe.key");
    std::fs::write(&key_file, &h.ceph.admin_key).unwrap();
    let monitors = format!("--monitors={}", h.ceph.monitors);
    let key_arg = format!("--probe-key-file={}", key_file.display());
    let args = [
        "--services=all",
        "--default-mounter=fuse",
        "--node-id=node-1",
        monitors.as_str(),
        key_arg.as_str(),
    ];
    let (staging, target) = (r.staging.clone(), r.target.clone());
    for round in 0..20 {
        let mut plugin = NodePlugin::start_with(dir.path(), &args);
        let channel = plugin.channel().await;
        let probe = IdentityClient::new(channel.clone())
            .probe(rbd_csi::proto::csi::ProbeRequest {})
            .await
            .unwrap();
        assert_eq!(probe.into_inner().ready, Some(true), "round {round}");
        ControllerClient::new(channel.clone())
            .get_capacity(rbd_csi::proto::csi::GetCapacityRequest {
                parameters: [("pool".to_string(), h.ceph.pool.clone())].into(),
                ..Default::default()
            })
            .await
            .unwrap();
        // staged once, then idempotent: the next instances find it staged and published
        let mut node = NodeClient::new(channel);
        node.node_stage_volume(r.stage.clone()).await.unwrap();
        node.node_publish_volume(r.publish.clone()).await.unwrap();
        if round == 0 {
            std::fs::write(target.join("kept.txt"), b"survives plugin restarts").unwrap();
        }
        drop(node);
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(plugin.child.id().to_string())
            .status();
        let end = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = plugin.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < end,
                "round {round}: still running 30 s after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
        assert!(
            status.signal().is_none() && status.code() == Some(0),
            "round {round}: ended with {status:?}, expected exit status 0\n{log}"
        );
        assert!(
            mounted(&staging) && mounted(&target),
            "round {round}: mounts gone"
        );
        assert_eq!(
            std::fs::read(target.join("kept.txt")).unwrap(),
            b"survives plugin restarts",
            "round {round}"
        );
    }
    // the next instance takes the mounts down
    let plugin = NodePlugin::start_with(dir.path(), &args);
    let mut node = plugin.client().await;
    node.node_unpublish_volume(r.unpublish).await.unwrap();
    node.node_unstage_volume(r.unstage).await.unwrap();
    assert!(!mounted(&target) && !mounted(&staging));
}
