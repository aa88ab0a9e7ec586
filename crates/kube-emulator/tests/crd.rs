//! CustomResourceDefinitions through the kube-rs client: the snapshot CRDs shipped in
//! `deploy/snapshot-crds/` are created, discovered, served like built-ins (resourceVersion,
//! 409, watch resume, status subresource, generation, patches), validated by their schema and
//! CEL rules, and deleting a CRD deletes its objects.

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PostParams, WatchEvent, WatchParams,
};
use kube::discovery::Discovery;
use kube_emulator::Emulator;
use serde_json::{Value, json};

use common::{api_err, eventually, raw};

const CRD_FILES: [&str; 3] = [
    include_str!("../../../deploy/snapshot-crds/volumesnapshotclasses.yaml"),
    include_str!("../../../deploy/snapshot-crds/volumesnapshotcontents.yaml"),
    include_str!("../../../deploy/snapshot-crds/volumesnapshots.yaml"),
];

async fn install_crds(emu: &Emulator) {
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    for text in CRD_FILES {
        let crd: CustomResourceDefinition = serde_yaml::from_str(text).unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
}

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

fn classes(emu: &Emulator) -> Api<DynamicObject> {
    Api::all_with(
        emu.client(),
        &ar("VolumeSnapshotClass", "volumesnapshotclasses"),
    )
}

fn contents(emu: &Emulator) -> Api<DynamicObject> {
    Api::all_with(
        emu.client(),
        &ar("VolumeSnapshotContent", "volumesnapshotcontents"),
    )
}

fn snapshots(emu: &Emulator) -> Api<DynamicObject> {
    Api::namespaced_with(
        emu.client(),
        "default",
        &ar("VolumeSnapshot", "volumesnapshots"),
    )
}

fn obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn content(name: &str) -> DynamicObject {
    obj(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {
            "deletionPolicy": "Delete",
            "driver": "rbd.example.com",
            "source": {"volumeHandle": "vol-1"},
            "volumeSnapshotRef": {"name": "snap", "namespace": "default"}
        }
    }))
}

#[tokio::test]
async fn crd_create_is_established_and_discoverable() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    let vs = crds
        .get("volumesnapshots.snapshot.storage.k8s.io")
        .await
        .unwrap();
    let status = serde_json::to_value(vs.status.unwrap()).unwrap();
    let established = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Established" && c["status"] == "True");
    assert!(established, "{status}");
    assert_eq!(status["acceptedNames"]["kind"], "VolumeSnapshot");
    assert_eq!(status["storedVersions"], json!(["v1"]));
    assert_eq!(
        vs.metadata.finalizers,
        Some(vec![
            "customresourcecleanup.apiextensions.k8s.io".to_string()
        ])
    );
    assert_eq!(
        vs.spec.names.list_kind.as_deref(),
        Some("VolumeSnapshotList")
    );

    let discovery = Discovery::new(emu.client()).run().await.unwrap();
    let group = discovery
        .groups()
        .find(|g| g.name() == "snapshot.storage.k8s.io")
        .expect("snapshot group discovered");
    let kinds: Vec<(String, bool)> = group
        .recommended_resources()
        .into_iter()
        .map(|(ar, caps)| {
            (
                ar.kind.clone(),
                caps.scope == kube::discovery::Scope::Namespaced,
            )
        })
        .collect();
    assert!(
        kinds.contains(&("VolumeSnapshot".into(), true)),
        "{kinds:?}"
    );
    assert!(kinds.contains(&("VolumeSnapshotContent".into(), false)));
    assert!(kinds.contains(&("VolumeSnapshotClass".into(), false)));
    let legacy = raw(&emu, "GET", "/apis/snapshot.storage.k8s.io/v1", None, "").await;
    let names: Vec<&str> = legacy.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&"volumesnapshots/status"), "{names:?}");
    assert!(
        !names.contains(&"volumesnapshotclasses/status"),
        "{names:?}"
    );
    // The short names are served for kubectl.
    let vs_entry = legacy.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "volumesnapshots")
        .unwrap()
        .clone();
    assert_eq!(vs_entry["shortNames"], json!(["vs"]));
}

#[tokio::test]
async fn custom_resources_before_the_crd_are_404() {
    let emu = Emulator::builder().pv_controller(false).build();
    let err = classes(&emu).list(&Default::default()).await.unwrap_err();
    assert_eq!(api_err(err).code, 404);
    install_crds(&emu).await;
    assert!(classes(&emu).list(&Default::default()).await.is_ok());
}

#[tokio::test]
async fn schema_required_enum_and_pruning() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let api = classes(&emu);
    let missing = obj(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "c1"}, "deletionPolicy": "Delete"
    }));
    let e = api_err(
        api.create(&PostParams::default(), &missing)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "VolumeSnapshotClass.snapshot.storage.k8s.io \"c1\" is invalid: driver: Required value"
    );
    let bad_enum = obj(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "c1"}, "driver": "d", "deletionPolicy": "Keep"
    }));
    let e = api_err(
        api.create(&PostParams::default(), &bad_enum)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "deletionPolicy: Unsupported value: \"Keep\": supported values: \"Delete\", \"Retain\""
        ),
        "{}",
        e.message
    );
    let wrong_type = obj(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "c1"}, "driver": 7, "deletionPolicy": "Delete"
    }));
    let e = api_err(
        api.create(&PostParams::default(), &wrong_type)
            .await
            .unwrap_err(),
    );
    assert!(
        e.message.contains(
            "driver: Invalid value: \"integer\": driver in body must be of type string: \"integer\""
        ),
        "{}",
        e.message
    );
    // Unknown fields are pruned (with a warning); Strict rejects them.
    let extra = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "c1"}, "driver": "d", "deletionPolicy": "Delete",
        "parameters": {"a": "b"}, "bogus": {"x": 1}
    });
    let r = raw(
        &emu,
        "POST",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses?fieldValidation=Strict",
        Some("application/json"),
        &extra.to_string(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("unknown field \\\"bogus\\\""), "{}", r.text);
    let r = raw(
        &emu,
        "POST",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses",
        Some("application/json"),
        &extra.to_string(),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert!(r.body.get("bogus").is_none(), "{}", r.text);
    assert_eq!(r.body["parameters"], json!({"a": "b"}));
    assert_eq!(r.body["metadata"]["generation"], 1);
    let warning = r.headers.get("warning").unwrap().to_str().unwrap();
    assert!(warning.contains("unknown field \\\"bogus\\\""), "{warning}");
}

#[tokio::test]
async fn cel_rules_of_the_snapshot_crds_are_enforced() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let api = contents(&emu);
    let mut both = content("c-both");
    both.data["spec"]["source"]["snapshotHandle"] = json!("snap-1");
    let e = api_err(api.create(&PostParams::default(), &both).await.unwrap_err());
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "spec.source: Invalid value: \"object\": exactly one of volumeHandle and snapshotHandle must be set"
        ),
        "{}",
        e.message
    );
    let mut no_ns = content("c-nons");
    no_ns.data["spec"]["volumeSnapshotRef"] = json!({"name": "snap"});
    let e = api_err(
        api.create(&PostParams::default(), &no_ns)
            .await
            .unwrap_err(),
    );
    assert!(
        e.message.contains(
            "both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace must be set"
        ),
        "{}",
        e.message
    );
    api.create(&PostParams::default(), &content("c1"))
        .await
        .unwrap();
    // volumeHandle is immutable.
    let e = api_err(
        api.patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"volumeHandle": "vol-2"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains(
            "spec.source.volumeHandle: Invalid value: \"string\": volumeHandle is immutable"
        ),
        "{}",
        e.message
    );
    // Other spec fields may change, and the generation follows spec changes only.
    let patched = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletionPolicy": "Retain"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    let labelled = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(2));
    // A snapshot's class name may not be empty.
    let vs = obj(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "s1"},
        "spec": {"volumeSnapshotClassName": "", "source": {"persistentVolumeClaimName": "p"}}
    }));
    let e = api_err(
        snapshots(&emu)
            .create(&PostParams::default(), &vs)
            .await
            .unwrap_err(),
    );
    assert!(
        e.message
            .contains("volumeSnapshotClassName must not be the empty string when set"),
        "{}",
        e.message
    );
}

#[tokio::test]
async fn status_subresource_isolates_spec_and_status() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let api = contents(&emu);
    let mut c = content("c1");
    c.data["status"] = json!({"readyToUse": true});
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create: {:?}",
        created.data
    );
    // A status write does not change spec (or bump generation)...
    let st = api
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"from": "status"}}, "spec": {"deletionPolicy": "Retain"}, "status": {"readyToUse": true, "restoreSize": 1024}})),
        )
        .await
        .unwrap();
    assert_eq!(st.data["spec"]["deletionPolicy"], "Delete");
    assert_eq!(st.metadata.labels, None, "a CR status write keeps metadata");
    assert_eq!(st.data["status"]["readyToUse"], true);
    assert_eq!(st.metadata.generation, Some(1));
    // ...and a main-resource write does not change status.
    let mut full = api.get("c1").await.unwrap();
    full.data["status"]["readyToUse"] = json!(false);
    full.data["spec"]["deletionPolicy"] = json!("Retain");
    let updated = api
        .replace("c1", &PostParams::default(), &full)
        .await
        .unwrap();
    assert_eq!(updated.data["status"]["readyToUse"], true);
    assert_eq!(updated.data["spec"]["deletionPolicy"], "Retain");
    assert_eq!(updated.metadata.generation, Some(2));
    // The status schema is validated too.
    let e = api_err(
        api.patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"restoreSize": -1}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("status.restoreSize in body should be greater than or equal to 0"),
        "{}",
        e.message
    );
    // A PUT must carry a resourceVersion (no unconditional updates of custom resources).
    let mut unconditional = api.get("c1").await.unwrap();
    unconditional.metadata.resource_version = None;
    let e = api_err(
        api.replace("c1", &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "volumesnapshotcontents.snapshot.storage.k8s.io \"c1\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
    );
    // A stale resourceVersion is a 409 like for built-ins.
    let mut stale = created.clone();
    stale.data["spec"]["driver"] = json!("other");
    let e = api_err(
        api.replace("c1", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409);
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on volumesnapshotcontents.snapshot.storage.k8s.io \"c1\": the object has been modified; please apply your changes to the latest version and try again"
    );
}

#[tokio::test]
async fn patches_on_custom_resources() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let api = contents(&emu);
    api.create(&PostParams::default(), &content("c1"))
        .await
        .unwrap();
    // Strategic merge patch is not accepted for custom resources.
    let r = raw(
        &emu,
        "PATCH",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/c1",
        Some("application/strategic-merge-patch+json"),
        r#"{"metadata":{"labels":{"a":"b"}}}"#,
    )
    .await;
    assert_eq!(r.status, 415, "{}", r.text);
    assert_eq!(r.body["reason"], "UnsupportedMediaType");
    let p = api
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/hold"]}
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers,
        Some(vec!["example.com/hold".to_string()])
    );
    // Server-side apply works on custom resources too.
    let applied = api
        .patch(
            "c2",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                "metadata": {"name": "c2"},
                "spec": {"deletionPolicy": "Retain", "driver": "d", "source": {"snapshotHandle": "h"},
                         "volumeSnapshotRef": {"name": "s", "namespace": "default"}}
            })),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["spec"]["source"]["snapshotHandle"], "h");
    // Finalizers hold a deleted custom resource like a built-in one.
    api.delete("c1", &DeleteParams::default()).await.unwrap();
    let held = api.get("c1").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    api.patch(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(api.get("c1").await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn watch_on_a_custom_resource_resumes_from_a_resource_version() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let api = contents(&emu);
    let first = api
        .create(&PostParams::default(), &content("c1"))
        .await
        .unwrap();
    let rv1 = first.metadata.resource_version.clone().unwrap();
    api.create(&PostParams::default(), &content("c2"))
        .await
        .unwrap();
    api.patch_status(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"readyToUse": true}})),
    )
    .await
    .unwrap();
    api.delete("c2", &DeleteParams::default()).await.unwrap();
    // Resuming after c1's creation replays exactly what followed, in order.
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &rv1)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("watch event in time")
            .unwrap()
            .expect("stream open");
        let entry = match ev {
            WatchEvent::Added(o) => ("ADDED", o.metadata.name.unwrap()),
            WatchEvent::Modified(o) => ("MODIFIED", o.metadata.name.unwrap()),
            WatchEvent::Deleted(o) => ("DELETED", o.metadata.name.unwrap()),
            other => panic!("unexpected {other:?}"),
        };
        seen.push(entry);
    }
    assert_eq!(
        seen,
        vec![
            ("ADDED", "c2".to_string()),
            ("MODIFIED", "c1".to_string()),
            ("DELETED", "c2".to_string())
        ]
    );
}

#[tokio::test]
async fn deleting_the_crd_deletes_its_objects_after_their_finalizers() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let api = contents(&emu);
    api.create(&PostParams::default(), &content("free"))
        .await
        .unwrap();
    let mut held = content("held");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    let name = "volumesnapshotcontents.snapshot.storage.k8s.io";
    let mut watch = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    crds.delete(name, &DeleteParams::default()).await.unwrap();
    // The free object goes, the held one is terminating, and so is the CRD.
    eventually("free object deleted", Duration::from_secs(5), || {
        let api = api.clone();
        async move { api.get_opt("free").await.unwrap().is_none().then_some(()) }
    })
    .await;
    let h = api.get("held").await.unwrap();
    assert!(h.metadata.deletion_timestamp.is_some());
    let crd = crds.get(name).await.unwrap();
    assert!(crd.metadata.deletion_timestamp.is_some());
    let terminating = serde_json::to_value(crd.status.unwrap()).unwrap()["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Terminating");
    assert!(terminating);
    // No creates while terminating.
    let e = api_err(
        api.create(&PostParams::default(), &content("new"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 405);
    // Releasing the last object lets the CRD go, and its resources stop being served.
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("CRD gone", Duration::from_secs(5), || {
        let crds = crds.clone();
        async move { crds.get_opt(name).await.unwrap().is_none().then_some(()) }
    })
    .await;
    assert_eq!(
        api_err(api.list(&Default::default()).await.unwrap_err()).code,
        404
    );
    // Open watches saw the objects go, then ended with the resource.
    let mut deleted = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(5), watch.try_next())
            .await
            .expect("the watch ends");
        match next.unwrap() {
            Some(WatchEvent::Deleted(o)) => deleted.push(o.metadata.name.unwrap()),
            Some(_) => {}
            None => break,
        }
    }
    deleted.sort();
    assert_eq!(deleted, ["free", "held"]);
    let apis = raw(&emu, "GET", "/apis/snapshot.storage.k8s.io/v1", None, "").await;
    let names: Vec<&str> = apis.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(!names.contains(&"volumesnapshotcontents"), "{names:?}");
    assert!(names.contains(&"volumesnapshots"), "{names:?}");
}

#[tokio::test]
async fn namespace_deletion_removes_namespaced_custom_resources() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(emu.client());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    let team: Api<DynamicObject> = Api::namespaced_with(
        emu.client(),
        "team",
        &ar("VolumeSnapshot", "volumesnapshots"),
    );
    let vs = obj(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "s1"}, "spec": {"source": {"persistentVolumeClaimName": "p"}}
    }));
    team.create(&PostParams::default(), &vs).await.unwrap();
    ns.delete("team", &DeleteParams::default()).await.unwrap();
    let all: Api<DynamicObject> =
        Api::all_with(emu.client(), &ar("VolumeSnapshot", "volumesnapshots"));
    assert!(
        all.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn crd_validation_errors() {
    let emu = Emulator::builder().pv_controller(false).build();
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    let mut crd: Value = serde_yaml::from_str(CRD_FILES[0]).unwrap();
    // Protected groups need the approval annotation.
    crd["metadata"]["annotations"] = json!({});
    let typed: CustomResourceDefinition = serde_json::from_value(crd.clone()).unwrap();
    let e = api_err(
        crds.create(&PostParams::default(), &typed)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "CustomResourceDefinition.apiextensions.k8s.io \"volumesnapshotclasses.snapshot.storage.k8s.io\" is invalid: metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111"
    );
    // The name must be <plural>.<group>; one storage version.
    crd["metadata"]["annotations"] = json!({"api-approved.kubernetes.io": "unapproved, testing"});
    crd["metadata"]["name"] = json!("classes.snapshot.storage.k8s.io");
    crd["spec"]["versions"][0]["storage"] = json!(false);
    let typed: CustomResourceDefinition = serde_json::from_value(crd.clone()).unwrap();
    let e = api_err(
        crds.create(&PostParams::default(), &typed)
            .await
            .unwrap_err(),
    );
    assert!(
        e.message.contains(
            "metadata.name: Invalid value: \"classes.snapshot.storage.k8s.io\": must be spec.names.plural+\".\"+spec.group"
        ),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("must have exactly one version marked as storage version"),
        "{}",
        e.message
    );
    // Fixed, it is accepted, and the group is immutable afterwards.
    crd["metadata"]["name"] = json!("volumesnapshotclasses.snapshot.storage.k8s.io");
    crd["spec"]["versions"][0]["storage"] = json!(true);
    let typed: CustomResourceDefinition = serde_json::from_value(crd).unwrap();
    let created = crds.create(&PostParams::default(), &typed).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let e = api_err(
        crds.patch(
            "volumesnapshotclasses.snapshot.storage.k8s.io",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"group": "other.example.com"}})),
        )
        .await
        .unwrap_err(),
    );
    assert!(e.message.contains("spec.group"), "{}", e.message);
    // A spec change bumps the CRD's generation and shows up in discovery.
    let patched = crds
        .patch(
            "volumesnapshotclasses.snapshot.storage.k8s.io",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"names": {"shortNames": ["vsc2"]}}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.generation, Some(2));
    let accepted =
        serde_json::to_value(patched.status.unwrap()).unwrap()["acceptedNames"]["shortNames"]
            .clone();
    assert_eq!(accepted, json!(["vsc2"]));
    let legacy = raw(&emu, "GET", "/apis/snapshot.storage.k8s.io/v1", None, "").await;
    assert_eq!(legacy.body["resources"][0]["shortNames"], json!(["vsc2"]));
}

#[tokio::test]
async fn custom_resources_answer_json_to_protobuf_clients() {
    let emu = Emulator::builder().pv_controller(false).build();
    install_crds(&emu).await;
    for path in [
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/missing",
    ] {
        let req = http::Request::get(path)
            .header(
                "accept",
                "application/vnd.kubernetes.protobuf,application/json",
            )
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = tower::ServiceExt::oneshot(emu.router(), req).await.unwrap();
        assert_eq!(resp.headers()["content-type"], "application/json", "{path}");
    }
}

#[tokio::test]
async fn several_served_versions_share_storage_and_warn_when_deprecated() {
    let emu = Emulator::builder().pv_controller(false).build();
    let crds: Api<CustomResourceDefinition> = Api::all(emu.client());
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "size": {"type": "integer"},
            "color": {"type": "string", "default": "blue"}}}}}});
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget", "categories": ["all"]},
            "versions": [
                {"name": "v1beta1", "served": true, "storage": false, "deprecated": true, "schema": schema},
                {"name": "v1", "served": true, "storage": true, "schema": schema},
                {"name": "v1alpha1", "served": false, "storage": false, "schema": schema}
            ]
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    // Discovery: preferred version first by Kubernetes version priority, unserved ones absent.
    let group = raw(&emu, "GET", "/apis/example.com", None, "").await;
    assert_eq!(group.body["preferredVersion"]["version"], "v1");
    let versions: Vec<&str> = group.body["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert_eq!(versions, ["v1", "v1beta1"]);
    let r = raw(&emu, "GET", "/apis/example.com/v1alpha1/widgets", None, "").await;
    assert_eq!(r.status, 404);
    // Written through v1beta1 (with the deprecation warning), read through v1.
    let r = raw(
        &emu,
        "POST",
        "/apis/example.com/v1beta1/namespaces/default/widgets",
        Some("application/json"),
        r#"{"apiVersion":"example.com/v1beta1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":3}}"#,
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["apiVersion"], "example.com/v1beta1");
    assert_eq!(
        r.headers["warning"],
        "299 - \"example.com/v1beta1 Widget is deprecated\""
    );
    let v1 = raw(
        &emu,
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets/w",
        None,
        "",
    )
    .await;
    assert_eq!(v1.body["apiVersion"], "example.com/v1");
    assert_eq!(v1.body["spec"]["size"], 3);
    assert_eq!(v1.body["spec"]["color"], "blue", "schema default applied");
    assert!(v1.headers.get("warning").is_none());
    let list = raw(&emu, "GET", "/apis/example.com/v1beta1/widgets", None, "").await;
    assert_eq!(list.body["kind"], "WidgetList");
    assert_eq!(list.body["apiVersion"], "example.com/v1beta1");
    // Wrong type for the schema.
    let bad = raw(
        &emu,
        "POST",
        "/apis/example.com/v1/namespaces/default/widgets",
        Some("application/json"),
        r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"x"},"spec":{"size":"big"}}"#,
    )
    .await;
    assert_eq!(bad.status, 422, "{}", bad.text);
    assert_eq!(
        bad.body["details"]["causes"][0],
        json!({"reason": "FieldValueInvalid", "field": "spec.size",
               "message": "Invalid value: \"string\": spec.size in body must be of type integer: \"string\""})
    );
}
