//! The RBD backend: the `provisioner` library's traits on Ceph RBD, and what they need.

pub mod attacher;
pub mod claim;
pub mod fencing;
pub mod image;
pub mod monitors;
pub mod params;
pub mod pv_build;
pub mod rbd;
pub mod reclaim;
pub mod replication;
pub mod secrets;
pub mod snapshots;
pub mod sources;
pub mod topology;

pub use rbd::{BackendConfig, RbdBackend, SourceMode};
