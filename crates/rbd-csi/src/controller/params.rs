//! `CreateVolume` parameters and controller secrets (pure: no I/O).
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `monitors` | `CsiConfig::default_monitors` | comma-separated `host:port` list; give this or `clusterID` |
//! | `clusterID` | none | a cluster of the cluster config (`--cluster-config`); its monitors are looked up at use time |
//! | `pool` | `rbd` | pool for the image |
//! | `radosNamespace` | the cluster config entry's `rbd.radosNamespace`, else none | RADOS namespace for the image (must exist) |
//! | `topologyConstrainedPools` | none | ceph-csi's JSON list of pools per topology domain; the pool is picked from `accessibility_requirements` |
//! | `dataPool` | none | erasure-coded data pool |
//! | `imageFeatures` | librbd default | comma list (`layering,exclusive-lock,object-map,fast-diff,deep-flatten,journaling`) |
//! | `userID` / `userId` | none | Ceph user nodes map with (into `volume_context`; else the node-stage secret's `userID`) |
//! | `mounter` | node default | `rbd`/`krbd`, `rbd-nbd`, `fuse` (into `volume_context`) |
//! | `mapOptions` / `unmapOptions` | none | ceph-csi's `krbd:opt,opt;nbd:opt`, checked option by option ([`crate::mapper::options`]; into `volume_context`) |
//! | `csi.storage.k8s.io/fstype` | none | checked: `ext4` or `xfs` |
//! | other `csi.storage.k8s.io/*` | | ignored, except `pvc/name` + `pvc/namespace`, recorded as the owner claim |
//!
//! Any other key is an error (as in the `ceph.com/rbd` provisioner), so a typo cannot silently
//! produce a volume with the wrong settings. `monitors` and `clusterID` together are an error;
//! with neither, the controller's default monitors are used.
//!
//! Secrets: user from `userID` (or `adminId`/`adminID`; default `admin`), key from `userKey`
//! (or `key`, the in-tree plugin's secret key; or `adminKey`).

use std::collections::HashMap;

use rbd_volume::clusters::{ClusterRef, cluster_ref};
use rbd_volume::topology::{self, ConstrainedPool};
use tonic::Status;

use crate::fs::FsType;
use crate::mapper::{MounterKind, options};

/// What `CreateVolume`'s parameters ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateParams {
    /// The cluster: monitors (given or the default) or a `clusterID`.
    pub cluster: ClusterRef,
    pub pool: String,
    /// `radosNamespace` as given (`None`: the cluster config's default, else the default one).
    pub namespace: Option<String>,
    /// `topologyConstrainedPools`, replacing `pool`/`dataPool` by the pool of the topology.
    pub topology_pools: Option<Vec<ConstrainedPool>>,
    pub data_pool: Option<String>,
    /// Raw `imageFeatures` value (validated by `ceph_rbd::Features::parse`).
    pub image_features: Option<String>,
    pub node_user: Option<String>,
    pub mounter: Option<MounterKind>,
    /// `mapOptions` (ceph-csi's `krbd:opt,opt;nbd:opt`), checked, into `volume_context`.
    pub map_options: Option<String>,
    /// `unmapOptions`, likewise.
    pub unmap_options: Option<String>,
    /// `namespace/name` of the claim, when the external-provisioner passes it.
    pub claim: Option<String>,
    /// `encrypted: "true"` (with `encryptionType`, `encryptionKMSID`): an encrypted volume.
    pub encryption: Option<rbd_volume::encryption::Encryption>,
}

const CSI_PREFIX: &str = "csi.storage.k8s.io/";

/// Parses `CreateVolume` (or `GetCapacity`) parameters.
///
/// # Errors
/// `INVALID_ARGUMENT` naming the offending parameter.
pub fn create_params(
    parameters: &HashMap<String, String>,
    default_monitors: Option<&str>,
) -> Result<CreateParams, Status> {
    let mut params = CreateParams {
        cluster: ClusterRef::Monitors(String::new()),
        pool: "rbd".to_owned(),
        namespace: None,
        topology_pools: None,
        data_pool: None,
        image_features: None,
        node_user: None,
        mounter: None,
        map_options: None,
        unmap_options: None,
        claim: None,
        encryption: rbd_volume::encryption::parameters(parameters)
            .map_err(|e| Status::invalid_argument(format!("parameters: {e}")))?,
    };
    let mut monitors = None;
    let mut cluster_id = None;
    let mut claim_name = None;
    let mut claim_namespace = None;
    for (key, value) in parameters {
        let value = value.trim();
        match key.as_str() {
            "monitors" => monitors = Some(value),
            "clusterID" => cluster_id = Some(value),
            "pool" => {
                if !value.is_empty() {
                    value.clone_into(&mut params.pool);
                }
            }
            "radosNamespace" => params.namespace = Some(value.to_owned()),
            topology::PARAMETER => {
                params.topology_pools = Some(
                    topology::parse_constrained_pools(value)
                        .map_err(|e| Status::invalid_argument(format!("parameters.{e}")))?,
                );
            }
            "dataPool" => params.data_pool = Some(value.to_owned()).filter(|v| !v.is_empty()),
            "imageFeatures" => params.image_features = Some(value.to_owned()),
            "userID" | "userId" => {
                params.node_user = Some(value.to_owned()).filter(|v| !v.is_empty());
            }
            "mounter" => {
                params.mounter =
                    Some(MounterKind::parse(value).map_err(|e| {
                        Status::invalid_argument(format!("parameters.mounter: {e}"))
                    })?);
            }
            "mapOptions" | "unmapOptions" => {
                let which = if key == "mapOptions" {
                    options::Which::Map
                } else {
                    options::Which::Unmap
                };
                options::check_parameter(which, value)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                let slot = match which {
                    options::Which::Map => &mut params.map_options,
                    options::Which::Unmap => &mut params.unmap_options,
                };
                *slot = Some(value.to_owned()).filter(|v| !v.is_empty());
            }
            "csi.storage.k8s.io/fstype" => {
                FsType::parse(value)
                    .map_err(|e| Status::invalid_argument(format!("parameters.{key}: {e}")))?;
            }
            rbd_volume::encryption::PARAM_ENCRYPTED
            | rbd_volume::encryption::PARAM_TYPE
            | rbd_volume::encryption::PARAM_KMS_ID => {}
            "csi.storage.k8s.io/pvc/name" => claim_name = Some(value.to_owned()),
            "csi.storage.k8s.io/pvc/namespace" => claim_namespace = Some(value.to_owned()),
            other if other.starts_with(CSI_PREFIX) => {}
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown parameter {other:?} (known: monitors, clusterID, pool, \
                     radosNamespace, topologyConstrainedPools, dataPool, imageFeatures, userID, \
                     mounter, mapOptions, unmapOptions, encrypted, encryptionType, \
                     encryptionKMSID, csi.storage.k8s.io/*)"
                )));
            }
        }
    }
    if params.encryption.is_some() && params.mounter == Some(MounterKind::FuseLoop) {
        return Err(Status::invalid_argument(
            "parameters.encrypted: encrypted volumes need a block device for LUKS2 and the fuse \
             mounter has none; use mounter \"rbd\" or \"rbd-nbd\"",
        ));
    }
    let invalid = |message: String| Status::invalid_argument(message);
    params.cluster = match (monitors, cluster_id) {
        (None | Some(""), None) => ClusterRef::Monitors(
            default_monitors
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    Status::invalid_argument(
                        "parameters.monitors or parameters.clusterID is required (no default \
                         monitors configured)",
                    )
                })?
                .to_owned(),
        ),
        (m, id) => cluster_ref(m, id).map_err(|e| invalid(format!("parameters: {e}")))?,
    };
    // the node validates the same values when it stages the volume: refuse them here already,
    // before an image is made for a volume no node could use
    if let ClusterRef::Monitors(m) = &params.cluster {
        crate::validate::monitors("parameters.monitors", m).map_err(invalid)?;
        if m.contains('/') {
            // volume IDs are `v1/<monitors>/<pool>/<image>`
            return Err(invalid(format!(
                "parameters.monitors {m:?} may not contain '/' (give host[:port] addresses)"
            )));
        }
    }
    if let ClusterRef::Named(id) = &params.cluster {
        crate::validate::cluster_id("parameters.clusterID", id).map_err(invalid)?;
    }
    crate::validate::pool("parameters.pool", &params.pool).map_err(invalid)?;
    if let Some(namespace) = &params.namespace {
        crate::validate::namespace("parameters.radosNamespace", namespace).map_err(invalid)?;
    }
    for pool in params.topology_pools.iter().flatten() {
        crate::validate::pool("parameters.topologyConstrainedPools poolName", &pool.pool)
            .map_err(invalid)?;
        if let Some(data_pool) = &pool.data_pool {
            crate::validate::pool("parameters.topologyConstrainedPools dataPool", data_pool)
                .map_err(invalid)?;
        }
    }
    if let Some(data_pool) = &params.data_pool {
        crate::validate::pool("parameters.dataPool", data_pool).map_err(invalid)?;
    }
    if let Some(user) = &params.node_user {
        crate::validate::user("parameters.userID", user).map_err(invalid)?;
    }
    if let (Some(ns), Some(name)) = (claim_namespace, claim_name) {
        params.claim = Some(format!("{ns}/{name}"));
    }
    Ok(params)
}

/// Ceph user and key from a controller call's secrets.
///
/// # Errors
/// `INVALID_ARGUMENT` when no key is present.
pub fn credentials(secrets: &HashMap<String, String>) -> Result<(String, String), Status> {
    let first = |keys: &[&str]| {
        keys.iter()
            .filter_map(|k| secrets.get(*k))
            .find(|v| !v.is_empty())
            .cloned()
    };
    let user = first(&["userID", "adminId", "adminID"]).unwrap_or_else(|| "admin".to_owned());
    let key = first(&["userKey", "key", "adminKey"])
        .ok_or_else(|| Status::invalid_argument("secrets.userKey (or secrets.key) is required"))?;
    Ok((user, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn defaults_and_all_known_parameters() {
        let p = create_params(&HashMap::new(), Some("m:1")).unwrap();
        assert_eq!(p.cluster, ClusterRef::Monitors("m:1".into()));
        assert_eq!(p.pool, "rbd");
        let p = create_params(
            &map(&[
                ("monitors", "a:1,b:2"),
                ("pool", "kube"),
                ("dataPool", "ec"),
                ("imageFeatures", "layering"),
                ("userID", "kube"),
                ("mounter", "fuse"),
                ("csi.storage.k8s.io/fstype", "xfs"),
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "apps"),
                ("csi.storage.k8s.io/pv/name", "pvc-1"),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(p.cluster, ClusterRef::Monitors("a:1,b:2".into()));
        assert_eq!(p.pool, "kube");
        assert_eq!(p.data_pool.as_deref(), Some("ec"));
        assert_eq!(p.image_features.as_deref(), Some("layering"));
        assert_eq!(p.node_user.as_deref(), Some("kube"));
        assert_eq!(p.mounter, Some(MounterKind::FuseLoop));
        assert_eq!(p.claim.as_deref(), Some("apps/data"));
    }

    #[test]
    fn map_options_are_checked_and_kept_for_the_volume_context() {
        let p = create_params(
            &map(&[
                ("mapOptions", "krbd:ms_mode=secure;nbd:try-netlink"),
                ("unmapOptions", "krbd:force"),
            ]),
            Some("m:1"),
        )
        .unwrap();
        assert_eq!(
            p.map_options.as_deref(),
            Some("krbd:ms_mode=secure;nbd:try-netlink")
        );
        assert_eq!(p.unmap_options.as_deref(), Some("krbd:force"));
        let err = create_params(
            &map(&[("mapOptions", "krbd:queue_depth=8,bogus")]),
            Some("m"),
        )
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.message(),
            "parameters.mapOptions: unknown krbd map option \"bogus\""
        );
        let err = create_params(&map(&[("unmapOptions", "krbd:secret=x")]), Some("m")).unwrap_err();
        assert!(
            err.message()
                .starts_with("parameters.unmapOptions: option \"secret\"")
        );
    }

    #[test]
    fn unknown_parameters_missing_monitors_and_bad_values_are_rejected() {
        let err = create_params(&map(&[("pol", "x")]), Some("m:1")).unwrap_err();
        assert!(err.message().contains("\"pol\""));
        let err = create_params(&HashMap::new(), None).unwrap_err();
        assert!(err.message().contains("monitors"));
        assert!(create_params(&map(&[("mounter", "iscsi")]), Some("m")).is_err());
        assert!(create_params(&map(&[("csi.storage.k8s.io/fstype", "zfs")]), Some("m")).is_err());
    }

    /// What the node would refuse at stage is refused at create, naming the parameter.
    #[test]
    fn unsafe_pool_user_and_monitors_are_rejected_at_create() {
        for (key, value) in [
            ("pool", "../etc"),
            ("dataPool", "a b"),
            ("userID", "admin\nkey = x"),
            ("monitors", "10.0.0.1:6789\n[global]"),
            ("monitors", "v2:10.0.0.1:3300/0"),
        ] {
            let err = create_params(&map(&[(key, value)]), Some("m:1")).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{key}={value:?}");
            assert!(
                err.message().contains(&format!("parameters.{key}")),
                "{key}={value:?}: {}",
                err.message()
            );
        }
    }

    #[test]
    fn cluster_id_namespace_and_topology_parameters() {
        // clusterID instead of monitors, even with default monitors configured
        let p = create_params(
            &map(&[("clusterID", "site-a"), ("radosNamespace", "tenant-1")]),
            Some("m:1"),
        )
        .unwrap();
        assert_eq!(p.cluster, ClusterRef::Named("site-a".into()));
        assert_eq!(p.namespace.as_deref(), Some("tenant-1"));
        let p = create_params(
            &map(&[(
                "topologyConstrainedPools",
                r#"[{"poolName":"a","domainSegments":[{"domainLabel":"zone","value":"a"}]}]"#,
            )]),
            Some("m:1"),
        )
        .unwrap();
        assert_eq!(p.topology_pools.unwrap()[0].pool, "a");
        for (pairs, named) in [
            (&[("clusterID", "a"), ("monitors", "m:1")][..], "clusterID"),
            (&[("clusterID", "a/b")][..], "clusterID"),
            (&[("clusterID", "")][..], "clusterID"),
            (
                &[("radosNamespace", "../x")][..],
                "parameters.radosNamespace",
            ),
            (
                &[("topologyConstrainedPools", "[{")][..],
                "topologyConstrainedPools",
            ),
            (
                &[(
                    "topologyConstrainedPools",
                    r#"[{"poolName":"a b","domainSegments":[{"domainLabel":"zone","value":"a"}]}]"#,
                )][..],
                "topologyConstrainedPools",
            ),
        ] {
            let err = create_params(&map(pairs), Some("m:1")).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{pairs:?}");
            assert!(
                err.message().contains(named),
                "{pairs:?}: {}",
                err.message()
            );
        }
    }

    #[test]
    fn credentials_accept_csi_and_in_tree_keys() {
        assert_eq!(
            credentials(&map(&[("userID", "kube"), ("userKey", "K1")])).unwrap(),
            ("kube".into(), "K1".into())
        );
        assert_eq!(
            credentials(&map(&[("key", "K2")])).unwrap(),
            ("admin".into(), "K2".into())
        );
        assert_eq!(
            credentials(&map(&[("adminId", "boss"), ("key", "K3")])).unwrap(),
            ("boss".into(), "K3".into())
        );
        assert!(credentials(&map(&[("userID", "kube")])).is_err());
    }
}
