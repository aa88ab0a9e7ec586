//! `rbd-provisioner`: Ceph RBD dynamic provisioning and CSI driver for Kubernetes.

mod backend;
mod claim;
mod cli;
mod crashpoint;
mod csi;
mod duration;
mod gc;
mod image;
mod kube_client;
mod monitors;
mod params;
mod pv_build;
mod run;
mod secrets;
mod throttle;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command, LogArgs, LogFormat};

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

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(cli::normalise_args(std::env::args()));
    init_logging(&cli.log);
    let result = match cli.command {
        None => run::run(cli.provisioner).await,
        Some(Command::Csi(args)) => csi::run(args).await,
        Some(Command::Gc(args)) => gc::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("rbd-provisioner: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
