//! `rbd-provisioner` as a library: the modules of the binary, for its tests. Not a stable API.
//!
//! `main.rs` is a thin entry point over them, so the tests use the real modules.
//!
//! - [`backend`]: the RBD backend of the `provisioner` library (provisioning, expansion,
//!   modification, snapshots, data sources, attachment), on the volume core (`rbd-volume`,
//!   shared with the CSI controller).
//! - [`commands`]: the operator commands `gc` and `migrate`.
//! - [`cli`]: the command line and the process around the controllers (`run`, `csi`, exit,
//!   client, throttling, crash points).

pub mod backend;
pub mod cli;
pub mod commands;
