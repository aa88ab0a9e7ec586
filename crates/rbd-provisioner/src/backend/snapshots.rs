//! The RBD backend's snapshots: [`provisioner::snapshot::Snapshotter`] on the volume core.
//!
//! Snapshots are the volume core's ([`rbd_volume::snapshot`]); the library's content
//! controller does the Kubernetes side.
//!
//! Ours: contents whose `spec.driver` is the CSI driver name (`--csi-driver-name`, what the
//! snapshot-controller copies from a VolumeSnapshotClass naming our driver) or the provisioner
//! name (`--provisioner-name`). Snapshots need a CSI PV: the snapshot-controller takes the
//! source from the PV's `spec.csi.volumeHandle` and refuses in-tree `rbd` PVs. Class
//! parameters other than the `csi.storage.k8s.io/snapshotter-{,list-}secret-*` ones are an
//! error.
//!
//! Credentials: the snapshotter secret (the content's deletion-secret annotations, set by the
//! snapshot-controller from the class parameters `csi.storage.k8s.io/snapshotter-secret-*`;
//! user from its `userID`/`adminId` entry, else `admin`); without it, for a dynamic content,
//! the admin secret recorded on the source PV (as the provisioner's delete uses it); then the
//! class's `csi.storage.k8s.io/snapshotter-list-secret-*`.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::api::{Api, ListParams};
use provisioner::SecretRef;
use provisioner::snapshot::{
    ANN_SECRET_NAME, ANN_SECRET_NAMESPACE, CheckSnapshot, CreateSnapshot, DeleteSnapshot,
    SnapshotError, SnapshotInfo, SnapshotSecrets, Snapshotter,
};
use rbd_csi::volume::VolumeId;
use rbd_volume::snapshot::{self, SnapshotId, SnapshotOwner};

use crate::backend::RbdBackend;
use crate::backend::{monitors, secrets};
use crate::cli::crashpoint;

/// The settings of the content controller for this binary.
#[must_use]
pub fn controller_config(
    workers: usize,
    identity: &str,
) -> provisioner::snapshot::ContentControllerConfig {
    provisioner::snapshot::ContentControllerConfig {
        workers,
        component: "rbd-provisioner-snapshotter".into(),
        identity: identity.to_owned(),
        ..Default::default()
    }
}

fn info(handle: String, snap: &snapshot::Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        handle,
        size_bytes: snap.size,
        created: snap.created,
    }
}

#[async_trait]
impl Snapshotter for RbdBackend {
    fn driver_names(&self) -> Vec<String> {
        self.snapshot_drivers().map(str::to_owned).to_vec()
    }

    async fn create_snapshot(
        &self,
        request: &CreateSnapshot,
    ) -> Result<SnapshotInfo, SnapshotError> {
        if let Some(key) = request.parameters.keys().next() {
            return Err(SnapshotError::final_error(format!(
                "VolumeSnapshotClass {} parameters: unknown parameter {key:?} (snapshots of \
                 this driver take only the csi.storage.k8s.io/snapshotter-* secret parameters)",
                request.class_name.as_deref().unwrap_or_default()
            )));
        }
        let volume_handle = &request.source_volume;
        let source = VolumeId::parse(volume_handle).map_err(|e| {
            SnapshotError::final_error(format!("spec.source.volumeHandle {volume_handle:?}: {e}"))
        })?;
        crashpoint::hit("before-snapshot-create");
        let (user, key) = self
            .snapshot_credentials(&request.secrets, Some(volume_handle))
            .await?;
        let cluster = self.snapshot_cluster(&source.cluster, &user, key).await?;
        let image = snapshot::snapshot_image_name(&request.name);
        let owner = SnapshotOwner {
            name: request.name.clone(),
            source: volume_handle.clone(),
            driver: self.snapshot_drivers()[0].to_owned(),
            kube_cluster: self.kube_cluster().to_owned(),
        };
        let snap = snapshot::create_snapshot(
            &cluster,
            &snapshot::NewSnapshot {
                pool: &source.pool_spec(),
                source_image: &source.image,
                image: &image,
                owner: &owner,
            },
        )
        .await
        .map_err(|e| match &e {
            snapshot::SnapshotError::Volume(v) if v.is_timeout() => SnapshotError::uncertain(e),
            _ => SnapshotError::retriable(e),
        })?;
        crashpoint::hit("after-snapshot-create");
        let handle = SnapshotId::located(
            source.cluster.clone(),
            &source.pool,
            &source.namespace,
            &snap.image,
        )
        .encode()
        .map_err(SnapshotError::final_error)?;
        // a snapshot of an encrypted volume gets its own copy of the key where the KMS keeps
        // keys apart from the image
        let pool = source.pool_spec();
        let snapshot_target = rbd_volume::encryption::Target {
            cluster: &cluster,
            pool: &pool,
            image: &snap.image,
            volume_id: &handle,
            tenant: None,
        };
        let source_target = rbd_volume::encryption::Target {
            image: &source.image,
            volume_id: volume_handle,
            ..snapshot_target
        };
        self.copy_key_to_snapshot(&snapshot_target, &source_target)
            .await
            .map_err(|e| SnapshotError::retriable(format!("copying the volume's key: {e}")))?;
        Ok(info(handle, &snap))
    }

    async fn check_snapshot(&self, request: &CheckSnapshot) -> Result<SnapshotInfo, SnapshotError> {
        let handle = &request.handle;
        let id = SnapshotId::parse(handle).map_err(|e| {
            SnapshotError::final_error(format!("spec.source.snapshotHandle {handle:?}: {e}"))
        })?;
        let (user, key) = self.snapshot_credentials(&request.secrets, None).await?;
        let cluster = self.snapshot_cluster(&id.cluster, &user, key).await?;
        let snap = snapshot::find_snapshot(&cluster, &id.pool_spec(), &id.image)
            .await
            .map_err(SnapshotError::retriable)?
            .ok_or_else(|| {
                SnapshotError::retriable(format!(
                    "spec.source.snapshotHandle {handle:?}: no such snapshot in pool {}",
                    id.pool
                ))
            })?;
        Ok(info(handle.clone(), &snap))
    }

    async fn delete_snapshot(&self, request: &DeleteSnapshot) -> Result<(), SnapshotError> {
        let handle = &request.handle;
        let Ok(id) = SnapshotId::parse(handle) else {
            tracing::warn!(handle, "not a snapshot handle of ours: nothing to delete");
            return Ok(());
        };
        let (user, key) = self
            .snapshot_credentials(&request.secrets, request.source_volume.as_deref())
            .await?;
        let cluster = self.snapshot_cluster(&id.cluster, &user, key).await?;
        crashpoint::hit("before-snapshot-delete");
        let pool = id.pool_spec();
        let deleted = self
            .delete_with_key((&cluster, &pool, &id.image), handle, async {
                let deleted = snapshot::delete_snapshot(&cluster, &pool, &id.image).await?;
                crashpoint::hit("after-snapshot-delete");
                Ok::<_, rbd_volume::Error>(deleted)
            })
            .await
            .map_err(SnapshotError::retriable)?;
        tracing::debug!(snapshot_handle = %handle, ?deleted, "snapshot image deleted");
        Ok(())
    }
}

impl RbdBackend {
    async fn snapshot_cluster(
        &self,
        cluster: &rbd_volume::ClusterRef,
        user: &str,
        key: ceph_rbd::Secret,
    ) -> Result<Arc<ceph_rbd::Cluster>, SnapshotError> {
        let monitors = self
            .monitors_of(cluster)
            .map_err(SnapshotError::final_error)?;
        let monitors = monitors::resolve(&monitors)
            .await
            .map_err(SnapshotError::retriable)?;
        self.cluster(&monitors, user, key).await.map_err(|e| {
            if e.is_connection_failure() {
                SnapshotError::uncertain(e)
            } else {
                SnapshotError::retriable(e)
            }
        })
    }

    /// User and key (see the module docs).
    async fn snapshot_credentials(
        &self,
        secrets: &SnapshotSecrets,
        volume_handle: Option<&str>,
    ) -> Result<(String, ceph_rbd::Secret), SnapshotError> {
        if let Some(secret) = &secrets.snapshotter {
            return self.snapshot_secret(secret).await;
        }
        if let Some(handle) = volume_handle {
            let pvs: Api<PersistentVolume> = Api::all(self.client().clone());
            let list = pvs
                .list(&ListParams::default())
                .await
                .map_err(|e| SnapshotError::retriable(format!("listing PersistentVolumes: {e}")))?;
            if let Some(pv) = list.items.iter().find(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.volume_handle == handle)
            }) {
                let (_, _, user, key) = self
                    .access_for(pv)
                    .await
                    .map_err(SnapshotError::retriable)?;
                return Ok((user, key));
            }
        }
        if let Some(secret) = &secrets.list {
            return self.snapshot_secret(secret).await;
        }
        Err(SnapshotError::final_error(format!(
            "no Ceph credentials for this snapshot: set the VolumeSnapshotClass parameters \
             csi.storage.k8s.io/snapshotter-secret-name/-namespace (the annotations \
             {ANN_SECRET_NAME}/{ANN_SECRET_NAMESPACE} on the content){}",
            if volume_handle.is_some() {
                ", or keep the source PersistentVolume"
            } else {
                ""
            }
        )))
    }

    async fn snapshot_secret(
        &self,
        secret: &SecretRef,
    ) -> Result<(String, ceph_rbd::Secret), SnapshotError> {
        let (ns, name) = (&secret.namespace, &secret.name);
        let api: Api<Secret> = Api::namespaced(self.client().clone(), ns);
        let secret = api
            .get_opt(name)
            .await
            .map_err(|e| SnapshotError::retriable(format!("reading secret {ns}/{name}: {e}")))?
            .ok_or_else(|| SnapshotError::retriable(format!("secret {ns}/{name} not found")))?;
        secrets::user_and_key(&secret).map_err(SnapshotError::final_error)
    }
}
