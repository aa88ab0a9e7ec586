//! Volume modification by VolumeAttributesClass (`storage.k8s.io/v1`, GA in Kubernetes 1.34):
//! the contract a backend implements ([`Modifier`]) and "does this claim need its volume
//! modified?" ([`decide`], pure), as external-resizer's modify controller
//! (`pkg/modifycontroller`) has it.
//!
//! A bound claim of ours whose `spec.volumeAttributesClassName` differs from its
//! `status.currentVolumeAttributesClassName` (or that has a `status.modifyVolumeStatus` left)
//! is modified to that class: the backend gets the class (its `parameters`), and on success the
//! PV's `spec.volumeAttributesClassName` and then the claim's `currentVolumeAttributesClassName`
//! name it and `modifyVolumeStatus` is cleared. The flow and its events are in the controller.
//!
//! Not modelled: a claim whose `spec.volumeAttributesClassName` is cleared while a modification
//! is in progress is left as it is (external-resizer then finishes the modification it was
//! uncertain about); nothing is "cancelled".

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;

use crate::volume::BoxError;

/// Claim condition while a modification is in progress or was found infeasible.
pub const CONDITION_MODIFYING_VOLUME: &str = "ModifyingVolume";
/// Claim condition after a modification failed (upstream's; cleared with ours on success).
pub const CONDITION_MODIFY_VOLUME_ERROR: &str = "ModifyVolumeError";
/// `status.modifyVolumeStatus.status`: the class does not exist (yet).
pub const STATUS_PENDING: &str = "Pending";
/// `status.modifyVolumeStatus.status`: the volume is being modified (also after a failure
/// that may pass).
pub const STATUS_IN_PROGRESS: &str = "InProgress";
/// `status.modifyVolumeStatus.status`: the backend refused the class's parameters; a valid
/// class must be named.
pub const STATUS_INFEASIBLE: &str = "Infeasible";

/// Why modifying a volume failed.
#[derive(Debug, thiserror::Error)]
pub enum ModifyError {
    /// The class can never be applied to this volume (bad or unknown parameters, a volume that
    /// cannot carry them; CSI `INVALID_ARGUMENT`): the claim's modification becomes
    /// `Infeasible` until another class is named; it is retried with backoff meanwhile.
    #[error(transparent)]
    Infeasible(BoxError),
    /// It did not work this time (e.g. the storage did not answer): the modification stays
    /// `InProgress` and is retried with backoff.
    #[error(transparent)]
    Failed(BoxError),
}

impl ModifyError {
    /// A [`ModifyError::Infeasible`] from any error or message.
    pub fn infeasible(error: impl Into<BoxError>) -> Self {
        Self::Infeasible(error.into())
    }

    /// A [`ModifyError::Failed`] from any error or message.
    pub fn failed(error: impl Into<BoxError>) -> Self {
        Self::Failed(error.into())
    }
}

/// A storage backend that modifies volumes by VolumeAttributesClass. Optional: a controller
/// without one ([`crate::Controller::with_modifier`]) leaves `volumeAttributesClassName` alone,
/// as external-resizer does for a driver without the `MODIFY_VOLUME` capability.
#[async_trait]
pub trait Modifier: Send + Sync {
    /// Applies `class` (its `driverName` and `parameters` are the backend's to check) to the
    /// volume behind `volume`. Must be idempotent. Only the parameters the class names change
    /// (the CSI rule for `ControllerModifyVolume`).
    async fn modify(
        &self,
        volume: &PersistentVolume,
        class: &VolumeAttributesClass,
    ) -> Result<(), ModifyError>;
}

/// What to do about a claim's VolumeAttributesClass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModifyDecision {
    /// Nothing to do.
    Nothing,
    /// Modify the volume to the class `target`.
    Modify {
        /// The class name (`spec.volumeAttributesClassName`).
        target: String,
    },
}

pub(crate) fn spec_class(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_attributes_class_name.as_deref())
        .unwrap_or_default()
}

/// Whether the claim names a class or carries a modification status: the claims worth a
/// closer look ([`decide`]).
#[must_use]
pub fn names_a_class(claim: &PersistentVolumeClaim) -> bool {
    !spec_class(claim).is_empty()
        || claim
            .status
            .as_ref()
            .is_some_and(|s| s.modify_volume_status.is_some())
}

/// Whether `claim` (bound to `volume`, a PV of ours: the caller checks) needs its volume
/// modified: it names a class and either that class is not its current one or a modification
/// status is left.
#[must_use]
pub fn decide(
    claim: &PersistentVolumeClaim,
    volume: &(impl crate::pv::VolumeFacts + ?Sized),
) -> ModifyDecision {
    let status = claim.status.as_ref();
    let bound = status.and_then(|s| s.phase.as_deref()) == Some("Bound")
        && claim.spec.as_ref().and_then(|s| s.volume_name.as_deref())
            == volume.meta().name.as_deref();
    let target = spec_class(claim);
    if !bound || target.is_empty() {
        return ModifyDecision::Nothing;
    }
    let current = status
        .and_then(|s| s.current_volume_attributes_class_name.as_deref())
        .unwrap_or_default();
    let pending = status.is_some_and(|s| s.modify_volume_status.is_some());
    if target == current && !pending {
        return ModifyDecision::Nothing;
    }
    ModifyDecision::Modify {
        target: target.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn claim(spec: Value, status: Value) -> PersistentVolumeClaim {
        let mut c = json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {"volumeName": "pvc-u", "accessModes": ["ReadWriteOnce"]},
            "status": {"phase": "Bound"},
        });
        let (Value::Object(spec), Value::Object(status)) = (spec, status) else {
            panic!("objects expected");
        };
        c["spec"].as_object_mut().unwrap().extend(spec);
        c["status"].as_object_mut().unwrap().extend(status);
        serde_json::from_value(c).unwrap()
    }

    fn volume() -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pvc-u"}})).unwrap()
    }

    fn modify(target: &str) -> ModifyDecision {
        ModifyDecision::Modify {
            target: target.to_owned(),
        }
    }

    #[test]
    fn a_new_or_changed_class_is_applied_and_a_reached_one_is_not() {
        let v = volume();
        assert_eq!(
            decide(&claim(json!({}), json!({})), &v),
            ModifyDecision::Nothing
        );
        let first = claim(json!({"volumeAttributesClassName": "gold"}), json!({}));
        assert_eq!(decide(&first, &v), modify("gold"));
        assert!(names_a_class(&first));
        let changed = claim(
            json!({"volumeAttributesClassName": "silver"}),
            json!({"currentVolumeAttributesClassName": "gold"}),
        );
        assert_eq!(decide(&changed, &v), modify("silver"));
        let reached = claim(
            json!({"volumeAttributesClassName": "gold"}),
            json!({"currentVolumeAttributesClassName": "gold"}),
        );
        assert_eq!(decide(&reached, &v), ModifyDecision::Nothing);
    }

    #[test]
    fn a_left_status_is_finished_even_when_the_class_is_current() {
        // e.g. switched to silver (InProgress), then back to gold before it finished
        let back = claim(
            json!({"volumeAttributesClassName": "gold"}),
            json!({"currentVolumeAttributesClassName": "gold",
                   "modifyVolumeStatus": {"targetVolumeAttributesClassName": "silver", "status": "InProgress"}}),
        );
        assert_eq!(decide(&back, &volume()), modify("gold"));
    }

    #[test]
    fn unbound_claims_and_cleared_classes_are_left_alone() {
        let mut unbound = claim(json!({"volumeAttributesClassName": "gold"}), json!({}));
        unbound.status.as_mut().unwrap().phase = Some("Pending".into());
        assert_eq!(decide(&unbound, &volume()), ModifyDecision::Nothing);
        let other_volume = claim(
            json!({"volumeAttributesClassName": "gold", "volumeName": "pvc-other"}),
            json!({}),
        );
        assert_eq!(decide(&other_volume, &volume()), ModifyDecision::Nothing);
        let cleared = claim(
            json!({}),
            json!({"modifyVolumeStatus": {"targetVolumeAttributesClassName": "gold", "status": "Infeasible"}}),
        );
        assert_eq!(decide(&cleared, &volume()), ModifyDecision::Nothing);
        assert!(names_a_class(&cleared));
    }
}
