//! Finishing a backend's PersistentVolume, and deciding what to do with a PV (pure).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::volume::{
    ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ProvisionOptions, Provisioned,
};

/// Annotation naming the provisioner that created a PV.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Finalizer that keeps a PV until its backend volume is deleted (optional, see `Config`).
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The PV name for a claim: `pvc-<claim uid>`.
#[must_use]
pub fn volume_name_for(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// A reference to `claim` built from kind, namespace, name, uid and resourceVersion (the API
/// server stopped setting `selfLink` in 1.24; never rely on it).
#[must_use]
pub fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("PersistentVolumeClaim".to_owned()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// Turns the backend's [`Provisioned`] into the PV to save (see [`crate::volume`] for the split).
#[must_use]
pub fn finish_volume(
    provisioned: Provisioned,
    options: &ProvisionOptions,
    provisioner_name: &str,
    add_finalizer: bool,
) -> PersistentVolume {
    let Provisioned {
        mut volume,
        deletion_secret,
    } = provisioned;
    let class = &options.storage_class;
    let claim_spec = options.claim.spec.clone().unwrap_or_default();

    volume.metadata.name = Some(options.pv_name.clone());
    volume.metadata.namespace = None;
    volume.metadata.resource_version = None;
    volume.metadata.uid = None;
    let annotations = volume
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    annotations.insert(ANN_PROVISIONED_BY.to_owned(), provisioner_name.to_owned());
    if let Some(secret) = deletion_secret {
        annotations.insert(ANN_DELETION_SECRET_NAME.to_owned(), secret.name);
        annotations.insert(ANN_DELETION_SECRET_NAMESPACE.to_owned(), secret.namespace);
    }
    if add_finalizer {
        let finalizers = volume.metadata.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|f| f == FINALIZER) {
            finalizers.push(FINALIZER.to_owned());
        }
    }

    let spec = volume.spec.get_or_insert_with(Default::default);
    spec.claim_ref = Some(claim_ref(&options.claim));
    spec.storage_class_name.clone_from(&class.metadata.name);
    spec.persistent_volume_reclaim_policy = Some(
        class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".to_owned()),
    );
    spec.mount_options = class
        .mount_options
        .clone()
        .filter(|options| !options.is_empty());
    if spec.access_modes.as_ref().is_none_or(Vec::is_empty) {
        spec.access_modes = claim_spec.access_modes;
    }
    if spec.volume_mode.is_none() {
        spec.volume_mode = claim_spec.volume_mode;
    }
    volume.status = None;
    volume
}

/// What to do with a PV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Ours, Released, reclaim policy Delete: delete the backend volume, then the PV, then our
    /// finalizer.
    Delete,
    /// Being deleted, our finalizer on it, and nothing for the backend to do (e.g. Retain):
    /// only remove our finalizer.
    RemoveFinalizer,
    /// Leave it alone.
    Keep,
}

/// The facts about a PersistentVolume that decisions read: implemented by the full object (a
/// fresh read) and by the summary the controller caches of every PV (a few hundred bytes instead
/// of several KiB), so both are decided by the same code.
pub trait VolumeFacts {
    /// The object's metadata (name, uid, deletion timestamp; the summary keeps no annotations
    /// or finalizers: [`VolumeFacts::provisioned_by`], [`VolumeFacts::has_our_finalizer`]).
    fn meta(&self) -> &ObjectMeta;
    /// The `pv.kubernetes.io/provisioned-by` annotation.
    fn provisioned_by(&self) -> Option<&str>;
    /// Whether [`FINALIZER`] is among the finalizers.
    fn has_our_finalizer(&self) -> bool;
    /// `status.phase`.
    fn phase(&self) -> Option<&str>;
    /// `spec.persistentVolumeReclaimPolicy`.
    fn reclaim_policy(&self) -> Option<&str>;
    /// `spec.capacity.storage`.
    fn capacity(&self) -> Option<&Quantity>;
    /// `spec.csi.driver`.
    fn csi_driver(&self) -> Option<&str>;
    /// `spec.claimRef.uid`.
    fn claim_uid(&self) -> Option<&str>;
}

impl VolumeFacts for PersistentVolume {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn provisioned_by(&self) -> Option<&str> {
        provisioned_by(&self.metadata)
    }
    fn has_our_finalizer(&self) -> bool {
        has_our_finalizer(&self.metadata)
    }
    fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }
    fn reclaim_policy(&self) -> Option<&str> {
        self.spec
            .as_ref()?
            .persistent_volume_reclaim_policy
            .as_deref()
    }
    fn capacity(&self) -> Option<&Quantity> {
        crate::quantity::storage(self.spec.as_ref()?.capacity.as_ref())
    }
    fn csi_driver(&self) -> Option<&str> {
        Some(self.spec.as_ref()?.csi.as_ref()?.driver.as_str())
    }
    fn claim_uid(&self) -> Option<&str> {
        self.spec.as_ref()?.claim_ref.as_ref()?.uid.as_deref()
    }
}

/// A reference to facts is facts (`&&PersistentVolume` from iterators and filters).
impl<T: VolumeFacts + ?Sized> VolumeFacts for &T {
    fn meta(&self) -> &ObjectMeta {
        (**self).meta()
    }
    fn provisioned_by(&self) -> Option<&str> {
        (**self).provisioned_by()
    }
    fn has_our_finalizer(&self) -> bool {
        (**self).has_our_finalizer()
    }
    fn phase(&self) -> Option<&str> {
        (**self).phase()
    }
    fn reclaim_policy(&self) -> Option<&str> {
        (**self).reclaim_policy()
    }
    fn capacity(&self) -> Option<&Quantity> {
        (**self).capacity()
    }
    fn csi_driver(&self) -> Option<&str> {
        (**self).csi_driver()
    }
    fn claim_uid(&self) -> Option<&str> {
        (**self).claim_uid()
    }
}

/// Whether `volume` was provisioned by one of `our_names`.
#[must_use]
pub fn is_ours(volume: &(impl VolumeFacts + ?Sized), our_names: &[String]) -> bool {
    volume
        .provisioned_by()
        .is_some_and(|by| our_names.iter().any(|ours| ours == by))
}

/// Whether `volume` carries our finalizer.
#[must_use]
pub fn has_finalizer(volume: &(impl VolumeFacts + ?Sized)) -> bool {
    volume.has_our_finalizer()
}

/// The `pv.kubernetes.io/provisioned-by` annotation of `meta`.
pub(crate) fn provisioned_by(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(ANN_PROVISIONED_BY)
        .map(String::as_str)
}

/// Whether [`FINALIZER`] is among the finalizers of `meta`.
pub(crate) fn has_our_finalizer(meta: &ObjectMeta) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|finalizers| finalizers.iter().any(|f| f == FINALIZER))
}

/// Decides what to do with `volume`.
#[must_use]
pub fn decide(volume: &(impl VolumeFacts + ?Sized), our_names: &[String]) -> VolumeDecision {
    if !is_ours(volume, our_names) {
        return VolumeDecision::Keep;
    }
    let deleting = volume.meta().deletion_timestamp.is_some();
    if deleting && !has_finalizer(volume) {
        // Either we already deleted it (and dropped our finalizer), or it was deleted without
        // our finalizer: nothing left for us to do either way.
        return VolumeDecision::Keep;
    }
    let released = volume.phase() == Some("Released");
    let reclaim_delete = volume.reclaim_policy() == Some("Delete");
    if released && reclaim_delete {
        return VolumeDecision::Delete;
    }
    if deleting && !reclaim_delete {
        return VolumeDecision::RemoveFinalizer;
    }
    VolumeDecision::Keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::SecretRef;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeSpec, PersistentVolumeStatus,
    };
    use k8s_openapi::api::storage::v1::StorageClass;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn options() -> ProvisionOptions {
        let mut claim = PersistentVolumeClaim::default();
        claim.metadata.name = Some("data".to_owned());
        claim.metadata.namespace = Some("apps".to_owned());
        claim.metadata.uid = Some("1234".to_owned());
        claim.metadata.resource_version = Some("77".to_owned());
        claim.metadata.self_link = Some("/must/not/be/used".to_owned());
        claim.spec = Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            volume_mode: Some("Filesystem".to_owned()),
            ..Default::default()
        });
        let mut class = StorageClass {
            provisioner: "ceph.com/rbd".to_owned(),
            reclaim_policy: Some("Retain".to_owned()),
            mount_options: Some(vec!["discard".to_owned()]),
            ..Default::default()
        };
        class.metadata.name = Some("fast".to_owned());
        ProvisionOptions {
            storage_class: class,
            pv_name: volume_name_for("1234"),
            claim,
            selected_node: None,
        }
    }

    fn backend_volume() -> Provisioned {
        let mut volume = PersistentVolume::default();
        volume.metadata.name = Some("backend-picked".to_owned());
        volume.spec = Some(PersistentVolumeSpec {
            capacity: Some([("storage".to_owned(), Quantity("1Gi".to_owned()))].into()),
            ..Default::default()
        });
        Provisioned {
            volume,
            deletion_secret: Some(SecretRef {
                namespace: "ceph".to_owned(),
                name: "admin".to_owned(),
            }),
        }
    }

    #[test]
    fn finished_volume_has_library_fields() {
        let pv = finish_volume(backend_volume(), &options(), "ceph.com/rbd", true);
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1234"));
        let annotations = pv.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations[ANN_PROVISIONED_BY], "ceph.com/rbd");
        assert_eq!(
            crate::volume::deletion_secret(&pv),
            Some(SecretRef {
                namespace: "ceph".to_owned(),
                name: "admin".to_owned()
            })
        );
        assert_eq!(pv.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
        let spec = pv.spec.unwrap_or_default();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.mount_options, Some(vec!["discard".to_owned()]));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.capacity.unwrap_or_default()["storage"].0, "1Gi");
    }

    #[test]
    fn claim_ref_never_uses_self_link() {
        let reference = claim_ref(&options().claim);
        assert_eq!(reference.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(reference.namespace.as_deref(), Some("apps"));
        assert_eq!(reference.name.as_deref(), Some("data"));
        assert_eq!(reference.uid.as_deref(), Some("1234"));
        assert_eq!(reference.resource_version.as_deref(), Some("77"));
        assert_eq!(reference.field_path, None);
    }

    #[test]
    fn reclaim_policy_defaults_to_delete_and_finalizer_is_optional() {
        let mut options = options();
        options.storage_class.reclaim_policy = None;
        options.storage_class.mount_options = None;
        let pv = finish_volume(backend_volume(), &options, "ceph.com/rbd", false);
        assert_eq!(pv.metadata.finalizers, None);
        let spec = pv.spec.unwrap_or_default();
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.mount_options, None);
    }

    #[test]
    fn backend_access_modes_are_kept() {
        let mut provisioned = backend_volume();
        if let Some(spec) = provisioned.volume.spec.as_mut() {
            spec.access_modes = Some(vec!["ReadOnlyMany".to_owned()]);
        }
        let pv = finish_volume(provisioned, &options(), "ceph.com/rbd", false);
        assert_eq!(
            pv.spec.unwrap_or_default().access_modes,
            Some(vec!["ReadOnlyMany".to_owned()])
        );
    }

    fn released(policy: &str, by: &str) -> PersistentVolume {
        let mut pv = PersistentVolume::default();
        pv.metadata.annotations = Some([(ANN_PROVISIONED_BY.to_owned(), by.to_owned())].into());
        pv.spec = Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some(policy.to_owned()),
            ..Default::default()
        });
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Released".to_owned()),
            ..Default::default()
        });
        pv
    }

    fn names() -> Vec<String> {
        vec!["ceph.com/rbd".to_owned()]
    }

    #[test]
    fn deletes_only_our_released_volumes_with_delete_policy() {
        assert_eq!(
            decide(&released("Delete", "ceph.com/rbd"), &names()),
            VolumeDecision::Delete
        );
        assert_eq!(
            decide(&released("Delete", "other/x"), &names()),
            VolumeDecision::Keep
        );
        assert_eq!(
            decide(&released("Retain", "ceph.com/rbd"), &names()),
            VolumeDecision::Keep
        );
        let mut bound = released("Delete", "ceph.com/rbd");
        bound.status = Some(PersistentVolumeStatus {
            phase: Some("Bound".to_owned()),
            ..Default::default()
        });
        assert_eq!(decide(&bound, &names()), VolumeDecision::Keep);
    }

    #[test]
    fn volume_being_deleted_without_our_finalizer_is_left_alone() {
        let mut pv = released("Delete", "ceph.com/rbd");
        pv.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        pv.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".to_owned()]);
        assert_eq!(decide(&pv, &names()), VolumeDecision::Keep);
        pv.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        assert_eq!(decide(&pv, &names()), VolumeDecision::Delete);
    }

    #[test]
    fn retained_volume_being_deleted_only_loses_our_finalizer() {
        let mut pv = released("Retain", "ceph.com/rbd");
        pv.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(decide(&pv, &names()), VolumeDecision::Keep);
        pv.metadata.finalizers = Some(vec![FINALIZER.to_owned()]);
        assert_eq!(decide(&pv, &names()), VolumeDecision::RemoveFinalizer);
    }
}
