//! "Is this claim ours, and can we provision it?" (pure).
//!
//! The rules are upstream's (sig-storage-lib-external-provisioner): a claim is ours when
//!
//! 1. `spec.volumeName` is empty (nobody bound it yet) and it is not being deleted,
//! 2. `volume.kubernetes.io/storage-provisioner` (fallback: the beta annotation) names us or
//!    one of our additional names (the PV controller sets it from the class),
//! 3. for `WaitForFirstConsumer` classes, `volume.kubernetes.io/selected-node` is set.
//!
//! A claim that is ours but asks for something we cannot do (a `selector`, an unknown access
//! mode or volume mode, a block volume from a backend without block support) is *refused*: the
//! controller emits a Warning that says what to fix and does not retry until the claim changes.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

/// Annotation the PV controller sets to the provisioner that should provision a claim.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Deprecated form of [`ANN_STORAGE_PROVISIONER`], still set by the PV controller.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Annotation the scheduler sets to the node chosen for a `WaitForFirstConsumer` claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Deprecated annotation naming a claim's StorageClass.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// Access modes Kubernetes knows.
pub const KNOWN_ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// What to do with a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Provision a volume for it.
    Provision,
    /// Nothing to do (not ours, or not yet); no event.
    Skip(SkipReason),
    /// Ours, but not provisionable as asked: a Warning with this message, no retry.
    Refuse(String),
}

/// Why a claim is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `spec.volumeName` is set.
    AlreadyBound,
    /// The claim is being deleted.
    Deleting,
    /// The storage-provisioner annotation is missing or names someone else.
    NotOurs,
    /// `WaitForFirstConsumer` class and no node selected yet.
    WaitingForSelectedNode,
}

/// The claim's StorageClass name (`spec.storageClassName`, else the beta annotation).
#[must_use]
pub fn storage_class_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.as_deref())
        .or_else(|| annotation(claim, ANN_BETA_STORAGE_CLASS))
        .filter(|name| !name.is_empty())
}

/// The provisioner the claim asks for (GA annotation, else beta).
#[must_use]
pub fn requested_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(claim, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(claim, ANN_BETA_STORAGE_PROVISIONER))
}

/// The node selected by the scheduler, if any.
#[must_use]
pub fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(claim, ANN_SELECTED_NODE).filter(|node| !node.is_empty())
}

/// Whether the claim's storage-provisioner annotation names one of `our_names`, the cheap
/// check done before looking up the class.
#[must_use]
pub fn claims_our_provisioner(claim: &PersistentVolumeClaim, our_names: &[String]) -> bool {
    requested_provisioner(claim).is_some_and(|name| our_names.iter().any(|ours| ours == name))
}

/// Whether `class` binds volumes only once a pod is scheduled.
#[must_use]
pub fn is_wait_for_first_consumer(class: &StorageClass) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}

/// Decides what to do with `claim` whose StorageClass is `class`.
#[must_use]
pub fn decide(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    our_names: &[String],
    supports_block: bool,
) -> ClaimDecision {
    let spec = claim.spec.clone().unwrap_or_default();
    if spec
        .volume_name
        .as_deref()
        .is_some_and(|name| !name.is_empty())
    {
        return ClaimDecision::Skip(SkipReason::AlreadyBound);
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return ClaimDecision::Skip(SkipReason::Deleting);
    }
    if !claims_our_provisioner(claim, our_names) {
        return ClaimDecision::Skip(SkipReason::NotOurs);
    }
    if is_wait_for_first_consumer(class) && selected_node(claim).is_none() {
        return ClaimDecision::Skip(SkipReason::WaitingForSelectedNode);
    }
    if spec.selector.is_some() {
        return ClaimDecision::Refuse(
            "claim Selector is not supported: remove spec.selector to get a dynamically provisioned volume"
                .to_owned(),
        );
    }
    let modes = spec.access_modes.unwrap_or_default();
    if let Some(unknown) = modes
        .iter()
        .find(|mode| !KNOWN_ACCESS_MODES.contains(&mode.as_str()))
    {
        return ClaimDecision::Refuse(format!(
            "unknown access mode {unknown:?}: use one of {}",
            KNOWN_ACCESS_MODES.join(", ")
        ));
    }
    match spec.volume_mode.as_deref() {
        None | Some("Filesystem") => ClaimDecision::Provision,
        Some("Block") if supports_block => ClaimDecision::Provision,
        Some("Block") => ClaimDecision::Refuse(
            "volumeMode Block is not supported by this provisioner: use volumeMode Filesystem"
                .to_owned(),
        ),
        Some(other) => ClaimDecision::Refuse(format!(
            "unknown volumeMode {other:?}: use Filesystem or Block"
        )),
    }
}

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};

    fn names() -> Vec<String> {
        vec!["ceph.com/rbd".to_owned(), "legacy/rbd".to_owned()]
    }

    fn claim(annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.name = Some("data".to_owned());
        claim.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        claim.spec = Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some("fast".to_owned()),
            ..Default::default()
        });
        claim
    }

    fn ours() -> PersistentVolumeClaim {
        claim(&[(ANN_STORAGE_PROVISIONER, "ceph.com/rbd")])
    }

    fn class(mode: Option<&str>) -> StorageClass {
        StorageClass {
            provisioner: "ceph.com/rbd".to_owned(),
            volume_binding_mode: mode.map(str::to_owned),
            ..Default::default()
        }
    }

    fn spec(claim: &mut PersistentVolumeClaim) -> &mut PersistentVolumeClaimSpec {
        claim.spec.get_or_insert_with(Default::default)
    }

    #[test]
    fn provisions_unbound_claim_annotated_with_our_name() {
        assert_eq!(
            decide(&ours(), &class(None), &names(), false),
            ClaimDecision::Provision
        );
    }

    #[test]
    fn accepts_beta_annotation_and_additional_names() {
        let beta = claim(&[(ANN_BETA_STORAGE_PROVISIONER, "ceph.com/rbd")]);
        assert_eq!(
            decide(&beta, &class(None), &names(), false),
            ClaimDecision::Provision
        );
        let additional = claim(&[(ANN_STORAGE_PROVISIONER, "legacy/rbd")]);
        assert_eq!(
            decide(&additional, &class(None), &names(), false),
            ClaimDecision::Provision
        );
    }

    #[test]
    fn ga_annotation_wins_over_beta() {
        let claim = claim(&[
            (ANN_STORAGE_PROVISIONER, "other.io/x"),
            (ANN_BETA_STORAGE_PROVISIONER, "ceph.com/rbd"),
        ]);
        assert_eq!(
            decide(&claim, &class(None), &names(), false),
            ClaimDecision::Skip(SkipReason::NotOurs)
        );
    }

    #[test]
    fn skips_claims_of_other_provisioners_or_unannotated() {
        let other = claim(&[(ANN_STORAGE_PROVISIONER, "other.io/x")]);
        assert_eq!(
            decide(&other, &class(None), &names(), false),
            ClaimDecision::Skip(SkipReason::NotOurs)
        );
        assert_eq!(
            decide(&claim(&[]), &class(None), &names(), false),
            ClaimDecision::Skip(SkipReason::NotOurs)
        );
    }

    #[test]
    fn skips_bound_and_deleting_claims() {
        let mut bound = ours();
        spec(&mut bound).volume_name = Some("pv-1".to_owned());
        assert_eq!(
            decide(&bound, &class(None), &names(), false),
            ClaimDecision::Skip(SkipReason::AlreadyBound)
        );
        let mut deleting = ours();
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            decide(&deleting, &class(None), &names(), false),
            ClaimDecision::Skip(SkipReason::Deleting)
        );
    }

    #[test]
    fn wait_for_first_consumer_needs_selected_node() {
        let wffc = class(Some("WaitForFirstConsumer"));
        assert_eq!(
            decide(&ours(), &wffc, &names(), false),
            ClaimDecision::Skip(SkipReason::WaitingForSelectedNode)
        );
        let selected = claim(&[
            (ANN_STORAGE_PROVISIONER, "ceph.com/rbd"),
            (ANN_SELECTED_NODE, "node-1"),
        ]);
        assert_eq!(
            decide(&selected, &wffc, &names(), false),
            ClaimDecision::Provision
        );
        assert_eq!(selected_node(&selected), Some("node-1"));
    }

    #[test]
    fn refuses_selector_with_a_message_saying_what_to_fix() {
        let mut claim = ours();
        spec(&mut claim).selector = Some(LabelSelector::default());
        match decide(&claim, &class(None), &names(), false) {
            ClaimDecision::Refuse(message) => {
                assert!(message.contains("remove spec.selector"), "{message}");
            }
            other => panic!("expected refusal, got {other:?}"),
        }
    }

    #[test]
    fn refuses_unknown_access_and_volume_modes() {
        let mut claim = ours();
        spec(&mut claim).access_modes = Some(vec!["ReadWriteSometimes".to_owned()]);
        assert!(matches!(
            decide(&claim, &class(None), &names(), false),
            ClaimDecision::Refuse(m) if m.contains("ReadWriteSometimes")
        ));
        let mut claim = ours();
        spec(&mut claim).volume_mode = Some("Tape".to_owned());
        assert!(matches!(
            decide(&claim, &class(None), &names(), true),
            ClaimDecision::Refuse(m) if m.contains("Tape")
        ));
    }

    #[test]
    fn block_mode_depends_on_backend_support() {
        let mut claim = ours();
        spec(&mut claim).volume_mode = Some("Block".to_owned());
        assert_eq!(
            decide(&claim, &class(None), &names(), true),
            ClaimDecision::Provision
        );
        assert!(matches!(
            decide(&claim, &class(None), &names(), false),
            ClaimDecision::Refuse(_)
        ));
    }

    #[test]
    fn storage_class_name_falls_back_to_beta_annotation() {
        let mut claim = claim(&[(ANN_BETA_STORAGE_CLASS, "slow")]);
        assert_eq!(storage_class_name(&claim), Some("fast"));
        spec(&mut claim).storage_class_name = None;
        assert_eq!(storage_class_name(&claim), Some("slow"));
        spec(&mut claim).storage_class_name = Some(String::new());
        assert_eq!(storage_class_name(&claim), None);
    }
}
