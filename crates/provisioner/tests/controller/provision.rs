//! Provisioning flow.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::Emulator;
use provisioner::ownership::ANN_SELECTED_NODE;
use provisioner::pv::ANN_PROVISIONED_BY;
use tokio::sync::Semaphore;

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
async fn pv_save_failure_deletes_backend_volume_then_retries() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    // Every save attempt of the first round fails; the cleanup delete fails once too.
    emu.faults()
        .fail_next("create", "persistentvolumes", 3, 500);
    backend.fail_deletes(1);
    let controller = start(client.clone(), config(), backend.clone(), false);

    let created = create_claim(&client, &claim("data", "fast", "1Gi")).await;
    let pv_name = format!("pvc-{}", uid(&created));
    wait_for_event(&client, "data", "ProvisioningCleanupFailed", &pv_name).await;
    wait_for_event(
        &client,
        "data",
        "ProvisioningFailed",
        "failed to save PersistentVolume",
    )
    .await;
    wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert!(
        backend.deletes() >= 1,
        "the backend volume was deleted after the save failed"
    );
    assert!(backend.provisions() >= 2);
    assert_eq!(
        backend.volume_count(),
        1,
        "exactly one backend volume in the end"
    );
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn retries_forever_and_says_it_is_still_failing() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    backend.script((0..5).map(|_| Scripted::Final("pool rbd is full")));
    let controller = start(client.clone(), config(), backend.clone(), false);

    create_claim(&client, &claim("data", "fast", "1Gi")).await;
    let first = wait_for_event(
        &client,
        "data",
        "ProvisioningFailed",
        "failed to provision volume with StorageClass \"fast\": pool rbd is full",
    )
    .await;
    assert_eq!(first.type_.as_deref(), Some("Warning"));
    let still = wait_for_event(
        &client,
        "data",
        "ProvisioningFailed",
        "still failing after 4 attempts",
    )
    .await;
    assert!(still.message.unwrap().contains("pool rbd is full"));
    wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(backend.provisions(), 6);
    // Repeats of the same message are aggregated into one Event with a count.
    let repeated = events_for(&client, "data")
        .await
        .into_iter()
        .find(|e| {
            e.message
                .as_deref()
                .is_some_and(|m| m.starts_with("failed to provision"))
        })
        .unwrap();
    assert!(repeated.count.unwrap_or(0) >= 2, "{repeated:?}");
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
async fn in_background_provisioning_is_cleaned_up_after_claim_deletion() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    backend.script((0..3).map(|_| Scripted::InBackground("image creation timed out")));
    let controller = start(client.clone(), config(), backend.clone(), false);

    let created = create_claim(&client, &claim("data", "fast", "1Gi")).await;
    let pv_name = format!("pvc-{}", uid(&created));
    wait_for_event(
        &client,
        "data",
        "ProvisioningFailed",
        "image creation timed out",
    )
    .await;
    assert!(backend.has_volume(&pv_name));
    claims(&client)
        .delete("data", &Default::default())
        .await
        .unwrap();
    wait_until("the orphaned backend volume is deleted", || {
        !backend.has_volume(&pv_name)
    })
    .await;
    assert!(
        volumes(&client).get_opt(&pv_name).await.unwrap().is_none(),
        "no PV for a deleted claim"
    );
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn restart_between_backend_create_and_pv_save_converges() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    // The first instance creates the volume and then hangs before returning: crash it there.
    *backend.gate.lock().unwrap() = Some(Arc::new(Semaphore::new(0)));
    let first = start(client.clone(), config(), backend.clone(), false);
    let created = create_claim(&client, &claim("data", "fast", "1Gi")).await;
    let pv_name = format!("pvc-{}", uid(&created));
    wait_until("the first instance created the volume", || {
        backend.has_volume(&pv_name)
    })
    .await;
    first.crash().await;

    *backend.gate.lock().unwrap() = None;
    let second = start(client.clone(), config(), backend.clone(), false);
    wait_for(&claims(&client), "data", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(
        backend.provisions(),
        2,
        "the restarted instance asked the backend again"
    );
    assert_eq!(
        backend.volume_count(),
        1,
        "and got the same volume, not a second one"
    );
    assert_eq!(backend.created_by.lock().unwrap()[&pv_name], 1);
    second.stop().await.unwrap();
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

#[tokio::test]
async fn keeps_working_after_watches_are_dropped() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);
    provisioned_claim(&client, "before", "fast").await;
    let dropped = emu.faults().drop_watches("persistentvolumeclaims")
        + emu.faults().drop_watches("persistentvolumes");
    assert!(dropped >= 2, "the controller had watches open ({dropped})");
    provisioned_claim(&client, "after", "fast").await;
    assert_eq!(backend.provisions(), 2);
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn optional_failure_threshold_gives_up_with_a_warning() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    backend.script((0..10).map(|_| Scripted::Final("quota exceeded")));
    let mut config = config();
    config.failure_threshold = Some(3);
    let controller = start(client.clone(), config, backend.clone(), false);
    create_claim(&client, &claim("data", "fast", "1Gi")).await;
    wait_for_event(
        &client,
        "data",
        "ProvisioningFailed",
        "giving up after 3 failed attempts: quota exceeded",
    )
    .await;
    // Let the barrier (created afterwards) prove the queue moved on without more attempts.
    backend.script.lock().unwrap().clear();
    provisioned_claim(&client, "barrier", "fast").await;
    assert_eq!(
        backend.provisions(),
        4,
        "three attempts for data, one for the barrier"
    );
    assert_eq!(
        phase(&claims(&client).get("data").await.unwrap()),
        Some("Pending")
    );
    controller.stop().await.unwrap();
}
