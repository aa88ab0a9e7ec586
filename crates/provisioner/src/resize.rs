//! "Does this claim need its volume expanded?" (pure).
//!
//! Mirrors the external-resizer: a bound claim of ours whose requested size exceeds its
//! reported capacity, in a class with `allowVolumeExpansion: true`, is expanded. A request
//! below the capacity (shrink) is reported and otherwise ignored: volumes never shrink.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::quantity::{claim_capacity_bytes, claim_request_bytes, volume_capacity_bytes};

/// Claim condition saying the filesystem still has to grow on the node.
pub const CONDITION_FS_RESIZE_PENDING: &str = "FileSystemResizePending";
/// Claim condition saying a controller-side resize is in progress.
pub const CONDITION_RESIZING: &str = "Resizing";

/// What to do about a claim's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeDecision {
    /// Nothing to do.
    Nothing,
    /// Grow the volume to `requested` bytes.
    Expand {
        /// The claim's requested size in bytes.
        requested: u64,
    },
    /// The claim asks for less than it has: warn, change nothing.
    Shrink {
        /// The claim's requested size in bytes.
        requested: u64,
        /// The claim's current capacity in bytes.
        capacity: u64,
    },
}

/// Whether the claim carries the condition `kind` with status True.
#[must_use]
pub fn has_condition(claim: &PersistentVolumeClaim, kind: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == kind && c.status == "True")
        })
}

/// Decides whether `claim`, bound to `volume` of `class`, needs expansion.
#[must_use]
pub fn decide(
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    class: &StorageClass,
    our_names: &[String],
) -> ResizeDecision {
    let bound_to = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref());
    let phase = claim
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    if bound_to.is_none() || bound_to != volume.metadata.name.as_deref() || phase != Some("Bound") {
        return ResizeDecision::Nothing;
    }
    if !crate::pv::is_ours(volume, our_names) || class.allow_volume_expansion != Some(true) {
        return ResizeDecision::Nothing;
    }
    let (Some(requested), Some(capacity)) =
        (claim_request_bytes(claim), claim_capacity_bytes(claim))
    else {
        return ResizeDecision::Nothing;
    };
    // The API server refuses requests below status.capacity, but a claim whose volume already
    // grew (status not yet updated) may be lowered below the volume's size: also a shrink.
    let volume_size = volume_capacity_bytes(volume).unwrap_or(0);
    let current = capacity.max(volume_size);
    if requested < current {
        return ResizeDecision::Shrink {
            requested,
            capacity: current,
        };
    }
    if requested == capacity {
        return ResizeDecision::Nothing;
    }
    if volume_size >= requested && has_condition(claim, CONDITION_FS_RESIZE_PENDING) {
        // Controller side done; the kubelet finishes the resize on the node.
        return ResizeDecision::Nothing;
    }
    ResizeDecision::Expand { requested }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimCondition, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const GI: u64 = 1 << 30;

    fn names() -> Vec<String> {
        vec!["ceph.com/rbd".to_owned()]
    }

    fn storage(q: &str) -> std::collections::BTreeMap<String, Quantity> {
        [("storage".to_owned(), Quantity(q.to_owned()))].into()
    }

    fn claim(requested: &str, capacity: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: Some("pvc-1".to_owned()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(storage(requested)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Bound".to_owned()),
                capacity: Some(storage(capacity)),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn volume(capacity: &str) -> PersistentVolume {
        let mut pv = PersistentVolume::default();
        pv.metadata.name = Some("pvc-1".to_owned());
        pv.metadata.annotations = Some(
            [(
                crate::pv::ANN_PROVISIONED_BY.to_owned(),
                "ceph.com/rbd".to_owned(),
            )]
            .into(),
        );
        pv.spec = Some(PersistentVolumeSpec {
            capacity: Some(storage(capacity)),
            ..Default::default()
        });
        pv
    }

    fn class(allow: Option<bool>) -> StorageClass {
        StorageClass {
            allow_volume_expansion: allow,
            ..Default::default()
        }
    }

    #[test]
    fn expands_when_request_exceeds_capacity_and_class_allows() {
        assert_eq!(
            decide(
                &claim("2Gi", "1Gi"),
                &volume("1Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Expand { requested: 2 * GI }
        );
    }

    #[test]
    fn nothing_when_class_forbids_or_volume_not_ours_or_sizes_equal() {
        assert_eq!(
            decide(&claim("2Gi", "1Gi"), &volume("1Gi"), &class(None), &names()),
            ResizeDecision::Nothing
        );
        assert_eq!(
            decide(
                &claim("2Gi", "1Gi"),
                &volume("1Gi"),
                &class(Some(true)),
                &["x/y".to_owned()]
            ),
            ResizeDecision::Nothing
        );
        assert_eq!(
            decide(
                &claim("1Gi", "1Gi"),
                &volume("1Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Nothing
        );
    }

    #[test]
    fn shrink_is_reported_not_done() {
        assert_eq!(
            decide(
                &claim("1Gi", "2Gi"),
                &volume("2Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Shrink {
                requested: GI,
                capacity: 2 * GI
            }
        );
    }

    #[test]
    fn waits_for_node_once_volume_grew_and_condition_is_set() {
        let mut pending = claim("2Gi", "1Gi");
        if let Some(status) = pending.status.as_mut() {
            status.conditions = Some(vec![PersistentVolumeClaimCondition {
                type_: CONDITION_FS_RESIZE_PENDING.to_owned(),
                status: "True".to_owned(),
                ..Default::default()
            }]);
        }
        assert_eq!(
            decide(&pending, &volume("2Gi"), &class(Some(true)), &names()),
            ResizeDecision::Nothing
        );
        // Volume grown but claim not yet told (restart mid-step): expand again (idempotent).
        assert_eq!(
            decide(
                &claim("2Gi", "1Gi"),
                &volume("2Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Expand { requested: 2 * GI }
        );
    }

    #[test]
    fn request_below_grown_volume_is_a_shrink() {
        assert_eq!(
            decide(
                &claim("1536Mi", "1Gi"),
                &volume("2Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Shrink {
                requested: 1536 << 20,
                capacity: 2 * GI
            }
        );
    }

    #[test]
    fn unbound_claim_is_not_expanded() {
        let mut unbound = claim("2Gi", "1Gi");
        if let Some(status) = unbound.status.as_mut() {
            status.phase = Some("Pending".to_owned());
        }
        assert_eq!(
            decide(&unbound, &volume("1Gi"), &class(Some(true)), &names()),
            ResizeDecision::Nothing
        );
    }
}
