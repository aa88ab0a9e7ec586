//! A generic external-provisioning controller: the Rust counterpart of
//! `sig-storage-lib-external-provisioner`.
//!
//! A storage backend implements [`Provisioner`] (and optionally [`Expander`]) from [`volume`];
//! this crate does the Kubernetes side.

pub mod quantity;
pub mod volume;

pub use volume::{
    DeleteError, ExpandError, ExpandOutcome, Expander, ProvisionError, ProvisionOptions,
    Provisioned, Provisioner, SecretRef,
};
