//! The command line and the process around the controllers.
//!
//! Flags, the provisioner and CSI entry points, how the process ends, the Kubernetes client,
//! throttling, crash points.

mod args;
pub mod crashpoint;
pub mod csi;
pub mod duration;
pub mod exit;
pub mod kube_client;
pub mod run;
pub mod throttle;

pub use args::{
    Cli, Command, KubeArgs, LogArgs, LogFormat, ProvisionerArgs, TopologyLabels, normalise_args,
    parse, version_text,
};
