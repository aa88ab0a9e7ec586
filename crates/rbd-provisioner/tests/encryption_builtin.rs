//! The built-in provisioner and encrypted classes, end to end against micro-ceph and the
//! emulator: it makes encrypted CSI PVs through the volume core's encryption steps (the same
//! the CSI controller calls), with each of the three KMS types; a clone, a snapshot and a restore
//! carry the key; the key goes with the volume; and what cannot work is refused naming the
//! parameter: an in-tree PV, an unknown KMS entry, a clone whose encryption differs from its
//! source's. The node's LUKS2 data path is tested in the VM (`vm_kernel`); here the node's key
//! step (the KMS read with the PV's volume handle and attributes) shows the key a node would
//! unlock with.
//!
//! `cargo test -p rbd-provisioner --test encryption_builtin`

#[path = "support/snapshots.rs"]
mod snapshots;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use rbd_volume::encryption::{self, Dek, secret_per_volume};
use serde_json::json;
use support::Harness;

const KMS_NAMESPACE: &str = "kms";
const KEK_SECRET: &str = "volume-kek";

/// The KMS configuration (ceph-csi's format) with one entry of each type, in the harness's dir.
async fn kms_setup(h: &Harness) -> String {
    let namespaces: Api<Namespace> = Api::all(h.client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": KMS_NAMESPACE}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    h.create_secret(
        KMS_NAMESPACE,
        KEK_SECRET,
        &[("encryptionPassphrase", "a-kek-for-the-tests")],
    )
    .await;
    let config = json!({
        "plain": {"encryptionKMSType": "metadata"},
        "wrapped": {
            "encryptionKMSType": "metadata",
            "secretName": KEK_SECRET,
            "secretNamespace": KMS_NAMESPACE,
        },
        "per-volume": {"encryptionKMSType": "kubernetes-secret", "secretNamespace": KMS_NAMESPACE},
    });
    let path = h.dir.path().join("kms-config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    format!("--kms-config={}", path.display())
}

fn spawn(h: &Harness, kms: &str) -> support::Process {
    h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
            kms,
        ],
        &[],
    )
}

/// An encrypted class with KMS entry `kms_id` (`None`: unencrypted), PV source `source`.
async fn class(h: &Harness, name: &str, kms_id: Option<&str>, source: &str) {
    let mut params = h.params();
    params.push(("pvSource".into(), source.into()));
    if let Some(id) = kms_id {
        params.push(("encrypted".into(), "true".into()));
        params.push(("encryptionKMSID".into(), id.into()));
    }
    h.create_class(name, &params, "Delete").await;
}

fn csi(pv: &PersistentVolume) -> &k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .expect("a CSI PV")
}

fn attributes(pv: &PersistentVolume) -> BTreeMap<String, String> {
    csi(pv).volume_attributes.clone().unwrap_or_default()
}

/// The key a node staging `pv` would unlock with: the node's step, the KMS of the PV's
/// `encryptionKMSID` read with its volume handle and tenant.
async fn node_key(h: &Harness, kms_config: &str, pv: &PersistentVolume) -> Option<Dek> {
    let attributes: HashMap<String, String> = attributes(pv).into_iter().collect();
    let settings = encryption::parameters(&attributes)
        .unwrap()
        .expect("encryption attributes");
    let path = kms_config.trim_start_matches("--kms-config=");
    let store: Arc<dyn encryption::secrets::SecretStore> =
        Arc::new(rbd_csi::kube_secrets::KubeSecrets::new(h.client.clone()));
    let kms = encryption::load_kms(std::path::Path::new(path), Some(store), &settings.kms_id)
        .await
        .unwrap();
    let cluster = h.ceph_cluster().await;
    let handle = &csi(pv).volume_handle;
    let image = Harness::image_name(pv);
    let target = encryption::Target {
        cluster: &cluster,
        pool: &h.ceph.pool,
        image: &image,
        volume_id: handle,
        tenant: settings.tenant.as_deref(),
    };
    kms.fetch_dek(&target).await.unwrap()
}

fn secrets(h: &Harness) -> Api<Secret> {
    Api::namespaced(h.client.clone(), KMS_NAMESPACE)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kms_type_keeps_the_key_of_an_encrypted_csi_pv_until_it_is_deleted() {
    let h = Harness::start().await;
    let kms = kms_setup(&h).await;
    let _p = spawn(&h, &kms);
    let ids = ["plain", "wrapped", "per-volume"];
    for id in ids {
        class(&h, id, Some(id), "csi").await;
        h.create_claim(id, id, "16Mi", false).await;
    }
    let mut made = Vec::new();
    for id in ids {
        let (_, pv) = h.wait_bound(id).await;
        let image = Harness::image_name(&pv);
        let attributes = attributes(&pv);
        for (key, value) in [
            ("encrypted", "true"),
            ("encryptionType", "block"),
            ("encryptionKMSID", id),
            ("csi.storage.k8s.io/pvc/namespace", "default"),
        ] {
            assert_eq!(
                attributes.get(key).map(String::as_str),
                Some(value),
                "PV of {id}: {key}"
            );
        }
        assert_eq!(
            h.image_meta(&image, encryption::META_ENCRYPTED).as_deref(),
            Some(encryption::ENCRYPTION_PREPARED),
            "{id}"
        );
        assert_eq!(
            h.image_meta(&image, encryption::META_KMS_ID).as_deref(),
            Some(id)
        );
        let key = node_key(&h, &kms, &pv).await.expect("a key the node finds");
        assert_eq!(key.expose().len(), 64, "{id}: 32 random bytes, hex");
        let stored = h.image_meta(&image, encryption::kms::META_DEK);
        let secret_name =
            secret_per_volume::secret_name(&h.ceph.fsid().unwrap(), &h.ceph.pool, &image);
        let secret = secrets(&h).get_opt(&secret_name).await.unwrap();
        match id {
            "plain" => assert_eq!(stored.as_deref(), Some(key.expose())),
            "wrapped" => {
                let stored = stored.expect("the wrapped key in the image's metadata");
                assert!(encryption::wrap::is_wrapped(&stored), "{stored}");
                assert!(
                    !stored.contains(key.expose()),
                    "stored wrapped, not as it is"
                );
            }
            _ => {
                assert_eq!(stored, None, "per-volume: not in the image");
                assert!(secret.is_some(), "the volume's Secret {secret_name}");
            }
        }
        made.push((id, pv, image, secret_name));
    }
    for (id, pv, image, secret_name) in made {
        h.claims()
            .delete(id, &DeleteParams::default())
            .await
            .unwrap();
        h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
        assert!(!h.images().contains(&image), "{id}: image deleted");
        assert!(
            secrets(&h).get_opt(&secret_name).await.unwrap().is_none(),
            "{id}: no key Secret left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_snapshots_and_restores_carry_the_key_and_mismatches_are_refused() {
    let h = snapshots::harness().await;
    let kms = kms_setup(&h).await;
    let _p = spawn(&h, &kms);
    class(&h, "per-volume", Some("per-volume"), "csi").await;
    class(&h, "plain-csi", None, "csi").await;
    class(&h, "unknown-kms", Some("nowhere"), "csi").await;
    class(&h, "in-tree", Some("plain"), "rbd").await;
    h.create_claim("src", "per-volume", "16Mi", false).await;
    h.create_claim("clear", "plain-csi", "16Mi", false).await;
    h.create_claim("lost", "unknown-kms", "16Mi", false).await;
    h.create_claim("old", "in-tree", "16Mi", false).await;
    let (_, src) = h.wait_bound("src").await;
    h.wait_bound("clear").await;
    let key = node_key(&h, &kms, &src).await.expect("the source's key");

    let claim_from = |name, class, kind, source| {
        snapshots::create_claim_of_class_from(&h, name, class, "16Mi", kind, source)
    };
    claim_from("clone", "per-volume", "PersistentVolumeClaim", "src").await;
    snapshots::create_snapshot(&h, "snap", "src").await;
    snapshots::wait_ready(&h, "snap").await;
    claim_from("restore", "per-volume", "VolumeSnapshot", "snap").await;
    claim_from("clear-clone", "plain-csi", "PersistentVolumeClaim", "src").await;
    claim_from(
        "crypt-clone",
        "per-volume",
        "PersistentVolumeClaim",
        "clear",
    )
    .await;
    for made in ["clone", "restore"] {
        let (_, pv) = h.wait_bound(made).await;
        let own = node_key(&h, &kms, &pv).await.expect("its own stored key");
        assert!(own == key, "{made} opens with its source's key");
        let image = Harness::image_name(&pv);
        let secret_name =
            secret_per_volume::secret_name(&h.ceph.fsid().unwrap(), &h.ceph.pool, &image);
        assert!(
            secrets(&h).get_opt(&secret_name).await.unwrap().is_some(),
            "{made} has a key Secret of its own"
        );
    }

    for (claim, parts) in [
        ("lost", vec!["encryptionKMSID", "\"nowhere\""]),
        (
            "old",
            vec!["StorageClass parameter \"encrypted\"", "CSI PVs"],
        ),
        (
            "clear-clone",
            vec![
                "StorageClass parameter \"encrypted\"",
                "is encrypted and the class is not",
            ],
        ),
        (
            "crypt-clone",
            vec![
                "StorageClass parameter \"encrypted\"",
                "the class is encrypted and the source",
            ],
        ),
    ] {
        let message = h.wait_event(claim, "ProvisioningFailed").await;
        for part in parts {
            assert!(message.contains(part), "claim {claim}: {message:?}");
        }
    }
    let volumes = h.volumes().list(&Default::default()).await.unwrap().items;
    assert_eq!(volumes.len(), 4, "src, clear, clone and restore only");
}
