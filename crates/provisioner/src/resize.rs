//! "Does this claim need its volume expanded?" (pure).
//!
//! Mirrors the external-resizer: a bound claim of ours whose request is **greater** than its
//! `status.capacity`, in a class with `allowVolumeExpansion: true`, is expanded. A request at or
//! below the capacity needs nothing, whatever units it is written in: a `1G` claim provisioned
//! as `954Mi` (rounded up to whole MiB) has nothing to resize. Quantities are compared exactly
//! (`1G` < `954Mi`), never after a conversion.
//!
//! A shrink is a request lowered below what the volume was already expanded for
//! (`status.allocatedResources`, the request the resizer last acted on) while the volume
//! already has more than the new request: reported, never done. (The API server itself refuses
//! requests below `status.capacity`.)
//!
//! A claim whose [`ANN_STORAGE_RESIZER`] annotation names another resizer is that resizer's to
//! expand ([`ResizeDecision::OtherResizer`]): kube-controller-manager writes the annotation when
//! its in-tree plugin resizes the volume itself (`kubernetes.io/rbd` on clusters that still have
//! it), or names a CSI driver when it hands a migrated volume to that driver's external-resizer.
//! Ours are our provisioner names and the CSI driver of the claim's PV. Without the annotation
//! the claim is ours (kube-controller-manager without a plugin for the volume writes none).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::pv::VolumeFacts;
use crate::quantity::{self, ParsedQuantity};

/// Claim condition saying the filesystem still has to grow on the node.
pub const CONDITION_FS_RESIZE_PENDING: &str = "FileSystemResizePending";
/// Claim condition saying a controller-side resize is in progress.
pub const CONDITION_RESIZING: &str = "Resizing";
/// Claim annotation naming the resizer that owns the claim's expansion (upstream's
/// `VolumeResizerKey`).
pub const ANN_STORAGE_RESIZER: &str = "volume.kubernetes.io/storage-resizer";

/// What to do about a claim's size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResizeDecision {
    /// Nothing to do.
    Nothing,
    /// Grow the volume to `requested` bytes.
    Expand {
        /// The claim's requested size in bytes (rounded up to a whole byte).
        requested: u64,
    },
    /// The claim asks for less than the volume was already expanded for: warn, change nothing.
    Shrink {
        /// The claim's request, as written.
        requested: String,
        /// `status.allocatedResources.storage`, as written.
        allocated: String,
    },
    /// The request does not fit in 64 bits of bytes: no volume can be that large.
    TooLarge {
        /// The claim's request, as written.
        requested: String,
    },
    /// The claim asks for more, but its [`ANN_STORAGE_RESIZER`] annotation names another
    /// resizer: leave it to that one.
    OtherResizer {
        /// The annotation's value.
        resizer: String,
    },
}

/// The resizer the claim's [`ANN_STORAGE_RESIZER`] annotation names, when it is neither one of
/// `our_names` nor the CSI driver of `volume` (the name an external-resizer answers to).
#[must_use]
pub fn other_resizer<'a>(
    claim: &'a PersistentVolumeClaim,
    volume: &(impl VolumeFacts + ?Sized),
    our_names: &[String],
) -> Option<&'a str> {
    let resizer = claim
        .metadata
        .annotations
        .as_ref()?
        .get(ANN_STORAGE_RESIZER)?
        .as_str();
    let driver = volume.csi_driver();
    let ours = our_names.iter().any(|name| name == resizer) || driver == Some(resizer);
    (!resizer.is_empty() && !ours).then_some(resizer)
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

fn parsed(
    q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Option<ParsedQuantity> {
    quantity::parse(&q?.0).ok()
}

/// Decides whether `claim`, bound to `volume` of `class`, needs expansion.
#[must_use]
pub fn decide(
    claim: &PersistentVolumeClaim,
    volume: &(impl VolumeFacts + ?Sized),
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
    if bound_to.is_none() || bound_to != volume.meta().name.as_deref() || phase != Some("Bound") {
        return ResizeDecision::Nothing;
    }
    if !crate::pv::is_ours(volume, our_names) || class.allow_volume_expansion != Some(true) {
        return ResizeDecision::Nothing;
    }
    let (Some(request_text), Some(requested), Some(capacity)) = (
        quantity::claim_request(claim),
        parsed(quantity::claim_request(claim)),
        parsed(quantity::claim_capacity(claim)),
    ) else {
        return ResizeDecision::Nothing;
    };
    if requested <= capacity {
        // Already at least as large as asked (e.g. rounded up at provisioning).
        return ResizeDecision::Nothing;
    }
    if let Some(resizer) = other_resizer(claim, volume, our_names) {
        return ResizeDecision::OtherResizer {
            resizer: resizer.to_owned(),
        };
    }
    let volume_size = parsed(quantity::volume_capacity(volume));
    if let Some(allocated) = quantity::claim_allocated(claim)
        && parsed(Some(allocated)).is_some_and(|a| requested < a)
        && volume_size.as_ref().is_some_and(|v| *v > requested)
    {
        return ResizeDecision::Shrink {
            requested: request_text.0.clone(),
            allocated: allocated.0.clone(),
        };
    }
    let Some(requested_bytes) = requested.to_u64_ceil() else {
        return ResizeDecision::TooLarge {
            requested: request_text.0.clone(),
        };
    };
    if volume_size.is_some_and(|v| v >= requested)
        && has_condition(claim, CONDITION_FS_RESIZE_PENDING)
    {
        // Controller side done; the kubelet finishes the resize on the node.
        return ResizeDecision::Nothing;
    }
    ResizeDecision::Expand {
        requested: requested_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolume, PersistentVolumeClaimCondition, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, PersistentVolumeSpec, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const GI: u64 = 1 << 30;

    fn names() -> Vec<String> {
        vec!["ceph.com/rbd".to_owned()]
    }

    fn storage(q: &str) -> std::collections::BTreeMap<String, Quantity> {
        [("storage".to_owned(), Quantity(q.to_owned()))].into()
    }

    fn with_allocated(mut claim: PersistentVolumeClaim, allocated: &str) -> PersistentVolumeClaim {
        if let Some(status) = claim.status.as_mut() {
            status.allocated_resources = Some(storage(allocated));
        }
        claim
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
    fn request_at_or_below_capacity_needs_nothing_in_any_units() {
        // Provisioned in whole MiB: the capacity is above a decimal request.
        for (request, capacity) in [
            ("1G", "954Mi"),
            ("10G", "9537Mi"),
            ("500M", "477Mi"),
            ("100m", "1Mi"),
            ("0.5", "1Mi"),
            ("1e3", "1Mi"),
            ("1", "1Mi"),
            ("1.5Gi", "1536Mi"),
            ("1Gi", "2Gi"),
        ] {
            for allocated in [None, Some(request)] {
                let mut c = claim(request, capacity);
                if let Some(a) = allocated {
                    c = with_allocated(c, a);
                }
                assert_eq!(
                    decide(&c, &volume(capacity), &class(Some(true)), &names()),
                    ResizeDecision::Nothing,
                    "{request} with capacity {capacity}"
                );
            }
        }
    }

    #[test]
    fn shrink_below_what_the_volume_grew_for_is_reported_not_done() {
        // Grown for 2Gi (node step pending), then lowered to 1536Mi.
        assert_eq!(
            decide(
                &with_allocated(claim("1536Mi", "1Gi"), "2Gi"),
                &volume("2Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Shrink {
                requested: "1536Mi".to_owned(),
                allocated: "2Gi".to_owned(),
            }
        );
        // Lowered after a failed expansion (the volume never grew): expand to the new request,
        // as the external-resizer's recovery from expansion failures does.
        assert_eq!(
            decide(
                &with_allocated(claim("1536Mi", "1Gi"), "100Gi"),
                &volume("1Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Expand {
                requested: 1536 << 20
            }
        );
    }

    #[test]
    fn decimal_growth_waits_for_the_node_without_a_shrink() {
        // 10G grown to 20G: the image is 19074Mi, a little more than 20G.
        let mut pending = with_allocated(claim("20G", "9537Mi"), "20G");
        if let Some(status) = pending.status.as_mut() {
            status.conditions = Some(vec![PersistentVolumeClaimCondition {
                type_: CONDITION_FS_RESIZE_PENDING.to_owned(),
                status: "True".to_owned(),
                ..Default::default()
            }]);
        }
        assert_eq!(
            decide(&pending, &volume("19074Mi"), &class(Some(true)), &names()),
            ResizeDecision::Nothing
        );
        assert_eq!(
            decide(
                &with_allocated(claim("20G", "9537Mi"), "20G"),
                &volume("9537Mi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Expand {
                requested: 20_000_000_000
            }
        );
    }

    #[test]
    fn request_beyond_64_bits_is_too_large() {
        assert_eq!(
            decide(
                &claim("20E", "1Gi"),
                &volume("1Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::TooLarge {
                requested: "20E".to_owned()
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
    fn request_below_grown_volume_without_allocated_resources_completes_the_resize() {
        // No record of what the volume grew for: not a shrink; the (idempotent) expand finishes
        // the status updates.
        assert_eq!(
            decide(
                &claim("1536Mi", "1Gi"),
                &volume("2Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Expand {
                requested: 1536 << 20
            }
        );
    }

    fn annotated(mut claim: PersistentVolumeClaim, resizer: &str) -> PersistentVolumeClaim {
        claim.metadata.annotations =
            Some([(ANN_STORAGE_RESIZER.to_owned(), resizer.to_owned())].into());
        claim
    }

    #[test]
    fn a_claim_another_resizer_owns_is_left_to_it() {
        let decide_for = |resizer: &str, volume: &PersistentVolume| {
            decide(
                &annotated(claim("2Gi", "1Gi"), resizer),
                volume,
                &class(Some(true)),
                &names(),
            )
        };
        assert_eq!(
            decide_for("kubernetes.io/rbd", &volume("1Gi")),
            ResizeDecision::OtherResizer {
                resizer: "kubernetes.io/rbd".to_owned()
            }
        );
        // Our own name, or an empty value: ours.
        for resizer in ["ceph.com/rbd", ""] {
            assert_eq!(
                decide_for(resizer, &volume("1Gi")),
                ResizeDecision::Expand { requested: 2 * GI },
                "{resizer:?}"
            );
        }
        // The CSI driver of the PV is the name an external-resizer answers to: ours too.
        let mut csi = volume("1Gi");
        if let Some(spec) = csi.spec.as_mut() {
            spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: "rbd.provisioner.ceph.io".to_owned(),
                ..Default::default()
            });
        }
        assert_eq!(
            decide_for("rbd.provisioner.ceph.io", &csi),
            ResizeDecision::Expand { requested: 2 * GI }
        );
        assert_eq!(
            decide_for("rbd.csi.ceph.com", &csi),
            ResizeDecision::OtherResizer {
                resizer: "rbd.csi.ceph.com".to_owned()
            }
        );
        // Nothing requested: nothing to say, whoever owns it.
        assert_eq!(
            decide(
                &annotated(claim("1Gi", "1Gi"), "kubernetes.io/rbd"),
                &volume("1Gi"),
                &class(Some(true)),
                &names()
            ),
            ResizeDecision::Nothing
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
