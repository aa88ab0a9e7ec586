//! What the controller keeps of each object it watches: only what its decisions read.
//!
//! Every PV and every bound claim stays in the reflector stores for the life of the process, so
//! their size is the controller's memory. A `PersistentVolume` of k8s-openapi is 3.5 KiB before
//! its first string (its spec holds every volume source inline) and about 6 KiB once parsed; the
//! controller decides on a handful of its fields and reads the object fresh before it acts. So
//! PVs are watched as [`CachedVolume`], which deserialises only those fields (the rest of each
//! event is skipped by the parser, never allocated), and claims as [`CachedClaim`]: serialised
//! while unbound (a backend provisions from the whole claim), reduced to what the expansion and
//! modification decisions read once bound.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    Ok(capacity.and_then(storage))
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

/// A claim as the controller caches it. Every claim stays cached while it exists, and
/// k8s-openapi's type costs 2.5-3 KiB per claim even stripped (its structs hold every field
/// inline, and each one-entry map, such as the storage request, is a whole B-tree node of about
/// 550 bytes). So an unbound claim is kept as its JSON, parsed again when it is looked at (a
/// backend provisions from the whole claim), and a bound one as only what the expansion and
/// modification decisions read ([`BoundClaim`]). Watched and listed as `persistentvolumeclaims`;
/// parsed whole, then [`CachedClaim::trim`]med before it is stored.
#[derive(Clone, Debug)]
pub(crate) enum CachedClaim {
    /// As the API server sent it (before [`CachedClaim::trim`]).
    Whole(Arc<PersistentVolumeClaim>),
    /// Not bound: the whole claim as JSON, and its identity for the store.
    Pending(PendingClaim),
    /// Bound to a volume.
    Bound(BoundClaim),
}

/// An unbound claim: name, namespace, uid and resourceVersion (what the store and lookups read)
/// and the whole stripped claim, serialised: about 1.3 KiB in all where the parsed claim takes 2.8.
#[derive(Clone, Debug)]
pub(crate) struct PendingClaim {
    metadata: ObjectMeta,
    json: Box<str>,
}

/// What a bound claim keeps: name, namespace, uid, resourceVersion, deletion timestamp, the
/// resizer and legacy class annotations; class, volume name, storage request and attributes
/// class; phase, storage capacity, and the status's rarer fields (allocated resources,
/// conditions, modification status), boxed because most bound claims have none of them.
#[derive(Clone, Debug)]
pub(crate) struct BoundClaim {
    metadata: ObjectMeta,
    storage_class_name: Option<String>,
    volume_name: String,
    volume_attributes_class_name: Option<String>,
    request: Option<Quantity>,
    has_status: bool,
    phase: Option<String>,
    capacity: Option<Quantity>,
    progress: Option<Box<PersistentVolumeClaimStatus>>,
}

impl<'de> Deserialize<'de> for CachedClaim {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        PersistentVolumeClaim::deserialize(deserializer).map(|claim| Self::Whole(Arc::new(claim)))
    }
}

impl CachedClaim {
    /// The whole claim, while it has not been trimmed.
    pub(crate) fn whole_mut(&mut self) -> Option<&mut PersistentVolumeClaim> {
        match self {
            Self::Whole(claim) => Some(Arc::make_mut(claim)),
            Self::Pending(_) | Self::Bound(_) => None,
        }
    }

    /// Keeps what the controller needs in its compact form: a bound claim only what the
    /// decisions read, an unbound one whole but serialised.
    pub(crate) fn trim(&mut self) {
        let Self::Whole(claim) = self else {
            return;
        };
        let bound_to = claim
            .spec
            .as_ref()
            .and_then(|spec| spec.volume_name.as_deref())
            .filter(|name| !name.is_empty())
            .map(str::to_owned);
        let Some(volume_name) = bound_to else {
            // Serialising a parsed claim cannot fail (string keys only); if it did, the
            // claim would simply stay whole.
            if let Ok(json) = serde_json::to_string(&**claim) {
                let meta = &claim.metadata;
                let metadata = ObjectMeta {
                    name: meta.name.clone(),
                    namespace: meta.namespace.clone(),
                    uid: meta.uid.clone(),
                    resource_version: meta.resource_version.clone(),
                    ..ObjectMeta::default()
                };
                *self = Self::Pending(PendingClaim {
                    metadata,
                    json: json.into_boxed_str(),
                });
            }
            return;
        };
        let claim = std::mem::take(Arc::make_mut(claim));
        let mut meta = claim.metadata;
        let kept: BTreeMap<String, String> = meta
            .annotations
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, _)| key == ANN_STORAGE_RESIZER || key == ANN_BETA_STORAGE_CLASS)
            .collect();
        let metadata = ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            deletion_timestamp: meta.deletion_timestamp,
            annotations: (!kept.is_empty()).then_some(kept),
            ..ObjectMeta::default()
        };
        let spec = claim.spec.unwrap_or_default();
        let request = spec
            .resources
            .and_then(|resources| resources.requests)
            .and_then(storage);
        let has_status = claim.status.is_some();
        let mut status = claim.status.unwrap_or_default();
        let phase = status.phase.take();
        let capacity = status.capacity.take().and_then(storage);
        status.access_modes = None;
        let progress = (status != PersistentVolumeClaimStatus::default()).then(|| Box::new(status));
        *self = Self::Bound(BoundClaim {
            metadata,
            storage_class_name: spec.storage_class_name,
            volume_name,
            volume_attributes_class_name: spec.volume_attributes_class_name,
            request,
            has_status,
            phase,
            capacity,
            progress,
        });
    }

    /// The claim as k8s-openapi's type, for the decisions, the backends and event references:
    /// the same `Arc` for a whole claim, an unbound one parsed again, and for a bound one a claim
    /// holding what was kept.
    pub(crate) fn view(&self) -> Arc<PersistentVolumeClaim> {
        match self {
            Self::Whole(claim) => Arc::clone(claim),
            Self::Pending(pending) => Arc::new(pending.view()),
            Self::Bound(bound) => Arc::new(bound.view()),
        }
    }
}

impl PendingClaim {
    fn view(&self) -> PersistentVolumeClaim {
        serde_json::from_str(&self.json).unwrap_or_else(|error| {
            // Our own serialisation of the same type: cannot happen. The claim's identity alone
            // makes every decision skip it, and the next watch event replaces it.
            tracing::error!(claim = ?self.metadata.name, %error, "cached claim unreadable");
            PersistentVolumeClaim {
                metadata: self.metadata.clone(),
                ..PersistentVolumeClaim::default()
            }
        })
    }
}

impl BoundClaim {
    fn view(&self) -> PersistentVolumeClaim {
        let status = self.has_status.then(|| {
            let mut status = self.progress.as_deref().cloned().unwrap_or_default();
            status.phase.clone_from(&self.phase);
            status.capacity = self.capacity.clone().map(storage_map);
            status
        });
        PersistentVolumeClaim {
            metadata: self.metadata.clone(),
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: self.storage_class_name.clone(),
                volume_name: Some(self.volume_name.clone()),
                volume_attributes_class_name: self.volume_attributes_class_name.clone(),
                resources: self
                    .request
                    .clone()
                    .map(|request| VolumeResourceRequirements {
                        requests: Some(storage_map(request)),
                        limits: None,
                    }),
                ..PersistentVolumeClaimSpec::default()
            }),
            status,
        }
    }
}

impl Resource for CachedClaim {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind((): &()) -> Cow<'_, str> {
        <PersistentVolumeClaim as k8s_openapi::Resource>::KIND.into()
    }
    fn group((): &()) -> Cow<'_, str> {
        <PersistentVolumeClaim as k8s_openapi::Resource>::GROUP.into()
    }
    fn version((): &()) -> Cow<'_, str> {
        <PersistentVolumeClaim as k8s_openapi::Resource>::VERSION.into()
    }
    fn api_version((): &()) -> Cow<'_, str> {
        <PersistentVolumeClaim as k8s_openapi::Resource>::API_VERSION.into()
    }
    fn plural((): &()) -> Cow<'_, str> {
        <PersistentVolumeClaim as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Whole(claim) => &claim.metadata,
            Self::Pending(pending) => &pending.metadata,
            Self::Bound(bound) => &bound.metadata,
        }
    }
    /// A pending claim's JSON does not follow changes made here (nothing changes a stored
    /// claim: the watch replaces it).
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Whole(claim) => &mut Arc::make_mut(claim).metadata,
            Self::Pending(pending) => &mut pending.metadata,
            Self::Bound(bound) => &mut bound.metadata,
        }
    }
}

/// The `storage` entry of a resource map.
fn storage(mut resources: BTreeMap<String, Quantity>) -> Option<Quantity> {
    resources.remove("storage")
}

fn storage_map(quantity: Quantity) -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_owned(), quantity)])
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
        let mut cached: CachedClaim = serde_json::from_value(claim.clone()).unwrap();
        cached.trim();
        assert!(matches!(cached, CachedClaim::Bound(_)), "{cached:?}");
        assert_eq!(Resource::meta(&cached).name.as_deref(), Some("c"));
        let trimmed = cached.view();
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
        assert_eq!(
            crate::modify::names_a_class(&trimmed),
            crate::modify::names_a_class(&full)
        );
        let annotations = trimmed.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 2, "{annotations:?}");
        assert_eq!(trimmed.metadata.labels, None);
        assert_eq!(trimmed.metadata.finalizers, None);
        assert_eq!(trimmed.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(trimmed.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(trimmed.object_ref(&()), full.object_ref(&()));
        let spec = trimmed.spec.as_ref().unwrap();
        assert_eq!(spec.access_modes, None);
        assert_eq!(spec.volume_name.as_deref(), Some("pvc-u1"));
        assert_eq!(spec.resources.as_ref().unwrap().limits, None);
        let status = trimmed.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Bound"));
        assert_eq!(status.access_modes, None);
        assert_eq!(
            status.current_volume_attributes_class_name.as_deref(),
            Some("silver")
        );

        // the common bound claim: no rarer status fields, nothing boxed
        let mut plain: CachedClaim = serde_json::from_value(json!({
            "metadata": {"name": "d", "namespace": "ns", "uid": "u2", "resourceVersion": "8",
                         "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"storageClassName": "fast", "volumeName": "pvc-u2",
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}
        }))
        .unwrap();
        plain.trim();
        let CachedClaim::Bound(bound) = &plain else {
            panic!("not trimmed: {plain:?}");
        };
        assert!(bound.progress.is_none(), "{bound:?}");
        assert_eq!(bound.metadata.annotations, None);
        let view = plain.view();
        assert_eq!(
            crate::quantity::claim_capacity(&view).map(|q| q.0.clone()),
            Some("1Gi".to_owned())
        );
        assert!(!crate::modify::names_a_class(&view));

        // an unbound claim is kept whole, serialised
        let mut unbound = full.clone();
        unbound.spec.as_mut().unwrap().volume_name = None;
        let mut cached = CachedClaim::Whole(Arc::new(unbound.clone()));
        cached.trim();
        assert!(matches!(cached, CachedClaim::Pending(_)), "{cached:?}");
        assert_eq!(Resource::meta(&cached).uid.as_deref(), Some("u1"));
        assert_eq!(Resource::meta(&cached).namespace.as_deref(), Some("ns"));
        assert_eq!(*cached.view(), unbound);
    }
}
