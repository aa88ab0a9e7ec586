//! Modification by VolumeAttributesClass, as external-resizer's modify controller does it:
//! a bound claim of ours names a class that is not its current one -> `InProgress` -> the
//! [`Modifier`](crate::Modifier) applies the class -> PV `spec.volumeAttributesClassName` ->
//! claim `status.currentVolumeAttributesClassName`.
//!
//! # Flow
//! 1. [`modify::decide`] says `Modify { target }` (on fresh reads of the claim and its PV).
//! 2. The class `target` is read. Missing: Warning `VolumeModifyFailed` ("VAC ... does not
//!    exist."), `status.modifyVolumeStatus` = `{target, Pending}`, retried with backoff.
//! 3. `status.modifyVolumeStatus` = `{target, InProgress}` and the `ModifyingVolume` condition;
//!    Normal event `VolumeModify`.
//! 4. The modifier applies the class.
//!    - Success: the PV's `spec.volumeAttributesClassName` = target (first, so a claim never
//!      says more than its PV), then the claim's `currentVolumeAttributesClassName` = target,
//!      `modifyVolumeStatus` removed, our conditions removed; Normal `VolumeModifySuccessful`.
//!    - [`ModifyError::Infeasible`]: `{target, Infeasible}`, the `ModifyingVolume` condition
//!      says why; Warning `VolumeModifyFailed`; retried with backoff (a class is immutable, so
//!      this only succeeds once another class is named, or the backend changes).
//!    - [`ModifyError::Failed`]: stays `InProgress`; Warning `VolumeModifyFailed` ("... Still
//!      modifying to VAC ..."); retried with backoff.
//!
//! A restart between steps finds the `InProgress` status and applies the (idempotent) class
//! again. Status writes are merge patches with resourceVersion preconditions, recomputed on a
//! conflict (the expansion's `write_claim_status`).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use super::expand::{foreign_conditions, fresh, write_claim_status};
use super::{Retry, Shared, error_chain};
use crate::events::EventType;
use crate::modify::{
    self, CONDITION_MODIFY_VOLUME_ERROR, CONDITION_MODIFYING_VOLUME, ModifyDecision, ModifyError,
    STATUS_IN_PROGRESS, STATUS_INFEASIBLE, STATUS_PENDING,
};

/// Event reasons (external-resizer's).
pub(crate) const VOLUME_MODIFY: &str = "VolumeModify";
pub(crate) const VOLUME_MODIFY_SUCCESSFUL: &str = "VolumeModifySuccessful";
pub(crate) const VOLUME_MODIFY_FAILED: &str = "VolumeModifyFailed";

const OUR_CONDITIONS: [&str; 2] = [CONDITION_MODIFYING_VOLUME, CONDITION_MODIFY_VOLUME_ERROR];

pub(super) async fn sync_modify(shared: &Shared, uid: &str) -> Result<(), Retry> {
    let Some(modifier) = shared.modifier.clone() else {
        return Ok(());
    };
    let Some(cached) = shared.claim_by_uid(uid) else {
        return Ok(());
    };
    let Some(volume_name) = cached.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return Ok(());
    };
    let Some(cached_volume) = shared.volumes.get(&ObjectRef::new(&volume_name)) else {
        return Ok(());
    };
    if !crate::pv::is_ours(&*cached_volume, &shared.names)
        || modify::decide(&cached, &*cached_volume) == ModifyDecision::Nothing
    {
        return Ok(());
    }
    // The cache may lag behind our own last write: decide again on fresh objects.
    let Some((claim, volume)) = fresh(shared, &cached, &volume_name).await? else {
        return Ok(());
    };
    let ModifyDecision::Modify { target } = modify::decide(&claim, &volume) else {
        return Ok(());
    };
    let classes: Api<VolumeAttributesClass> = Api::all(shared.client.clone());
    let class = match classes.get_opt(&target).await {
        Ok(Some(class)) => class,
        Ok(None) => {
            shared.event(
                &claim,
                EventType::Warning,
                VOLUME_MODIFY_FAILED,
                &format!("VAC {target:?} does not exist."),
            );
            if let Err(error) = mark(shared, &claim, &target, STATUS_PENDING, None).await {
                tracing::warn!(claim = %claim.name_any(), %error, "could not mark the claim's modification pending");
            }
            return Err(Retry);
        }
        Err(error) => {
            tracing::warn!(claim = %claim.name_any(), %error, "could not read the VolumeAttributesClass");
            return Err(Retry);
        }
    };
    let claim = match mark(shared, &claim, &target, STATUS_IN_PROGRESS, None).await {
        Ok(marked) => marked,
        Err(error) => {
            tracing::warn!(claim = %claim.name_any(), %error, "could not mark the claim as being modified");
            return Err(Retry);
        }
    };
    shared.event(
        &claim,
        EventType::Normal,
        VOLUME_MODIFY,
        &format!("modifying volume {volume_name} with VolumeAttributesClass {target}"),
    );
    shared.config.step("before-modify");
    if let Err(error) = modifier.modify(&volume, &class).await {
        return failed(shared, &claim, &target, &error).await;
    }
    shared.config.step("after-modify");
    if let Err(error) = complete(shared, &claim, &volume, &target).await {
        let message = format!("recording the modification failed: {error}");
        shared.event(&claim, EventType::Warning, VOLUME_MODIFY_FAILED, &message);
        return Err(Retry);
    }
    tracing::info!(claim = %claim.name_any(), volume = %volume_name, class = %target, "volume modified");
    shared.event(
        &claim,
        EventType::Normal,
        VOLUME_MODIFY_SUCCESSFUL,
        &format!("modified volume {volume_name} with VolumeAttributesClass {target} successfully"),
    );
    Ok(())
}

/// Reports a failed modification: `Infeasible` or still `InProgress`, a Warning, a retry.
async fn failed(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    target: &str,
    error: &ModifyError,
) -> Result<(), Retry> {
    let text = error_chain(error);
    let (status, message) = match error {
        ModifyError::Infeasible(_) => (STATUS_INFEASIBLE, text.clone()),
        ModifyError::Failed(_) => (
            STATUS_IN_PROGRESS,
            format!("{text}. Still modifying to VAC {target}"),
        ),
    };
    tracing::warn!(claim = %claim.name_any(), class = %target, status, error = %text, "modification failed");
    if let Err(write) = mark(shared, claim, target, status, Some(&text)).await {
        tracing::warn!(claim = %claim.name_any(), error = %write, "could not record the failed modification");
    }
    shared.event(claim, EventType::Warning, VOLUME_MODIFY_FAILED, &message);
    Err(Retry)
}

/// Writes `modifyVolumeStatus` = `{target, status}` and, unless `Pending`, the
/// `ModifyingVolume` condition (with `error` for `Infeasible`).
async fn mark(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    target: &str,
    status: &str,
    error: Option<&str>,
) -> Result<PersistentVolumeClaim, kube::Error> {
    write_claim_status(shared, claim, |current| {
        let mut patch = json!({
            "modifyVolumeStatus": {"targetVolumeAttributesClassName": target, "status": status},
        });
        if status != STATUS_PENDING {
            let message = match (status, error) {
                (STATUS_INFEASIBLE, Some(e)) => {
                    format!("ModifyVolume failed with error {e}. Waiting for retry.")
                }
                _ => "ModifyVolume operation in progress.".to_owned(),
            };
            let mut conditions = foreign_conditions(current, &[CONDITION_MODIFYING_VOLUME]);
            conditions.push(json!({
                "type": CONDITION_MODIFYING_VOLUME,
                "status": "True",
                "lastProbeTime": null,
                "lastTransitionTime": Time(Timestamp::now()),
                "message": message,
            }));
            patch["conditions"] = Value::Array(conditions);
        }
        patch
    })
    .await
}

/// The PV names the class, then the claim: current class, no modification status, none of
/// our conditions.
async fn complete(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    target: &str,
) -> Result<(), kube::Error> {
    let volumes: Api<PersistentVolume> = Api::all(shared.client.clone());
    let patch = json!({"spec": {"volumeAttributesClassName": target}});
    volumes
        .patch(
            &volume.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    write_claim_status(shared, claim, |current| {
        json!({
            "currentVolumeAttributesClassName": target,
            "modifyVolumeStatus": null,
            "conditions": foreign_conditions(current, &OUR_CONDITIONS),
        })
    })
    .await
    .map(drop)
}
