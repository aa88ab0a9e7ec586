//! Who an image belongs to, recorded in its metadata (`rbd image-meta list` shows it): the PV (or
//! CSI request) name, the claim and the provisioner identity (or CSI driver name). `gc`,
//! idempotent creates and deletes read it; both front doors write the same keys.

use std::collections::BTreeMap;
use std::fmt;

/// Image metadata key: the PV the image backs (the CSI request name, which is the PV name with
/// the external-provisioner).
pub const META_PV: &str = "provisioner.ceph.com/pv";
/// Image metadata key: `namespace/name` of the claim it was made for.
pub const META_CLAIM: &str = "provisioner.ceph.com/claim";
/// Image metadata key: the provisioner identity (`--id`) or CSI driver name that made it.
pub const META_PROVISIONER: &str = "provisioner.ceph.com/provisioner";

/// Who an image belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pv: String,
    /// `namespace/name`; empty when unknown (a CSI call without `csi.storage.k8s.io/pvc/*`),
    /// and then not recorded.
    pub claim: String,
    pub provisioner: String,
}

impl Owner {
    /// The metadata entries recording this owner, in the order they are written: the PV key
    /// last, so that a record cut short by a crash reads as no record (and is completed). An
    /// empty claim is left out.
    #[must_use]
    pub fn entries(&self) -> Vec<(&'static str, &str)> {
        let mut entries = vec![(META_PROVISIONER, self.provisioner.as_str())];
        if !self.claim.is_empty() {
            entries.push((META_CLAIM, self.claim.as_str()));
        }
        entries.push((META_PV, self.pv.as_str()));
        entries
    }

    /// Reads an owner from image metadata; `None` when the image has no owner record.
    #[must_use]
    pub fn from_metadata(meta: &BTreeMap<String, String>) -> Option<Owner> {
        Some(Owner {
            pv: meta.get(META_PV)?.clone(),
            claim: meta.get(META_CLAIM).cloned().unwrap_or_default(),
            provisioner: meta.get(META_PROVISIONER).cloned().unwrap_or_default(),
        })
    }
}

/// `PV <pv> (claim <claim>)`, the claim only when recorded.
impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PV {}", self.pv)?;
        if !self.claim.is_empty() {
            write!(f, " (claim {})", self.claim)?;
        }
        Ok(())
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
#[must_use]
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

    fn record(owner: &Owner) -> BTreeMap<String, String> {
        owner
            .entries()
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn ownership_compares_the_recorded_pv() {
        let owner = Owner {
            pv: "pvc-a".into(),
            claim: "ns/c".into(),
            provisioner: "ceph.com/rbd".into(),
        };
        let meta = record(&owner);
        assert_eq!(ownership(&meta, "pvc-a"), Ownership::Ours);
        assert_eq!(ownership(&meta, "pvc-b"), Ownership::Foreign(owner));
        assert_eq!(ownership(&BTreeMap::new(), "pvc-a"), Ownership::Unrecorded);
    }

    #[test]
    fn the_pv_key_goes_last_and_an_unknown_claim_is_not_recorded() {
        let mut owner = Owner {
            pv: "pvc-a".into(),
            claim: "ns/c".into(),
            provisioner: "ceph.com/rbd".into(),
        };
        let keys: Vec<&str> = owner.entries().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [META_PROVISIONER, META_CLAIM, META_PV]);
        assert_eq!(owner.to_string(), "PV pvc-a (claim ns/c)");
        owner.claim.clear();
        let keys: Vec<&str> = owner.entries().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [META_PROVISIONER, META_PV]);
        assert_eq!(owner.to_string(), "PV pvc-a");
        // a record cut short before its PV key is no record
        let mut meta = record(&owner);
        meta.remove(META_PV);
        assert_eq!(ownership(&meta, "pvc-a"), Ownership::Unrecorded);
    }
}
