//! Expansion, as the external-resizer does it: bound claim of ours asks for more ->
//! `Resizing` -> backend expand -> PV capacity raised -> claim status.
//!
//! # Flow
//! 1. [`resize::decide`] says `Expand` (or `Shrink`/`TooLarge`: a Warning, nothing changes; a
//!    request at or below `status.capacity`, e.g. `1G` provisioned as `954Mi`, is `Nothing`;
//!    a claim whose `volume.kubernetes.io/storage-resizer` annotation names another resizer is
//!    `OtherResizer`: an `OtherResizer` event, nothing changes).
//! 2. `Resizing` event and claim condition; the [`Expander`](crate::Expander) grows the volume.
//! 3. PV `spec.capacity.storage` is raised to the new size.
//! 4. If the node must still grow the filesystem: claim condition `FileSystemResizePending`
//!    and event `FileSystemResizeRequired`; else claim `status.capacity` is set and event
//!    `VolumeResizeSuccessful`.
//!
//! A failure anywhere is `VolumeResizeFailed` and a retry with backoff. A restart between
//! steps re-runs the (idempotent) expand and the remaining writes.
//!
//! Claim status writes are JSON merge patches of `/status` carrying the `metadata.uid` and
//! `metadata.resourceVersion` of the claim they were computed from (the external-resizer's
//! `addResourceVersionCheck`): a merge patch replaces the whole `conditions` list, so a write
//! computed from a stale read would drop conditions others wrote since. The API server answers
//! such a write 409 Conflict; it is then recomputed on a fresh read (others' conditions kept,
//! ours replaced) and sent again.

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
use crate::resize::{
    self, ANN_STORAGE_RESIZER, CONDITION_FS_RESIZE_PENDING, CONDITION_RESIZING, ResizeDecision,
};
use crate::volume::ExpandOutcome;

/// Event reasons (the external-resizer's).
pub(crate) const RESIZING: &str = "Resizing";
pub(crate) const VOLUME_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
pub(crate) const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
pub(crate) const FILE_SYSTEM_RESIZE_REQUIRED: &str = "FileSystemResizeRequired";
/// Event reason (ours): the claim asks for more, but another resizer owns its expansion.
pub(crate) const OTHER_RESIZER: &str = "OtherResizer";

/// Attempts of one claim status write that keeps conflicting with concurrent writers (each
/// after a fresh read); then the whole resize is retried with backoff.
const STATUS_WRITE_ATTEMPTS: usize = 5;

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
    if resize::decide(&cached, &*cached_volume, &class, &shared.names) == ResizeDecision::Nothing {
        return Ok(());
    }
    // The cache may lag behind our own last resize: decide again on fresh objects.
    let Some((claim, volume)) = fresh(shared, &cached, &volume_name).await? else {
        return Ok(());
    };
    let class_name = class.name_any();
    let decision = resize::decide(&claim, &volume, &class, &shared.names);
    let ResizeDecision::Expand { requested } = decision else {
        report_no_resize(shared, &claim, decision);
        return Ok(());
    };

    shared.event(
        &claim,
        EventType::Normal,
        RESIZING,
        &format!("External resizer is resizing volume {volume_name}"),
    );
    // The request this resize acts on, as written (`status.allocatedResources`).
    let acted_on = allocated(&claim);
    let claim = match mark_resizing(shared, &claim, &acted_on).await {
        Ok(marked) => marked,
        Err(error) => {
            // Informational only (the external-resizer's `Resizing` condition): the resize
            // itself goes on, and the final status write replaces these fields anyway.
            tracing::warn!(claim = %claim.name_any(), %error, "could not mark the claim as resizing");
            claim
        }
    };
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
    if let Err(error) = update_claim_status(shared, &claim, &acted_on, outcome).await {
        let message = format!("updating the status of the claim failed: {error}");
        return fail(shared, &claim, &class_name, &message);
    }
    shared.metrics.expanded(&class_name, started.elapsed());
    report_success(shared, &claim, outcome);
    Ok(())
}

/// Tells the claim's owner why a request for more is not acted on (nothing for `Nothing`).
fn report_no_resize(shared: &Shared, claim: &PersistentVolumeClaim, decision: ResizeDecision) {
    match decision {
        ResizeDecision::Nothing | ResizeDecision::Expand { .. } => {}
        ResizeDecision::Shrink {
            requested,
            allocated,
        } => {
            let message = format!(
                "requested size {requested} is smaller than {allocated}, the size the volume was \
                 already expanded for (status.allocatedResources): volumes cannot shrink; set \
                 spec.resources.requests.storage back to at least {allocated}"
            );
            shared.event(claim, EventType::Warning, VOLUME_RESIZE_FAILED, &message);
        }
        ResizeDecision::TooLarge { requested } => {
            let message = format!(
                "requested size {requested} is larger than {} bytes, the most any volume can hold",
                u64::MAX
            );
            shared.event(claim, EventType::Warning, VOLUME_RESIZE_FAILED, &message);
        }
        ResizeDecision::OtherResizer { resizer } => {
            let ours = &shared.config.provisioner_name;
            let message = format!(
                "waiting for {resizer} to expand this claim: its {ANN_STORAGE_RESIZER} \
                 annotation names {resizer}, so {ours} leaves the volume alone (if {resizer} no \
                 longer runs in this cluster, e.g. kubernetes.io/rbd on Kubernetes 1.31 and \
                 later, remove the annotation to let {ours} expand it)"
            );
            tracing::info!(claim = %claim.name_any(), %resizer, "expansion left to another resizer");
            shared.event(claim, EventType::Normal, OTHER_RESIZER, &message);
        }
    }
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

pub(super) async fn fresh(
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

/// The claim's conditions without ours (`drop`), as JSON: merge patches replace lists, so
/// every condition that is not ours to manage is sent back as it is.
pub(super) fn foreign_conditions(
    claim: &PersistentVolumeClaim,
    drop: &[&str],
) -> Vec<serde_json::Value> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !drop.contains(&c.type_.as_str()))
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect()
}

/// Writes the claim's status as computed by `status` from the claim, with the claim's uid and
/// resourceVersion as preconditions; on 409 Conflict (someone wrote the claim since it was
/// read) recomputes it from a fresh read and tries again, up to [`STATUS_WRITE_ATTEMPTS`]
/// times. Returns the claim as written.
pub(super) async fn write_claim_status(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    status: impl Fn(&PersistentVolumeClaim) -> serde_json::Value,
) -> Result<PersistentVolumeClaim, kube::Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(
        shared.client.clone(),
        claim.meta().namespace.as_deref().unwrap_or("default"),
    );
    let name = claim.name_any();
    let mut current = claim.clone();
    let mut attempt = 1;
    loop {
        let patch = serde_json::json!({
            "metadata": {
                "uid": claim.metadata.uid,
                "resourceVersion": current.metadata.resource_version,
            },
            "status": status(&current),
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => return Ok(written),
            Err(kube::Error::Api(conflict))
                if conflict.code == 409 && attempt < STATUS_WRITE_ATTEMPTS =>
            {
                tracing::debug!(claim = %name, attempt, "claim changed since read; writing its status again on a fresh read");
                let fresh = api.get(&name).await?;
                if fresh.metadata.uid != claim.metadata.uid {
                    // Deleted and created again under the same name: not the claim we resized.
                    return Err(kube::Error::Api(conflict));
                }
                current = fresh;
                attempt += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// What the external-resizer writes when it starts: the `Resizing` condition,
/// `allocatedResources` = the requested size and `ControllerResizeInProgress`. Returns the
/// claim as written.
async fn mark_resizing(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    acted_on: &serde_json::Value,
) -> Result<PersistentVolumeClaim, kube::Error> {
    write_claim_status(shared, claim, |current| {
        let mut conditions = foreign_conditions(current, &[CONDITION_RESIZING]);
        conditions.push(serde_json::json!({
            "type": CONDITION_RESIZING,
            "status": "True",
            "lastProbeTime": null,
            "lastTransitionTime": Time(Timestamp::now()),
        }));
        serde_json::json!({
            "conditions": conditions,
            "allocatedResources": { "storage": acted_on },
            "allocatedResourceStatuses": { "storage": "ControllerResizeInProgress" },
        })
    })
    .await
}

async fn update_claim_status(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    acted_on: &serde_json::Value,
    outcome: ExpandOutcome,
) -> Result<(), kube::Error> {
    let size = quantity::quantity(outcome.capacity_bytes);
    write_claim_status(shared, claim, |current| {
        let mut conditions = foreign_conditions(
            current,
            &[CONDITION_RESIZING, CONDITION_FS_RESIZE_PENDING],
        );
        if outcome.node_expansion_required {
            conditions.push(serde_json::json!({
                "type": CONDITION_FS_RESIZE_PENDING,
                "status": "True",
                "lastProbeTime": null,
                "lastTransitionTime": Time(Timestamp::now()),
                "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
            }));
            serde_json::json!({
                "conditions": conditions,
                "allocatedResources": { "storage": acted_on },
                // What the kubelet looks at (RecoverVolumeExpansionFailure) to grow the filesystem.
                "allocatedResourceStatuses": { "storage": "NodeResizePending" },
            })
        } else {
            serde_json::json!({
                "conditions": conditions,
                "capacity": { "storage": size },
                "allocatedResources": { "storage": acted_on },
                "allocatedResourceStatuses": null,
            })
        }
    })
    .await
    .map(|_| ())
}
