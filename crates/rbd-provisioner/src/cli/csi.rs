//! `rbd-provisioner csi`: the CSI driver services.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::core::v1::Node;
use rbd_csi::{CsiConfig, MounterKind, ProbeCluster, RegistrationConfig, Services};
use rbd_volume::clusters::{ClusterConfigFile, DEFAULT_PATH};
use rbd_volume::topology;

use crate::cli::KubeArgs;

#[derive(Args, Debug, Clone)]
pub struct CsiArgs {
    /// Unix socket to serve on (`unix://` prefix accepted).
    #[arg(long, env = "CSI_ENDPOINT", default_value = "/csi/csi.sock")]
    pub endpoint: String,
    /// CSI driver name.
    #[arg(long, default_value = rbd_csi::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Services: controller (Deployment), node (DaemonSet) or all.
    #[arg(long, default_value = "all", value_parser = Services::parse)]
    pub services: Services,
    /// Node id reported to Kubernetes (the node name). Default: $NODE_NAME, else the host name.
    #[arg(long, env = "NODE_NAME")]
    pub node_id: Option<String>,
    /// Mapper for volumes whose class names none: rbd (krbd), rbd-nbd or fuse (rbd-fuse + loop).
    #[arg(long, default_value = "rbd", value_parser = MounterKind::parse)]
    pub default_mounter: MounterKind,
    /// `rbd map -o` options for every krbd volume of this node (e.g. `noudev` in a container,
    /// `ms_mode=secure`); a class's `mapOptions` win for an option both set. Without `ms_mode`
    /// here or in the class, krbd maps monitors that have no msgr1 address with
    /// `ms_mode=prefer-crc`.
    #[arg(long, value_parser = krbd_map_options)]
    pub krbd_map_options: Option<String>,
    /// Private runtime directory for key files and rbd-fuse instances; keep it on tmpfs.
    #[arg(long, default_value = "/run/rbd-csi")]
    pub runtime_dir: PathBuf,
    /// Host cgroup the rbd-fuse and rbd-nbd daemons start in, so that they outlive a restart of
    /// the plugin's container, e.g. /host-cgroup/rbd-csi-daemons with the host's
    /// /sys/fs/cgroup mounted at /host-cgroup: used as is on a cgroup v2 host, one cgroup in
    /// every mounted hierarchy (/host-cgroup/HIERARCHY/rbd-csi-daemons) on a cgroup v1 host; a
    /// directory inside a hierarchy is used as is. Created at start when missing. Repeat or
    /// separate with commas. Default none (the daemons only get a session of their own).
    #[arg(long, value_delimiter = ',')]
    pub daemon_cgroup: Vec<PathBuf>,
    /// How many volumes of this driver the node can have (NodeGetInfo's `max_volumes_per_node`,
    /// which the Kubernetes scheduler counts against); 0 = no limit. With `--services=all` the
    /// controller also refuses (RESOURCE_EXHAUSTED) a ControllerPublishVolume beyond that many
    /// volumes of the pool published to this node.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    pub max_volumes_per_node: i64,
    /// Register with the kubelet through its plugin registry (node service; replaces the
    /// node-driver-registrar sidecar).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set)]
    pub register: bool,
    /// The kubelet's plugin registry directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    pub registry_dir: PathBuf,
    /// The CSI socket as the kubelet sees it on the host. Default: --endpoint.
    #[arg(long)]
    pub kubelet_endpoint: Option<PathBuf>,
    /// Monitors for CreateVolume/GetCapacity requests whose parameters name none, and of the
    /// cluster Probe and GetCapacity check.
    #[arg(long)]
    pub monitors: Option<String>,
    /// Ceph user for Probe (ready only while Ceph answers) and GetCapacity, which carry no
    /// secrets. Needs --monitors and --probe-key-file.
    #[arg(long, default_value = "admin")]
    pub probe_user: String,
    /// File holding that user's key (e.g. a mounted Secret; never pass keys on the command line).
    #[arg(long)]
    pub probe_key_file: Option<PathBuf>,
    /// Cluster config (ceph-csi's `config.json`: `clusterID` to monitors and a default
    /// `rbd.radosNamespace`), re-read when it changes. Default: /etc/ceph-csi-config/config.json
    /// if that file exists.
    #[arg(long, env = "CLUSTER_CONFIG")]
    pub cluster_config: Option<PathBuf>,
    /// KMS configuration of encrypted volumes (ceph-csi's `config.json` of the `ConfigMap`
    /// `ceph-csi-encryption-kms-config`): the entries a class's `encryptionKMSID` names. Read
    /// when an encrypted volume is created or staged.
    #[arg(long, env = "KMS_CONFIG", default_value = rbd_volume::encryption::DEFAULT_KMS_CONFIG)]
    pub kms_config: PathBuf,
    /// Node label keys that make up the node's topology, comma-separated (e.g.
    /// `topology.kubernetes.io/zone`). Enables topology: the node service reports the node's
    /// values as `topology.<driver name>/<domain>` (read from its Node object through the
    /// Kubernetes API at startup), and the plugin advertises VOLUME_ACCESSIBILITY_CONSTRAINTS.
    /// Give it to the controller too.
    #[arg(long, env = "TOPOLOGY_LABELS", default_value = "")]
    pub topology_labels: String,
    /// The kubelet's root directory, where it stages volumes
    /// (`plugins/kubernetes.io/csi/<driver>/...`): the node service looks there for the staging
    /// path of a volume whose space a ReclaimSpaceJob asks this node to reclaim.
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_dir: PathBuf,
    /// Node service: answer the ReclaimSpaceJobs that ask this node to trim a volume staged here
    /// (csi-addons' `csiaddons.openshift.io/v1alpha1`; the controller asks; docs/reclaim-space.md).
    /// Needs Kubernetes API access; without the CRD installed the watch looks for it again at
    /// most once a minute.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub reclaim_space: bool,
    /// Kubernetes API access: to read this node's labels for --topology-labels, the Secrets
    /// of KMS entries that keep or wrap volume keys with Secrets, and ReclaimSpaceJobs.
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `--cluster-config`, or ceph-csi's default path when a file is there; opened and parsed.
fn cluster_config(given: Option<&Path>) -> anyhow::Result<Option<Arc<ClusterConfigFile>>> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None if Path::new(DEFAULT_PATH).exists() => PathBuf::from(DEFAULT_PATH),
        None => return Ok(None),
    };
    let file =
        ClusterConfigFile::open(&path).map_err(|e| anyhow::anyhow!("--cluster-config: {e}"))?;
    tracing::info!(path = %path.display(), "cluster config loaded");
    Ok(Some(Arc::new(file)))
}

/// This node's topology segments from its labels, read once through the Kubernetes API.
async fn node_topology(
    args: &CsiArgs,
    node: &str,
    labels: &[String],
) -> anyhow::Result<BTreeMap<String, String>> {
    let client = crate::cli::kube_client::client(&args.kube).await?;
    let api: kube::Api<Node> = kube::Api::all(client);
    let object = api
        .get(node)
        .await
        .with_context(|| format!("reading Node {node:?} for --topology-labels"))?;
    let node_labels = object.metadata.labels.unwrap_or_default();
    let prefix = format!("topology.{}", args.driver_name);
    topology::node_topology(node, labels, &node_labels, &prefix)
        .map_err(|e| anyhow::anyhow!("--topology-labels: {e}"))
}

/// `--daemon-cgroup` resolved for this host and prepared (node service only), so a cgroup the
/// daemons cannot join fails the start rather than a stage.
fn daemon_cgroups(args: &CsiArgs) -> anyhow::Result<Vec<PathBuf>> {
    if args.daemon_cgroup.is_empty() || !args.services.node() {
        return Ok(Vec::new());
    }
    let placement = rbd_csi::mapper::daemon::DaemonPlacement::resolve(&args.daemon_cgroup)
        .map_err(|e| anyhow::anyhow!("--daemon-cgroup: {e}"))?;
    tracing::info!(configured = ?args.daemon_cgroup, cgroups = ?placement.cgroups,
        "rbd-fuse and rbd-nbd daemons start in these cgroups");
    Ok(placement.cgroups)
}

/// Kubernetes Secrets for the KMS entries that keep or wrap keys with Secrets; without
/// Kubernetes API access (a plugin run outside a cluster with no kubeconfig) such entries are
/// refused when used, naming the entry, and everything else works.
fn kms_secrets(
    client: Option<&kube::Client>,
) -> Option<Arc<dyn rbd_volume::encryption::secrets::SecretStore>> {
    client.map(|client| {
        Arc::new(rbd_csi::kube_secrets::KubeSecrets::new(client.clone()))
            as Arc<dyn rbd_volume::encryption::secrets::SecretStore>
    })
}

/// The node side of ReclaimSpaceJobs: trims the volume where the kubelet staged it here.
struct NodeTrim {
    node: rbd_csi::node::NodeService,
    kubelet_dir: PathBuf,
    driver: String,
}

#[async_trait::async_trait]
impl provisioner::reclaim_space::NodeSpaceReclaimer for NodeTrim {
    async fn reclaim(
        &self,
        volume_handle: &str,
    ) -> Result<provisioner::reclaim_space::NodeAnswer, String> {
        use rbd_csi::node::reclaim::NodeReclaimed;
        let done = self
            .node
            .reclaim_staged_volume(&self.kubelet_dir, &self.driver, volume_handle)
            .await
            .map_err(|status| status.message().to_owned())?;
        Ok(provisioner::reclaim_space::NodeAnswer {
            message: done.describe(),
            discarded: match done {
                NodeReclaimed::Trimmed { bytes, .. } => Some(bytes),
                NodeReclaimed::BlockVolume | NodeReclaimed::ReadOnly => None,
            },
        })
    }
}

/// Serves until SIGTERM/SIGINT.
pub async fn run(args: CsiArgs) -> anyhow::Result<()> {
    let defaults = CsiConfig::default();
    let probe = match (&args.monitors, &args.probe_key_file) {
        (Some(monitors), Some(path)) => {
            let key = std::fs::read_to_string(path)
                .with_context(|| format!("reading --probe-key-file {}", path.display()))?;
            Some(ProbeCluster {
                monitors: monitors.clone(),
                user: args.probe_user.clone(),
                key: key.trim().to_string(),
            })
        }
        (None, Some(_)) => anyhow::bail!("--probe-key-file needs --monitors"),
        _ => None,
    };
    let cluster_config = cluster_config(args.cluster_config.as_deref())?;
    let topology_labels =
        topology::parse_topology_labels(&args.topology_labels).map_err(anyhow::Error::msg)?;
    let node_id = args.node_id.clone().unwrap_or(defaults.node_id.clone());
    let node_topology = if topology_labels.is_empty() || !args.services.node() {
        BTreeMap::new()
    } else {
        let topology = node_topology(&args, &node_id, &topology_labels).await?;
        tracing::info!(node = %node_id, ?topology, "node topology");
        topology
    };
    let daemon_cgroups = daemon_cgroups(&args)?;
    let kube = match crate::cli::kube_client::client(&args.kube).await {
        Ok(client) => Some(client),
        Err(e) => {
            tracing::info!(error = %e, "no Kubernetes API access: KMS entries that use Secrets are refused, ReclaimSpaceJobs are not answered on this node");
            None
        }
    };
    let secrets = kms_secrets(kube.as_ref());
    let endpoint = PathBuf::from(
        args.endpoint
            .strip_prefix("unix://")
            .unwrap_or(&args.endpoint),
    );
    let config = CsiConfig {
        endpoint,
        driver_name: args.driver_name,
        services: args.services,
        node_id,
        default_mounter: args.default_mounter,
        runtime_dir: args.runtime_dir,
        krbd_map_options: args.krbd_map_options,
        max_volumes_per_node: args.max_volumes_per_node,
        registration: args.register.then_some(RegistrationConfig {
            registry_dir: args.registry_dir,
            kubelet_endpoint: args.kubelet_endpoint,
        }),
        default_monitors: args.monitors,
        probe,
        cluster_config,
        topology_labels,
        node_topology,
        kube_cluster: args.kube.kube_cluster_id.clone().unwrap_or_default(),
        daemon_cgroups,
        kms_config: args.kms_config,
        secrets,
    };
    tracing::info!(endpoint = %config.endpoint.display(), driver = %config.driver_name, services = ?config.services, ceph_client = %ceph_rbd::key::client_version(), "starting CSI driver");
    config.validate().map_err(anyhow::Error::msg)?;
    let node = config
        .services
        .node()
        .then(|| rbd_csi::node::NodeService::new(config.node_config()));
    let agent = match (&node, kube, args.reclaim_space) {
        (Some(service), Some(client), true) => {
            let trim = Arc::new(NodeTrim {
                node: service.clone(),
                kubelet_dir: args.kubelet_dir.clone(),
                driver: config.driver_name.clone(),
            });
            Some(tokio::spawn(provisioner::reclaim_space::node::agent(
                client,
                config.driver_name.clone(),
                config.node_id.clone(),
                trim,
            )))
        }
        _ => None,
    };
    let served = rbd_csi::serve_with_node(config, node, crate::cli::run::shutdown_signal()).await;
    if let Some(agent) = agent {
        agent.abort();
    }
    served?;
    Ok(())
}

/// `--krbd-map-options`: krbd map options, checked as a class's `krbd:` entry would be.
fn krbd_map_options(value: &str) -> Result<String, String> {
    let parsed = rbd_csi::mapper::options::parse(
        "--krbd-map-options",
        rbd_csi::mapper::options::Which::Map,
        &format!("krbd:{value}"),
    )
    .map_err(|e| e.to_string())?;
    Ok(parsed.krbd.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::krbd_map_options;

    #[test]
    fn krbd_map_options_flag_is_checked_naming_the_option() {
        assert_eq!(
            krbd_map_options("noudev, ms_mode=secure").as_deref(),
            Ok("noudev,ms_mode=secure")
        );
        let err = krbd_map_options("noudev,bogus").unwrap_err();
        assert_eq!(err, "--krbd-map-options: unknown krbd map option \"bogus\"");
        assert!(
            krbd_map_options("key=AQB")
                .unwrap_err()
                .contains("\"key\" is not allowed")
        );
        assert!(
            krbd_map_options("ms_mode=fast")
                .unwrap_err()
                .contains("ms_mode must be one of")
        );
    }
}
