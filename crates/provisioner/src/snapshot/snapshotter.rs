//! The contract a snapshot backend implements.
//!
//! A backend implements [`Snapshotter`]; the library's content controller
//! ([`crate::snapshot::run`]) does all the Kubernetes work, as external-snapshotter's
//! sidecar-controller does for a CSI driver: watching VolumeSnapshotContents of the backend's
//! drivers, the being-created annotation, the status, `status.error` and events, the
//! finalizer, retries with backoff.
//!
//! # What the backend is asked
//!
//! - [`Snapshotter::create_snapshot`] for a dynamic content (`spec.source.volumeHandle`), once
//!   it is bound to its VolumeSnapshot. The request name is `snapshot-<VolumeSnapshot uid>`:
//!   deterministic, so a retry (after a crash, a timeout or a failed status write) must find the
//!   snapshot it made before instead of making a second one.
//! - [`Snapshotter::check_snapshot`] for a pre-provisioned content
//!   (`spec.source.snapshotHandle`): does the snapshot exist, how large, since when.
//! - [`Snapshotter::delete_snapshot`] when a content with policy `Delete` goes. A snapshot that
//!   is already gone, or a handle the backend does not recognise, is a success.
//!
//! # Who fills what
//!
//! The backend returns a [`SnapshotInfo`]; the library writes it to the content's status
//! (`snapshotHandle`, `readyToUse: true`, `creationTime` in nanoseconds, `restoreSize` in bytes
//! when not zero) and clears `status.error`.
//!
//! # Errors
//!
//! Every error is recorded (`status.error`, a Warning event) and the content retried with the
//! per-item backoff. [`SnapshotError`] says whether the operation may still have happened:
//! only an [`SnapshotError::Uncertain`] create keeps the being-created annotation, so that a
//! content deleted meanwhile first completes the create (idempotent) and then deletes, and no
//! snapshot is left behind.

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;

use crate::volume::{BoxError, SecretRef};

/// The secrets a snapshot operation may use, as the content and its class name them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotSecrets {
    /// The snapshotter secret: the content's annotations
    /// `snapshot.storage.kubernetes.io/deletion-secret-{name,namespace}` (the snapshot-controller
    /// sets them from the class's `csi.storage.k8s.io/snapshotter-secret-*` parameters).
    pub snapshotter: Option<SecretRef>,
    /// The class's `csi.storage.k8s.io/snapshotter-list-secret-{name,namespace}`.
    pub list: Option<SecretRef>,
}

/// A snapshot to create (or find, on a retry) of a volume.
#[derive(Clone, Debug)]
pub struct CreateSnapshot {
    /// The request name, `snapshot-<VolumeSnapshot uid>`: stable across retries.
    pub name: String,
    /// The CSI volume handle of the source volume (`spec.source.volumeHandle`).
    pub source_volume: String,
    /// The VolumeSnapshotClass, if the content names one.
    pub class_name: Option<String>,
    /// The class's parameters without the `csi.storage.k8s.io/snapshotter-*` secret keys
    /// (those are in `secrets`).
    pub parameters: BTreeMap<String, String>,
    /// Secrets named by the content and its class.
    pub secrets: SnapshotSecrets,
}

/// A pre-provisioned snapshot to look up.
#[derive(Clone, Debug)]
pub struct CheckSnapshot {
    /// The snapshot's handle (`spec.source.snapshotHandle`).
    pub handle: String,
    /// Secrets named by the content and its class.
    pub secrets: SnapshotSecrets,
}

/// A snapshot to delete.
#[derive(Clone, Debug)]
pub struct DeleteSnapshot {
    /// The snapshot's handle (the status's, else `spec.source.snapshotHandle`).
    pub handle: String,
    /// The source volume's handle, for a dynamic content.
    pub source_volume: Option<String>,
    /// Secrets named by the content and its class.
    pub secrets: SnapshotSecrets,
}

/// A snapshot that exists and can be restored from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The handle the library records in `status.snapshotHandle`, and passes back to
    /// [`Snapshotter::delete_snapshot`] and to restores.
    pub handle: String,
    /// The smallest volume a restore needs, in bytes (0: unknown, not recorded).
    pub size_bytes: u64,
    /// When the snapshot was taken.
    pub created: SystemTime,
}

/// Why a snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The request cannot succeed as it is (a malformed handle, an unknown class parameter,
    /// missing credentials): nothing was done. Recorded and retried with backoff, since the
    /// content, its class or a secret may be fixed meanwhile (as the sidecar does).
    #[error(transparent)]
    Final(BoxError),
    /// Nothing was done, and a later attempt may succeed as it is (a secret that cannot be read
    /// now, a snapshot in use). Recorded and retried with backoff.
    #[error(transparent)]
    Retriable(BoxError),
    /// The operation may have happened or may still be under way (a timeout, a lost
    /// connection). Recorded and retried with backoff; a create keeps the being-created
    /// annotation, so deleting the content completes the create first.
    #[error(transparent)]
    Uncertain(BoxError),
}

impl SnapshotError {
    /// A [`SnapshotError::Final`] from any error or message.
    pub fn final_error(error: impl Into<BoxError>) -> Self {
        Self::Final(error.into())
    }
    /// A [`SnapshotError::Retriable`] from any error or message.
    pub fn retriable(error: impl Into<BoxError>) -> Self {
        Self::Retriable(error.into())
    }
    /// A [`SnapshotError::Uncertain`] from any error or message.
    pub fn uncertain(error: impl Into<BoxError>) -> Self {
        Self::Uncertain(error.into())
    }
    /// Whether the operation may have happened.
    #[must_use]
    pub fn is_uncertain(&self) -> bool {
        matches!(self, Self::Uncertain(_))
    }
}

/// A storage backend that creates, checks and deletes snapshots.
///
/// Used from many tokio tasks at once behind `Arc<dyn Snapshotter>`.
#[async_trait]
pub trait Snapshotter: Send + Sync {
    /// The `spec.driver` values of the contents this backend handles.
    fn driver_names(&self) -> Vec<String>;

    /// Creates (or finds, on a retry) the snapshot `request.name` of `request.source_volume`.
    async fn create_snapshot(
        &self,
        request: &CreateSnapshot,
    ) -> Result<SnapshotInfo, SnapshotError>;

    /// Looks up a pre-provisioned snapshot; not finding it is an error.
    async fn check_snapshot(&self, request: &CheckSnapshot) -> Result<SnapshotInfo, SnapshotError>;

    /// Deletes a snapshot; already gone is a success.
    async fn delete_snapshot(&self, request: &DeleteSnapshot) -> Result<(), SnapshotError>;
}
