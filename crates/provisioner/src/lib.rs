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
//! [`reclaim_space::SpaceReclaimer`] backend. Disaster recovery: [`replication`] serves
//! csi-addons' VolumeReplication over a [`replication::VolumeReplicator`] backend.
//!
//! Pure decisions live in [`ownership`] (is this claim ours?), [`pv`] (finish a PV, should this
//! PV be deleted?), [`resize`] (does this claim need expansion?) and [`quantity`].

#![warn(clippy::all, clippy::pedantic, missing_docs)]
// Kubernetes kinds and field values (PersistentVolume, WaitForFirstConsumer) are prose here,
// not code; backticking every one would make the docs harder to read.
#![allow(clippy::doc_markdown)]

/// `kube::Resource` for a typed custom resource whose `metadata` field is its `ObjectMeta`:
/// `custom_resource!(Type, group, version, "Kind", "plural", Scope)`.
macro_rules! custom_resource {
    ($ty:ty, $group:expr, $version:expr, $kind:literal, $plural:literal, $scope:ty) => {
        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = $scope;

            fn kind((): &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group((): &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version((): &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural((): &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

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
pub mod replication;
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
