//! Kubelet plugin registration over its own socket in the plugins registry directory.

mod common;

use std::path::PathBuf;

use common::{TestServer, connect};
use rbd_csi::proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use rbd_csi::{RegistrationConfig, Services};

#[tokio::test]
async fn kubelet_learns_type_name_endpoint_and_versions() {
    let registry = tempfile::tempdir().unwrap();
    let registry_dir = registry.path().to_path_buf();
    let server = TestServer::start(Services::Node, |c| {
        c.registration = Some(RegistrationConfig {
            registry_dir: registry_dir.clone(),
            kubelet_endpoint: Some(PathBuf::from(
                "/var/lib/kubelet/plugins/rbd.provisioner.ceph.io/csi.sock",
            )),
        });
    })
    .await;
    let socket = registry_dir.join("rbd.provisioner.ceph.io-reg.sock");
    common::wait_for_socket(&socket).await;
    let mut client = RegistrationClient::new(connect(&socket).await);
    let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "rbd.provisioner.ceph.io");
    assert_eq!(
        info.endpoint,
        "/var/lib/kubelet/plugins/rbd.provisioner.ceph.io/csi.sock"
    );
    assert_eq!(info.supported_versions, ["1.0.0"]);
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "driver name clash".into(),
        })
        .await
        .unwrap();
    server.stop().await.unwrap();
    assert!(!socket.exists(), "registration socket removed on shutdown");
}

#[tokio::test]
async fn endpoint_defaults_to_the_served_socket_and_controller_does_not_register() {
    let registry = tempfile::tempdir().unwrap();
    let registry_dir = registry.path().to_path_buf();
    let server = TestServer::start(Services::Node, |c| {
        c.driver_name = "rbd.example.org".into();
        c.registration = Some(RegistrationConfig {
            registry_dir: registry_dir.clone(),
            kubelet_endpoint: None,
        });
    })
    .await;
    let socket = registry_dir.join("rbd.example.org-reg.sock");
    common::wait_for_socket(&socket).await;
    let info = RegistrationClient::new(connect(&socket).await)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "rbd.example.org");
    assert_eq!(PathBuf::from(info.endpoint), server.socket);
    server.stop().await.unwrap();

    let controller_registry = tempfile::tempdir().unwrap();
    let dir = controller_registry.path().to_path_buf();
    let controller = TestServer::start(Services::Controller, |c| {
        c.registration = Some(RegistrationConfig {
            registry_dir: dir.clone(),
            kubelet_endpoint: None,
        });
    })
    .await;
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    controller.stop().await.unwrap();
}
