//! Raw HTTP answers compared with the recordings of kube-apiserver 1.36 (tests/traces/).

mod common;

use std::time::Duration;

use common::{eventually, raw, recorded};
use kube_emulator::Emulator;
use serde_json::{Value, json};

const PVCS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";
const JSON: Option<&str> = Some("application/json");

fn emu() -> Emulator {
    Emulator::builder().pv_controller(false).build()
}

fn step_request(file: &str, step: u64) -> (String, String, Option<String>, String) {
    let s = recorded(file, step);
    let req = &s["request"];
    let body = match &req["body"] {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    (
        req["method"].as_str().unwrap().to_string(),
        req["path"].as_str().unwrap().to_string(),
        req["contentType"].as_str().map(str::to_string),
        body,
    )
}

/// Replays a recorded request and asserts the Status body equals the recorded one.
async fn replay_status(emu: &Emulator, file: &str, step: u64) {
    let (method, path, ct, body) = step_request(file, step);
    let r = raw(emu, &method, &path, ct.as_deref(), &body).await;
    let want = &recorded(file, step)["response"];
    assert_eq!(
        r.status as u64,
        want["status"].as_u64().unwrap(),
        "{file} step {step}: {}",
        r.text
    );
    assert_eq!(r.body, want["body"], "{file} step {step}");
}

async fn create_pvc(emu: &Emulator, name: &str) -> Value {
    let body = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": "default"},
        "spec": {"storageClassName": "rbd-immediate", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let r = raw(emu, "POST", PVCS, JSON, &body.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    r.body
}

#[tokio::test]
async fn status_bodies_match_the_recordings() {
    let emu = emu();
    create_pvc(&emu, "pvc-errors").await;
    for step in [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 26] {
        replay_status(&emu, "07-errors-concurrency.json", step).await;
    }
}

#[tokio::test]
async fn stale_resource_version_conflict_matches_the_recording() {
    let emu = emu();
    let created = create_pvc(&emu, "pvc-errors").await;
    let mut stale = created.clone();
    raw(
        &emu,
        "PATCH",
        &format!("{PVCS}/pvc-errors"),
        Some("application/merge-patch+json"),
        r#"{"metadata":{"labels":{"a":"b"}}}"#,
    )
    .await;
    stale["metadata"]["labels"] = json!({"step": "stale-put"});
    let r = raw(
        &emu,
        "PUT",
        &format!("{PVCS}/pvc-errors"),
        JSON,
        &stale.to_string(),
    )
    .await;
    assert_eq!(
        r.body,
        recorded("07-errors-concurrency.json", 3)["response"]["body"]
    );
    let patch = json!({"metadata": {"resourceVersion": created["metadata"]["resourceVersion"], "labels": {"step": "stale-patch"}}});
    let r = raw(
        &emu,
        "PATCH",
        &format!("{PVCS}/pvc-errors"),
        Some("application/merge-patch+json"),
        &patch.to_string(),
    )
    .await;
    assert_eq!(
        r.body,
        recorded("07-errors-concurrency.json", 4)["response"]["body"]
    );
}

#[tokio::test]
async fn unknown_field_is_accepted_with_a_warning_header() {
    let emu = emu();
    let (_, path, ct, body) = step_request("07-errors-concurrency.json", 18);
    let r = raw(&emu, "POST", &path, ct.as_deref(), &body).await;
    assert_eq!(r.status, 201);
    let want = recorded("07-errors-concurrency.json", 18)["response"]["headers"]["Warning"].clone();
    assert_eq!(
        r.headers.get("warning").unwrap().to_str().unwrap(),
        want.as_str().unwrap()
    );
    assert!(r.body["spec"].get("bogusField").is_none());
}

#[tokio::test]
async fn delete_preconditions_match_the_recording() {
    let emu = emu();
    let created = create_pvc(&emu, "pvc-errors").await;
    let uid = created["metadata"]["uid"].as_str().unwrap();
    let (method, path, ct, body) = step_request("07-errors-concurrency.json", 31);
    let r = raw(&emu, &method, &path, ct.as_deref(), &body).await;
    let mut want = recorded("07-errors-concurrency.json", 31)["response"]["body"].clone();
    want["message"] = json!(
        want["message"]
            .as_str()
            .unwrap()
            .replace("b7891002-f83d-4c2d-a36c-7b57ccaa269d", uid)
    );
    assert_eq!(r.body, want);
    let body = json!({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": "355"}});
    let r = raw(
        &emu,
        "DELETE",
        &format!("{PVCS}/pvc-errors"),
        JSON,
        &body.to_string(),
    )
    .await;
    let rv = created["metadata"]["resourceVersion"].as_str().unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(
        r.body["message"],
        format!(
            "Operation cannot be fulfilled on PersistentVolumeClaim \"pvc-errors\": the ResourceVersion in the precondition (355) does not match the ResourceVersion in record ({rv}). The object might have been modified"
        )
    );
    assert_eq!(
        r.body["details"],
        json!({"name": "pvc-errors", "kind": "PersistentVolumeClaim"})
    );
}

#[tokio::test]
async fn lease_errors_match_the_recording() {
    let emu = emu();
    for step in [39, 40, 41] {
        replay_status(&emu, "07-errors-concurrency.json", step).await;
    }
    let (_, path, ct, body) = step_request("07-errors-concurrency.json", 42);
    assert_eq!(
        raw(&emu, "POST", &path, ct.as_deref(), &body).await.status,
        201
    );
    for step in [45, 46, 47] {
        replay_status(&emu, "07-errors-concurrency.json", step).await;
    }
}

#[tokio::test]
async fn json_patch_test_failure_and_late_finalizer_match_the_recording() {
    let emu = emu();
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pvc-728e7eaa-a6ac-4a74-9269-eb289f67267d"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": "h"}}});
    assert_eq!(
        raw(
            &emu,
            "POST",
            "/api/v1/persistentvolumes",
            JSON,
            &pv.to_string()
        )
        .await
        .status,
        201
    );
    replay_status(&emu, "06-release-delete.json", 13).await;
    let del = raw(
        &emu,
        "DELETE",
        "/api/v1/persistentvolumes/pvc-728e7eaa-a6ac-4a74-9269-eb289f67267d",
        None,
        "",
    )
    .await;
    assert_eq!(del.status, 200);
    assert_eq!(del.body["metadata"]["deletionGracePeriodSeconds"], 0);
    replay_status(&emu, "06-release-delete.json", 11).await;
}

#[tokio::test]
async fn watch_errors_match_the_recording() {
    let emu = Emulator::builder()
        .pv_controller(false)
        .watch_history(1)
        .build();
    for n in ["a", "b", "c"] {
        create_pvc(&emu, n).await;
    }
    let r = raw(
        &emu,
        "GET",
        &format!("{PVCS}?watch=1&resourceVersion=1&allowWatchBookmarks=true"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let recorded_line = std::fs::read_to_string(format!(
        "{}/tests/traces/08-watch-rv1-after-restart.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let want: Value = serde_json::from_str(recorded_line.lines().last().unwrap()).unwrap();
    let got: Value = serde_json::from_str(r.text.trim()).unwrap();
    assert_eq!(got["type"], want["type"]);
    let mut got_obj = got["object"].clone();
    let mut want_obj = want["object"].clone();
    got_obj["message"] = json!("");
    want_obj["message"] = json!("");
    assert_eq!(got_obj, want_obj);
}

#[tokio::test]
async fn expansion_errors_match_the_recording() {
    let emu = Emulator::new();
    let sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "rbd-immediate"}, "provisioner": "ceph.com/rbd", "allowVolumeExpansion": true});
    raw(
        &emu,
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        JSON,
        &sc.to_string(),
    )
    .await;
    let claim = create_pvc(&emu, "pvc-imm").await;
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("pvc-{uid}")},
        "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "rbd-immediate",
                 "claimRef": {"namespace": "default", "name": "pvc-imm", "uid": uid}, "csi": {"driver": "d", "volumeHandle": "h"}}});
    raw(
        &emu,
        "POST",
        "/api/v1/persistentvolumes",
        JSON,
        &pv.to_string(),
    )
    .await;
    eventually("bound", Duration::from_secs(5), || async {
        let r = raw(&emu, "GET", &format!("{PVCS}/pvc-imm"), None, "").await;
        (r.body["status"]["phase"] == "Bound").then_some(())
    })
    .await;
    let grow = raw(
        &emu,
        "PATCH",
        &format!("{PVCS}/pvc-imm"),
        Some("application/merge-patch+json"),
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    )
    .await;
    assert_eq!(grow.status, 200, "{}", grow.text);
    replay_status(&emu, "05-expansion.json", 17).await;
    replay_status(&emu, "05-expansion.json", 15).await;
}

#[tokio::test]
async fn binding_writes_pv_status_then_claim_then_claim_status() {
    let emu = Emulator::new();
    let sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "rbd-immediate"}, "provisioner": "ceph.com/rbd"});
    raw(
        &emu,
        "POST",
        "/apis/storage.k8s.io/v1/storageclasses",
        JSON,
        &sc.to_string(),
    )
    .await;
    let claim = create_pvc(&emu, "pvc-imm").await;
    let uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let annotated = eventually("annotated", Duration::from_secs(5), || async {
        let r = raw(&emu, "GET", &format!("{PVCS}/pvc-imm"), None, "").await;
        r.body["metadata"]["annotations"]
            .is_object()
            .then_some(r.body)
    })
    .await;
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("pvc-{uid}"), "annotations": {"pv.kubernetes.io/provisioned-by": "ceph.com/rbd"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "rbd-immediate",
                 "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "default", "name": "pvc-imm", "uid": uid},
                 "csi": {"driver": "rbd.example.com", "volumeHandle": "rbd/img1", "fsType": "ext4", "volumeAttributes": {"image": "img1", "pool": "rbd"}}}});
    let created = raw(
        &emu,
        "POST",
        "/api/v1/persistentvolumes",
        JSON,
        &pv.to_string(),
    )
    .await;
    // As recorded: the create response has pv-protection and phase Pending.
    let want_pv = recorded("04-binding.json", 2)["stdout"].clone();
    assert_eq!(
        created.body["metadata"]["finalizers"],
        want_pv["metadata"]["finalizers"]
    );
    assert_eq!(created.body["status"]["phase"], "Pending");
    assert!(created.body["status"]["lastPhaseTransitionTime"].is_string());
    let pv_rv: u64 = created.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let bound = eventually("bound", Duration::from_secs(5), || async {
        let r = raw(&emu, "GET", &format!("{PVCS}/pvc-imm"), None, "").await;
        (r.body["status"]["phase"] == "Bound").then_some(r.body)
    })
    .await;
    let pv_now = raw(
        &emu,
        "GET",
        &format!("/api/v1/persistentvolumes/pvc-{uid}"),
        None,
        "",
    )
    .await
    .body;
    let rv = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    // 293 PV created, 294 PV Bound, 295 claim spec+annotations, 296 claim status.
    assert_eq!(rv(&pv_now), pv_rv + 1);
    assert_eq!(rv(&bound), pv_rv + 3);
    let want_claim = recorded("04-binding.json", 4)["stdout"].clone();
    for key in [
        "pv.kubernetes.io/bind-completed",
        "pv.kubernetes.io/bound-by-controller",
    ] {
        assert_eq!(
            bound["metadata"]["annotations"][key],
            want_claim["metadata"]["annotations"][key]
        );
    }
    assert_eq!(bound["status"], want_claim["status"]);
    assert_eq!(
        pv_now["metadata"]["annotations"],
        want_pv["metadata"]["annotations"]
    );
    assert_ne!(rv(&annotated), 0);
}

#[tokio::test]
async fn discovery_matches_the_recording() {
    let emu = emu();
    let api = raw(&emu, "GET", "/api", None, "").await;
    assert_eq!(
        api.body,
        recorded("01-discovery.json", 2)["response"]["body"]
    );
    assert!(api.body.get("apiVersion").is_none());
    let v1 = raw(&emu, "GET", "/api/v1", None, "").await;
    assert!(v1.body.get("apiVersion").is_none());
    let want = recorded("01-discovery.json", 3)["response"]["body"].clone();
    for entry in want["resources"].as_array().unwrap() {
        assert!(
            v1.body["resources"].as_array().unwrap().contains(entry),
            "missing {entry}"
        );
    }
    let apis = raw(&emu, "GET", "/apis", None, "").await;
    let step = recorded("01-discovery.json", 4);
    // The recording keeps three groups (it says so); the emulator also serves
    // apiextensions.k8s.io, in the real server's order.
    let kept: Vec<&Value> = step["response"]["body"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["name"])
        .collect();
    let mut trimmed = apis.body.clone();
    trimmed["groups"]
        .as_array_mut()
        .unwrap()
        .retain(|g| kept.contains(&&g["name"]));
    assert_eq!(trimmed, step["response"]["body"]);
    let served: Vec<&Value> = apis.body["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["name"])
        .collect();
    let real_order: Vec<&Value> = step["untrimmedGroupNames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| served.contains(g))
        .collect();
    assert_eq!(served, real_order);
    for (step, group) in [(6, "coordination.k8s.io"), (7, "events.k8s.io")] {
        let r = raw(&emu, "GET", &format!("/apis/{group}/v1"), None, "").await;
        assert_eq!(
            r.body,
            recorded("01-discovery.json", step)["response"]["body"]
        );
    }
    let storage = raw(&emu, "GET", "/apis/storage.k8s.io/v1", None, "").await;
    let want = recorded("01-discovery.json", 5)["response"]["body"].clone();
    for entry in storage.body["resources"].as_array().unwrap() {
        assert!(
            want["resources"].as_array().unwrap().contains(entry),
            "unexpected {entry}"
        );
    }
    let openapi = raw(&emu, "GET", "/openapi/v3", None, "").await;
    assert_eq!(openapi.headers["content-type"], "text/plain; charset=utf-8");
    assert!(openapi.body["paths"]["api/v1"]["serverRelativeURL"].is_string());
}

#[tokio::test]
async fn aggregated_discovery_matches_the_recording() {
    let emu = emu();
    let req = http::Request::get("/apis")
        .header(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = tower::ServiceExt::oneshot(emu.router(), req).await.unwrap();
    assert_eq!(
        resp.headers()["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    let body: Value = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap(),
    )
    .unwrap();
    let want = recorded("01-discovery.json", 10)["response"]["body"].clone();
    assert_eq!(body["kind"], want["kind"]);
    let kept: Vec<&Value> = want["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| &g["metadata"]["name"])
        .collect();
    for (got_group, want_group) in body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| kept.contains(&&g["metadata"]["name"]))
        .zip(want["items"].as_array().unwrap())
    {
        assert_eq!(got_group["metadata"], want_group["metadata"]);
        let want_res = want_group["versions"][0]["resources"].as_array().unwrap();
        for r in got_group["versions"][0]["resources"].as_array().unwrap() {
            assert!(want_res.contains(r), "unexpected {r}");
        }
    }
}

#[tokio::test]
async fn malformed_requests_get_a_status_never_a_panic() {
    let emu = emu();
    for (method, path, ct, body, code) in [
        ("POST", PVCS, JSON, "{not json", 400),
        ("POST", PVCS, JSON, "[1,2]", 400),
        (
            "POST",
            PVCS,
            Some("application/vnd.kubernetes.protobuf"),
            "x",
            400,
        ),
        ("GET", "/api/v1/namespaces/default/widgets", None, "", 404),
        ("GET", "/apis/nope.example.com/v1/things", None, "", 404),
        ("GET", "/this/is/not/an/api", None, "", 404),
        ("GET", "/api/v1/persistentvolumeclaims/x", None, "", 404),
        ("PUT", PVCS, JSON, "{}", 405),
        ("POST", &format!("{PVCS}/x"), JSON, "{}", 405),
        (
            "PATCH",
            &format!("{PVCS}/x"),
            Some("application/merge-patch+json"),
            "{bad",
            400,
        ),
        ("PATCH", &format!("{PVCS}/x"), Some("text/plain"), "{}", 415),
        (
            "GET",
            &format!("{PVCS}?labelSelector=a%20in%20b"),
            None,
            "",
            400,
        ),
        ("GET", &format!("{PVCS}?continue=garbage"), None, "", 400),
        ("DELETE", &format!("{PVCS}/x"), JSON, "{bad", 400),
        ("GET", &format!("{PVCS}/x/status"), None, "", 404),
        (
            "GET",
            "/api/v1/namespaces/default/configmaps/x/status",
            None,
            "",
            404,
        ),
    ] {
        let r = raw(&emu, method, path, ct, body).await;
        assert_eq!(r.status, code, "{method} {path}: {}", r.text);
        assert_eq!(r.body["kind"], "Status", "{method} {path}: {}", r.text);
        assert_eq!(r.body["code"], code);
    }
}

#[tokio::test]
async fn in_tree_rbd_pv_is_accepted_with_a_deprecation_warning_and_becomes_available() {
    let emu = Emulator::new();
    let (_, path, ct, body) = step_request("04-binding.json", 9);
    let r = raw(&emu, "POST", &path, ct.as_deref(), &body).await;
    assert_eq!(r.status, 201);
    let want = recorded("04-binding.json", 9)["response"].clone();
    assert_eq!(
        r.headers["warning"].to_str().unwrap(),
        want["headers"]["Warning"].as_str().unwrap()
    );
    eventually("Available", Duration::from_secs(5), || async {
        let r = raw(
            &emu,
            "GET",
            "/api/v1/persistentvolumes/rbd-intree-test",
            None,
            "",
        )
        .await;
        (r.body["status"]["phase"] == "Available").then_some(())
    })
    .await;
}

#[tokio::test]
async fn invalid_generate_name_names_both_fields_like_the_recording() {
    let emu = emu();
    let (method, path, ct, body) = step_request("09-generate-name.json", 7);
    let r = raw(&emu, &method, &path, ct.as_deref(), &body).await;
    let want = recorded("09-generate-name.json", 7)["response"]["body"].clone();
    assert_eq!(r.status, 422);
    let fields = |v: &Value| {
        v["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(fields(&r.body), fields(&want));
    let name = r.body["details"]["name"].as_str().unwrap();
    assert!(name.starts_with("Data-") && name.len() == 10, "{name}");
    assert_eq!(r.body["details"]["causes"][0], want["details"]["causes"][0]);
}

#[tokio::test]
async fn exact_list_older_than_the_window_is_410() {
    let emu = Emulator::builder()
        .pv_controller(false)
        .watch_history(1)
        .build();
    for n in ["a", "b", "c"] {
        create_pvc(&emu, n).await;
    }
    let r = raw(
        &emu,
        "GET",
        &format!("{PVCS}?resourceVersion=1&resourceVersionMatch=Exact"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 410);
    assert_eq!(r.body, recorded("08-watch.json", 11)["response"]["body"]);
}

#[tokio::test]
async fn exact_list_rebuilds_the_snapshot_at_that_resource_version() {
    let emu = emu();
    let a = create_pvc(&emu, "a").await;
    create_pvc(&emu, "b").await;
    let rv = a["metadata"]["resourceVersion"].as_str().unwrap();
    let r = raw(
        &emu,
        "GET",
        &format!("{PVCS}?resourceVersion={rv}&resourceVersionMatch=Exact"),
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["metadata"]["resourceVersion"], rv);
    let names: Vec<&str> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a"]);
    assert!(
        r.body["items"][0].get("kind").is_none(),
        "list items carry no kind"
    );
}

#[tokio::test]
async fn server_side_apply_conflict_matches_the_recording() {
    let emu = emu();
    create_pvc(&emu, "pvc-patch-types").await;
    let (method, path, ct, body) = step_request("07-errors-concurrency.json", 24);
    let first = raw(&emu, &method, &path, ct.as_deref(), &body).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.body["metadata"]["labels"]["owner"], "a");
    assert_eq!(
        first.body["metadata"]["managedFields"][0]["manager"],
        "manager-a"
    );
    let rv = first.body["metadata"]["resourceVersion"].clone();
    // Re-applying the same configuration is a no-op.
    let again = raw(&emu, &method, &path, ct.as_deref(), &body).await;
    assert_eq!(again.body["metadata"]["resourceVersion"], rv);
    replay_status(&emu, "07-errors-concurrency.json", 25).await;
    let (method, path, ct, body) = step_request("07-errors-concurrency.json", 25);
    let forced = raw(
        &emu,
        &method,
        &format!("{path}&force=true"),
        ct.as_deref(),
        &body,
    )
    .await;
    assert_eq!(forced.status, 200, "{}", forced.text);
    assert_eq!(forced.body["metadata"]["labels"]["owner"], "b");
}
