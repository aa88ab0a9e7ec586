//! Fault injection, in-process and over HTTP.

mod common;

use std::time::{Duration, Instant};

use common::{pvc, raw};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::Emulator;
use serde_json::json;

fn setup() -> (Emulator, Api<PersistentVolumeClaim>) {
    let emu = Emulator::builder().pv_controller(false).build();
    let api = Api::default_namespaced(emu.client());
    (emu, api)
}

fn code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected API error, got {other:?}"),
    }
}

#[tokio::test]
async fn fail_next_answers_a_status_for_the_next_matching_requests_only() {
    let (emu, api) = setup();
    emu.faults()
        .fail_next("create", "persistentvolumeclaims", 2, 500);
    for _ in 0..2 {
        let e = api
            .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
            .await
            .unwrap_err();
        assert_eq!(code(e), (500, "InternalError".to_string()));
    }
    api.create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    emu.faults().fail_next("*", "*", 1, 409);
    assert_eq!(code(api.get("a").await.unwrap_err()).0, 409);
    api.get("a").await.unwrap();
}

#[tokio::test]
async fn too_many_requests_carries_retry_after() {
    let (emu, _) = setup();
    emu.faults()
        .fail_next("list", "persistentvolumeclaims", 1, 429);
    let r = raw(
        &emu,
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 429);
    assert_eq!(r.body["reason"], "TooManyRequests");
    assert_eq!(r.headers["retry-after"], "1");
    emu.faults()
        .fail_next("list", "persistentvolumeclaims", 1, 503);
    let r = raw(
        &emu,
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        None,
        "",
    )
    .await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
}

#[tokio::test]
async fn subresource_faults_match_only_the_subresource() {
    let (emu, api) = setup();
    api.create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    emu.faults()
        .fail_next("patch", "persistentvolumeclaims/status", 1, 500);
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    let e = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Pending"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(e).0, 500);
    assert_eq!(
        emu.request_count("patch", "persistentvolumeclaims/status"),
        1
    );
    assert_eq!(emu.request_count("patch", "*"), 2);
}

#[tokio::test]
async fn delay_next_delays_and_clear_removes_pending_faults() {
    let (emu, api) = setup();
    emu.faults().delay_next(
        "get",
        "persistentvolumeclaims",
        1,
        Duration::from_millis(300),
    );
    let start = Instant::now();
    let _ = api.get_opt("a").await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(300));
    emu.faults().fail_next("*", "*", 5, 500);
    emu.faults().clear();
    assert!(api.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn faults_can_be_injected_over_http() {
    let (emu, api) = setup();
    let post = |body: serde_json::Value| {
        let emu = emu.clone();
        async move {
            raw(
                &emu,
                "POST",
                "/emulator/faults",
                Some("application/json"),
                &body.to_string(),
            )
            .await
        }
    };
    let r = post(json!({"action": "fail", "verb": "get", "resource": "persistentvolumeclaims", "count": 1, "code": 500})).await;
    assert_eq!(r.status, 200);
    assert_eq!(code(api.get("x").await.unwrap_err()).0, 500);
    post(json!({"action": "delay", "verb": "get", "resource": "*", "count": 1, "delayMs": 200}))
        .await;
    let start = Instant::now();
    let _ = api.get_opt("x").await;
    assert!(start.elapsed() >= Duration::from_millis(200));
    let r = post(json!({"action": "drop-watches", "resource": "*"})).await;
    assert_eq!(r.body["dropped"], 0);
    assert_eq!(post(json!({"action": "clear"})).await.status, 200);
    assert_eq!(post(json!({"action": "explode"})).await.status, 400);
}

#[tokio::test]
async fn recorded_requests_carry_the_user_agent_verb_and_resource() {
    use k8s_openapi::api::core::v1::Secret;
    let emu = kube_emulator::Emulator::builder()
        .record_requests(true)
        .build();
    let server = emu.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static("recorder-test/1"),
    ));
    let client = kube::Client::try_from(config).unwrap();
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client, "kube-system");
    assert!(secrets.get_opt("nope").await.unwrap().is_none());
    let log = emu.requests();
    assert!(
        log.contains(&kube_emulator::RequestRecord {
            user_agent: "recorder-test/1".into(),
            verb: "get".into(),
            group: String::new(),
            resource: "secrets".into(),
            namespace: Some("kube-system".into()),
        }),
        "{log:?}"
    );
    // off by default
    assert!(kube_emulator::Emulator::new().requests().is_empty());
}
