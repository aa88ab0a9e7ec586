//! `rbd-provisioner`: Ceph RBD dynamic provisioning and CSI driver for Kubernetes.

use tracing_subscriber::EnvFilter;

use rbd_provisioner::cli::{self, Cli, Command, LogArgs, LogFormat, csi, exit, run};
use rbd_provisioner::commands::{dr, gc, migrate};

fn init_logging(log: &LogArgs) {
    let level = match log.verbosity {
        Some(v) if v >= 4 => "debug".to_string(),
        _ => log.log_level.clone(),
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() {
    let cli: Cli = cli::parse(cli::normalise_args(std::env::args()));
    init_logging(&cli.log);
    // librados' and librbd's threads run in this process: if one crashes, say where
    crash_report::install("rbd-provisioner");
    cli::crashpoint::install_ceph_steps();
    ceph_rbd::set_librbd_only(cli.librbd_only);
    if cli.librbd_only {
        tracing::info!("every image operation goes through librbd (--librbd-only)");
    }
    match rbd_volume::snapshot_limit::SnapshotLimits::new(
        cli.max_snapshots_on_image,
        cli.min_snapshots_on_image,
    ) {
        Ok(limits) => rbd_volume::snapshot_limit::set_snapshot_limits(limits),
        Err(e) => {
            eprintln!("rbd-provisioner: --{e}");
            exit::exit(2);
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rbd-provisioner: starting the async runtime: {e}");
            exit::exit(1);
        }
    };
    // A panic here has been printed by the panic hook; it must still end through exit::exit.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            match cli.command {
                None => run::run(cli.provisioner).await,
                Some(Command::Csi(args)) => csi::run(args).await,
                Some(Command::Gc(args)) => gc::run(args).await,
                Some(Command::Migrate(args)) => migrate::run(args).await,
                Some(Command::Dr(args)) => dr::run(args).await,
            }
        })
    }));
    let code = match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            tracing::error!("{e:#}");
            eprintln!("rbd-provisioner: {e:#}");
            1
        }
        Err(_panic) => 101,
    };
    // Never return from main or call process::exit: see exit.rs. The runtime is not dropped
    // either (it would wait for librbd calls stuck on an unreachable OSD).
    exit::exit(code);
}
