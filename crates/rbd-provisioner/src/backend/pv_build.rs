//! The PersistentVolume spec for a provisioned image. Pure.
//!
//! The provisioner library fills name, claimRef, class, reclaim policy, mount options and the
//! provisioned-by annotation; this builds the rest: the volume source (in-tree `rbd` or `csi`),
//! capacity, access modes and volume mode, and our own annotations.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, RBDPersistentVolumeSource,
    SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use rbd_csi::volume::VolumeId;
use rbd_volume::ClusterRef;

use crate::backend::params::{Parameters, PvSource};

/// Annotation naming the Ceph user whose key is in the deletion secret (delete needs it
/// without the StorageClass).
pub const ANN_ADMIN_ID: &str = "provisioner.ceph.com/admin-id";
/// The old provisioner's annotation, kept for tools that look for it.
pub const ANN_LEGACY_IDENTITY: &str = "rbdProvisionerIdentity";
/// Annotation naming the cluster of the cluster config (`clusterID`) the volume was made on:
/// delete, expand and modify look its monitors up again, so edited monitors strand nothing.
pub const ANN_CLUSTER_ID: &str = "provisioner.ceph.com/cluster-id";
/// CSI volume attribute naming the cluster (ceph-csi's name for it).
pub const ATTR_CLUSTER_ID: &str = "clusterID";
/// CSI volume attribute naming the RADOS namespace (ceph-csi's name for it).
pub const ATTR_NAMESPACE: &str = "radosNamespace";

/// What the PV is built from.
#[derive(Clone, Debug)]
pub struct VolumeInputs<'a> {
    pub params: &'a Parameters,
    pub claim: &'a PersistentVolumeClaim,
    /// Monitors as they go into the PV (as the class gave them, or as the cluster config said
    /// when the volume was made).
    pub monitors: String,
    /// The class's `clusterID`, recorded on the PV.
    pub cluster_id: Option<&'a str>,
    /// The pool the image is in (the class's, or the one `topologyConstrainedPools` chose).
    pub pool: &'a str,
    /// RADOS namespace (empty: the default one); CSI PVs only.
    pub namespace: &'a str,
    /// Node label keys and values the PV is restricted to (`nodeAffinity`), from the topology
    /// segments of the chosen pool.
    pub node_affinity: Option<&'a BTreeMap<String, String>>,
    pub image: String,
    pub size_bytes: u64,
    pub source: PvSource,
    pub csi_driver: &'a str,
    pub identity: &'a str,
    /// An encrypted volume's settings, for the node (CSI PVs only).
    pub encryption: Option<&'a rbd_volume::encryption::Encryption>,
}

/// The CSI volume handle of a volume made here: its cluster (the class's `clusterID`, else its
/// monitors), pool, RADOS namespace and image.
///
/// # Errors
/// A name the handle cannot carry.
pub fn csi_handle(
    cluster_id: Option<&str>,
    monitors: &str,
    pool: &str,
    namespace: &str,
    image: &str,
) -> Result<String, String> {
    let cluster = match cluster_id {
        Some(id) => ClusterRef::Named(id.to_string()),
        None => ClusterRef::Monitors(monitors.to_string()),
    };
    VolumeId::located(cluster, pool, namespace, image)
        .encode()
        .map_err(|e| e.to_string())
}

/// The namespace of the user secret: the class's, else the claim's (as the old provisioner).
pub fn user_secret_namespace(params: &Parameters, claim: &PersistentVolumeClaim) -> String {
    params
        .user_secret_namespace
        .clone()
        .or_else(|| claim.metadata.namespace.clone())
        .unwrap_or_else(|| "default".into())
}

/// Why an encrypted class cannot make an in-tree `rbd` PV.
pub fn encryption_needs_csi() -> String {
    format!(
        "StorageClass parameter {:?}: encrypted volumes need CSI PVs (pvSource \"csi\", or \
         --pv-source=csi, or the CSIDriver object installed with --pv-source=auto): an in-tree \
         rbd PV cannot carry encryption, and the kubelet's in-tree plugin would mount the \
         ciphertext",
        rbd_volume::encryption::PARAM_ENCRYPTED
    )
}

/// Why a volume in RADOS namespace `namespace` cannot get an in-tree `rbd` PV.
pub fn namespace_needs_csi(namespace: &str) -> String {
    format!(
        "StorageClass parameter \"radosNamespace\": in-tree rbd PVs cannot name a RADOS namespace \
         (Kubernetes' RBDPersistentVolumeSource has no field for it); use pvSource: csi for \
         namespace {namespace:?}"
    )
}

/// Builds the PV the library will finish and save.
pub fn build_volume(inputs: &VolumeInputs<'_>) -> Result<PersistentVolume, String> {
    let p = inputs.params;
    let claim_spec = inputs.claim.spec.clone().unwrap_or_default();
    let user_secret = p.user_secret_name.as_ref().map(|name| SecretReference {
        name: Some(name.clone()),
        namespace: Some(user_secret_namespace(p, inputs.claim)),
    });
    let mut spec = PersistentVolumeSpec {
        capacity: Some(BTreeMap::from([(
            "storage".to_string(),
            Quantity(format!("{}Mi", inputs.size_bytes >> 20)),
        )])),
        access_modes: claim_spec.access_modes.clone(),
        volume_mode: claim_spec.volume_mode.clone(),
        ..Default::default()
    };
    match inputs.source {
        PvSource::InTree if !inputs.namespace.is_empty() => {
            return Err(namespace_needs_csi(inputs.namespace));
        }
        PvSource::InTree if inputs.encryption.is_some() => {
            return Err(encryption_needs_csi());
        }
        PvSource::InTree => {
            spec.rbd = Some(RBDPersistentVolumeSource {
                monitors: inputs.monitors.split(',').map(str::to_string).collect(),
                image: inputs.image.clone(),
                pool: Some(inputs.pool.to_string()),
                fs_type: p.fs_type.clone(),
                user: Some(p.user_id.clone()),
                secret_ref: user_secret,
                ..Default::default()
            });
        }
        PvSource::Csi => {
            let handle = csi_handle(
                inputs.cluster_id,
                &inputs.monitors,
                inputs.pool,
                inputs.namespace,
                &inputs.image,
            )?;
            use rbd_csi::volume::context;
            let mut attributes = BTreeMap::from([
                (context::MONITORS.to_string(), inputs.monitors.clone()),
                (context::POOL.to_string(), inputs.pool.to_string()),
                (context::IMAGE.to_string(), inputs.image.clone()),
                (context::USER.to_string(), p.user_id.clone()),
            ]);
            if let Some(m) = &p.mounter {
                attributes.insert(context::MOUNTER.to_string(), m.clone());
            }
            if let Some(id) = inputs.cluster_id {
                attributes.insert(ATTR_CLUSTER_ID.to_string(), id.to_string());
            }
            if !inputs.namespace.is_empty() {
                attributes.insert(ATTR_NAMESPACE.to_string(), inputs.namespace.to_string());
            }
            if let Some(enc) = inputs.encryption {
                attributes.extend(rbd_volume::encryption::context(enc));
            }
            let admin_secret = SecretReference {
                name: Some(p.admin_secret_name.clone()),
                namespace: Some(p.admin_secret_namespace.clone()),
            };
            spec.csi = Some(CSIPersistentVolumeSource {
                driver: inputs.csi_driver.to_string(),
                volume_handle: handle,
                fs_type: p.fs_type.clone(),
                volume_attributes: Some(attributes),
                node_stage_secret_ref: user_secret,
                controller_expand_secret_ref: Some(admin_secret.clone()),
                // ControllerPublishVolume records the node on the image with this key
                controller_publish_secret_ref: Some(admin_secret),
                ..Default::default()
            });
        }
    }
    spec.node_affinity = inputs.node_affinity.map(node_affinity);
    let mut annotations = BTreeMap::from([
        (ANN_ADMIN_ID.to_string(), p.admin_id.clone()),
        (ANN_LEGACY_IDENTITY.to_string(), inputs.identity.to_string()),
    ]);
    if let Some(id) = inputs.cluster_id {
        annotations.insert(ANN_CLUSTER_ID.to_string(), id.to_string());
    }
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    })
}

/// A required node affinity: one term matching every label key to its value.
fn node_affinity(labels: &BTreeMap<String, String>) -> VolumeNodeAffinity {
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(
                    labels
                        .iter()
                        .map(|(key, value)| NodeSelectorRequirement {
                            key: key.clone(),
                            operator: "In".into(),
                            values: Some(vec![value.clone()]),
                        })
                        .collect(),
                ),
                ..Default::default()
            }],
        }),
    }
}

/// Where a PV's image lives, read back from its source (for delete and expand).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageLocation {
    /// The cluster: the monitors the PV records, or the `clusterID` it was made through (its
    /// monitors are looked up in the cluster config at use time, so edited monitors strand
    /// nothing).
    pub cluster: ClusterRef,
    pub pool: String,
    /// RADOS namespace; empty for the default one.
    pub namespace: String,
    pub image: String,
}

impl ImageLocation {
    /// `pool` or `pool/namespace`, what the volume core's calls take.
    pub fn pool_spec(&self) -> String {
        ceph_rbd::pool_spec(&self.pool, &self.namespace)
    }

    /// The CSI volume ID of this image.
    pub fn volume_id(&self) -> VolumeId {
        VolumeId::located(
            self.cluster.clone(),
            &self.pool,
            &self.namespace,
            &self.image,
        )
    }
}

/// Reads the image location from an in-tree `rbd` source, or a `csi` source of `csi_driver`.
pub fn image_location(volume: &PersistentVolume, csi_driver: &str) -> Option<ImageLocation> {
    let spec = volume.spec.as_ref()?;
    if let Some(rbd) = &spec.rbd {
        let cluster_id = volume
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_CLUSTER_ID));
        return Some(ImageLocation {
            cluster: match cluster_id {
                Some(id) => ClusterRef::Named(id.clone()),
                None => ClusterRef::Monitors(rbd.monitors.join(",")),
            },
            pool: rbd.pool.clone().unwrap_or_else(|| "rbd".into()),
            namespace: String::new(),
            image: rbd.image.clone(),
        });
    }
    let csi = spec.csi.as_ref().filter(|c| c.driver == csi_driver)?;
    let id = VolumeId::parse(&csi.volume_handle).ok()?;
    Some(ImageLocation {
        cluster: id.cluster,
        pool: id.pool,
        namespace: id.namespace,
        image: id.image,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

    fn params(extra: &[(&str, &str)]) -> Parameters {
        let mut m: BTreeMap<String, String> = [
            ("monitors", "10.0.0.1:6789"),
            ("adminSecretName", "admin-secret"),
            ("userSecretName", "user-secret"),
            ("userId", "kube"),
            ("fsType", "xfs"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        m.insert("pool".into(), "kube".into());
        Parameters::parse(&m).unwrap()
    }

    fn claim() -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("apps".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn inputs<'a>(
        p: &'a Parameters,
        c: &'a PersistentVolumeClaim,
        source: PvSource,
    ) -> VolumeInputs<'a> {
        VolumeInputs {
            params: p,
            claim: c,
            monitors: p.monitors_string(),
            cluster_id: None,
            pool: &p.pool,
            namespace: "",
            node_affinity: None,
            image: "kubernetes-dynamic-pvc-abc".into(),
            size_bytes: 1 << 30,
            source,
            csi_driver: "rbd.provisioner.ceph.io",
            identity: "ceph.com/rbd",
            encryption: None,
        }
    }

    #[test]
    fn in_tree_volumes_carry_what_the_old_provisioner_set() {
        let (p, c) = (params(&[]), claim());
        let pv = build_volume(&inputs(&p, &c, PvSource::InTree)).unwrap();
        let spec = pv.spec.unwrap();
        let rbd = spec.rbd.unwrap();
        assert_eq!(rbd.monitors, vec!["10.0.0.1:6789"]);
        assert_eq!(rbd.image, "kubernetes-dynamic-pvc-abc");
        assert_eq!(rbd.pool.as_deref(), Some("kube"));
        assert_eq!(rbd.fs_type.as_deref(), Some("xfs"));
        assert_eq!(rbd.user.as_deref(), Some("kube"));
        let secret = rbd.secret_ref.unwrap();
        // user secret namespace defaults to the claim's
        assert_eq!(
            (secret.name.as_deref(), secret.namespace.as_deref()),
            (Some("user-secret"), Some("apps"))
        );
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1024Mi");
        assert_eq!(spec.access_modes.unwrap(), vec!["ReadWriteOnce"]);
        assert!(spec.csi.is_none());
        let ann = pv.metadata.annotations.unwrap();
        assert_eq!(ann[ANN_ADMIN_ID], "admin");
        assert_eq!(ann[ANN_LEGACY_IDENTITY], "ceph.com/rbd");
    }

    #[test]
    fn encrypted_volumes_tell_the_node_their_kms_entry_and_tenant_and_need_csi() {
        let (p, c) = (params(&[]), claim());
        let encryption = rbd_volume::encryption::Encryption {
            kms_id: "per-volume".into(),
            tenant: Some("team-a".into()),
        };
        let mut csi = inputs(&p, &c, PvSource::Csi);
        csi.encryption = Some(&encryption);
        let pv = build_volume(&csi).unwrap();
        let attributes = pv.spec.unwrap().csi.unwrap().volume_attributes.unwrap();
        for (key, value) in rbd_volume::encryption::context(&encryption) {
            assert_eq!(attributes.get(&key), Some(&value), "{key}");
        }
        let mut in_tree = inputs(&p, &c, PvSource::InTree);
        in_tree.encryption = Some(&encryption);
        let e = build_volume(&in_tree).unwrap_err();
        assert!(e.contains("encrypted volumes need CSI PVs"), "{e}");
    }

    #[test]
    fn csi_volumes_have_a_stable_handle_and_node_attributes() {
        let (p, c) = (params(&[("mounter", "fuse")]), claim());
        let pv = build_volume(&inputs(&p, &c, PvSource::Csi)).unwrap();
        let csi = pv.spec.as_ref().unwrap().csi.clone().unwrap();
        assert_eq!(csi.driver, "rbd.provisioner.ceph.io");
        assert_eq!(
            csi.volume_handle,
            "v1/10.0.0.1:6789/kube/kubernetes-dynamic-pvc-abc"
        );
        let attrs = csi.volume_attributes.unwrap();
        assert_eq!(attrs["pool"], "kube");
        assert_eq!(attrs["imageName"], "kubernetes-dynamic-pvc-abc");
        assert_eq!(attrs["userID"], "kube");
        assert_eq!(attrs["mounter"], "fuse");
        assert_eq!(
            csi.node_stage_secret_ref.unwrap().name.as_deref(),
            Some("user-secret")
        );
        assert_eq!(
            csi.controller_expand_secret_ref.unwrap().name.as_deref(),
            Some("admin-secret")
        );
        assert_eq!(
            csi.controller_publish_secret_ref.unwrap().name.as_deref(),
            Some("admin-secret")
        );
        assert_eq!(
            image_location(&pv, "rbd.provisioner.ceph.io")
                .unwrap()
                .image,
            "kubernetes-dynamic-pvc-abc"
        );
        assert_eq!(image_location(&pv, "other.driver"), None);
    }

    #[test]
    fn cluster_names_namespaces_and_affinity_reach_the_pv_and_read_back() {
        let (p, c) = (params(&[]), claim());
        let zone = BTreeMap::from([("topology.kubernetes.io/zone".to_string(), "b".to_string())]);
        let mut i = inputs(&p, &c, PvSource::InTree);
        i.cluster_id = Some("site-b");
        i.node_affinity = Some(&zone);
        let pv = build_volume(&i).unwrap();
        assert_eq!(
            pv.metadata.annotations.as_ref().unwrap()[ANN_CLUSTER_ID],
            "site-b"
        );
        let term = &pv
            .spec
            .as_ref()
            .unwrap()
            .node_affinity
            .clone()
            .unwrap()
            .required
            .unwrap()
            .node_selector_terms[0];
        let e = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (
                e.key.as_str(),
                e.operator.as_str(),
                e.values.clone().unwrap()
            ),
            ("topology.kubernetes.io/zone", "In", vec!["b".to_string()])
        );
        // in-tree: the monitors are in the PV, the cluster is looked up by name
        let loc = image_location(&pv, "x").unwrap();
        assert_eq!(loc.cluster, ClusterRef::Named("site-b".into()));

        i.namespace = "tenant-1";
        assert!(build_volume(&i).unwrap_err().contains("radosNamespace"));
        i.source = PvSource::Csi;
        let pv = build_volume(&i).unwrap();
        let csi = pv.spec.as_ref().unwrap().csi.clone().unwrap();
        assert_eq!(
            csi.volume_handle,
            "v2/site-b/kube/tenant-1/kubernetes-dynamic-pvc-abc"
        );
        let attrs = csi.volume_attributes.unwrap();
        assert_eq!(
            (
                attrs[ATTR_CLUSTER_ID].as_str(),
                attrs[ATTR_NAMESPACE].as_str()
            ),
            ("site-b", "tenant-1")
        );
        let loc = image_location(&pv, "rbd.provisioner.ceph.io").unwrap();
        assert_eq!(loc.pool_spec(), "kube/tenant-1");
        assert_eq!(loc.cluster, ClusterRef::Named("site-b".into()));
    }

    #[test]
    fn image_location_reads_in_tree_sources() {
        let (p, c) = (params(&[]), claim());
        let pv = build_volume(&inputs(&p, &c, PvSource::InTree)).unwrap();
        let loc = image_location(&pv, "x").unwrap();
        assert_eq!(
            loc,
            ImageLocation {
                cluster: ClusterRef::Monitors("10.0.0.1:6789".into()),
                pool: "kube".into(),
                namespace: String::new(),
                image: "kubernetes-dynamic-pvc-abc".into()
            }
        );
    }
}
