//! `kube-emulator --listen 127.0.0.1:PORT --kubeconfig-out FILE`: the emulated API over plain
//! HTTP (no TLS, no auth) for kubectl, the demo and end-to-end tests.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use kube_emulator::{DEFAULT_WATCH_HISTORY, Emulator, EmulatorBuilder};

#[derive(Debug, Parser)]
#[command(
    name = "kube-emulator",
    about = "In-memory Kubernetes API server for tests and demos"
)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Write a kubeconfig for this server to FILE.
    #[arg(long, value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,
    /// Do not run the PV controller slice.
    #[arg(long)]
    no_pv_controller: bool,
    /// Watch events kept per resource for resuming watches.
    #[arg(long, default_value_t = DEFAULT_WATCH_HISTORY)]
    watch_history: usize,
    /// Rate-limit the PV controller slice's writes like kube-controller-manager's API clients
    /// (token bucket per controller): requests per second. Without it: unthrottled.
    #[arg(long, value_name = "QPS")]
    controller_qps: Option<f64>,
    /// Token bucket size for --controller-qps.
    #[arg(long, value_name = "N", default_value_t = EmulatorBuilder::KCM_CLIENT_BURST, requires = "controller_qps")]
    controller_burst: u32,
    /// Shorthand for kube-controller-manager's default client limit:
    /// --controller-qps 20 --controller-burst 30.
    #[arg(long, conflicts_with = "controller_qps")]
    default_control_plane: bool,
    /// Serve the csi-addons CRDs of deploy/csi-addons-crds/ (NetworkFence, ReclaimSpaceJob,
    /// ReclaimSpaceCronJob, VolumeReplicationClass, VolumeReplication) from the start.
    #[arg(long)]
    csi_addons_crds: bool,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut builder = Emulator::builder()
        .pv_controller(!args.no_pv_controller)
        .watch_history(args.watch_history)
        .csi_addons_crds(args.csi_addons_crds);
    if args.default_control_plane {
        builder = builder.controller_client_limit(
            EmulatorBuilder::KCM_CLIENT_QPS,
            EmulatorBuilder::KCM_CLIENT_BURST,
        );
    } else if let Some(qps) = args.controller_qps {
        builder = builder.controller_client_limit(qps, args.controller_burst);
    }
    let emu = builder.build();
    let server = emu.serve(args.listen).await?;
    if let Some(path) = &args.kubeconfig_out {
        // Write to a temporary name and rename, so readers never see a partial file.
        let tmp = path.with_extension("tmp");
        server.write_kubeconfig(&tmp)?;
        std::fs::rename(&tmp, path)?;
    }
    tracing::info!(url = %server.url(), "ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}
