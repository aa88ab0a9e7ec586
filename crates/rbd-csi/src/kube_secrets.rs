//! [`SecretStore`] through the Kubernetes API: the Secrets the volume core's KMSs read and write
//! (`rbd_volume::encryption::secrets`), over kube-rs.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use rbd_volume::encryption::secrets::{NewSecret, SecretData, SecretStore};

/// [`SecretStore`] through the Kubernetes API.
#[derive(Clone)]
pub struct KubeSecrets {
    client: kube::Client,
}

impl std::fmt::Debug for KubeSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeSecrets")
    }
}

impl KubeSecrets {
    #[must_use]
    pub fn new(client: kube::Client) -> KubeSecrets {
        KubeSecrets { client }
    }

    fn api(&self, namespace: &str) -> kube::Api<Secret> {
        kube::Api::namespaced(self.client.clone(), namespace)
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

#[async_trait::async_trait]
impl SecretStore for KubeSecrets {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<SecretData>, String> {
        let secret = self
            .api(namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))?;
        Ok(secret.map(|s| {
            let mut data: BTreeMap<String, Vec<u8>> = s
                .string_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            data.extend(
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            SecretData(data)
        }))
    }

    async fn put(&self, secret: NewSecret<'_>) -> Result<(), String> {
        let (namespace, name) = (secret.namespace, secret.name);
        let mut object = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(secret.labels),
                annotations: Some(secret.annotations),
                ..ObjectMeta::default()
            },
            data: Some(
                secret
                    .data
                    .0
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v)))
                    .collect(),
            ),
            type_: Some("Opaque".to_owned()),
            ..Secret::default()
        };
        let api = self.api(namespace);
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 409) => {
                let existing = api
                    .get(name)
                    .await
                    .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))?;
                object.metadata.resource_version = existing.metadata.resource_version;
                api.replace(name, &PostParams::default(), &object)
                    .await
                    .map(drop)
                    .map_err(|e| format!("replacing Secret {namespace}/{name}: {e}"))
            }
            Err(e) => Err(format!("creating Secret {namespace}/{name}: {e}")),
        }
    }

    async fn delete(&self, namespace: &str, name: &str) -> Result<(), String> {
        match self
            .api(namespace)
            .delete(name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(format!("deleting Secret {namespace}/{name}: {e}")),
        }
    }
}
