//! The replacement PV for a legacy in-tree `rbd` PV, and the checks that need no I/O. Pure.
//!
//! The new PV keeps the name, capacity, access modes, volume mode, mount options, node affinity,
//! labels, annotations, class and `claimRef` (with its uid: the claim binds to it again) of the
//! old one, and swaps `spec.rbd` for a `spec.csi` of our driver naming the same monitors, pool
//! and image. Credentials stay references: no secret value is read into the PV.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, RBDPersistentVolumeSource, SecretReference,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provisioner::volume::{ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE};
use rbd_csi::volume::{VolumeId, context};

use crate::backend::pv_build::{ANN_ADMIN_ID, ANN_LEGACY_IDENTITY};

/// Annotation on a migrated PV: the volume source it had before (`rbd`).
pub const ANN_MIGRATED_FROM: &str = "provisioner.ceph.com/migrated-from";
/// Annotation on a PV migrated from ceph-csi: its ceph-csi volume handle (for the way back).
pub const ANN_CEPH_CSI_HANDLE: &str = "provisioner.ceph.com/ceph-csi-volume-handle";
/// Annotation the migration sets on the claim once its new PV exists (nanoseconds since the
/// epoch: a new value each time, so each run's write is an update).
/// Writing it is an update of the claim, which makes kube-controller-manager sync the claim and
/// bind it again at once instead of on its next periodic resync.
pub const ANN_CLAIM_MIGRATED_AT: &str = "provisioner.ceph.com/migrated-at";
/// Finalizers the migration removes from the old PV after deleting it (no pod uses the claim;
/// the image is never deleted). Any other finalizer is someone else's: the PV is refused.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// The in-tree default filesystem when `spec.rbd.fsType` is empty.
pub const IN_TREE_DEFAULT_FS: &str = "ext4";
/// The in-tree default pool and user.
const DEFAULT_POOL: &str = "rbd";
const DEFAULT_USER: &str = "admin";

/// A Secret by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretName {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for SecretName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The Ceph credentials with admin rights for a PV's image (deletion, expansion, owner record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminAccess {
    pub secret: SecretName,
    pub user: String,
}

/// What the old PV's source says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Legacy {
    pub monitors: String,
    pub pool: String,
    pub image: String,
    pub user: String,
    /// The node-stage secret: `spec.rbd.secretRef`, its namespace resolved as the in-tree plugin
    /// did at mount time (empty = the pod's, i.e. the claim's namespace).
    pub user_secret: SecretName,
    /// `namespace/name` of the claim in `claimRef`, if any.
    pub claim: Option<(String, String)>,
    pub claim_uid: Option<String>,
    /// Bytes of `spec.capacity.storage`.
    pub capacity: u64,
}

/// Bytes of a PV's `spec.capacity.storage`; the error names the field.
fn capacity_bytes(spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> Result<u64, String> {
    let capacity = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .ok_or("the PV has no spec.capacity.storage")?;
    provisioner::quantity::parse_bytes(&capacity.0)
        .ok_or_else(|| format!("spec.capacity.storage {:?} is not a size", capacity.0))
}

/// Reads and checks the old PV's `spec.rbd`. The error says which field is wrong.
pub fn legacy(pv: &PersistentVolume) -> Result<Legacy, String> {
    let spec = pv.spec.as_ref().ok_or("the PV has no spec")?;
    let rbd: &RBDPersistentVolumeSource =
        spec.rbd.as_ref().ok_or("the PV has no spec.rbd source")?;
    if rbd.monitors.is_empty() || rbd.monitors.iter().any(|m| m.trim().is_empty()) {
        return Err("spec.rbd.monitors is empty".into());
    }
    if rbd.image.is_empty() {
        return Err("spec.rbd.image is empty".into());
    }
    let claim = spec
        .claim_ref
        .as_ref()
        .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
    let Some(secret_ref) = rbd.secret_ref.as_ref().filter(|r| r.name.is_some()) else {
        return Err(match &rbd.keyring {
            Some(k) if !k.is_empty() => format!(
                "spec.rbd has no secretRef, only keyring {k:?} (a file on each node): our CSI \
                 driver takes the key from a Secret; create a PV by hand whose \
                 csi.nodeStageSecretRef names a Secret with that key"
            ),
            _ => "spec.rbd has no secretRef".into(),
        });
    };
    let secret_namespace = match secret_ref.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(ns) => ns.to_string(),
        None => claim.as_ref().map(|(ns, _)| ns.clone()).ok_or(
            "spec.rbd.secretRef has no namespace and the PV has no claimRef to take it from \
             (the in-tree plugin used the pod's namespace)",
        )?,
    };
    let capacity = capacity_bytes(spec)?;
    Ok(Legacy {
        monitors: rbd
            .monitors
            .iter()
            .map(|m| m.trim())
            .collect::<Vec<_>>()
            .join(","),
        pool: rbd
            .pool
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_POOL.into()),
        image: rbd.image.clone(),
        user: rbd
            .user
            .clone()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_USER.into()),
        user_secret: SecretName {
            namespace: secret_namespace,
            name: secret_ref.name.clone().unwrap_or_default(),
        },
        claim_uid: spec.claim_ref.as_ref().and_then(|r| r.uid.clone()),
        claim,
        capacity,
    })
}

/// `(namespace/name of the claim, pool/image)` as far as the PV says, for the report (also
/// when [`legacy`] refuses it).
pub fn describe(pv: &PersistentVolume) -> (String, String) {
    let spec = pv.spec.as_ref();
    let claim = spec
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| {
            Some(format!(
                "{}/{}",
                r.namespace.as_deref()?,
                r.name.as_deref()?
            ))
        })
        .unwrap_or_default();
    let image = spec
        .and_then(|s| s.rbd.as_ref())
        .filter(|r| !r.image.is_empty())
        .map(|r| {
            let pool = r
                .pool
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or(DEFAULT_POOL);
            format!("{pool}/{}", r.image)
        })
        .unwrap_or_default();
    (claim, image)
}

/// The admin credentials a PV records: the provisioner's deletion-secret annotations (and
/// `provisioner.ceph.com/admin-id`, default `admin`). `None` when it records none.
pub fn recorded_admin(pv: &PersistentVolume) -> Option<AdminAccess> {
    let secret = provisioner::volume::deletion_secret(pv)?;
    let user = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_ADMIN_ID))
        .cloned()
        .unwrap_or_else(|| DEFAULT_USER.into());
    Some(AdminAccess {
        secret: SecretName {
            namespace: secret.namespace,
            name: secret.name,
        },
        user,
    })
}

/// Finalizers on the old PV the migration may not remove (set by other controllers).
pub fn foreign_finalizers(pv: &PersistentVolume) -> Vec<String> {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != PV_PROTECTION && *f != provisioner::pv::FINALIZER)
        .cloned()
        .collect()
}

/// Builds the CSI PV that replaces `old`, with `reclaim_policy`. `admin` (from the PV's
/// annotations or its class) becomes the controller-expand secret and the deletion-secret
/// annotations, so deletes and expansion work without the class.
pub fn replacement(
    old: &PersistentVolume,
    legacy: &Legacy,
    driver: &str,
    admin: Option<&AdminAccess>,
    reclaim_policy: &str,
) -> Result<PersistentVolume, String> {
    let rbd = old
        .spec
        .as_ref()
        .and_then(|s| s.rbd.as_ref())
        .ok_or("the PV has no spec.rbd source")?;
    // a PV made through a clusterID keeps naming the cluster (a v2 handle: monitors looked up
    // at use time), not the monitors written into its in-tree source back then
    let cluster_id = old
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::backend::pv_build::ANN_CLUSTER_ID))
        .filter(|id| !id.is_empty());
    let cluster = match cluster_id {
        Some(id) => rbd_volume::ClusterRef::Named(id.clone()),
        None => rbd_volume::ClusterRef::Monitors(legacy.monitors.clone()),
    };
    let handle = VolumeId::located(cluster, &legacy.pool, "", &legacy.image).encode()?;
    let mut spec = old.spec.clone().unwrap_or_default();
    let block = spec.volume_mode.as_deref() == Some("Block");
    spec.rbd = None;
    spec.persistent_volume_reclaim_policy = Some(reclaim_policy.to_string());
    let mut attributes = BTreeMap::from([
        (context::MONITORS.to_string(), legacy.monitors.clone()),
        (context::POOL.to_string(), legacy.pool.clone()),
        (context::IMAGE.to_string(), legacy.image.clone()),
        (context::USER.to_string(), legacy.user.clone()),
    ]);
    if let Some(id) = cluster_id {
        attributes.insert(
            crate::backend::pv_build::ATTR_CLUSTER_ID.to_string(),
            id.clone(),
        );
    }
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: driver.to_string(),
        volume_handle: handle,
        fs_type: (!block).then(|| {
            rbd.fs_type
                .clone()
                .filter(|f| !f.is_empty())
                .unwrap_or_else(|| IN_TREE_DEFAULT_FS.into())
        }),
        read_only: rbd.read_only.filter(|r| *r),
        volume_attributes: Some(attributes),
        node_stage_secret_ref: Some(SecretReference {
            name: Some(legacy.user_secret.name.clone()),
            namespace: Some(legacy.user_secret.namespace.clone()),
        }),
        controller_expand_secret_ref: admin.map(|a| SecretReference {
            name: Some(a.secret.name.clone()),
            namespace: Some(a.secret.namespace.clone()),
        }),
        ..Default::default()
    });
    let mut annotations = old.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(ANN_MIGRATED_FROM.into(), "rbd".into());
    if let Some(a) = admin {
        annotations
            .entry(ANN_DELETION_SECRET_NAME.into())
            .or_insert_with(|| a.secret.name.clone());
        annotations
            .entry(ANN_DELETION_SECRET_NAMESPACE.into())
            .or_insert_with(|| a.secret.namespace.clone());
        annotations
            .entry(ANN_ADMIN_ID.into())
            .or_insert_with(|| a.user.clone());
    }
    Ok(new_pv(old, annotations, spec))
}

/// What a PV of ceph-csi's RBD driver says of its volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CephCsi {
    /// The parsed volume handle.
    pub handle: rbd_volume::ceph_csi::Handle,
    /// `volumeAttributes.pool`.
    pub pool: String,
    /// `volumeAttributes.radosNamespace` (empty: the pool's default namespace).
    pub namespace: String,
    /// `volumeAttributes.imageName`.
    pub image: String,
    /// The node-stage secret (`nodeStageSecretRef`).
    pub node_secret: SecretName,
    /// The secret with rights to delete and resize the image: the provisioner's deletion secret
    /// the external-provisioner recorded on the PV, else `controllerExpandSecretRef`.
    pub admin_secret: Option<SecretName>,
    pub claim: Option<(String, String)>,
    pub claim_uid: Option<String>,
    /// Bytes of `spec.capacity.storage`.
    pub capacity: u64,
}

impl CephCsi {
    /// `pool/namespace` or `pool`.
    #[must_use]
    pub fn pool_spec(&self) -> String {
        if self.namespace.is_empty() {
            self.pool.clone()
        } else {
            format!("{}/{}", self.pool, self.namespace)
        }
    }

    /// The fields the PV replacement shares with an in-tree PV's.
    #[must_use]
    pub fn as_legacy(&self) -> Legacy {
        Legacy {
            monitors: String::new(),
            pool: self.pool.clone(),
            image: self.image.clone(),
            user: String::new(),
            user_secret: self.node_secret.clone(),
            claim: self.claim.clone(),
            claim_uid: self.claim_uid.clone(),
            capacity: self.capacity,
        }
    }
}

fn secret_name(r: Option<&SecretReference>) -> Option<SecretName> {
    let r = r?;
    Some(SecretName {
        namespace: r.namespace.clone().filter(|n| !n.is_empty())?,
        name: r.name.clone().filter(|n| !n.is_empty())?,
    })
}

/// Reads and checks a PV of ceph-csi's RBD driver `from_driver`. The error says which field is
/// wrong.
pub fn ceph_csi(pv: &PersistentVolume, from_driver: &str) -> Result<CephCsi, String> {
    let spec = pv.spec.as_ref().ok_or("the PV has no spec")?;
    let csi = spec
        .csi
        .as_ref()
        .filter(|c| c.driver == from_driver)
        .ok_or_else(|| format!("the PV is not a CSI volume of {from_driver}"))?;
    let handle = rbd_volume::ceph_csi::Handle::parse(&csi.volume_handle)
        .map_err(|e| format!("spec.csi.volumeHandle: {e}"))?;
    let attributes = csi.volume_attributes.clone().unwrap_or_default();
    let attribute = |key: &str| attributes.get(key).filter(|v| !v.is_empty()).cloned();
    if let Some(id) = attribute(context::CLUSTER_ID)
        && id != handle.cluster_id
    {
        return Err(format!(
            "spec.csi.volumeAttributes.clusterID {id:?} differs from the handle's {:?}",
            handle.cluster_id
        ));
    }
    let pool = attribute(context::POOL).ok_or("spec.csi.volumeAttributes.pool is missing")?;
    let image =
        attribute(context::IMAGE).ok_or("spec.csi.volumeAttributes.imageName is missing")?;
    let node_secret = secret_name(csi.node_stage_secret_ref.as_ref())
        .ok_or("spec.csi.nodeStageSecretRef is missing (nodes could not stage the volume)")?;
    let admin_secret = provisioner::volume::deletion_secret(pv)
        .map(|s| SecretName {
            namespace: s.namespace,
            name: s.name,
        })
        .or_else(|| secret_name(csi.controller_expand_secret_ref.as_ref()));
    let capacity = capacity_bytes(spec)?;
    Ok(CephCsi {
        pool,
        namespace: attribute(context::NAMESPACE).unwrap_or_default(),
        image,
        node_secret,
        admin_secret,
        claim: spec
            .claim_ref
            .as_ref()
            .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?))),
        claim_uid: spec.claim_ref.as_ref().and_then(|r| r.uid.clone()),
        capacity,
        handle,
    })
}

/// The PV of our `driver` that replaces ceph-csi's PV `old`, with `reclaim_policy`: the same
/// PV with our driver and a handle naming the same cluster ID, pool, namespace and image; the
/// volume attributes (ceph-csi's and ours are the same keys), secrets, filesystem and claim
/// kept; `pv.kubernetes.io/provisioned-by` set to `provisioner`, so ours deletes it.
pub fn ceph_csi_replacement(
    old: &PersistentVolume,
    volume: &CephCsi,
    driver: &str,
    provisioner: &str,
    reclaim_policy: &str,
) -> Result<PersistentVolume, String> {
    let handle = VolumeId::located(
        rbd_volume::ClusterRef::Named(volume.handle.cluster_id.clone()),
        &volume.pool,
        &volume.namespace,
        &volume.image,
    )
    .encode()?;
    let mut spec = old.spec.clone().unwrap_or_default();
    spec.persistent_volume_reclaim_policy = Some(reclaim_policy.to_string());
    let mut csi = spec.csi.clone().ok_or("the PV has no spec.csi source")?;
    let from = csi.driver.clone();
    csi.driver = driver.to_string();
    csi.volume_handle = handle;
    let mut attributes = csi.volume_attributes.clone().unwrap_or_default();
    attributes.insert(
        context::CLUSTER_ID.to_string(),
        volume.handle.cluster_id.clone(),
    );
    csi.volume_attributes = Some(attributes);
    spec.csi = Some(csi);
    let mut annotations = old.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(ANN_MIGRATED_FROM.into(), from);
    annotations.insert(ANN_CEPH_CSI_HANDLE.into(), volume.handle.encode());
    annotations.insert(
        provisioner::pv::ANN_PROVISIONED_BY.into(),
        provisioner.to_string(),
    );
    Ok(new_pv(old, annotations, spec))
}

/// `spec.csi.volumeAttributes[key]` of `pv`, when set and not empty.
#[must_use]
pub fn csi_attribute(pv: &PersistentVolume, key: &str) -> Option<String> {
    pv.spec
        .as_ref()?
        .csi
        .as_ref()?
        .volume_attributes
        .as_ref()?
        .get(key)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Sets `spec.csi.volumeAttributes[key]` of `pv` unless it is set.
pub fn add_attribute(pv: &mut PersistentVolume, key: &str, value: &str) {
    if let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.as_mut()) {
        csi.volume_attributes
            .get_or_insert_with(Default::default)
            .entry(key.to_owned())
            .or_insert_with(|| value.to_owned());
    }
}

/// `spec.csi.volumeHandle` of `pv`.
#[must_use]
pub fn volume_handle(pv: &PersistentVolume) -> Option<String> {
    Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone())
}

/// The old PV's source as the replacement needs it: an in-tree `rbd` source, or a volume of
/// ceph-csi's driver `from_driver`.
pub fn original(pv: &PersistentVolume, from_driver: &str) -> Result<Legacy, String> {
    if pv.spec.as_ref().is_some_and(|s| s.rbd.is_some()) {
        legacy(pv)
    } else {
        ceph_csi(pv, from_driver).map(|v| v.as_legacy())
    }
}

/// The replacement of `old`: its name and labels, `annotations` and `spec`.
fn new_pv(
    old: &PersistentVolume,
    annotations: BTreeMap<String, String>,
    spec: k8s_openapi::api::core::v1::PersistentVolumeSpec,
) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: old.metadata.name.clone(),
            labels: old.metadata.labels.clone(),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The owner-record identity of a legacy PV's image: the old provisioner's
/// `rbdProvisionerIdentity`, else ours.
pub fn owner_identity(pv: &PersistentVolume, ours: &str) -> String {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_LEGACY_IDENTITY))
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or_else(|| ours.to_string())
}

/// Whether `pv` is the migrated form of the PV `old_image` named: a CSI PV of `driver` whose
/// handle names the same pool and image.
pub fn is_replacement_of(pv: &PersistentVolume, driver: &str, pool: &str, image: &str) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .filter(|c| c.driver == driver)
        .and_then(|c| VolumeId::parse(&c.volume_handle).ok())
        .is_some_and(|id| id.pool == pool && id.image == image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A PV as the old ceph.com/rbd provisioner wrote it.
    fn old_pv() -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {
                "name": "pvc-1f2e",
                "uid": "old-uid",
                "resourceVersion": "42",
                "labels": {"team": "a"},
                "annotations": {
                    "pv.kubernetes.io/provisioned-by": "ceph.com/rbd",
                    "rbdProvisionerIdentity": "ceph.com/rbd",
                },
                "finalizers": ["kubernetes.io/pv-protection"],
            },
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "rbd",
                "mountOptions": ["discard"],
                "volumeMode": "Filesystem",
                "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                             "namespace": "apps", "name": "data", "uid": "claim-uid",
                             "resourceVersion": "7"},
                "rbd": {
                    "monitors": ["10.0.0.1:6789", "10.0.0.2:6789"],
                    "image": "kubernetes-dynamic-pvc-8c5a2f3e-0000-11e9-a1b2-0a580a000001",
                    "pool": "kube",
                    "user": "kube",
                    "secretRef": {"name": "ceph-user"},
                },
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn the_new_pv_keeps_everything_but_the_source_and_names_the_same_image() {
        let old = old_pv();
        let l = legacy(&old).unwrap();
        assert_eq!(
            l.user_secret,
            SecretName {
                namespace: "apps".into(),
                name: "ceph-user".into()
            }
        );
        assert_eq!(l.capacity, 1 << 30);
        let admin = AdminAccess {
            secret: SecretName {
                namespace: "kube-system".into(),
                name: "ceph-admin".into(),
            },
            user: "admin".into(),
        };
        let new = replacement(&old, &l, "rbd.provisioner.ceph.io", Some(&admin), "Retain").unwrap();
        let (os, ns) = (old.spec.clone().unwrap(), new.spec.clone().unwrap());
        assert_eq!(new.metadata.name, old.metadata.name);
        assert_eq!(new.metadata.labels, old.metadata.labels);
        assert!(new.metadata.uid.is_none() && new.metadata.resource_version.is_none());
        assert!(new.metadata.finalizers.is_none() && new.status.is_none());
        let ann = new.metadata.annotations.clone().unwrap();
        assert_eq!(ann["pv.kubernetes.io/provisioned-by"], "ceph.com/rbd");
        assert_eq!(ann["rbdProvisionerIdentity"], "ceph.com/rbd");
        assert_eq!(ann[ANN_MIGRATED_FROM], "rbd");
        assert_eq!(ann[ANN_DELETION_SECRET_NAME], "ceph-admin");
        assert_eq!(ann[ANN_ADMIN_ID], "admin");
        assert_eq!(ns.claim_ref, os.claim_ref);
        assert_eq!(ns.capacity, os.capacity);
        assert_eq!(ns.access_modes, os.access_modes);
        assert_eq!(ns.mount_options, os.mount_options);
        assert_eq!(ns.storage_class_name, os.storage_class_name);
        assert_eq!(ns.volume_mode, os.volume_mode);
        assert_eq!(
            ns.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert!(ns.rbd.is_none());
        let csi = ns.csi.unwrap();
        assert_eq!(csi.driver, "rbd.provisioner.ceph.io");
        assert_eq!(
            csi.volume_handle,
            "v1/10.0.0.1:6789,10.0.0.2:6789/kube/kubernetes-dynamic-pvc-8c5a2f3e-0000-11e9-a1b2-0a580a000001"
        );
        assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
        assert_eq!(csi.read_only, None);
        let attrs = csi.volume_attributes.unwrap();
        assert_eq!(attrs["userID"], "kube");
        assert_eq!(attrs["pool"], "kube");
        assert_eq!(attrs["monitors"], "10.0.0.1:6789,10.0.0.2:6789");
        let stage = csi.node_stage_secret_ref.unwrap();
        assert_eq!(
            (stage.namespace.as_deref(), stage.name.as_deref()),
            (Some("apps"), Some("ceph-user"))
        );
        let expand = csi.controller_expand_secret_ref.unwrap();
        assert_eq!(expand.name.as_deref(), Some("ceph-admin"));

        // made through a clusterID: the handle names the cluster
        let mut named = old.clone();
        named.metadata.annotations.as_mut().unwrap().insert(
            crate::backend::pv_build::ANN_CLUSTER_ID.into(),
            "site-a".into(),
        );
        let by_name = replacement(
            &named,
            &l,
            "rbd.provisioner.ceph.io",
            Some(&admin),
            "Retain",
        )
        .unwrap();
        let csi = by_name.spec.clone().unwrap().csi.unwrap();
        assert!(is_replacement_of(
            &by_name,
            "rbd.provisioner.ceph.io",
            "kube",
            &l.image
        ));
        assert_eq!(
            csi.volume_handle,
            "v2/site-a/kube/kubernetes-dynamic-pvc-8c5a2f3e-0000-11e9-a1b2-0a580a000001"
        );
        assert_eq!(csi.volume_attributes.unwrap()["clusterID"], "site-a");
        assert!(is_replacement_of(
            &new,
            "rbd.provisioner.ceph.io",
            "kube",
            &l.image
        ));
        assert!(!is_replacement_of(&new, "other", "kube", &l.image));
        assert!(!is_replacement_of(
            &old,
            "rbd.provisioner.ceph.io",
            "kube",
            &l.image
        ));
    }

    #[test]
    fn block_volumes_get_no_fs_type_and_read_only_is_kept() {
        let mut old = old_pv();
        let spec = old.spec.as_mut().unwrap();
        spec.volume_mode = Some("Block".into());
        spec.rbd.as_mut().unwrap().read_only = Some(true);
        spec.rbd.as_mut().unwrap().fs_type = Some("xfs".into());
        let l = legacy(&old).unwrap();
        let csi = replacement(&old, &l, "d", None, "Delete")
            .unwrap()
            .spec
            .unwrap()
            .csi
            .unwrap();
        assert_eq!(csi.fs_type, None);
        assert_eq!(csi.read_only, Some(true));
        assert!(csi.controller_expand_secret_ref.is_none());
    }

    #[test]
    fn bad_sources_are_refused_naming_the_field() {
        let mut keyring = old_pv();
        let rbd = keyring.spec.as_mut().unwrap().rbd.as_mut().unwrap();
        rbd.secret_ref = None;
        rbd.keyring = Some("/etc/ceph/keyring".into());
        let e = legacy(&keyring).unwrap_err();
        assert!(
            e.contains("no secretRef") && e.contains("/etc/ceph/keyring"),
            "{e}"
        );

        let mut unbound = old_pv();
        unbound.spec.as_mut().unwrap().claim_ref = None;
        let e = legacy(&unbound).unwrap_err();
        assert!(e.contains("secretRef has no namespace"), "{e}");
        unbound
            .spec
            .as_mut()
            .unwrap()
            .rbd
            .as_mut()
            .unwrap()
            .secret_ref
            .as_mut()
            .unwrap()
            .namespace = Some("ceph".into());
        assert_eq!(legacy(&unbound).unwrap().user_secret.namespace, "ceph");

        let mut no_image = old_pv();
        no_image.spec.as_mut().unwrap().rbd.as_mut().unwrap().image = String::new();
        assert!(legacy(&no_image).unwrap_err().contains("spec.rbd.image"));

        let mut csi = old_pv();
        csi.spec.as_mut().unwrap().rbd = None;
        assert!(legacy(&csi).unwrap_err().contains("no spec.rbd"));

        let mut long = old_pv();
        long.spec.as_mut().unwrap().rbd.as_mut().unwrap().monitors =
            vec!["192.168.100.100:6789".into(); 8];
        let l = legacy(&long).unwrap();
        let e = replacement(&long, &l, "d", None, "Delete").unwrap_err();
        assert!(e.contains("128"), "{e}");
    }

    #[test]
    fn finalizers_of_other_controllers_are_reported() {
        let mut pv = old_pv();
        assert!(foreign_finalizers(&pv).is_empty());
        pv.metadata.finalizers = Some(vec![
            PV_PROTECTION.into(),
            provisioner::pv::FINALIZER.into(),
            "example.com/backup".into(),
        ]);
        assert_eq!(foreign_finalizers(&pv), ["example.com/backup"]);
    }

    #[test]
    fn the_owner_identity_is_the_old_provisioners_else_ours() {
        let mut pv = old_pv();
        assert_eq!(owner_identity(&pv, "mine"), "ceph.com/rbd");
        pv.metadata.annotations = None;
        assert_eq!(owner_identity(&pv, "mine"), "mine");
    }
}
