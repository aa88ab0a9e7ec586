//! The CSI `Controller` and `GroupController` services: `CreateVolume`, `DeleteVolume`,
//! `ControllerExpandVolume`, `ValidateVolumeCapabilities`, `GetCapacity`, `ListVolumes`,
//! `ControllerModifyVolume`, snapshots and group snapshots, on librbd through
//! `ceph-rbd` (pooled connections keyed by monitors + user + key).
//!
//! The image lifecycle is the volume core's ([`rbd_volume`]), the one the built-in provisioner
//! uses too: this module translates CSI requests onto it and its errors into CSI codes.
//!
//! **Idempotency** comes from deterministic names, not a journal: the image name is derived from
//! the request name ([`crate::volume::image_name`]), so a retried `CreateVolume` finds its image.
//! The owner (request name, claim, driver) is recorded in the image's metadata with the same keys
//! the built-in provisioner uses ([`META_PV`], [`META_CLAIM`], [`META_PROVISIONER`]); an image of
//! that name owned by another request is `ALREADY_EXISTS`, never adopted. A half-created image (a
//! create killed midway, or an owner record cut short) is repaired by the next `CreateVolume`.
//! `DeleteVolume` refuses (`FAILED_PRECONDITION`) an image whose owner record names a volume it is
//! not the image of. Calls for one volume (or one request name) are serialised: a concurrent
//! second call gets ABORTED.
//!
//! **Publishing** (`ControllerPublishVolume`/`ControllerUnpublishVolume`, `publish.rs`) records
//! the node on the image through [`rbd_volume::publish`] and refuses a single-node volume on a
//! second node.
//!
//! **Listing** (`ListVolumes` with volume conditions, `listing.rs`), **limits**
//! (`ControllerModifyVolume` and `CreateVolume`'s `mutable_parameters`, `modify.rs`) and
//! **volume group snapshots** (the `GroupController` service, `groups.rs`) are thin translations
//! onto the volume core too.
//!
//! **Snapshots and clones** (`CreateSnapshot`, `DeleteSnapshot`, `ListSnapshots`, `CreateVolume`
//! from a snapshot or a volume) are the volume core's [`rbd_volume::snapshot`]: clone-v2 snapshot
//! images, deletes that never break dependents, clone chains flattened past
//! [`rbd_volume::MAX_CHAIN_DEPTH`] parents.

mod groups;
mod listing;
mod modify;
mod pages;
mod params;
mod placement;
mod publish;
mod snapshots;
mod volumes;

use std::collections::BTreeSet;
use std::sync::Mutex;

use std::sync::Arc;
use std::time::Duration;

use ceph_rbd::{ClusterConfig, ConnectionPool, PoolOptions, Secret};
use rbd_volume::clusters::{ClusterConfigFile, ClusterInfo, ClusterRef, LookupError};
use tonic::{Request, Response, Status};

use crate::config::{CsiConfig, ProbeCluster};
use crate::identity::ReadinessProbe;
use crate::locks::VolumeLocks;
use crate::proto::csi::{self, controller_server::Controller, controller_service_capability};

pub use params::{CreateParams, create_params, credentials};

/// The pool `CreateVolume` uses when its parameters name none.
const DEFAULT_POOL: &str = "rbd";

pub use rbd_volume::owner::{META_CLAIM, META_PROVISIONER, META_PV};

/// The Controller service.
#[derive(Clone)]
pub struct ControllerService {
    ceph: ConnectionPool,
    driver_name: String,
    default_monitors: Option<String>,
    /// Credentials for calls that carry no secrets (`GetCapacity`).
    capacity_cluster: Option<ProbeCluster>,
    locks: VolumeLocks,
    /// Called at the volume core's steps (none by default).
    hooks: rbd_volume::Hooks,
    /// The cluster config (`clusterID` to monitors), re-read when it changes.
    clusters: Option<Arc<ClusterConfigFile>>,
    /// Where this controller has served volumes or snapshots: cluster and pool spec
    /// (`pool[/namespace]`), for listing everything.
    locations: Arc<Mutex<BTreeSet<Location>>>,
    /// [`CsiConfig::kube_cluster`].
    kube_cluster: String,
    /// This plugin's own node when it serves the node service too (`--services=all`): the only
    /// node a volume can be published to.
    local_node: Option<String>,
    /// [`CsiConfig::max_volumes_per_node`], enforced by publish for [`Self::local_node`].
    max_volumes_per_node: i64,
    /// [`CsiConfig::kms_config`].
    kms_config: std::path::PathBuf,
    /// [`CsiConfig::secrets`].
    secrets: Option<Arc<dyn rbd_volume::encryption::secrets::SecretStore>>,
}

/// A cluster and a pool spec (`pool` or `pool/namespace`) volumes live in.
pub(crate) type Location = (ClusterRef, String);

impl std::fmt::Debug for ControllerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerService")
            .field("driver_name", &self.driver_name)
            .field("default_monitors", &self.default_monitors)
            .finish_non_exhaustive()
    }
}

impl ControllerService {
    /// A controller for `config` sharing Ceph connections through `ceph`.
    #[must_use]
    pub fn new(config: &CsiConfig, ceph: ConnectionPool) -> Self {
        let mut locations = BTreeSet::new();
        if let Some(monitors) = config
            .default_monitors
            .clone()
            .or_else(|| config.probe.as_ref().map(|p| p.monitors.clone()))
        {
            locations.insert((ClusterRef::Monitors(monitors), DEFAULT_POOL.to_owned()));
        }
        Self {
            ceph,
            driver_name: config.driver_name.clone(),
            default_monitors: config.default_monitors.clone(),
            capacity_cluster: config.probe.clone(),
            locks: VolumeLocks::new(),
            hooks: rbd_volume::Hooks::default(),
            clusters: config.cluster_config.clone(),
            locations: Arc::new(Mutex::new(locations)),
            kube_cluster: config.kube_cluster.clone(),
            local_node: config.services.node().then(|| config.node_id.clone()),
            max_volumes_per_node: config.max_volumes_per_node,
            kms_config: config.kms_config.clone(),
            secrets: config.secrets.clone(),
        }
    }

    /// Notes where volumes or snapshots live, for listing everything.
    fn remember(&self, cluster: &ClusterRef, pool_spec: &str) {
        self.locations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((cluster.clone(), pool_spec.to_owned()));
    }

    /// What [`ControllerService::remember`] noted, and `rbd` of the default monitors.
    fn known_locations(&self) -> Vec<Location> {
        self.locations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// The cluster config entry of `cluster` (`None` for monitors given directly).
    fn cluster_info(&self, cluster: &ClusterRef) -> Result<Option<ClusterInfo>, Status> {
        match cluster {
            ClusterRef::Monitors(_) => Ok(None),
            ClusterRef::Named(name) => match &self.clusters {
                Some(file) => file.lookup(name).map(Some).map_err(lookup_status),
                None => Err(lookup_status(LookupError::NoConfig {
                    cluster: name.clone(),
                })),
            },
        }
    }

    /// The same controller calling `hooks` at the volume core's steps (crash-point tests).
    #[must_use]
    pub fn with_hooks(mut self, hooks: rbd_volume::Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// A connection to `cluster`: its monitors as given, or as the cluster config says now.
    async fn cluster(
        &self,
        cluster: &ClusterRef,
        user: &str,
        key: &str,
    ) -> Result<Arc<ceph_rbd::Cluster>, Status> {
        let monitors = cluster
            .monitors(self.clusters.as_deref())
            .map_err(lookup_status)?;
        let cfg = ClusterConfig::new(monitors, user, Secret::new(key));
        self.ceph.get(&cfg).await.map_err(ceph_status)
    }
}

/// A `clusterID` the cluster config cannot resolve: `INVALID_ARGUMENT` naming it (and the file's
/// problem, if it has one).
#[allow(clippy::needless_pass_by_value)]
fn lookup_status(e: LookupError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The gRPC servers of the `Controller` and `GroupController` services of `config`: one controller
/// (own connection pool, shared per-call locks) behind both.
#[must_use]
pub fn servers(
    config: &CsiConfig,
) -> (
    csi::controller_server::ControllerServer<ControllerService>,
    csi::group_controller_server::GroupControllerServer<ControllerService>,
) {
    let controller = ControllerService::new(config, ConnectionPool::new(PoolOptions::default()));
    (
        csi::controller_server::ControllerServer::new(controller.clone()),
        csi::group_controller_server::GroupControllerServer::new(controller),
    )
}

/// Maps a Ceph error to the CSI code a CO acts on (by value: it is used as `map_err(ceph_status)`).
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn ceph_status(e: ceph_rbd::Error) -> Status {
    use ceph_rbd::Error as E;
    let message = e.to_string();
    match e {
        E::NotFound { .. } => Status::not_found(message),
        E::AlreadyExists { .. } => Status::already_exists(message),
        E::InUse { .. } | E::Busy { .. } | E::HasDependents { .. } => {
            Status::failed_precondition(message)
        }
        E::PermissionDenied { .. } => Status::permission_denied(message),
        E::Timeout { .. } => Status::unavailable(message),
        // the spec's code for "an operation is already pending for this volume"
        E::InProgress { .. } => Status::aborted(message),
        E::InvalidArgument { .. } => Status::invalid_argument(message),
        E::Other { .. } => Status::internal(message),
    }
}

/// Maps a volume core error to its CSI code: another volume's image is `ALREADY_EXISTS` for a
/// create and `FAILED_PRECONDITION` for a delete; an existing image of another size is
/// `ALREADY_EXISTS`.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn volume_status(e: rbd_volume::Error) -> Status {
    use rbd_volume::Error as E;
    match e {
        E::Ceph(e) => ceph_status(e),
        E::Foreign {
            action: rbd_volume::Action::Delete,
            ..
        } => Status::failed_precondition(e.to_string()),
        E::Foreign { .. } | E::SizeMismatch { .. } => Status::already_exists(e.to_string()),
        E::MissingNamespace { .. } => Status::invalid_argument(e.to_string()),
        // the spec's code for "an operation is already pending for this volume"
        E::BeingCreated { .. } => Status::aborted(e.to_string()),
        // retried: the peer site's daemon takes the demotion within seconds
        E::MirrorPeer(_) => Status::unavailable(e.to_string()),
    }
}

/// Probe readiness: Ceph answers a cluster-stats query within a few seconds.
struct CephProbe {
    ceph: ConnectionPool,
    cluster: ProbeCluster,
}

#[async_trait::async_trait]
impl ReadinessProbe for CephProbe {
    async fn ready(&self) -> Result<bool, String> {
        let cfg = ClusterConfig::new(
            &self.cluster.monitors,
            &self.cluster.user,
            Secret::new(self.cluster.key.clone()),
        )
        .with_connect_timeout(Duration::from_secs(5))
        .with_op_timeout(Duration::from_secs(5));
        let result = match self.ceph.get(&cfg).await {
            Ok(cluster) => cluster.cluster_stats().await.map(drop),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(error = %e, "Ceph not reachable");
                Ok(false)
            }
        }
    }
}

/// A readiness probe that checks `cluster`.
#[must_use]
pub fn probe(cluster: &ProbeCluster) -> Arc<dyn ReadinessProbe> {
    Arc::new(CephProbe {
        ceph: ConnectionPool::new(PoolOptions::default()),
        cluster: cluster.clone(),
    })
}

fn rpc_capability(
    kind: controller_service_capability::rpc::Type,
) -> csi::ControllerServiceCapability {
    csi::ControllerServiceCapability {
        r#type: Some(controller_service_capability::Type::Rpc(
            controller_service_capability::Rpc {
                r#type: kind as i32,
            },
        )),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        Ok(Response::new(
            volumes::create(self, request.into_inner()).await?,
        ))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        volumes::delete(self, request.into_inner()).await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        Ok(Response::new(
            volumes::validate(self, request.into_inner()).await?,
        ))
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        Ok(Response::new(
            volumes::capacity(self, request.into_inner()).await?,
        ))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use controller_service_capability::rpc::Type;
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: [
                Type::CreateDeleteVolume,
                Type::ExpandVolume,
                Type::GetCapacity,
                Type::CreateDeleteSnapshot,
                Type::ListSnapshots,
                Type::CloneVolume,
                Type::ListVolumes,
                Type::VolumeCondition,
                Type::ModifyVolume,
                Type::PublishUnpublishVolume,
                Type::PublishReadonly,
            ]
            .into_iter()
            .map(rpc_capability)
            .collect(),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        Ok(Response::new(
            volumes::expand(self, request.into_inner()).await?,
        ))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        Ok(Response::new(
            snapshots::create(self, request.into_inner()).await?,
        ))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        snapshots::delete(self, request.into_inner()).await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Ok(Response::new(
            snapshots::list(self, request.into_inner()).await?,
        ))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        Ok(Response::new(
            listing::list(self, request.into_inner()).await?,
        ))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        Ok(Response::new(
            publish::publish(self, request.into_inner()).await?,
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        publish::unpublish(self, request.into_inner()).await?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        modify::modify(self, request.into_inner()).await?;
        Ok(Response::new(csi::ControllerModifyVolumeResponse {}))
    }
}
