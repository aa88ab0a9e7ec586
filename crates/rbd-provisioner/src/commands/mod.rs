//! The operator commands: `rbd-provisioner gc`, `rbd-provisioner migrate` and
//! `rbd-provisioner dr`.

pub mod dr;
pub mod gc;
pub mod migrate;

/// The monitors (as the class, or the cluster config entry its `clusterID` names, gives them)
/// and the RADOS namespace (empty: the default one) of a class's parameters.
///
/// # Errors
/// A `clusterID` without `--cluster-config`, or one the cluster config does not have.
pub fn class_location(
    params: &crate::backend::params::Parameters,
    clusters: Option<&rbd_volume::ClusterConfigFile>,
) -> Result<(String, String), String> {
    let info = match &params.cluster_id {
        Some(id) => match clusters.map(|c| c.lookup(id)) {
            Some(Ok(info)) => Some(info),
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err(format!("it names clusterID {id:?}; give --cluster-config")),
        },
        None => None,
    };
    let monitors = match &info {
        Some(info) => info.monitor_list(),
        None => params.monitors_string(),
    };
    let namespace = params
        .rados_namespace
        .clone()
        .or_else(|| info.and_then(|i| i.rados_namespace))
        .unwrap_or_default();
    Ok((monitors, namespace))
}
