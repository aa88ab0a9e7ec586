//! Expansion, as the external-resizer does it: bound claim of ours asks for more ->
//! `Resizing` -> backend expand -> PV capacity raised -> claim status.
//!
//! # Flow
//! 1. [`resize::decide`] says `Expand` (or `Shrink`/`TooLarge`: a Warning, nothing changes; a
//!    request at or below `status.capacity`, e.g. `1G` provisioned as `954Mi`, is `Nothing`).
//! 2. `Resizing` event; the [`Expander`](crate::Expander) grows the volume.
//! 3. PV `spec.capacity.storage` is raised to the new size.
//! 4. If the node must still grow the filesystem: claim condition `FileSystemResizePending`
//!    and event `FileSystemResizeRequired`; else claim `status.capacity` is set and event
//!    `VolumeResizeSuccessful`.
//!
//! A failure anywhere is `VolumeResizeFailed` and a retry with backoff. A restart between
//! steps re-runs the (idempotent) expand and the remaining writes.

use std::time::Instant;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::{Retry, Shared, error_chain};
use crate::events::EventType;
use crate::quantity;
use crate::resize::{self, CONDITION_FS_RESIZE_PENDING, CONDITION_RESIZING, ResizeDecision};
use crate::volume::ExpandOutcome;

/// Event reasons (the external-resizer's).
pub(crate) const RESIZING: &str = "Resizing";
pub(crate) const VOLUME_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
pub(crate) const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
pub(crate) const FILE_SYSTEM_RESIZE_REQUIRED: &str = "FileSystemResizeRequired";

pub(super) async fn sync_resize(shared: &Shared, uid: &str) -> Result<(), Retry> {
    let Some(expander) = shared.expander.clone() else {
        return Ok(());
    };
    let Some(cached) = shared.claim_by_uid(uid) else {
        return Ok(());
    };
    let Some(volume_name) = cached
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.clone())
    else {
        return Ok(());
    };
    let Some(cached_volume) = shared.volumes.get(&ObjectRef::new(&volume_name)) else {
        return Ok(());
    };
    let Some(class) =
        crate::ownership::storage_class_name(&cached).and_then(|name| shared.class(name))
    else {
        return Ok(());
    };
    if resize::decide(&cached, &cached_volume, &class, &shared.names) == ResizeDecision::Nothing {
        return Ok(());
    }
    // The cache may lag behind our own last resize: decide again on fresh objects.
    let Some((claim, volume)) = fresh(shared, &cached, &volume_name).await? else {
        return Ok(());
    };
    let class_name = class.name_any();
    let requested = match resize::decide(&claim, &volume, &class, &shared.names) {
        ResizeDecision::Nothing => return Ok(()),
        ResizeDecision::Shrink {
            requested,
            allocated,
        } => {
            let message = format!(
                "requested size {requested} is smaller than {allocated}, the size the volume was \
                 already expanded for (status.allocatedResources): volumes cannot shrink; set \
                 spec.resources.requests.storage back to at least {allocated}"
            );
            shared.event(&claim, EventType::Warning, VOLUME_RESIZE_FAILED, &message);
            return Ok(());
        }
        ResizeDecision::TooLarge { requested } => {
            let message = format!(
                "requested size {requested} is larger than {} bytes, the most any volume can hold",
                u64::MAX
            );
            shared.event(&claim, EventType::Warning, VOLUME_RESIZE_FAILED, &message);
            return Ok(());
        }
        ResizeDecision::Expand { requested } => requested,
    };

    shared.event(
        &claim,
        EventType::Normal,
        RESIZING,
        &format!("External resizer is resizing volume {volume_name}"),
    );
    if let Err(error) = mark_resizing(shared, &claim).await {
        // Informational only (the external-resizer's `Resizing` condition): the resize itself
        // goes on, and the final status write replaces these fields anyway.
        tracing::warn!(claim = %claim.name_any(), %error, "could not mark the claim as resizing");
    }
    let started = Instant::now();
    let outcome = match expander.expand(&volume, requested).await {
        Ok(outcome) if outcome.capacity_bytes >= requested => outcome,
        Ok(outcome) => {
            let message = format!(
                "resize volume {volume_name:?} failed: the backend reported {} bytes after a \
                 request for {} ({requested} bytes)",
                outcome.capacity_bytes,
                request_text(&claim)
            );
            return fail(shared, &claim, &class_name, &message);
        }
        Err(error) => {
            let message = format!(
                "resize volume {volume_name:?} failed: {}",
                error_chain(&error)
            );
            return fail(shared, &claim, &class_name, &message);
        }
    };
    shared.config.step("before-pv-resize");
    if let Err(error) = raise_volume_capacity(shared, &volume, outcome.capacity_bytes).await {
        let message =
            format!("updating the capacity of PersistentVolume {volume_name:?} failed: {error}");
        return fail(shared, &claim, &class_name, &message);
    }
    shared.config.step("after-pv-resize");
    if let Err(error) = update_claim_status(shared, &claim, outcome).await {
        let message = format!("updating the status of the claim failed: {error}");
        return fail(shared, &claim, &class_name, &message);
    }
    shared.metrics.expanded(&class_name, started.elapsed());
    report_success(shared, &claim, outcome);
    Ok(())
}

/// The event ending a successful controller-side expansion.
fn report_success(shared: &Shared, claim: &PersistentVolumeClaim, outcome: ExpandOutcome) {
    let (reason, message) = if outcome.node_expansion_required {
        (
            FILE_SYSTEM_RESIZE_REQUIRED,
            "Require file system resize of volume on node",
        )
    } else {
        (VOLUME_RESIZE_SUCCESSFUL, "Resize volume succeeded")
    };
    shared.event(claim, EventType::Normal, reason, message);
}

async fn fresh(
    shared: &Shared,
    cached: &PersistentVolumeClaim,
    volume_name: &str,
) -> Result<Option<(PersistentVolumeClaim, PersistentVolume)>, Retry> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(
        shared.client.clone(),
        cached.meta().namespace.as_deref().unwrap_or("default"),
    );
    let volumes: Api<PersistentVolume> = Api::all(shared.client.clone());
    let read = async {
        let claim = claims.get_opt(&cached.name_any()).await?;
        let volume = volumes.get_opt(volume_name).await?;
        Ok::<_, kube::Error>(claim.zip(volume))
    };
    match read.await {
        Ok(Some((claim, volume))) if claim.metadata.uid == cached.metadata.uid => {
            Ok(Some((claim, volume)))
        }
        Ok(_) => Ok(None),
        Err(error) => {
            tracing::warn!(claim = %cached.name_any(), %error, "could not read claim and volume");
            Err(Retry)
        }
    }
}

fn fail(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    class: &str,
    message: &str,
) -> Result<(), Retry> {
    shared.metrics.expand_failed(class);
    tracing::warn!(claim = %claim.name_any(), error = message, "expansion failed");
    shared.event(claim, EventType::Warning, VOLUME_RESIZE_FAILED, message);
    Err(Retry)
}

async fn raise_volume_capacity(
    shared: &Shared,
    volume: &PersistentVolume,
    bytes: u64,
) -> Result<(), kube::Error> {
    if quantity::volume_capacity_bytes(volume).is_some_and(|current| current >= bytes) {
        return Ok(());
    }
    let api: Api<PersistentVolume> = Api::all(shared.client.clone());
    let patch =
        serde_json::json!({ "spec": { "capacity": { "storage": quantity::quantity(bytes) } } });
    api.patch(
        &volume.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

/// The claim's request as written (for messages).
fn request_text(claim: &PersistentVolumeClaim) -> String {
    quantity::claim_request(claim).map_or_else(String::new, |q| q.0.clone())
}

/// The claim's request as written, for `status.allocatedResources` (the external-resizer
/// records the request itself there, not the size the backend rounded it up to).
fn allocated(claim: &PersistentVolumeClaim) -> serde_json::Value {
    quantity::claim_request(claim).map_or(serde_json::Value::Null, |q| serde_json::json!(q))
}

/// What the external-resizer writes when it starts: the `Resizing` condition,
/// `allocatedResources` = the requested size and `ControllerResizeInProgress`.
async fn mark_resizing(shared: &Shared, claim: &PersistentVolumeClaim) -> Result<(), kube::Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(
        shared.client.clone(),
        claim.meta().namespace.as_deref().unwrap_or("default"),
    );
    // Merge patches replace lists: keep the conditions that are not ours.
    let mut conditions: Vec<serde_json::Value> = claim
        .status
        .as_ref()
        .and_then(|status| status.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != CONDITION_RESIZING)
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    conditions.push(serde_json::json!({
        "type": CONDITION_RESIZING,
        "status": "True",
        "lastProbeTime": null,
        "lastTransitionTime": Time(Timestamp::now()),
    }));
    let status = serde_json::json!({
        "conditions": conditions,
        "allocatedResources": { "storage": allocated(claim) },
        "allocatedResourceStatuses": { "storage": "ControllerResizeInProgress" },
    });
    api.patch_status(
        &claim.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "status": status })),
    )
    .await
    .map(|_| ())
}

async fn update_claim_status(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    outcome: ExpandOutcome,
) -> Result<(), kube::Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(
        shared.client.clone(),
        claim.meta().namespace.as_deref().unwrap_or("default"),
    );
    // Merge patches replace lists: keep every condition that is not ours to manage.
    let mut conditions: Vec<serde_json::Value> = claim
        .status
        .as_ref()
        .and_then(|status| status.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != CONDITION_RESIZING && c.type_ != CONDITION_FS_RESIZE_PENDING)
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    let size = quantity::quantity(outcome.capacity_bytes);
    let status = if outcome.node_expansion_required {
        conditions.push(serde_json::json!({
            "type": CONDITION_FS_RESIZE_PENDING,
            "status": "True",
            "lastProbeTime": null,
            "lastTransitionTime": Time(Timestamp::now()),
            "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
        }));
        serde_json::json!({
            "conditions": conditions,
            "allocatedResources": { "storage": allocated(claim) },
            // What the kubelet looks at (RecoverVolumeExpansionFailure) to grow the filesystem.
            "allocatedResourceStatuses": { "storage": "NodeResizePending" },
        })
    } else {
        serde_json::json!({
            "conditions": conditions,
            "capacity": { "storage": size },
            "allocatedResources": { "storage": allocated(claim) },
            "allocatedResourceStatuses": null,
        })
    };
    api.patch_status(
        &claim.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "status": status })),
    )
    .await
    .map(|_| ())
}
