//! patch (merge, JSON, strategic, apply), the status subresource and delete semantics.

mod common;

use common::{api_err, no_controller, pvc, pvcs};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;

#[tokio::test]
async fn merge_patch_replaces_lists_and_strategic_merge_merges_finalizers() {
    let emu = no_controller();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let smp = json!({"metadata": {"finalizers": ["example.com/a"]}});
    let p = pvcs(&emu)
        .patch("a", &PatchParams::default(), &Patch::Strategic(&smp))
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        ["example.com/a", "kubernetes.io/pvc-protection"]
    );
    let merge = json!({"metadata": {"finalizers": ["example.com/b"]}});
    let p = pvcs(&emu)
        .patch("a", &PatchParams::default(), &Patch::Merge(&merge))
        .await
        .unwrap();
    assert_eq!(p.metadata.finalizers.unwrap(), ["example.com/b"]);
    let labels = json!({"metadata": {"labels": {"x": "1"}}});
    let p = pvcs(&emu)
        .patch("a", &PatchParams::default(), &Patch::Strategic(&labels))
        .await
        .unwrap();
    assert_eq!(p.metadata.labels.unwrap()["x"], "1");
}

#[tokio::test]
async fn merge_patch_with_stale_resource_version_is_409() {
    let emu = no_controller();
    let created = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    pvcs(&emu)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    let stale = json!({"metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"a": "c"}}});
    let e = api_err(
        pvcs(&emu)
            .patch("a", &PatchParams::default(), &Patch::Merge(&stale))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
}

#[tokio::test]
async fn json_patch_failed_test_is_generic_422() {
    let emu = no_controller();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "not-this-one"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    let e = api_err(
        pvcs(&emu)
            .patch("a", &PatchParams::default(), &Patch::<()>::Json(ops))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            422,
            "the server rejected our request due to an error in our request"
        )
    );
    let ops: json_patch::Patch = serde_json::from_value(
        json!([{"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/x"}]),
    )
    .unwrap();
    let p = pvcs(&emu)
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        ["kubernetes.io/pvc-protection", "example.com/x"]
    );
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let emu = no_controller();
    let pp = PatchParams::apply("manager-a");
    let body = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ssa", "labels": {"owner": "a"}},
                      "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "x"}});
    let created = pvcs(&emu)
        .patch("ssa", &pp, &Patch::Apply(&body))
        .await
        .unwrap();
    assert_eq!(
        created.metadata.finalizers.unwrap(),
        ["kubernetes.io/pvc-protection"]
    );
    let body2 = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ssa", "labels": {"more": "b"}}});
    let updated = pvcs(&emu)
        .patch("ssa", &pp, &Patch::Apply(&body2))
        .await
        .unwrap();
    let labels = updated.metadata.labels.unwrap();
    assert_eq!(
        (labels["owner"].as_str(), labels["more"].as_str()),
        ("a", "b")
    );
}

#[tokio::test]
async fn status_subresource_applies_status_and_labels_but_ignores_spec() {
    let emu = no_controller();
    let mut p = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    p.spec
        .as_mut()
        .unwrap()
        .resources
        .as_mut()
        .unwrap()
        .requests = Some(
        [(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("5Gi".into()),
        )]
        .into(),
    );
    p.status.as_mut().unwrap().phase = Some("Lost".into());
    p.metadata.labels = Some([("via".to_string(), "status".to_string())].into());
    let updated = pvcs(&emu)
        .replace_status("a", &PostParams::default(), &p)
        .await
        .unwrap();
    assert_eq!(
        updated.status.as_ref().unwrap().phase.as_deref(),
        Some("Lost")
    );
    assert_eq!(updated.metadata.labels.as_ref().unwrap()["via"], "status");
    let req = updated
        .spec
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap();
    assert_eq!(req["storage"].0, "1Gi");
    // Main-resource writes ignore status; a status-only merge patch is a no-op.
    let rv = updated.metadata.resource_version.clone();
    let same = pvcs(&emu)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Pending"}})),
        )
        .await
        .unwrap();
    assert_eq!(same.metadata.resource_version, rv);
    assert_eq!(same.status.unwrap().phase.as_deref(), Some("Lost"));
}

#[tokio::test]
async fn delete_with_finalizer_marks_terminating_and_last_finalizer_removal_deletes() {
    let emu = no_controller();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let first = pvcs(&emu)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(first.metadata.deletion_timestamp.is_some());
    assert_eq!(first.metadata.deletion_grace_period_seconds, Some(0));
    // Repeating the delete is a no-op.
    let again = pvcs(&emu)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        first.metadata.resource_version
    );
    // No new finalizers on a terminating object.
    let add =
        json!({"metadata": {"finalizers": ["kubernetes.io/pvc-protection", "example.com/late"]}});
    let e = api_err(
        pvcs(&emu)
            .patch("a", &PatchParams::default(), &Patch::Merge(&add))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("no new finalizers can be added if the object is being deleted")
    );
    // Removing the last finalizer deletes it and answers the old resourceVersion.
    let gone = pvcs(&emu)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert_eq!(
        gone.metadata.resource_version,
        first.metadata.resource_version
    );
    assert!(pvcs(&emu).get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn delete_preconditions_conflict() {
    let emu = no_controller();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = api_err(pvcs(&emu).delete("a", &dp).await.unwrap_err());
    assert_eq!(e.code, 409);
    assert!(e.message.starts_with(
        "Operation cannot be fulfilled on PersistentVolumeClaim \"a\": the UID in the precondition"
    ));
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    let e = api_err(pvcs(&emu).delete("a", &dp).await.unwrap_err());
    assert!(
        e.message
            .contains("the ResourceVersion in the precondition (1) does not match")
    );
}

#[tokio::test]
async fn pods_and_objects_without_finalizers_are_deleted_at_once() {
    let emu = no_controller();
    let pods: Api<Pod> = Api::default_namespaced(emu.client());
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let deleted = pods.delete("p", &DeleteParams::default()).await.unwrap();
    assert!(deleted.is_left());
    assert!(pods.get_opt("p").await.unwrap().is_none());
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    let status = cms
        .delete("c", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert_eq!(status.details.unwrap().name, "c");
}

#[tokio::test]
async fn delete_collection_honours_selectors_and_finalizers() {
    let emu = no_controller();
    for (name, app) in [("a", "db"), ("b", "db"), ("c", "web")] {
        let mut p = pvc(name, Some("x"), "1Gi");
        p.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        pvcs(&emu).create(&PostParams::default(), &p).await.unwrap();
    }
    let deleted = pvcs(&emu)
        .delete_collection(
            &DeleteParams::default(),
            &kube::api::ListParams::default().labels("app=db"),
        )
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(deleted.items.len(), 2);
    // The finalizer keeps them, terminating.
    let a = pvcs(&emu).get("a").await.unwrap();
    assert!(a.metadata.deletion_timestamp.is_some());
    assert!(
        pvcs(&emu)
            .get("c")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_objects() {
    use k8s_openapi::api::core::v1::Namespace;
    let emu = no_controller();
    let nss: Api<Namespace> = Api::all(emu.client());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap(),
    )
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(emu.client(), "scratch");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
    )
    .await
    .unwrap();
    nss.delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    assert!(nss.get_opt("scratch").await.unwrap().is_none());
    assert!(cms.get_opt("c").await.unwrap().is_none());
}
