//! CSI driver services for Ceph RBD volumes: Identity, Controller and Node on a unix socket,
//! plus kubelet plugin registration, so one binary replaces ceph-csi's plugin and its sidecars.
//!
//! Start with [`serve`] and [`CsiConfig`]:
//!
//! ```no_run
//! # async fn run() -> Result<(), rbd_csi::CsiError> {
//! let config = rbd_csi::CsiConfig {
//!     endpoint: "/csi/csi.sock".into(),
//!     services: rbd_csi::Services::Node,
//!     ..rbd_csi::CsiConfig::default()
//! };
//! rbd_csi::serve(config, async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
//!
//! Module map: [`identity`], [`controller`], [`node`] (+ [`mapper`] for krbd / rbd-nbd / rbd-fuse+loop),
//! [`registration`], [`server`] (+ [`h2_authority`] for the `:authority` gRPC clients send on unix sockets); pure helpers in [`volume`] (volume IDs, image names, sizes).

#![warn(clippy::pedantic)]
// `mapper`/`mapped`, `staging`/`staged` are the domain's words; renaming them would obscure.
#![allow(clippy::similar_names)]
// Every map here is a prost-generated `std::collections::HashMap`; generic hashers add nothing.
#![allow(clippy::implicit_hasher)]

pub mod config;
pub mod controller;
pub mod exec;
pub mod fs;
pub mod h2_authority;
pub mod identity;
pub mod kube_secrets;
pub mod locks;
pub mod mapper;
pub mod mount;
pub mod node;
pub mod proto;
pub mod registration;
pub mod server;
pub mod status;
pub mod validate;
pub mod volume;

pub use config::{CsiConfig, DEFAULT_DRIVER_NAME, ProbeCluster, Services};
pub use mapper::MounterKind;
pub use registration::RegistrationConfig;
pub use server::{CsiError, serve, serve_with_node};
