//! ceph-csi's StorageClasses and VolumeSnapshotClasses, translated for ours and printed (a
//! StorageClass's provisioner and parameters are immutable: the user deletes the class and
//! creates it again; nothing here writes a class). Pure.
//!
//! - A StorageClass keeps its name, labels, annotations, reclaim policy, binding mode,
//!   expansion, mount options and allowed topologies; its provisioner becomes ours; the
//!   parameters our provisioner knows are kept as they are (ceph-csi's spellings are ours too),
//!   the others are dropped with the reason; the Ceph users of its secrets (`userID`, which
//!   ceph-csi reads from the secret) become `adminId`/`userId`.
//! - A VolumeSnapshotClass keeps its name, annotations and deletion policy; its driver becomes
//!   ours; of its parameters only the snapshotter secrets are kept (a snapshot is made in its
//!   source's cluster and pool).

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provisioner::snapshot::VolumeSnapshotClass;
use serde_json::{Value, json};

use crate::backend::params::{self, Parameters};

/// Annotation kubectl keeps the last applied object in; not carried over.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// ceph-csi's parameters ours has no use for, with the reason.
const DROPPED: &[(&str, &str)] = &[
    (
        "volumeNamePrefix",
        "our images are named after their PV (pvc-<uid>)",
    ),
    (
        "snapshotNamePrefix",
        "our snapshot images are named csi-snap-<hash of the snapshot's name>",
    ),
    (
        "thickProvision",
        "thick provisioning is not provided: images are thin",
    ),
    (
        "mapOptions",
        "the built-in provisioner takes no map options (volumes use the node plugin's defaults)",
    ),
    (
        "unmapOptions",
        "the built-in provisioner takes no unmap options",
    ),
    ("cephLogDir", "ceph-csi's rbd-nbd log settings"),
    ("cephLogStrategy", "ceph-csi's rbd-nbd log settings"),
    (
        "journalPool",
        "our volumes have no journal: the PV names its image",
    ),
];

/// One translated class.
#[derive(Clone, Debug, PartialEq)]
pub struct Translated {
    /// `StorageClass` or `VolumeSnapshotClass`.
    pub kind: &'static str,
    pub name: String,
    /// The class to apply.
    pub object: Value,
    /// `(parameter, why)` for each parameter left out.
    pub dropped: Vec<(String, String)>,
    /// Why the translated class would still be refused by our provisioner, if it would.
    pub problem: Option<String>,
}

fn metadata(meta: &ObjectMeta) -> Value {
    let annotations: BTreeMap<&String, &String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != LAST_APPLIED)
        .collect();
    let mut out = json!({"name": meta.name});
    if let Some(labels) = meta.labels.as_ref().filter(|l| !l.is_empty()) {
        out["labels"] = json!(labels);
    }
    if !annotations.is_empty() {
        out["annotations"] = json!(annotations);
    }
    out
}

/// The Ceph users ceph-csi takes from the class's secrets (`userID` of the provisioner and of
/// the node-stage secret), when known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretUsers {
    pub admin: Option<String>,
    pub node: Option<String>,
}

/// `class` (ceph-csi's) for our `provisioner`.
#[must_use]
pub fn storage_class(class: &StorageClass, provisioner: &str, users: &SecretUsers) -> Translated {
    let mut kept = BTreeMap::new();
    let mut dropped = Vec::new();
    for (key, value) in class.parameters.iter().flatten() {
        if params::is_known(key) {
            kept.insert(key.clone(), value.clone());
        } else {
            let why = DROPPED
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map_or("not a parameter of our provisioner", |(_, why)| why);
            dropped.push((key.clone(), why.to_string()));
        }
    }
    // ceph-csi reads the Ceph user from the secret (userID); ours from the class
    let admin = users.admin.clone().unwrap_or_else(|| "admin".into());
    if admin != "admin" {
        kept.entry("adminId".into()).or_insert(admin.clone());
    }
    if let Some(node) = users.node.clone().filter(|n| *n != admin) {
        kept.entry("userId".into()).or_insert(node);
    }
    let problem = Parameters::parse(&kept).err().map(|e| e.to_string());
    let mut object = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": metadata(&class.metadata),
        "provisioner": provisioner,
        "parameters": kept,
    });
    if let Some(policy) = &class.reclaim_policy {
        object["reclaimPolicy"] = json!(policy);
    }
    if let Some(expand) = class.allow_volume_expansion {
        object["allowVolumeExpansion"] = json!(expand);
    }
    if let Some(mode) = &class.volume_binding_mode {
        object["volumeBindingMode"] = json!(mode);
    }
    if let Some(options) = class.mount_options.as_ref().filter(|o| !o.is_empty()) {
        object["mountOptions"] = json!(options);
    }
    if let Some(topologies) = class.allowed_topologies.as_ref().filter(|t| !t.is_empty()) {
        object["allowedTopologies"] = json!(topologies);
    }
    Translated {
        kind: "StorageClass",
        name: class.metadata.name.clone().unwrap_or_default(),
        object,
        dropped,
        problem,
    }
}

/// The snapshot class parameters ours takes.
const SNAPSHOT_SECRET_PREFIXES: &[&str] = &[
    "csi.storage.k8s.io/snapshotter-secret-",
    "csi.storage.k8s.io/snapshotter-list-secret-",
];

/// `class` (ceph-csi's) for our `driver`.
#[must_use]
pub fn snapshot_class(class: &VolumeSnapshotClass, driver: &str) -> Translated {
    let mut kept = BTreeMap::new();
    let mut dropped = Vec::new();
    for (key, value) in class.parameters.iter().flatten() {
        if SNAPSHOT_SECRET_PREFIXES.iter().any(|p| key.starts_with(p)) {
            kept.insert(key.clone(), value.clone());
        } else {
            let why = match key.as_str() {
                "clusterID" | "pool" => {
                    "a snapshot is made in its source volume's cluster and pool"
                }
                "snapshotNamePrefix" => {
                    "our snapshot images are named csi-snap-<hash of the snapshot's name>"
                }
                "imageFeatures" => "snapshot images get librbd's default features",
                _ => "not a snapshot parameter of ours (only the snapshotter secrets are)",
            };
            dropped.push((key.clone(), why.to_string()));
        }
    }
    let mut object = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotClass",
        "metadata": metadata(&class.metadata),
        "driver": driver,
        "parameters": kept,
    });
    if let Some(policy) = &class.deletion_policy {
        object["deletionPolicy"] = json!(policy);
    }
    Translated {
        kind: "VolumeSnapshotClass",
        name: class.metadata.name.clone().unwrap_or_default(),
        object,
        dropped,
        problem: None,
    }
}

/// The translations as text: each class as JSON (`kubectl apply -f` takes it), with what was
/// dropped and what to do, as comments.
#[must_use]
pub fn render(classes: &[Translated]) -> String {
    let mut out = String::new();
    for t in classes {
        let how = if t.kind == "StorageClass" {
            "delete the class and create it again with this (its provisioner and parameters are \
             immutable); the PVs and claims of the class are not affected"
        } else {
            "apply this in its place"
        };
        out.push_str(&format!("# {} {} for our driver: {how}\n", t.kind, t.name));
        for (key, why) in &t.dropped {
            out.push_str(&format!("#   dropped parameter {key}: {why}\n"));
        }
        if let Some(problem) = &t.problem {
            out.push_str(&format!(
                "#   still refused by our provisioner: {problem}\n"
            ));
        }
        out.push_str(&serde_json::to_string_pretty(&t.object).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// The translations as JSON.
#[must_use]
pub fn to_json(classes: &[Translated]) -> Value {
    json!(
        classes
            .iter()
            .map(|t| json!({
                "kind": t.kind,
                "name": t.name,
                "translated": t.object,
                "dropped": t.dropped.iter().map(|(k, why)| json!({"parameter": k, "reason": why})).collect::<Vec<_>>(),
                "problem": t.problem,
            }))
            .collect::<Vec<_>>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceph_csi_class() -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": "csi-rbd-sc", "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true",
                LAST_APPLIED: "{}",
            }},
            "provisioner": "rbd.csi.ceph.com",
            "reclaimPolicy": "Delete",
            "allowVolumeExpansion": true,
            "mountOptions": ["discard"],
            "parameters": {
                "clusterID": "rook-ceph", "pool": "replicapool", "imageFormat": "2",
                "imageFeatures": "layering",
                "csi.storage.k8s.io/provisioner-secret-name": "csi-rbd-secret",
                "csi.storage.k8s.io/provisioner-secret-namespace": "default",
                "csi.storage.k8s.io/controller-expand-secret-name": "csi-rbd-secret",
                "csi.storage.k8s.io/controller-expand-secret-namespace": "default",
                "csi.storage.k8s.io/node-stage-secret-name": "csi-rbd-secret",
                "csi.storage.k8s.io/node-stage-secret-namespace": "default",
                "csi.storage.k8s.io/fstype": "ext4",
                "mapOptions": "krbd:lock_on_read",
                "volumeNamePrefix": "k8s-",
                "someFutureKey": "x",
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_storage_class_keeps_what_ours_knows_and_says_what_it_drops() {
        let users = SecretUsers {
            admin: Some("kubernetes".into()),
            node: Some("kubernetes".into()),
        };
        let t = storage_class(&ceph_csi_class(), "ceph.com/rbd", &users);
        assert_eq!(t.problem, None, "{t:?}");
        let o = &t.object;
        assert_eq!(o["provisioner"], "ceph.com/rbd");
        assert_eq!(o["metadata"]["name"], "csi-rbd-sc");
        assert_eq!(
            o["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"],
            "true"
        );
        assert!(o["metadata"]["annotations"].get(LAST_APPLIED).is_none());
        assert_eq!(o["reclaimPolicy"], "Delete");
        assert_eq!(o["allowVolumeExpansion"], true);
        assert_eq!(o["mountOptions"], json!(["discard"]));
        let p = &o["parameters"];
        assert_eq!(p["clusterID"], "rook-ceph");
        assert_eq!(
            p["csi.storage.k8s.io/node-stage-secret-name"],
            "csi-rbd-secret"
        );
        assert_eq!(p["adminId"], "kubernetes", "the secret's user");
        assert!(p.get("userId").is_none(), "the same user as the admin");
        let dropped: Vec<&str> = t.dropped.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(dropped, ["mapOptions", "someFutureKey", "volumeNamePrefix"]);
        assert!(
            t.dropped[1]
                .1
                .contains("not a parameter of our provisioner"),
            "{t:?}"
        );
        let text = render(&[t]);
        assert!(text.contains("# StorageClass csi-rbd-sc"), "{text}");
        assert!(
            text.contains("dropped parameter volumeNamePrefix"),
            "{text}"
        );
    }

    #[test]
    fn a_class_ours_would_refuse_says_why() {
        let mut class = ceph_csi_class();
        class
            .parameters
            .as_mut()
            .unwrap()
            .remove("csi.storage.k8s.io/provisioner-secret-name");
        class
            .parameters
            .as_mut()
            .unwrap()
            .remove("csi.storage.k8s.io/controller-expand-secret-name");
        let t = storage_class(&class, "ceph.com/rbd", &SecretUsers::default());
        let problem = t.problem.clone().unwrap();
        assert!(problem.contains("adminSecretName"), "{problem}");
        assert!(render(&[t]).contains("still refused"));
    }

    #[test]
    fn a_snapshot_class_keeps_its_secrets_only() {
        let class: VolumeSnapshotClass = serde_json::from_value(json!({
            "metadata": {"name": "csi-rbdplugin-snapclass"},
            "driver": "rbd.csi.ceph.com",
            "deletionPolicy": "Delete",
            "parameters": {
                "clusterID": "rook-ceph",
                "csi.storage.k8s.io/snapshotter-secret-name": "csi-rbd-secret",
                "csi.storage.k8s.io/snapshotter-secret-namespace": "default",
            },
        }))
        .unwrap();
        let t = snapshot_class(&class, "rbd.provisioner.ceph.io");
        assert_eq!(t.object["driver"], "rbd.provisioner.ceph.io");
        assert_eq!(t.object["deletionPolicy"], "Delete");
        assert_eq!(
            t.object["parameters"],
            json!({
                "csi.storage.k8s.io/snapshotter-secret-name": "csi-rbd-secret",
                "csi.storage.k8s.io/snapshotter-secret-namespace": "default",
            })
        );
        assert_eq!(t.dropped.len(), 1);
        assert_eq!(to_json(&[t])[0]["dropped"][0]["parameter"], "clusterID");
    }
}
