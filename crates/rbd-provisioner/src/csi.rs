//! `rbd-provisioner csi`: the CSI driver services.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use rbd_csi::{CsiConfig, MounterKind, ProbeCluster, RegistrationConfig, Services};

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
    /// Private runtime directory for key files and rbd-fuse instances; keep it on tmpfs.
    #[arg(long, default_value = "/run/rbd-csi")]
    pub runtime_dir: PathBuf,
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
    let endpoint = PathBuf::from(
        args.endpoint
            .strip_prefix("unix://")
            .unwrap_or(&args.endpoint),
    );
    let config = CsiConfig {
        endpoint,
        driver_name: args.driver_name,
        services: args.services,
        node_id: args.node_id.unwrap_or(defaults.node_id.clone()),
        default_mounter: args.default_mounter,
        runtime_dir: args.runtime_dir,
        registration: args.register.then_some(RegistrationConfig {
            registry_dir: args.registry_dir,
            kubelet_endpoint: args.kubelet_endpoint,
        }),
        default_monitors: args.monitors,
        probe,
        ..defaults
    };
    tracing::info!(endpoint = %config.endpoint.display(), driver = %config.driver_name, services = ?config.services, "starting CSI driver");
    rbd_csi::serve(config, crate::run::shutdown_signal()).await?;
    Ok(())
}
