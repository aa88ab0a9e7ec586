//! Command line: the old provisioner's flags and env, plus ours. `--help` lists them all.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::backend::SourceMode;

fn duration(text: &str) -> Result<Duration, String> {
    crate::cli::duration::parse(text)
}

#[derive(Parser, Debug)]
#[command(
    name = "rbd-provisioner",
    version,
    about = "Ceph RBD volume provisioner and CSI driver for Kubernetes",
    long_about = "Ceph RBD volume provisioner and CSI driver for Kubernetes.\n\n\
        Without a subcommand it runs the provisioning controller (drop-in for the ceph.com/rbd \
        external provisioner: same flags, env and StorageClass parameters). Go-style single-dash \
        flags (-master=..., -id ...) are accepted too."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub provisioner: ProvisionerArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Send every image operation (create, clone, snapshot, remove) through librbd instead of
    /// the RADOS-level paths this driver takes for plain images (see docs/provisioner.md).
    #[arg(long, global = true, env = "RBD_LIBRBD_ONLY", num_args = 0..=1, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub librbd_only: bool,
    /// krbd maps at most 510 snapshots per image: a source volume with more snapshots than
    /// this (its snapshot images' temporary snapshots included) gets those images flattened
    /// and the new snapshot or clone refused, to be retried (ceph-csi's maxsnapshotsonimage;
    /// at most 500).
    #[arg(long, global = true, env = "RBD_MAX_SNAPSHOTS_ON_IMAGE", default_value_t = rbd_volume::snapshot_limit::DEFAULT_MAX_SNAPSHOTS_ON_IMAGE)]
    pub max_snapshots_on_image: u32,
    /// Past this many snapshots on a source volume, the snapshot images of all but the oldest
    /// (this number - 1) are flattened before a new snapshot or clone is taken, so their
    /// temporary snapshots go (ceph-csi's minsnapshotsonimage; at most max-snapshots-on-image).
    #[arg(long, global = true, env = "RBD_MIN_SNAPSHOTS_ON_IMAGE", default_value_t = rbd_volume::snapshot_limit::DEFAULT_MIN_SNAPSHOTS_ON_IMAGE)]
    pub min_snapshots_on_image: u32,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the CSI driver (identity + controller and/or node services on a unix socket).
    Csi(crate::cli::csi::CsiArgs),
    /// List (and with --delete, remove) images that carry our owner record but have no PV.
    Gc(crate::commands::gc::GcArgs),
    /// Replace PVs with an in-tree rbd source by PVs of our CSI driver (same name, image and
    /// claim); crash-safe, resumable, never deletes an image. See docs/migration.md.
    Migrate(crate::commands::migrate::MigrateArgs),
    /// Disaster recovery on the site that holds mirrored copies: list them, and make the PVs,
    /// claims and VolumeReplications of a namespace's copies. See docs/disaster-recovery.md.
    Dr(crate::commands::dr::DrArgs),
}

#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        global = true,
        env = "LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// Log filter (tracing-subscriber syntax, e.g. `info,provisioner=debug`); RUST_LOG also works.
    #[arg(long, default_value = "info", global = true, env = "LOG_LEVEL")]
    pub log_level: String,
    /// glog verbosity of the old provisioner (>= 4 means debug). Deprecated; use --log-level.
    #[arg(long = "v", global = true, hide = true)]
    pub verbosity: Option<u8>,
    /// Accepted for compatibility with the old provisioner's deployments; has no effect.
    #[arg(long, global = true, hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub logtostderr: Option<String>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct KubeArgs {
    /// Kubernetes API server URL (overrides the kubeconfig's). Neither --master nor --kubeconfig:
    /// in-cluster configuration (or $KUBECONFIG / ~/.kube/config when not in a pod).
    #[arg(long)]
    pub master: Option<String>,
    /// Path to a kubeconfig file.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Client-side API request limit per second; 0 disables throttling (the default: the API
    /// server has its own fairness). client-go's default is 5.
    #[arg(long, default_value_t = 0.0)]
    pub kube_api_qps: f64,
    /// Burst allowed above --kube-api-qps.
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,
    /// The Kubernetes cluster's identity, recorded on every image we make and compared before
    /// any is deleted (clusters sharing a Ceph pool never delete each other's images). Default:
    /// the uid of the `kube-system` namespace, read at startup (the CSI driver, which does not
    /// read it, records one only when given).
    #[arg(long, env = "KUBE_CLUSTER_ID", value_parser = non_empty_id)]
    pub kube_cluster_id: Option<String>,
}

fn non_empty_id(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("--kube-cluster-id: must not be empty".into())
    } else {
        Ok(value.to_owned())
    }
}

#[derive(Args, Debug, Clone)]
pub struct ProvisionerArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Name of the provisioner StorageClasses refer to.
    #[arg(long, env = "PROVISIONER_NAME", default_value = "ceph.com/rbd")]
    pub provisioner_name: String,
    /// Unique identity of this provisioner (recorded on images and PVs). Default: the name.
    #[arg(long)]
    pub id: Option<String>,
    /// Port for Prometheus metrics on /metrics (and /healthz); 0 disables.
    #[arg(long, default_value_t = 0)]
    pub metrics_port: u16,
    /// Address the metrics server binds.
    #[arg(long, default_value = "0.0.0.0")]
    pub metrics_address: String,
    /// Bound for each Ceph operation (was: the rbd command timeout).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub command_timeout: Duration,
    /// Name images after the PV (`pvc-<uid>`) instead of `<prefix><uid>`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set)]
    pub use_pv_name: bool,
    /// Prefix of image names (unless --use-pv-name).
    #[arg(long, default_value = crate::backend::image::DEFAULT_PREFIX)]
    pub image_name_prefix: String,
    /// PV source when the class has no `pvSource`: auto = csi when the CSIDriver object of
    /// --csi-driver-name exists, else in-tree rbd.
    #[arg(long, value_enum, default_value = "auto")]
    pub pv_source: SourceMode,
    /// CSI driver name used in csi PVs.
    #[arg(long, default_value = rbd_csi::DEFAULT_DRIVER_NAME)]
    pub csi_driver_name: String,
    /// Concurrent provisioning workers.
    #[arg(long, default_value_t = 16)]
    pub workers: usize,
    /// First retry delay of a failing claim or volume (doubles per failure).
    #[arg(long, default_value = "1s", value_parser = duration)]
    pub retry_interval_start: Duration,
    /// Longest retry delay.
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub retry_interval_max: Duration,
    /// Give up on a claim after this many failures (until it changes); 0 = retry forever.
    #[arg(long, default_value_t = 0)]
    pub failure_threshold: u32,
    /// Period of the full resync.
    #[arg(long, default_value = "15m", value_parser = duration)]
    pub resync_period: Duration,
    /// Put external-provisioner.volume.kubernetes.io/finalizer on PVs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false", action = clap::ArgAction::Set)]
    pub add_finalizer: bool,
    /// Run the built-in attach controller: publish volumes of the CSI driver (--csi-driver-name)
    /// to nodes for its VolumeAttachment objects, as the external-attacher sidecar does. Set
    /// false when an external-attacher sidecar serves the driver instead.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub attacher: bool,
    /// Fence nodes tainted `node.kubernetes.io/out-of-service` (Kubernetes' non-graceful node
    /// shutdown): blocklist their Ceph clients of our volumes before the volumes move, and
    /// remove the blocklisting when the taint goes (see docs/fencing.md).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub fencing: bool,
    /// How long the blocklist entries of a fence last unless the fence is taken back first
    /// (default five years, as ceph-csi's NetworkFence).
    #[arg(long, default_value = "157784760s", value_parser = duration)]
    pub fence_expiry: Duration,
    /// Serve csi-addons' NetworkFence objects (csiaddons.openshift.io/v1alpha1) whose
    /// spec.driver is --csi-driver-name: blocklist their CIDRs (see docs/fencing.md). Without
    /// the CRD installed the watch looks for it again at most once a minute.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub network_fence: bool,
    /// Serve csi-addons' ReclaimSpaceJob objects (csiaddons.openshift.io/v1alpha1) whose claim
    /// is bound to one of this provisioner's volumes: give its free space back to Ceph (see
    /// docs/reclaim-space.md). Without the CRD installed the watch looks for it again at most
    /// once a minute.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub reclaim_space: bool,
    /// Serve csi-addons' VolumeReplication objects (replication.storage.openshift.io/v1alpha1)
    /// whose VolumeReplicationClass names --csi-driver-name: mirror their claim's image to the
    /// peer Ceph cluster (see docs/disaster-recovery.md). Without the CRDs installed the watch
    /// looks for them again at most once a minute.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub volume_replication: bool,
    /// Run leader election on a Lease (required with more than one replica).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true", action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease. Default: $POD_NAMESPACE, else "default".
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// Lease duration.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub leader_election_lease_duration: Duration,
    /// Renew deadline of the leader.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub leader_election_renew_deadline: Duration,
    /// Retry period of acquire and renew.
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub leader_election_retry_period: Duration,
    /// On SIGTERM/SIGINT, how long in-flight operations may take to finish before the process
    /// exits (Ceph calls still running then get a few more seconds; keep the sum below the
    /// pod's terminationGracePeriodSeconds, 30 s by default).
    #[arg(long, default_value = "20s", value_parser = duration)]
    pub shutdown_grace_period: Duration,
    /// Cluster config (ceph-csi's `config.json`: cluster names to monitors) for classes that name
    /// `clusterID` instead of `monitors`; re-read when it changes.
    #[arg(long, env = "CLUSTER_CONFIG")]
    pub cluster_config: Option<PathBuf>,
    /// KMS configuration of encrypted volumes (ceph-csi's `config.json` of the `ConfigMap`
    /// `ceph-csi-encryption-kms-config`): the entries a class's `encryptionKMSID` names. Read
    /// when an encrypted volume is created or deleted.
    #[arg(long, env = "KMS_CONFIG", default_value = rbd_volume::encryption::DEFAULT_KMS_CONFIG)]
    pub kms_config: PathBuf,
    /// Node label keys that make up a node's topology, comma-separated (e.g.
    /// `topology.kubernetes.io/zone`), for classes with `topologyConstrainedPools`.
    #[arg(long, env = "TOPOLOGY_LABELS", default_value = "", value_parser = topology_labels)]
    pub topology_labels: TopologyLabels,
}

/// `--topology-labels`, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyLabels(pub Vec<String>);

fn topology_labels(text: &str) -> Result<TopologyLabels, String> {
    if text.trim().is_empty() {
        return Ok(TopologyLabels::default());
    }
    rbd_volume::topology::parse_topology_labels(text).map(TopologyLabels)
}

/// Long flags that Go's flag package let users write with one dash.
const GO_STYLE_FLAGS: &[&str] = &[
    "master",
    "kubeconfig",
    "id",
    "metrics-port",
    "command-timeout",
    "use-pv-name",
    "v",
    "logtostderr",
    "alsologtostderr",
    "stderrthreshold",
];

/// Rewrites `-master=x` / `-id x` (Go flag syntax) as `--master=x` / `--id x`.
/// What `--version` prints: ours and the Ceph client release this binary is linked with.
#[must_use]
pub fn version_text() -> String {
    format!(
        "{} (Ceph client {})",
        env!("CARGO_PKG_VERSION"),
        ceph_rbd::key::client_version()
    )
}

/// Parses the command line (after [`normalise_args`]); `--version` names the Ceph client.
/// Exits with clap's message on bad flags, as `Cli::parse_from` does.
#[must_use]
pub fn parse(args: Vec<String>) -> Cli {
    // clap keeps the version for the life of the command: one small string, leaked once
    let version: &'static str = Box::leak(version_text().into_boxed_str());
    let matches = Cli::command().version(version).get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

pub fn normalise_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            if i == 0 || arg.starts_with("--") || !arg.starts_with('-') {
                return arg;
            }
            let name = arg[1..].split('=').next().unwrap_or_default();
            if GO_STYLE_FLAGS.contains(&name) {
                format!("-{arg}")
            } else {
                arg
            }
        })
        .filter(|arg| {
            !arg.starts_with("--alsologtostderr") && !arg.starts_with("--stderrthreshold")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        let argv = normalise_args(
            std::iter::once("rbd-provisioner")
                .chain(args.iter().copied())
                .map(String::from),
        );
        Cli::try_parse_from(argv).unwrap()
    }

    #[test]
    fn the_old_flags_and_defaults_work() {
        let cli = parse(&[]);
        let p = &cli.provisioner;
        assert!(cli.command.is_none());
        assert_eq!(p.command_timeout, Duration::from_secs(5));
        assert!(!p.use_pv_name);
        assert_eq!(p.metrics_port, 0);
        assert_eq!(p.id, None);
        let cli = parse(&[
            "-master=http://127.0.0.1:8080",
            "-id",
            "rbd-1",
            "-use-pv-name",
            "-command-timeout=10s",
            "-v=4",
            "-logtostderr",
        ]);
        let p = &cli.provisioner;
        assert_eq!(p.kube.master.as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(p.id.as_deref(), Some("rbd-1"));
        assert!(p.use_pv_name);
        assert_eq!(p.command_timeout, Duration::from_secs(10));
        assert_eq!(cli.log.verbosity, Some(4));
    }

    #[test]
    fn new_flags_parse() {
        let cli = parse(&[
            "--workers",
            "4",
            "--kube-api-qps",
            "5",
            "--pv-source",
            "csi",
            "--leader-elect=false",
            "--log-format",
            "json",
        ]);
        assert_eq!(cli.provisioner.workers, 4);
        assert_eq!(cli.provisioner.kube.kube_api_qps, 5.0);
        assert_eq!(cli.provisioner.pv_source, SourceMode::Csi);
        assert!(!cli.provisioner.leader_elect);
        assert_eq!(cli.log.log_format, LogFormat::Json);
        let cli = parse(&[
            "--cluster-config",
            "/etc/ceph-csi-config/config.json",
            "--topology-labels",
            "topology.kubernetes.io/zone,example.com/rack",
        ]);
        assert_eq!(
            cli.provisioner.topology_labels.0,
            ["topology.kubernetes.io/zone", "example.com/rack"]
        );
        assert_eq!(
            cli.provisioner.cluster_config,
            Some(PathBuf::from("/etc/ceph-csi-config/config.json"))
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        let argv =
            normalise_args(["rbd-provisioner", "--command-timeout", "soon"].map(String::from));
        let e = Cli::try_parse_from(argv).unwrap_err().to_string();
        assert!(e.contains("--command-timeout"), "{e}");
    }
}
