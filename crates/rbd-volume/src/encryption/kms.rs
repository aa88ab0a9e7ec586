//! Key management: where a volume's DEK is kept.
//!
//! The configuration is ceph-csi's `config.json`: a JSON object of entries, each an object with
//! `encryptionKMSType`. Provided here:
//!
//! | `encryptionKMSType` | the DEK is kept |
//! | --- | --- |
//! | `metadata` (without `secretName`) | in the image's metadata ([`META_DEK`]), as it is: for clusters whose Ceph access is trusted |
//! | `metadata` with `secretName` (and `secretNamespace`) | in the image's metadata, wrapped with a key-encryption key from a Kubernetes Secret ([`super::secrets_metadata`]) |
//! | `kubernetes-secret` (with `secretNamespace`) | in a Kubernetes Secret of its own per volume ([`super::secret_per_volume`]) |
//!
//! Other types (Vault, cloud KMSs) are refused with an error naming the entry; a new one
//! implements [`Kms`].

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use ceph_rbd::Cluster;

use super::EncryptionError;
use super::secret_per_volume::SecretPerVolumeKms;
use super::secrets::SecretStore;
use super::secrets_metadata::SecretsMetadataKms;

/// Image metadata: the DEK of the `metadata` KMS (ceph-csi's key).
pub const META_DEK: &str = "rbd.csi.ceph.com/dek";
/// The key older ceph-csi releases kept [`META_DEK`] under; a volume they made may still carry
/// only this one (ceph-csi moves it when it stages the volume).
pub const LEGACY_META_DEK: &str = ".rbd.csi.ceph.com/dek";

/// The DEK value stored on `target`'s image: under [`META_DEK`], else under
/// [`LEGACY_META_DEK`]; `None` when neither holds one. One read of the image's metadata.
pub(crate) async fn stored_dek(target: &Target<'_>) -> Result<Option<String>, ceph_rbd::Error> {
    let mut meta = target
        .cluster
        .metadata_list_unopened(target.pool, target.image)
        .await?;
    Ok([META_DEK, LEGACY_META_DEK]
        .into_iter()
        .find_map(|key| meta.remove(key).filter(|v| !v.is_empty())))
}

/// A volume's passphrase (data encryption key): 32 random bytes, hex. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Dek(String);

impl Dek {
    /// A fresh key from the kernel's random source.
    ///
    /// # Errors
    /// Reading `/dev/urandom`.
    pub fn generate() -> std::io::Result<Dek> {
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(Dek(crate::hex(&bytes)))
    }

    /// A key as stored.
    #[must_use]
    pub fn new(value: String) -> Dek {
        Dek(value)
    }

    /// The passphrase, for the one place it is handed to (cryptsetup's stdin).
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Dek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Dek(<redacted>)")
    }
}

/// The image a key belongs to, with a connection that may read (and on create, write) its
/// metadata.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub cluster: &'a Cluster,
    /// The pool spec (`pool` or `pool/namespace`).
    pub pool: &'a str,
    pub image: &'a str,
    /// The volume's CSI ID (ceph-csi's salt of a wrapped key).
    pub volume_id: &'a str,
    /// The namespace of the volume's claim, when known (ceph-csi's default `secretNamespace`).
    pub tenant: Option<&'a str>,
}

impl Target<'_> {
    /// `pool/image`, for messages.
    #[must_use]
    pub fn spec(&self) -> String {
        format!("{}/{}", self.pool, self.image)
    }
}

/// A key management service: keeps one DEK per volume.
#[async_trait::async_trait]
pub trait Kms: Send + Sync {
    /// The configuration entry's name (`encryptionKMSID`), for errors and logs.
    fn id(&self) -> &str;
    /// The volume's DEK, `None` when none is stored.
    async fn fetch_dek(&self, target: &Target<'_>) -> Result<Option<Dek>, EncryptionError>;
    /// Stores the volume's DEK (replacing one stored).
    async fn store_dek(&self, target: &Target<'_>, dek: &Dek) -> Result<(), EncryptionError>;
    /// Removes the volume's DEK when the volume is deleted (nothing to do for a KMS that keeps
    /// it with the image).
    async fn remove_dek(&self, target: &Target<'_>) -> Result<(), EncryptionError>;
    /// Whether the key lives outside the image, so that deleting the volume must remove it.
    fn keeps_key_apart(&self) -> bool {
        false
    }
}

/// The `metadata` KMS: the DEK in the image's own metadata. Whoever can read the image's
/// metadata (a Ceph key with read access to the pool) can read the data.
#[derive(Clone, Debug)]
pub struct MetadataKms {
    id: String,
}

#[async_trait::async_trait]
impl Kms for MetadataKms {
    fn id(&self) -> &str {
        &self.id
    }

    async fn fetch_dek(&self, target: &Target<'_>) -> Result<Option<Dek>, EncryptionError> {
        let value = stored_dek(target)
            .await
            .map_err(|source| self.ceph(source))?;
        match value {
            Some(v) if super::wrap::is_wrapped(&v) => Err(EncryptionError::Kms {
                id: self.id.clone(),
                problem: format!(
                    "image {} holds a wrapped key (ceph-csi's metadata KMS with a secretName), \
                     which this entry (no secretName) cannot unwrap",
                    target.spec()
                ),
            }),
            Some(v) if !v.is_empty() => Ok(Some(Dek(v))),
            _ => Ok(None),
        }
    }

    async fn store_dek(&self, target: &Target<'_>, dek: &Dek) -> Result<(), EncryptionError> {
        target
            .cluster
            .metadata_set(target.pool, target.image, META_DEK, dek.expose())
            .await
            .map_err(|source| self.ceph(source))
    }

    async fn remove_dek(&self, _target: &Target<'_>) -> Result<(), EncryptionError> {
        // Removed with the image.
        Ok(())
    }
}

impl MetadataKms {
    fn ceph(&self, source: ceph_rbd::Error) -> EncryptionError {
        EncryptionError::Ceph {
            id: self.id.clone(),
            source,
        }
    }
}

/// The KMS configuration (ceph-csi's `config.json`), as read from its file.
#[derive(Clone, Debug)]
pub struct KmsConfig {
    path: String,
    entries: BTreeMap<String, serde_json::Value>,
    secrets: Option<Arc<dyn SecretStore>>,
}

impl KmsConfig {
    /// Reads the configuration at `path`.
    ///
    /// # Errors
    /// [`EncryptionError::Config`] naming the file: unreadable, not a JSON object of objects.
    pub fn load(path: &Path) -> Result<KmsConfig, EncryptionError> {
        let shown = path.display().to_string();
        let problem = |problem: String| EncryptionError::Config {
            path: shown.clone(),
            problem,
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| problem(format!("cannot read: {e}")))?;
        KmsConfig::parse(&shown, &text)
    }

    /// Parses a configuration's text (`path` names it in errors).
    ///
    /// # Errors
    /// [`EncryptionError::Config`]: not a JSON object whose values are objects.
    pub fn parse(path: &str, text: &str) -> Result<KmsConfig, EncryptionError> {
        let problem = |problem: String| EncryptionError::Config {
            path: path.to_owned(),
            problem,
        };
        let entries: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| problem(format!("not a JSON object of KMS entries: {e}")))?;
        if let Some((id, _)) = entries.iter().find(|(_, v)| !v.is_object()) {
            return Err(problem(format!("entry {id:?} is not a JSON object")));
        }
        Ok(KmsConfig {
            path: path.to_owned(),
            entries,
            secrets: None,
        })
    }

    /// The Kubernetes Secrets the entries that keep keys in (or behind) Secrets use.
    #[must_use]
    pub fn with_secrets(mut self, secrets: Option<Arc<dyn SecretStore>>) -> KmsConfig {
        self.secrets = secrets;
        self
    }

    /// The KMS of entry `id`.
    ///
    /// # Errors
    /// [`EncryptionError::UnknownKms`] for an id not in the file; [`EncryptionError::Kms`] for an
    /// entry of a type not provided or malformed.
    pub fn kms(&self, id: &str) -> Result<Box<dyn Kms>, EncryptionError> {
        let entry = self
            .entries
            .get(id)
            .ok_or_else(|| EncryptionError::UnknownKms {
                id: id.to_owned(),
                path: self.path.clone(),
                known: self.entries.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        let problem = |problem: String| EncryptionError::Kms {
            id: id.to_owned(),
            problem,
        };
        let kind = entry
            .get("encryptionKMSType")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| problem("encryptionKMSType is missing or not a string".to_owned()))?;
        let option = |name: &str| -> Result<Option<String>, EncryptionError> {
            match entry.get(name) {
                None => Ok(None),
                Some(serde_json::Value::String(v)) if !v.trim().is_empty() => {
                    Ok(Some(v.trim().to_owned()))
                }
                Some(_) => Err(problem(format!("{name} is not a non-empty string"))),
            }
        };
        let secrets = || {
            self.secrets.clone().ok_or_else(|| {
                problem(format!(
                    "encryptionKMSType {kind:?} reads Kubernetes Secrets, and this process has \
                     no Kubernetes API access (give it a kubeconfig or run it in a pod)"
                ))
            })
        };
        match kind {
            "metadata" => match option("secretName")? {
                None => Ok(Box::new(MetadataKms { id: id.to_owned() })),
                Some(secret_name) => Ok(Box::new(SecretsMetadataKms::new(
                    id,
                    secret_name,
                    option("secretNamespace")?,
                    secrets()?,
                ))),
            },
            super::secret_per_volume::KMS_TYPE => {
                let namespace = option("secretNamespace")?.ok_or_else(|| {
                    problem(
                        "secretNamespace is required: the namespace the volumes' key Secrets \
                         are kept in"
                            .to_owned(),
                    )
                })?;
                Ok(Box::new(SecretPerVolumeKms::new(id, namespace, secrets()?)))
            }
            other => Err(problem(format!(
                "encryptionKMSType {other:?} is not provided by this driver (provided: \
                 \"metadata\", \"{}\"; Vault and cloud KMSs are not)",
                super::secret_per_volume::KMS_TYPE
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dek_is_64_hex_digits_and_never_printed() {
        let dek = Dek::generate().map_err(|e| e.to_string());
        let dek = dek.as_ref().map(Dek::expose).map(str::to_owned);
        assert!(
            dek.as_ref()
                .is_ok_and(|d| d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()))
        );
        assert_eq!(
            format!("{:?}", Dek::new("secret".into())),
            "Dek(<redacted>)"
        );
    }

    #[test]
    fn config_errors_name_the_file_and_the_entry() {
        let err = |text: &str, id: &str| {
            KmsConfig::parse("/kms.json", text)
                .and_then(|c| c.kms(id).map(|k| k.id().to_owned()))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err("[]", "x").starts_with("KMS configuration /kms.json:"));
        let good = r#"{"plain":{"encryptionKMSType":"metadata"},
                      "v":{"encryptionKMSType":"vault"}}"#;
        assert!(err(good, "nope").contains("\"nope\" is not an entry"));
        assert!(err(good, "v").starts_with("KMS entry \"v\""));
        assert_eq!(err(good, "plain"), "");
    }
}
