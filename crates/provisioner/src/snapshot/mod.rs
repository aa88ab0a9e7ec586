//! Snapshots: a generic VolumeSnapshotContent controller, what external-snapshotter v8.3's
//! csi-snapshotter sidecar (`pkg/sidecar-controller`) does for one driver, over a
//! [`Snapshotter`] backend ([`snapshotter`], the one file a backend author reads), and typed
//! snapshot resources ([`types`]). The common snapshot-controller (a cluster add-on) turns
//! VolumeSnapshots into contents; this fills them.
//!
//! Ours: contents whose `spec.driver` is one of [`Snapshotter::driver_names`].
//!
//! # Flow, per content
//!
//! 1. Dynamic (`spec.source.volumeHandle`), bound (`spec.volumeSnapshotRef.uid`), not ready:
//!    annotate `snapshot.storage.kubernetes.io/volumesnapshot-being-created: yes`, call
//!    [`Snapshotter::create_snapshot`] (request name `snapshot-<VolumeSnapshot uid>`; the
//!    class's parameters without the `csi.storage.k8s.io/snapshotter-{,list-}secret-*` keys),
//!    patch `/status` (`snapshotHandle`, `readyToUse`, `creationTime` in ns, `restoreSize` in
//!    bytes, `error` cleared), drop the annotation.
//! 2. Pre-provisioned (`spec.source.snapshotHandle`), not ready:
//!    [`Snapshotter::check_snapshot`]; found = ready, with its size and creation time.
//! 3. Ready with the being-created annotation left over: the annotation is dropped.
//! 4. Deleted, and marked `snapshot.storage.kubernetes.io/volumesnapshot-being-deleted` by the
//!    snapshot-controller (or a pre-provisioned content never bound): a content still marked
//!    being-created is first completed (step 1 is idempotent, so a crash between annotation and
//!    status leaks nothing); with policy `Delete` [`Snapshotter::delete_snapshot`], then the
//!    status's snapshot fields are cleared; the finalizer
//!    `snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection` is removed.
//! 5. Deleted, not marked: nothing (the snapshot-controller marks it first).
//!
//! # Errors
//!
//! A failed create or check goes to `status.error` (`readyToUse: false`) and a Warning event
//! (`SnapshotCreationFailed`, or `SnapshotContentCheckandUpdateFailed` for a pre-provisioned
//! content), once per distinct message; a failed delete to a `SnapshotDeleteError` event. The
//! content is retried with the per-item backoff (1 s doubling to 5 min by default). The
//! being-created annotation stays only after an [`SnapshotError::Uncertain`] create or a
//! status write that may have been lost: the snapshot may exist.
//!
//! # Secrets
//!
//! The library passes references, never secret data: the content's deletion-secret
//! annotations (set by the snapshot-controller from the class's
//! `csi.storage.k8s.io/snapshotter-secret-*`) and the class's
//! `csi.storage.k8s.io/snapshotter-list-secret-*` ([`SnapshotSecrets`]). The backend reads them.
//!
//! # Caveats
//!
//! Until the snapshot CRDs exist the controller polls for them
//! ([`ContentControllerConfig::api_poll`]) and does nothing else. Every content is looked at
//! again every 15 minutes.

mod controller;
pub mod snapshotter;
pub mod types;

pub use controller::{ContentControllerConfig, run, task};
pub use snapshotter::{
    CheckSnapshot, CreateSnapshot, DeleteSnapshot, SnapshotError, SnapshotInfo, SnapshotSecrets,
    Snapshotter,
};
pub use types::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};

/// The content's finalizer (the snapshot-controller adds it, the content controller removes it).
pub const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// Set on a content while its snapshot is being created.
pub const ANN_BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// Set by the snapshot-controller on a content whose snapshot may be deleted.
pub const ANN_BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// The snapshotter secret's name, on a content.
pub const ANN_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
/// The snapshotter secret's namespace, on a content.
pub const ANN_SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
/// On a content: restores may change the volume mode.
pub const ANN_ALLOW_MODE_CHANGE: &str = "snapshot.storage.kubernetes.io/allow-volume-mode-change";
/// Class parameter: the snapshotter secret's name.
pub const SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-secret-name";
/// Class parameter: the snapshotter secret's namespace.
pub const SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-secret-namespace";
/// Class parameter: the list secret's name (checks of pre-provisioned snapshots).
pub const LIST_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-list-secret-name";
/// Class parameter: the list secret's namespace.
pub const LIST_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-list-secret-namespace";
