//! Claims with a data source: what external-provisioner v6.3 (`controller.go`,
//! `clone_controller.go`) checks before restoring a `VolumeSnapshot` or cloning a
//! `PersistentVolumeClaim`, and the protection finalizers it holds on the source meanwhile.
//! The Ceph side (the clone, its growth, its chain depth) is the volume core's
//! ([`rbd_volume::snapshot::clone_volume`]).
//!
//! Checks, each failure an error naming the field:
//! - `VolumeSnapshot`: exists in the claim's namespace, not being deleted, `status.readyToUse`,
//!   bound to a content whose `volumeSnapshotRef` names it (uid included), whose `spec.driver`
//!   is ours and which has `status.snapshotHandle`; the claim's request is at least
//!   `status.restoreSize`; the claim's volume mode equals the content's `sourceVolumeMode`
//!   unless the content has `snapshot.storage.kubernetes.io/allow-volume-mode-change: "true"`.
//! - `PersistentVolumeClaim`: exists in the claim's namespace, not being deleted, Bound, names
//!   a class; the claim's request is at least the source's; its PV is Bound to it (claimRef
//!   uid) and is one of ours (an in-tree `rbd` PV or a CSI PV of our driver); equal volume
//!   modes.
//!
//! The source holds `provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection`
//! (snapshot) or `.../cloning-protection` (claim) from before the clone until no Pending claim
//! uses it any more ([`provisioner::data_source::protection`]).

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use kube::{Client, ResourceExt};
use provisioner::data_source::{DataSource, data_source};
pub use provisioner::snapshot::ANN_ALLOW_MODE_CHANGE;
use provisioner::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
use rbd_volume::snapshot::SnapshotId;

use crate::backend::pv_build::{ImageLocation, image_location};

fn snapshots(client: &Client, ns: &str) -> Api<VolumeSnapshot> {
    Api::namespaced(client.clone(), ns)
}

/// A resolved, checked source.
#[derive(Clone, Debug)]
pub enum Resolved {
    /// Restore from this snapshot (its handle as the content has it).
    Snapshot {
        vs: String,
        id: SnapshotId,
        handle: String,
    },
    /// Clone this claim's image.
    Volume {
        claim: String,
        location: ImageLocation,
    },
}

impl Resolved {
    /// The source as the claim names it (for its protection finalizer).
    #[must_use]
    pub fn data_source(&self) -> DataSource {
        match self {
            Resolved::Snapshot { vs, .. } => DataSource::Snapshot(vs.clone()),
            Resolved::Volume { claim, .. } => DataSource::Claim(claim.clone()),
        }
    }
}

fn volume_mode(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem")
}

fn request_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    provisioner::quantity::claim_request_bytes(claim)
}

/// The claim's source, checked; `None` without one.
///
/// # Errors
/// A message naming the field and the problem (also for API errors reading the source).
pub async fn resolve(
    client: &Client,
    drivers: &[&str],
    csi_driver: &str,
    claim: &PersistentVolumeClaim,
) -> Result<Option<Resolved>, String> {
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
        DataSource::Snapshot(name) => snapshot(client, drivers, claim, &ns, &name, field)
            .await
            .map(Some),
        DataSource::Claim(name) => volume(client, csi_driver, claim, &ns, &name, field)
            .await
            .map(Some),
    }
}

async fn snapshot(
    client: &Client,
    drivers: &[&str],
    claim: &PersistentVolumeClaim,
    ns: &str,
    name: &str,
    field: &str,
) -> Result<Resolved, String> {
    let what = format!("{field}: VolumeSnapshot {ns}/{name}");
    let vs = snapshots(client, ns)
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
    check_snapshot(claim, &vs, &content, drivers, &what)
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
pub fn check_snapshot(
    claim: &PersistentVolumeClaim,
    vs: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
    drivers: &[&str],
    what: &str,
) -> Result<Resolved, String> {
    let name = vs.metadata.name.as_deref().unwrap_or_default();
    let ns = vs.metadata.namespace.as_deref().unwrap_or_default();
    let content_name = content.metadata.name.as_deref().unwrap_or_default();
    let snapshot_ref = &content.spec.volume_snapshot_ref;
    let ref_ok = snapshot_ref.name.as_deref() == Some(name)
        && snapshot_ref.namespace.as_deref() == Some(ns)
        && snapshot_ref.uid == vs.metadata.uid;
    if !ref_ok {
        return Err(format!(
            "{what}: VolumeSnapshotContent {content_name} is bound to another snapshot \
             (spec.volumeSnapshotRef does not name it)"
        ));
    }
    let driver = content.spec.driver.as_str();
    if !drivers.contains(&driver) {
        return Err(format!(
            "{what}: VolumeSnapshotContent {content_name} has spec.driver {driver:?}, not ours ({})",
            drivers.join(" or ")
        ));
    }
    let handle = content.status_handle().ok_or_else(|| {
        format!("{what}: VolumeSnapshotContent {content_name} has no status.snapshotHandle")
    })?;
    let id = SnapshotId::parse(handle).map_err(|e| {
        format!("{what}: VolumeSnapshotContent {content_name} status.snapshotHandle: {e}")
    })?;
    let restore = vs
        .status
        .as_ref()
        .and_then(|s| s.restore_size.as_ref())
        .and_then(|q| provisioner::quantity::parse_bytes(&q.0))
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
        id,
        handle: handle.to_owned(),
    })
}

async fn volume(
    client: &Client,
    csi_driver: &str,
    claim: &PersistentVolumeClaim,
    ns: &str,
    name: &str,
    field: &str,
) -> Result<Resolved, String> {
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
    check_source_volume(&source, &pv, csi_driver, &what)
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

/// The source claim's PV is Bound to it and is ours. Pure.
///
/// # Errors
/// Which of those it is not.
pub fn check_source_volume(
    source: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    csi_driver: &str,
    what: &str,
) -> Result<Resolved, String> {
    let name = source.metadata.name.as_deref().unwrap_or_default();
    let ns = source.metadata.namespace.as_deref().unwrap_or_default();
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let bound_to_it = claim_ref.is_some_and(|r| {
        r.name.as_deref() == Some(name)
            && r.namespace.as_deref() == Some(ns)
            && r.uid == source.metadata.uid
    });
    if !bound_to_it || pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(format!(
            "{what}: its PersistentVolume {pv_name} is not Bound to it (spec.claimRef)"
        ));
    }
    let location = image_location(pv, csi_driver).ok_or_else(|| {
        format!(
            "{what}: its PersistentVolume {pv_name} is not one of ours (no rbd source, no csi \
             source of driver {csi_driver})"
        )
    })?;
    Ok(Resolved::Volume {
        claim: name.to_owned(),
        location,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVERS: [&str; 2] = ["rbd.provisioner.ceph.io", "ceph.com/rbd"];
    const HANDLE: &str = "s1/10.0.0.1:6789/rbd/csi-snap-0123456789abcdef0123456789abcdef";

    fn claim(size: &str, mode: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "new", "namespace": "ns", "uid": "u-new"},
            "spec": {
                "storageClassName": "rbd",
                "volumeMode": mode,
                "resources": {"requests": {"storage": size}},
            },
        }))
        .unwrap()
    }

    fn vs() -> VolumeSnapshot {
        serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": "snap", "namespace": "ns", "uid": "u-vs"},
            "status": {"readyToUse": true, "boundVolumeSnapshotContentName": "c", "restoreSize": "1Gi"},
        }))
        .unwrap()
    }

    fn content() -> VolumeSnapshotContent {
        serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "c"},
            "spec": {
                "driver": "rbd.provisioner.ceph.io",
                "sourceVolumeMode": "Filesystem",
                "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u-vs"},
            },
            "status": {"snapshotHandle": HANDLE, "readyToUse": true},
        }))
        .unwrap()
    }

    fn check(
        claim: &PersistentVolumeClaim,
        vs: &VolumeSnapshot,
        c: &VolumeSnapshotContent,
    ) -> Result<Resolved, String> {
        check_snapshot(
            claim,
            vs,
            c,
            &DRIVERS,
            "spec.dataSource: VolumeSnapshot ns/snap",
        )
    }

    #[test]
    fn a_ready_snapshot_of_our_driver_restores_into_an_equal_or_larger_claim() {
        for size in ["1Gi", "2Gi"] {
            match check(&claim(size, "Filesystem"), &vs(), &content()).unwrap() {
                Resolved::Snapshot { vs, handle, id } => {
                    assert_eq!((vs.as_str(), handle.as_str()), ("snap", HANDLE));
                    assert_eq!(id.pool, "rbd");
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(snapshot_ready(&vs(), "x").unwrap(), "c");
    }

    #[test]
    fn restores_are_refused_with_the_field_named() {
        let e = check(&claim("512Mi", "Filesystem"), &vs(), &content()).unwrap_err();
        assert!(
            e.starts_with(
                "spec.resources.requests.storage (536870912 bytes) is smaller than the restore size"
            ),
            "{e}"
        );
        let e = check(&claim("1Gi", "Block"), &vs(), &content()).unwrap_err();
        assert!(e.starts_with("spec.volumeMode \"Block\" differs"), "{e}");
        let mut allowed = content();
        allowed.metadata.annotations =
            Some([(ANN_ALLOW_MODE_CHANGE.to_string(), "true".to_string())].into());
        assert!(check(&claim("1Gi", "Block"), &vs(), &allowed).is_ok());
        let mut other = content();
        other.spec.driver = "other.csi.io".into();
        assert!(
            check(&claim("1Gi", "Filesystem"), &vs(), &other)
                .unwrap_err()
                .contains("spec.driver \"other.csi.io\"")
        );
        let mut rebound = content();
        rebound.spec.volume_snapshot_ref.uid = Some("u-old".into());
        assert!(
            check(&claim("1Gi", "Filesystem"), &vs(), &rebound)
                .unwrap_err()
                .contains("spec.volumeSnapshotRef")
        );
        let mut no_handle = content();
        no_handle.status = serde_json::from_value(json!({"readyToUse": true})).unwrap();
        assert!(
            check(&claim("1Gi", "Filesystem"), &vs(), &no_handle)
                .unwrap_err()
                .contains("status.snapshotHandle")
        );
        let mut unready = vs();
        if let Some(status) = unready.status.as_mut() {
            status.ready_to_use = Some(false);
        }
        assert!(
            snapshot_ready(&unready, "x")
                .unwrap_err()
                .contains("status.readyToUse")
        );
        let mut deleting = vs();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(
            snapshot_ready(&deleting, "x")
                .unwrap_err()
                .contains("being deleted")
        );
    }

    fn source(phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "src", "namespace": "ns", "uid": "u-src"},
            "spec": {
                "storageClassName": "rbd", "volumeMode": "Filesystem", "volumeName": "pvc-src",
                "resources": {"requests": {"storage": "1Gi"}},
            },
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn pv(driver: &str, uid: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-src"},
            "spec": {
                "claimRef": {"name": "src", "namespace": "ns", "uid": uid},
                "csi": {"driver": driver, "volumeHandle": "v1/10.0.0.1:6789/rbd/img"},
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn a_bound_claim_of_ours_clones_and_others_are_refused() {
        let what = "spec.dataSource: PersistentVolumeClaim ns/src";
        assert_eq!(
            check_source_claim(&claim("1Gi", "Filesystem"), &source("Bound"), what).unwrap(),
            "pvc-src"
        );
        match check_source_volume(&source("Bound"), &pv(DRIVERS[0], "u-src"), DRIVERS[0], what)
            .unwrap()
        {
            Resolved::Volume { claim, location } => {
                assert_eq!((claim.as_str(), location.image.as_str()), ("src", "img"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            check_source_claim(&claim("1Gi", "Filesystem"), &source("Pending"), what)
                .unwrap_err()
                .ends_with("is not Bound")
        );
        let e =
            check_source_claim(&claim("100Mi", "Filesystem"), &source("Bound"), what).unwrap_err();
        assert!(e.starts_with("spec.resources.requests.storage"), "{e}");
        let e = check_source_claim(&claim("1Gi", "Block"), &source("Bound"), what).unwrap_err();
        assert!(e.starts_with("spec.volumeMode"), "{e}");
        let e = check_source_volume(
            &source("Bound"),
            &pv(DRIVERS[0], "u-other"),
            DRIVERS[0],
            what,
        )
        .unwrap_err();
        assert!(e.contains("not Bound to it"), "{e}");
        let e = check_source_volume(
            &source("Bound"),
            &pv("other.csi.io", "u-src"),
            DRIVERS[0],
            what,
        )
        .unwrap_err();
        assert!(e.contains("not one of ours"), "{e}");
    }
}
