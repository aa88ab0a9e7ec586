//! The Controller service over a real unix socket against a private Ceph cluster: create/delete/
//! expand with the spec's idempotency and error codes, capabilities, capacity, owner metadata.

mod common;

use std::collections::HashMap;

use common::controller::{MIB, create_request, image_size, params, remove_image, secrets, server};
use common::{block_cap, mount_cap, strings};
use rbd_csi::proto::csi;
use tonic::Code;

#[tokio::test]
async fn create_is_idempotent_and_records_the_owner() {
    let server = server().await;
    let mut ctl = server.controller().await;
    remove_image("pvc-ctl-create");
    let first = ctl
        .create_volume(create_request("pvc-ctl-create", 10 * MIB + 1))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(first.capacity_bytes, 11 * MIB, "rounded up to MiB");
    let cluster = micro_ceph::cluster();
    assert_eq!(
        first.volume_id,
        format!("v1/{}/{}/pvc-ctl-create", cluster.monitors, cluster.pool)
    );
    assert_eq!(first.volume_context["imageName"], "pvc-ctl-create");
    assert_eq!(first.volume_context["pool"], cluster.pool);
    assert_eq!(first.volume_context["monitors"], cluster.monitors);
    assert_eq!(first.volume_context["mounter"], "fuse");
    assert_eq!(image_size("pvc-ctl-create"), Some(11 << 20));

    // Same name, compatible size: the same volume.
    let again = ctl
        .create_volume(create_request("pvc-ctl-create", 5 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, first.volume_id);
    assert_eq!(again.capacity_bytes, 11 * MIB);
    // Incompatible size: ALREADY_EXISTS.
    let err = ctl
        .create_volume(create_request("pvc-ctl-create", 64 * MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    let meta = cluster
        .rbd(&[
            "image-meta",
            "list",
            "--format",
            "json",
            &format!("{}/pvc-ctl-create", cluster.pool),
        ])
        .unwrap();
    let meta: HashMap<String, String> = serde_json::from_str(&meta).unwrap();
    assert_eq!(meta["provisioner.ceph.com/pv"], "pvc-ctl-create");
    assert_eq!(meta["provisioner.ceph.com/claim"], "apps/data");
    assert_eq!(
        meta["provisioner.ceph.com/provisioner"],
        "rbd.provisioner.ceph.io"
    );

    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: first.volume_id.clone(),
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert_eq!(image_size("pvc-ctl-create"), None);
    // Deleting again (volume gone) is OK.
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: first.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn default_size_is_one_gib_and_unsafe_names_are_hashed() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let vol = ctl
        .create_volume(create_request("Weird Name/1", 0))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.capacity_bytes, 1 << 30);
    let image = &vol.volume_context["imageName"];
    assert!(image.starts_with("csi-vol-"), "{image}");
    assert_eq!(image_size(image), Some(1 << 30));
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_image_owned_by_another_name_is_not_adopted() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let cluster = micro_ceph::cluster();
    remove_image("pvc-ctl-foreign");
    cluster
        .rbd(&[
            "create",
            "--size",
            "4M",
            &format!("{}/pvc-ctl-foreign", cluster.pool),
        ])
        .unwrap();
    cluster
        .rbd(&[
            "image-meta",
            "set",
            &format!("{}/pvc-ctl-foreign", cluster.pool),
            "provisioner.ceph.com/pv",
            "someone-else",
        ])
        .unwrap();
    let err = ctl
        .create_volume(create_request("pvc-ctl-foreign", MIB))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(err.message().contains("someone-else"));
    remove_image("pvc-ctl-foreign");
}

#[tokio::test]
async fn missing_fields_and_bad_parameters_are_invalid_argument() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let mut req = create_request("", MIB);
    let err = ctl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("name"));

    req = create_request("pvc-ctl-invalid", MIB);
    req.volume_capabilities.clear();
    let err = ctl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("volume_capabilities"));

    req = create_request("pvc-ctl-invalid", MIB);
    req.parameters
        .insert("imageFeature".into(), "layering".into());
    let err = ctl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("imageFeature"));

    req = create_request("pvc-ctl-invalid", MIB);
    req.parameters
        .insert("imageFeatures".into(), "object-map".into());
    let err = ctl.create_volume(req).await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "object-map needs exclusive-lock"
    );

    req = create_request("pvc-ctl-invalid", MIB);
    req.secrets.clear();
    let err = ctl.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("userKey"));

    let err = ctl
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: String::new(),
            secrets: secrets(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("volume_id"));
    // A malformed (foreign) id names nothing of ours: OK.
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: "not-ours".into(),
        secrets: secrets(),
    })
    .await
    .unwrap();
}

/// What external-provisioner sends for a claim with `ReadWriteOnce` and `ReadOnlyMany`: one
/// capability per mode. Kubernetes would attach such a volume to several nodes, each able to
/// write; it is refused before any image exists.
#[tokio::test]
async fn many_readers_with_a_single_node_writer_are_refused_naming_volume_capabilities() {
    use csi::volume_capability::access_mode::Mode;
    let with_mode = |mut cap: csi::VolumeCapability, mode: Mode| {
        if let Some(access) = cap.access_mode.as_mut() {
            access.mode = mode as i32;
        }
        cap
    };
    let server = server().await;
    let mut ctl = server.controller().await;
    remove_image("pvc-ctl-rwo-rox");
    for writer in [
        Mode::SingleNodeWriter,
        Mode::SingleNodeMultiWriter,
        Mode::SingleNodeSingleWriter,
    ] {
        for base in [mount_cap("ext4"), block_cap()] {
            let mut req = create_request("pvc-ctl-rwo-rox", MIB);
            req.volume_capabilities = vec![
                with_mode(base.clone(), Mode::MultiNodeReaderOnly),
                with_mode(base, writer),
            ];
            let err = ctl.create_volume(req).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{writer:?}: {err:?}");
            assert!(
                err.message().starts_with("volume_capabilities:")
                    && err.message().contains("MULTI_NODE_READER_ONLY"),
                "{}",
                err.message()
            );
        }
    }
    assert_eq!(image_size("pvc-ctl-rwo-rox"), None, "an image was made");
    // a raw block volume for many writers may also be asked for as single-node or read-only
    let mut req = create_request("pvc-ctl-rwx-all", MIB);
    req.volume_capabilities = vec![
        with_mode(block_cap(), Mode::MultiNodeMultiWriter),
        with_mode(block_cap(), Mode::SingleNodeWriter),
        with_mode(block_cap(), Mode::MultiNodeReaderOnly),
    ];
    ctl.create_volume(req).await.unwrap();
    remove_image("pvc-ctl-rwx-all");
}

#[tokio::test]
async fn expand_grows_never_shrinks_and_missing_volumes_are_not_found() {
    let server = server().await;
    let mut ctl = server.controller().await;
    remove_image("pvc-ctl-expand");
    let vol = ctl
        .create_volume(create_request("pvc-ctl-expand", 8 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let expand = |required: i64, cap: csi::VolumeCapability| csi::ControllerExpandVolumeRequest {
        volume_id: vol.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        secrets: secrets(),
        volume_capability: Some(cap),
    };
    let grown = ctl
        .controller_expand_volume(expand(20 * MIB, mount_cap("ext4")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 20 * MIB);
    assert!(grown.node_expansion_required);
    assert_eq!(image_size("pvc-ctl-expand"), Some(20 << 20));
    // Idempotent, and a smaller request never shrinks.
    let same = ctl
        .controller_expand_volume(expand(4 * MIB, block_cap()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.capacity_bytes, 20 * MIB);
    assert!(
        !same.node_expansion_required,
        "block volumes need no node step"
    );
    assert_eq!(image_size("pvc-ctl-expand"), Some(20 << 20));

    let mut missing = expand(30 * MIB, mount_cap("ext4"));
    missing.volume_id = vol
        .volume_id
        .replace("pvc-ctl-expand", "pvc-ctl-nonexistent");
    let err = ctl.controller_expand_volume(missing).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let mut malformed = expand(30 * MIB, mount_cap("ext4"));
    malformed.volume_id = "garbage".into();
    assert_eq!(
        ctl.controller_expand_volume(malformed)
            .await
            .unwrap_err()
            .code(),
        Code::NotFound
    );
    let mut no_range = expand(30 * MIB, mount_cap("ext4"));
    no_range.capacity_range = None;
    let err = ctl.controller_expand_volume(no_range).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("capacity_range"));

    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn validate_capabilities_capacity_and_controller_capabilities() {
    let server = server().await;
    let mut ctl = server.controller().await;
    remove_image("pvc-ctl-validate");
    let vol = ctl
        .create_volume(create_request("pvc-ctl-validate", MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let ok = ctl
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: vol.volume_id.clone(),
            volume_capabilities: vec![mount_cap("xfs"), block_cap()],
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let unsupported = ctl
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: vol.volume_id.clone(),
            volume_capabilities: vec![mount_cap("btrfs")],
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(unsupported.confirmed.is_none());
    assert!(unsupported.message.contains("btrfs"));
    let err = ctl
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: vol.volume_id.replace("pvc-ctl-validate", "pvc-ctl-gone"),
            volume_capabilities: vec![mount_cap("ext4")],
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let capacity = ctl
        .get_capacity(csi::GetCapacityRequest {
            parameters: params(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(capacity.available_capacity >= 0);
    assert_eq!(capacity.minimum_volume_size, Some(MIB));
    let err = ctl
        .get_capacity(csi::GetCapacityRequest {
            parameters: strings(&[("pool", "no-such-pool")]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    use csi::controller_service_capability::{Type, rpc};
    let caps: Vec<i32> = ctl
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(r)| r.r#type))
        .collect();
    for want in [
        rpc::Type::CreateDeleteVolume,
        rpc::Type::ExpandVolume,
        rpc::Type::GetCapacity,
        rpc::Type::ListVolumes,
        rpc::Type::VolumeCondition,
        rpc::Type::ModifyVolume,
        rpc::Type::PublishUnpublishVolume,
        rpc::Type::PublishReadonly,
    ] {
        assert!(caps.contains(&(want as i32)), "missing {want:?}");
    }
    // ListVolumes does not report published nodes
    assert!(!caps.contains(&(rpc::Type::ListVolumesPublishedNodes as i32)));
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}
