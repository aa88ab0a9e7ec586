//! Attaching: a generic VolumeAttachment controller, what external-attacher does for a CSI
//! driver with `attachRequired: true`, over an [`Attacher`] backend ([`attacher`], the one
//! file a backend author reads). kube-controller-manager makes a VolumeAttachment for each
//! volume a pod on a node needs; this attaches it and detaches it when it goes.
//!
//! Ours: VolumeAttachments whose `spec.attacher` is [`Attacher::driver_name`]. The names are
//! external-attacher's (finalizer, annotation, status fields), so the two can take turns on a
//! cluster.
//!
//! # Flow, per VolumeAttachment
//!
//! 1. Not being deleted and not `status.attached`: the PV it names is read, the node's CSI node
//!    ID taken from its CSINode (our driver's entry); the finalizer [`finalizer`]`(driver)` put
//!    on the VolumeAttachment (with the node ID in the annotation [`ANN_NODE_ID`]) and on the
//!    PV; then [`Attacher::attach`], and `status.attached: true`, `attachmentMetadata` (the
//!    publish context), no `attachError`. A failure (also an inline volume,
//!    `spec.source.inlineVolumeSpec`: only PVs are served) sets `status.attachError` (`time`,
//!    `message`) and `attached: false`, and is retried with backoff.
//! 2. Being deleted (`deletionTimestamp`) with our finalizer: [`Attacher::detach`] (skipped
//!    when the PV is gone), then `status.attached: false`, no `detachError`, and the finalizer
//!    removed; a failure sets `status.detachError` and is retried. A PV being deleted that
//!    this VolumeAttachment was the last to name is then released (step 3).
//! 3. A PV being deleted that carries our finalizer and that no VolumeAttachment of ours names
//!    any more: the finalizer removed (on the PV's watch events and at every resync).
//!
//! # Guarantees
//!
//! Finalizers go on before the backend is asked to attach, so a VolumeAttachment or PV deleted
//! meanwhile still gets its detach. Finalizer lists are written as a whole on the
//! resourceVersion just read, and read again on a conflict, so another controller's finalizer
//! is never dropped and a conflict (the status written a moment before) is retried quietly.
//!
//! # Caveats
//!
//! One driver per controller. Every VolumeAttachment and PV is looked at again every
//! [`AttachControllerConfig::resync`] (5 minutes by default).

pub mod attacher;
mod controller;

pub use attacher::{Access, AttachError, AttachRequest, Attacher, DetachRequest};
pub use controller::{AttachControllerConfig, run, task};

use k8s_openapi::api::core::v1::PersistentVolume;

/// The annotation holding the CSI node ID a VolumeAttachment was attached to (external-attacher's).
pub const ANN_NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";

/// external-attacher's finalizer for `driver`: `external-attacher/` and the driver name with
/// every character other than `[a-zA-Z0-9-]` replaced by `-` (and an `X` after a trailing `-`).
#[must_use]
pub fn finalizer(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.ends_with('-') {
        name.push('X');
    }
    format!("external-attacher/{name}")
}

/// Why access modes `modes` (a claim's or a PV's) have no single CSI access mode, in
/// external-attacher's words (csi-lib-utils `ToCSIAccessMode`), which refuses to attach such a
/// PV; `None` when they have one.
///
/// `ReadWriteOnce` with `ReadOnlyMany` is the one that matters: Kubernetes' attach/detach
/// controller lets a PV with `ReadOnlyMany` among its modes be attached to several nodes at
/// once, and nothing would stop each of them from writing (`ReadWriteMany`, allowed for raw
/// block volumes, takes precedence: several writers are what it asks for).
#[must_use]
pub fn unsupported_access_modes(modes: &[String]) -> Option<&'static str> {
    let has = |mode: &str| modes.iter().any(|m| m == mode);
    if has("ReadWriteOncePod") && modes.iter().any(|m| m != "ReadWriteOncePod") {
        return Some(
            "Kubernetes does not support use of ReadWriteOncePod with other access modes on \
             the same PersistentVolume",
        );
    }
    if has("ReadWriteOnce") && has("ReadOnlyMany") && !has("ReadWriteMany") {
        return Some(
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume \
             (Kubernetes would attach it to several nodes, each of which could write)",
        );
    }
    None
}

/// How `volume` may be shared, as external-attacher derives it: a PV whose access modes are
/// all `ReadOnlyMany`, or whose CSI source says `readOnly`, is read-only; one without
/// `ReadWriteMany`/`ReadOnlyMany` is single-node.
///
/// # Errors
/// Access modes [`unsupported_access_modes`] refuses, as the message external-attacher gives,
/// naming `spec.accessModes`.
pub fn access(volume: &PersistentVolume) -> Result<Access, String> {
    let spec = volume.spec.as_ref();
    let modes = spec
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    if let Some(why) = unsupported_access_modes(&modes) {
        return Err(format!("spec.accessModes {modes:?}: {why}"));
    }
    let multi_node = modes
        .iter()
        .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
    let read_only = (!modes.is_empty() && modes.iter().all(|m| m == "ReadOnlyMany"))
        || spec
            .and_then(|s| s.csi.as_ref())
            .and_then(|c| c.read_only)
            .unwrap_or(false);
    Ok(Access {
        multi_node,
        read_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finalizer_is_external_attachers() {
        assert_eq!(
            finalizer("rbd.provisioner.ceph.io"),
            "external-attacher/rbd-provisioner-ceph-io"
        );
        assert_eq!(finalizer("a.b/"), "external-attacher/a-b-X");
    }

    fn pv(modes: &[&str], read_only: Option<bool>) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pv"},
            "spec": {
                "accessModes": modes,
                "csi": {"driver": "d", "volumeHandle": "h", "readOnly": read_only},
            }
        }))
        .unwrap()
    }

    fn shared(multi_node: bool, read_only: bool) -> Access {
        Access {
            multi_node,
            read_only,
        }
    }

    #[test]
    fn access_follows_the_pv() {
        let ok = |modes: &[&str], read_only| access(&pv(modes, read_only)).unwrap();
        assert_eq!(ok(&["ReadWriteOnce"], None), shared(false, false));
        assert_eq!(ok(&["ReadWriteOncePod"], None), shared(false, false));
        assert_eq!(ok(&["ReadOnlyMany"], None), shared(true, true));
        assert_eq!(ok(&["ReadWriteMany"], None), shared(true, false));
        assert_eq!(ok(&["ReadWriteOnce"], Some(true)), shared(false, true));
        // ReadWriteMany takes precedence, as in external-attacher
        assert_eq!(
            ok(&["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"], None),
            shared(true, false)
        );
    }

    #[test]
    fn read_write_once_with_read_only_many_is_refused_not_shared_read_write() {
        let err = access(&pv(&["ReadWriteOnce", "ReadOnlyMany"], None)).unwrap_err();
        assert!(
            err.contains("spec.accessModes")
                && err.contains("CSI does not support ReadOnlyMany and ReadWriteOnce"),
            "{err}"
        );
        let err = access(&pv(&["ReadWriteOncePod", "ReadOnlyMany"], None)).unwrap_err();
        assert!(
            err.contains("ReadWriteOncePod with other access modes"),
            "{err}"
        );
        assert_eq!(unsupported_access_modes(&["ReadOnlyMany".to_owned()]), None);
    }
}
