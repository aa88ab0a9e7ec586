//! Volume identity: volume IDs, image names, sizes and the `volume_context` keys. Pure functions.
//!
//! **Volume ID** `v1/<monitors>/<pool>/<image>`, e.g.
//! `v1/10.0.0.1:6789,10.0.0.2:6789/kube/pvc-2f1c...`. `/` cannot occur in monitor addresses, pool
//! or image names, so the split is unambiguous. The ID alone (plus the secrets of the call) is
//! enough to find the image, which `DeleteVolume` and `ControllerExpandVolume` rely on. It must
//! stay within the 128 bytes Kubernetes allows for a CSI volume handle, which a few monitors, a
//! pool name and an image name do.
//!
//! **Image name**: the `CreateVolume` name itself when it is a safe RBD image name (the
//! external-provisioner's `pvc-<uid>` always is), else `csi-vol-` + the first 32 hex digits of
//! its SHA-256. Deterministic, so a retried create finds its own image.

use std::fmt;

use sha2::{Digest, Sha256};

/// `volume_context` keys the controller sets and the node reads.
pub mod context {
    /// Comma-separated `host:port` monitor list.
    pub const MONITORS: &str = "monitors";
    /// The pool holding the image.
    pub const POOL: &str = "pool";
    /// The RBD image name.
    pub const IMAGE: &str = "imageName";
    /// The Ceph user nodes map with (without `client.`).
    pub const USER: &str = "userID";
    /// Which mapper stages the volume (`rbd`/`krbd`, `rbd-nbd`, `fuse`).
    pub const MOUNTER: &str = "mounter";
}

/// Longest volume ID Kubernetes accepts as a CSI volume handle.
pub const MAX_VOLUME_ID_LEN: usize = 128;

const PREFIX: &str = "v1";

/// A parsed volume ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeId {
    pub monitors: String,
    pub pool: String,
    pub image: String,
}

impl VolumeId {
    #[must_use]
    pub fn new(monitors: &str, pool: &str, image: &str) -> Self {
        Self {
            monitors: monitors.to_owned(),
            pool: pool.to_owned(),
            image: image.to_owned(),
        }
    }

    /// Parses `v1/<monitors>/<pool>/<image>`.
    ///
    /// # Errors
    /// A message saying what is malformed.
    pub fn parse(id: &str) -> Result<Self, String> {
        let parts: Vec<&str> = id.split('/').collect();
        match parts.as_slice() {
            [PREFIX, monitors, pool, image]
                if !monitors.is_empty() && !pool.is_empty() && !image.is_empty() =>
            {
                Ok(Self::new(monitors, pool, image))
            }
            _ => Err(format!(
                "malformed volume id {id:?} (expected v1/<monitors>/<pool>/<image>)"
            )),
        }
    }

    /// The ID, checked against the length limit.
    ///
    /// # Errors
    /// When the ID would exceed [`MAX_VOLUME_ID_LEN`].
    pub fn encode(&self) -> Result<String, String> {
        let id = self.to_string();
        if id.len() > MAX_VOLUME_ID_LEN {
            return Err(format!(
                "volume id {id:?} would be {} bytes, more than the {MAX_VOLUME_ID_LEN} Kubernetes \
                 allows; list fewer monitors or use shorter pool names",
                id.len()
            ));
        }
        Ok(id)
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}/{}/{}/{}", self.monitors, self.pool, self.image)
    }
}

/// Whether `name` can be used as an RBD image name as is (conservative: `[A-Za-z0-9._-]`, not
/// starting with `.` or `-`, at most 100 bytes).
#[must_use]
pub fn is_safe_image_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The image name for a `CreateVolume` request name.
#[must_use]
pub fn image_name(request_name: &str) -> String {
    if is_safe_image_name(request_name) {
        return request_name.to_owned();
    }
    let digest = Sha256::digest(request_name.as_bytes());
    format!("csi-vol-{}", hex(&digest[..16]))
}

/// Lower-case hex of `bytes`.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// One MiB.
pub const MIB: u64 = 1 << 20;
/// The largest volume: the last whole MiB below 2^63 bytes (9223372036853727232 bytes, 8Ei
/// minus 1Mi). CSI sizes are signed 64-bit and the Linux block layer stops at 2^63-1 bytes, so
/// a larger image could never be used (librbd itself accepts larger sizes).
pub const MAX_SIZE: u64 = (1 << 63) - MIB;
/// [`MAX_SIZE`] as people read it.
pub const MAX_SIZE_TEXT: &str = "9223372036853727232 bytes (8Ei minus 1Mi)";
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

/// Whether an existing image of `size` bytes satisfies the capacity range.
#[must_use]
pub fn size_compatible(size: u64, required: i64, limit: i64) -> bool {
    let required = u64::try_from(required).unwrap_or(0);
    let limit = u64::try_from(limit).unwrap_or(0);
    size >= required && (limit == 0 || size <= limit)
}

#[cfg(test)]
#[allow(clippy::cast_possible_wrap)] // small MiB constants
mod tests {
    use super::*;

    #[test]
    fn volume_id_round_trips() {
        let id = VolumeId::new("10.0.0.1:6789,10.0.0.2:6789", "kube", "pvc-1");
        let text = id.encode().unwrap();
        assert_eq!(text, "v1/10.0.0.1:6789,10.0.0.2:6789/kube/pvc-1");
        assert_eq!(VolumeId::parse(&text).unwrap(), id);
    }

    #[test]
    fn malformed_volume_ids_are_rejected() {
        for bad in [
            "",
            "pvc-1",
            "v1/m/pool",
            "v2/m/p/i",
            "v1//p/i",
            "v1/m/p/i/x",
        ] {
            assert!(VolumeId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn over_long_volume_ids_are_refused() {
        let monitors = ["192.168.100.100:6789"; 8].join(",");
        assert!(VolumeId::new(&monitors, "rbd", "pvc-1").encode().is_err());
    }

    #[test]
    fn image_name_is_the_request_name_when_safe_else_a_stable_hash() {
        assert_eq!(image_name("pvc-0a1b"), "pvc-0a1b");
        let hashed = image_name("my volume/1");
        assert!(hashed.starts_with("csi-vol-") && hashed.len() == 40);
        assert_eq!(hashed, image_name("my volume/1"));
        assert_ne!(hashed, image_name("my volume/2"));
        assert_ne!(image_name(".hidden"), ".hidden");
    }

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

    #[test]
    fn compatibility_respects_both_bounds() {
        assert!(size_compatible(2 * MIB, MIB as i64, 0));
        assert!(!size_compatible(MIB, 2 * MIB as i64, 0));
        assert!(!size_compatible(3 * MIB, MIB as i64, 2 * MIB as i64));
    }
}
