//! A claim's data source (`spec.dataSourceRef`, else `spec.dataSource`), as external-provisioner
//! v6.3 reads it: a `VolumeSnapshot` (API group `snapshot.storage.k8s.io`) or a
//! `PersistentVolumeClaim` (core group) in the claim's own namespace. Pure.
//!
//! Cross-namespace sources (`dataSourceRef.namespace` other than the claim's) need the alpha
//! gate `CrossNamespaceVolumeDataSource` and a `ReferenceGrant` upstream; they are refused here.
//! Other kinds (volume populators) are refused too: this provisioner populates nothing else.
//!
//! [`checks`] holds external-provisioner's checks of such a source before a volume is made
//! from it (generic over the backend's reading of snapshot handles and volumes), [`protection`]
//! its protection finalizers on the source meanwhile.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

pub mod checks;
pub mod protection;

/// API group of VolumeSnapshots.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// Finalizer external-provisioner (v6.2+) puts on a VolumeSnapshot while a claim is being
/// restored from it.
pub const SNAPSHOT_SOURCE_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// Finalizer external-provisioner puts on a claim while another claim is being cloned from it.
pub const CLONE_SOURCE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";

/// Where a claim's content comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DataSource {
    /// The VolumeSnapshot of this name in the claim's namespace.
    Snapshot(String),
    /// The PersistentVolumeClaim of this name in the claim's namespace.
    Claim(String),
}

impl DataSource {
    /// The source's name.
    #[must_use]
    pub fn name(&self) -> &str {
        match self {
            Self::Snapshot(n) | Self::Claim(n) => n,
        }
    }
}

/// The claim's data source: `None` for an empty volume; `Err` names the field and the problem.
///
/// # Errors
/// A cross-namespace reference, an unsupported kind or group, an empty name.
pub fn data_source(claim: &PersistentVolumeClaim) -> Result<Option<DataSource>, String> {
    let Some(spec) = claim.spec.as_ref() else {
        return Ok(None);
    };
    // The API server keeps both in sync when dataSourceRef has no namespace; dataSourceRef
    // wins (it is the one that can say more).
    let (field, kind, group, name, namespace) = if let Some(r) = &spec.data_source_ref {
        (
            "spec.dataSourceRef",
            r.kind.as_str(),
            r.api_group.as_deref().unwrap_or_default(),
            r.name.as_str(),
            r.namespace.as_deref(),
        )
    } else if let Some(r) = &spec.data_source {
        (
            "spec.dataSource",
            r.kind.as_str(),
            r.api_group.as_deref().unwrap_or_default(),
            r.name.as_str(),
            None,
        )
    } else {
        return Ok(None);
    };
    let claim_ns = claim.metadata.namespace.as_deref().unwrap_or("default");
    if let Some(ns) = namespace.filter(|ns| !ns.is_empty() && *ns != claim_ns) {
        return Err(format!(
            "{field}.namespace {ns:?} differs from the claim's namespace {claim_ns:?}: \
             cross-namespace data sources are not supported"
        ));
    }
    if name.is_empty() {
        return Err(format!("{field}.name is empty"));
    }
    match (kind, group) {
        ("VolumeSnapshot", SNAPSHOT_GROUP) => Ok(Some(DataSource::Snapshot(name.to_owned()))),
        ("PersistentVolumeClaim", "") => Ok(Some(DataSource::Claim(name.to_owned()))),
        _ => Err(format!(
            "{field} of kind {kind:?} in API group {group:?} is not supported (VolumeSnapshot \
             in {SNAPSHOT_GROUP:?} or PersistentVolumeClaim in the core group)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[allow(clippy::needless_pass_by_value)]
    fn claim(spec: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn snapshot_and_claim_sources_and_refusals() {
        assert_eq!(data_source(&claim(json!({}))).unwrap(), None);
        let snap = json!({"kind": "VolumeSnapshot", "apiGroup": SNAPSHOT_GROUP, "name": "s"});
        assert_eq!(
            data_source(&claim(json!({"dataSource": snap}))).unwrap(),
            Some(DataSource::Snapshot("s".into()))
        );
        assert_eq!(
            data_source(&claim(
                json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "p", "namespace": "ns"}})
            ))
            .unwrap(),
            Some(DataSource::Claim("p".into()))
        );
        let e = data_source(&claim(
            json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "p", "namespace": "other"}}),
        ))
        .unwrap_err();
        assert!(
            e.starts_with("spec.dataSourceRef.namespace \"other\""),
            "{e}"
        );
        let e = data_source(&claim(
            json!({"dataSource": {"kind": "VolumeSnapshot", "name": "s"}}),
        ))
        .unwrap_err();
        assert!(
            e.starts_with("spec.dataSource of kind \"VolumeSnapshot\" in API group \"\""),
            "{e}"
        );
        let e = data_source(&claim(
            json!({"dataSourceRef": {"kind": "Pop", "apiGroup": "x.io", "name": "s"}}),
        ))
        .unwrap_err();
        assert!(e.contains("not supported"), "{e}");
    }
}
