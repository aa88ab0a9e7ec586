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
        "secret {namespace}/{name} has no non-empty \"key\" (or \"userKey\"/\"adminKey\") entry"
    )]
    NoKey { namespace: String, name: String },
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
    key_from(&secret).ok_or(SecretError::NoKey { namespace, name })
}

/// The key in a secret's `data` (or `stringData`), first of [`KEY_FIELDS`] that is non-empty.
pub fn key_from(secret: &Secret) -> Option<ceph_rbd::Secret> {
    for field in KEY_FIELDS {
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(field))
            .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(field))
                    .map(|s| s.trim().to_string())
            });
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            return Some(ceph_rbd::Secret::new(v));
        }
    }
    None
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

    #[test]
    fn reads_key_then_user_key_never_the_last_value() {
        assert_eq!(
            key_from(&secret(&[("key", "AQA1\n")])).unwrap().expose(),
            "AQA1"
        );
        assert_eq!(
            key_from(&secret(&[("userID", "kube"), ("userKey", "AQA2")]))
                .unwrap()
                .expose(),
            "AQA2"
        );
        // the old provisioner fell back to "the last value in the map": we refuse instead
        assert!(key_from(&secret(&[("other", "AQA3")])).is_none());
        assert!(key_from(&secret(&[("key", " ")])).is_none());
    }

    #[test]
    fn errors_name_the_secret() {
        let e = SecretError::NoKey {
            namespace: "kube-system".into(),
            name: "ceph-admin".into(),
        };
        assert_eq!(
            e.to_string(),
            "secret kube-system/ceph-admin has no non-empty \"key\" (or \"userKey\"/\"adminKey\") entry"
        );
    }
}
