//! Where `CreateVolume` puts a volume: cluster, pool, RADOS namespace and, with
//! `topologyConstrainedPools`, the pool of the topology the CO asks for (pure: no I/O).
//!
//! - **Namespace**: `radosNamespace` if given, else the cluster config entry's
//!   `rbd.radosNamespace` (a `clusterID` class), else the pool's default namespace.
//! - **Topology** (ceph-csi's rules): the first pool of `topologyConstrainedPools` whose every
//!   domain segment matches one of the `accessibility_requirements`' preferred topologies (in
//!   order), then one of the requisite ones. Its `dataPool` (or none) replaces the class's, as in
//!   ceph-csi. No requirements at all: the class's `pool` (as ceph-csi). Requirements that no pool fits: `RESOURCE_EXHAUSTED`
//!   naming the topologies, which the external-provisioner turns into a reschedule of a
//!   `WaitForFirstConsumer` claim (its `checkError`: `ResourceExhausted` with a selected node).
//! - The volume's `accessible_topology` is the chosen pool's segments under
//!   `topology.<driver name>/<domain>`, the keys the node plugins report: every node the pool
//!   serves (ceph-csi returns the whole requested topology instead, e.g. zone and rack for a
//!   per-zone pool, which pins the volume to fewer nodes than can use it).

use std::collections::BTreeMap;

use rbd_volume::clusters::{ClusterInfo, ClusterRef};
use rbd_volume::topology::select_pool;
use tonic::Status;

use super::CreateParams;
use crate::proto::csi;

/// The volume's place.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub cluster: ClusterRef,
    pub pool: String,
    /// Empty: the default namespace.
    pub namespace: String,
    pub data_pool: Option<String>,
    /// `accessible_topology` of the volume (empty without topology).
    pub topology: Vec<csi::Topology>,
}

impl Placement {
    /// `pool` or `pool/namespace`, what the volume core takes.
    #[must_use]
    pub fn pool_spec(&self) -> String {
        ceph_rbd::pool_spec(&self.pool, &self.namespace)
    }
}

/// The topology key prefix of `driver`: `topology.<driver>`.
#[must_use]
pub fn topology_prefix(driver: &str) -> String {
    format!("topology.{driver}")
}

fn segments_of(topology: &[csi::Topology]) -> Vec<BTreeMap<String, String>> {
    topology
        .iter()
        .map(|t| {
            t.segments
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .collect()
}

/// Places a volume of `params` (`info`: its cluster config entry, for a `clusterID` class).
///
/// # Errors
/// `INVALID_ARGUMENT` for a malformed namespace from the cluster config, `RESOURCE_EXHAUSTED`
/// when no pool fits the requirements.
pub fn place(
    params: &CreateParams,
    info: Option<&ClusterInfo>,
    requirements: Option<&csi::TopologyRequirement>,
    driver: &str,
) -> Result<Placement, Status> {
    let namespace = match (
        &params.namespace,
        info.and_then(|i| i.rados_namespace.as_ref()),
    ) {
        (Some(given), _) => given.clone(),
        (None, Some(default)) => {
            crate::validate::namespace("cluster config rbd.radosNamespace", default)
                .map_err(Status::invalid_argument)?;
            default.clone()
        }
        (None, None) => String::new(),
    };
    let mut placement = Placement {
        cluster: params.cluster.clone(),
        pool: params.pool.clone(),
        namespace,
        data_pool: params.data_pool.clone(),
        topology: Vec::new(),
    };
    let (Some(pools), Some(requirements)) = (&params.topology_pools, requirements) else {
        return Ok(placement);
    };
    let mut wanted = segments_of(&requirements.preferred);
    wanted.extend(segments_of(&requirements.requisite));
    if wanted.is_empty() {
        return Ok(placement);
    }
    let Some((pool, _)) = select_pool(pools, &wanted) else {
        let asked: Vec<String> = wanted
            .iter()
            .map(|t| {
                let pairs: Vec<String> = t.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{{{}}}", pairs.join(","))
            })
            .collect();
        return Err(Status::resource_exhausted(format!(
            "parameters.topologyConstrainedPools has no pool for the requested topology {} \
             (accessibility_requirements); the claim can be scheduled elsewhere",
            asked.join(" or ")
        )));
    };
    let prefix = topology_prefix(driver);
    placement.pool.clone_from(&pool.pool);
    placement.data_pool.clone_from(&pool.data_pool);
    placement.topology = vec![csi::Topology {
        segments: pool
            .segments
            .iter()
            .map(|(domain, value)| (format!("{prefix}/{domain}"), value.clone()))
            .collect(),
    }];
    Ok(placement)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::controller::create_params;

    const DRIVER: &str = "rbd.provisioner.ceph.io";

    fn params(pairs: &[(&str, &str)]) -> CreateParams {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        create_params(&map, Some("m:1")).unwrap()
    }

    fn topology(pairs: &[(&str, &str)]) -> csi::Topology {
        csi::Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        }
    }

    const POOLS: &str = r#"[{"poolName":"rbd-a","dataPool":"ec-a","domainSegments":[{"domainLabel":"zone","value":"a"}]},
        {"poolName":"rbd-b","domainSegments":[{"domainLabel":"zone","value":"b"}]}]"#;

    #[test]
    fn the_namespace_comes_from_the_class_then_the_cluster_config() {
        let info = ClusterInfo {
            monitors: vec!["m:1".into()],
            rados_namespace: Some("tenant".into()),
        };
        let p = params(&[("clusterID", "site-a")]);
        assert_eq!(
            place(&p, Some(&info), None, DRIVER).unwrap().pool_spec(),
            "rbd/tenant"
        );
        let p = params(&[("clusterID", "site-a"), ("radosNamespace", "other")]);
        assert_eq!(
            place(&p, Some(&info), None, DRIVER).unwrap().pool_spec(),
            "rbd/other"
        );
        let p = params(&[("clusterID", "site-a"), ("radosNamespace", "")]);
        assert_eq!(
            place(&p, Some(&info), None, DRIVER).unwrap().pool_spec(),
            "rbd"
        );
        assert_eq!(
            place(&params(&[]), None, None, DRIVER).unwrap().pool_spec(),
            "rbd"
        );
    }

    #[test]
    fn topology_picks_the_preferred_pool_then_a_requisite_one() {
        let p = params(&[("topologyConstrainedPools", POOLS), ("dataPool", "ec")]);
        let key = format!("topology.{DRIVER}/zone");
        let req = csi::TopologyRequirement {
            requisite: vec![topology(&[(&key, "a")]), topology(&[(&key, "b")])],
            preferred: vec![topology(&[(&key, "b")])],
        };
        let placed = place(&p, None, Some(&req), DRIVER).unwrap();
        assert_eq!(
            (placed.pool.as_str(), placed.data_pool.as_deref()),
            ("rbd-b", None)
        );
        assert_eq!(placed.topology, vec![topology(&[(&key, "b")])]);
        let req = csi::TopologyRequirement {
            requisite: vec![topology(&[(&key, "c")]), topology(&[(&key, "a")])],
            preferred: Vec::new(),
        };
        let placed = place(&p, None, Some(&req), DRIVER).unwrap();
        assert_eq!(
            (placed.pool.as_str(), placed.data_pool.as_deref()),
            ("rbd-a", Some("ec-a"))
        );
    }

    #[test]
    fn no_fitting_pool_is_resource_exhausted_naming_the_topology() {
        let p = params(&[("topologyConstrainedPools", POOLS)]);
        let key = format!("topology.{DRIVER}/zone");
        let req = csi::TopologyRequirement {
            requisite: vec![topology(&[(&key, "c")])],
            preferred: Vec::new(),
        };
        let e = place(&p, None, Some(&req), DRIVER).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("zone=c"), "{}", e.message());
        // without requirements, the class's pool (ceph-csi does the same)
        assert_eq!(place(&p, None, None, DRIVER).unwrap().pool, "rbd");
    }
}
