//! What a claim may ask for. Pure.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use rbd_csi::volume::{MAX_SIZE, MAX_SIZE_TEXT, MIB};

/// Checks access and volume modes: ReadWriteOnce, ReadOnlyMany and ReadWriteOncePod for
/// filesystems; ReadWriteMany too for raw block volumes (the application coordinates access).
pub fn check_modes(claim: &PersistentVolumeClaim) -> Result<(), String> {
    let spec = claim.spec.as_ref().ok_or("claim has no spec")?;
    let block = spec.volume_mode.as_deref() == Some("Block");
    match spec.volume_mode.as_deref() {
        None | Some("Filesystem" | "Block") => {}
        Some(other) => {
            return Err(format!(
                "spec.volumeMode {other:?} is not supported (Filesystem or Block)"
            ));
        }
    }
    let modes = spec.access_modes.as_deref().unwrap_or_default();
    if modes.is_empty() {
        return Err("spec.accessModes is empty".into());
    }
    for mode in modes {
        match mode.as_str() {
            "ReadWriteOnce" | "ReadOnlyMany" | "ReadWriteOncePod" => {}
            "ReadWriteMany" if block => {}
            "ReadWriteMany" => {
                return Err("spec.accessModes ReadWriteMany is only supported with volumeMode Block (an RBD filesystem can be mounted read-write on one node only)".into());
            }
            other => return Err(format!("spec.accessModes {other:?} is not supported")),
        }
    }
    if let Some(why) = provisioner::attach::unsupported_access_modes(modes) {
        return Err(format!(
            "spec.accessModes {modes:?} cannot be provisioned: {why}; ask for ReadWriteOnce (one \
             node writes) or ReadOnlyMany (many nodes read)"
        ));
    }
    Ok(())
}

/// The image size for a request (`spec.resources.requests.storage` as written): rounded up to
/// whole MiB. Missing, malformed, zero or larger than the largest RBD image is an error, the
/// last naming the limit.
pub fn image_size(request: Option<&str>) -> Result<u64, String> {
    let text = request.ok_or("spec.resources.requests.storage is missing")?;
    let quantity = provisioner::quantity::parse(text).map_err(|e| {
        format!("spec.resources.requests.storage {text:?} is not a valid quantity: {e}")
    })?;
    if !quantity.is_positive() {
        return Err(format!(
            "spec.resources.requests.storage must be greater than zero (is {text})"
        ));
    }
    let too_large = || {
        format!(
            "requested size {text} (spec.resources.requests.storage) is larger than the largest \
             RBD image, {MAX_SIZE_TEXT}"
        )
    };
    let bytes = quantity.to_u64_ceil().ok_or_else(too_large)?;
    size_in_mib(bytes).ok_or_else(too_large)
}

/// `bytes` rounded up to whole MiB; `None` when that is larger than the largest RBD image.
pub fn size_in_mib(bytes: u64) -> Option<u64> {
    bytes
        .checked_next_multiple_of(MIB)
        .filter(|size| *size <= MAX_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

    fn claim(modes: &[&str], volume_mode: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                volume_mode: volume_mode.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn filesystem_claims_take_rwo_and_rox_only() {
        assert!(check_modes(&claim(&["ReadWriteOnce"], None)).is_ok());
        assert!(check_modes(&claim(&["ReadOnlyMany"], Some("Filesystem"))).is_ok());
        assert!(check_modes(&claim(&["ReadOnlyMany", "ReadWriteOncePod"], None)).is_err());
        let e = check_modes(&claim(&["ReadWriteMany"], Some("Filesystem"))).unwrap_err();
        assert!(
            e.contains("ReadWriteMany is only supported with volumeMode Block"),
            "{e}"
        );
        assert!(
            check_modes(&claim(&[], None))
                .unwrap_err()
                .contains("spec.accessModes is empty")
        );
        assert!(check_modes(&claim(&["Sometimes"], None)).is_err());
    }

    #[test]
    fn read_write_once_with_read_only_many_is_refused_naming_the_field_and_why() {
        for volume_mode in [None, Some("Filesystem"), Some("Block")] {
            let e =
                check_modes(&claim(&["ReadOnlyMany", "ReadWriteOnce"], volume_mode)).unwrap_err();
            assert!(
                e.starts_with(r#"spec.accessModes ["ReadOnlyMany", "ReadWriteOnce"]"#)
                    && e.contains("CSI does not support ReadOnlyMany and ReadWriteOnce")
                    && e.contains("several nodes"),
                "{e}"
            );
        }
        // with ReadWriteMany (raw block) several writers are what is asked for
        assert!(
            check_modes(&claim(
                &["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
                Some("Block")
            ))
            .is_ok()
        );
    }

    #[test]
    fn block_claims_may_be_rwx() {
        assert!(check_modes(&claim(&["ReadWriteMany"], Some("Block"))).is_ok());
        assert!(check_modes(&claim(&["ReadWriteOnce"], Some("Tape"))).is_err());
    }

    #[test]
    fn sizes_round_up_to_mib() {
        for (request, size) in [
            ("1", MIB),
            ("1Mi", MIB),
            ("1G", 954 * MIB),
            ("10G", 9537 * MIB),
            ("500M", 477 * MIB),
            ("1.5Gi", 1536 * MIB),
            ("100m", MIB),
            ("0.5", MIB),
            ("1e3", MIB),
        ] {
            assert_eq!(image_size(Some(request)), Ok(size), "{request}");
        }
        assert!(
            image_size(Some("0"))
                .unwrap_err()
                .contains("greater than zero")
        );
        assert!(image_size(None).unwrap_err().contains("requests.storage"));
        let e = image_size(Some("1 GB")).unwrap_err();
        assert!(
            e.contains("not a valid quantity") && e.contains("1 GB"),
            "{e}"
        );
    }

    #[test]
    fn sizes_beyond_the_largest_image_name_the_limit() {
        assert_eq!(image_size(Some("8388607Ti")), Ok((1 << 63) - (1 << 40)));
        for request in [
            "16Ei",
            "9223372036854775807",
            "9223372036853727233",
            "20E",
            "1e40",
        ] {
            let e = image_size(Some(request)).unwrap_err();
            assert!(
                e.contains(request)
                    && e.contains("larger than the largest RBD image, 9223372036853727232 bytes"),
                "{e}"
            );
        }
        assert_eq!(image_size(Some("9223372036853727232")), Ok(MAX_SIZE));
        assert_eq!(size_in_mib(MAX_SIZE + 1), None);
        assert_eq!(size_in_mib(u64::MAX), None);
    }
}
