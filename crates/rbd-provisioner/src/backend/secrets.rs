//! Reading Ceph keys from Kubernetes Secrets. Values never reach a log, an event or an error.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

/// Data keys a Ceph key may be stored under: the old provisioner's `key`, ceph-csi's `userKey`
/// and `adminKey`.
pub const KEY_FIELDS: [&str; 3] = ["key", "userKey", "adminKey"];

/// Why a key could not be read; the message names the secret, never its content.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error(
        "secret {namespace}/{name} has no non-empty \"key\" (or \"userKey\"/\"adminKey\") entry, and no other entry holds a Ceph key"
    )]
    NoKey { namespace: String, name: String },
    #[error(
        "secret {namespace}/{name} has no \"key\" entry and several others that could hold the Ceph key ({}): name the key's entry \"key\"",
        entries.join(", ")
    )]
    Ambiguous {
        namespace: String,
        name: String,
        /// Entry names only, never values.
        entries: Vec<String>,
    },
    #[error("secret {namespace}/{name}: {reason}")]
    UnusableKey {
        namespace: String,
        name: String,
        /// Why this client cannot use the key (its type, or how it is malformed), never the key.
        reason: String,
    },
    #[error("reading secret {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The Ceph key in secret `namespace/name`.
pub async fn read_key(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<ceph_rbd::Secret, SecretError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let (namespace, name) = (namespace.to_string(), name.to_string());
    let secret = match api.get_opt(&name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(SecretError::NotFound { namespace, name }),
        Err(source) => {
            return Err(SecretError::Api {
                namespace,
                name,
                source,
            });
        }
    };
    match key_from(&secret) {
        Found::Key(key) => match ceph_rbd::key::check_usable(key.expose()) {
            Ok(_) => Ok(key),
            Err(reason) => Err(SecretError::UnusableKey {
                namespace,
                name,
                reason,
            }),
        },
        Found::None => Err(SecretError::NoKey { namespace, name }),
        Found::Ambiguous(entries) => Err(SecretError::Ambiguous {
            namespace,
            name,
            entries,
        }),
    }
}

/// The Ceph user and key of a secret in ceph-csi's shape: the user in `userID` (or `adminID`,
/// `adminId`; default `admin`), the key as [`key_from`] finds it. The error says what is
/// missing and names no value.
///
/// # Errors
/// No entry that could be the key, or several.
pub fn user_and_key(secret: &Secret) -> Result<(String, ceph_rbd::Secret), String> {
    let name = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let entry = |k: &str| {
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_string());
        let string_data = || {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|v| v.trim().to_string())
        };
        data.or_else(string_data).filter(|v| !v.is_empty())
    };
    let user = ["userID", "adminID", "adminId"]
        .iter()
        .find_map(|k| entry(k))
        .unwrap_or_else(|| "admin".into());
    match key_from(secret) {
        Found::Key(key) => Ok((user, key)),
        Found::None => Err(format!(
            "secret {name} has no userKey (or adminKey, key) entry"
        )),
        Found::Ambiguous(entries) => Err(format!(
            "secret {name} has several entries that could hold the Ceph key ({})",
            entries.join(", ")
        )),
    }
}

/// What a secret holds.
pub enum Found {
    Key(ceph_rbd::Secret),
    /// No entry could be the key.
    None,
    /// No entry of [`KEY_FIELDS`], and several others shaped like a cephx key (names).
    Ambiguous(Vec<String>),
}

/// Whether `value` has the shape of a cephx key (`aes` or `aes256k`), as `ceph auth get-key`
/// prints it: base64 of a 12-byte header and the secret its header announces.
fn looks_like_cephx_key(value: &str) -> bool {
    ceph_rbd::key::key_type(value).is_ok()
}

/// The key in a secret's `data` (or `stringData`): the first of [`KEY_FIELDS`] that is
/// non-empty; else, as the old provisioner took any entry, the one entry shaped like a cephx key
/// whatever its name (e.g. `kubectl create secret generic --from-file=ceph.client.admin.key`).
/// Several such entries are [`Found::Ambiguous`] (the old provisioner took a random one); a
/// value that is no key (a password, a user name) is never sent to Ceph as one.
pub fn key_from(secret: &Secret) -> Found {
    let mut entries: Vec<(String, String)> = Vec::new();
    for (k, v) in secret.data.iter().flatten() {
        entries.push((k.clone(), String::from_utf8_lossy(&v.0).trim().to_string()));
    }
    for (k, v) in secret.string_data.iter().flatten() {
        if !entries.iter().any(|(e, _)| e == k) {
            entries.push((k.clone(), v.trim().to_string()));
        }
    }
    entries.retain(|(_, v)| !v.is_empty());
    for field in KEY_FIELDS {
        if let Some((_, v)) = entries.iter().find(|(k, _)| k == field) {
            return Found::Key(ceph_rbd::Secret::new(v.clone()));
        }
    }
    let candidates: Vec<&(String, String)> = entries
        .iter()
        .filter(|(_, v)| looks_like_cephx_key(v))
        .collect();
    match candidates.as_slice() {
        [(_, v)] => Found::Key(ceph_rbd::Secret::new(v.clone())),
        [] => Found::None,
        many => Found::Ambiguous(many.iter().map(|(k, _)| k.clone()).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(pairs: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    fn key(s: &Secret) -> Option<String> {
        match key_from(s) {
            Found::Key(k) => Some(k.expose().to_string()),
            _ => None,
        }
    }

    const K1: &str = "AQBzYGFhAAAAABAAqB2nL9cR6J7Bi1Xi9cE1OQ==";
    const K2: &str = "AQCdPmZhAAAAABAAyWZ2XHBpPS6SNbD0z3n0Zg==";

    #[test]
    fn reads_key_then_user_key() {
        assert_eq!(key(&secret(&[("key", "AQA1\n")])).unwrap(), "AQA1");
        assert_eq!(
            key(&secret(&[("userID", "kube"), ("userKey", "AQA2")])).unwrap(),
            "AQA2"
        );
        assert!(matches!(key_from(&secret(&[("key", " ")])), Found::None));
        assert!(matches!(key_from(&secret(&[])), Found::None));
    }

    #[test]
    fn any_entry_name_works_as_with_the_old_provisioner() {
        // kubectl create secret generic ceph-secret --from-file=ceph.client.admin.key
        assert_eq!(
            key(&secret(&[("ceph.client.admin.key", &format!("{K1}\n"))])).unwrap(),
            K1
        );
        // among several entries, the only one shaped like a cephx key
        assert_eq!(
            key(&secret(&[("user", "kube"), ("secret", K2)])).unwrap(),
            K2
        );
        // several candidates: refused, naming the entries only
        match key_from(&secret(&[("a", K1), ("b", K2)])) {
            Found::Ambiguous(names) => assert_eq!(names, ["a", "b"]),
            _ => panic!("two cephx-shaped entries must be ambiguous"),
        }
        // a lone value that is no key is not taken for one
        assert!(matches!(
            key_from(&secret(&[("password", "x")])),
            Found::None
        ));
        assert!(matches!(
            key_from(&secret(&[("a", "x"), ("b", "y")])),
            Found::None
        ));
    }

    #[test]
    fn errors_name_the_secret() {
        let e = SecretError::NoKey {
            namespace: "kube-system".into(),
            name: "ceph-admin".into(),
        };
        assert_eq!(
            e.to_string(),
            "secret kube-system/ceph-admin has no non-empty \"key\" (or \"userKey\"/\"adminKey\") entry, and no other entry holds a Ceph key"
        );
    }
}
