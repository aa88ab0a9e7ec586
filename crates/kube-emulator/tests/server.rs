//! Serving over TCP: the kubeconfig works for a kube-rs client, shutdown ends the server.

mod common;

use std::time::Duration;

use common::pvc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_emulator::Emulator;

#[tokio::test]
async fn kubeconfig_client_over_tcp_can_write_and_watch_and_shutdown_stops_the_server() {
    let emu = Emulator::new();
    let server = emu.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    assert!(server.url().starts_with("http://127.0.0.1:"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(config.default_namespace, "default");
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(client);
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &pvc("tcp", Some("x"), "1Gi"))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), watch.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(p) => {
                assert_eq!(p.metadata.name.as_deref(), Some("tcp"));
                break;
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(emu.request_count("create", "persistentvolumeclaims"), 1);
    let addr = server.addr();
    tokio::time::timeout(Duration::from_secs(5), server.shutdown())
        .await
        .unwrap();
    // The open watch ends and new connections are refused.
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = watch.try_next().await {}
    })
    .await;
    assert!(end.is_ok(), "watch must end on shutdown");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
