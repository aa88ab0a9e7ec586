//! Generated gRPC code: CSI v1 (`csi`) and kubelet plugin registration (`pluginregistration`).
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// CSI v1 messages and the Identity, Controller and Node services (server and client).
pub mod csi {
    tonic::include_proto!("csi.v1");
}

/// Kubelet plugin registration v1 (`Registration` service, server and client).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// Prints how many secrets a request carries, never their keys or values.
struct Redacted(usize);

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} redacted>", self.0)
    }
}

/// `Debug` for a request with `secrets`: every other field as usual, the secrets redacted
/// (prost's derived `Debug` would print them; build.rs skips it for these messages).
macro_rules! redacted_debug {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl std::fmt::Debug for csi::$ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &self.$field))*
                    .field("secrets", &Redacted(self.secrets.len()))
                    .finish()
            }
        }
    };
}

redacted_debug!(CreateVolumeRequest {
    name,
    capacity_range,
    volume_capabilities,
    parameters,
    volume_content_source,
    accessibility_requirements,
    mutable_parameters,
});
redacted_debug!(DeleteVolumeRequest { volume_id });
redacted_debug!(ControllerPublishVolumeRequest {
    volume_id,
    node_id,
    volume_capability,
    readonly,
    volume_context,
});
redacted_debug!(ControllerUnpublishVolumeRequest { volume_id, node_id });
redacted_debug!(ValidateVolumeCapabilitiesRequest {
    volume_id,
    volume_context,
    volume_capabilities,
    parameters,
    mutable_parameters,
});
redacted_debug!(ControllerExpandVolumeRequest {
    volume_id,
    capacity_range,
    volume_capability,
});
redacted_debug!(NodeStageVolumeRequest {
    volume_id,
    publish_context,
    staging_target_path,
    volume_capability,
    volume_context,
});
redacted_debug!(NodePublishVolumeRequest {
    volume_id,
    publish_context,
    staging_target_path,
    target_path,
    volume_capability,
    readonly,
    volume_context,
});
redacted_debug!(NodeExpandVolumeRequest {
    volume_id,
    volume_path,
    capacity_range,
    staging_target_path,
    volume_capability,
});
redacted_debug!(CreateSnapshotRequest {
    source_volume_id,
    name,
    parameters,
});
redacted_debug!(DeleteSnapshotRequest { snapshot_id });
redacted_debug!(ListSnapshotsRequest {
    max_entries,
    starting_token,
    source_volume_id,
    snapshot_id,
});
redacted_debug!(ControllerModifyVolumeRequest {
    volume_id,
    mutable_parameters,
});
redacted_debug!(CreateVolumeGroupSnapshotRequest {
    name,
    source_volume_ids,
    parameters,
});
redacted_debug!(DeleteVolumeGroupSnapshotRequest {
    group_snapshot_id,
    snapshot_ids,
});
redacted_debug!(GetVolumeGroupSnapshotRequest {
    group_snapshot_id,
    snapshot_ids,
});

#[cfg(test)]
mod tests {
    use super::csi;

    #[test]
    fn debug_of_requests_never_prints_secrets() {
        let secrets: std::collections::HashMap<String, String> =
            [("userKey".to_owned(), "AQBsecret==".to_owned())].into();
        let stage = csi::NodeStageVolumeRequest {
            volume_id: "v1/m/p/i".into(),
            secrets: secrets.clone(),
            ..Default::default()
        };
        let text = format!("{stage:?}");
        assert!(
            text.contains("v1/m/p/i") && text.contains("<1 redacted>"),
            "{text}"
        );
        assert!(
            !text.contains("AQBsecret") && !text.contains("userKey"),
            "{text}"
        );
        let create = csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            secrets,
            ..Default::default()
        };
        assert!(!format!("{create:?}").contains("AQBsecret"));
        let snapshot = csi::CreateSnapshotRequest {
            name: "snapshot-1".into(),
            secrets: create.secrets.clone(),
            ..Default::default()
        };
        assert!(!format!("{snapshot:?}").contains("AQBsecret"));
        let group = csi::CreateVolumeGroupSnapshotRequest {
            name: "group-1".into(),
            secrets: create.secrets.clone(),
            ..Default::default()
        };
        assert!(!format!("{group:?}").contains("AQBsecret"));
        let modify = csi::ControllerModifyVolumeRequest {
            volume_id: "v1/m/p/i".into(),
            secrets: create.secrets.clone(),
            ..Default::default()
        };
        assert!(!format!("{modify:?}").contains("AQBsecret"));
    }
}
