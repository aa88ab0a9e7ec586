//! What external-provisioner v6.3 checks before it makes a volume from a claim's data source.
//!
//! As `controller.go` (restores) and `clone_controller.go` (clones) do, each failure an error
//! naming the field:
//! - `VolumeSnapshot`: exists in the claim's namespace, not being deleted, `status.readyToUse`,
//!   bound to a content whose `volumeSnapshotRef` names it (uid included), whose `spec.driver`
//!   is ours and which has `status.snapshotHandle`; the claim's request is at least
//!   `status.restoreSize`; the claim's volume mode equals the content's `sourceVolumeMode`
//!   unless the content has `snapshot.storage.kubernetes.io/allow-volume-mode-change: "true"`.
//! - `PersistentVolumeClaim`: exists in the claim's namespace, not being deleted, Bound, names
//!   a class; the claim's request is at least the source's; equal volume modes; its PV is
//!   Bound to it (claimRef uid) and is one of ours.
//!
//! What only the storage system knows comes from a [`SourceBackend`]: which `spec.driver`
//! values are its own, what a snapshot handle means to it, and whether (and where) a source
//! claim's PV holds one of its volumes. The source's protection finalizer while a claim is made
//! from it is [`super::protection`]'s.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::{Client, ResourceExt};

use super::{DataSource, data_source};
use crate::snapshot::{ANN_ALLOW_MODE_CHANGE, VolumeSnapshot, VolumeSnapshotContent};

/// What only the backend knows about a data source.
pub trait SourceBackend {
    /// A snapshot as the backend addresses it, read from a content's `status.snapshotHandle`.
    type Snapshot;
    /// A volume as the backend addresses it, read from a source claim's PersistentVolume.
    type Volume;

    /// The `spec.driver` values of VolumeSnapshotContents the backend restores from.
    fn snapshot_drivers(&self) -> Vec<&str>;

    /// The snapshot behind a content's `status.snapshotHandle`.
    ///
    /// # Errors
    /// What is wrong with the handle (the caller names the content and the field).
    fn snapshot(&self, handle: &str) -> Result<Self::Snapshot, String>;

    /// The volume behind a source claim's PersistentVolume (already checked to be Bound to the
    /// claim).
    ///
    /// # Errors
    /// Why the PersistentVolume is not one of the backend's (the caller names it).
    fn volume(&self, pv: &PersistentVolume) -> Result<Self::Volume, String>;
}

/// A checked source.
#[derive(Clone, Debug)]
pub enum Resolved<S, V> {
    /// Restore from this snapshot.
    Snapshot {
        /// The VolumeSnapshot's name.
        vs: String,
        /// The content's `status.snapshotHandle`, as it has it.
        handle: String,
        /// The snapshot, as the backend read the handle.
        snapshot: S,
    },
    /// Clone this claim's volume.
    Volume {
        /// The source claim's name.
        claim: String,
        /// The volume, as the backend read the source's PersistentVolume.
        volume: V,
    },
}

impl<S, V> Resolved<S, V> {
    /// The source as the claim names it (for its protection finalizer).
    #[must_use]
    pub fn data_source(&self) -> DataSource {
        match self {
            Resolved::Snapshot { vs, .. } => DataSource::Snapshot(vs.clone()),
            Resolved::Volume { claim, .. } => DataSource::Claim(claim.clone()),
        }
    }
}

/// The result of checking a claim's source with `B`.
pub type ResolvedBy<B> = Resolved<<B as SourceBackend>::Snapshot, <B as SourceBackend>::Volume>;

fn volume_mode(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem")
}

fn request_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    crate::quantity::claim_request_bytes(claim)
}

/// `reference` names `object`: the same name and namespace, and the same uid (none on both
/// sides counts as the same, as external-provisioner compares them).
fn refers_to(reference: &ObjectReference, object: &ObjectMeta) -> bool {
    reference.name.as_deref() == Some(object.name.as_deref().unwrap_or_default())
        && reference.namespace.as_deref() == Some(object.namespace.as_deref().unwrap_or_default())
        && reference.uid == object.uid
}

/// The claim's source, read from the API and checked; `None` without one.
///
/// # Errors
/// A message naming the field and the problem (also for API errors reading the source).
pub async fn resolve<B: SourceBackend>(
    client: &Client,
    backend: &B,
    claim: &PersistentVolumeClaim,
) -> Result<Option<ResolvedBy<B>>, String> {
    let Some(source) = data_source(claim)? else {
        return Ok(None);
    };
    let ns = claim.namespace().unwrap_or_else(|| "default".into());
    let field = if claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source_ref.as_ref())
        .is_some()
    {
        "spec.dataSourceRef"
    } else {
        "spec.dataSource"
    };
    match source {
        DataSource::Snapshot(name) => snapshot(client, backend, claim, &ns, &name, field)
            .await
            .map(Some),
        DataSource::Claim(name) => volume(client, backend, claim, &ns, &name, field)
            .await
            .map(Some),
    }
}

async fn snapshot<B: SourceBackend>(
    client: &Client,
    backend: &B,
    claim: &PersistentVolumeClaim,
    ns: &str,
    name: &str,
    field: &str,
) -> Result<ResolvedBy<B>, String> {
    let what = format!("{field}: VolumeSnapshot {ns}/{name}");
    let vs = Api::<VolumeSnapshot>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(|e| format!("{what}: reading it: {e}"))?
        .ok_or_else(|| format!("{what} not found"))?;
    let content_name = snapshot_ready(&vs, &what)?;
    let content = Api::<VolumeSnapshotContent>::all(client.clone())
        .get_opt(content_name)
        .await
        .map_err(|e| format!("{what}: reading VolumeSnapshotContent {content_name}: {e}"))?
        .ok_or_else(|| format!("{what}: its VolumeSnapshotContent {content_name} not found"))?;
    check_snapshot(backend, claim, &vs, &content, &what)
}

/// The VolumeSnapshot may be restored from: not being deleted, ready, bound. Returns its
/// content's name. Pure.
///
/// # Errors
/// Which of those it is not, prefixed with `what`.
pub fn snapshot_ready<'a>(vs: &'a VolumeSnapshot, what: &str) -> Result<&'a str, String> {
    if vs.metadata.deletion_timestamp.is_some() {
        return Err(format!("{what} is being deleted"));
    }
    if !vs.is_ready() {
        return Err(format!(
            "{what} is not ready to use (status.readyToUse is not true)"
        ));
    }
    vs.status
        .as_ref()
        .and_then(|s| s.bound_volume_snapshot_content_name.as_deref())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{what} is not bound to a VolumeSnapshotContent"))
}

/// external-provisioner's checks of a restore from `vs` bound to `content`. Pure.
///
/// # Errors
/// The first failed check, naming the field.
pub fn check_snapshot<B: SourceBackend>(
    backend: &B,
    claim: &PersistentVolumeClaim,
    vs: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
    what: &str,
) -> Result<ResolvedBy<B>, String> {
    let name = vs.metadata.name.as_deref().unwrap_or_default();
    let content_name = content.metadata.name.as_deref().unwrap_or_default();
    if !refers_to(&content.spec.volume_snapshot_ref, &vs.metadata) {
        return Err(format!(
            "{what}: VolumeSnapshotContent {content_name} is bound to another snapshot \
             (spec.volumeSnapshotRef does not name it)"
        ));
    }
    let driver = content.spec.driver.as_str();
    let drivers = backend.snapshot_drivers();
    if !drivers.contains(&driver) {
        return Err(format!(
            "{what}: VolumeSnapshotContent {content_name} has spec.driver {driver:?}, not ours ({})",
            drivers.join(" or ")
        ));
    }
    let handle = content.status_handle().ok_or_else(|| {
        format!("{what}: VolumeSnapshotContent {content_name} has no status.snapshotHandle")
    })?;
    let snapshot = backend.snapshot(handle).map_err(|e| {
        format!("{what}: VolumeSnapshotContent {content_name} status.snapshotHandle: {e}")
    })?;
    let restore = vs
        .status
        .as_ref()
        .and_then(|s| s.restore_size.as_ref())
        .and_then(|q| crate::quantity::parse_bytes(&q.0))
        .or_else(|| {
            content
                .status
                .as_ref()
                .and_then(|s| s.restore_size)
                .and_then(|n| u64::try_from(n).ok())
        });
    if let (Some(restore), Some(requested)) = (restore, request_bytes(claim))
        && requested < restore
    {
        return Err(format!(
            "spec.resources.requests.storage ({requested} bytes) is smaller than the restore \
             size of {what} ({restore} bytes)"
        ));
    }
    let allow_change = content
        .annotations()
        .get(ANN_ALLOW_MODE_CHANGE)
        .is_some_and(|v| v == "true");
    if let Some(source_mode) = content.spec.source_volume_mode.as_deref()
        && source_mode != volume_mode(claim)
        && !allow_change
    {
        return Err(format!(
            "spec.volumeMode {:?} differs from the volume mode {source_mode:?} {what} was taken \
             from (set the annotation {ANN_ALLOW_MODE_CHANGE}: \"true\" on VolumeSnapshotContent \
             {content_name} to allow it)",
            volume_mode(claim)
        ));
    }
    Ok(Resolved::Snapshot {
        vs: name.to_owned(),
        handle: handle.to_owned(),
        snapshot,
    })
}

async fn volume<B: SourceBackend>(
    client: &Client,
    backend: &B,
    claim: &PersistentVolumeClaim,
    ns: &str,
    name: &str,
    field: &str,
) -> Result<ResolvedBy<B>, String> {
    let what = format!("{field}: PersistentVolumeClaim {ns}/{name}");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let source = claims
        .get_opt(name)
        .await
        .map_err(|e| format!("{what}: reading it: {e}"))?
        .ok_or_else(|| format!("{what} not found"))?;
    let pv_name = check_source_claim(claim, &source, &what)?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs
        .get_opt(pv_name)
        .await
        .map_err(|e| format!("{what}: reading its PersistentVolume {pv_name}: {e}"))?
        .ok_or_else(|| format!("{what}: its PersistentVolume {pv_name} not found"))?;
    check_source_volume(backend, &source, &pv, &what)
}

/// external-provisioner's checks of the claim `source` a new `claim` is cloned from: not
/// being deleted, Bound, names a class, its request not larger, the same volume mode. Returns
/// the source's PV name. Pure.
///
/// # Errors
/// The first failed check, naming the field.
pub fn check_source_claim<'a>(
    claim: &PersistentVolumeClaim,
    source: &'a PersistentVolumeClaim,
    what: &str,
) -> Result<&'a str, String> {
    if source.metadata.deletion_timestamp.is_some() {
        return Err(format!("{what} is being deleted"));
    }
    if source.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(format!("{what} is not Bound"));
    }
    let spec = source.spec.as_ref();
    if spec
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
        .is_empty()
    {
        return Err(format!(
            "{what} names no StorageClass (spec.storageClassName)"
        ));
    }
    if let (Some(requested), Some(source_size)) = (request_bytes(claim), request_bytes(source))
        && requested < source_size
    {
        return Err(format!(
            "spec.resources.requests.storage ({requested} bytes) is smaller than the request of \
             {what} ({source_size} bytes)"
        ));
    }
    if volume_mode(claim) != volume_mode(source) {
        return Err(format!(
            "spec.volumeMode {:?} differs from the volume mode {:?} of {what}",
            volume_mode(claim),
            volume_mode(source)
        ));
    }
    spec.and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("{what} has no spec.volumeName"))
}

/// The source claim's PV is Bound to it and is one of the backend's. Pure.
///
/// # Errors
/// Which of those it is not.
pub fn check_source_volume<B: SourceBackend>(
    backend: &B,
    source: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    what: &str,
) -> Result<ResolvedBy<B>, String> {
    let name = source.metadata.name.as_deref().unwrap_or_default();
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let bound_to_it = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| refers_to(r, &source.metadata));
    if !bound_to_it || pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(format!(
            "{what}: its PersistentVolume {pv_name} is not Bound to it (spec.claimRef)"
        ));
    }
    let volume = backend.volume(pv).map_err(|why| {
        format!("{what}: its PersistentVolume {pv_name} is not one of ours ({why})")
    })?;
    Ok(Resolved::Volume {
        claim: name.to_owned(),
        volume,
    })
}

#[cfg(test)]
mod tests;
