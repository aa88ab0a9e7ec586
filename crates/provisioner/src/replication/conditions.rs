//! The conditions of a VolumeReplication, with csi-addons' types, reasons and transitions: a
//! condition's `lastTransitionTime` changes only when its status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// A `metav1.Condition`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Completed`, `Degraded`, `Resyncing` or `Validated`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason (`Promoted`, `FailedToPromote`, ...).
    pub reason: String,
    /// What it means here.
    pub message: String,
    /// The generation it was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When its status last changed.
    pub last_transition_time: Time,
}

/// The conditions of one object.
pub type Conditions = Vec<Condition>;

fn set(
    conditions: &mut Conditions,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.status = status.into();
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::now());
        }
        c.reason = reason.into();
        c.message = message.into();
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        });
    }
}

fn validated(conditions: &mut Conditions, generation: Option<i64>) {
    set(
        conditions,
        "Validated",
        true,
        "PrerequisiteMet",
        "Volume is validated",
        generation,
    );
}

/// Promoted; degraded while the peer does not replay the volume.
pub(super) fn promoted(
    conditions: &mut Conditions,
    replaying: bool,
    description: &str,
    generation: Option<i64>,
) {
    set(
        conditions,
        "Completed",
        true,
        "Promoted",
        "Volume is promoted",
        generation,
    );
    if replaying {
        set(
            conditions,
            "Degraded",
            false,
            "Healthy",
            "Volume is healthy",
            generation,
        );
    } else {
        set(
            conditions,
            "Degraded",
            true,
            "VolumeDegraded",
            &format!("the peer does not replay the volume: {description}"),
            generation,
        );
    }
    set(
        conditions,
        "Resyncing",
        false,
        "NotResyncing",
        "Volume is not resyncing",
        generation,
    );
    validated(conditions, generation);
}

/// Demoted; degraded until the copy replays the peer's primary.
pub(super) fn demoted(
    conditions: &mut Conditions,
    replaying: bool,
    description: &str,
    generation: Option<i64>,
) {
    set(
        conditions,
        "Completed",
        true,
        "Demoted",
        "Volume is demoted",
        generation,
    );
    if replaying {
        set(
            conditions,
            "Degraded",
            false,
            "Healthy",
            "Volume is demoted",
            generation,
        );
    } else {
        set(
            conditions,
            "Degraded",
            true,
            "VolumeDegraded",
            &format!("Volume is degraded: {description}"),
            generation,
        );
    }
    set(
        conditions,
        "Resyncing",
        false,
        "NotResyncing",
        "Volume is not resyncing",
        generation,
    );
    validated(conditions, generation);
}

/// A resync triggered (`active`: not replaying yet) or done.
pub(super) fn resyncing(conditions: &mut Conditions, active: bool, generation: Option<i64>) {
    set(
        conditions,
        "Completed",
        true,
        "Demoted",
        "Volume is demoted",
        generation,
    );
    if active {
        set(
            conditions,
            "Degraded",
            true,
            "VolumeDegraded",
            "Volume is degraded",
            generation,
        );
        set(
            conditions,
            "Resyncing",
            true,
            "ResyncTriggered",
            "resync is triggered",
            generation,
        );
    } else {
        set(
            conditions,
            "Degraded",
            false,
            "Healthy",
            "Volume is demoted",
            generation,
        );
        set(
            conditions,
            "Resyncing",
            false,
            "NotResyncing",
            "Volume is not resyncing",
            generation,
        );
    }
    validated(conditions, generation);
}

/// The operation for `state` failed with `message`; the reason (`FailedToPromote`,
/// `FailedToDemote`, `FailedToResync`, `Error`).
pub(super) fn failed(
    conditions: &mut Conditions,
    state: &str,
    message: &str,
    generation: Option<i64>,
) -> &'static str {
    let reason = match state {
        "primary" => "FailedToPromote",
        "secondary" => "FailedToDemote",
        "resync" => "FailedToResync",
        _ => "Error",
    };
    set(conditions, "Completed", false, reason, message, generation);
    set(conditions, "Degraded", true, "Error", message, generation);
    if state == "resync" {
        set(
            conditions,
            "Resyncing",
            false,
            "FailedToResync",
            message,
            generation,
        );
    } else {
        set(
            conditions,
            "Resyncing",
            false,
            "NotResyncing",
            "Volume is not resyncing",
            generation,
        );
    }
    reason
}

/// The prerequisites are not met (`message` says which): nothing was done.
pub(super) fn failed_validation(
    conditions: &mut Conditions,
    message: &str,
    generation: Option<i64>,
) {
    set(
        conditions,
        "Completed",
        false,
        "FailedToPromote",
        "failed to meet prerequisite",
        generation,
    );
    set(conditions, "Degraded", true, "Error", message, generation);
    set(
        conditions,
        "Resyncing",
        false,
        "NotResyncing",
        "Volume is not resyncing",
        generation,
    );
    set(
        conditions,
        "Validated",
        false,
        "PrerequisiteNotMet",
        message,
        generation,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transition_time_moves_only_with_the_status() {
        let mut c = Conditions::new();
        promoted(&mut c, false, "peer down", Some(1));
        let degraded = c.iter().find(|c| c.type_ == "Degraded").unwrap().clone();
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "VolumeDegraded")
        );
        promoted(&mut c, false, "peer still down", Some(1));
        let again = c.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert_eq!(again.last_transition_time, degraded.last_transition_time);
        assert!(again.message.contains("still down"));
        assert_eq!(c.len(), 4);
        failed(&mut c, "primary", "pool rbd is not mirrored", Some(2));
        let completed = c.iter().find(|c| c.type_ == "Completed").unwrap();
        assert_eq!(
            (completed.status.as_str(), completed.reason.as_str()),
            ("False", "FailedToPromote")
        );
        assert_eq!(completed.observed_generation, Some(2));
    }

    #[test]
    fn an_unmet_prerequisite_says_why_under_validated() {
        let mut c = Conditions::new();
        failed_validation(&mut c, "spec.dataSource: no such claim", None);
        let v = c.iter().find(|c| c.type_ == "Validated").unwrap();
        assert_eq!(
            (v.status.as_str(), v.reason.as_str()),
            ("False", "PrerequisiteNotMet")
        );
        assert_eq!(v.message, "spec.dataSource: no such claim");
    }
}
