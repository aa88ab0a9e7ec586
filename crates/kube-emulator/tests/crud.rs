//! CRUD semantics over the real kube-rs client.

mod common;

use common::{pvc, raw, storage_class};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube_emulator::Emulator;
use serde_json::json;

/// The Status of an API error.
fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn pvcs(emu: &Emulator) -> Api<PersistentVolumeClaim> {
    Api::default_namespaced(emu.client())
}

fn no_controller() -> Emulator {
    Emulator::builder().pv_controller(false).build()
}

#[tokio::test]
async fn create_sets_uid_timestamp_resource_version_and_pvc_protection() {
    let emu = no_controller();
    let created = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(
        created
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert_eq!(
        created.metadata.finalizers,
        Some(vec!["kubernetes.io/pvc-protection".to_string()])
    );
    assert_eq!(
        created.spec.unwrap().volume_mode.as_deref(),
        Some("Filesystem")
    );
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));
}

#[tokio::test]
async fn resource_versions_are_global_and_increasing() {
    let emu = no_controller();
    let a = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(emu.client());
    let cm = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap(),
        )
        .await
        .unwrap();
    let rv = |m: &Option<String>| m.as_deref().unwrap().parse::<u64>().unwrap();
    assert_eq!(
        rv(&cm.metadata.resource_version),
        rv(&a.metadata.resource_version) + 1
    );
}

#[tokio::test]
async fn create_of_existing_object_is_409_already_exists() {
    let emu = no_controller();
    pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let e = api_err(
        pvcs(&emu)
            .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "persistentvolumeclaims \"a\" already exists");
}

#[tokio::test]
async fn create_in_missing_namespace_is_404() {
    let emu = no_controller();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(emu.client(), "nope");
    let e = api_err(
        api.create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );
}

#[tokio::test]
async fn generate_name_appends_five_characters_and_dry_run_stores_nothing() {
    let emu = no_controller();
    let mut p = pvc("", Some("x"), "1Gi");
    p.metadata.name = None;
    p.metadata.generate_name = Some("data-rbd-".into());
    let created = pvcs(&emu).create(&PostParams::default(), &p).await.unwrap();
    let name = created.metadata.name.unwrap();
    assert_eq!(name.len(), "data-rbd-".len() + 5);
    assert!(name.starts_with("data-rbd-"));
    assert!(
        name[9..]
            .chars()
            .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
    );
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let d = pvcs(&emu).create(&dry, &p).await.unwrap();
    assert!(d.metadata.resource_version.is_none());
    assert!(
        pvcs(&emu)
            .get_opt(d.metadata.name.as_deref().unwrap())
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn get_of_missing_object_is_404_not_found() {
    let emu = no_controller();
    let e = api_err(pvcs(&emu).get("does-not-exist").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(
        e.message,
        "persistentvolumeclaims \"does-not-exist\" not found"
    );
}

#[tokio::test]
async fn list_filters_by_label_and_field_selectors() {
    let emu = no_controller();
    for (name, tier) in [("a", Some("gold")), ("b", Some("silver")), ("c", None)] {
        let mut p = pvc(name, Some("x"), "1Gi");
        if let Some(t) = tier {
            p.metadata.labels = Some([("tier".to_string(), t.to_string())].into());
        }
        pvcs(&emu).create(&PostParams::default(), &p).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<PersistentVolumeClaim>| {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    let q = |s: &str| ListParams::default().labels(s);
    assert_eq!(
        names(pvcs(&emu).list(&q("tier=gold")).await.unwrap()),
        ["a"]
    );
    assert_eq!(
        names(pvcs(&emu).list(&q("tier!=gold")).await.unwrap()),
        ["b", "c"]
    );
    assert_eq!(
        names(pvcs(&emu).list(&q("tier in (gold,silver)")).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(
        names(pvcs(&emu).list(&q("tier notin (gold)")).await.unwrap()),
        ["b", "c"]
    );
    assert_eq!(
        names(pvcs(&emu).list(&q("tier")).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(names(pvcs(&emu).list(&q("!tier")).await.unwrap()), ["c"]);
    let f = ListParams::default().fields("metadata.name=b");
    assert_eq!(names(pvcs(&emu).list(&f).await.unwrap()), ["b"]);
    let all = pvcs(&emu).list(&ListParams::default()).await.unwrap();
    assert!(
        all.metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    let emu = no_controller();
    for n in ["a", "b", "c"] {
        pvcs(&emu)
            .create(&PostParams::default(), &pvc(n, Some("x"), "1Gi"))
            .await
            .unwrap();
    }
    let first = pvcs(&emu)
        .list(&ListParams::default().limit(2))
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.metadata.remaining_item_count, Some(1));
    let token = first.metadata.continue_.unwrap();
    let second = pvcs(&emu)
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.items.len(), 1);
    assert_eq!(second.items[0].metadata.name.as_deref(), Some("c"));
    assert!(second.metadata.continue_.is_none());
}

#[tokio::test]
async fn update_with_stale_resource_version_is_409_conflict() {
    let emu = no_controller();
    let created = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let mut first = created.clone();
    first.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    pvcs(&emu)
        .replace("a", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = created;
    stale.metadata.labels = Some([("a".to_string(), "2".to_string())].into());
    let e = api_err(
        pvcs(&emu)
            .replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on persistentvolumeclaims \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

#[tokio::test]
async fn pvc_put_without_resource_version_is_unconditional_and_drops_finalizers() {
    let emu = no_controller();
    let mut p = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    p.metadata.resource_version = None;
    p.metadata.finalizers = None;
    let updated = pvcs(&emu)
        .replace("a", &PostParams::default(), &p)
        .await
        .unwrap();
    assert!(updated.metadata.finalizers.is_none());
}

fn lease(holder: &str, time: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": "ceph-com-rbd"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": time, "renewTime": time, "leaseTransitions": 0}
    }))
    .unwrap()
}

#[tokio::test]
async fn lease_put_without_resource_version_is_422_and_stale_takeover_409() {
    let emu = no_controller();
    let leases: Api<Lease> = Api::default_namespaced(emu.client());
    let created = leases
        .create(
            &PostParams::default(),
            &lease("a", "2026-01-01T00:00:00.000000Z"),
        )
        .await
        .unwrap();
    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().holder_identity = Some("a2".into());
    leases
        .replace("ceph-com-rbd", &PostParams::default(), &renewed)
        .await
        .unwrap();
    let e = api_err(
        leases
            .replace("ceph-com-rbd", &PostParams::default(), &created)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert!(
        e.message
            .contains("leases.coordination.k8s.io \"ceph-com-rbd\"")
    );
    let mut no_rv = created;
    no_rv.metadata.resource_version = None;
    let e = api_err(
        leases
            .replace("ceph-com-rbd", &PostParams::default(), &no_rv)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "leases.coordination.k8s.io \"ceph-com-rbd\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
    );
}

#[tokio::test]
async fn lease_micro_time_needs_exactly_six_fractional_digits() {
    let emu = no_controller();
    for bad in [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.5Z",
        "2026-01-01T00:00:00.123456789Z",
    ] {
        let r = raw(
            &emu,
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            Some("application/json"),
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
                    "spec": {"holderIdentity": "a", "acquireTime": bad, "renewTime": bad}})
            .to_string(),
        )
        .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .starts_with("Lease in version \"v1\" cannot be handled as a Lease: parsing time")
        );
    }
    let leases: Api<Lease> = Api::default_namespaced(emu.client());
    let ok = leases
        .create(
            &PostParams::default(),
            &lease("a", "2026-01-01T00:00:00.000000Z"),
        )
        .await
        .unwrap();
    assert!(ok.spec.unwrap().renew_time.is_some());
}

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
async fn pvc_validation_errors() {
    let emu = no_controller();
    let e = api_err(
        pvcs(&emu)
            .create(&PostParams::default(), &pvc("neg", Some("x"), "-1Gi"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "PersistentVolumeClaim \"neg\" is invalid: spec.resources[storage]: Invalid value: \"-1Gi\": must be greater than zero"
    );
    let r = raw(&emu, "POST", "/api/v1/namespaces/default/persistentvolumeclaims", Some("application/json"),
        &json!({"metadata": {"name": "q"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1 GB"}}}}).to_string()).await;
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (400, Some("BadRequest"))
    );
    let r = raw(&emu, "POST", "/api/v1/namespaces/default/persistentvolumeclaims", Some("application/json"),
        &json!({"metadata": {"name": "Bad_Name"}, "spec": {"resources": {"requests": {"storage": "0"}}}}).to_string()).await;
    assert_eq!(r.status, 422);
    let fields: Vec<&str> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        [
            "metadata.name",
            "spec.accessModes",
            "spec.resources[storage]"
        ]
    );
    let r = raw(
        &emu,
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        Some("application/json"),
        &json!({"metadata": {"name": "nosize"}, "spec": {"accessModes": ["ReadWriteOnce"]}})
            .to_string(),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "spec.resources[storage]"
    );
}

#[tokio::test]
async fn default_storage_class_and_class_defaults_are_applied() {
    let emu = no_controller();
    let scs: Api<StorageClass> = Api::all(emu.client());
    let mut sc = storage_class("fast", false, false);
    sc.metadata.annotations = Some(
        [(
            "storageclass.kubernetes.io/is-default-class".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let created = scs.create(&PostParams::default(), &sc).await.unwrap();
    assert_eq!(created.volume_binding_mode.as_deref(), Some("Immediate"));
    let p = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", None, "1Gi"))
        .await
        .unwrap();
    assert_eq!(p.spec.unwrap().storage_class_name.as_deref(), Some("fast"));
    let explicit_empty = pvcs(&emu)
        .create(&PostParams::default(), &pvc("b", Some(""), "1Gi"))
        .await
        .unwrap();
    assert_eq!(
        explicit_empty.spec.unwrap().storage_class_name.as_deref(),
        Some("")
    );
    let drivers: Api<CSIDriver> = Api::all(emu.client());
    let d = drivers
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "rbd.example.com"}, "spec": {}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let spec = d.spec;
    assert_eq!(spec.attach_required, Some(true));
    assert_eq!(
        spec.fs_group_policy.as_deref(),
        Some("ReadWriteOnceWithFSType")
    );
    assert_eq!(
        spec.volume_lifecycle_modes,
        Some(vec!["Persistent".to_string()])
    );
}

#[tokio::test]
async fn quantities_are_canonicalised() {
    let emu = no_controller();
    let p = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1024Mi"))
        .await
        .unwrap();
    assert_eq!(
        p.spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0,
        "1Gi"
    );
}

#[tokio::test]
async fn events_k8s_io_view_shows_core_events_with_renamed_fields() {
    let emu = no_controller();
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(emu.client());
    let ev = json!({"metadata": {"name": "x.1"}, "involvedObject": {"kind": "PersistentVolumeClaim", "name": "x", "namespace": "default"},
                    "reason": "R", "message": "hello", "type": "Normal", "count": 2, "source": {"component": "c"}});
    core.create(&PostParams::default(), &serde_json::from_value(ev).unwrap())
        .await
        .unwrap();
    let v1: Api<k8s_openapi::api::events::v1::Event> = Api::default_namespaced(emu.client());
    let got = v1.get("x.1").await.unwrap();
    assert_eq!(got.note.as_deref(), Some("hello"));
    assert_eq!(got.deprecated_count, Some(2));
    assert_eq!(got.regarding.unwrap().name.as_deref(), Some("x"));
    let listed = v1
        .list(&ListParams::default().fields("regarding.name=x"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn kube_runtime_event_recorder_works_through_events_k8s_io() {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let emu = no_controller();
    let created = pvcs(&emu)
        .create(&PostParams::default(), &pvc("a", Some("x"), "1Gi"))
        .await
        .unwrap();
    let reporter = Reporter {
        controller: "test-controller".into(),
        instance: None,
    };
    let recorder = Recorder::new(emu.client(), reporter);
    let reference = kube::Resource::object_ref(&created, &());
    for _ in 0..2 {
        recorder
            .publish(
                &Event {
                    type_: EventType::Normal,
                    reason: "Provisioning".into(),
                    note: Some("working".into()),
                    action: "Provision".into(),
                    secondary: None,
                },
                &reference,
            )
            .await
            .unwrap();
    }
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(emu.client());
    let events = core
        .list(&ListParams::default().fields("involvedObject.name=a"))
        .await
        .unwrap();
    assert_eq!(events.items.len(), 1);
    assert_eq!(events.items[0].message.as_deref(), Some("working"));
    assert_eq!(
        events.items[0].series.as_ref().map(|s| s.count),
        Some(Some(2))
    );
}
