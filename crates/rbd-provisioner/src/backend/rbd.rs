//! The RBD backend of the provisioning library: `Provisioner` and `Expander` on ceph-rbd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::{Api, Client};
use provisioner::data_source::checks;
use provisioner::{
    DeleteError, ExpandError, ExpandOutcome, Expander, ProvisionError, ProvisionOptions,
    Provisioned, Provisioner, SecretRef,
};

use rbd_volume::clusters::ClusterConfigFile;
use rbd_volume::encryption::secrets::SecretStore;
use rbd_volume::encryption::{Encryption, Kms};
use rbd_volume::{Claimant, ClusterRef, Fit, Hooks, NewImage, Step};

use crate::backend::image::{Naming, Owner};
use crate::backend::params::{Parameters, PvSource};
use crate::backend::pv_build::{
    ANN_ADMIN_ID, ImageLocation, VolumeInputs, build_volume, image_location,
};
use crate::backend::sources::{RbdSources, Resolved};
use crate::backend::topology::{Placement, place};
use crate::backend::{claim, monitors, secrets};
use crate::cli::crashpoint;

/// How PV sources are chosen when the class does not say (`--pv-source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceMode {
    /// `csi` when our CSIDriver object exists in the cluster, else in-tree `rbd`.
    Auto,
    Csi,
    #[value(alias = "intree", alias = "in-tree")]
    Rbd,
}

/// Backend settings.
#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub identity: String,
    /// The Kubernetes cluster's identity (`--kube-cluster-id`, default the uid of
    /// `kube-system`): recorded on every image, snapshot image and clone intermediate, compared
    /// by deletes.
    pub kube_cluster: String,
    pub naming: Naming,
    pub source_mode: SourceMode,
    pub csi_driver: String,
    /// The provisioner name (`--provisioner-name`): snapshot contents whose `spec.driver` is it
    /// or `csi_driver` are ours.
    pub provisioner_name: String,
    /// Bound of each Ceph operation (`--command-timeout`).
    pub op_timeout: Duration,
    /// The cluster config (`--cluster-config`): `clusterID` names to monitors, re-read when the
    /// file changes.
    pub clusters: Option<Arc<ClusterConfigFile>>,
    /// Node label keys that make up a node's topology (`--topology-labels`), for
    /// `topologyConstrainedPools`.
    pub topology_labels: Vec<String>,
    /// The KMS configuration of encrypted classes (`--kms-config`), read per use.
    pub kms_config: std::path::PathBuf,
}

/// Provisions, deletes and expands RBD images.
pub struct RbdBackend {
    client: Client,
    /// The Kubernetes Secrets of KMS entries that keep keys in (or behind) Secrets.
    kms_secrets: Arc<dyn SecretStore>,
    ceph: ConnectionPool,
    config: BackendConfig,
    csi_driver_seen: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// False after an operation failed because Ceph did not answer; true again after one that
    /// reached it. Reported by `/readyz`.
    ceph_reachable: std::sync::atomic::AtomicBool,
}

impl RbdBackend {
    pub fn new(client: Client, ceph: ConnectionPool, config: BackendConfig) -> Arc<RbdBackend> {
        Arc::new(RbdBackend {
            kms_secrets: Arc::new(rbd_csi::kube_secrets::KubeSecrets::new(client.clone())),
            client,
            ceph,
            config,
            csi_driver_seen: tokio::sync::Mutex::new(None),
            ceph_reachable: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The client this backend talks to Kubernetes with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The Kubernetes cluster's identity recorded on images.
    pub fn kube_cluster(&self) -> &str {
        &self.config.kube_cluster
    }

    /// The CSI driver name (`--csi-driver-name`): CSI PVs and VolumeAttachments of it are ours.
    pub fn csi_driver(&self) -> &str {
        &self.config.csi_driver
    }

    /// The driver names whose snapshot contents are ours: the CSI driver name, then the
    /// provisioner name.
    pub fn snapshot_drivers(&self) -> [&str; 2] {
        [&self.config.csi_driver, &self.config.provisioner_name]
    }

    /// Whether the last connection attempt reached the cluster.
    pub fn ceph_reachable(&self) -> bool {
        self.ceph_reachable
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A pooled connection. A broken connection is replaced by the pool, so this is where an
    /// outage shows (and ends).
    pub(crate) async fn cluster(
        &self,
        monitors: &str,
        user: &str,
        key: ceph_rbd::Secret,
    ) -> Result<Arc<ceph_rbd::Cluster>, ceph_rbd::Error> {
        let cfg = ClusterConfig::new(monitors, user, key)
            .with_op_timeout(self.config.op_timeout)
            .with_connect_timeout(self.config.op_timeout);
        let cluster = self.ceph.get(&cfg).await;
        let reachable = match &cluster {
            Ok(c) => c.is_healthy() && c.is_responsive(),
            Err(e) => !e.is_connection_failure(),
        };
        self.ceph_reachable
            .store(reachable, std::sync::atomic::Ordering::Relaxed);
        cluster
    }

    /// Whether our CSIDriver object exists (cached for 30 s).
    async fn csi_driver_installed(&self) -> bool {
        let mut cached = self.csi_driver_seen.lock().await;
        if let Some((at, seen)) = *cached
            && at.elapsed() < Duration::from_secs(30)
        {
            return seen;
        }
        let api: Api<CSIDriver> = Api::all(self.client.clone());
        let seen = match api.get_opt(&self.config.csi_driver).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "could not look up the CSIDriver object; assuming in-tree rbd PVs");
                false
            }
        };
        *cached = Some((Instant::now(), seen));
        seen
    }

    async fn pv_source(&self, params: &Parameters) -> PvSource {
        if let Some(source) = params.pv_source {
            return source;
        }
        match self.config.source_mode {
            SourceMode::Csi => PvSource::Csi,
            SourceMode::Rbd => PvSource::InTree,
            SourceMode::Auto if self.csi_driver_installed().await => PvSource::Csi,
            SourceMode::Auto => PvSource::InTree,
        }
    }

    /// An existing PV's image and a pooled connection to its cluster with the PV's admin key
    /// ([`Self::access_for`], then [`Self::cluster`]).
    pub(crate) async fn connect_to_pv(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(ImageLocation, Arc<ceph_rbd::Cluster>), provisioner::volume::BoxError> {
        let (location, monitors, user, key) = self.access_for(volume).await?;
        let cluster = self.cluster(&monitors, &user, key).await?;
        Ok((location, cluster))
    }

    /// Location, monitors (resolved; for a `clusterID` looked up in the cluster config now),
    /// user and key for acting on an existing PV's image, from the PV alone.
    pub(crate) async fn access_for(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(ImageLocation, String, String, ceph_rbd::Secret), String> {
        let location = image_location(volume, &self.config.csi_driver).ok_or_else(|| {
            "the PV has no rbd source and no csi source of our driver".to_string()
        })?;
        let (secret, admin_id) = self.admin_secret_for(volume).await?;
        let monitors = self
            .monitors_of(&location.cluster)
            .map_err(|e| format!("the PV's cluster: {e}"))?;
        let monitors = monitors::resolve(&monitors)
            .await
            .map_err(|e| e.to_string())?;
        let key = secrets::read_key(&self.client, &secret.namespace, &secret.name)
            .await
            .map_err(|e| e.to_string())?;
        Ok((location, monitors, admin_id, key))
    }

    /// The admin secret (a reference, not its key) and Ceph user of an existing PV: its
    /// deletion-secret annotations, or for a PV made by the old provisioner its class's.
    pub(crate) async fn admin_secret_for(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(provisioner::volume::SecretRef, String), String> {
        let annotations = volume.metadata.annotations.clone().unwrap_or_default();
        match provisioner::volume::deletion_secret(volume) {
            Some(secret) => Ok((
                secret,
                annotations
                    .get(ANN_ADMIN_ID)
                    .cloned()
                    .unwrap_or_else(|| "admin".into()),
            )),
            // a PV made by the old provisioner: its class is the only record of the admin secret
            None => self.legacy_admin_secret(volume).await,
        }
    }

    /// The connection pool (fencing leaves this process's own clients alone).
    pub(crate) fn connections(&self) -> &ConnectionPool {
        &self.ceph
    }

    /// The KMS of entry `kms_id` (`encryptionKMSID`), from the KMS configuration.
    async fn kms(&self, kms_id: &str) -> Result<Box<dyn Kms>, String> {
        rbd_volume::encryption::load_kms(
            &self.config.kms_config,
            Some(self.kms_secrets.clone()),
            kms_id,
        )
        .await
        .map_err(|e| {
            format!(
                "StorageClass parameter {:?}: {e}",
                rbd_volume::encryption::PARAM_KMS_ID
            )
        })
    }

    /// The snapshot-time step of the volume core: a snapshot of an encrypted volume gets its own
    /// copy of the key where the KMS keeps keys apart from the image.
    pub(crate) async fn copy_key_to_snapshot(
        &self,
        snapshot: &rbd_volume::encryption::Target<'_>,
        source: &rbd_volume::encryption::Target<'_>,
    ) -> Result<(), rbd_volume::encryption::EncryptionError> {
        rbd_volume::encryption::copy_key_to_snapshot(
            snapshot,
            source,
            &self.config.kms_config,
            Some(self.kms_secrets.clone()),
        )
        .await
    }

    /// Deletes an image through `delete`, then its key where its KMS keeps it apart from the
    /// image ([`rbd_volume::encryption::delete_with_key`]: a failure to remove it is logged).
    pub(crate) async fn delete_with_key<T, E>(
        &self,
        image: (&ceph_rbd::Cluster, &str, &str),
        volume_id: &str,
        delete: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let secrets = Some(self.kms_secrets.clone());
        rbd_volume::encryption::delete_with_key(
            image,
            volume_id,
            &self.config.kms_config,
            secrets,
            delete,
        )
        .await
    }

    /// The monitors of `cluster`: given, or for a `clusterID` as the cluster config says now.
    pub(crate) fn monitors_of(&self, cluster: &ClusterRef) -> Result<String, String> {
        let monitors = cluster
            .monitors(self.config.clusters.as_deref())
            .map_err(|e| e.to_string())?;
        if let ClusterRef::Named(id) = cluster {
            crate::backend::params::parse_monitors(&monitors).map_err(|e| {
                format!(
                    "clusterID {id:?}: the cluster config's \"monitors\": {}",
                    e.problem
                )
            })?;
        }
        Ok(monitors)
    }

    /// The default RADOS namespace of a `clusterID` (the cluster config's `rbd.radosNamespace`).
    fn default_namespace(&self, cluster_id: &str) -> Option<String> {
        self.config
            .clusters
            .as_deref()?
            .lookup(cluster_id)
            .ok()?
            .rados_namespace
            .filter(|ns| !ns.is_empty())
    }

    async fn legacy_admin_secret(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(SecretRef, String), String> {
        let class_name = volume
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .ok_or("the PV records no deletion secret and names no StorageClass")?;
        let api: Api<StorageClass> = Api::all(self.client.clone());
        let class = api
            .get_opt(&class_name)
            .await
            .map_err(|e| format!("reading StorageClass {class_name}: {e}"))?
            .ok_or_else(|| {
                format!(
                    "the PV records no deletion secret and its StorageClass {class_name} is gone"
                )
            })?;
        let params =
            Parameters::parse(&class.parameters.unwrap_or_default()).map_err(|e| e.to_string())?;
        Ok((
            SecretRef {
                namespace: params.admin_secret_namespace,
                name: params.admin_secret_name,
            },
            params.admin_id,
        ))
    }
}

impl RbdBackend {
    /// Creates the new volume from its (checked) source through the volume core, holding the
    /// source's protection finalizer meanwhile.
    async fn clone_from(
        &self,
        cluster: &ceph_rbd::Cluster,
        new: &NewImage<'_>,
        claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
        source: &Resolved,
        (class_cluster, class_monitors): (&ClusterRef, &str),
        encrypted: Option<&Encrypted<'_>>,
    ) -> Result<(), ProvisionError> {
        use rbd_volume::snapshot::{self, NewClone, SnapshotError, Source};
        let ns = claim.metadata.namespace.as_deref().unwrap_or("default");
        let (source_cluster, source_pool, source_image, source_id, is_snapshot) = match source {
            Resolved::Snapshot {
                snapshot: id,
                handle,
                ..
            } => (&id.cluster, id.pool_spec(), &id.image, handle.clone(), true),
            Resolved::Volume {
                volume: location, ..
            } => (
                &location.cluster,
                location.pool_spec(),
                &location.image,
                location
                    .volume_id()
                    .encode()
                    .map_err(ProvisionError::final_error)?,
                false,
            ),
        };
        // the same cluster: the same clusterID, or the same monitors (a name looked up now)
        let same_cluster = source_cluster == class_cluster
            || self.monitors_of(source_cluster).ok().as_deref() == Some(class_monitors);
        if !same_cluster {
            return Err(ProvisionError::final_error(format!(
                "the data source is on the Ceph cluster {source_cluster}, the StorageClass \
                 provisions on {class_cluster}: a volume can only be created from a source on \
                 the same cluster"
            )));
        }
        let source_ref = if is_snapshot {
            Source::Snapshot {
                pool: &source_pool,
                image: source_image,
            }
        } else {
            Source::Volume {
                pool: &source_pool,
                image: source_image,
            }
        };
        // a restore or clone is encrypted exactly when its source is
        let source_encrypted =
            rbd_volume::encryption::is_encrypted(cluster, &source_pool, source_image)
                .await
                .map_err(|e| ProvisionError::final_error(format!("the data source: {e}")))?;
        rbd_volume::encryption::check_source(
            &format!("{source_pool}/{source_image}"),
            source_encrypted,
            encrypted.map(|e| e.settings),
        )
        .map_err(|e| ProvisionError::final_error(class_parameter_error(e)))?;
        provisioner::data_source::protection::protect(&self.client, ns, &source.data_source())
            .await
            .map_err(ProvisionError::final_error)?;
        let clone = NewClone::of(new, source_ref, &source_id, &self.config.csi_driver);
        match snapshot::clone_volume(cluster, &clone).await {
            Ok(_) => {}
            Err(SnapshotError::Volume(e)) => return Err(provision_error(e)),
            Err(e) => return Err(ProvisionError::final_error(e)),
        }
        crashpoint::hit("after-volume-clone");
        if let Some(encrypted) = encrypted {
            let source = rbd_volume::encryption::Target {
                cluster,
                pool: &source_pool,
                image: source_image,
                volume_id: &source_id,
                tenant: encrypted.settings.tenant.as_deref(),
            };
            encrypted.store_key(cluster, new, Some(&source)).await?;
        }
        // The source keeps its protection finalizer until this claim is Bound (the PV saved):
        // the protection controller takes it off then, as external-provisioner does. Released
        // here, the source could be deleted while a crash before the PV save still needs it.
        Ok(())
    }
}

/// A volume being made encrypted: its settings (tenant: the claim's namespace), its KMS and its
/// CSI volume handle (which the KMSs key and salt by, as the node reads it from the PV).
struct Encrypted<'a> {
    settings: &'a Encryption,
    kms: Box<dyn Kms>,
    volume_id: String,
}

impl Encrypted<'_> {
    /// The create-time step of the volume core, after the image exists: its key stored (a new
    /// one, or its source's for a restore or clone).
    async fn store_key(
        &self,
        cluster: &ceph_rbd::Cluster,
        new: &NewImage<'_>,
        source: Option<&rbd_volume::encryption::Target<'_>>,
    ) -> Result<(), ProvisionError> {
        let target = rbd_volume::encryption::Target {
            cluster,
            pool: new.pool,
            image: new.image,
            volume_id: &self.volume_id,
            tenant: self.settings.tenant.as_deref(),
        };
        rbd_volume::encryption::prepare(&target, self.kms.as_ref(), source)
            .await
            .map_err(|e| {
                let text = format!("storing the volume's key: {e}");
                match e {
                    rbd_volume::encryption::EncryptionError::Ceph { .. } => {
                        ProvisionError::in_background(text)
                    }
                    _ => ProvisionError::final_error(text),
                }
            })
    }
}

/// An encryption parameter problem as the class's (the built-in provisioner's wording).
fn class_parameter_error(e: rbd_volume::encryption::EncryptionError) -> String {
    match e {
        rbd_volume::encryption::EncryptionError::Parameter { field, problem } => {
            format!("StorageClass parameter {field:?}: {problem}")
        }
        other => other.to_string(),
    }
}

/// The crash points of the binary (`crashpoint.rs`) at the volume core's steps.
const CRASH_POINTS: Hooks = Hooks {
    step: crash_at_step,
    owner_key_written,
};

fn crash_at_step(step: Step) {
    crashpoint::hit(step.name());
}

/// Called by ceph-rbd after each owner key is written (crash point between keys).
fn owner_key_written(_key: &str) {
    crashpoint::hit("after-image-owner-key");
}

/// Volume core errors while provisioning: a timeout may hide a create that happened.
fn provision_error(e: rbd_volume::Error) -> ProvisionError {
    if e.is_timeout() {
        ProvisionError::in_background(e)
    } else {
        ProvisionError::final_error(e)
    }
}

#[async_trait]
impl Provisioner for RbdBackend {
    async fn provision(&self, options: ProvisionOptions) -> Result<Provisioned, ProvisionError> {
        let class = &options.storage_class;
        let raw = class.parameters.clone().unwrap_or_default();
        let params = Parameters::parse(&raw).map_err(ProvisionError::final_error)?;
        claim::check_modes(&options.claim).map_err(ProvisionError::final_error)?;
        let request = provisioner::quantity::claim_request(&options.claim).map(|q| q.0.as_str());
        let size = claim::image_size(request).map_err(ProvisionError::final_error)?;
        let key = secrets::read_key(
            &self.client,
            &params.admin_secret_namespace,
            &params.admin_secret_name,
        )
        .await
        .map_err(ProvisionError::final_error)?;
        // monitors as they go into the PV: the class's, or the cluster config's now
        let class_cluster = match &params.cluster_id {
            Some(id) => ClusterRef::Named(id.clone()),
            None => ClusterRef::Monitors(params.monitors_string()),
        };
        let class_monitors = self.monitors_of(&class_cluster).map_err(|e| {
            ProvisionError::final_error(format!("StorageClass parameter \"clusterID\": {e}"))
        })?;
        let namespace = params
            .rados_namespace
            .clone()
            .or_else(|| {
                params
                    .cluster_id
                    .as_deref()
                    .and_then(|id| self.default_namespace(id))
            })
            .unwrap_or_default();
        let source = self.pv_source(&params).await;
        if source == PvSource::InTree && !namespace.is_empty() {
            return Err(ProvisionError::final_error(
                crate::backend::pv_build::namespace_needs_csi(&namespace),
            ));
        }
        // An encrypted class's KMS entry is resolved before anything is made; the claim's
        // namespace is the tenant (ceph-csi's default secretNamespace of a metadata KMS).
        let encryption = params.encryption.clone().map(|mut e| {
            e.tenant.clone_from(&options.claim.metadata.namespace);
            e
        });
        if encryption.is_some() && source == PvSource::InTree {
            return Err(ProvisionError::final_error(
                crate::backend::pv_build::encryption_needs_csi(),
            ));
        }
        let kms = match &encryption {
            Some(e) => Some(
                self.kms(&e.kms_id)
                    .await
                    .map_err(ProvisionError::final_error)?,
            ),
            None => None,
        };
        let placement = place(
            &params,
            options.selected_node.as_ref(),
            &self.config.topology_labels,
        )?;
        let (pool, data_pool) = match &placement {
            Some(Placement {
                pool, data_pool, ..
            }) => (pool.clone(), data_pool.clone()),
            None => (params.pool.clone(), params.data_pool.clone()),
        };
        let monitors = monitors::resolve(&class_monitors)
            .await
            .map_err(ProvisionError::final_error)?;
        let cluster = self
            .cluster(&monitors, &params.admin_id, key)
            .await
            .map_err(ProvisionError::final_error)?;

        let image = self.config.naming.image_name(&options.pv_name);
        let claim_meta = &options.claim.metadata;
        let owner = Owner {
            pv: options.pv_name.clone(),
            claim: format!(
                "{}/{}",
                claim_meta.namespace.as_deref().unwrap_or_default(),
                claim_meta.name.as_deref().unwrap_or_default()
            ),
            provisioner: self.config.identity.clone(),
            kube_cluster: self.config.kube_cluster.clone(),
        };
        let create_options = CreateOptions {
            format: Some(params.image_format),
            features: (params.image_format == 2).then_some(params.image_features),
            data_pool,
            object_size: params.object_size,
            stripe_unit: params.stripe_unit,
            stripe_count: params.stripe_count,
        };
        let pool_spec = ceph_rbd::pool_spec(&pool, &namespace);
        let encrypted = match (&encryption, kms) {
            (Some(settings), Some(kms)) => Some(Encrypted {
                settings,
                kms,
                volume_id: crate::backend::pv_build::csi_handle(
                    params.cluster_id.as_deref(),
                    &class_monitors,
                    &pool,
                    &namespace,
                    &image,
                )
                .map_err(ProvisionError::final_error)?,
            }),
            _ => None,
        };
        let new = NewImage {
            pool: &pool_spec,
            image: &image,
            size,
            options: &create_options,
            owner: &owner,
            fit: Fit::Grow,
        };
        let sources = RbdSources {
            snapshot_drivers: self.snapshot_drivers(),
            csi_driver: &self.config.csi_driver,
        };
        let data_source = checks::resolve(&self.client, &sources, &options.claim)
            .await
            .map_err(ProvisionError::final_error)?;
        match &data_source {
            None => {
                rbd_volume::ensure(&cluster, &new, &CRASH_POINTS)
                    .await
                    .map_err(provision_error)?;
                if let Some(encrypted) = &encrypted {
                    encrypted.store_key(&cluster, &new, None).await?;
                }
            }
            Some(source) => {
                self.clone_from(
                    &cluster,
                    &new,
                    &options.claim,
                    source,
                    (&class_cluster, &class_monitors),
                    encrypted.as_ref(),
                )
                .await?;
            }
        }

        let volume = build_volume(&VolumeInputs {
            params: &params,
            claim: &options.claim,
            monitors: class_monitors,
            cluster_id: params.cluster_id.as_deref(),
            pool: &pool,
            namespace: &namespace,
            node_affinity: placement.as_ref().map(|p| &p.node_labels),
            image,
            size_bytes: size,
            source,
            csi_driver: &self.config.csi_driver,
            identity: &self.config.identity,
            encryption: encryption.as_ref(),
        })
        .map_err(ProvisionError::final_error)?;
        Ok(Provisioned {
            volume,
            deletion_secret: Some(SecretRef {
                namespace: params.admin_secret_namespace.clone(),
                name: params.admin_secret_name.clone(),
            }),
        })
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let pv_name = volume.metadata.name.clone().unwrap_or_default();
        if image_location(volume, &self.config.csi_driver).is_none() {
            return Err(DeleteError::ignored(format!(
                "PV {pv_name} has no RBD image source of ours"
            )));
        }
        let (location, cluster) = self
            .connect_to_pv(volume)
            .await
            .map_err(DeleteError::failed)?;
        let (pool, image) = (&location.pool_spec(), &location.image);
        let claimant = Claimant::volume(pv_name.clone()).in_kube_cluster(&self.config.kube_cluster);
        // the key of an encrypted CSI volume is stored under its volume handle
        let volume_id = volume
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.as_str())
            .unwrap_or_default();
        // the owner record is read from the image header (no open) before the removal, which
        // librbd refuses for a watched image; snapshot images and clone intermediates made from
        // this volume (CSI snapshots) are released first
        self.delete_with_key(
            (&cluster, pool, image),
            volume_id,
            rbd_volume::delete_volume(&cluster, pool, image, &claimant, &CRASH_POINTS),
        )
        .await
        .map_err(DeleteError::failed)?;
        Ok(())
    }

    fn supports_block(&self) -> bool {
        true
    }

    /// The old provisioner's `-id` meaning: a PV carrying `rbdProvisionerIdentity` is deleted
    /// only by the provisioner with that identity, so several provisioners with different ids
    /// on one cluster never delete each other's volumes. PVs without the annotation (CSI PVs of
    /// other tools, hand-made ones) are not restricted by it.
    fn should_delete(&self, volume: &PersistentVolume) -> bool {
        deletes_as(volume, &self.config.identity)
    }
}

/// Whether the provisioner with `identity` may delete `volume` (see `should_delete`).
fn deletes_as(volume: &PersistentVolume, identity: &str) -> bool {
    let recorded = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::backend::pv_build::ANN_LEGACY_IDENTITY));
    match recorded {
        Some(recorded) if recorded != identity => {
            tracing::debug!(
                volume = volume.metadata.name.as_deref().unwrap_or_default(),
                %recorded,
                ours = identity,
                "leaving the PV to the provisioner with its identity"
            );
            false
        }
        _ => true,
    }
}

#[async_trait]
impl Expander for RbdBackend {
    async fn expand(
        &self,
        volume: &PersistentVolume,
        new_size_bytes: u64,
    ) -> Result<ExpandOutcome, ExpandError> {
        let (location, cluster) = self.connect_to_pv(volume).await.map_err(ExpandError::new)?;
        let size = claim::size_in_mib(new_size_bytes).ok_or_else(|| {
            ExpandError::new(format!(
                "requested size {new_size_bytes} bytes is larger than the largest RBD image, {}",
                rbd_volume::size::MAX_SIZE_TEXT
            ))
        })?;
        let grown = rbd_volume::grow(
            &cluster,
            &location.pool_spec(),
            &location.image,
            size,
            &CRASH_POINTS,
        )
        .await
        .map_err(ExpandError::new)?;
        let block = volume.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
        Ok(ExpandOutcome {
            capacity_bytes: grown.size,
            node_expansion_required: !block,
        })
    }
}

/// VolumeAttributesClass modification: the class's `parameters` are librbd QoS limits
/// ([`rbd_volume::qos`]), set on the PV's image. The class must name our CSI driver (or the
/// provisioner name), the PV must be a CSI PV of our driver: an in-tree `rbd` PV is mapped by
/// krbd, which does not enforce librbd limits, so its modification is infeasible.
#[async_trait]
impl provisioner::Modifier for RbdBackend {
    async fn modify(
        &self,
        volume: &PersistentVolume,
        class: &k8s_openapi::api::storage::v1::VolumeAttributesClass,
    ) -> Result<(), provisioner::ModifyError> {
        use provisioner::ModifyError;
        let class_name = class.metadata.name.as_deref().unwrap_or_default();
        if !self
            .snapshot_drivers()
            .contains(&class.driver_name.as_str())
        {
            return Err(ModifyError::infeasible(format!(
                "VolumeAttributesClass {class_name} is for driver {:?}, not {:?}",
                class.driver_name, self.config.csi_driver
            )));
        }
        let spec = volume.spec.as_ref();
        if spec.is_some_and(|s| s.rbd.is_some()) {
            return Err(ModifyError::infeasible(
                "the PV has an in-tree rbd source, mapped by krbd, which does not enforce librbd QoS limits; VolumeAttributesClass applies to CSI PVs of our driver (see `rbd-provisioner migrate`)",
            ));
        }
        if image_location(volume, &self.config.csi_driver).is_none() {
            return Err(ModifyError::infeasible(format!(
                "the PV is not a CSI PV of driver {:?}",
                self.config.csi_driver
            )));
        }
        let qos = rbd_volume::qos::parse(class.parameters.iter().flatten()).map_err(|e| {
            ModifyError::infeasible(format!("VolumeAttributesClass {class_name}: {e}"))
        })?;
        let (location, cluster) = self
            .connect_to_pv(volume)
            .await
            .map_err(ModifyError::failed)?;
        match rbd_volume::qos::apply(&cluster, &location.pool_spec(), &location.image, &qos).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_invalid() => Err(ModifyError::infeasible(e)),
            Err(e) => Err(ModifyError::failed(e)),
        }
    }
}
