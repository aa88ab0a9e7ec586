//! The RBD side of claims with a data source: snapshot handles and source volumes read as images.
//!
//! The checks external-provisioner makes before a restore or a clone are the library's
//! ([`provisioner::data_source::checks`]); this says what only the RBD backend knows: a
//! VolumeSnapshotContent is ours when its `spec.driver` is the CSI driver name or the
//! provisioner name, its `status.snapshotHandle` is a snapshot ID of the volume core
//! ([`SnapshotId`]), and a source claim's PV is ours when it is an in-tree `rbd` PV or a CSI PV
//! of our driver ([`check_source_volume`]). The Ceph side (the clone, its growth, its chain
//! depth) is the volume core's ([`rbd_volume::snapshot::clone_volume`]).

use k8s_openapi::api::core::v1::PersistentVolume;
use provisioner::data_source::checks::{self, SourceBackend};
use rbd_volume::snapshot::SnapshotId;

use crate::backend::pv_build::{ImageLocation, image_location};

/// A checked source: a snapshot by its ID, or a claim's image.
pub type Resolved = checks::Resolved<SnapshotId, ImageLocation>;

/// What the RBD backend knows about data sources.
#[derive(Clone, Copy, Debug)]
pub struct RbdSources<'a> {
    /// The `spec.driver` values of our snapshot contents (CSI driver name, provisioner name).
    pub snapshot_drivers: [&'a str; 2],
    /// The CSI driver name: CSI PVs of this driver are ours.
    pub csi_driver: &'a str,
}

impl SourceBackend for RbdSources<'_> {
    type Snapshot = SnapshotId;
    type Volume = ImageLocation;

    fn snapshot_drivers(&self) -> Vec<&str> {
        self.snapshot_drivers.to_vec()
    }

    fn snapshot(&self, handle: &str) -> Result<SnapshotId, String> {
        SnapshotId::parse(handle).map_err(|e| e.to_string())
    }

    fn volume(&self, pv: &PersistentVolume) -> Result<ImageLocation, String> {
        check_source_volume(pv, self.csi_driver)
    }
}

/// The image of a source claim's PV: an in-tree `rbd` source, or a `csi` source of
/// `csi_driver`. Pure.
///
/// # Errors
/// Why the PV is not one of ours.
pub fn check_source_volume(
    pv: &PersistentVolume,
    csi_driver: &str,
) -> Result<ImageLocation, String> {
    image_location(pv, csi_driver)
        .ok_or_else(|| format!("no rbd source, no csi source of driver {csi_driver}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use provisioner::snapshot::{VolumeSnapshot, VolumeSnapshotContent};
    use serde_json::json;

    const DRIVERS: [&str; 2] = ["rbd.provisioner.ceph.io", "ceph.com/rbd"];
    const HANDLE: &str = "s1/10.0.0.1:6789/rbd/csi-snap-0123456789abcdef0123456789abcdef";
    const SOURCES: RbdSources<'static> = RbdSources {
        snapshot_drivers: DRIVERS,
        csi_driver: DRIVERS[0],
    };

    fn claim() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "new", "namespace": "ns", "uid": "u-new"},
            "spec": {"storageClassName": "rbd", "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap()
    }

    fn vs() -> VolumeSnapshot {
        serde_json::from_value(json!({
            "metadata": {"name": "snap", "namespace": "ns", "uid": "u-vs"},
            "status": {"readyToUse": true, "boundVolumeSnapshotContentName": "c", "restoreSize": "1Gi"},
        }))
        .unwrap()
    }

    fn content(driver: &str, handle: &str) -> VolumeSnapshotContent {
        serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "spec": {
                "driver": driver,
                "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u-vs"},
            },
            "status": {"snapshotHandle": handle, "readyToUse": true},
        }))
        .unwrap()
    }

    fn restore(content: &VolumeSnapshotContent) -> Result<Resolved, String> {
        checks::check_snapshot(
            &SOURCES,
            &claim(),
            &vs(),
            content,
            "spec.dataSource: VolumeSnapshot ns/snap",
        )
    }

    #[test]
    fn contents_of_either_name_restore_from_the_snapshot_their_handle_names() {
        for driver in DRIVERS {
            match restore(&content(driver, HANDLE)).unwrap() {
                Resolved::Snapshot {
                    vs,
                    handle,
                    snapshot,
                } => {
                    assert_eq!((vs.as_str(), handle.as_str()), ("snap", HANDLE));
                    assert_eq!(
                        (snapshot.pool.as_str(), snapshot.image.as_str()),
                        ("rbd", "csi-snap-0123456789abcdef0123456789abcdef")
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        let e = restore(&content("rbd.csi.ceph.com", HANDLE)).unwrap_err();
        assert!(
            e.ends_with("not ours (rbd.provisioner.ceph.io or ceph.com/rbd)"),
            "{e}"
        );
    }

    #[test]
    fn a_handle_that_is_no_snapshot_id_is_refused_naming_the_field() {
        let e = restore(&content(DRIVERS[0], "not-a-snapshot-id")).unwrap_err();
        assert!(
            e.starts_with(
                "spec.dataSource: VolumeSnapshot ns/snap: VolumeSnapshotContent c \
                 status.snapshotHandle: "
            ),
            "{e}"
        );
    }

    fn pv(source: &serde_json::Value) -> PersistentVolume {
        let mut pv = json!({
            "metadata": {"name": "pvc-src"},
            "spec": {"claimRef": {"name": "src", "namespace": "ns", "uid": "u-src"}},
            "status": {"phase": "Bound"},
        });
        pv["spec"]
            .as_object_mut()
            .unwrap()
            .extend(source.as_object().unwrap().clone());
        serde_json::from_value(pv).unwrap()
    }

    #[test]
    fn in_tree_rbd_pvs_and_csi_pvs_of_our_driver_are_ours_and_others_not() {
        let csi =
            pv(&json!({"csi": {"driver": DRIVERS[0], "volumeHandle": "v1/10.0.0.1:6789/rbd/img"}}));
        assert_eq!(SOURCES.volume(&csi).unwrap().image, "img");
        let in_tree =
            pv(&json!({"rbd": {"monitors": ["10.0.0.1:6789"], "pool": "p", "image": "old"}}));
        let location = SOURCES.volume(&in_tree).unwrap();
        assert_eq!(
            (location.pool.as_str(), location.image.as_str()),
            ("p", "old")
        );
        let other = pv(
            &json!({"csi": {"driver": "other.csi.io", "volumeHandle": "v1/10.0.0.1:6789/rbd/img"}}),
        );
        assert_eq!(
            check_source_volume(&other, DRIVERS[0]).unwrap_err(),
            "no rbd source, no csi source of driver rbd.provisioner.ceph.io"
        );
        let source: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "src", "namespace": "ns", "uid": "u-src"},
        }))
        .unwrap();
        let e = checks::check_source_volume(
            &SOURCES,
            &source,
            &other,
            "spec.dataSource: PersistentVolumeClaim ns/src",
        )
        .unwrap_err();
        assert_eq!(
            e,
            "spec.dataSource: PersistentVolumeClaim ns/src: its PersistentVolume pvc-src is not \
             one of ours (no rbd source, no csi source of driver rbd.provisioner.ceph.io)"
        );
    }
}
