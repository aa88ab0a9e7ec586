//! Native access to Ceph RBD through librados and librbd: no `rbd` CLI, no keyring or ceph.conf
//! on disk, no key on any command line.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ceph_rbd::Error> {
//! use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};
//! let pool = ConnectionPool::new(PoolOptions::default());
//! let cfg = ClusterConfig::new("10.0.0.1:6789,10.0.0.2:6789", "admin", Secret::new("AQB..."));
//! let cluster = pool.get(&cfg).await?;
//! cluster.create_image("rbd", "vol-1", 1 << 30, &CreateOptions::default()).await?;
//! # Ok(()) }
//! ```
//!
//! * [`ConnectionPool`] shares one connection per (monitors, user, key) and replaces broken ones.
//! * [`Cluster`] is the async API; every call runs on tokio's blocking pool, in a tracing span,
//!   and the caller waits at most the operation timeout + 2 s (librados gets it as its monitor
//!   command timeout; OSD ops get none, librbd does not survive one: a stuck call finishes in the
//!   background, at most 64 per connection).
//! * [`Error`] is typed (not found, exists, in use with watcher addresses, permission, timeout...)
//!   and names the operation and the pool/image, never the key.
//! * Every `pool` argument is `pool` or `pool/namespace` (a RADOS namespace): see [`namespace`].
//! * Plain format-2 images are created and removed with RADOS calls, the objects librbd itself
//!   writes and removes, without a librbd image context (most of the CPU an image costs); so is
//!   the clone [`Cluster::clone_recorded`] makes of a snapshot of a plain image, and the
//!   snapshot it takes of the image it has just cloned, unless somebody has it open; every other
//!   image, and every other operation, goes through librbd ([`created_without_librbd`],
//!   [`cloned_without_librbd`], [`snapshots_without_librbd`], [`removed_without_librbd`] count
//!   the former). Each of those
//!   paths is left to librbd where the cluster may not support it (its OSDs' release), and the
//!   clone where the client's `rbd_default_clone_format` gives clone v1 (see `compat`);
//!   [`set_librbd_only`] turns them all off.
//! * All `unsafe` code lives in the private `raw` module.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod clone;
mod cls_lock;
mod cluster;
mod compat;
mod config;
mod create;
mod denc;
mod error;
mod features;
mod first_snapshot;
mod header;
mod header_lock;
pub mod key;
mod librbd_only;
mod lifecycle;
mod mirror;
pub mod namespace;
mod plain_clone;
mod pool;
mod probe;
mod raw;
mod remove;
mod repair;
mod space;
pub mod steps;

pub use clone::{CloneJob, CloneRecord, Cloned, ImageFacts};
pub use cluster::{
    Cluster, ClusterStats, CreateOptions, GroupSnapInfo, ImageGroupSnap, ImageInfo, Locker,
    MAX_CALLS_PER_CONNECTION, MonReply, ParentSpec, PoolStats, SnapEntry, SnapInfo, TrashEntry,
    Watcher,
};
pub use compat::CloneFormat;
pub use config::{ClusterConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, Secret};
pub use create::created_without_librbd;
pub use error::Error;
pub use features::Features;
pub use first_snapshot::snapshots_without_librbd;
pub use header_lock::{HeaderLock, Locked};
pub use librbd_only::{ENV as LIBRBD_ONLY_ENV, librbd_only, set_librbd_only};
pub use lifecycle::{AT_EXIT_BOUND, QUIET_BOUND, ShutdownReport, busy_calls, shutdown};
pub use mirror::{
    MirrorGlobalStatus, MirrorImageInfo, MirrorImageState, MirrorMode, MirrorSiteStatus,
    MirrorSnapshot, MirrorStatusState,
};
pub use namespace::{pool_spec, split_pool_spec};
pub use plain_clone::cloned_without_librbd;
pub use pool::{ConnectionPool, PoolOptions};
pub use remove::removed_without_librbd;
pub use repair::ChildLink;
pub use space::{SPARSE_SIZE, sparse_size};
