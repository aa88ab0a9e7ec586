//! What the controller keeps of each object it watches: only what its decisions read.
//!
//! Every PV and every bound claim stays in the reflector stores for the life of the process, so
//! their size is the controller's memory. A `PersistentVolume` of k8s-openapi is 3.5 KiB before
//! its first string (its spec holds every volume source inline) and about 6 KiB once parsed; the
//! controller decides on a handful of its fields and reads the object fresh before it acts. So
//! PVs are watched as [`CachedVolume`], which deserialises only those fields (the rest of each
//! event is skipped by the parser, never allocated), and bound claims are trimmed to what the
//! expansion and modification decisions read (unbound ones stay whole: a backend provisions from
//! them).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};

use crate::ownership::ANN_BETA_STORAGE_CLASS;
use crate::pv::{ANN_PROVISIONED_BY, VolumeFacts};
use crate::resize::ANN_STORAGE_RESIZER;

/// A PersistentVolume as the controller caches it: name, uid, resourceVersion, deletion
/// timestamp, our annotation and whether our finalizer is on it, phase, reclaim policy, capacity, CSI driver and the
/// bound claim's uid ([`VolumeFacts`]). Watched and listed as `persistentvolumes`.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct CachedVolume {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: CachedSpec,
    #[serde(default)]
    status: CachedStatus,
    /// Our annotation and finalizer, moved out of `metadata` by [`CachedVolume::trim`] (a map
    /// and a list of one entry each cost about 600 bytes per PV).
    #[serde(skip)]
    provisioned_by: Option<String>,
    #[serde(skip)]
    our_finalizer: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedSpec {
    #[serde(default, deserialize_with = "storage_only")]
    capacity: Option<Quantity>,
    persistent_volume_reclaim_policy: Option<String>,
    csi: Option<CsiDriver>,
    claim_ref: Option<ClaimUid>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct CsiDriver {
    #[serde(default)]
    driver: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct ClaimUid {
    uid: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct CachedStatus {
    phase: Option<String>,
}

/// `capacity: {storage: ..., other resources...}` -> the storage quantity only.
fn storage_only<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Quantity>, D::Error> {
    let capacity: Option<BTreeMap<String, Quantity>> = Option::deserialize(deserializer)?;
    Ok(capacity.and_then(|mut capacity| capacity.remove("storage")))
}

impl CachedVolume {
    /// Drops the metadata no decision reads (labels, managed fields, owner references,
    /// annotations and finalizers, keeping whether ours are there); called before the reflector
    /// stores it.
    pub(crate) fn trim(&mut self) {
        let meta = &mut self.metadata;
        if let Some(by) = meta
            .annotations
            .take()
            .and_then(|mut annotations| annotations.remove(ANN_PROVISIONED_BY))
        {
            self.provisioned_by = Some(by);
        }
        self.our_finalizer |= crate::pv::has_our_finalizer(meta);
        meta.annotations = None;
        meta.finalizers = None;
        meta.labels = None;
        meta.managed_fields = None;
        meta.owner_references = None;
        meta.creation_timestamp = None;
        meta.generate_name = None;
        meta.self_link = None;
    }
}

impl Resource for CachedVolume {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        <PersistentVolume as k8s_openapi::Resource>::KIND.into()
    }
    fn group((): &()) -> Cow<'_, str> {
        <PersistentVolume as k8s_openapi::Resource>::GROUP.into()
    }
    fn version((): &()) -> Cow<'_, str> {
        <PersistentVolume as k8s_openapi::Resource>::VERSION.into()
    }
    fn api_version((): &()) -> Cow<'_, str> {
        <PersistentVolume as k8s_openapi::Resource>::API_VERSION.into()
    }
    fn plural((): &()) -> Cow<'_, str> {
        <PersistentVolume as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl VolumeFacts for CachedVolume {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn provisioned_by(&self) -> Option<&str> {
        self.provisioned_by
            .as_deref()
            .or_else(|| crate::pv::provisioned_by(&self.metadata))
    }
    fn has_our_finalizer(&self) -> bool {
        self.our_finalizer || crate::pv::has_our_finalizer(&self.metadata)
    }
    fn phase(&self) -> Option<&str> {
        self.status.phase.as_deref()
    }
    fn reclaim_policy(&self) -> Option<&str> {
        self.spec.persistent_volume_reclaim_policy.as_deref()
    }
    fn capacity(&self) -> Option<&Quantity> {
        self.spec.capacity.as_ref()
    }
    fn csi_driver(&self) -> Option<&str> {
        self.spec.csi.as_ref().map(|csi| csi.driver.as_str())
    }
    fn claim_uid(&self) -> Option<&str> {
        self.spec.claim_ref.as_ref()?.uid.as_deref()
    }
}

/// Trims a bound claim to what the expansion and modification decisions read (name, namespace,
/// uid, resourceVersion, deletion timestamp, the resizer and legacy class annotations; class,
/// volume name, storage request and attributes class; phase, capacity, allocated resources,
/// conditions and modification status). Unbound claims are left whole: a backend provisions
/// from them.
pub(crate) fn trim_bound_claim(claim: &mut PersistentVolumeClaim) {
    let bound = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .is_some_and(|name| !name.is_empty());
    if !bound {
        return;
    }
    let meta = &mut claim.metadata;
    let kept: BTreeMap<String, String> = meta
        .annotations
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|(key, _)| key == ANN_STORAGE_RESIZER || key == ANN_BETA_STORAGE_CLASS)
        .collect();
    meta.annotations = (!kept.is_empty()).then_some(kept);
    meta.labels = None;
    meta.finalizers = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.creation_timestamp = None;
    meta.generate_name = None;
    meta.self_link = None;
    if let Some(spec) = claim.spec.take() {
        claim.spec = Some(PersistentVolumeClaimSpec {
            storage_class_name: spec.storage_class_name,
            volume_name: spec.volume_name,
            volume_attributes_class_name: spec.volume_attributes_class_name,
            resources: spec.resources.map(|resources| VolumeResourceRequirements {
                requests: resources.requests.map(storage_request),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        });
    }
    if let Some(status) = claim.status.take() {
        claim.status = Some(PersistentVolumeClaimStatus {
            access_modes: None,
            ..status
        });
    }
}

fn storage_request(mut requests: BTreeMap<String, Quantity>) -> BTreeMap<String, Quantity> {
    requests.retain(|key, _| key == "storage");
    requests
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pv::FINALIZER;
    use serde_json::json;

    fn volume_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {
                "name": "pvc-1", "uid": "u-pv", "resourceVersion": "9",
                "creationTimestamp": "2026-12-01T05:00:00Z",
                "deletionTimestamp": "2026-12-01T06:00:00Z",
                "labels": {"team": "a"},
                "annotations": {
                    ANN_PROVISIONED_BY: "ceph.com/rbd",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "rbdProvisionerIdentity": "ceph.com/rbd"
                },
                "finalizers": ["kubernetes.io/pv-protection", FINALIZER],
                "managedFields": [{"manager": "kcm", "operation": "Update"}]
            },
            "spec": {
                "capacity": {"storage": "1Gi", "other": "1"},
                "accessModes": ["ReadWriteOnce"],
                "csi": {"driver": "rbd.csi.example", "volumeHandle": "v1/m/rbd/img",
                        "volumeAttributes": {"pool": "rbd"}},
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "c",
                             "uid": "u-claim"},
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "fast",
                "mountOptions": ["discard"]
            },
            "status": {"phase": "Released"}
        })
    }

    #[test]
    fn the_cached_volume_decides_as_the_full_object() {
        let full: PersistentVolume = serde_json::from_value(volume_json()).unwrap();
        let mut cached: CachedVolume = serde_json::from_value(volume_json()).unwrap();
        cached.trim();
        let names = vec!["ceph.com/rbd".to_owned()];
        assert_eq!(VolumeFacts::meta(&cached).name.as_deref(), Some("pvc-1"));
        assert_eq!(cached.phase(), full.phase());
        assert_eq!(cached.reclaim_policy(), full.reclaim_policy());
        assert_eq!(cached.capacity(), full.capacity());
        assert_eq!(cached.csi_driver(), Some("rbd.csi.example"));
        assert_eq!(cached.claim_uid(), Some("u-claim"));
        assert!(crate::pv::is_ours(&cached, &names));
        assert!(crate::pv::has_finalizer(&cached));
        assert_eq!(
            crate::pv::decide(&cached, &names),
            crate::pv::decide(&full, &names)
        );
        let meta = VolumeFacts::meta(&cached);
        assert_eq!(meta.labels, None);
        assert_eq!(meta.managed_fields, None);
        assert_eq!(meta.annotations, None);
        assert_eq!(meta.finalizers, None);
        assert!(meta.deletion_timestamp.is_some());

        // without our annotation or finalizer, and a minimal object
        let bare: CachedVolume =
            serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(!crate::pv::is_ours(&bare, &names));
        assert!(!crate::pv::has_finalizer(&bare));
        assert_eq!(bare.capacity(), None);
        assert_eq!(
            <CachedVolume as Resource>::url_path(&(), None),
            "/api/v1/persistentvolumes"
        );
    }

    #[test]
    fn bound_claims_keep_what_expansion_and_modification_read() {
        let claim = json!({
            "metadata": {
                "name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "db"},
                "annotations": {
                    ANN_STORAGE_RESIZER: "ceph.com/rbd",
                    ANN_BETA_STORAGE_CLASS: "fast",
                    "volume.kubernetes.io/storage-provisioner": "ceph.com/rbd",
                    "pv.kubernetes.io/bind-completed": "yes"
                },
                "finalizers": ["kubernetes.io/pvc-protection"]
            },
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "volumeName": "pvc-u1", "volumeMode": "Filesystem",
                     "volumeAttributesClassName": "gold",
                     "resources": {"requests": {"storage": "2Gi"}, "limits": {"storage": "3Gi"}}},
            "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                       "capacity": {"storage": "1Gi"},
                       "allocatedResources": {"storage": "2Gi"},
                       "conditions": [{"type": "FileSystemResizePending", "status": "True"}],
                       "currentVolumeAttributesClassName": "silver"}
        });
        let full: PersistentVolumeClaim = serde_json::from_value(claim.clone()).unwrap();
        let mut trimmed = full.clone();
        trim_bound_claim(&mut trimmed);
        assert_eq!(
            crate::quantity::claim_request(&trimmed),
            crate::quantity::claim_request(&full)
        );
        assert_eq!(
            crate::quantity::claim_capacity(&trimmed),
            crate::quantity::claim_capacity(&full)
        );
        assert_eq!(
            crate::quantity::claim_allocated(&trimmed),
            crate::quantity::claim_allocated(&full)
        );
        assert_eq!(
            crate::ownership::storage_class_name(&trimmed),
            crate::ownership::storage_class_name(&full)
        );
        assert!(crate::resize::has_condition(
            &trimmed,
            "FileSystemResizePending"
        ));
        assert_eq!(crate::modify::spec_class(&trimmed), "gold");
        let annotations = trimmed.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 2, "{annotations:?}");
        assert_eq!(trimmed.metadata.labels, None);
        assert_eq!(trimmed.metadata.finalizers, None);
        assert_eq!(trimmed.metadata.uid.as_deref(), Some("u1"));
        let spec = trimmed.spec.as_ref().unwrap();
        assert_eq!(spec.access_modes, None);
        assert_eq!(spec.resources.as_ref().unwrap().limits, None);
        assert_eq!(
            trimmed
                .status
                .as_ref()
                .unwrap()
                .current_volume_attributes_class_name
                .as_deref(),
            Some("silver")
        );

        // an unbound claim is left whole
        let mut unbound = full.clone();
        unbound.spec.as_mut().unwrap().volume_name = None;
        let before = unbound.clone();
        trim_bound_claim(&mut unbound);
        assert_eq!(unbound, before);
    }
}
