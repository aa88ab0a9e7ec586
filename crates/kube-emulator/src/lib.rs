//! An in-memory Kubernetes API server (kube-apiserver 1.36 semantics, checked against the
//! recordings in `reference/k8s-traces/`) plus the slice of kube-controller-manager's PV
//! controller that dynamic provisioning depends on. For tests and the demo.
//!
//! ```no_run
//! # async fn demo() {
//! let emu = kube_emulator::Emulator::new();
//! let client = emu.client(); // in-process kube::Client, no socket
//! # let _ = client;
//! let server = emu.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
//! println!("{}", server.kubeconfig_yaml());
//! # }
//! ```
//!
//! See the crate README for what is emulated and what deliberately is not.

mod admission;
mod api;
mod controller;
mod crd;
mod emulator;
mod events_view;
mod faults;
mod patch;
mod resources;
mod schema;
mod selectors;
mod server;
mod snapshots;
mod ssa;
mod stats;
mod status;
mod store;
mod util;
mod vac;
mod validation;

pub use crd::{
    CSI_ADDONS_CRDS, NETWORK_FENCE_CRD, RECLAIM_SPACE_CRON_JOB_CRD, RECLAIM_SPACE_JOB_CRD,
    SNAPSHOT_CRDS, VOLUME_REPLICATION_CLASS_CRD, VOLUME_REPLICATION_CRD,
};
pub use emulator::{DEFAULT_WATCH_HISTORY, Emulator, EmulatorBuilder, RequestRecord};
pub use faults::Faults;
pub use server::ServerHandle;
