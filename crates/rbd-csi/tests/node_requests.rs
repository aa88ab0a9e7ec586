//! Node and Identity services over a real unix socket: capabilities, info, and the CSI error-code
//! rules (INVALID_ARGUMENT naming the field, idempotent unstage/unpublish, NOT_FOUND, ABORTED).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestServer, block_cap, connect, mount_cap, strings};
use rbd_csi::mapper::{ImageSpec, Key, MapError, MappedDevice, Mapper, MounterKind};
use rbd_csi::node::{NodeConfig, NodeService};
use rbd_csi::proto::csi::{self, node_server::NodeServer};
use rbd_csi::{Services, server::bind_unix};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Code;

fn stage_request(volume_id: &str, staging: &str) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(mount_cap("ext4")),
        volume_context: strings(&[("mounter", "fuse")]),
        secrets: strings(&[("userKey", "AQBfake==")]),
        ..Default::default()
    }
}

#[tokio::test]
async fn identity_reports_name_version_capabilities_and_ready() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let mut identity = server.identity().await;
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "rbd.provisioner.ceph.io");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));

    let caps = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    use csi::plugin_capability::{Type, service, volume_expansion};
    assert!(caps.iter().any(|c| matches!(&c.r#type,
        Some(Type::Service(s)) if s.r#type == service::Type::ControllerService as i32)));
    assert!(caps.iter().any(|c| matches!(&c.r#type,
        Some(Type::Service(s)) if s.r#type == service::Type::GroupControllerService as i32)));
    assert!(caps.iter().any(|c| matches!(&c.r#type,
        Some(Type::VolumeExpansion(e)) if e.r#type == volume_expansion::Type::Online as i32)));

    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(probe.ready, Some(true));
}

#[tokio::test]
async fn driver_name_is_configurable() {
    let server =
        TestServer::start(Services::Node, |c| c.driver_name = "rbd.example.org".into()).await;
    let info = server
        .identity()
        .await
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "rbd.example.org");
}

#[tokio::test]
async fn node_capabilities_and_info() {
    let server = TestServer::start(Services::Node, |c| c.max_volumes_per_node = 32).await;
    let mut node = server.node().await;
    let caps: Vec<i32> = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| {
            c.r#type
                .map(|csi::node_service_capability::Type::Rpc(rpc)| rpc.r#type)
        })
        .collect();
    use csi::node_service_capability::rpc::Type;
    for want in [
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::VolumeCondition,
        Type::ExpandVolume,
    ] {
        assert!(caps.contains(&(want as i32)), "missing {want:?}");
    }
    let info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "test-node-1");
    assert_eq!(info.max_volumes_per_node, 32);
}

#[tokio::test]
async fn node_only_server_does_not_serve_controller() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let err = server
        .controller()
        .await
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}

async fn assert_invalid<T: std::fmt::Debug>(result: Result<T, tonic::Status>, field: &str) {
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains(field),
        "message {:?} should name {field}",
        err.message()
    );
}

#[tokio::test]
async fn missing_fields_are_invalid_argument_naming_the_field() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let mut node = server.node().await;
    let staging = server.dir.path().join("staging").display().to_string();

    let mut req = stage_request("", &staging);
    assert_invalid(node.node_stage_volume(req.clone()).await, "volume_id").await;
    req = stage_request("v1/m:1/p/i", "");
    assert_invalid(
        node.node_stage_volume(req.clone()).await,
        "staging_target_path",
    )
    .await;
    req = stage_request("v1/m:1/p/i", &staging);
    req.volume_capability = None;
    assert_invalid(node.node_stage_volume(req).await, "volume_capability").await;
    req = stage_request("v1/m:1/p/i", &staging);
    req.secrets.clear();
    assert_invalid(node.node_stage_volume(req).await, "userKey").await;
    req = stage_request("v1/m:1/p/i", &staging);
    req.volume_capability = Some(mount_cap("btrfs"));
    assert_invalid(node.node_stage_volume(req).await, "btrfs").await;

    assert_invalid(
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "v1/m:1/p/i".into(),
            staging_target_path: String::new(),
        })
        .await,
        "staging_target_path",
    )
    .await;
    assert_invalid(
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: "v1/m:1/p/i".into(),
            staging_target_path: staging.clone(),
            target_path: String::new(),
            volume_capability: Some(block_cap()),
            ..Default::default()
        })
        .await,
        "target_path",
    )
    .await;
    assert_invalid(
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: "v1/m:1/p/i".into(),
            staging_target_path: staging.clone(),
            target_path: "/tmp/x".into(),
            volume_capability: None,
            ..Default::default()
        })
        .await,
        "volume_capability",
    )
    .await;
    assert_invalid(
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: String::new(),
            target_path: "/tmp/x".into(),
        })
        .await,
        "volume_id",
    )
    .await;
    assert_invalid(
        node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: String::new(),
            staging_target_path: String::new(),
        })
        .await,
        "volume_path",
    )
    .await;
    assert_invalid(
        node.node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: String::new(),
            volume_path: "/tmp".into(),
            ..Default::default()
        })
        .await,
        "volume_id",
    )
    .await;
}

#[tokio::test]
async fn unstage_and_unpublish_of_unknown_paths_succeed() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let mut node = server.node().await;
    let staging = server.dir.path().join("never-staged");
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: "v1/m:1/p/i".into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    let target = server.dir.path().join("never-published");
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: "v1/m:1/p/i".into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    // An existing, unmounted target directory is removed.
    std::fs::create_dir(&target).unwrap();
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: "v1/m:1/p/i".into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    assert!(!target.exists());
}

#[tokio::test]
async fn publish_of_unstaged_volume_is_failed_precondition() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let err = server
        .node()
        .await
        .node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: "v1/m:1/p/i".into(),
            staging_target_path: server.dir.path().join("s").display().to_string(),
            target_path: server.dir.path().join("t").display().to_string(),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn stats_and_expand_of_missing_path_are_not_found_and_unmounted_dir_is_abnormal() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let mut node = server.node().await;
    let missing = server.dir.path().join("gone").display().to_string();
    let err = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: missing.clone(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: "v".into(),
            volume_path: missing,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let plain = server.dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let stats = node
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: "v".into(),
            volume_path: plain.display().to_string(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let condition = stats.volume_condition.unwrap();
    assert!(condition.abnormal);
    assert!(condition.message.contains("not a mount point"));
}

/// A mapper whose map of image "slow" blocks until released, and fails every map.
struct GateMapper {
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl Mapper for GateMapper {
    fn kind(&self) -> MounterKind {
        MounterKind::FuseLoop
    }
    async fn map(&self, image: &ImageSpec, _key: &Key) -> Result<MappedDevice, MapError> {
        if image.image == "slow" {
            self.entered.notify_one();
            self.release.notified().await;
        }
        Err(MapError::ImageNotFound {
            pool: image.pool.clone(),
            image: image.image.clone(),
        })
    }
    async fn unmap(&self, _mapped: &MappedDevice, _image: &ImageSpec) -> Result<(), MapError> {
        Ok(())
    }
}

#[tokio::test]
async fn concurrent_calls_on_one_volume_are_aborted_other_volumes_proceed() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("node.sock");
    let release = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let node = NodeService::with_mappers(
        NodeConfig {
            node_id: "n".into(),
            default_mounter: MounterKind::FuseLoop,
            runtime_dir: dir.path().join("run"),
            krbd_map_options: None,
            max_volumes_per_node: 0,
            cluster_config: None,
            topology: Default::default(),
            daemons: Default::default(),
            kms_config: Default::default(),
            secrets: None,
        },
        vec![Arc::new(GateMapper {
            entered: Arc::clone(&entered),
            release: Arc::clone(&release),
        })],
    )
    .with_cluster_check(Arc::new(common::NoCluster));
    let listener = bind_unix(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeServer::new(node))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let channel = connect(&socket).await;
    let mut slow_client = csi::node_client::NodeClient::new(channel.clone());
    let staging = dir.path().join("s1").display().to_string();
    let slow_req = stage_request("v1/m:1/p/slow", &staging);
    let slow = tokio::spawn(async move { slow_client.node_stage_volume(slow_req).await });

    let mut client = csi::node_client::NodeClient::new(channel);
    // Once the slow stage is inside the mapper (holding the volume), a second call is ABORTED.
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("slow stage never reached the mapper");
    let err = client
        .node_stage_volume(stage_request("v1/m:1/p/slow", &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    assert!(err.message().contains("pending"));
    // Another volume is not blocked: it reaches the mapper (NOT_FOUND from the fake).
    let other = client
        .node_stage_volume(stage_request(
            "v1/m:1/p/other",
            &dir.path().join("s2").display().to_string(),
        ))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::NotFound);
    // Unstage of the busy volume is serialised too.
    let err = client
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "v1/m:1/p/slow".into(),
            staging_target_path: staging.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);

    release.notify_one();
    let slow = slow.await.unwrap().unwrap_err();
    assert_eq!(slow.code(), Code::NotFound);
    // Released: the volume accepts calls again.
    client
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: "v1/m:1/p/slow".into(),
            staging_target_path: staging,
        })
        .await
        .unwrap();
    server.abort();
}

#[tokio::test]
async fn stale_socket_is_replaced_and_removed_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    assert!(socket.exists(), "stale socket file left by a dead process");
    let server = TestServer::start(Services::Node, |c| c.endpoint = socket.clone()).await;
    server
        .identity()
        .await
        .probe(csi::ProbeRequest {})
        .await
        .unwrap();
    server.stop().await.unwrap();
    assert!(!socket.exists());
}

#[tokio::test]
async fn invalid_configuration_is_refused_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let config = rbd_csi::CsiConfig {
        endpoint: socket.clone(),
        driver_name: "rbd_csi".into(),
        ..rbd_csi::CsiConfig::default()
    };
    let err = rbd_csi::serve(config, async {}).await.unwrap_err();
    assert!(matches!(err, rbd_csi::CsiError::Config(_)), "{err}");
    assert!(err.to_string().contains("rbd_csi"));
    assert!(!socket.exists());
}

#[test]
fn key_files_a_killed_plugin_left_are_swept_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let keys = run.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    // A killed process's transient key file, and one of a map this process has in flight.
    let leftover = keys.join("krbd-4194304-0");
    let in_flight = keys.join(format!("nbd-{}-3", std::process::id()));
    std::fs::write(&leftover, "AQBsecret==").unwrap();
    std::fs::write(&in_flight, "AQBsecret==").unwrap();
    // An rbd-fuse instance that is gone (its mount point is no mount), and its files.
    let instance = run.join("fuse/0123456789abcdef");
    std::fs::create_dir_all(instance.join("mnt")).unwrap();
    for name in ["keyring", "ceph.conf", "rbd-fuse.log"] {
        std::fs::write(instance.join(name), "[client.admin]\n\tkey = AQBsecret==\n").unwrap();
    }

    let _node = NodeService::new(NodeConfig {
        node_id: "n".into(),
        default_mounter: MounterKind::FuseLoop,
        runtime_dir: run.clone(),
        krbd_map_options: None,
        max_volumes_per_node: 0,
        cluster_config: None,
        topology: Default::default(),
        daemons: Default::default(),
        kms_config: Default::default(),
        secrets: None,
    });
    assert!(!leftover.exists(), "a leftover key file survived startup");
    assert!(in_flight.exists(), "a key file of this process was removed");
    assert!(
        !instance.exists(),
        "a gone rbd-fuse instance's keyring survived startup"
    );
}
