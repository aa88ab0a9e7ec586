//! Provisioning flow.

use std::collections::BTreeMap;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::Emulator;
use provisioner::ownership::ANN_SELECTED_NODE;
use provisioner::pv::ANN_PROVISIONED_BY;

use crate::common::backend::{FakeBackend, Scripted};
use crate::common::*;

#[tokio::test]
async fn provisions_and_binds_claim() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);

    let created = create_claim(&client, &claim("data", "fast", "2Gi")).await;
    let pv_name = format!("pvc-{}", uid(&created));
    let bound = wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some(pv_name.as_str())
    );

    let volume = volumes(&client).get(&pv_name).await.unwrap();
    let annotations = volume.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations[ANN_PROVISIONED_BY], PROVISIONER);
    assert_eq!(
        provisioner::volume::deletion_secret(&volume).map(|s| (s.namespace, s.name)),
        Some(("storage".to_owned(), "admin-secret".to_owned()))
    );
    let spec = volume.spec.clone().unwrap();
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(claim_ref.uid, created.metadata.uid);
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    assert_eq!(claim_ref.namespace.as_deref(), Some(NS));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        backend.volumes.lock().unwrap().get(&pv_name),
        Some(&(2u64 << 30))
    );

    wait_for_event(
        &client,
        "data",
        "Provisioning",
        "External provisioner is provisioning volume",
    )
    .await;
    wait_for_event(&client, "data", "ProvisioningSucceeded", &pv_name).await;
    assert_eq!(backend.provisions(), 1);
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn does_nothing_when_volume_already_exists() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let created = create_claim(&client, &claim("data", "fast", "1Gi")).await;
    // Someone (a previous instance) already saved the PV for this claim.
    let pv_name = format!("pvc-{}", uid(&created));
    let existing: PersistentVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": { "name": pv_name, "annotations": { ANN_PROVISIONED_BY: PROVISIONER } },
        "spec": {
            "capacity": { "storage": "1Gi" }, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
            "csi": { "driver": "fake.example.com", "volumeHandle": pv_name },
            "claimRef": { "kind": "PersistentVolumeClaim", "namespace": NS, "name": "data", "uid": uid(&created) },
        },
    }))
    .unwrap();
    volumes(&client)
        .create(&PostParams::default(), &existing)
        .await
        .unwrap();

    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);
    // A second claim as a barrier: once it is provisioned, the first one was examined too.
    create_claim(&client, &claim("barrier", "fast", "1Gi")).await;
    wait_for(&claims(&client), "barrier", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(
        backend.provisions(),
        1,
        "only the barrier claim reaches the backend"
    );
    assert!(!backend.has_volume(&pv_name));
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn refuses_claim_with_selector() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);

    let mut with_selector = claim("picky", "fast", "1Gi");
    with_selector.spec.as_mut().unwrap().selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([("tier".to_owned(), "gold".to_owned())])),
            ..Default::default()
        },
    );
    create_claim(&client, &with_selector).await;
    let event = wait_for_event(
        &client,
        "picky",
        "ProvisioningFailed",
        "Selector is not supported",
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(backend.provisions(), 0);
    let claim = claims(&client).get("picky").await.unwrap();
    assert_eq!(phase(&claim), Some("Pending"));
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn wait_for_first_consumer_waits_for_selected_node() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(
        &client,
        "late",
        ClassSpec {
            wait_for_first_consumer: true,
            ..Default::default()
        },
    )
    .await;
    create_class(&client, "fast", ClassSpec::default()).await;
    create_node(&client, "node-1").await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);

    create_claim(&client, &claim("late", "late", "1Gi")).await;
    create_claim(&client, &claim("barrier", "fast", "1Gi")).await;
    wait_for(&claims(&client), "barrier", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(
        backend.provisions(),
        1,
        "the WaitForFirstConsumer claim waits for a node"
    );

    let patch =
        serde_json::json!({ "metadata": { "annotations": { ANN_SELECTED_NODE: "node-1" } } });
    claims(&client)
        .patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&claims(&client), "late", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert!(
        backend
            .selected_nodes
            .lock()
            .unwrap()
            .contains(&Some("node-1".to_owned()))
    );
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn reschedule_clears_selected_node() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(
        &client,
        "late",
        ClassSpec {
            wait_for_first_consumer: true,
            ..Default::default()
        },
    )
    .await;
    create_node(&client, "node-1").await;
    let backend = FakeBackend::new();
    backend.script([Scripted::Reschedule("node-1 cannot reach pool rbd")]);
    let controller = start(client.clone(), config(), backend.clone(), false);

    let mut late = claim("late", "late", "1Gi");
    late.metadata.annotations = Some(BTreeMap::from([(
        ANN_SELECTED_NODE.to_owned(),
        "node-1".to_owned(),
    )]));
    create_claim(&client, &late).await;
    wait_for(&claims(&client), "late", "selected-node removed", |c| {
        c.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(ANN_SELECTED_NODE))
    })
    .await;
    wait_for_event(&client, "late", "ProvisioningFailed", "pick another node").await;
    assert_eq!(backend.provisions(), 1);
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn claims_of_other_provisioners_are_left_alone() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    let other: k8s_openapi::api::storage::v1::StorageClass =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": { "name": "other" }, "provisioner": "other.example.com/x",
        }))
        .unwrap();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone())
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);
    create_claim(&client, &claim("theirs", "other", "1Gi")).await;
    create_claim(&client, &claim("barrier", "fast", "1Gi")).await;
    wait_for(&claims(&client), "barrier", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(backend.provisions(), 1);
    assert!(
        events_for(&client, "theirs")
            .await
            .iter()
            .all(|e| e.reason.as_deref() != Some("Provisioning"))
    );
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn exposes_provisioning_metrics() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    backend.script([Scripted::Final("transient")]);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = provisioner::Metrics::new(&mut registry);
    let controller = provisioner::Controller::new(client.clone(), config(), backend.clone())
        .with_metrics(metrics);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));
    create_claim(&client, &claim("data", "fast", "1Gi")).await;
    wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    let text = provisioner::metrics::encode_text(&registry).unwrap();
    for expected in [
        "controller_persistentvolumeclaim_provision_total{class=\"fast\",source=\"\"} 1",
        "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\",source=\"\"} 1",
        "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"fast\",source=\"\"} 1",
        "provisioner_workqueue_retries_total 1",
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
    let _ = stop.send(());
    handle.await.unwrap().unwrap();
}

/// A claim observer sees every claim the watch delivers, whole: also once it is Bound (when the
/// controller's cache keeps only a trimmed copy), with its labels and finalizers, and its
/// deletion.
#[tokio::test]
async fn claim_observers_see_every_claim_whole_including_bound_and_deleted_ones() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let seen: Arc<std::sync::Mutex<Vec<PersistentVolumeClaim>>> = Arc::default();
    let observer: provisioner::ClaimObserver = {
        let seen = Arc::clone(&seen);
        Arc::new(move |claim: &PersistentVolumeClaim| {
            seen.lock().unwrap().push(claim.clone());
        })
    };
    let controller = provisioner::Controller::new(client.clone(), config(), backend.clone())
        .with_claim_observer(observer);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));

    let mut labelled = claim("data", "fast", "1Gi");
    labelled.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "db".to_owned())]));
    create_claim(&client, &labelled).await;
    wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    let bound_and_whole = |seen: &[PersistentVolumeClaim]| {
        seen.iter().any(|c| {
            phase(c) == Some("Bound")
                && c.metadata.labels.as_ref().is_some_and(|l| l["app"] == "db")
                && c.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                && c.spec
                    .as_ref()
                    .and_then(|s| s.access_modes.as_ref())
                    .is_some()
        })
    };
    wait_until("the observer saw the Bound claim whole", || {
        bound_and_whole(&seen.lock().unwrap())
    })
    .await;
    claims(&client)
        .delete("data", &Default::default())
        .await
        .unwrap();
    wait_gone(&claims(&client), "data").await;
    wait_until("the observer saw the claim go", || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|c| c.metadata.deletion_timestamp.is_some())
    })
    .await;
    let _ = stop.send(());
    handle.await.unwrap().unwrap();
}
