//! Validation, defaulting and the events.k8s.io view.

mod common;

use common::{api_err, no_controller, pvc, pvcs, raw, storage_class};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

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

#[tokio::test]
async fn secret_string_data_is_folded_into_data_and_type_defaults_to_opaque() {
    use k8s_openapi::api::core::v1::Secret;
    let emu = no_controller();
    let secrets: Api<Secret> = Api::default_namespaced(emu.client());
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "ceph-admin"}, "stringData": {"key": "AQBsecret=="}}),
    )
    .unwrap();
    let created = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    assert!(created.string_data.is_none());
    assert_eq!(created.data.unwrap()["key"].0, b"AQBsecret==");
}
