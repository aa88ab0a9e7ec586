//! Kubernetes Secrets as the KMSs see them: read a Secret's data, create or replace a Secret,
//! delete one. The trait keeps the KMSs (and this crate) free of the Kubernetes API;
//! `rbd_csi::kube_secrets::KubeSecrets` speaks to it.

use std::collections::BTreeMap;

/// A Secret's data, key to bytes. Never printed.
pub struct SecretData(pub BTreeMap<String, Vec<u8>>);

impl std::fmt::Debug for SecretData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// A Secret to write: its data and the labels and annotations that say what it is.
#[derive(Debug)]
pub struct NewSecret<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub data: SecretData,
}

/// Access to Kubernetes Secrets. Errors are messages without Secret data.
#[async_trait::async_trait]
pub trait SecretStore: Send + Sync + std::fmt::Debug {
    /// The data of Secret `namespace/name`; `None` when there is no such Secret.
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<SecretData>, String>;
    /// The data and annotations of Secret `namespace/name`; `None` when there is no such
    /// Secret. The default reads no annotations.
    async fn get_annotated(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<(SecretData, BTreeMap<String, String>)>, String> {
        Ok(self
            .get(namespace, name)
            .await?
            .map(|data| (data, BTreeMap::new())))
    }
    /// Creates the Secret, or replaces the data of one of that name that belongs to the same
    /// owner: an existing Secret not labelled with all of `secret.labels`, or whose annotations
    /// give another value for one of `secret.annotations`, is not replaced (an error naming
    /// it).
    async fn put(&self, secret: NewSecret<'_>) -> Result<(), String>;
    /// Deletes Secret `namespace/name`; one already gone is fine.
    async fn delete(&self, namespace: &str, name: &str) -> Result<(), String>;
}
