//! `rbd-provisioner` as a library: the modules of the binary (`main.rs` is a thin entry point
//! over them), so its tests use the real modules. Not a stable API.
//!
//! The volume lifecycle itself (names, owner records, create/repair/grow/delete) is in the
//! `rbd-volume` crate, shared with the CSI controller; [`backend`] translates the provisioning
//! library's requests onto it.

pub mod attacher;
pub mod backend;
pub mod claim;
pub mod cli;
pub mod crashpoint;
pub mod csi;
pub mod duration;
pub mod exit;
pub mod gc;
pub mod image;
pub mod kube_client;
pub mod migrate;
pub mod monitors;
pub mod params;
pub mod protection;
pub mod pv_build;
pub mod run;
pub mod secrets;
pub mod snapshotter;
pub mod sources;
pub mod throttle;
pub mod topology;
