//! The `kubernetes-secret` KMS: each volume's DEK in a Kubernetes Secret of its own, in the
//! entry's `secretNamespace`, named after the image ([`secret_name`]) and labelled
//! [`LABEL_MANAGED_BY`] with the pool and image in its annotations. Deleting the volume deletes
//! the Secret. Ceph alone holds no key: reading the data takes the pool and the Secret.

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

/// The name of the Secret keeping the DEK of `pool/image`: `rbd-volume-key-` and a hash of the
/// pool spec and image (any image name, any length, gives a valid Secret name).
#[must_use]
pub fn secret_name(pool: &str, image: &str) -> String {
    let digest = sha2::Sha256::digest(format!("{pool}/{image}").as_bytes());
    format!("rbd-volume-key-{}", crate::hex(&digest[..16]))
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

#[async_trait::async_trait]
impl Kms for SecretPerVolumeKms {
    fn id(&self) -> &str {
        &self.id
    }

    async fn fetch_dek(&self, target: &Target<'_>) -> Result<Option<Dek>, EncryptionError> {
        let name = secret_name(target.pool, target.image);
        let Some(data) = self
            .secrets
            .get(&self.namespace, &name)
            .await
            .map_err(|e| self.problem(e))?
        else {
            return Ok(None);
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
        let name = secret_name(target.pool, target.image);
        let secret = NewSecret {
            namespace: &self.namespace,
            name: &name,
            labels: BTreeMap::from([(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned())]),
            annotations: BTreeMap::from([
                (ANNOTATION_POOL.to_owned(), target.pool.to_owned()),
                (ANNOTATION_IMAGE.to_owned(), target.image.to_owned()),
            ]),
            data: SecretData(BTreeMap::from([(
                DEK_KEY.to_owned(),
                dek.expose().as_bytes().to_vec(),
            )])),
        };
        self.secrets.put(secret).await.map_err(|e| self.problem(e))
    }

    async fn remove_dek(&self, target: &Target<'_>) -> Result<(), EncryptionError> {
        let name = secret_name(target.pool, target.image);
        self.secrets
            .delete(&self.namespace, &name)
            .await
            .map_err(|e| self.problem(e))
    }

    fn keeps_key_apart(&self) -> bool {
        true
    }
}
