//! The `kubernetes-secret` KMS: each volume's DEK in a Kubernetes Secret of its own, in the
//! entry's `secretNamespace`, named after the cluster and the image ([`secret_name`]: several
//! Ceph clusters may have the same pool and image names) and labelled [`LABEL_MANAGED_BY`] with
//! the cluster's fsid, the pool and the image in its annotations. Deleting the volume deletes
//! the Secret. Ceph alone holds no key: reading the data takes the pool and the Secret.
//!
//! **Owners.** A Secret is never overwritten when its annotations name another volume (another
//! cluster, pool or image), or when it is not labelled as made by this driver: the store
//! refuses (`rbd_csi::kube_secrets`), and the KMS names the Secret.
//!
//! **Secrets of older versions** were named after the pool and image alone
//! ([`legacy_secret_name`]). A volume that has no Secret under the new name and is prepared
//! already (an older version stored its key) reads its key from the old name, when that
//! Secret's annotations name the same pool and image and no other cluster; deleting such a
//! volume deletes that Secret. New keys are only ever stored under the new name.

use std::collections::BTreeMap;
use std::sync::Arc;

use sha2::Digest;

use super::EncryptionError;
use super::kms::{Dek, Kms, Target};
use super::secrets::{NewSecret, SecretData, SecretStore};

/// The `encryptionKMSType` of this KMS.
pub const KMS_TYPE: &str = "kubernetes-secret";
/// The Secret key holding the DEK.
pub const DEK_KEY: &str = "dek";
/// Label on every key Secret.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "rbd-provisioner";
/// Annotations naming the volume's image.
pub const ANNOTATION_POOL: &str = "provisioner.ceph.com/pool";
pub const ANNOTATION_IMAGE: &str = "provisioner.ceph.com/image";
/// Annotation naming the volume's cluster (its fsid); Secrets of older versions have none.
pub const ANNOTATION_CLUSTER: &str = "provisioner.ceph.com/cluster-fsid";

/// The name of the Secret keeping the DEK of `pool/image` in the cluster with `fsid`:
/// `rbd-volume-key-` and a hash of the fsid, the pool spec and the image (any image name, any
/// length, gives a valid Secret name).
#[must_use]
pub fn secret_name(fsid: &str, pool: &str, image: &str) -> String {
    let digest = sha2::Sha256::digest(format!("{fsid}\0{pool}/{image}").as_bytes());
    format!("rbd-volume-key-{}", crate::hex(&digest[..16]))
}

/// The name older versions gave that Secret: a hash of the pool spec and image only, the same
/// for the same names in two clusters. Read (and deleted) for volumes made by them.
#[must_use]
pub fn legacy_secret_name(pool: &str, image: &str) -> String {
    let digest = sha2::Sha256::digest(format!("{pool}/{image}").as_bytes());
    format!("rbd-volume-key-{}", crate::hex(&digest[..16]))
}

/// Why a key Secret annotated `annotations` is not the one of the volume `ours`
/// ([`owner_annotations`]) names: an owner annotation with another value (one it lacks, as in
/// Secrets of older versions, does not count). `None`: it is.
#[must_use]
pub fn other_owner(
    annotations: &BTreeMap<String, String>,
    ours: &BTreeMap<String, String>,
) -> Option<String> {
    let differing: Vec<String> = ours
        .iter()
        .filter_map(|(key, value)| {
            annotations
                .get(key)
                .filter(|v| *v != value)
                .map(|v| format!("{key}={v}"))
        })
        .collect();
    (!differing.is_empty()).then(|| format!("it belongs to {}", differing.join(", ")))
}

/// The annotations that say which volume a key Secret belongs to.
#[must_use]
pub fn owner_annotations(fsid: &str, pool: &str, image: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (ANNOTATION_CLUSTER.to_owned(), fsid.to_owned()),
        (ANNOTATION_POOL.to_owned(), pool.to_owned()),
        (ANNOTATION_IMAGE.to_owned(), image.to_owned()),
    ])
}

#[derive(Debug)]
pub struct SecretPerVolumeKms {
    id: String,
    namespace: String,
    secrets: Arc<dyn SecretStore>,
}

impl SecretPerVolumeKms {
    #[must_use]
    pub fn new(id: &str, namespace: String, secrets: Arc<dyn SecretStore>) -> SecretPerVolumeKms {
        SecretPerVolumeKms {
            id: id.to_owned(),
            namespace,
            secrets,
        }
    }

    fn problem(&self, problem: String) -> EncryptionError {
        EncryptionError::Kms {
            id: self.id.clone(),
            problem,
        }
    }
}

impl SecretPerVolumeKms {
    /// The fsid of the target's cluster, which the Secret's name includes.
    async fn fsid(&self, target: &Target<'_>) -> Result<String, EncryptionError> {
        target
            .cluster
            .fsid()
            .await
            .map_err(|source| EncryptionError::Ceph {
                id: self.id.clone(),
                source,
            })
    }

    /// The Secret of the old name and its data, when it is this volume's: its annotations name
    /// the target's pool and image, and this cluster or none.
    async fn legacy_owned(
        &self,
        target: &Target<'_>,
        fsid: &str,
    ) -> Result<Option<(String, SecretData)>, EncryptionError> {
        let name = legacy_secret_name(target.pool, target.image);
        let Some((data, annotations)) = self
            .secrets
            .get_annotated(&self.namespace, &name)
            .await
            .map_err(|e| self.problem(e))?
        else {
            return Ok(None);
        };
        let names =
            |key: &str, value: &str| annotations.get(key).map(String::as_str) == Some(value);
        let cluster_ok = annotations
            .get(ANNOTATION_CLUSTER)
            .is_none_or(|f| f == fsid);
        if names(ANNOTATION_POOL, target.pool)
            && names(ANNOTATION_IMAGE, target.image)
            && cluster_ok
        {
            Ok(Some((name, data)))
        } else {
            Ok(None)
        }
    }

    /// [`Self::legacy_owned`] for a key read: only for a volume prepared already (its key was
    /// stored by an older version). A volume being created never takes an old-named Secret,
    /// which may be another cluster's volume of the same names.
    async fn legacy(
        &self,
        target: &Target<'_>,
        fsid: &str,
    ) -> Result<Option<(String, SecretData)>, EncryptionError> {
        let prepared = super::is_encrypted(target.cluster, target.pool, target.image)
            .await
            .map_err(|source| EncryptionError::Ceph {
                id: self.id.clone(),
                source,
            })?;
        if !prepared {
            return Ok(None);
        }
        self.legacy_owned(target, fsid).await
    }
}

#[async_trait::async_trait]
impl Kms for SecretPerVolumeKms {
    fn id(&self) -> &str {
        &self.id
    }

    async fn fetch_dek(&self, target: &Target<'_>) -> Result<Option<Dek>, EncryptionError> {
        let fsid = self.fsid(target).await?;
        let name = secret_name(&fsid, target.pool, target.image);
        let data = match self
            .secrets
            .get_annotated(&self.namespace, &name)
            .await
            .map_err(|e| self.problem(e))?
        {
            Some((data, annotations)) => {
                let ours = owner_annotations(&fsid, target.pool, target.image);
                if let Some(why) = other_owner(&annotations, &ours) {
                    return Err(self.problem(format!(
                        "Secret {}/{name} is not the key of image {}: {why}",
                        self.namespace,
                        target.spec()
                    )));
                }
                data
            }
            None => match self.legacy(target, &fsid).await? {
                Some((legacy, data)) => {
                    tracing::info!(pool = target.pool, image = target.image, secret = %legacy,
                        "volume key read from the Secret name of an older version");
                    data
                }
                None => return Ok(None),
            },
        };
        let dek = data
            .0
            .get(DEK_KEY)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                self.problem(format!(
                    "Secret {}/{name} (the key of image {}) has no {DEK_KEY:?}",
                    self.namespace,
                    target.spec()
                ))
            })?;
        let dek = String::from_utf8(dek.clone()).map_err(|_| {
            self.problem(format!(
                "Secret {}/{name}: {DEK_KEY:?} is not text",
                self.namespace
            ))
        })?;
        Ok(Some(Dek::new(dek)))
    }

    async fn store_dek(&self, target: &Target<'_>, dek: &Dek) -> Result<(), EncryptionError> {
        let fsid = self.fsid(target).await?;
        let name = secret_name(&fsid, target.pool, target.image);
        let secret = NewSecret {
            namespace: &self.namespace,
            name: &name,
            labels: BTreeMap::from([(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned())]),
            annotations: owner_annotations(&fsid, target.pool, target.image),
            data: SecretData(BTreeMap::from([(
                DEK_KEY.to_owned(),
                dek.expose().as_bytes().to_vec(),
            )])),
        };
        self.secrets.put(secret).await.map_err(|e| self.problem(e))
    }

    /// Deletes the volume's Secret; a volume of an older version (none under the new name)
    /// loses the one of the old name, when that one is its own.
    async fn remove_dek(&self, target: &Target<'_>) -> Result<(), EncryptionError> {
        let fsid = self.fsid(target).await?;
        let name = secret_name(&fsid, target.pool, target.image);
        let exists = self
            .secrets
            .get(&self.namespace, &name)
            .await
            .map_err(|e| self.problem(e))?
            .is_some();
        let name = if exists {
            name
        } else {
            match self.legacy_owned(target, &fsid).await? {
                Some((legacy, _)) => legacy,
                None => return Ok(()),
            }
        };
        self.secrets
            .delete(&self.namespace, &name)
            .await
            .map_err(|e| self.problem(e))
    }

    fn keeps_key_apart(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_differ_per_cluster_and_the_old_name_is_kept_as_it_was() {
        let a = secret_name("f-a", "rbd", "pvc-1");
        let b = secret_name("f-b", "rbd", "pvc-1");
        assert_ne!(a, b);
        assert!(a.starts_with("rbd-volume-key-") && a.len() == "rbd-volume-key-".len() + 32);
        // the name older versions gave: the hash of "pool/image" alone
        let digest = sha2::Sha256::digest(b"rbd/pvc-1");
        assert_eq!(
            legacy_secret_name("rbd", "pvc-1"),
            format!("rbd-volume-key-{}", crate::hex(&digest[..16]))
        );
        assert_ne!(legacy_secret_name("rbd", "pvc-1"), a);
    }

    #[test]
    fn a_secret_annotated_for_another_volume_is_not_this_ones() {
        let ours = owner_annotations("f-a", "rbd", "pvc-1");
        assert_eq!(other_owner(&ours, &ours), None);
        let legacy = BTreeMap::from([(ANNOTATION_IMAGE.to_owned(), "pvc-1".to_owned())]);
        assert_eq!(other_owner(&legacy, &ours), None);
        let other = owner_annotations("f-b", "rbd", "pvc-1");
        let why = other_owner(&other, &ours).unwrap();
        assert!(why.contains("cluster-fsid=f-b"), "{why}");
    }
}
