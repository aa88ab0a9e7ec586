//! Encrypted volumes, in ceph-csi's model so its storage classes carry over: class parameters
//! `encrypted: "true"`, `encryptionType: block` and `encryptionKMSID: <entry>`, the entry naming
//! a KMS in ceph-csi's KMS configuration (`config.json` of the ConfigMap
//! `ceph-csi-encryption-kms-config`). Each volume has its own passphrase (the DEK), made when the
//! volume is created and stored through the KMS; the node unlocks it at stage time and formats
//! LUKS2 on the mapped device on the first stage.
//!
//! - [`parameters`]: the class parameters (also the volume context the node reads);
//! - [`kms`]: the KMS configuration and the [`kms::Kms`] trait with its implementations;
//! - [`prepare`]: the create-time step both front doors call after the image exists.
//!
//! Image metadata (ceph-csi's keys): [`META_ENCRYPTED`] says the volume is encrypted
//! (`encryptionPrepared` once the DEK is stored); the `metadata` KMS keeps the DEK in
//! [`kms::META_DEK`]. A clone or a restore copies the image metadata of its source, so it gets
//! its own copy of the source's DEK, as it must: it shares the source's data and LUKS header.

pub mod kms;

use std::collections::HashMap;

use ceph_rbd::Cluster;

pub use kms::{Dek, Kms, KmsConfig};

/// Class parameter (and volume context key): `"true"` for an encrypted volume.
pub const PARAM_ENCRYPTED: &str = "encrypted";
/// Class parameter: `block` (LUKS2 on the mapped device), the only type provided.
pub const PARAM_TYPE: &str = "encryptionType";
/// Class parameter: the entry of the KMS configuration that keeps the volume's DEK.
pub const PARAM_KMS_ID: &str = "encryptionKMSID";
/// The volume context keys the node needs, copied from the class parameters.
pub const CONTEXT_KEYS: &[&str] = &[PARAM_ENCRYPTED, PARAM_TYPE, PARAM_KMS_ID];

/// Image metadata: the volume's encryption state (ceph-csi's key).
pub const META_ENCRYPTED: &str = "rbd.csi.ceph.com/encrypted";
/// [`META_ENCRYPTED`]: the DEK is stored, the LUKS header not necessarily written yet.
pub const ENCRYPTION_PREPARED: &str = "encryptionPrepared";

/// Where ceph-csi's deployments mount the KMS configuration.
pub const DEFAULT_KMS_CONFIG: &str = "/etc/ceph-csi-encryption-kms-config/config.json";

/// An encrypted volume's settings, from the class parameters or the volume context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encryption {
    /// The KMS configuration entry (`encryptionKMSID`).
    pub kms_id: String,
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
    }))
}

/// The volume context entries of an encrypted volume (what the node needs from the class).
#[must_use]
pub fn context(encryption: &Encryption) -> Vec<(String, String)> {
    vec![
        (PARAM_ENCRYPTED.to_owned(), "true".to_owned()),
        (PARAM_TYPE.to_owned(), "block".to_owned()),
        (PARAM_KMS_ID.to_owned(), encryption.kms_id.clone()),
    ]
}

/// The create-time step of an encrypted volume, after its image exists: a DEK made and stored
/// through the KMS unless one is stored already (a retried create, a clone or a restore, which
/// carry their source's), and the image marked [`ENCRYPTION_PREPARED`]. Idempotent.
///
/// # Errors
/// The KMS's errors, naming its entry.
pub async fn prepare(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    kms: &dyn Kms,
) -> Result<(), EncryptionError> {
    let target = kms::Target {
        cluster,
        pool,
        image,
    };
    if kms.fetch_dek(&target).await?.is_none() {
        kms.store_dek(
            &target,
            &Dek::generate().map_err(|e| EncryptionError::Kms {
                id: kms.id().to_owned(),
                problem: format!("generating a key: {e}"),
            })?,
        )
        .await?;
        tracing::info!(pool, image, kms = kms.id(), "volume key made and stored");
    }
    let marked = cluster
        .metadata_get(pool, image, META_ENCRYPTED)
        .await
        .map_err(|source| EncryptionError::Ceph {
            id: kms.id().to_owned(),
            source,
        })?;
    if marked.is_none() {
        cluster
            .metadata_set(pool, image, META_ENCRYPTED, ENCRYPTION_PREPARED)
            .await
            .map_err(|source| EncryptionError::Ceph {
                id: kms.id().to_owned(),
                source,
            })?;
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
                kms_id: "m".to_owned()
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
