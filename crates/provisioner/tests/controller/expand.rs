//! Expansion flow.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use kube::Client;
use kube::api::{Patch, PatchParams};
use kube_emulator::Emulator;
use provisioner::quantity::{claim_capacity_bytes, volume_capacity_bytes};
use provisioner::resize::{CONDITION_FS_RESIZE_PENDING, has_condition};
use provisioner::{Controller, ExpandError, ExpandOutcome, Expander};

use crate::common::backend::FakeBackend;
use crate::common::*;

const GI: u64 = 1 << 30;

async fn request(client: &Client, name: &str, size: &str) -> PersistentVolumeClaim {
    let patch = serde_json::json!({ "spec": { "resources": { "requests": { "storage": size } } } });
    claims(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("resize request")
}

fn expandable() -> ClassSpec {
    ClassSpec {
        allow_expansion: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn expansion_needing_node_sets_file_system_resize_pending() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = Arc::new(FakeBackend {
        node_expansion_required: true,
        ..Default::default()
    });
    let controller = start(client.clone(), config(), backend.clone(), true);

    let (_, volume) = provisioned_claim(&client, "data", "grow").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    request(&client, "data", "2Gi").await;

    wait_for(&volumes(&client), &pv_name, "capacity 2Gi", |v| {
        volume_capacity_bytes(v) == Some(2 * GI)
    })
    .await;
    let claim = wait_for(&claims(&client), "data", "FileSystemResizePending", |c| {
        has_condition(c, CONDITION_FS_RESIZE_PENDING)
    })
    .await;
    assert_eq!(
        claim_capacity_bytes(&claim),
        Some(GI),
        "capacity waits for the node"
    );
    let status = claim.status.clone().unwrap();
    assert_eq!(status.allocated_resources.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        status.allocated_resource_statuses.unwrap()["storage"],
        "NodeResizePending"
    );
    wait_for_event(&client, "data", "Resizing", &pv_name).await;
    wait_for_event(
        &client,
        "data",
        "FileSystemResizeRequired",
        "file system resize",
    )
    .await;
    assert_eq!(backend.volumes.lock().unwrap()[&pv_name], 2 * GI);

    // Asking for less than the volume already has is a shrink: a Warning and no change.
    request(&client, "data", "1536Mi").await;
    wait_for_event(
        &client,
        "data",
        "VolumeResizeFailed",
        "volumes cannot shrink",
    )
    .await;
    let volume = volumes(&client).get(&pv_name).await.unwrap();
    assert_eq!(volume_capacity_bytes(&volume), Some(2 * GI));
    assert_eq!(backend.expands(), 1);
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn expansion_without_node_step_updates_claim_capacity() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = FakeBackend::new();
    backend.fail_expands(1);
    let controller = start(client.clone(), config(), backend.clone(), true);

    let (_, volume) = provisioned_claim(&client, "data", "grow").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    request(&client, "data", "3Gi").await;

    wait_for_event(&client, "data", "VolumeResizeFailed", "pool is full").await;
    let claim = wait_for(&claims(&client), "data", "capacity 3Gi", |c| {
        claim_capacity_bytes(c) == Some(3 * GI)
    })
    .await;
    assert!(!has_condition(&claim, CONDITION_FS_RESIZE_PENDING));
    let volume = volumes(&client).get(&pv_name).await.unwrap();
    assert_eq!(volume_capacity_bytes(&volume), Some(3 * GI));
    wait_for_event(
        &client,
        "data",
        "VolumeResizeSuccessful",
        "Resize volume succeeded",
    )
    .await;
    assert_eq!(backend.expands(), 2, "one failure, one success");
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn class_without_allow_volume_expansion_is_not_expanded() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fixed", ClassSpec::default()).await;
    create_class(&client, "grow", expandable()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), true);
    let (_, fixed) = provisioned_claim(&client, "fixed", "fixed").await;
    provisioned_claim(&client, "barrier", "grow").await;
    // The API server may refuse the request itself (as the real one does); either way no expand.
    let patch =
        serde_json::json!({ "spec": { "resources": { "requests": { "storage": "2Gi" } } } });
    let _ = claims(&client)
        .patch("fixed", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    request(&client, "barrier", "2Gi").await;
    wait_for(&claims(&client), "barrier", "capacity 2Gi", |c| {
        claim_capacity_bytes(c) == Some(2 * GI)
    })
    .await;
    assert_eq!(backend.expands(), 1);
    let fixed = volumes(&client)
        .get(fixed.metadata.name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(volume_capacity_bytes(&fixed), Some(GI));
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn expansion_interrupted_after_volume_grew_converges() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), true);
    let (_, volume) = provisioned_claim(&client, "data", "grow").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    // The PV capacity write succeeds, the claim status writes fail (the `Resizing` mark, which
    // is informational, and the final one): a half-done resize.
    emu.faults()
        .fail_next("patch", "persistentvolumeclaims/status", 2, 500);
    request(&client, "data", "2Gi").await;
    wait_for_event(
        &client,
        "data",
        "VolumeResizeFailed",
        "updating the status of the claim failed",
    )
    .await;
    let claim = wait_for(&claims(&client), "data", "capacity 2Gi", |c| {
        claim_capacity_bytes(c) == Some(2 * GI)
    })
    .await;
    assert!(
        claim
            .status
            .unwrap()
            .allocated_resource_statuses
            .is_none_or(|s| s.is_empty())
    );
    let volume = volumes(&client).get(&pv_name).await.unwrap();
    assert_eq!(volume_capacity_bytes(&volume), Some(2 * GI));
    assert_eq!(
        backend.expands(),
        2,
        "the idempotent expand is repeated, nothing else"
    );
    assert_eq!(backend.volumes.lock().unwrap()[&pv_name], 2 * GI);
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn a_resize_in_progress_shows_on_the_claim_as_the_external_resizer_marks_it() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = FakeBackend::new();
    backend.fail_expands(usize::MAX);
    let controller = start(client.clone(), config(), backend.clone(), true);
    provisioned_claim(&client, "data", "grow").await;
    request(&client, "data", "5Gi").await;

    wait_for_event(&client, "data", "VolumeResizeFailed", "pool is full").await;
    let claim = wait_for(&claims(&client), "data", "marked resizing", |c| {
        has_condition(c, provisioner::resize::CONDITION_RESIZING)
    })
    .await;
    assert_eq!(claim_capacity_bytes(&claim), Some(GI), "not resized yet");
    let status = claim.status.unwrap();
    assert_eq!(
        status.allocated_resource_statuses.unwrap()["storage"],
        "ControllerResizeInProgress"
    );
    assert_eq!(status.allocated_resources.unwrap()["storage"].0, "5Gi");
    controller.stop().await.unwrap();
}

/// Claims in decimal units, milli or plain bytes, on a backend that rounds up to whole MiB
/// (`1G` becomes 954Mi): Bound with no Warning (the capacity above the request is
/// not a shrink), and growing one resizes it once.
#[tokio::test]
async fn rounded_up_capacity_is_not_a_shrink() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = Arc::new(FakeBackend {
        node_expansion_required: true,
        round_to: Some(1 << 20),
        ..Default::default()
    });
    let controller = start(client.clone(), config(), backend.clone(), true);
    let sizes = [
        ("one-g", "1G", 954u64 << 20),
        ("ten-g", "10G", 9537 << 20),
        ("half-g", "500M", 477 << 20),
        ("milli", "100m", 1 << 20),
        ("half", "0.5", 1 << 20),
        ("kilo", "1e3", 1 << 20),
        ("byte", "1", 1 << 20),
        ("fraction", "1.5Gi", 1536 << 20),
    ];
    for (name, size, _) in sizes {
        create_claim(&client, &claim(name, "grow", size)).await;
    }
    for (name, _, bytes) in sizes {
        let bound = wait_for(&claims(&client), name, "Bound", |c| {
            phase(c) == Some("Bound")
        })
        .await;
        assert_eq!(claim_capacity_bytes(&bound), Some(bytes), "{name}");
    }

    // The claims above were queued for the expansion check before this change.
    request(&client, "ten-g", "20G").await;
    let claim = wait_for(&claims(&client), "ten-g", "FileSystemResizePending", |c| {
        has_condition(c, CONDITION_FS_RESIZE_PENDING)
    })
    .await;
    let status = claim.status.clone().unwrap();
    assert_eq!(
        status.allocated_resources.unwrap()["storage"].0,
        "20G",
        "the request as written"
    );
    wait_for_event(
        &client,
        "ten-g",
        "FileSystemResizeRequired",
        "file system resize",
    )
    .await;
    let pv_name = claim.spec.unwrap().volume_name.unwrap();
    let volume = volumes(&client).get(&pv_name).await.unwrap();
    assert_eq!(volume_capacity_bytes(&volume), Some(19074 << 20));

    for (name, _, _) in sizes {
        let events = events_for(&client, name).await;
        let warnings: Vec<_> = events
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(|e| (e.reason.clone(), e.message.clone()))
            .collect();
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
        let resizing = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("Resizing"))
            .count();
        assert_eq!(resizing, usize::from(name == "ten-g"), "{name}");
    }
    assert_eq!(backend.expands(), 1);
    controller.stop().await.unwrap();
}

/// The annotation kube-controller-manager writes on a claim whose expansion it owns.
const RESIZER_ANNOTATION: &str = "volume.kubernetes.io/storage-resizer";

async fn annotate_and_request(client: &Client, name: &str, resizer: &str, size: &str) {
    let patch = serde_json::json!({
        "metadata": { "annotations": { RESIZER_ANNOTATION: resizer } },
        "spec": { "resources": { "requests": { "storage": size } } },
    });
    claims(client)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate and grow");
}

/// A claim whose `volume.kubernetes.io/storage-resizer` names another resizer (here
/// kube-controller-manager's in-tree `kubernetes.io/rbd`, which writes it on clusters that still
/// have the plugin) is left to that resizer: an event says so, nothing is expanded or written.
/// Without the annotation (removed), or with it naming us or the PV's CSI driver, we expand.
#[tokio::test]
async fn a_claim_owned_by_another_resizer_is_left_to_it() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), true);
    let (_, volume) = provisioned_claim(&client, "intree", "grow").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    provisioned_claim(&client, "by-driver", "grow").await;
    provisioned_claim(&client, "by-name", "grow").await;

    // What kube-controller-manager's expand controller writes when its in-tree plugin resizes.
    annotate_and_request(&client, "intree", "kubernetes.io/rbd", "2Gi").await;
    let event = wait_for_event(&client, "intree", "OtherResizer", "kubernetes.io/rbd").await;
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert!(
        event
            .message
            .as_deref()
            .is_some_and(|m| m.contains(RESIZER_ANNOTATION)),
        "{event:?}"
    );
    assert_eq!(backend.expands(), 0, "another resizer owns it");
    let claim = claims(&client).get("intree").await.unwrap();
    assert_eq!(claim_capacity_bytes(&claim), Some(GI));
    assert!(!has_condition(
        &claim,
        provisioner::resize::CONDITION_RESIZING
    ));
    assert!(
        claim
            .status
            .unwrap()
            .allocated_resource_statuses
            .is_none_or(|s| s.is_empty()),
        "no status written"
    );
    let volume = volumes(&client).get(&pv_name).await.unwrap();
    assert_eq!(volume_capacity_bytes(&volume), Some(GI));

    // Naming our CSI driver or our provisioner name: ours to expand.
    for (name, resizer) in [("by-driver", "fake.example.com"), ("by-name", PROVISIONER)] {
        annotate_and_request(&client, name, resizer, "2Gi").await;
        wait_for(&claims(&client), name, "capacity 2Gi", |c| {
            claim_capacity_bytes(c) == Some(2 * GI)
        })
        .await;
    }
    assert_eq!(backend.expands(), 2);

    // The annotation removed (e.g. after an upgrade to a release without the in-tree plugin):
    // the claim is ours to expand.
    let patch = serde_json::json!({ "metadata": { "annotations": { RESIZER_ANNOTATION: null } } });
    claims(&client)
        .patch("intree", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("remove the annotation");
    wait_for(&claims(&client), "intree", "capacity 2Gi", |c| {
        claim_capacity_bytes(c) == Some(2 * GI)
    })
    .await;
    assert_eq!(backend.expands(), 3);
    controller.stop().await.unwrap();
}

/// Another controller adds a condition of its own while the volume grows.
struct ConcurrentWriter {
    inner: Arc<FakeBackend>,
    client: Client,
    claim: &'static str,
}

/// A condition type another controller writes (the external-resizer's modify controller).
const FOREIGN_CONDITION: &str = "ModifyingVolume";

#[async_trait::async_trait]
impl Expander for ConcurrentWriter {
    async fn expand(
        &self,
        volume: &PersistentVolume,
        new_size_bytes: u64,
    ) -> Result<ExpandOutcome, ExpandError> {
        // The claim as it is now (the controller read it and marked it Resizing before calling
        // us); add a condition the way a well-behaved writer does: every condition kept, with a
        // resourceVersion precondition.
        let api = claims(&self.client);
        let current = api.get(self.claim).await.expect("claim");
        let mut conditions = current
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        conditions.push(PersistentVolumeClaimCondition {
            type_: FOREIGN_CONDITION.to_owned(),
            status: "True".to_owned(),
            message: Some("written while the volume grew".to_owned()),
            ..Default::default()
        });
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "status": { "conditions": conditions },
        });
        api.patch_status(self.claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("concurrent condition write");
        self.inner.expand(volume, new_size_bytes).await
    }
}

async fn concurrent_condition_survives(node_expansion_required: bool) {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "grow", expandable()).await;
    let backend = Arc::new(FakeBackend {
        node_expansion_required,
        ..Default::default()
    });
    let expander = Arc::new(ConcurrentWriter {
        inner: backend.clone(),
        client: client.clone(),
        claim: "data",
    });
    let controller =
        Controller::new(client.clone(), config(), backend.clone()).with_expander(expander);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));

    provisioned_claim(&client, "data", "grow").await;
    request(&client, "data", "2Gi").await;
    let done = wait_for(&claims(&client), "data", "resize finished", |c| {
        if node_expansion_required {
            has_condition(c, CONDITION_FS_RESIZE_PENDING)
        } else {
            claim_capacity_bytes(c) == Some(2 * GI)
        }
    })
    .await;
    assert!(
        has_condition(&done, FOREIGN_CONDITION),
        "the condition written during the resize was overwritten: {:#?}",
        done.status
    );
    assert!(!has_condition(
        &done,
        provisioner::resize::CONDITION_RESIZING
    ));
    let status = done.status.unwrap();
    assert_eq!(status.allocated_resources.unwrap()["storage"].0, "2Gi");
    let event = if node_expansion_required {
        "FileSystemResizeRequired"
    } else {
        "VolumeResizeSuccessful"
    };
    wait_for_event(&client, "data", event, "").await;
    assert_eq!(backend.expands(), 1);

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, handle)
        .await
        .expect("controller stops")
        .expect("controller task")
        .expect("controller result");
}

/// Claim status writes carry the resourceVersion they were computed from: a condition another
/// controller wrote in between is kept (the write is redone on a fresh read), not overwritten.
#[tokio::test]
async fn a_condition_written_during_the_resize_is_kept_at_the_end() {
    concurrent_condition_survives(false).await;
}

#[tokio::test]
async fn a_condition_written_during_the_resize_is_kept_when_the_node_must_finish() {
    concurrent_condition_survives(true).await;
}
