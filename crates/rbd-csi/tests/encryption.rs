//! Encrypted volumes on the host (no dm-crypt here: the LUKS2 data path is tested in the VM,
//! `rbd-provisioner`'s `vm_kernel` suite): the controller stores a key through the KMS entry
//! and hands the encryption to the node in the volume context; bad KMS settings are refused
//! naming the parameter and the entry; the fuse mapper refuses encrypted volumes.

mod common;

use std::collections::HashMap;

use common::controller::{MIB, create_request, image_meta, image_size, remove_image, secrets};
use common::{TestServer, mount_cap};
use rbd_csi::proto::csi;
use rbd_csi::{ProbeCluster, Services};
use tonic::Code;

async fn server(kms_config: &str) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, kms_config).unwrap();
    let cluster = micro_ceph::cluster();
    let server = TestServer::start(Services::All, |c| {
        c.probe = Some(ProbeCluster {
            monitors: cluster.monitors.clone(),
            user: "admin".into(),
            key: cluster.admin_key.clone(),
        });
        c.kms_config = path.clone();
    })
    .await;
    (server, dir)
}

fn encrypted_request(name: &str, kms_id: &str, mounter: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, 16 * MIB);
    for (k, v) in [
        ("encrypted", "true"),
        ("encryptionType", "block"),
        ("encryptionKMSID", kms_id),
        ("mounter", mounter),
    ] {
        req.parameters.insert(k.into(), v.into());
    }
    req
}

#[tokio::test]
async fn an_encrypted_create_stores_a_key_once_and_tells_the_node() {
    let (server, _dir) = server(r#"{"plain": {"encryptionKMSType": "metadata"}}"#).await;
    let mut ctl = server.controller().await;
    remove_image("pvc-crypt-create");
    let vol = ctl
        .create_volume(encrypted_request("pvc-crypt-create", "plain", "rbd"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.volume_context["encrypted"], "true");
    assert_eq!(vol.volume_context["encryptionType"], "block");
    assert_eq!(vol.volume_context["encryptionKMSID"], "plain");
    let meta = image_meta("pvc-crypt-create");
    let dek = meta["rbd.csi.ceph.com/dek"].clone();
    assert!(
        dek.len() == 64 && dek.chars().all(|c| c.is_ascii_hexdigit()),
        "a 256-bit key is stored"
    );
    assert_eq!(meta["rbd.csi.ceph.com/encrypted"], "encryptionPrepared");
    // a retried create keeps the key (a new one would lock the data out)
    ctl.create_volume(encrypted_request("pvc-crypt-create", "plain", "rbd"))
        .await
        .unwrap();
    assert_eq!(image_meta("pvc-crypt-create")["rbd.csi.ceph.com/dek"], dek);
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert_eq!(image_size("pvc-crypt-create"), None);
}

#[tokio::test]
async fn bad_kms_settings_are_refused_before_anything_is_made() {
    let (server, dir) = server(
        r#"{"plain": {"encryptionKMSType": "metadata"}, "v": {"encryptionKMSType": "vault"}}"#,
    )
    .await;
    let mut ctl = server.controller().await;
    remove_image("pvc-crypt-bad");
    for (kms, mounter, names) in [
        ("nope", "rbd", vec!["encryptionKMSID", "\"nope\""]),
        ("v", "rbd", vec!["encryptionKMSID", "\"v\"", "vault"]),
        ("plain", "fuse", vec!["parameters.encrypted", "fuse"]),
    ] {
        let err = ctl
            .create_volume(encrypted_request("pvc-crypt-bad", kms, mounter))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        for name in names {
            assert!(err.message().contains(name), "{name}: {}", err.message());
        }
    }
    let mut req = encrypted_request("pvc-crypt-bad", "plain", "rbd");
    req.parameters.remove("encryptionKMSID");
    let err = ctl.create_volume(req).await.unwrap_err();
    assert!(
        err.message().contains("encryptionKMSID"),
        "{}",
        err.message()
    );
    // an unreadable KMS configuration names the file
    std::fs::write(dir.path().join("config.json"), "not json").unwrap();
    let err = ctl
        .create_volume(encrypted_request("pvc-crypt-bad", "plain", "rbd"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("config.json"), "{}", err.message());
    assert_eq!(image_size("pvc-crypt-bad"), None, "nothing was created");
}

#[tokio::test]
async fn the_fuse_mapper_refuses_an_encrypted_volume() {
    let (server, _dir) = server(r#"{"plain": {"encryptionKMSType": "metadata"}}"#).await;
    let mut ctl = server.controller().await;
    let mut node = server.node().await;
    remove_image("pvc-crypt-fuse");
    let vol = ctl
        .create_volume(encrypted_request("pvc-crypt-fuse", "plain", "rbd"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    // staged with the fuse mapper (this host's default mapper, as the class names none)
    let mut context = vol.volume_context.clone();
    context.insert("mounter".into(), "fuse".into());
    let staging = server.dir.path().join("staging");
    let err = node
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap("ext4")),
            secrets: secrets(),
            volume_context: context,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("volume_context.encrypted") && err.message().contains("fuse"),
        "{}",
        err.message()
    );
    assert!(common::mounts_under(server.dir.path()).is_empty());
    assert!(common::loops_under(server.dir.path()).is_empty());
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_restore_and_a_clone_of_an_encrypted_volume_carry_its_key() {
    let (server, _dir) = server(r#"{"plain": {"encryptionKMSType": "metadata"}}"#).await;
    let mut ctl = server.controller().await;
    for name in ["pvc-crypt-src", "pvc-crypt-restore", "pvc-crypt-clone"] {
        remove_image(name);
    }
    let volume =
        |resp: tonic::Response<csi::CreateVolumeResponse>| resp.into_inner().volume.unwrap();
    let src = volume(
        ctl.create_volume(encrypted_request("pvc-crypt-src", "plain", "rbd"))
            .await
            .unwrap(),
    );
    let dek = image_meta("pvc-crypt-src")["rbd.csi.ceph.com/dek"].clone();
    let snap = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-crypt-src".into(),
            source_volume_id: src.volume_id.clone(),
            secrets: secrets(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let mut restore = encrypted_request("pvc-crypt-restore", "plain", "rbd");
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    let mut clone = encrypted_request("pvc-crypt-clone", "plain", "rbd");
    clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: src.volume_id.clone(),
            },
        )),
    });
    let mut made = Vec::new();
    for (req, image) in [(restore, "pvc-crypt-restore"), (clone, "pvc-crypt-clone")] {
        let vol = volume(ctl.create_volume(req).await.unwrap());
        assert_eq!(vol.volume_context["encryptionKMSID"], "plain");
        assert_eq!(
            image_meta(image).get("rbd.csi.ceph.com/dek"),
            Some(&dek),
            "{image} has its own copy of the source's key (it shares its LUKS header)"
        );
        made.push(vol.volume_id);
    }
    for volume_id in made {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id,
            secrets: secrets(),
        })
        .await
        .unwrap();
    }
    ctl.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: src.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_restore_or_clone_keeps_its_sources_encryption() {
    let (server, _dir) = server(r#"{"plain": {"encryptionKMSType": "metadata"}}"#).await;
    let mut ctl = server.controller().await;
    let names = [
        "pvc-crypt-mix-enc",
        "pvc-crypt-mix-plain",
        "pvc-crypt-mix-a",
        "pvc-crypt-mix-b",
        "pvc-crypt-mix-c",
    ];
    for name in names {
        remove_image(name);
    }
    let volume =
        |resp: tonic::Response<csi::CreateVolumeResponse>| resp.into_inner().volume.unwrap();
    let encrypted = volume(
        ctl.create_volume(encrypted_request("pvc-crypt-mix-enc", "plain", "rbd"))
            .await
            .unwrap(),
    );
    let plain = volume(
        ctl.create_volume(create_request("pvc-crypt-mix-plain", 16 * MIB))
            .await
            .unwrap(),
    );
    let snap = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-crypt-mix".into(),
            source_volume_id: encrypted.volume_id.clone(),
            secrets: secrets(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let from_volume = |id: &str| {
        Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: id.to_owned(),
                },
            )),
        })
    };
    // an encrypted volume cloned, and its snapshot restored, into an unencrypted class
    let mut clone = create_request("pvc-crypt-mix-a", 16 * MIB);
    clone.volume_content_source = from_volume(&encrypted.volume_id);
    let mut restore = create_request("pvc-crypt-mix-b", 16 * MIB);
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    // an unencrypted volume cloned into an encrypted class
    let mut into_encrypted = encrypted_request("pvc-crypt-mix-c", "plain", "rbd");
    into_encrypted.volume_content_source = from_volume(&plain.volume_id);
    for (req, source, problem) in [
        (
            clone,
            "pvc-crypt-mix-enc",
            "is encrypted and the class is not",
        ),
        (restore, "snap", "is encrypted and the class is not"),
        (
            into_encrypted,
            "pvc-crypt-mix-plain",
            "the class is encrypted and the source",
        ),
    ] {
        let name = req.name.clone();
        let err = ctl.create_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        for part in ["parameters: parameter encrypted:", source, problem] {
            assert!(err.message().contains(part), "{part}: {}", err.message());
        }
        assert_eq!(image_size(&name), None, "{name}: nothing was made");
    }
    ctl.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    for id in [encrypted.volume_id, plain.volume_id] {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            secrets: secrets(),
        })
        .await
        .unwrap();
    }
}

/// A volume an older ceph-csi encrypted carries its state and key under the keys ceph-csi used
/// then (`.rbd.csi.ceph.com/encrypted`, `.rbd.csi.ceph.com/dek`): it counts as encrypted, and
/// a clone of it into an encrypted class gets a copy of that key (under today's key name) rather
/// than a new one: it shares the source's LUKS header.
#[tokio::test]
async fn a_volume_with_an_older_ceph_csis_keys_is_encrypted_and_its_clone_keeps_the_key() {
    let (server, _dir) = server(r#"{"plain": {"encryptionKMSType": "metadata"}}"#).await;
    let mut ctl = server.controller().await;
    for name in [
        "pvc-crypt-legacy",
        "pvc-crypt-legacy-a",
        "pvc-crypt-legacy-b",
    ] {
        remove_image(name);
    }
    let legacy = ctl
        .create_volume(create_request("pvc-crypt-legacy", 16 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let cluster = micro_ceph::cluster();
    let spec = format!("{}/pvc-crypt-legacy", cluster.pool);
    let dek = "5f".repeat(32);
    for (key, value) in [
        (".rbd.csi.ceph.com/encrypted", "encrypted"),
        (".rbd.csi.ceph.com/dek", dek.as_str()),
    ] {
        cluster
            .rbd(&["image-meta", "set", &spec, key, value])
            .unwrap();
    }
    let from_legacy = || {
        Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: legacy.volume_id.clone(),
                },
            )),
        })
    };
    let mut plain = create_request("pvc-crypt-legacy-a", 16 * MIB);
    plain.volume_content_source = from_legacy();
    let err = ctl.create_volume(plain).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    assert!(
        err.message().contains("is encrypted and the class is not"),
        "{}",
        err.message()
    );

    let mut encrypted = encrypted_request("pvc-crypt-legacy-b", "plain", "rbd");
    encrypted.volume_content_source = from_legacy();
    let clone = ctl
        .create_volume(encrypted)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let meta = image_meta("pvc-crypt-legacy-b");
    assert_eq!(
        meta.get("rbd.csi.ceph.com/dek"),
        Some(&dek),
        "the source's key, not a new one: {meta:?}"
    );
    for volume_id in [clone.volume_id, legacy.volume_id.clone()] {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id,
            secrets: secrets(),
        })
        .await
        .unwrap();
    }
}
