//! ceph-csi's wrapping of a DEK with a passphrase (its `metadata` KMS with a `secretName`), so
//! that keys written by either driver read the same way.
//!
//! The key-encryption key is `scrypt(passphrase, salt, N=32768, r=8, p=1)`, 32 bytes; the DEK is
//! sealed with AES-256-GCM under a random 96-bit nonce; the stored value is the JSON object
//! `{"dek": <base64 of ciphertext and tag>, "nonce": <base64>}` (Go's encoding of `[]byte`:
//! standard base64 with padding). ceph-csi's salt is the CSI volume ID; as the salt must survive
//! a copy of the value (a clone or a restore copies its source's image metadata), this driver
//! also records the salt it used as `"salt"`, a field ceph-csi ignores when it reads the value.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

use super::kms::Dek;

/// scrypt's cost parameters as ceph-csi uses them (`scrypt.Key(pass, salt, 32768, 8, 1, 32)`).
const SCRYPT_LOG_N: u8 = 15;
const SCRYPT_R: u32 = 8;
const SCRYPT_P: u32 = 1;
const KEY_LEN: usize = 32;

/// The stored form of a wrapped DEK.
#[derive(Debug, Serialize, Deserialize)]
struct Wrapped {
    dek: String,
    nonce: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    salt: Option<String>,
}

/// Why a wrapped DEK could not be made or opened. Never carries a key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WrapError {
    #[error("the stored key is not a wrapped key (JSON with \"dek\" and \"nonce\"): {0}")]
    Malformed(String),
    #[error("the key-encryption key does not unwrap the stored key (a wrong passphrase)")]
    WrongKek,
    #[error("the key-encryption key could not be derived: {0}")]
    Kdf(String),
    #[error("no random nonce: {0}")]
    Random(String),
}

/// Whether a stored DEK value is in the wrapped form (a JSON object).
#[must_use]
pub fn is_wrapped(stored: &str) -> bool {
    stored.trim_start().starts_with('{')
}

fn kek(passphrase: &[u8], salt: &str) -> Result<LessSafeKey, WrapError> {
    let params = scrypt::Params::new(SCRYPT_LOG_N, SCRYPT_R, SCRYPT_P, KEY_LEN)
        .map_err(|e| WrapError::Kdf(e.to_string()))?;
    let mut key = [0u8; KEY_LEN];
    scrypt::scrypt(passphrase, salt.as_bytes(), &params, &mut key)
        .map_err(|e| WrapError::Kdf(e.to_string()))?;
    let unbound = UnboundKey::new(&AES_256_GCM, &key).map_err(|_| WrapError::Kdf("aes".into()))?;
    Ok(LessSafeKey::new(unbound))
}

/// Seals `dek` with the key derived from `passphrase` and `salt` under `nonce`.
///
/// # Errors
/// [`WrapError::Kdf`].
pub fn wrap_with_nonce(
    dek: &Dek,
    passphrase: &[u8],
    salt: &str,
    nonce: [u8; NONCE_LEN],
) -> Result<String, WrapError> {
    let key = kek(passphrase, salt)?;
    let mut sealed = dek.expose().as_bytes().to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::empty(),
        &mut sealed,
    )
    .map_err(|_| WrapError::Kdf("sealing".into()))?;
    let wrapped = Wrapped {
        dek: STANDARD.encode(&sealed),
        nonce: STANDARD.encode(nonce),
        salt: Some(salt.to_owned()),
    };
    serde_json::to_string(&wrapped).map_err(|e| WrapError::Malformed(e.to_string()))
}

/// Seals `dek` under a fresh random nonce.
///
/// # Errors
/// [`WrapError::Random`], [`WrapError::Kdf`].
pub fn wrap(dek: &Dek, passphrase: &[u8], salt: &str) -> Result<String, WrapError> {
    use std::io::Read;
    let mut nonce = [0u8; NONCE_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut nonce))
        .map_err(|e| WrapError::Random(e.to_string()))?;
    wrap_with_nonce(dek, passphrase, salt, nonce)
}

/// `stored` with `salt` recorded in it, for a key ceph-csi wrapped (it records none, its salt
/// being the volume ID it reads the key by): once a volume is read by another ID (this
/// driver's handle), the salt must travel with the value. `None` when `stored` records a salt
/// already. The sealed key and its nonce are kept as they are, so ceph-csi, which ignores the
/// field, still reads the value.
///
/// # Errors
/// [`WrapError::Malformed`] for a value that is not the wrapped form.
pub fn with_salt(stored: &str, salt: &str) -> Result<Option<String>, WrapError> {
    let mut wrapped: Wrapped =
        serde_json::from_str(stored).map_err(|e| WrapError::Malformed(e.to_string()))?;
    if wrapped.salt.is_some() {
        return Ok(None);
    }
    wrapped.salt = Some(salt.to_owned());
    serde_json::to_string(&wrapped)
        .map(Some)
        .map_err(|e| WrapError::Malformed(e.to_string()))
}

/// Opens a wrapped DEK: the salt recorded in it, else `default_salt` (ceph-csi's volume ID).
///
/// # Errors
/// [`WrapError::Malformed`] for a value that is not the wrapped form, [`WrapError::WrongKek`]
/// when the passphrase (or the salt) is not the one it was wrapped with.
pub fn unwrap(stored: &str, passphrase: &[u8], default_salt: &str) -> Result<Dek, WrapError> {
    let wrapped: Wrapped =
        serde_json::from_str(stored).map_err(|e| WrapError::Malformed(e.to_string()))?;
    let decode = |field: &str, value: &str| {
        STANDARD
            .decode(value)
            .map_err(|e| WrapError::Malformed(format!("{field}: {e}")))
    };
    let mut sealed = decode("dek", &wrapped.dek)?;
    let nonce = decode("nonce", &wrapped.nonce)?;
    let nonce = Nonce::try_assume_unique_for_key(&nonce)
        .map_err(|_| WrapError::Malformed(format!("nonce: not {NONCE_LEN} bytes")))?;
    let key = kek(passphrase, wrapped.salt.as_deref().unwrap_or(default_salt))?;
    let plain = key
        .open_in_place(nonce, Aad::empty(), &mut sealed)
        .map_err(|_| WrapError::WrongKek)?;
    let dek = String::from_utf8(plain.to_vec())
        .map_err(|_| WrapError::Malformed("the unwrapped key is not text".into()))?;
    Ok(Dek::new(dek))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made with Python's `hashlib.scrypt` and `cryptography`'s `AESGCM`, following ceph-csi's
    /// `secretsMetadataKMS.EncryptDEK` (salt: a ceph-csi volume ID; no `"salt"` field).
    const CEPH_CSI_WRAPPED: &str = r#"{"dek":"nlVeYUXHoXmfOzSJWD45T0+MBJiCBFTGCSjUty0yujavjdVUD465mhG8fYCoO+IiId6qbA==","nonce":"AAECAwQFBgcICQoL"}"#;
    const CEPH_CSI_VOLUME_ID: &str =
        "0001-0009-rook-ceph-0000000000000002-817ac001-d510-4b7d-90d9-fccbe70d3fd6";

    #[test]
    fn reads_a_key_wrapped_as_ceph_csi_wraps_it() {
        let dek = unwrap(
            CEPH_CSI_WRAPPED,
            b"a-passphrase-from-a-secret",
            CEPH_CSI_VOLUME_ID,
        );
        assert_eq!(
            dek.as_ref().map(Dek::expose).ok(),
            Some("Zm9vYmFyYmF6cXV4cXV1eC0xMjM0NTY3OA==")
        );
        assert_eq!(
            unwrap(CEPH_CSI_WRAPPED, b"another passphrase", CEPH_CSI_VOLUME_ID).err(),
            Some(WrapError::WrongKek)
        );
        assert_eq!(
            unwrap(CEPH_CSI_WRAPPED, b"a-passphrase-from-a-secret", "other-id").err(),
            Some(WrapError::WrongKek)
        );
    }

    #[test]
    fn a_key_wrapped_by_ceph_csi_opens_by_another_id_once_its_salt_is_recorded() {
        let salted = with_salt(CEPH_CSI_WRAPPED, CEPH_CSI_VOLUME_ID)
            .ok()
            .flatten()
            .unwrap_or_default();
        let opened = unwrap(&salted, b"a-passphrase-from-a-secret", "0001-another-id");
        assert_eq!(
            opened.as_ref().map(Dek::expose).ok(),
            Some("Zm9vYmFyYmF6cXV4cXV1eC0xMjM0NTY3OA==")
        );
        // ceph-csi's fields are kept as they were
        let before: serde_json::Value = serde_json::from_str(CEPH_CSI_WRAPPED).unwrap_or_default();
        let after: serde_json::Value = serde_json::from_str(&salted).unwrap_or_default();
        assert_eq!(after["dek"], before["dek"]);
        assert_eq!(after["nonce"], before["nonce"]);
        // a recorded salt is not replaced
        assert_eq!(with_salt(&salted, "other").ok(), Some(None));
        assert!(matches!(
            with_salt("0123abcd", "s"),
            Err(WrapError::Malformed(_))
        ));
    }

    #[test]
    fn a_wrapped_key_records_its_salt_and_opens_with_it_anywhere() {
        let dek = Dek::new("k".repeat(64));
        let wrapped = wrap(&dek, b"kek", "volume-a").unwrap_or_default();
        assert!(is_wrapped(&wrapped));
        assert!(
            !wrapped.contains(&"k".repeat(64)),
            "the DEK is not stored in clear"
        );
        // a copy (a clone's metadata) opens with the recorded salt, whatever its own ID
        let opened = unwrap(&wrapped, b"kek", "volume-b").map(|d| d.expose().to_owned());
        assert_eq!(opened.ok(), Some("k".repeat(64)));
        assert_eq!(
            unwrap(&wrapped, b"wrong", "volume-a").err(),
            Some(WrapError::WrongKek)
        );
        assert!(matches!(
            unwrap("0123abcd", b"kek", "v"),
            Err(WrapError::Malformed(_))
        ));
    }
}
