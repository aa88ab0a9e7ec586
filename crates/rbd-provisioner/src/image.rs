//! Image names and ownership records. Pure.
//!
//! The image name is derived from the PV name (`pvc-<claim uid>`), so a retried or restarted
//! create finds the image it made instead of leaking a second one: by default
//! `<prefix><claim uid>` with the prefix `kubernetes-dynamic-pvc-` (the old provisioner's, which
//! appended a random UUID instead), or the PV name itself with `--use-pv-name`.
//!
//! Who owns an image is recorded in its metadata (`rbd image-meta list` shows it): the PV name,
//! the claim and the provisioner identity. `gc`, idempotent creates and deletes read it.

use std::collections::BTreeMap;

/// Image metadata key: the PV the image backs.
pub const META_PV: &str = "provisioner.ceph.com/pv";
/// Image metadata key: `namespace/name` of the claim it was made for.
pub const META_CLAIM: &str = "provisioner.ceph.com/claim";
/// Image metadata key: the provisioner identity (`--id`) that made it.
pub const META_PROVISIONER: &str = "provisioner.ceph.com/provisioner";

/// Default image name prefix.
pub const DEFAULT_PREFIX: &str = "kubernetes-dynamic-pvc-";

/// How image names are made.
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
    pub fn image_name(&self, pv_name: &str) -> String {
        if self.use_pv_name {
            return pv_name.to_string();
        }
        let id = pv_name.strip_prefix("pvc-").unwrap_or(pv_name);
        format!("{}{id}", self.prefix)
    }
}

/// Who an image belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pv: String,
    /// `namespace/name`.
    pub claim: String,
    pub provisioner: String,
}

impl Owner {
    /// The metadata entries recording this owner, in the order they are written: the PV key
    /// last, so that a record cut short by a crash reads as no record (and is completed).
    pub fn entries(&self) -> [(&'static str, &str); 3] {
        [
            (META_PROVISIONER, &self.provisioner),
            (META_CLAIM, &self.claim),
            (META_PV, &self.pv),
        ]
    }

    /// Reads an owner from image metadata; `None` when the image has no owner record.
    pub fn from_metadata(meta: &BTreeMap<String, String>) -> Option<Owner> {
        Some(Owner {
            pv: meta.get(META_PV)?.clone(),
            claim: meta.get(META_CLAIM).cloned().unwrap_or_default(),
            provisioner: meta.get(META_PROVISIONER).cloned().unwrap_or_default(),
        })
    }
}

/// What an existing image's metadata says about a PV we want it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Recorded as this PV's image.
    Ours,
    /// No owner recorded (a crash between create and metadata write, or an image made by the
    /// old provisioner).
    Unrecorded,
    /// Recorded as another PV's image.
    Foreign(Owner),
}

/// Compares the recorded owner with the PV we want the image for.
pub fn ownership(meta: &BTreeMap<String, String>, pv_name: &str) -> Ownership {
    match Owner::from_metadata(meta) {
        None => Ownership::Unrecorded,
        Some(owner) if owner.pv == pv_name => Ownership::Ours,
        Some(owner) => Ownership::Foreign(owner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_deterministic_from_the_pv_name() {
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
    fn ownership_compares_the_recorded_pv() {
        let owner = Owner {
            pv: "pvc-a".into(),
            claim: "ns/c".into(),
            provisioner: "ceph.com/rbd".into(),
        };
        let meta: BTreeMap<String, String> = owner
            .entries()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(ownership(&meta, "pvc-a"), Ownership::Ours);
        assert_eq!(ownership(&meta, "pvc-b"), Ownership::Foreign(owner));
        assert_eq!(ownership(&BTreeMap::new(), "pvc-a"), Ownership::Unrecorded);
    }
}
