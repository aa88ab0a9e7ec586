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

/// `GET /emulator/stats` counts requests per client (`User-Agent`), verb and resource, for
/// benchmarks that report a client's requests per claim.
#[tokio::test]
async fn stats_count_requests_by_user_agent_verb_and_resource() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let emu = Emulator::new();
    let server = emu.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let get = |path: &str, agent: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: {agent}\r\nConnection: close\r\n\r\n"
        )
    };
    let fetch = |request: String| {
        let addr = server.addr();
        async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            answer
        }
    };
    for _ in 0..3 {
        fetch(get(
            "/api/v1/namespaces/default/persistentvolumeclaims",
            "bench-a/1",
        ))
        .await;
    }
    fetch(get("/api/v1/persistentvolumes/x", "bench-b/1")).await;
    let answer = fetch(get("/emulator/stats", "reader")).await;
    let body = answer.split("\r\n\r\n").nth(1).unwrap();
    let stats: serde_json::Value = serde_json::from_str(body).unwrap();
    let count = |agent: &str, verb: &str, resource: &str| {
        stats["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["userAgent"] == agent && r["verb"] == verb && r["resource"] == resource)
            .map(|r| r["count"].as_u64().unwrap())
    };
    assert_eq!(
        count("bench-a/1", "list", "persistentvolumeclaims"),
        Some(3)
    );
    assert_eq!(count("bench-b/1", "get", "persistentvolumes"), Some(1));
    assert_eq!(count("reader", "get", "persistentvolumes"), None);
    assert_eq!(stats["stalls"]["slowAnswers"], 0);
    assert!(stats["stalls"]["maxAnswerMs"].as_f64().unwrap() < 1000.0);
    assert_eq!(emu.stats()["requests"], stats["requests"]);
    server.shutdown().await;
}
