//! Volume identity: volume IDs, image names, sizes and the `volume_context` keys. Pure functions.
//!
//! Volume IDs, image names and size limits are the volume core's ([`rbd_volume`]), shared with
//! the built-in provisioner, re-exported here:
//!
//! **Volume ID** `v1/<monitors>/<pool>[/<namespace>]/<image>` or
//! `v2/<clusterID>/<pool>[/<namespace>]/<image>` ([`VolumeId`], see [`rbd_volume::id`]), e.g.
//! `v1/10.0.0.1:6789,10.0.0.2:6789/kube/pvc-2f1c...`. The ID alone (plus the secrets of the call
//! and, for a `v2` ID, the cluster config) is enough to find the image, which `DeleteVolume` and
//! `ControllerExpandVolume` rely on.
//!
//! **Image name** ([`image_name`]): the `CreateVolume` name itself when it is a safe RBD image
//! name (the external-provisioner's `pvc-<uid>` always is), else `csi-vol-` + the first 32 hex
//! digits of its SHA-256. Deterministic, so a retried create finds its own image.
//!
//! What is CSI's own: the capacity-range rules ([`size_for_range`]) and the `volume_context` keys.

pub use rbd_volume::id::{MAX_VOLUME_ID_LEN, VolumeId};
pub use rbd_volume::naming::{hex, is_safe_image_name, request_image_name as image_name};
pub use rbd_volume::size::{MAX_SIZE, MAX_SIZE_TEXT, MIB};

/// `volume_context` keys the controller sets and the node reads.
pub mod context {
    /// Comma-separated `host:port` monitor list (volumes of a class that names monitors).
    pub const MONITORS: &str = "monitors";
    /// The cluster config's name of the cluster (volumes of a `clusterID` class, instead of
    /// `monitors`: the node looks the monitors up when it stages, so they may change).
    pub const CLUSTER_ID: &str = "clusterID";
    /// The pool holding the image.
    pub const POOL: &str = "pool";
    /// The RADOS namespace holding the image (absent: the default one).
    pub const NAMESPACE: &str = "radosNamespace";
    /// The RBD image name.
    pub const IMAGE: &str = "imageName";
    /// The Ceph user nodes map with (without `client.`).
    pub const USER: &str = "userID";
    /// Which mapper stages the volume (`rbd`/`krbd`, `rbd-nbd`, `fuse`).
    pub const MOUNTER: &str = "mounter";
    /// Map options in ceph-csi's syntax (`krbd:opt,opt;nbd:opt`), the class's `mapOptions`.
    pub const MAP_OPTIONS: &str = "mapOptions";
    /// Unmap options in the same syntax, the class's `unmapOptions`.
    pub const UNMAP_OPTIONS: &str = "unmapOptions";
}

/// Size of a volume created without a capacity request.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// The image size for a capacity range: `required` rounded up to MiB, [`DEFAULT_SIZE`] when
/// neither bound is set, `limit` (rounded down to MiB) when only the limit is set and is smaller.
///
/// # Errors
/// When the range is negative, cannot be met in whole MiB or needs more than [`MAX_SIZE`]
/// (`OUT_OF_RANGE`).
pub fn size_for_range(required: i64, limit: i64) -> Result<u64, String> {
    let required = u64::try_from(required).map_err(|_| "required_bytes is negative".to_owned())?;
    let limit = u64::try_from(limit).map_err(|_| "limit_bytes is negative".to_owned())?;
    let size = if required == 0 {
        if limit == 0 {
            DEFAULT_SIZE
        } else {
            DEFAULT_SIZE.min(limit / MIB * MIB)
        }
    } else {
        let size = required.div_ceil(MIB) * MIB;
        if size > MAX_SIZE {
            return Err(format!(
                "required_bytes={required} is larger than the largest RBD volume, {MAX_SIZE_TEXT}"
            ));
        }
        size
    };
    if size == 0 || (limit != 0 && size > limit) {
        return Err(format!(
            "no size in whole MiB satisfies required_bytes={required} limit_bytes={limit}"
        ));
    }
    Ok(size)
}

#[cfg(test)]
#[allow(clippy::cast_possible_wrap)] // small MiB constants
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_mib_and_default_to_one_gib() {
        assert_eq!(size_for_range(0, 0).unwrap(), DEFAULT_SIZE);
        assert_eq!(size_for_range(1, 0).unwrap(), MIB);
        assert_eq!(size_for_range(MIB as i64 + 1, 0).unwrap(), 2 * MIB);
        assert_eq!(size_for_range(0, 10 * MIB as i64).unwrap(), 10 * MIB);
        assert!(size_for_range(MIB as i64 + 1, MIB as i64 + 2).is_err());
        assert!(size_for_range(-1, 0).is_err());
    }

    #[test]
    fn sizes_stop_at_the_largest_volume() {
        assert_eq!(size_for_range(MAX_SIZE as i64, 0).unwrap(), MAX_SIZE);
        assert_eq!(size_for_range(MAX_SIZE as i64 - 1, 0).unwrap(), MAX_SIZE);
        let e = size_for_range(MAX_SIZE as i64 + 1, 0).unwrap_err();
        assert!(
            e.contains("required_bytes=") && e.contains(MAX_SIZE_TEXT),
            "{e}"
        );
        assert!(size_for_range(i64::MAX, 0).is_err());
        assert_eq!(size_for_range(0, i64::MAX).unwrap(), DEFAULT_SIZE);
        assert_eq!(MAX_SIZE, 9_223_372_036_853_727_232);
    }
}
