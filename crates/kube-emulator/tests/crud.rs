//! create, get, list and update over the real kube-rs client.

mod common;

use common::{api_err, no_controller, pvc, pvcs, raw};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

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
