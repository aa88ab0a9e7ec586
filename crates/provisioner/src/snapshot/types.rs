//! Typed `snapshot.storage.k8s.io/v1` resources: VolumeSnapshot, VolumeSnapshotContent and
//! VolumeSnapshotClass, with the fields the provisioning and snapshot controllers read (other
//! fields are ignored when reading). Objects are read with these types and written with merge
//! patches of the fields that change, so a field name is checked by the compiler on both sides.
//! (They carry no `apiVersion`/`kind`: to create one, post it through an `Api<DynamicObject>`
//! of `ApiResource::erase::<T>(&())`, or as JSON.)

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Serialize};

use crate::data_source::SNAPSHOT_GROUP;

/// The API version of the snapshot resources.
pub const SNAPSHOT_VERSION: &str = "v1";

macro_rules! snapshot_resource {
    ($ty:ty, $kind:literal, $plural:literal, $scope:ty) => {
        custom_resource!(
            $ty,
            SNAPSHOT_GROUP,
            SNAPSHOT_VERSION,
            $kind,
            $plural,
            $scope
        );
    };
}

/// A user's request for a snapshot of a claim (namespaced).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshot {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// What to snapshot and with which class.
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
    /// Set by the snapshot-controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}

/// `VolumeSnapshot.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    /// What to snapshot.
    #[serde(default)]
    pub source: VolumeSnapshotSource,
    /// The class (`volumeSnapshotClassName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// `VolumeSnapshot.spec.source`: exactly one of the two.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    /// A claim in the snapshot's namespace (a dynamic snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    /// An existing content (a pre-provisioned snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

/// `VolumeSnapshot.status`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    /// The content this snapshot is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    /// Whether the snapshot can be restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The smallest volume a restore needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
    /// The last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotStatusError>,
}

/// The storage side of a snapshot (cluster-scoped).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContent {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// Driver, source, policy and the VolumeSnapshot it is bound to.
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    /// Filled by the driver's snapshot controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}

/// `VolumeSnapshotContent.spec`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    /// The CSI driver (or provisioner) name that handles this content.
    #[serde(default)]
    pub driver: String,
    /// `Delete` or `Retain`: what happens to the snapshot when the content goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<String>,
    /// A volume to snapshot (dynamic) or an existing snapshot (pre-provisioned).
    #[serde(default)]
    pub source: VolumeSnapshotContentSource,
    /// The volume mode of the source volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
    /// The class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// The VolumeSnapshot this content is bound to (its uid is empty until bound).
    #[serde(default)]
    pub volume_snapshot_ref: ObjectReference,
}

/// `VolumeSnapshotContent.spec.source`: exactly one of the two.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    /// The CSI volume handle of the volume to snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    /// The handle of an existing snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

/// `VolumeSnapshotContent.status`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    /// The driver's handle of the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// Whether the snapshot can be restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// When the snapshot was taken, in nanoseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// The smallest volume a restore needs, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    /// The last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotStatusError>,
}

/// `status.error` of a VolumeSnapshot or VolumeSnapshotContent.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatusError {
    /// When it happened (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// What happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A class of snapshots (cluster-scoped): driver, deletion policy and the driver's parameters.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The driver the class is for.
    #[serde(default)]
    pub driver: String,
    /// `Delete` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<String>,
    /// Parameters: the `csi.storage.k8s.io/` secret references and the driver's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

snapshot_resource!(
    VolumeSnapshot,
    "VolumeSnapshot",
    "volumesnapshots",
    NamespaceResourceScope
);
snapshot_resource!(
    VolumeSnapshotContent,
    "VolumeSnapshotContent",
    "volumesnapshotcontents",
    ClusterResourceScope
);
snapshot_resource!(
    VolumeSnapshotClass,
    "VolumeSnapshotClass",
    "volumesnapshotclasses",
    ClusterResourceScope
);

impl VolumeSnapshot {
    /// `status.readyToUse` is true.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
    }
}

impl VolumeSnapshotContent {
    /// `status.snapshotHandle`, if set and not empty.
    #[must_use]
    pub fn status_handle(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.snapshot_handle.as_deref())
            .filter(|h| !h.is_empty())
    }

    /// `status.readyToUse` is true and `status.snapshotHandle` is set.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
            && self.status_handle().is_some()
    }

    /// `spec.volumeSnapshotRef.uid`, if not empty (the content is bound).
    #[must_use]
    pub fn bound_uid(&self) -> Option<&str> {
        self.spec
            .volume_snapshot_ref
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
    }

    /// `status.error.message`.
    #[must_use]
    pub fn error_message(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.error.as_ref())
            .and_then(|e| e.message.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_content_reads_the_fields_the_controllers_use() {
        let c: VolumeSnapshotContent = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "c"},
            "spec": {
                "driver": "d", "deletionPolicy": "Retain",
                "source": {"volumeHandle": "v"},
                "volumeSnapshotRef": {"name": "s", "namespace": "ns", "uid": "u"},
            },
            "status": {"snapshotHandle": "h", "readyToUse": true, "restoreSize": 1024,
                       "creationTime": 5, "error": {"message": "m"}},
        }))
        .unwrap();
        assert_eq!(c.spec.source.volume_handle.as_deref(), Some("v"));
        assert_eq!(c.bound_uid(), Some("u"));
        assert!(c.is_ready());
        assert_eq!(c.error_message(), Some("m"));
        assert_eq!(c.status.and_then(|s| s.restore_size), Some(1024));
        let empty: VolumeSnapshotContent =
            serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
        assert!(!empty.is_ready());
        assert_eq!(empty.bound_uid(), None);
    }
}
