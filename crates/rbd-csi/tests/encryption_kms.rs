//! The KMSs that use Kubernetes Secrets, end to end against micro-ceph and the Kubernetes API
//! emulator (through the real kube-rs client): ceph-csi's `metadata` KMS with a `secretName`
//! (the DEK in image metadata, wrapped with the Secret's passphrase) and the `kubernetes-secret`
//! KMS (a Secret per volume). The LUKS2 data path itself is tested in the VM (`vm_kernel`); the
//! node's key step runs here: it comes before anything is mapped.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use common::controller::{MIB, create_request, image_meta, image_size, remove_image, secrets};
use common::{TestServer, mount_cap};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{ObjectMeta, PostParams};
use rbd_csi::kube_secrets::KubeSecrets;
use rbd_csi::proto::csi;
use rbd_csi::{ProbeCluster, Services};
use rbd_volume::encryption::secret_per_volume;
use tonic::Code;

const KMS_NAMESPACE: &str = "kms";

struct Setup {
    server: TestServer,
    emulator: kube_emulator::Emulator,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(kms_config: &str) -> Setup {
        let emulator = kube_emulator::Emulator::new();
        let namespaces = kube::Api::<Namespace>::all(emulator.client());
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": KMS_NAMESPACE}}))
                .unwrap();
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, kms_config).unwrap();
        let cluster = micro_ceph::cluster();
        let store = Arc::new(KubeSecrets::new(emulator.client()));
        let server = TestServer::start(Services::All, |c| {
            c.probe = Some(ProbeCluster {
                monitors: cluster.monitors.clone(),
                user: "admin".into(),
                key: cluster.admin_key.clone(),
            });
            c.kms_config = path.clone();
            c.secrets = Some(store);
        })
        .await;
        Setup {
            server,
            emulator,
            _dir: dir,
        }
    }

    fn secrets(&self) -> kube::Api<Secret> {
        kube::Api::namespaced(self.emulator.client(), KMS_NAMESPACE)
    }

    /// Creates or replaces the key-encryption Secret `name` with `passphrase`.
    async fn put_kek(&self, name: &str, passphrase: &str) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(KMS_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                "encryptionPassphrase".to_owned(),
                ByteString(passphrase.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        let api = self.secrets();
        if let Some(old) = api.get_opt(name).await.unwrap() {
            let mut secret = secret;
            secret.metadata.resource_version = old.metadata.resource_version;
            api.replace(name, &PostParams::default(), &secret)
                .await
                .unwrap();
        } else {
            api.create(&PostParams::default(), &secret).await.unwrap();
        }
    }
}

fn encrypted_request(name: &str, kms_id: &str) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, 32 * MIB);
    for (k, v) in [
        ("encrypted", "true"),
        ("encryptionType", "block"),
        ("encryptionKMSID", kms_id),
        ("mounter", "rbd"),
        ("csi.storage.k8s.io/pvc/name", name),
        ("csi.storage.k8s.io/pvc/namespace", "apps"),
    ] {
        req.parameters.insert(k.into(), v.into());
    }
    req
}

fn stage_request(vol: &csi::Volume, staging: &std::path::Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap("ext4")),
        secrets: secrets(),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    }
}

/// The data object holding the first 4 MiB of `image`.
fn first_object(image: &str) -> String {
    let cluster = micro_ceph::cluster();
    let info = cluster
        .rbd(&[
            "info",
            "--format",
            "json",
            &format!("{}/{image}", cluster.pool),
        ])
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    format!(
        "{}.0000000000000000",
        info["block_name_prefix"].as_str().unwrap()
    )
}

/// Writes a real LUKS2 header (made by cryptsetup on a file) at the start of `image`.
fn write_luks_header(image: &str, dir: &std::path::Path) {
    let file = dir.join("luks.img");
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(20 * MIB as u64).unwrap();
    drop(f);
    let mut format = std::process::Command::new("cryptsetup")
        .args([
            "luksFormat",
            "--type",
            "luks2",
            "--batch-mode",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file=-",
        ])
        .arg(&file)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        format.stdin.take().unwrap().write_all(b"header").unwrap();
    }
    assert!(format.wait().unwrap().success());
    let head = dir.join("head.img");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&head, &bytes[..4 * MIB as usize]).unwrap();
    let cluster = micro_ceph::cluster();
    cluster
        .rados(&[
            "-p",
            &cluster.pool,
            "put",
            &first_object(image),
            &head.display().to_string(),
        ])
        .unwrap();
}

/// SHA-256 of the first MiB of `image` (read back from RADOS).
fn first_mib_digest(image: &str, dir: &std::path::Path) -> String {
    use sha2::Digest;
    let out = dir.join("read.img");
    let cluster = micro_ceph::cluster();
    cluster
        .rados(&[
            "-p",
            &cluster.pool,
            "get",
            &first_object(image),
            &out.display().to_string(),
        ])
        .unwrap();
    let bytes = std::fs::read(&out).unwrap();
    assert!(
        bytes.starts_with(b"LUKS\xba\xbe"),
        "the image starts with a LUKS header"
    );
    rbd_volume::hex(&sha2::Sha256::digest(&bytes[..MIB as usize]))
}

#[tokio::test]
async fn secrets_metadata_kms_wraps_the_key_with_the_secrets_passphrase() {
    let setup = Setup::start(
        r#"{"wrapped": {"encryptionKMSType": "metadata", "secretName": "volume-kek",
                        "secretNamespace": "kms"}}"#,
    )
    .await;
    setup.put_kek("volume-kek", "first passphrase").await;
    let mut ctl = setup.server.controller().await;
    let mut node = setup.server.node().await;
    remove_image("pvc-kek-wrapped");
    let vol = ctl
        .create_volume(encrypted_request("pvc-kek-wrapped", "wrapped"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.volume_context["encryptionKMSID"], "wrapped");
    let meta = image_meta("pvc-kek-wrapped");
    let stored = meta["rbd.csi.ceph.com/dek"].clone();
    let wrapped: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert!(
        wrapped["dek"].is_string() && wrapped["nonce"].is_string(),
        "{stored}"
    );
    // the stored value opens with the Secret's passphrase (and only with it)
    let dek = rbd_volume::encryption::wrap::unwrap(&stored, b"first passphrase", "")
        .unwrap()
        .expose()
        .to_owned();
    assert_eq!(dek.len(), 64);
    assert!(!stored.contains(&dek), "the key is not stored in clear");
    assert!(rbd_volume::encryption::wrap::unwrap(&stored, b"other", "").is_err());
    assert_eq!(meta["provisioner.ceph.com/encryption-kms-id"], "wrapped");
    // a retried create keeps the key
    ctl.create_volume(encrypted_request("pvc-kek-wrapped", "wrapped"))
        .await
        .unwrap();
    let again = image_meta("pvc-kek-wrapped")["rbd.csi.ceph.com/dek"].clone();
    assert_eq!(
        rbd_volume::encryption::wrap::unwrap(&again, b"first passphrase", "")
            .unwrap()
            .expose(),
        dek
    );

    // The right KEK: the node's key step passes (what follows, mapping with krbd and LUKS2, is
    // the VM suite's: this host has no krbd).
    let staging = setup.server.dir.path().join("staging");
    if let Err(err) = node.node_stage_volume(stage_request(&vol, &staging)).await {
        assert!(
            !err.message().contains("KMS entry"),
            "the key step passed: {}",
            err.message()
        );
    }
    let _ = node
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await;

    // Wrong KEK: the Secret's passphrase changed. The stage fails naming the KMS entry and the
    // Secret, before anything is mapped: the LUKS header on the image is as it was.
    let dir = tempfile::tempdir().unwrap();
    write_luks_header("pvc-kek-wrapped", dir.path());
    let before = first_mib_digest("pvc-kek-wrapped", dir.path());
    setup.put_kek("volume-kek", "a wrong passphrase").await;
    let err = node
        .node_stage_volume(stage_request(&vol, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    for name in ["KMS entry \"wrapped\"", "kms/volume-kek", "does not unwrap"] {
        assert!(err.message().contains(name), "{name}: {}", err.message());
    }
    assert!(!err.message().contains(&dek));
    assert_eq!(first_mib_digest("pvc-kek-wrapped", dir.path()), before);
    assert!(common::mounts_under(setup.server.dir.path()).is_empty());

    // No Secret: named.
    setup
        .secrets()
        .delete("volume-kek", &Default::default())
        .await
        .unwrap();
    let err = node
        .node_stage_volume(stage_request(&vol, &staging))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("KMS entry \"wrapped\"")
            && err
                .message()
                .contains("Secret kms/volume-kek does not exist"),
        "{}",
        err.message()
    );

    setup.put_kek("volume-kek", "first passphrase").await;
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert_eq!(image_size("pvc-kek-wrapped"), None);
    assert!(
        setup
            .secrets()
            .get_opt("volume-kek")
            .await
            .unwrap()
            .is_some(),
        "the key-encryption Secret is the user's: a delete leaves it"
    );
}

#[tokio::test]
async fn secrets_metadata_kms_defaults_to_the_claims_namespace_and_names_what_is_missing() {
    let setup = Setup::start(
        r#"{"tenant": {"encryptionKMSType": "metadata", "secretName": "volume-kek"}}"#,
    )
    .await;
    let mut ctl = setup.server.controller().await;
    remove_image("pvc-kek-tenant");
    // the claim is in "apps", which has no such Secret yet
    let err = ctl
        .create_volume(encrypted_request("pvc-kek-tenant", "tenant"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("KMS entry \"tenant\"")
            && err
                .message()
                .contains("Secret apps/volume-kek does not exist"),
        "{}",
        err.message()
    );
    // with the Secret in the claim's namespace, the retried create stores the key wrapped with it
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "apps"}})).unwrap();
    kube::Api::<Namespace>::all(setup.emulator.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "volume-kek", "namespace": "apps"},
        "stringData": {"encryptionPassphrase": "the apps passphrase"}}))
    .unwrap();
    kube::Api::<Secret>::namespaced(setup.emulator.client(), "apps")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let vol = ctl
        .create_volume(encrypted_request("pvc-kek-tenant", "tenant"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        vol.volume_context["csi.storage.k8s.io/pvc/namespace"], "apps",
        "the node learns the claim's namespace too"
    );
    let stored = image_meta("pvc-kek-tenant")["rbd.csi.ceph.com/dek"].clone();
    assert!(rbd_volume::encryption::wrap::unwrap(&stored, b"the apps passphrase", "").is_ok());
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn per_volume_secret_kms_keeps_each_key_in_a_secret_of_its_own() {
    let setup = Setup::start(
        r#"{"k8s": {"encryptionKMSType": "kubernetes-secret", "secretNamespace": "kms"}}"#,
    )
    .await;
    let mut ctl = setup.server.controller().await;
    let mut node = setup.server.node().await;
    let names = ["pvc-kms-k8s", "pvc-kms-k8s-clone", "pvc-kms-k8s-restore"];
    for name in names {
        remove_image(name);
    }
    let volume =
        |resp: tonic::Response<csi::CreateVolumeResponse>| resp.into_inner().volume.unwrap();
    let vol = volume(
        ctl.create_volume(encrypted_request("pvc-kms-k8s", "k8s"))
            .await
            .unwrap(),
    );
    let pool = micro_ceph::cluster().pool.clone();
    let fsid = micro_ceph::cluster().fsid().unwrap();
    let secret_of = |image: &str| secret_per_volume::secret_name(&fsid, &pool, image);
    let key_of = |secret: &Secret| {
        String::from_utf8(secret.data.as_ref().unwrap()["dek"].0.clone()).unwrap()
    };
    let secret = setup
        .secrets()
        .get(&secret_of("pvc-kms-k8s"))
        .await
        .unwrap();
    let dek = key_of(&secret);
    assert!(dek.len() == 64 && dek.chars().all(|c| c.is_ascii_hexdigit()));
    let annotations = secret.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations["provisioner.ceph.com/image"], "pvc-kms-k8s");
    let meta = image_meta("pvc-kms-k8s");
    assert!(
        !meta.contains_key("rbd.csi.ceph.com/dek"),
        "Ceph holds no key: {meta:?}"
    );
    assert_eq!(meta["rbd.csi.ceph.com/encrypted"], "encryptionPrepared");
    assert_eq!(meta["provisioner.ceph.com/encryption-kms-id"], "k8s");
    // a retried create keeps the key
    ctl.create_volume(encrypted_request("pvc-kms-k8s", "k8s"))
        .await
        .unwrap();
    let again = setup
        .secrets()
        .get(&secret_of("pvc-kms-k8s"))
        .await
        .unwrap();
    assert_eq!(key_of(&again), dek);

    // A snapshot, a restore and a clone get their own copies of the key.
    let snap = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-kms-k8s".into(),
            source_volume_id: vol.volume_id.clone(),
            secrets: secrets(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let mut clone = encrypted_request("pvc-kms-k8s-clone", "k8s");
    clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: vol.volume_id.clone(),
            },
        )),
    });
    let mut restore = encrypted_request("pvc-kms-k8s-restore", "k8s");
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    let clone = volume(ctl.create_volume(clone).await.unwrap());
    // the source goes before the restore is made: the snapshot's own key copy serves it
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert!(
        setup
            .secrets()
            .get_opt(&secret_of("pvc-kms-k8s"))
            .await
            .unwrap()
            .is_none(),
        "deleting the volume deleted its key Secret"
    );
    let restore = volume(ctl.create_volume(restore).await.unwrap());
    for image in ["pvc-kms-k8s-clone", "pvc-kms-k8s-restore"] {
        let copy = setup.secrets().get(&secret_of(image)).await.unwrap();
        assert_eq!(key_of(&copy), dek, "{image} has its own copy of the key");
    }

    // The node's key step reads the clone's Secret; without it, the stage names entry and image.
    setup
        .secrets()
        .delete(&secret_of("pvc-kms-k8s-clone"), &Default::default())
        .await
        .unwrap();
    let staging = setup.server.dir.path().join("staging");
    let err = node
        .node_stage_volume(stage_request(&clone, &staging))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains("KMS entry \"k8s\"") && err.message().contains("pvc-kms-k8s-clone"),
        "{}",
        err.message()
    );

    for id in [clone.volume_id, restore.volume_id] {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
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
    let left = setup
        .secrets()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect::<Vec<_>>();
    assert!(
        left.is_empty(),
        "every key Secret went with its image: {left:?}"
    );
    for name in names {
        assert_eq!(image_size(name), None);
    }
}

/// The `kubernetes-secret` key Secrets of the volume named `image`, with their DEKs.
async fn key_secrets_of(setup: &Setup, image: &str) -> Vec<(String, String)> {
    setup
        .secrets()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| {
            s.metadata.annotations.as_ref().is_some_and(|a| {
                a.get("provisioner.ceph.com/image").map(String::as_str) == Some(image)
            })
        })
        .map(|s| {
            let dek = String::from_utf8(s.data.as_ref().unwrap()["dek"].0.clone()).unwrap();
            (s.metadata.name.unwrap(), dek)
        })
        .collect()
}

#[tokio::test]
async fn per_volume_secrets_of_two_clusters_with_the_same_pool_and_image_names_do_not_collide() {
    let setup = Setup::start(
        r#"{"k8s": {"encryptionKMSType": "kubernetes-secret", "secretNamespace": "kms"}}"#,
    )
    .await;
    let mut ctl = setup.server.controller().await;
    let name = "pvc-kms-two-clusters";
    remove_image(name);
    let first = ctl
        .create_volume(encrypted_request(name, "k8s"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let before = key_secrets_of(&setup, name).await;
    assert_eq!(before.len(), 1, "{before:?}");

    // A second cluster with a pool of the same name and a volume of the same name in it.
    let other = micro_ceph::MicroCeph::start().unwrap();
    assert_eq!(other.pool, micro_ceph::cluster().pool);
    let mut req = encrypted_request(name, "k8s");
    req.parameters
        .insert("monitors".into(), other.monitors.clone());
    req.secrets = common::strings(&[("userID", "admin"), ("userKey", &other.admin_key)]);
    let second = ctl
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_ne!(first.volume_id, second.volume_id);

    let after = key_secrets_of(&setup, name).await;
    assert_eq!(after.len(), 2, "one key Secret per cluster: {after:?}");
    assert!(
        after.contains(&before[0]),
        "the first cluster's key Secret was replaced: {before:?} -> {after:?}"
    );
    assert_ne!(after[0].1, after[1].1, "two volumes, two keys");
    let fsid = micro_ceph::cluster().fsid().unwrap();
    let pool = micro_ceph::cluster().pool.clone();
    let first_secret = setup
        .secrets()
        .get(&secret_per_volume::secret_name(&fsid, &pool, name))
        .await
        .unwrap();
    assert_eq!(
        first_secret.metadata.annotations.unwrap()["provisioner.ceph.com/cluster-fsid"],
        fsid
    );

    // Deleting the second cluster's volume leaves the first one's key alone.
    let mut secrets_b = csi::DeleteVolumeRequest {
        volume_id: second.volume_id,
        secrets: common::strings(&[("userID", "admin"), ("userKey", &other.admin_key)]),
    };
    ctl.delete_volume(secrets_b.clone()).await.unwrap();
    secrets_b.volume_id = first.volume_id;
    secrets_b.secrets = secrets();
    assert_eq!(key_secrets_of(&setup, name).await, before);
    ctl.delete_volume(secrets_b).await.unwrap();
    assert!(key_secrets_of(&setup, name).await.is_empty());
}

#[tokio::test]
async fn a_key_secret_of_another_volume_is_not_overwritten() {
    let setup = Setup::start(
        r#"{"k8s": {"encryptionKMSType": "kubernetes-secret", "secretNamespace": "kms"}}"#,
    )
    .await;
    let mut ctl = setup.server.controller().await;
    let name = "pvc-kms-owned";
    remove_image(name);
    let fsid = micro_ceph::cluster().fsid().unwrap();
    let pool = micro_ceph::cluster().pool.clone();
    let secret_name = secret_per_volume::secret_name(&fsid, &pool, name);
    // A Secret of that name that names another image as its owner.
    let foreign = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name.clone()),
            namespace: Some(KMS_NAMESPACE.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "rbd-provisioner".to_owned(),
            )])),
            annotations: Some(BTreeMap::from([
                ("provisioner.ceph.com/pool".to_owned(), pool.clone()),
                (
                    "provisioner.ceph.com/image".to_owned(),
                    "someone-else".to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "dek".to_owned(),
            ByteString(b"their-key".to_vec()),
        )])),
        ..Secret::default()
    };
    setup
        .secrets()
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    // An image with no key stored yet: the create stores one, and must not take that Secret.
    let err = ctl
        .create_volume(encrypted_request(name, "k8s"))
        .await
        .unwrap_err();
    assert!(
        err.message().contains(&secret_name) && err.message().contains("someone-else"),
        "{}",
        err.message()
    );
    let kept = setup.secrets().get(&secret_name).await.unwrap();
    assert_eq!(kept.data.unwrap()["dek"].0, b"their-key");
    assert_eq!(
        kept.metadata.annotations.unwrap()["provisioner.ceph.com/image"],
        "someone-else"
    );
    remove_image(name);
}

#[tokio::test]
async fn a_volume_whose_key_secret_has_the_name_of_an_older_version_still_opens_and_takes_it_along()
{
    let setup = Setup::start(
        r#"{"k8s": {"encryptionKMSType": "kubernetes-secret", "secretNamespace": "kms"}}"#,
    )
    .await;
    let mut ctl = setup.server.controller().await;
    let mut node = setup.server.node().await;
    let name = "pvc-kms-legacy";
    remove_image(name);
    let vol = ctl
        .create_volume(encrypted_request(name, "k8s"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let fsid = micro_ceph::cluster().fsid().unwrap();
    let pool = micro_ceph::cluster().pool.clone();
    // As an older version left it: the old name, annotations without the cluster.
    let current = secret_per_volume::secret_name(&fsid, &pool, name);
    let legacy = secret_per_volume::legacy_secret_name(&pool, name);
    let mut secret = setup.secrets().get(&current).await.unwrap();
    setup
        .secrets()
        .delete(&current, &Default::default())
        .await
        .unwrap();
    secret.metadata = ObjectMeta {
        name: Some(legacy.clone()),
        namespace: Some(KMS_NAMESPACE.to_owned()),
        labels: secret.metadata.labels.take(),
        annotations: Some(BTreeMap::from([
            ("provisioner.ceph.com/pool".to_owned(), pool.clone()),
            ("provisioner.ceph.com/image".to_owned(), name.to_owned()),
        ])),
        ..ObjectMeta::default()
    };
    setup
        .secrets()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // The node's key step finds the key (the stage then fails mapping: no krbd on this host).
    let staging = setup.server.dir.path().join("staging-legacy");
    let err = node
        .node_stage_volume(stage_request(&vol, &staging))
        .await
        .unwrap_err();
    assert!(
        !err.message().contains("KMS entry"),
        "the key was not found: {}",
        err.message()
    );
    // A retried create keeps that key rather than storing a new one.
    ctl.create_volume(encrypted_request(name, "k8s"))
        .await
        .unwrap();
    assert!(setup.secrets().get_opt(&current).await.unwrap().is_none());
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: secrets(),
    })
    .await
    .unwrap();
    assert!(
        setup.secrets().get_opt(&legacy).await.unwrap().is_none(),
        "the volume's old-named key Secret went with it"
    );
}
