//! The contract an attach backend implements.
//!
//! A backend implements [`Attacher`]; the library's VolumeAttachment controller
//! ([`crate::attach::run`]) does all the Kubernetes work, as external-attacher does for a CSI
//! driver with `attachRequired: true`: watching the VolumeAttachments of the backend's driver,
//! the finalizers on them and on their PersistentVolumes, the node's CSI node ID from its
//! CSINode, `status.attached`, `attachmentMetadata`, `attachError` and `detachError`, retries
//! with backoff.
//!
//! # What the backend is asked
//!
//! - [`Attacher::attach`] for a VolumeAttachment not attached yet, once both finalizers are on
//!   (so a detach always follows an attach that may have happened): make the volume usable on
//!   the node, as CSI `ControllerPublishVolume` does. Asked again after a failure or a lost
//!   status write, so attaching a volume already attached to that node the same way must
//!   succeed. A refusal (a single-node volume the node cannot have while another node has it)
//!   is an error whose message says why; it becomes the VolumeAttachment's `attachError`.
//! - [`Attacher::detach`] for a VolumeAttachment being deleted: the volume no longer usable on
//!   the node, as CSI `ControllerUnpublishVolume`. A volume not attached there, or gone, is a
//!   success. Not asked when the PersistentVolume itself is gone: nothing names the volume any
//!   more.
//!
//! # Who fills what
//!
//! The library reads the PersistentVolume the VolumeAttachment names
//! (`spec.source.persistentVolumeName`; inline volumes are refused with an `attachError`), the
//! node's CSI node ID (its CSINode's entry for the driver, kept in the VolumeAttachment's
//! annotation `csi.alpha.kubernetes.io/node-id` for the detach) and how the volume may be shared
//! ([`Access`], from the PV's access modes and `spec.csi.readOnly`). The backend gets them
//! whole and returns the publish context, which the library writes to
//! `status.attachmentMetadata`.
//!
//! # Errors
//!
//! Every error is recorded (`status.attachError` or `status.detachError`, with its time and
//! message) and the VolumeAttachment retried with the per-item backoff until it succeeds, so
//! there is one kind: [`AttachError`], whose `Display` is the message written to the status.

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;

use crate::volume::BoxError;

/// How a volume may be used, as external-attacher derives it from the PersistentVolume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Several nodes may have the volume at once: the PV's access modes include
    /// `ReadWriteMany` or `ReadOnlyMany`. Otherwise (`ReadWriteOnce`, `ReadWriteOncePod`) one
    /// node at a time.
    pub multi_node: bool,
    /// Nodes may only read: the PV's access modes are all `ReadOnlyMany`, or its CSI source
    /// says `readOnly`.
    pub read_only: bool,
}

/// A volume to make usable on a node.
#[derive(Clone, Copy, Debug)]
pub struct AttachRequest<'a> {
    /// The PersistentVolume the VolumeAttachment names, as read just before the call.
    pub volume: &'a PersistentVolume,
    /// The node's CSI node ID (its CSINode's entry for the driver).
    pub node_id: &'a str,
    /// How the volume may be shared, from `volume`.
    pub access: Access,
}

/// A volume no longer to be usable on a node.
#[derive(Clone, Copy, Debug)]
pub struct DetachRequest<'a> {
    /// The PersistentVolume the VolumeAttachment names, as read just before the call.
    pub volume: &'a PersistentVolume,
    /// The CSI node ID the volume was attached to (the VolumeAttachment's annotation, else the
    /// node's CSINode).
    pub node_id: &'a str,
}

/// Why an attach or a detach failed; its `Display` becomes `attachError`/`detachError`.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct AttachError(BoxError);

impl AttachError {
    /// An [`AttachError`] from any error or message.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}

/// A storage backend that attaches volumes to nodes and detaches them.
///
/// Used from the controller's tasks behind `Arc<dyn Attacher>`.
#[async_trait]
pub trait Attacher: Send + Sync {
    /// The CSI driver name whose VolumeAttachments (`spec.attacher`) this backend serves, and
    /// whose entry in a node's CSINode holds the node ID.
    fn driver_name(&self) -> String;

    /// Makes `request.volume` usable on `request.node_id` (idempotent); returns the publish
    /// context for `status.attachmentMetadata` (may be empty).
    async fn attach(
        &self,
        request: &AttachRequest<'_>,
    ) -> Result<BTreeMap<String, String>, AttachError>;

    /// Makes `request.volume` no longer usable on `request.node_id`; not attached there is a
    /// success.
    async fn detach(&self, request: &DetachRequest<'_>) -> Result<(), AttachError>;
}
