//! What a cephx key is, read from its text, so that a key the linked client cannot use is
//! reported by its type instead of librados' bare `EINVAL`, and the Ceph client this process
//! links, for `--version` and the startup log.
//!
//! A key's text is the base64 of Ceph's `CryptoKey` encoding: the cipher type (`u16`, little
//! endian: 1 = `aes`, 2 = `aes256k`), the creation time (`u32` seconds + `u32` nanoseconds), the
//! secret's length (`u16`) and the secret. Ceph 20.2 (and 19.2.6 on) creates `aes256k` keys by
//! default; older clients, Pacific's among them, cannot parse them. Nothing here ever prints the
//! key or any part of it.

use base64::Engine as _;

/// The cipher of a cephx key, as its encoding names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// `aes` (AES-128, `CEPH_CRYPTO_AES` = 1): what every Ceph release reads.
    Aes,
    /// `aes256k` (AES-256 with Kerberos 5 key derivation, `CEPH_CRYPTO_AES256KRB5` = 2): the
    /// default of Ceph 20.2 and 19.2.6 on; clients of earlier releases cannot parse it.
    Aes256k,
    /// A cipher number this crate does not know.
    Unknown(u16),
}

impl std::fmt::Display for KeyType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyType::Aes => f.write_str("aes"),
            KeyType::Aes256k => f.write_str("aes256k"),
            KeyType::Unknown(n) => write!(f, "unknown cipher {n}"),
        }
    }
}

/// Reads the cipher of a key from its text.
///
/// # Errors
/// Why the text is not a cephx key (not base64, too short, a length that does not match): the
/// reason never quotes the key.
pub fn key_type(key: &str) -> Result<KeyType, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(key.trim())
        .map_err(|_| "the key is not base64 text (a cephx key looks like the output of `ceph auth print-key`)".to_string())?;
    // type (2) + created (8) + length (2)
    if bytes.len() < 12 {
        return Err(format!(
            "the key decodes to {} bytes, shorter than any cephx key",
            bytes.len()
        ));
    }
    let cipher = u16::from_le_bytes([bytes[0], bytes[1]]);
    let len = usize::from(u16::from_le_bytes([bytes[10], bytes[11]]));
    if bytes.len() != 12 + len {
        return Err(format!(
            "the key's secret length ({len} bytes) does not match its encoding ({} bytes after the header)",
            bytes.len() - 12
        ));
    }
    Ok(match cipher {
        1 => KeyType::Aes,
        2 => KeyType::Aes256k,
        n => KeyType::Unknown(n),
    })
}

/// Whether the linked client can use `key`, checked before it is sent anywhere.
///
/// # Errors
/// Why not (malformed, or of a type this client's release cannot parse), never quoting the key.
/// A client whose release cannot be read is given the benefit of the doubt: the connect says.
pub fn check_usable(key: &str) -> Result<KeyType, String> {
    let kind = key_type(key).map_err(|reason| format!("the key is malformed: {reason}"))?;
    let reads = match kind {
        KeyType::Aes => true,
        // added in 19.2.6 (and every 20.x)
        KeyType::Aes256k => release().is_none_or(|v| v >= (19, 2, 6)),
        KeyType::Unknown(_) => false,
    };
    if reads {
        Ok(kind)
    } else {
        Err(refusal_reason(key).unwrap_or_else(|| format!("the key is of type {kind}")))
    }
}

/// The linked client's release as numbers, when [`client_version`] has them.
fn release() -> Option<(u32, u32, u32)> {
    let version = client_version();
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Some((a, b, c)),
        _ => None,
    }
}

/// Why librados refused a key it was given (it answers `EINVAL` without a reason), from the key
/// itself: `None` when the key looks like one any client reads, so the refusal has another cause.
#[must_use]
pub fn refusal_reason(key: &str) -> Option<String> {
    let client = client_version();
    match key_type(key) {
        Err(reason) => Some(format!("the key is malformed: {reason}")),
        Ok(KeyType::Aes) => None,
        Ok(kind) => Some(format!(
            "the key is of type {kind}, which this Ceph client ({client}) cannot use: \
             give the user a key of type aes (on Ceph 20.2: `ceph mon set auth_allowed_ciphers \
             aes,aes256k`, then `ceph auth rotate client.ID --key-type aes`), or run a build linked \
             with a Ceph client that reads {kind} keys (19.2.6 or later)"
        )),
    }
}

/// The Ceph release of the linked client libraries (`16.2.15`), or the librbd API version
/// when the release cannot be read (`librbd 1.16.0`).
#[must_use]
pub fn client_version() -> String {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(crate::raw::client_version).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(cipher: u16, secret_len: u16, extra: usize) -> String {
        let mut b = cipher.to_le_bytes().to_vec();
        b.extend_from_slice(&[0x10, 0, 0, 0, 0, 0, 0, 0]);
        b.extend_from_slice(&secret_len.to_le_bytes());
        b.extend(std::iter::repeat_n(0xAB, usize::from(secret_len) + extra));
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    #[test]
    fn reads_the_cipher_of_aes_and_aes256k_keys() {
        assert_eq!(key_type(&encode(1, 16, 0)), Ok(KeyType::Aes));
        assert_eq!(key_type(&encode(2, 32, 0)), Ok(KeyType::Aes256k));
        assert_eq!(key_type(&encode(9, 16, 0)), Ok(KeyType::Unknown(9)));
        // what `ceph-authtool --gen-print-key` printed on Pacific
        assert_eq!(
            key_type("AQBgxqZmAAAAABAAvb0yEnMIFSMAwOvUv2sg8w=="),
            Ok(KeyType::Aes)
        );
    }

    #[test]
    fn malformed_keys_are_explained_without_quoting_them() {
        let garbage = "not-a-key!";
        let e = key_type(garbage).unwrap_err();
        assert!(e.contains("not base64"), "{e}");
        assert!(!e.contains(garbage));
        assert!(
            key_type(&encode(1, 16, 3))
                .unwrap_err()
                .contains("does not match")
        );
        assert!(key_type("AQAB").unwrap_err().contains("shorter"));
    }

    #[test]
    fn an_aes256k_key_is_refused_by_its_type_and_an_aes_key_is_not_blamed() {
        let reason = refusal_reason(&encode(2, 32, 0)).unwrap();
        assert!(reason.contains("aes256k"), "{reason}");
        assert!(reason.contains("--key-type aes"), "{reason}");
        assert_eq!(refusal_reason(&encode(1, 16, 0)), None);
    }

    #[test]
    fn this_pacific_client_is_known_not_to_read_aes256k_keys() {
        assert_eq!(check_usable(&encode(1, 16, 0)), Ok(KeyType::Aes));
        match release() {
            Some(v) if v < (19, 2, 6) => {
                let e = check_usable(&encode(2, 32, 0)).unwrap_err();
                assert!(e.contains("aes256k"), "{e}");
            }
            _ => assert_eq!(check_usable(&encode(2, 32, 0)), Ok(KeyType::Aes256k)),
        }
        assert!(check_usable("AQAB").unwrap_err().contains("malformed"));
    }
}
