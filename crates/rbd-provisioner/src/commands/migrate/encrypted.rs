//! Encrypted volumes and snapshots of ceph-csi, taken over.
//!
//! ceph-csi's `metadata` KMS with a `secretName` keeps a volume's LUKS passphrase in the image's
//! metadata (`rbd.csi.ceph.com/dek`), wrapped with a key derived from the Secret's
//! `encryptionPassphrase` and, as the salt, ceph-csi's ID of the volume (or of the snapshot).
//! This driver's entry of the same type reads the same value; only the salt differs, as our
//! handle is not ceph-csi's. So the takeover records ceph-csi's ID in the value as its salt (a
//! field ceph-csi ignores: its reads are unchanged, the way back stays open) and the KMS entry
//! on the image, after checking that the entry opens the key.
//!
//! Refused, with the reason: ceph-csi's `default` KMS (the StorageClass secret's passphrase
//! opens every volume), its `metadata` KMS without `secretName` (the key is wrapped with the
//! StorageClass secret's passphrase, which this driver's entry of that type does not read),
//! Vault and the cloud KMSs, and `file` (fscrypt) encryption.

use rbd_volume::encryption::{self, META_KMS_ID, Target};

use super::apply::Context;

/// ceph-csi's KMS ID of a volume encrypted without `encryptionKMSID`.
const CEPH_CSI_DEFAULT_KMS: &str = "default";

/// The KMS of an encrypted image of ceph-csi, checked.
pub struct Encrypted {
    /// The KMS entry (`encryptionKMSID`, ceph-csi's `csi.volume.encryptKMS`), as loaded from
    /// `--kms-config` by the check.
    kms: Box<dyn encryption::Kms>,
    /// The namespace the entry's Secret defaults to (ceph-csi's tenant: the claim's namespace).
    pub tenant: Option<String>,
}

impl Encrypted {
    /// The image metadata this driver keeps for the key (added beside ceph-csi's).
    #[must_use]
    pub fn entries(&self) -> Vec<(&str, &str)> {
        vec![(META_KMS_ID, self.kms.id())]
    }
}

/// The checks of image `pool/image` of ceph-csi, encrypted with KMS entry `kms_id` and of
/// `encryption_type` (ceph-csi's journal): the type is `block`, the entry is one this driver
/// reads (in `--kms-config`), and it opens the image's key by ceph-csi's ID `old_id`.
/// `Ok(Err(why))`: refused, nothing changed.
///
/// # Errors
/// None of its own; the `Result` is the caller's shape.
pub async fn check(
    ctx: &Context,
    cluster: &ceph_rbd::Cluster,
    (pool, image): (&str, &str),
    (kms_id, encryption_type): (&str, Option<&str>),
    old_id: &str,
    tenant: Option<&str>,
) -> Result<Result<Encrypted, String>, String> {
    match encryption_type.map(str::trim) {
        None | Some("" | "block") => {}
        Some("file") => {
            return Ok(Err(
                "encrypted with ceph-csi's file encryption (fscrypt), which this driver does not \
                 provide"
                    .into(),
            ));
        }
        Some(other) => {
            return Ok(Err(format!(
                "ceph-csi's journal gives the encryption type {other:?} (only block is taken \
                 over)"
            )));
        }
    }
    if kms_id == CEPH_CSI_DEFAULT_KMS {
        return Ok(Err(
            "encrypted with ceph-csi's default KMS (no encryptionKMSID: the StorageClass \
             secret's encryptionPassphrase is every volume's LUKS passphrase), which this \
             driver does not provide"
                .into(),
        ));
    }
    let kms = match load(ctx, kms_id).await {
        Ok(kms) => kms,
        Err(e) => return Ok(Err(e)),
    };
    let target = Target {
        cluster,
        pool,
        image,
        volume_id: old_id,
        tenant,
    };
    match kms.fetch_dek(&target).await {
        Ok(Some(_)) => Ok(Ok(Encrypted {
            kms,
            tenant: tenant.map(str::to_owned),
        })),
        Ok(None) => Ok(Err(format!(
            "KMS entry {kms_id:?} holds no key for image {pool}/{image} (ceph-csi's metadata KMS \
             with a secretName keeps it in the image's metadata; Vault and the cloud KMSs are \
             not taken over)"
        ))),
        Err(e) => Ok(Err(format!(
            "{e} (ceph-csi's metadata KMS is read by an entry of type metadata with the \
             secretName and secretNamespace of a Secret holding its encryptionPassphrase; \
             without a secretName, ceph-csi wraps with the StorageClass secret's \
             encryptionPassphrase: put it in a Secret and name it in the entry)"
        ))),
    }
}

/// The takeover of a checked image's key: ceph-csi's ID `old_id` recorded as the salt of the
/// wrapped key, then the key opened by our ID `new_id`, as our node will open it. Idempotent.
///
/// # Errors
/// Writing the metadata; the key not opening by `new_id` (nothing in Kubernetes is changed
/// then).
pub async fn take_over_key(
    cluster: &ceph_rbd::Cluster,
    (pool, image): (&str, &str),
    encrypted: &Encrypted,
    old_id: &str,
    new_id: &str,
) -> Result<(), String> {
    encryption::record_salt(cluster, pool, image, old_id)
        .await
        .map_err(|e| format!("recording the salt of the key of {pool}/{image}: {e}"))?;
    let target = Target {
        cluster,
        pool,
        image,
        volume_id: new_id,
        tenant: encrypted.tenant.as_deref(),
    };
    match encrypted.kms.fetch_dek(&target).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!("the key of {pool}/{image} is gone")),
        Err(e) => Err(format!("the key of {pool}/{image} by our volume ID: {e}")),
    }
}

/// KMS entry `kms_id` of `--kms-config`, reading Secrets through the API as the node plugin does.
async fn load(ctx: &Context, kms_id: &str) -> Result<Box<dyn encryption::Kms>, String> {
    let secrets: std::sync::Arc<dyn encryption::secrets::SecretStore> =
        std::sync::Arc::new(rbd_csi::kube_secrets::KubeSecrets::new(ctx.client.clone()));
    encryption::load_kms(&ctx.kms_config, Some(secrets), kms_id)
        .await
        .map_err(|e| format!("--kms-config: {e}"))
}
