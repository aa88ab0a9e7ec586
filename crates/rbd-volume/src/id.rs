//! Volume IDs: `v1/<monitors>/<pool>/<image>`, e.g. `v1/10.0.0.1:6789,10.0.0.2:6789/kube/pvc-2f1c...`.
//!
//! `/` cannot occur in monitor addresses, pool or image names, so the split is unambiguous. The
//! ID alone (plus the credentials of the call) is enough to find the image. It must stay within
//! the 128 bytes Kubernetes allows for a CSI volume handle, which a few monitors, a pool name and
//! an image name do.

use std::fmt;

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
        split(PREFIX, id)
            .map(|(monitors, pool, image)| Self::new(monitors, pool, image))
            .ok_or_else(|| {
                format!("malformed volume id {id:?} (expected v1/<monitors>/<pool>/<image>)")
            })
    }

    /// The ID, checked against the length limit.
    ///
    /// # Errors
    /// When the ID would exceed [`MAX_VOLUME_ID_LEN`].
    pub fn encode(&self) -> Result<String, String> {
        within_limit("volume", self.to_string())
    }
}

/// `<prefix>/<monitors>/<pool>/<image>` split into its three non-empty parts (the shape of
/// volume and snapshot IDs: `/` occurs in none of the parts).
pub(crate) fn split<'a>(prefix: &str, id: &'a str) -> Option<(&'a str, &'a str, &'a str)> {
    let mut parts = id.split('/');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some(p), Some(monitors), Some(pool), Some(image), None)
            if p == prefix && !monitors.is_empty() && !pool.is_empty() && !image.is_empty() =>
        {
            Some((monitors, pool, image))
        }
        _ => None,
    }
}

/// `id` if it fits the 128 bytes Kubernetes allows for CSI volume handles and snapshot handles.
pub(crate) fn within_limit(kind: &str, id: String) -> Result<String, String> {
    if id.len() > MAX_VOLUME_ID_LEN {
        return Err(format!(
            "{kind} id {id:?} would be {} bytes, more than the {MAX_VOLUME_ID_LEN} Kubernetes \
             allows; list fewer monitors or use shorter pool names",
            id.len()
        ));
    }
    Ok(id)
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}/{}/{}/{}", self.monitors, self.pool, self.image)
    }
}

#[cfg(test)]
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
}
