//! A generic external-provisioning controller: the Rust counterpart of
//! `sig-storage-lib-external-provisioner`. It knows nothing about any storage system.
//!
//! A backend implements [`Provisioner`] (and optionally [`Expander`]) from [`volume`], the one
//! file a backend author needs to read (and optionally [`Modifier`], VolumeAttributesClass
//! modification, from [`modify`]). [`Controller`] does the Kubernetes side: reflectors for
//! claims, volumes and classes, a de-duplicating work queue with per-key backoff, the
//! provision / delete / expand flows, [`events`], [`metrics`] and [`leader`] election.
//!
//! Snapshots: [`snapshot`] holds a VolumeSnapshotContent controller generic over a
//! [`snapshot::Snapshotter`] backend, and the typed snapshot resources. Attaching: [`attach`]
//! holds a VolumeAttachment controller (external-attacher's work) generic over an
//! [`attach::Attacher`] backend.
//!
//! Reclaiming space: [`reclaim_space`] serves csi-addons' ReclaimSpaceJob over a
//! [`reclaim_space::SpaceReclaimer`] backend.
//!
//! Pure decisions live in [`ownership`] (is this claim ours?), [`pv`] (finish a PV, should this
//! PV be deleted?), [`resize`] (does this claim need expansion?) and [`quantity`].

#![warn(clippy::all, clippy::pedantic, missing_docs)]
// Kubernetes kinds and field values (PersistentVolume, WaitForFirstConsumer) are prose here,
// not code; backticking every one would make the docs harder to read.
#![allow(clippy::doc_markdown)]

pub mod attach;
pub mod config;
mod controller;
mod custom_watch;
pub mod data_source;
pub mod events;
pub mod fencing;
mod finalizers;
pub mod leader;
pub mod metrics;
pub mod modify;
pub mod network_fence;
pub mod ownership;
pub mod paged;
pub mod pv;
pub mod quantity;
pub mod queue;
pub mod reclaim_space;
pub mod resize;
pub mod snapshot;
pub mod volume;

pub use config::Config;
pub use controller::{ClaimObserver, Companion, Controller, ControllerError};
pub use leader::{LeaderElectionConfig, LeaderElector, Leadership};
pub use metrics::Metrics;
pub use modify::{Modifier, ModifyError};
pub use volume::{
    DeleteError, ExpandError, ExpandOutcome, Expander, ProvisionError, ProvisionOptions,
    Provisioned, Provisioner, SecretRef,
};
