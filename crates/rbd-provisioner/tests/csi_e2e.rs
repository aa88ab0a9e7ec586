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
    fuse_volume_of(h, claim, dir, h.params()).await
}

/// The same for a class with `params` (plus ext4 and the fuse mapper).
async fn fuse_volume_of(
    h: &Harness,
    claim: &str,
    dir: &Path,
    mut params: Vec<(String, String)>,
) -> (PersistentVolume, NodeRequests) {
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

/// A volume of a `clusterID` class in a RADOS namespace, made by the built-in provisioner, is
/// staged by the node plugin from its PV after the cluster's monitors moved: the node takes them
/// from the (edited) cluster config, not from the monitors recorded in the PV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_cluster_id_pv_stages_with_the_monitors_the_config_gives_now() {
    let h = Harness::start().await;
    let namespace = format!("e2e-{}", std::process::id());
    let spec = format!("{}/{namespace}", h.ceph.pool);
    h.ceph.rbd(&["namespace", "create", &spec]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    let write_config = |monitors: &str| {
        let text = serde_json::json!([{"clusterID": "micro", "monitors": [monitors],
            "rbd": {"radosNamespace": namespace}}])
        .to_string();
        // as a ConfigMap volume does: a new file swapped in
        let next = config.with_extension("new");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &config).unwrap();
    };
    write_config(&h.ceph.monitors);
    let config_arg = format!("--cluster-config={}", config.display());
    let _p = h.spawn(
        &["--leader-elect=false", "--pv-source=csi", &config_arg],
        &[],
    );
    let mut params: Vec<(String, String)> = h
        .params()
        .into_iter()
        .filter(|(k, _)| k != "monitors")
        .collect();
    params.push(("clusterID".into(), "micro".into()));
    let (pv, r) = fuse_volume_of(&h, "tenant-data", dir.path(), params).await;
    let image = Harness::image_name(&pv);
    let handle = &pv
        .spec
        .as_ref()
        .unwrap()
        .csi
        .as_ref()
        .unwrap()
        .volume_handle;
    assert_eq!(handle, &format!("v2/micro/{spec}/{image}"));
    let in_namespace = h.ceph.rbd(&["ls", &spec]).unwrap();
    assert!(in_namespace.lines().any(|i| i == image), "{in_namespace}");
    assert!(!h.images().contains(&image), "not in the default namespace");

    // the monitors move: the config now names the monitor another way, and the address the PV
    // recorded answers no more
    write_config(&format!("localhost:{}", h.ceph.mon_port));
    let mut stage = r.stage.clone();
    stage
        .volume_context
        .insert("monitors".into(), "127.0.0.1:1".into());
    let node_dir = tempfile::tempdir().unwrap();
    let plugin = NodePlugin::start_with(
        node_dir.path(),
        &[
            "--services=node",
            "--default-mounter=fuse",
            "--node-id=node-1",
            &config_arg,
        ],
    );
    let mut node = plugin.client().await;
    node.node_stage_volume(stage).await.unwrap();
    node.node_publish_volume(r.publish.clone()).await.unwrap();
    std::fs::write(r.target.join("tenant.txt"), b"in the namespace").unwrap();
    node.node_unpublish_volume(r.unpublish.clone())
        .await
        .unwrap();
    node.node_unstage_volume(r.unstage.clone()).await.unwrap();
    assert!(!mounted(&r.target) && !mounted(&r.staging));

    // deleting the claim removes the image from the namespace (monitors from the config again)
    h.claims()
        .delete("tenant-data", &Default::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    assert_eq!(h.ceph.rbd(&["ls", &spec]).unwrap().trim(), "");
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

/// With `--topology-labels`, the node plugin reads its Node's labels through the Kubernetes API
/// at startup: a node without them does not start, and the message names the node and the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_its_topology_labels_does_not_start_and_says_which() {
    use k8s_openapi::api::core::v1::Node;
    let h = Harness::start().await;
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {
        "name": "unlabelled", "labels": {"kubernetes.io/hostname": "unlabelled"}}}))
    .unwrap();
    Api::<Node>::all(h.client.clone())
        .create(&Default::default(), &node)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = format!("--kubeconfig={}", h.kubeconfig.display());
    let mut plugin = NodePlugin::start_with(
        dir.path(),
        &[
            "--services=node",
            "--node-id=unlabelled",
            "--topology-labels=topology.kubernetes.io/zone",
            &kubeconfig,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = plugin.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the plugin did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap();
    assert!(
        log.contains("\"unlabelled\"") && log.contains("topology.kubernetes.io/zone"),
        "{log}"
    );
    assert!(!plugin.socket.exists(), "it never served");
}
