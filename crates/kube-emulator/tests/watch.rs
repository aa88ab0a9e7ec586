//! Watch semantics: resume, synthetic ADDED, bookmarks, streaming lists, errors, selectors,
//! kube-runtime watcher/reflector, slow watchers.

mod common;

use std::time::Duration;

use axum::body::Body;
use common::{eventually, pvc};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_emulator::Emulator;
use serde_json::{Value, json};
use tower::ServiceExt;

fn emu() -> Emulator {
    Emulator::builder().pv_controller(false).build()
}

fn pvcs(emu: &Emulator) -> Api<PersistentVolumeClaim> {
    Api::default_namespaced(emu.client())
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// Opens a raw watch and returns (status, body).
async fn open(emu: &Emulator, path: &str) -> (u16, Body) {
    let req = http::Request::get(path).body(Body::empty()).unwrap();
    let resp = emu.router().oneshot(req).await.unwrap();
    (resp.status().as_u16(), resp.into_body())
}

/// Reads JSON lines until `n` lines arrived, the stream ended, or `timeout` passed.
/// Returns the lines and whether the stream ended.
async fn read_lines(body: &mut Body, n: usize, timeout: Duration) -> (Vec<Value>, bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut buf = Vec::new();
    let mut lines = Vec::new();
    loop {
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            lines.push(serde_json::from_slice(&line).unwrap());
        }
        if lines.len() >= n {
            return (lines, false);
        }
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return (lines, false),
            Ok(None) => return (lines, true),
            Ok(Some(frame)) => {
                if let Ok(data) = frame.unwrap().into_data() {
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

#[tokio::test]
async fn watch_from_list_resource_version_sees_added_modified_deleted() {
    let emu = emu();
    let list_rv = pvcs(&emu)
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = pvcs(&emu)
        .watch(&WatchParams::default(), &list_rv)
        .await
        .unwrap()
        .boxed();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("w", Some("x"), "1Gi"))
        .await
        .unwrap();
    pvcs(&emu)
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    pvcs(&emu)
        .delete("w", &DeleteParams::default())
        .await
        .unwrap();
    pvcs(&emu)
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 4 {
        match stream.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => kinds.push("ADDED"),
            WatchEvent::Modified(_) => kinds.push("MODIFIED"),
            WatchEvent::Deleted(d) => {
                // The DELETED event still lists the finalizer that was just removed.
                assert_eq!(
                    d.metadata.finalizers.unwrap(),
                    ["kubernetes.io/pvc-protection"]
                );
                kinds.push("DELETED")
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(kinds, ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]);
}

#[tokio::test]
async fn watch_without_resource_version_starts_with_synthetic_added_and_times_out_cleanly() {
    let emu = emu();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    for path in [
        "/api/v1/namespaces/default/persistentvolumeclaims?watch=1&timeoutSeconds=1",
        "/api/v1/namespaces/default/persistentvolumeclaims?watch=1&resourceVersion=0&timeoutSeconds=1",
        "/api/v1/watch/namespaces/default/persistentvolumeclaims?timeoutSeconds=1",
    ] {
        let (status, mut body) = open(&emu, path).await;
        assert_eq!(status, 200);
        let (lines, ended) = read_lines(&mut body, 10, Duration::from_secs(3)).await;
        assert!(ended, "{path}: timeoutSeconds must end the stream");
        assert_eq!(lines.len(), 1, "{path}");
        assert_eq!(lines[0]["type"], "ADDED");
        assert_eq!(lines[0]["object"]["kind"], "PersistentVolumeClaim");
    }
}

#[tokio::test]
async fn watch_resumes_from_an_old_resource_version_within_the_window() {
    let emu = emu();
    let first = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("b", Some("x"), "1Gi"))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.unwrap();
    let (_, mut body) = open(
        &emu,
        &format!("/api/v1/namespaces/default/persistentvolumeclaims?watch=1&resourceVersion={rv}"),
    )
    .await;
    let (lines, _) = read_lines(&mut body, 1, Duration::from_secs(2)).await;
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[0]["object"]["metadata"]["name"], "b");
}

#[tokio::test]
async fn watch_older_than_the_window_is_200_with_one_410_error_line() {
    let emu = Emulator::builder()
        .pv_controller(false)
        .watch_history(2)
        .build();
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    let (status, mut body) = open(
        &emu,
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1&allowWatchBookmarks=true",
    )
    .await;
    assert_eq!(status, 200);
    let (lines, ended) = read_lines(&mut body, 5, Duration::from_secs(2)).await;
    assert!(ended);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["type"], "ERROR");
    let st = &lines[0]["object"];
    assert_eq!(
        (
            st["kind"].as_str(),
            st["code"].as_i64(),
            st["reason"].as_str()
        ),
        (Some("Status"), Some(410), Some("Expired"))
    );
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version: 1 (")
    );
}

#[tokio::test]
async fn non_numeric_resource_version_is_500() {
    let emu = emu();
    let r = common::raw(
        &emu,
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims?watch=1&resourceVersion=abc",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body["message"],
        "resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
    );
}

#[tokio::test]
async fn bookmarks_are_typed_nearly_empty_objects() {
    let emu = emu();
    let rv = pvcs(&emu)
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let (_, mut body) = open(
        &emu,
        &format!("/api/v1/namespaces/default/persistentvolumeclaims?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=3"),
    )
    .await;
    let (lines, _) = read_lines(&mut body, 1, Duration::from_secs(3)).await;
    assert_eq!(lines[0]["type"], "BOOKMARK");
    assert_eq!(
        lines[0]["object"],
        json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "spec": {"resources": {}}, "status": {}})
    );
}

#[tokio::test]
async fn streaming_list_ends_initial_events_with_annotated_bookmark() {
    let emu = emu();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let (_, mut body) = open(
        &emu,
        "/api/v1/namespaces/default/persistentvolumeclaims?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2",
    )
    .await;
    let (lines, _) = read_lines(&mut body, 2, Duration::from_secs(2)).await;
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[1]["type"], "BOOKMARK");
    assert_eq!(
        lines[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let r = common::raw(
        &emu,
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims?watch=1&sendInitialEvents=true",
        None,
        "",
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "resourceVersionMatch"
    );
}

#[tokio::test]
async fn watch_with_selectors_filters_and_translates_transitions() {
    let emu = emu();
    let (_, mut body) = open(
        &emu,
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1&labelSelector=app%3Ddb",
    )
    .await;
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    cms.create(&PostParams::default(), &cm("other"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("x")).await.unwrap();
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .unwrap();
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    let (lines, _) = read_lines(&mut body, 2, Duration::from_secs(2)).await;
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ADDED", "DELETED"]);
    assert!(lines.iter().all(|l| l["object"]["metadata"]["name"] == "x"));
}

#[tokio::test]
async fn future_resource_version_with_timeout_answers_empty_200() {
    let emu = emu();
    let (status, mut body) = open(
        &emu,
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=100000&timeoutSeconds=1",
    )
    .await;
    assert_eq!(status, 200);
    let (lines, ended) = read_lines(&mut body, 1, Duration::from_secs(3)).await;
    assert!(ended && lines.is_empty());
}

#[tokio::test]
async fn kube_runtime_watcher_and_reflector_list_watch_and_resume_after_dropped_watches() {
    let emu = emu();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("before", Some("x"), "1Gi"))
        .await
        .unwrap();
    let (reader, writer) = reflector::store::<PersistentVolumeClaim>();
    let stream = watcher(pvcs(&emu), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    assert!(
        reader
            .get(&reflector::ObjectRef::new("before").within("default"))
            .is_some()
    );
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("during", Some("x"), "1Gi"))
        .await
        .unwrap();
    eventually("reflector sees 'during'", Duration::from_secs(5), || {
        let r = reader.clone();
        async move {
            r.get(&reflector::ObjectRef::new("during").within("default"))
                .map(|_| ())
        }
    })
    .await;
    let list_before = emu.request_count("list", "persistentvolumeclaims");
    let dropped = emu.faults().drop_watches("persistentvolumeclaims");
    assert_eq!(dropped, 1);
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("after", Some("x"), "1Gi"))
        .await
        .unwrap();
    eventually("reflector sees 'after'", Duration::from_secs(10), || {
        let r = reader.clone();
        async move {
            r.get(&reflector::ObjectRef::new("after").within("default"))
                .map(|_| ())
        }
    })
    .await;
    eventually("watch re-opened", Duration::from_secs(10), || {
        let e = emu.clone();
        async move { (e.open_watches() == 1).then_some(()) }
    })
    .await;
    // Resumed from its last resourceVersion: no re-list was needed.
    assert_eq!(
        emu.request_count("list", "persistentvolumeclaims"),
        list_before
    );
    task.abort();
}

#[tokio::test]
async fn kube_runtime_watcher_streaming_list_mode() {
    let emu = emu();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let cfg = watcher::Config::default().streaming_lists();
    let (reader, writer) = reflector::store::<PersistentVolumeClaim>();
    let stream = watcher(pvcs(&emu), cfg)
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    tokio::time::timeout(Duration::from_secs(5), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 1);
    assert_eq!(emu.request_count("list", "persistentvolumeclaims"), 0);
    task.abort();
}

#[tokio::test]
async fn slow_watcher_is_dropped_without_blocking_others() {
    let emu = emu();
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    // The slow watcher never reads its body.
    let (_, mut slow) = open(
        &emu,
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1",
    )
    .await;
    let mut fast = cms
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    let total = 5000;
    let writer = {
        let cms = cms.clone();
        tokio::spawn(async move {
            for i in 0..total {
                cms.create(&PostParams::default(), &cm(&format!("c{i}")))
                    .await
                    .unwrap();
            }
        })
    };
    let mut seen = 0;
    while seen < total {
        match tokio::time::timeout(Duration::from_secs(10), fast.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(_)) => seen += 1,
            Some(WatchEvent::Bookmark(_)) => {}
            Some(other) => panic!("unexpected {other:?}"),
            None => panic!("fast watcher ended"),
        }
    }
    writer.await.unwrap();
    let (lines, ended) = read_lines(&mut slow, total, Duration::from_secs(10)).await;
    assert!(ended, "overflowed watcher must be ended");
    assert!(lines.len() < total);
}

#[tokio::test]
async fn table_watch_sends_one_row_tables_for_kubectl_get_watch() {
    let emu = emu();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let req = http::Request::get("/api/v1/namespaces/default/persistentvolumeclaims?watch=1&resourceVersion=0&timeoutSeconds=1")
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
        .body(Body::empty())
        .unwrap();
    let mut body = emu.router().oneshot(req).await.unwrap().into_body();
    let (lines, _) = read_lines(&mut body, 1, Duration::from_secs(2)).await;
    assert_eq!(lines[0]["type"], "ADDED");
    let table = &lines[0]["object"];
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"][0]["cells"][0], "a");
    assert_eq!(table["rows"][0]["cells"][1], "Pending");
}

/// A watcher ended because its queue overflowed must not be handed a bookmark past the events it
/// received: its client resumes from the last resourceVersion it saw, and every object created
/// meanwhile must still reach it (from the resumed watch). A bookmark at the store's current
/// resourceVersion, sent while the ended watcher's queue drained, made its client skip
/// everything between (claims lost in an N=5000 benchmark).
#[tokio::test]
async fn an_overflowed_watcher_gets_no_bookmark_past_what_it_received() {
    let emu = emu();
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    // Bookmarks on; the body is not read until the queue has overflowed.
    let (_, mut slow) = open(
        &emu,
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1&allowWatchBookmarks=true",
    )
    .await;
    let total = 6000;
    for i in 0..total {
        cms.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    // Let the bookmark interval pass, so a bookmark is due while the queue drains.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (lines, ended) = read_lines(&mut slow, usize::MAX, Duration::from_secs(20)).await;
    assert!(ended, "the overflowed watcher must be ended");
    let mut seen = std::collections::HashSet::new();
    let mut resume_from = 0u64;
    for line in &lines {
        let rv: u64 = line["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        resume_from = resume_from.max(rv);
        if line["type"] == "ADDED" {
            seen.insert(
                line["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    assert!(seen.len() < total, "the queue did not overflow");
    // Resume as a client does, from the last resourceVersion received (event or bookmark).
    let (status, mut resumed) = open(
        &emu,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={resume_from}&timeoutSeconds=2"),
    )
    .await;
    assert_eq!(status, 200);
    let (lines, _) = read_lines(&mut resumed, usize::MAX, Duration::from_secs(10)).await;
    for line in &lines {
        if line["type"] == "ADDED" {
            seen.insert(
                line["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
    }
    assert_eq!(
        seen.len(),
        total,
        "objects created after the overflow were skipped by the resumed watch"
    );
}
