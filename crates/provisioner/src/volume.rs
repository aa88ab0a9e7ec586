//! The contract a storage backend implements.
//!
//! A backend implements [`Provisioner`] (and optionally [`Expander`]); the library does all the
//! Kubernetes work: watching claims, deciding which ones are ours, saving and deleting
//! PersistentVolumes, events, retries, metrics and leader election.
//!
//! # Who fills what in the PersistentVolume
//!
//! The backend returns a [`Provisioned`] whose `volume` carries the **spec it knows about**: the
//! volume source (`spec.csi`, `spec.rbd`, ...), `spec.capacity`, `spec.accessModes`,
//! `spec.volumeMode`, `spec.nodeAffinity`, and any labels/annotations of its own. The library then
//! sets, overwriting whatever the backend put there:
//!
//! - `metadata.name` (= [`ProvisionOptions::pv_name`], `pvc-<claim uid>`),
//! - `spec.claimRef` (kind, namespace, name, uid, resourceVersion of the claim; never selfLink),
//! - `spec.storageClassName`, `spec.persistentVolumeReclaimPolicy` (default `Delete`) and
//!   `spec.mountOptions` from the StorageClass,
//! - the annotation `pv.kubernetes.io/provisioned-by` (our provisioner name),
//! - the finalizer `external-provisioner.volume.kubernetes.io/finalizer` when enabled,
//! - the annotations recording [`Provisioned::deletion_secret`] (read back with
//!   [`deletion_secret`]), so that [`Provisioner::delete`] never needs the StorageClass, which may
//!   be gone by then.
//!
//! If the backend leaves `spec.accessModes` or `spec.volumeMode` empty, the claim's are used.
//!
//! # Idempotency
//!
//! `provision` may be called again for the same `pv_name` after a crash, a timeout or a failed PV
//! save; it must then find (not duplicate) the volume it created before. `delete` of a volume that
//! is already gone must succeed.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

/// Any error a backend wants to report; its `Display` (and source chain) ends up in events.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Annotation holding the name of the secret [`Provisioner::delete`] needs.
pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
/// Annotation holding the namespace of the secret [`Provisioner::delete`] needs.
pub const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";

/// Everything a backend needs to create one volume.
#[derive(Clone, Debug)]
pub struct ProvisionOptions {
    /// The claim's StorageClass (its `parameters` are the backend's to interpret).
    pub storage_class: StorageClass,
    /// The name the PersistentVolume will get: `pvc-<claim uid>`. Deterministic, so a backend can
    /// derive its volume name from it and find its own volume on a retry.
    pub pv_name: String,
    /// The claim being provisioned.
    pub claim: PersistentVolumeClaim,
    /// The node the scheduler picked (`volume.kubernetes.io/selected-node`), for
    /// WaitForFirstConsumer classes; `None` for Immediate binding.
    pub selected_node: Option<Node>,
}

impl ProvisionOptions {
    /// The claim's `spec.resources.requests.storage` in bytes, if set and parseable.
    #[must_use]
    pub fn requested_bytes(&self) -> Option<u64> {
        crate::quantity::claim_request_bytes(&self.claim)
    }
}

/// A successfully provisioned volume.
#[derive(Clone, Debug, Default)]
pub struct Provisioned {
    /// The PersistentVolume as far as the backend knows it (see the module doc for the split).
    pub volume: PersistentVolume,
    /// The secret [`Provisioner::delete`] will need, recorded on the PV as annotations.
    pub deletion_secret: Option<SecretRef>,
}

/// A reference to a Secret by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// Namespace of the Secret.
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
}

/// Reads the deletion secret the library recorded on a PV we provisioned.
#[must_use]
pub fn deletion_secret(volume: &PersistentVolume) -> Option<SecretRef> {
    let annotations: &BTreeMap<String, String> = volume.metadata.annotations.as_ref()?;
    Some(SecretRef {
        name: annotations.get(ANN_DELETION_SECRET_NAME)?.clone(),
        namespace: annotations.get(ANN_DELETION_SECRET_NAMESPACE)?.clone(),
    })
}

/// Why provisioning failed, and what the library should do about it.
///
/// Whatever the kind, the claim is retried with backoff while it still needs a volume; the kinds
/// differ in what happens around that.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The attempt is over and no backend operation is left in progress. A `ProvisioningFailed`
    /// Warning is emitted; the claim is retried; if the claim is deleted, nothing is left to do.
    #[error(transparent)]
    Final(BoxError),
    /// The backend may still be creating the volume (e.g. a timeout). Retried even if the claim
    /// is deleted meanwhile, until `provision` returns success or `Final`; a volume that shows up
    /// after the claim is gone is deleted again with [`Provisioner::delete`].
    #[error(transparent)]
    InBackground(BoxError),
    /// The selected node cannot host the volume (WaitForFirstConsumer): the library removes
    /// `volume.kubernetes.io/selected-node` from the claim so the scheduler picks again.
    #[error(transparent)]
    Reschedule(BoxError),
    /// Not for us after all (e.g. another instance handles it): no event, no retry until the
    /// claim changes or the periodic resync.
    #[error(transparent)]
    Ignored(BoxError),
}

impl ProvisionError {
    /// A [`ProvisionError::Final`] from any error or message.
    pub fn final_error(error: impl Into<BoxError>) -> Self {
        Self::Final(error.into())
    }
    /// A [`ProvisionError::InBackground`] from any error or message.
    pub fn in_background(error: impl Into<BoxError>) -> Self {
        Self::InBackground(error.into())
    }
    /// A [`ProvisionError::Reschedule`] from any error or message.
    pub fn reschedule(error: impl Into<BoxError>) -> Self {
        Self::Reschedule(error.into())
    }
    /// A [`ProvisionError::Ignored`] from any error or message.
    pub fn ignored(error: impl Into<BoxError>) -> Self {
        Self::Ignored(error.into())
    }
}

/// Why deleting a volume failed.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// The volume could not be deleted now (e.g. still in use): a `VolumeFailedDelete` Warning
    /// is emitted and the deletion is retried with backoff. The PV is kept.
    #[error(transparent)]
    Failed(BoxError),
    /// Not ours to delete: no event, no retry, the PV is kept.
    #[error(transparent)]
    Ignored(BoxError),
}

impl DeleteError {
    /// A [`DeleteError::Failed`] from any error or message.
    pub fn failed(error: impl Into<BoxError>) -> Self {
        Self::Failed(error.into())
    }
    /// A [`DeleteError::Ignored`] from any error or message.
    pub fn ignored(error: impl Into<BoxError>) -> Self {
        Self::Ignored(error.into())
    }
}

/// Why expanding a volume failed: a `VolumeResizeFailed` Warning and a retry with backoff.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ExpandError(pub BoxError);

impl ExpandError {
    /// An [`ExpandError`] from any error or message.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}

/// The result of a successful controller-side expansion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpandOutcome {
    /// The volume's size now, in bytes (at least the requested size; backends may round up).
    pub capacity_bytes: u64,
    /// `true` when the filesystem on the node still has to grow (the claim gets the
    /// `FileSystemResizePending` condition); `false` when the claim can be reported resized now
    /// (e.g. raw block volumes).
    pub node_expansion_required: bool,
}

/// A storage backend that creates and deletes volumes.
///
/// Used from many tokio tasks at once behind `Arc<dyn Provisioner>`.
#[async_trait]
pub trait Provisioner: Send + Sync {
    /// Creates (or finds, on a retry) the volume for `options.pv_name`.
    async fn provision(&self, options: ProvisionOptions) -> Result<Provisioned, ProvisionError>;

    /// Deletes the backend volume of a released PV we provisioned. The PV object itself is
    /// deleted by the library afterwards. A volume that is already gone is a success.
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError>;

    /// Qualifier: return `false` to leave a claim that passed the ownership rules alone
    /// (no event). Default: `true`.
    fn should_provision(&self, _claim: &PersistentVolumeClaim, _class: &StorageClass) -> bool {
        true
    }

    /// Deletion guard: return `false` to keep a released PV (and its volume). Default: `true`.
    fn should_delete(&self, _volume: &PersistentVolume) -> bool {
        true
    }

    /// Whether claims with `volumeMode: Block` may be provisioned. Default: `false`
    /// (such claims are refused with an event).
    fn supports_block(&self) -> bool {
        false
    }
}

/// A storage backend that grows volumes (controller side).
#[async_trait]
pub trait Expander: Send + Sync {
    /// Grows the volume behind `volume` to at least `new_size_bytes` bytes. Must be idempotent:
    /// a volume already that large is a success.
    async fn expand(
        &self,
        volume: &PersistentVolume,
        new_size_bytes: u64,
    ) -> Result<ExpandOutcome, ExpandError>;
}
