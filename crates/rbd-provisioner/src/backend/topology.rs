//! `topologyConstrainedPools` for the built-in provisioner: a pool per topology domain.
//!
//! The pool of the zone (or any other topology domain) of the node the scheduler selected, and
//! the PV's `nodeAffinity` to match.
//!
//! A node's topology is the values of its labels named by `--topology-labels` (the same flag
//! the CSI node service takes); a pool's `domainSegments` name domains, the last part of those
//! label keys (`topology.kubernetes.io/zone` -> `zone`). Pool selection is the volume core's
//! [`rbd_volume::topology::select_pool`].
//!
//! Immediate-binding classes have no selected node: as ceph-csi does without accessibility
//! requirements, the class's `pool` (and `dataPool`) is used and the PV gets no node affinity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use provisioner::ProvisionError;
use rbd_volume::topology::{PARAMETER, domain_of, select_pool};

use crate::backend::params::Parameters;

/// Where a volume goes when the class constrains pools by topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub pool: String,
    pub data_pool: Option<String>,
    /// Node label keys and values of the chosen pool's segments: the PV's `nodeAffinity`.
    pub node_labels: BTreeMap<String, String>,
}

/// The pool for `node` (the selected node of a WaitForFirstConsumer claim).
///
/// `Ok(None)`: the class has no `topologyConstrainedPools`, or there is no selected node
/// (Immediate binding): the class's `pool`.
///
/// # Errors
/// No `--topology-labels` (final); no pool fits the node: [`ProvisionError::Reschedule`], naming
/// the node and its topology labels.
pub fn place(
    params: &Parameters,
    node: Option<&Node>,
    topology_labels: &[String],
) -> Result<Option<Placement>, ProvisionError> {
    let (Some(pools), Some(node)) = (&params.topology_pools, node) else {
        return Ok(None);
    };
    if topology_labels.is_empty() {
        return Err(ProvisionError::final_error(format!(
            "StorageClass parameter {PARAMETER:?} needs the provisioner's --topology-labels (the \
             node label keys that make up a node's topology, e.g. topology.kubernetes.io/zone)"
        )));
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let topology: BTreeMap<String, String> = topology_labels
        .iter()
        .filter_map(|key| labels.get(key).map(|v| (key.clone(), v.clone())))
        .collect();
    let Some((pool, _)) = select_pool(pools, std::slice::from_ref(&topology)) else {
        let described: Vec<String> = topology_labels
            .iter()
            .map(|key| match labels.get(key) {
                Some(value) => format!("{key}={value}"),
                None => format!("{key} unset"),
            })
            .collect();
        return Err(ProvisionError::reschedule(format!(
            "no pool of StorageClass parameter {PARAMETER:?} serves node {name:?} (its topology \
             labels: {})",
            described.join(", ")
        )));
    };
    let node_labels = pool
        .segments
        .iter()
        .filter_map(|(domain, value)| {
            topology_labels
                .iter()
                .find(|key| domain_of(key) == domain)
                .map(|key| (key.clone(), value.clone()))
        })
        .collect();
    Ok(Some(Placement {
        pool: pool.pool.clone(),
        data_pool: pool.data_pool.clone(),
        node_labels,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const ZONE: &str = "topology.kubernetes.io/zone";

    fn params(pools: &str) -> Parameters {
        let raw: BTreeMap<String, String> = [
            ("monitors", "10.0.0.1:6789"),
            ("adminSecretName", "s"),
            ("pool", "fallback"),
            (PARAMETER, pools),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        Parameters::parse(&raw).unwrap()
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    const POOLS: &str = r#"[{"poolName": "pool-a", "domainSegments": [{"domainLabel": "zone", "value": "a"}]},
        {"poolName": "pool-b", "dataPoolName": "ec-b", "domainSegments": [{"domainLabel": "zone", "value": "b"}]}]"#;

    #[test]
    fn the_selected_nodes_zone_picks_the_pool_and_the_affinity() {
        let p = params(POOLS);
        let labels = vec![ZONE.to_string()];
        let placed = place(&p, Some(&node("n-b", &[(ZONE, "b")])), &labels)
            .unwrap()
            .unwrap();
        assert_eq!(placed.pool, "pool-b");
        assert_eq!(placed.data_pool.as_deref(), Some("ec-b"));
        assert_eq!(
            placed.node_labels,
            BTreeMap::from([(ZONE.to_string(), "b".to_string())])
        );
        // Immediate binding: the class's pool
        assert_eq!(place(&p, None, &labels).unwrap(), None);
    }

    #[test]
    fn a_node_no_pool_serves_is_rescheduled_naming_it_and_its_labels() {
        let p = params(POOLS);
        let labels = vec![ZONE.to_string()];
        for n in [node("n-c", &[(ZONE, "c")]), node("n-none", &[])] {
            match place(&p, Some(&n), &labels) {
                Err(ProvisionError::Reschedule(e)) => {
                    let e = e.to_string();
                    assert!(e.contains(n.metadata.name.as_deref().unwrap()), "{e}");
                    assert!(e.contains(ZONE), "{e}");
                }
                other => panic!("{other:?}"),
            }
        }
        match place(&p, Some(&node("n-a", &[(ZONE, "a")])), &[]) {
            Err(ProvisionError::Final(e)) => assert!(e.to_string().contains("--topology-labels")),
            other => panic!("{other:?}"),
        }
    }
}
