//! [`CsiConfig`]: what [`crate::serve`] serves and how. Every field has a documented default
//! ([`CsiConfig::default`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use rbd_volume::clusters::ClusterConfigFile;

use crate::mapper::MounterKind;
use crate::node::NodeConfig;
use crate::registration::RegistrationConfig;

/// Default CSI driver name.
///
/// Chosen so it cannot be confused with ceph-csi's `rbd.csi.ceph.com` (both drivers can be
/// installed side by side, and a PV's `spec.csi.driver` says unambiguously which one mounts it),
/// while naming the product (`rbd-provisioner`, successor of `ceph.com/rbd`) in DNS-name form as
/// the CSI spec requires (at most 63 characters, alphanumerics, `-` and `.`).
pub const DEFAULT_DRIVER_NAME: &str = "rbd.provisioner.ceph.io";

/// Which CSI services one process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Services {
    /// Identity + Controller (the Deployment).
    Controller,
    /// Identity + Node (the per-node `DaemonSet`).
    Node,
    /// Identity + Controller + Node (single-node setups, tests).
    #[default]
    All,
}

impl Services {
    /// Parses `controller`, `node` or `all`.
    ///
    /// # Errors
    /// A message naming the unknown value.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "controller" => Ok(Self::Controller),
            "node" => Ok(Self::Node),
            "all" => Ok(Self::All),
            other => Err(format!(
                "unknown CSI service set {other:?} (expected controller, node or all)"
            )),
        }
    }

    #[must_use]
    pub fn controller(self) -> bool {
        matches!(self, Self::Controller | Self::All)
    }

    #[must_use]
    pub fn node(self) -> bool {
        matches!(self, Self::Node | Self::All)
    }
}

/// A Ceph cluster Probe checks (Identity `Probe` reports ready only while it is reachable).
#[derive(Clone, PartialEq, Eq)]
pub struct ProbeCluster {
    /// Comma-separated `host:port` monitor list.
    pub monitors: String,
    /// Ceph user id without `client.`.
    pub user: String,
    /// The user's key.
    pub key: String,
}

impl std::fmt::Debug for ProbeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeCluster")
            .field("monitors", &self.monitors)
            .field("user", &self.user)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// Configuration of the CSI server.
#[derive(Debug, Clone)]
pub struct CsiConfig {
    /// Unix socket the CSI services listen on (a stale socket file is replaced).
    /// Default `/csi/csi.sock`.
    pub endpoint: PathBuf,
    /// Driver name (`GetPluginInfo`, kubelet registration, image owner metadata).
    /// Default [`DEFAULT_DRIVER_NAME`].
    pub driver_name: String,
    /// Services to serve. Default [`Services::All`].
    pub services: Services,
    /// Node ID reported by `NodeGetInfo` (the Kubernetes node name). Default: the host name.
    pub node_id: String,
    /// Mapper for volumes whose `mounter` attribute is unset. Default [`MounterKind::Krbd`].
    pub default_mounter: MounterKind,
    /// Private runtime directory (key files, rbd-fuse instances); must be on tmpfs in
    /// production so keys never reach a disk. Default `/run/rbd-csi`.
    pub runtime_dir: PathBuf,
    /// Extra `rbd map -o` options for krbd. Default none.
    pub krbd_map_options: Option<String>,
    /// `NodeGetInfo` `max_volumes_per_node`; 0 = unlimited. Default 0.
    pub max_volumes_per_node: i64,
    /// Kubelet plugin registration (node service only). Default `None` (not registering).
    pub registration: Option<RegistrationConfig>,
    /// Cluster checked by Probe. Default `None` (Probe always ready).
    pub probe: Option<ProbeCluster>,
    /// Monitors used by CreateVolume/GetCapacity when the parameters name none. Default `None`
    /// (the `monitors` parameter is then required).
    pub default_monitors: Option<String>,
    /// The cluster config (ceph-csi's `config.json`: `clusterID` to monitors and a default
    /// `radosNamespace`), re-read when it changes; the controller resolves `clusterID` parameters
    /// and IDs with it, the node the `clusterID` of the volumes it stages. Default `None`.
    pub cluster_config: Option<Arc<ClusterConfigFile>>,
    /// Node labels whose values are the node's topology (`--topology-labels`). Non-empty: the
    /// plugin advertises `VOLUME_ACCESSIBILITY_CONSTRAINTS` (so the external-provisioner passes
    /// `accessibility_requirements`). Default none (no topology).
    pub topology_labels: Vec<String>,
    /// This node's topology as `NodeGetInfo` reports it: `topology.<driver name>/<domain>` to the
    /// node's value of each of `topology_labels` ([`rbd_volume::topology::node_topology`]).
    /// Default empty.
    pub node_topology: BTreeMap<String, String>,
    /// The Kubernetes cluster's identity, recorded on every image, snapshot image and clone
    /// intermediate the controller makes and compared by its deletes (an image recorded for
    /// another Kubernetes cluster is refused). Default empty: not recorded, not compared.
    pub kube_cluster: String,
    /// Cgroup directories the rbd-fuse and rbd-nbd daemons are started in (host cgroups, so a
    /// restart of the plugin's container does not kill them; [`crate::mapper::daemon`]), used as
    /// they are: give what [`crate::mapper::daemon::DaemonPlacement::resolve`] made of the
    /// configured ones. Default none: the daemons only get a session of their own.
    pub daemon_cgroups: Vec<PathBuf>,
    /// The KMS configuration of encrypted volumes (ceph-csi's `config.json` of the `ConfigMap`
    /// `ceph-csi-encryption-kms-config`), read when an encrypted volume is created or staged.
    /// Default [`rbd_volume::encryption::DEFAULT_KMS_CONFIG`].
    pub kms_config: PathBuf,
    /// Kubernetes Secrets, for the KMS entries that keep keys in Secrets or wrap them with one
    /// (read by the controller and the node). Default none: such entries are refused.
    pub secrets: Option<std::sync::Arc<dyn rbd_volume::encryption::secrets::SecretStore>>,
}

impl Default for CsiConfig {
    fn default() -> Self {
        Self {
            endpoint: PathBuf::from("/csi/csi.sock"),
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            services: Services::All,
            node_id: hostname(),
            default_mounter: MounterKind::Krbd,
            runtime_dir: PathBuf::from("/run/rbd-csi"),
            krbd_map_options: None,
            max_volumes_per_node: 0,
            registration: None,
            probe: None,
            default_monitors: None,
            cluster_config: None,
            topology_labels: Vec::new(),
            daemon_cgroups: Vec::new(),
            node_topology: BTreeMap::new(),
            kube_cluster: String::new(),
            kms_config: PathBuf::from(rbd_volume::encryption::DEFAULT_KMS_CONFIG),
            secrets: None,
        }
    }
}

impl CsiConfig {
    /// Checks what the CSI spec and the kubelet require of the configuration.
    ///
    /// # Errors
    /// A message naming the offending setting: a driver name that is not a DNS-style name of at
    /// most 63 characters, or an empty node ID when the node service runs.
    pub fn validate(&self) -> Result<(), String> {
        let name = &self.driver_name;
        let valid_chars = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        let alnum_ends = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
            && name
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric());
        if name.is_empty() || name.len() > 63 || !valid_chars || !alnum_ends {
            return Err(format!(
                "driver name {name:?} must be 1-63 characters of [a-zA-Z0-9.-], starting and \
                 ending with an alphanumeric"
            ));
        }
        if self.services.node() && self.node_id.trim().is_empty() {
            return Err("node_id must not be empty when the node service runs".to_owned());
        }
        Ok(())
    }

    /// The node service's part of the configuration.
    #[must_use]
    pub fn node_config(&self) -> NodeConfig {
        NodeConfig {
            node_id: self.node_id.clone(),
            default_mounter: self.default_mounter,
            runtime_dir: self.runtime_dir.clone(),
            krbd_map_options: self.krbd_map_options.clone(),
            max_volumes_per_node: self.max_volumes_per_node,
            cluster_config: self.cluster_config.clone(),
            topology: self.node_topology.clone(),
            daemons: crate::mapper::daemon::DaemonPlacement::in_cgroups(
                self.daemon_cgroups.clone(),
            ),
            kms_config: self.kms_config.clone(),
            secrets: self.secrets.clone(),
        }
    }
}

/// This machine's host name (`uname -n`), `localhost` if unavailable.
#[must_use]
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_documented_values() {
        let c = CsiConfig::default();
        assert_eq!(c.endpoint, PathBuf::from("/csi/csi.sock"));
        assert_eq!(c.driver_name, "rbd.provisioner.ceph.io");
        assert_eq!(c.services, Services::All);
        assert_eq!(c.default_mounter, MounterKind::Krbd);
        assert!(!c.node_id.is_empty());
    }

    #[test]
    fn validation_checks_driver_name_and_node_id() {
        assert!(CsiConfig::default().validate().is_ok());
        for bad in ["", "-rbd", "rbd.", "rbd_csi", &"a".repeat(64)] {
            let c = CsiConfig {
                driver_name: bad.to_owned(),
                ..CsiConfig::default()
            };
            assert!(c.validate().is_err(), "{bad:?}");
        }
        let c = CsiConfig {
            node_id: String::new(),
            ..CsiConfig::default()
        };
        assert!(c.validate().unwrap_err().contains("node_id"));
        let controller_only = CsiConfig {
            node_id: String::new(),
            services: Services::Controller,
            ..CsiConfig::default()
        };
        assert!(controller_only.validate().is_ok());
    }

    #[test]
    fn services_parse() {
        assert!(Services::parse("controller").unwrap().controller());
        assert!(!Services::parse("node").unwrap().controller());
        assert!(Services::parse("all").unwrap().node());
        assert!(Services::parse("both").is_err());
    }

    #[test]
    fn probe_cluster_debug_hides_key() {
        let p = ProbeCluster {
            monitors: "m".into(),
            user: "u".into(),
            key: "AQBsecret".into(),
        };
        assert!(!format!("{p:?}").contains("AQB"));
    }
}
