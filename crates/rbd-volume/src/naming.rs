//! Image names. Deterministic, so a retried or restarted create finds the image it made instead
//! of leaking a second one.
//!
//! - The built-in provisioner ([`Naming`]) names an image after the PV `pvc-<claim uid>`: by
//!   default `<prefix><claim uid>` with the prefix `kubernetes-dynamic-pvc-` (the old
//!   provisioner's, which appended a random UUID instead), or the PV name itself with
//!   `--use-pv-name`.
//! - The CSI controller ([`request_image_name`]) uses the `CreateVolume` name itself when it is a
//!   safe RBD image name (the external-provisioner's `pvc-<uid>` always is), else `csi-vol-` +
//!   the first 32 hex digits of its SHA-256.

use sha2::{Digest, Sha256};

/// Default image name prefix of the built-in provisioner.
pub const DEFAULT_PREFIX: &str = "kubernetes-dynamic-pvc-";

/// How the built-in provisioner names images.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Naming {
    pub prefix: String,
    pub use_pv_name: bool,
}

impl Default for Naming {
    fn default() -> Self {
        Naming {
            prefix: DEFAULT_PREFIX.into(),
            use_pv_name: false,
        }
    }
}

impl Naming {
    /// The image name for a PV.
    #[must_use]
    pub fn image_name(&self, pv_name: &str) -> String {
        if self.use_pv_name {
            return pv_name.to_string();
        }
        let id = pv_name.strip_prefix("pvc-").unwrap_or(pv_name);
        format!("{}{id}", self.prefix)
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

/// The image name for a CSI `CreateVolume` request name.
#[must_use]
pub fn request_image_name(request_name: &str) -> String {
    if is_safe_image_name(request_name) {
        return request_name.to_owned();
    }
    let digest = Sha256::digest(request_name.as_bytes());
    format!("csi-vol-{}", hex(&digest[..16]))
}

/// Whether `image` is a name one of the front doors gives the volume named `volume` (a PV or
/// CSI request name): the name itself, its CSI hash, or the provisioner's `<prefix><claim uid>`
/// for a PV `pvc-<claim uid>` (any prefix: it is a flag; the uid must be a UUID, as Kubernetes
/// makes them). Used where only the image is known (a CSI volume ID) to tell whether its owner
/// record names this volume or another one.
#[must_use]
pub fn is_image_of(image: &str, volume: &str) -> bool {
    if image == volume || image == request_image_name(volume) {
        return true;
    }
    volume
        .strip_prefix("pvc-")
        .is_some_and(|uid| is_uuid(uid) && image.len() > uid.len() && image.ends_with(uid))
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in hex digits.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioner_image_names_are_deterministic_from_the_pv_name() {
        let n = Naming::default();
        assert_eq!(n.image_name("pvc-1b2c"), "kubernetes-dynamic-pvc-1b2c");
        assert_eq!(n.image_name("pvc-1b2c"), n.image_name("pvc-1b2c"));
        let custom = Naming {
            prefix: "k8s-".into(),
            use_pv_name: false,
        };
        assert_eq!(custom.image_name("pvc-1b2c"), "k8s-1b2c");
        let pv = Naming {
            prefix: "ignored-".into(),
            use_pv_name: true,
        };
        assert_eq!(pv.image_name("pvc-1b2c"), "pvc-1b2c");
    }

    #[test]
    fn request_image_name_is_the_request_name_when_safe_else_a_stable_hash() {
        assert_eq!(request_image_name("pvc-0a1b"), "pvc-0a1b");
        let hashed = request_image_name("my volume/1");
        assert!(hashed.starts_with("csi-vol-") && hashed.len() == 40);
        assert_eq!(hashed, request_image_name("my volume/1"));
        assert_ne!(hashed, request_image_name("my volume/2"));
        assert_ne!(request_image_name(".hidden"), ".hidden");
    }

    #[test]
    fn an_image_is_recognised_under_every_naming_of_its_volume() {
        let uid = "6c1f0d2e-8a4b-4c3d-9e2f-0a1b2c3d4e5f";
        let pv = format!("pvc-{uid}");
        assert!(is_image_of(&pv, &pv));
        assert!(is_image_of(&Naming::default().image_name(&pv), &pv));
        assert!(is_image_of(&format!("k8s-{uid}"), &pv));
        assert!(is_image_of(
            &request_image_name("my volume/1"),
            "my volume/1"
        ));
        assert!(!is_image_of(&pv, "someone-else"));
        assert!(!is_image_of(
            &Naming::default().image_name(&pv),
            "pvc-other"
        ));
        // only a whole claim UID counts as the provisioner's naming
        assert!(!is_image_of("kubernetes-dynamic-pvc-", "pvc-"));
        assert!(!is_image_of("core-adopt", "pvc-adopt"));
        assert!(!is_image_of(
            &format!("k8s-{}", &uid[1..]),
            &format!("pvc-{}", &uid[1..])
        ));
        assert!(!is_image_of("x", "pvc-"));
    }
}
