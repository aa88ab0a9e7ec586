//! [`SecretStore`] through the Kubernetes API: the Secrets the volume core's KMSs read and write
//! (`rbd_volume::encryption::secrets`), over kube-rs.
//!
//! A `put` whose Secret exists already replaces it only when it has the same owner: labelled
//! with every label the new one carries, and no annotation of the new one set to another value
//! there (the key Secrets' annotations name their volume's cluster, pool and image). Otherwise
//! the existing Secret is left alone and the error names it and its owner. The replace carries
//! the resource version read, so a Secret changed in between is not overwritten either.

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

/// A Secret's data (`stringData` and `data`).
fn data_of(secret: Secret) -> SecretData {
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .string_data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    data.extend(
        secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0)),
    );
    SecretData(data)
}

/// Why `existing` may not be replaced by a Secret with `labels` and `annotations`: a label it
/// lacks (not made by the same hand), or an annotation it gives another value (another owner).
/// `None`: same owner.
#[must_use]
pub fn other_owner(
    existing: &ObjectMeta,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Option<String> {
    let empty = BTreeMap::new();
    let have_labels = existing.labels.as_ref().unwrap_or(&empty);
    if let Some((key, value)) = labels.iter().find(|(k, v)| have_labels.get(*k) != Some(*v)) {
        return Some(format!("it is not labelled {key}={value}"));
    }
    let have = existing.annotations.as_ref().unwrap_or(&empty);
    rbd_volume::encryption::secret_per_volume::other_owner(have, annotations)
}

#[async_trait::async_trait]
impl SecretStore for KubeSecrets {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<SecretData>, String> {
        Ok(self
            .get_annotated(namespace, name)
            .await?
            .map(|(data, _)| data))
    }

    async fn get_annotated(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<(SecretData, BTreeMap<String, String>)>, String> {
        let secret = self
            .api(namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading Secret {namespace}/{name}: {e}"))?;
        Ok(secret.map(|mut s| {
            let annotations = s.metadata.annotations.take().unwrap_or_default();
            (data_of(s), annotations)
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
                let (labels, annotations) = (
                    object.metadata.labels.clone().unwrap_or_default(),
                    object.metadata.annotations.clone().unwrap_or_default(),
                );
                if let Some(why) = other_owner(&existing.metadata, &labels, &annotations) {
                    return Err(format!(
                        "Secret {namespace}/{name} exists and is not replaced: {why}"
                    ));
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_secret_naming_another_owner_or_not_ours_is_not_replaced() {
        let labels = map(&[("app.kubernetes.io/managed-by", "rbd-provisioner")]);
        let ours = map(&[
            ("provisioner.ceph.com/cluster-fsid", "f1"),
            ("provisioner.ceph.com/pool", "kube"),
            ("provisioner.ceph.com/image", "pvc-1"),
        ]);
        let existing = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| ObjectMeta {
            labels: Some(map(labels)),
            annotations: Some(map(annotations)),
            ..ObjectMeta::default()
        };
        let managed = [("app.kubernetes.io/managed-by", "rbd-provisioner")];
        // the same volume (also as an older version annotated it, without the cluster)
        let same = existing(&managed, &[("provisioner.ceph.com/image", "pvc-1")]);
        assert_eq!(other_owner(&same, &labels, &ours), None);
        let other_image = existing(&managed, &[("provisioner.ceph.com/image", "pvc-2")]);
        let why = other_owner(&other_image, &labels, &ours).unwrap();
        assert!(why.contains("provisioner.ceph.com/image=pvc-2"), "{why}");
        let other_cluster = existing(&managed, &[("provisioner.ceph.com/cluster-fsid", "f2")]);
        assert!(other_owner(&other_cluster, &labels, &ours).is_some());
        let not_ours = existing(&[], &[]);
        let why = other_owner(&not_ours, &labels, &ours).unwrap();
        assert!(
            why.contains("not labelled app.kubernetes.io/managed-by"),
            "{why}"
        );
    }
}
