//! ceph-csi's `metadata` KMS with a `secretName`: the DEK in the image's metadata
//! ([`super::kms::META_DEK`]), wrapped ([`super::wrap`]) with a key-encryption key, the
//! `encryptionPassphrase` of the Kubernetes Secret `secretNamespace/secretName`
//! (`secretNamespace` defaults to the namespace of the volume's claim, as in ceph-csi).
//!
//! Reading the pool is no longer enough to read the data: the Secret is needed too.

use std::sync::Arc;

use super::EncryptionError;
use super::kms::{Dek, Kms, META_DEK, Target};
use super::secrets::SecretStore;
use super::wrap::{self, WrapError};

/// The Secret key holding the passphrase (ceph-csi's).
pub const PASSPHRASE_KEY: &str = "encryptionPassphrase";

#[derive(Debug)]
pub struct SecretsMetadataKms {
    id: String,
    secret_name: String,
    secret_namespace: Option<String>,
    secrets: Arc<dyn SecretStore>,
}

/// A passphrase read from a Secret. Never printed.
struct Passphrase(Vec<u8>);

impl SecretsMetadataKms {
    #[must_use]
    pub fn new(
        id: &str,
        secret_name: String,
        secret_namespace: Option<String>,
        secrets: Arc<dyn SecretStore>,
    ) -> SecretsMetadataKms {
        SecretsMetadataKms {
            id: id.to_owned(),
            secret_name,
            secret_namespace,
            secrets,
        }
    }

    fn problem(&self, problem: String) -> EncryptionError {
        EncryptionError::Kms {
            id: self.id.clone(),
            problem,
        }
    }

    /// The key-encryption passphrase from the entry's Secret.
    async fn passphrase(
        &self,
        target: &Target<'_>,
    ) -> Result<(Passphrase, String), EncryptionError> {
        let namespace = self
            .secret_namespace
            .as_deref()
            .or(target.tenant)
            .ok_or_else(|| {
                self.problem(format!(
                    "no secretNamespace, and the namespace of the claim of image {} is not known \
                     (the external-provisioner's --extra-create-metadata passes it)",
                    target.spec()
                ))
            })?;
        let shown = format!("{namespace}/{}", self.secret_name);
        let data = self
            .secrets
            .get(namespace, &self.secret_name)
            .await
            .map_err(|e| self.problem(e))?
            .ok_or_else(|| self.problem(format!("Secret {shown} does not exist")))?;
        let passphrase = data
            .0
            .get(PASSPHRASE_KEY)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                self.problem(format!(
                    "Secret {shown} has no {PASSPHRASE_KEY:?} (or it is empty)"
                ))
            })?;
        Ok((Passphrase(passphrase.clone()), shown))
    }

    fn ceph(&self, source: ceph_rbd::Error) -> EncryptionError {
        EncryptionError::Ceph {
            id: self.id.clone(),
            source,
        }
    }
}

/// Runs the (deliberately slow) key derivation off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WrapError> + Send + 'static,
) -> Result<T, WrapError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WrapError::Kdf(e.to_string()))?
}

#[async_trait::async_trait]
impl Kms for SecretsMetadataKms {
    fn id(&self) -> &str {
        &self.id
    }

    async fn fetch_dek(&self, target: &Target<'_>) -> Result<Option<Dek>, EncryptionError> {
        let stored = super::kms::stored_dek(target)
            .await
            .map_err(|e| self.ceph(e))?;
        let Some(stored) = stored else {
            return Ok(None);
        };
        if !wrap::is_wrapped(&stored) {
            return Err(self.problem(format!(
                "image {} holds an unwrapped key (the metadata KMS without secretName), not one \
                 wrapped with this entry's Secret",
                target.spec()
            )));
        }
        let (passphrase, shown) = self.passphrase(target).await?;
        let salt = target.volume_id.to_owned();
        match blocking(move || wrap::unwrap(&stored, &passphrase.0, &salt)).await {
            Ok(dek) => Ok(Some(dek)),
            Err(WrapError::WrongKek) => Err(self.problem(format!(
                "the encryptionPassphrase of Secret {shown} does not unwrap the key of image {} \
                 (a wrong key-encryption key); the volume is left as it is",
                target.spec()
            ))),
            Err(e) => Err(self.problem(format!("the key of image {}: {e}", target.spec()))),
        }
    }

    async fn store_dek(&self, target: &Target<'_>, dek: &Dek) -> Result<(), EncryptionError> {
        let (passphrase, _) = self.passphrase(target).await?;
        let (dek, salt) = (dek.clone(), target.volume_id.to_owned());
        let wrapped = blocking(move || wrap::wrap(&dek, &passphrase.0, &salt))
            .await
            .map_err(|e| {
                self.problem(format!("wrapping the key of image {}: {e}", target.spec()))
            })?;
        target
            .cluster
            .metadata_set(target.pool, target.image, META_DEK, &wrapped)
            .await
            .map_err(|e| self.ceph(e))
    }

    async fn remove_dek(&self, _target: &Target<'_>) -> Result<(), EncryptionError> {
        // Removed with the image; the Secret is the user's, shared by the entry's volumes.
        Ok(())
    }
}
