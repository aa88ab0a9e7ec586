//! Who an image belongs to, recorded in its metadata (`rbd image-meta list` shows it): the PV (or
//! CSI request) name, the claim, the provisioner identity (or CSI driver name) and the
//! Kubernetes cluster. `gc`, idempotent creates and deletes read it; both front doors write the
//! same keys.

use std::collections::BTreeMap;
use std::fmt;

/// Image metadata key: the PV the image backs (the CSI request name, which is the PV name with
/// the external-provisioner).
pub const META_PV: &str = "provisioner.ceph.com/pv";
/// Image metadata key: `namespace/name` of the claim it was made for.
pub const META_CLAIM: &str = "provisioner.ceph.com/claim";
/// Image metadata key: the provisioner identity (`--id`) or CSI driver name that made it.
pub const META_PROVISIONER: &str = "provisioner.ceph.com/provisioner";
/// Image metadata key: the Kubernetes cluster the image belongs to (by default the uid of its
/// `kube-system` namespace). Images made before it was recorded have none: their cluster is
/// unknown.
pub const META_KUBE_CLUSTER: &str = "provisioner.ceph.com/kube-cluster";

/// Whether a record naming the Kubernetes cluster `recorded` (empty: none recorded) may belong
/// to `ours` (empty: unknown). Only two known, different identities conflict.
#[must_use]
pub fn same_kube_cluster(recorded: &str, ours: &str) -> bool {
    recorded.is_empty() || ours.is_empty() || recorded == ours
}

/// Who an image belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub pv: String,
    /// `namespace/name`; empty when unknown (a CSI call without `csi.storage.k8s.io/pvc/*`),
    /// and then not recorded.
    pub claim: String,
    pub provisioner: String,
    /// The Kubernetes cluster's identity ([`META_KUBE_CLUSTER`]); empty when unknown (a record
    /// made before it was kept, or a CSI controller given none), and then not recorded.
    pub kube_cluster: String,
}

impl Owner {
    /// The metadata entries recording this owner, in the order they are written: the PV key
    /// last, so that a record cut short by a crash reads as no record (and is completed). An
    /// empty claim or Kubernetes cluster is left out.
    #[must_use]
    pub fn entries(&self) -> Vec<(&'static str, &str)> {
        let mut entries = vec![(META_PROVISIONER, self.provisioner.as_str())];
        if !self.kube_cluster.is_empty() {
            entries.push((META_KUBE_CLUSTER, self.kube_cluster.as_str()));
        }
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
            kube_cluster: meta.get(META_KUBE_CLUSTER).cloned().unwrap_or_default(),
        })
    }
}

/// `PV <pv> (claim <claim>) of Kubernetes cluster <id>`, the claim and cluster only when
/// recorded.
impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PV {}", self.pv)?;
        if !self.claim.is_empty() {
            write!(f, " (claim {})", self.claim)?;
        }
        if !self.kube_cluster.is_empty() {
            write!(f, " of Kubernetes cluster {}", self.kube_cluster)?;
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
    /// Recorded as another PV's image, or as an image of another Kubernetes cluster.
    Foreign(Owner),
}

/// Compares the recorded owner with the PV we want the image for, in the Kubernetes cluster
/// `kube_cluster` (empty: unknown, not compared). A record naming another cluster is foreign
/// even when its PV name is the same.
#[must_use]
pub fn ownership(meta: &BTreeMap<String, String>, pv_name: &str, kube_cluster: &str) -> Ownership {
    match Owner::from_metadata(meta) {
        None => Ownership::Unrecorded,
        Some(owner)
            if owner.pv == pv_name && same_kube_cluster(&owner.kube_cluster, kube_cluster) =>
        {
            Ownership::Ours
        }
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
            kube_cluster: "uid-a".into(),
        };
        let meta = record(&owner);
        assert_eq!(ownership(&meta, "pvc-a", "uid-a"), Ownership::Ours);
        assert_eq!(ownership(&meta, "pvc-a", ""), Ownership::Ours);
        assert_eq!(
            ownership(&meta, "pvc-b", "uid-a"),
            Ownership::Foreign(owner.clone())
        );
        // the same PV name in another Kubernetes cluster
        assert_eq!(
            ownership(&meta, "pvc-a", "uid-b"),
            Ownership::Foreign(owner.clone())
        );
        // a record made before the cluster was kept is not foreign to anyone
        let mut old = meta.clone();
        old.remove(META_KUBE_CLUSTER);
        assert_eq!(ownership(&old, "pvc-a", "uid-b"), Ownership::Ours);
        assert_eq!(
            ownership(&BTreeMap::new(), "pvc-a", "uid-a"),
            Ownership::Unrecorded
        );
        assert_eq!(
            owner.to_string(),
            "PV pvc-a (claim ns/c) of Kubernetes cluster uid-a"
        );
    }

    #[test]
    fn the_pv_key_goes_last_and_an_unknown_claim_is_not_recorded() {
        let mut owner = Owner {
            pv: "pvc-a".into(),
            claim: "ns/c".into(),
            provisioner: "ceph.com/rbd".into(),
            kube_cluster: "uid-a".into(),
        };
        let keys: Vec<&str> = owner.entries().iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [META_PROVISIONER, META_KUBE_CLUSTER, META_CLAIM, META_PV]
        );
        owner.kube_cluster.clear();
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
        assert_eq!(ownership(&meta, "pvc-a", ""), Ownership::Unrecorded);
    }
}
