//! Encrypted volumes, in ceph-csi's model so its storage classes carry over: class parameters
//! `encrypted: "true"`, `encryptionType: block` and `encryptionKMSID: <entry>`, the entry naming
//! a KMS in ceph-csi's KMS configuration (`config.json` of the ConfigMap
//! `ceph-csi-encryption-kms-config`). Each volume has its own passphrase (the DEK), made when the
//! volume is created and stored through the KMS; the node unlocks it at stage time and formats
//! LUKS2 on the mapped device on the first stage.
//!
//! - [`parameters`]: the class parameters (also the volume context the node reads);
//! - [`kms`]: the KMS configuration and the [`kms::Kms`] trait; its implementations
//!   [`kms::MetadataKms`], [`secrets_metadata`] (a DEK wrapped as ceph-csi wraps it, [`wrap`])
//!   and [`secret_per_volume`], the last two reading Kubernetes Secrets through [`secrets`];
//! - [`prepare`]: the create-time step both front doors call after the image exists;
//!   [`check_source`]: a restore or clone keeps its source's encryption.
//!
//! Image metadata (ceph-csi's keys): [`META_ENCRYPTED`] says the volume is encrypted
//! (`encryptionPrepared` once the DEK is stored); the `metadata` KMSs keep the DEK in
//! [`kms::META_DEK`]; [`META_KMS_ID`] (this driver's) names the KMS entry, so that a delete can
//! remove a key kept apart from the image. A clone or a restore copies the image metadata of its
//! source, so with the `metadata` KMSs it gets its own copy of the source's DEK, as it must: it
//! shares the source's data and LUKS header. With a KMS that keeps keys apart, [`prepare`]
//! copies the source's key.

pub mod kms;
pub mod secret_per_volume;
pub mod secrets;
pub mod secrets_metadata;
pub mod wrap;

use std::collections::HashMap;

use ceph_rbd::Cluster;

pub use kms::{Dek, Kms, KmsConfig, Target};

/// Class parameter (and volume context key): `"true"` for an encrypted volume.
pub const PARAM_ENCRYPTED: &str = "encrypted";
/// Class parameter: `block` (LUKS2 on the mapped device), the only type provided.
pub const PARAM_TYPE: &str = "encryptionType";
/// Class parameter: the entry of the KMS configuration that keeps the volume's DEK.
pub const PARAM_KMS_ID: &str = "encryptionKMSID";
/// The claim's namespace (the external-provisioner's `--extra-create-metadata`; ceph-csi's
/// "tenant", the default `secretNamespace` of its `metadata` KMS).
pub const PARAM_TENANT: &str = "csi.storage.k8s.io/pvc/namespace";
/// The volume context keys the node needs, copied from the class parameters.
pub const CONTEXT_KEYS: &[&str] = &[PARAM_ENCRYPTED, PARAM_TYPE, PARAM_KMS_ID, PARAM_TENANT];

/// Image metadata: the volume's encryption state (ceph-csi's key).
pub const META_ENCRYPTED: &str = "rbd.csi.ceph.com/encrypted";
/// The key older ceph-csi releases kept [`META_ENCRYPTED`] under (see [`kms::LEGACY_META_DEK`]).
pub const LEGACY_META_ENCRYPTED: &str = ".rbd.csi.ceph.com/encrypted";
/// [`META_ENCRYPTED`]: the DEK is stored, the LUKS header not necessarily written yet.
pub const ENCRYPTION_PREPARED: &str = "encryptionPrepared";
/// Image metadata: the KMS entry (`encryptionKMSID`) keeping the volume's DEK.
pub const META_KMS_ID: &str = "provisioner.ceph.com/encryption-kms-id";

/// Where ceph-csi's deployments mount the KMS configuration.
pub const DEFAULT_KMS_CONFIG: &str = "/etc/ceph-csi-encryption-kms-config/config.json";

/// An encrypted volume's settings, from the class parameters or the volume context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encryption {
    /// The KMS configuration entry (`encryptionKMSID`).
    pub kms_id: String,
    /// The claim's namespace, when known ([`PARAM_TENANT`]).
    pub tenant: Option<String>,
}

/// Errors of encrypted volumes. None carries a key.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    #[error("parameter {field}: {problem}")]
    Parameter { field: String, problem: String },
    #[error("KMS configuration {path}: {problem}")]
    Config { path: String, problem: String },
    #[error(
        "encryptionKMSID {id:?} is not an entry of the KMS configuration {path} (entries: {known})"
    )]
    UnknownKms {
        id: String,
        path: String,
        known: String,
    },
    #[error("KMS entry {id:?}: {problem}")]
    Kms { id: String, problem: String },
    #[error("KMS entry {id:?}: {source}")]
    Ceph {
        id: String,
        #[source]
        source: ceph_rbd::Error,
    },
}

fn parameter(field: &str, problem: impl Into<String>) -> EncryptionError {
    EncryptionError::Parameter {
        field: field.to_owned(),
        problem: problem.into(),
    }
}

/// The encryption settings of `params` (class parameters or a volume context): `None` for an
/// unencrypted volume.
///
/// # Errors
/// [`EncryptionError::Parameter`] naming the parameter: `encrypted` not `true`/`false`, an
/// `encryptionType` other than `block` (ceph-csi's `file`, fscrypt, is not provided), a missing
/// `encryptionKMSID`.
pub fn parameters(params: &HashMap<String, String>) -> Result<Option<Encryption>, EncryptionError> {
    let encrypted = match params.get(PARAM_ENCRYPTED).map(|v| v.trim()) {
        None | Some("") => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            return Err(parameter(
                PARAM_ENCRYPTED,
                format!("{v:?} is not \"true\" or \"false\""),
            ));
        }
    };
    if !encrypted {
        return Ok(None);
    }
    match params.get(PARAM_TYPE).map(|v| v.trim()) {
        None | Some("" | "block") => {}
        Some("file") => {
            return Err(parameter(
                PARAM_TYPE,
                "\"file\" (fscrypt) is not provided by this driver; use \"block\" (LUKS2)",
            ));
        }
        Some(other) => {
            return Err(parameter(
                PARAM_TYPE,
                format!("{other:?} is not an encryption type (\"block\")"),
            ));
        }
    }
    let kms_id = params
        .get(PARAM_KMS_ID)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            parameter(
                PARAM_KMS_ID,
                "is required for an encrypted volume: it names the entry of the KMS \
                 configuration that keeps the volume's key",
            )
        })?;
    Ok(Some(Encryption {
        kms_id: kms_id.to_owned(),
        tenant: params
            .get(PARAM_TENANT)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty()),
    }))
}

/// The volume context entries of an encrypted volume (what the node needs from the class).
#[must_use]
pub fn context(encryption: &Encryption) -> Vec<(String, String)> {
    let mut context = vec![
        (PARAM_ENCRYPTED.to_owned(), "true".to_owned()),
        (PARAM_TYPE.to_owned(), "block".to_owned()),
        (PARAM_KMS_ID.to_owned(), encryption.kms_id.clone()),
    ];
    if let Some(tenant) = &encryption.tenant {
        context.push((PARAM_TENANT.to_owned(), tenant.clone()));
    }
    context
}

/// A restore or a clone shares its source's data, so it must be encrypted exactly when its
/// source is: an encrypted source's data is ciphertext only its key opens; an unencrypted
/// source's data has no LUKS header to open.
///
/// # Errors
/// [`EncryptionError::Parameter`] naming `encrypted` and the source.
pub fn check_source(
    source: &str,
    source_encrypted: bool,
    class: Option<&Encryption>,
) -> Result<(), EncryptionError> {
    match (source_encrypted, class) {
        (true, None) => Err(parameter(
            PARAM_ENCRYPTED,
            format!(
                "the source {source} is encrypted and the class is not: a restore or clone of \
                 an encrypted volume needs a class with encrypted: \"true\" (and a KMS entry \
                 that holds the source's key)"
            ),
        )),
        (false, Some(_)) => Err(parameter(
            PARAM_ENCRYPTED,
            format!(
                "the class is encrypted and the source {source} is not: its data has no LUKS \
                 header, so it cannot become an encrypted volume; use a class without \
                 encryption"
            ),
        )),
        _ => Ok(()),
    }
}

/// Whether image `pool/image` is an encrypted volume (or a snapshot of one): it has
/// [`META_ENCRYPTED`] (or [`LEGACY_META_ENCRYPTED`]); one read of its metadata.
///
/// # Errors
/// Reading its metadata.
pub async fn is_encrypted(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<bool, ceph_rbd::Error> {
    let meta = cluster.metadata_list_unopened(pool, image).await?;
    Ok([META_ENCRYPTED, LEGACY_META_ENCRYPTED]
        .iter()
        .any(|key| meta.get(*key).is_some_and(|v| !v.trim().is_empty())))
}

/// Records `salt` in the wrapped DEK stored on image `pool/image` (under the key it is stored
/// under, [`kms::META_DEK`] or [`kms::LEGACY_META_DEK`]; see [`wrap::with_salt`]): for a volume
/// or snapshot of ceph-csi taken over, whose key ceph-csi wrapped with its own ID as the salt.
/// Nothing for an unwrapped key, no key, or a key that records its salt. Returns whether it
/// wrote. Idempotent.
///
/// # Errors
/// Reading or writing the image's metadata; a stored value that starts as JSON but is not
/// the wrapped form ([`ceph_rbd::Error::InvalidArgument`] naming the key).
pub async fn record_salt(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    salt: &str,
) -> Result<bool, ceph_rbd::Error> {
    let meta = cluster.metadata_list_unopened(pool, image).await?;
    let Some((key, stored)) = [kms::META_DEK, kms::LEGACY_META_DEK]
        .into_iter()
        .find_map(|key| meta.get(key).filter(|v| !v.is_empty()).map(|v| (key, v)))
    else {
        return Ok(false);
    };
    if !wrap::is_wrapped(stored) {
        return Ok(false);
    }
    match wrap::with_salt(stored, salt) {
        Ok(Some(salted)) => {
            cluster.metadata_set(pool, image, key, &salted).await?;
            Ok(true)
        }
        Ok(None) => Ok(false),
        Err(e) => Err(ceph_rbd::Error::InvalidArgument {
            op: "record the salt of a wrapped key",
            target: format!("{pool}/{image} metadata {key}"),
            reason: e.to_string(),
        }),
    }
}

/// The KMS entry recorded on image `pool/image` ([`META_KMS_ID`]), if any.
///
/// # Errors
/// Reading its metadata.
pub async fn recorded_kms_id(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Option<String>, ceph_rbd::Error> {
    Ok(cluster
        .metadata_get(pool, image, META_KMS_ID)
        .await?
        .filter(|v| !v.trim().is_empty()))
}

/// The KMS of entry `kms_id` (a class's `encryptionKMSID`), from the KMS configuration file at
/// `path` (read on a blocking thread: it is read per call, so an edited ConfigMap applies to
/// the next volume), with `secrets` for the entries that keep keys in Kubernetes Secrets.
///
/// # Errors
/// [`EncryptionError::Config`] naming the file, [`EncryptionError::UnknownKms`] and
/// [`EncryptionError::Kms`] naming the entry.
pub async fn load_kms(
    path: &std::path::Path,
    secrets: Option<std::sync::Arc<dyn secrets::SecretStore>>,
    kms_id: &str,
) -> Result<Box<dyn Kms>, EncryptionError> {
    let owned = path.to_path_buf();
    let config = tokio::task::spawn_blocking(move || KmsConfig::load(&owned))
        .await
        .map_err(|e| EncryptionError::Config {
            path: path.display().to_string(),
            problem: format!("reading it: {e}"),
        })??;
    config.with_secrets(secrets).kms(kms_id)
}

/// Deletes an image through `delete` (the volume core's delete of a volume or a snapshot) and,
/// when that succeeds and the image recorded a KMS entry ([`META_KMS_ID`], read before `delete`
/// runs, while the image and its metadata exist), removes its key where that KMS keeps keys apart
/// from the image (a per-volume Secret); with the `metadata` KMSs the key went with the image.
/// `volume_id` is the volume's (or snapshot's) ID, as the key was stored under it.
///
/// A failure to remove the key is logged, not returned: the image is gone, and a retried delete
/// would no longer know the entry; the key's Secret is labelled and annotated with its image for
/// a manual clean-up.
///
/// # Errors
/// `delete`'s.
pub async fn delete_with_key<T, E>(
    image: (&Cluster, &str, &str),
    volume_id: &str,
    kms_config: &std::path::Path,
    secrets: Option<std::sync::Arc<dyn secrets::SecretStore>>,
    delete: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let (cluster, pool, name) = image;
    let kms_id = recorded_kms_id(cluster, pool, name)
        .await
        .unwrap_or_default();
    let deleted = delete.await?;
    if let Some(kms_id) = kms_id {
        remove_key(image, volume_id, kms_config, secrets, &kms_id).await;
    }
    Ok(deleted)
}

/// The key of a deleted image, removed where KMS entry `kms_id` keeps keys apart from the image;
/// a failure is logged ([`delete_with_key`]).
async fn remove_key(
    (cluster, pool, image): (&Cluster, &str, &str),
    volume_id: &str,
    kms_config: &std::path::Path,
    secrets: Option<std::sync::Arc<dyn secrets::SecretStore>>,
    kms_id: &str,
) {
    let target = Target {
        cluster,
        pool,
        image,
        volume_id,
        tenant: None,
    };
    let removed = match load_kms(kms_config, secrets, kms_id).await {
        Ok(kms) if kms.keeps_key_apart() => kms.remove_dek(&target).await,
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(error) = removed {
        tracing::warn!(
            pool,
            image,
            kms = kms_id,
            %error,
            "the deleted volume's key was not removed"
        );
    }
}

/// The snapshot-time step: a snapshot of an encrypted volume whose KMS keeps keys apart from the
/// image gets its own copy of the volume's key (with the `metadata` KMSs the snapshot image's
/// metadata carries it already), so that restores from it outlive the volume. Nothing for an
/// unencrypted source. Idempotent.
///
/// # Errors
/// [`EncryptionError::Ceph`] reading the source's KMS entry (entry `""`); the KMS
/// configuration's and the KMS's errors, naming the entry.
pub async fn copy_key_to_snapshot(
    snapshot: &Target<'_>,
    source: &Target<'_>,
    kms_config: &std::path::Path,
    secrets: Option<std::sync::Arc<dyn secrets::SecretStore>>,
) -> Result<(), EncryptionError> {
    let kms_id = recorded_kms_id(source.cluster, source.pool, source.image)
        .await
        .map_err(|source| EncryptionError::Ceph {
            id: String::new(),
            source,
        })?;
    let Some(kms_id) = kms_id else {
        return Ok(());
    };
    let kms = load_kms(kms_config, secrets, &kms_id).await?;
    if kms.keeps_key_apart() {
        prepare(snapshot, kms.as_ref(), Some(source)).await?;
    }
    Ok(())
}

/// The create-time step of an encrypted volume, after its image exists: unless a DEK is stored
/// already (a retried create, or a restore or clone that copied its source's with the image
/// metadata), the source's DEK (a restore or a clone: `source`) or else a new one is stored
/// through the KMS; then the image is marked [`ENCRYPTION_PREPARED`] and [`META_KMS_ID`].
/// Idempotent.
///
/// # Errors
/// The KMS's errors, naming its entry; a source with no key.
pub async fn prepare(
    target: &Target<'_>,
    kms: &dyn Kms,
    source: Option<&Target<'_>>,
) -> Result<(), EncryptionError> {
    let cluster = target.cluster;
    let (pool, image) = (target.pool, target.image);
    if kms.fetch_dek(target).await?.is_none() {
        let dek = match source {
            Some(source) => kms
                .fetch_dek(source)
                .await?
                .ok_or_else(|| EncryptionError::Kms {
                    id: kms.id().to_owned(),
                    problem: format!(
                        "holds no key for the source {} (was it made with another KMS entry?)",
                        source.spec()
                    ),
                })?,
            None => Dek::generate().map_err(|e| EncryptionError::Kms {
                id: kms.id().to_owned(),
                problem: format!("generating a key: {e}"),
            })?,
        };
        kms.store_dek(target, &dek).await?;
        tracing::info!(
            pool,
            image,
            kms = kms.id(),
            copied = source.is_some(),
            "volume key stored"
        );
    }
    let ceph = |source| EncryptionError::Ceph {
        id: kms.id().to_owned(),
        source,
    };
    if !is_encrypted(cluster, pool, image).await.map_err(ceph)? {
        cluster
            .metadata_set(pool, image, META_ENCRYPTED, ENCRYPTION_PREPARED)
            .await
            .map_err(ceph)?;
    }
    if recorded_kms_id(cluster, pool, image)
        .await
        .map_err(ceph)?
        .as_deref()
        != Some(kms.id())
    {
        cluster
            .metadata_set(pool, image, META_KMS_ID, kms.id())
            .await
            .map_err(ceph)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn unencrypted_unless_encrypted_is_true() {
        assert_eq!(parameters(&map(&[])).ok(), Some(None));
        assert_eq!(parameters(&map(&[("encrypted", "false")])).ok(), Some(None));
        let on = parameters(&map(&[("encrypted", "true"), ("encryptionKMSID", "m")]));
        assert_eq!(
            on.ok(),
            Some(Some(Encryption {
                kms_id: "m".to_owned(),
                tenant: None,
            }))
        );
    }

    #[test]
    fn bad_parameters_name_the_parameter() {
        for (params, field) in [
            (vec![("encrypted", "yes")], "encrypted"),
            (vec![("encrypted", "true")], "encryptionKMSID"),
            (
                vec![
                    ("encrypted", "true"),
                    ("encryptionType", "file"),
                    ("encryptionKMSID", "m"),
                ],
                "encryptionType",
            ),
            (
                vec![
                    ("encrypted", "true"),
                    ("encryptionType", "disk"),
                    ("encryptionKMSID", "m"),
                ],
                "encryptionType",
            ),
        ] {
            let err = parameters(&map(&params)).err().map(|e| e.to_string());
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.starts_with(&format!("parameter {field}:"))),
                "{params:?}: {err:?}"
            );
        }
    }
}
