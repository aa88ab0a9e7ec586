//! What a claim may ask for. Pure.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

const MIB: u64 = 1 << 20;

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
    Ok(())
}

/// The image size for a request: rounded up to whole MiB; zero or missing is an error.
pub fn image_size(requested: Option<u64>) -> Result<u64, String> {
    match requested {
        None => Err("spec.resources.requests.storage is missing or not a valid quantity".into()),
        Some(0) => Err("spec.resources.requests.storage must be greater than zero".into()),
        Some(bytes) => bytes
            .checked_next_multiple_of(MIB)
            .ok_or_else(|| format!("spec.resources.requests.storage {bytes} is too large")),
    }
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
        assert!(
            check_modes(&claim(
                &["ReadOnlyMany", "ReadWriteOnce"],
                Some("Filesystem")
            ))
            .is_ok()
        );
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
    fn block_claims_may_be_rwx() {
        assert!(check_modes(&claim(&["ReadWriteMany"], Some("Block"))).is_ok());
        assert!(check_modes(&claim(&["ReadWriteOnce"], Some("Tape"))).is_err());
    }

    #[test]
    fn sizes_round_up_to_mib() {
        assert_eq!(image_size(Some(1)).unwrap(), MIB);
        assert_eq!(image_size(Some(MIB)).unwrap(), MIB);
        assert_eq!(image_size(Some(1_000_000_000)).unwrap(), 954 * MIB);
        assert!(image_size(Some(0)).is_err());
        assert!(image_size(None).unwrap_err().contains("requests.storage"));
    }
}
