//! The controller calls' logic.

use std::collections::HashMap;

use ceph_rbd::{CreateOptions, Features};
use rbd_volume::{Claimant, Fit, NewClone, NewImage, Owner, SnapshotId, Source};
use tonic::Status;

use rbd_volume::clusters::ClusterRef;

use super::params::{create_params, credentials};
use super::placement::{Placement, place};
use super::snapshots::snapshot_status;
use super::{ControllerService, ceph_status, volume_status};
use crate::node::request::{access, mode, single_node_writer};
use crate::proto::csi;
use crate::proto::csi::volume_capability::access_mode::Mode;
use crate::status::require;
use crate::volume::{self, VolumeId, context};

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Every capability must be one we can serve, and together they must not ask for a volume
/// many nodes read while one node writes ([`mixes_single_writer_and_multi_reader`]).
fn check_capabilities(caps: &[csi::VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    for (i, cap) in caps.iter().enumerate() {
        access(Some(cap), &format!("volume_capabilities[{i}]"))?;
    }
    let modes: Vec<Mode> = caps.iter().map(|cap| mode(Some(cap))).collect();
    if mixes_single_writer_and_multi_reader(&modes) {
        return Err(Status::invalid_argument(
            "volume_capabilities: MULTI_NODE_READER_ONLY together with a single-node writer mode \
             (a claim's ReadOnlyMany with ReadWriteOnce) is not supported: Kubernetes would \
             attach such a volume to several nodes, each of which could write; ask for one of \
             the two",
        ));
    }
    Ok(())
}

/// Whether `modes` ask for multi-node readers and a single-node writer without any multi-node
/// writer mode: what external-provisioner sends for a claim with `ReadWriteOnce` and
/// `ReadOnlyMany`, which external-attacher then refuses to attach (a `ReadWriteMany` claim's
/// `MULTI_NODE_MULTI_WRITER` takes precedence there, as here).
fn mixes_single_writer_and_multi_reader(modes: &[Mode]) -> bool {
    modes.contains(&Mode::MultiNodeReaderOnly)
        && modes.iter().any(|m| single_node_writer(*m))
        && !modes
            .iter()
            .any(|m| matches!(m, Mode::MultiNodeMultiWriter | Mode::MultiNodeSingleWriter))
}

/// A parsed `volume_content_source`.
struct ContentSource {
    /// The snapshot or volume ID as given (recorded on the new volume).
    id: String,
    source: Content,
}

enum Content {
    Snapshot(SnapshotId),
    Volume(VolumeId),
}

/// The content source, if any; an ID that is not one of ours cannot exist: `NOT_FOUND`.
fn content_source(
    source: Option<&csi::VolumeContentSource>,
) -> Result<Option<ContentSource>, Status> {
    use csi::volume_content_source::Type;
    let Some(source) = source else {
        return Ok(None);
    };
    match &source.r#type {
        Some(Type::Snapshot(s)) => {
            let id = require(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?;
            let parsed = SnapshotId::parse(id).map_err(|e| {
                Status::not_found(format!("volume_content_source.snapshot.snapshot_id: {e}"))
            })?;
            Ok(Some(ContentSource {
                id: id.to_owned(),
                source: Content::Snapshot(parsed),
            }))
        }
        Some(Type::Volume(v)) => {
            let id = require(&v.volume_id, "volume_content_source.volume.volume_id")?;
            let parsed = VolumeId::parse(id).map_err(|e| {
                Status::not_found(format!("volume_content_source.volume.volume_id: {e}"))
            })?;
            Ok(Some(ContentSource {
                id: id.to_owned(),
                source: Content::Volume(parsed),
            }))
        }
        None => Err(Status::invalid_argument(
            "volume_content_source.type is required (snapshot or volume)",
        )),
    }
}

/// What nodes need to stage the volume: the cluster (monitors, or the `clusterID` the node looks
/// up when it stages), pool, namespace, image, user and mapper.
fn volume_context(
    params: &super::CreateParams,
    place: &Placement,
    image: &str,
) -> HashMap<String, String> {
    let mut volume_context = HashMap::from([
        (context::POOL.to_owned(), place.pool.clone()),
        (context::IMAGE.to_owned(), image.to_owned()),
    ]);
    match &place.cluster {
        ClusterRef::Monitors(m) => volume_context.insert(context::MONITORS.to_owned(), m.clone()),
        ClusterRef::Named(n) => volume_context.insert(context::CLUSTER_ID.to_owned(), n.clone()),
    };
    if !place.namespace.is_empty() {
        volume_context.insert(context::NAMESPACE.to_owned(), place.namespace.clone());
    }
    if let Some(u) = &params.node_user {
        volume_context.insert(context::USER.to_owned(), u.clone());
    }
    if let Some(m) = params.mounter {
        volume_context.insert(context::MOUNTER.to_owned(), m.as_str().to_owned());
    }
    if let Some(o) = &params.map_options {
        volume_context.insert(context::MAP_OPTIONS.to_owned(), o.clone());
    }
    if let Some(o) = &params.unmap_options {
        volume_context.insert(context::UNMAP_OPTIONS.to_owned(), o.clone());
    }
    if let Some(enc) = &params.encryption {
        volume_context.extend(rbd_volume::encryption::context(enc));
    }
    volume_context
}

pub(super) async fn create(
    ctl: &ControllerService,
    req: csi::CreateVolumeRequest,
) -> Result<csi::CreateVolumeResponse, Status> {
    let name = require(&req.name, "name")?;
    check_capabilities(&req.volume_capabilities)?;
    let content = content_source(req.volume_content_source.as_ref())?;
    // refused before anything is created; applied once the image exists
    let qos = super::modify::parse(&req.mutable_parameters)?;
    let params = create_params(&req.parameters, ctl.default_monitors.as_deref())?;
    let (user, key) = credentials(&req.secrets)?;
    let (required, limit) = req
        .capacity_range
        .as_ref()
        .map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let size = volume::size_for_range(required, limit).map_err(Status::out_of_range)?;
    let info = ctl.cluster_info(&params.cluster)?;
    let place = place(
        &params,
        info.as_ref(),
        req.accessibility_requirements.as_ref(),
        &ctl.driver_name,
    )?;
    let pool = place.pool_spec();
    let image = volume::image_name(name);
    let volume_id = VolumeId::located(place.cluster.clone(), &place.pool, &place.namespace, &image)
        .encode()
        .map_err(Status::invalid_argument)?;
    let features = params
        .image_features
        .as_deref()
        .map(Features::parse)
        .transpose()
        .map_err(|e| Status::invalid_argument(format!("parameters.imageFeatures: {e}")))?;
    // An encrypted class's KMS entry is resolved before anything is made.
    let kms = match &params.encryption {
        Some(enc) => Some(kms_for(&ctl.kms_config, ctl.secrets.clone(), &enc.kms_id).await?),
        None => None,
    };
    let source = content
        .as_ref()
        .map(|c| locate(&place.cluster, c))
        .transpose()?;
    let _guard = ctl.locks.lock_or_abort(name)?;
    let cluster = ctl.cluster(&place.cluster, &user, &key).await?;
    // a namespace that does not exist is the class's mistake, said before anything is made
    rbd_volume::check_namespace(&cluster, &pool)
        .await
        .map_err(volume_status)?;
    if let Some(source) = &source {
        check_source_encryption(&cluster, source, &params).await?;
    }
    let options = CreateOptions {
        features,
        data_pool: place.data_pool.clone(),
        ..CreateOptions::default()
    };
    let owner = Owner {
        pv: name.to_owned(),
        claim: params.claim.clone().unwrap_or_default(),
        provisioner: ctl.driver_name.clone(),
        kube_cluster: ctl.kube_cluster.clone(),
    };
    // required/limit are non-negative here: size_for_range checked them
    let fit = Fit::Within {
        required: u64::try_from(required).unwrap_or(0),
        limit: u64::try_from(limit).unwrap_or(0),
    };
    let new = NewImage {
        pool: &pool,
        image: &image,
        size,
        options: &options,
        owner: &owner,
        fit,
    };
    ctl.remember(&place.cluster, &pool);
    let ensured = match &source {
        None => rbd_volume::ensure(&cluster, &new, &ctl.hooks)
            .await
            .map_err(volume_status)?,
        Some(source) => clone_from(ctl, &cluster, &new, source).await?,
    };
    super::modify::apply(&cluster, &pool, &image, &qos).await?;
    if let (Some(kms), Some(enc)) = (&kms, &params.encryption) {
        let target = rbd_volume::encryption::Target {
            cluster: &cluster,
            pool: &pool,
            image: &image,
            volume_id: &volume_id,
            tenant: enc.tenant.as_deref(),
        };
        store_key(&target, kms.as_ref(), source.as_ref()).await?;
    }
    let capacity = ensured.size;

    Ok(csi::CreateVolumeResponse {
        volume: Some(csi::Volume {
            capacity_bytes: to_i64(capacity),
            volume_id,
            volume_context: volume_context(&params, &place, &image),
            content_source: req.volume_content_source,
            accessible_topology: place.topology,
        }),
    })
}

/// The KMS of entry `kms_id` (a class's `encryptionKMSID`), from the KMS configuration file.
pub(super) async fn kms_for(
    path: &std::path::Path,
    secrets: Option<std::sync::Arc<dyn rbd_volume::encryption::secrets::SecretStore>>,
    kms_id: &str,
) -> Result<Box<dyn rbd_volume::encryption::Kms>, Status> {
    use rbd_volume::encryption::EncryptionError;
    rbd_volume::encryption::load_kms(path, secrets, kms_id)
        .await
        .map_err(|e| match e {
            EncryptionError::Config { .. } => Status::failed_precondition(e.to_string()),
            e => Status::invalid_argument(format!(
                "parameters.{}: {e}",
                rbd_volume::encryption::PARAM_KMS_ID
            )),
        })
}

/// A content source and where it is.
struct Located<'a> {
    content: &'a ContentSource,
    /// The pool spec of its image, on the new volume's cluster.
    pool: String,
    image: &'a str,
}

/// Where a content source is: its pool spec and image, on the new volume's cluster.
fn locate<'a>(cluster_ref: &ClusterRef, content: &'a ContentSource) -> Result<Located<'a>, Status> {
    let (source_cluster, source_pool, image) = match &content.source {
        Content::Snapshot(id) => (&id.cluster, id.pool_spec(), &id.image),
        Content::Volume(id) => (&id.cluster, id.pool_spec(), &id.image),
    };
    Ok(Located {
        content,
        pool: source_in(cluster_ref, source_cluster, source_pool)?,
        image,
    })
}

/// Stores an encrypted volume's key through its KMS once its image exists; a clone or a
/// restore gets its source's key.
async fn store_key(
    target: &rbd_volume::encryption::Target<'_>,
    kms: &dyn rbd_volume::encryption::Kms,
    source: Option<&Located<'_>>,
) -> Result<(), Status> {
    let source = source.map(|s| rbd_volume::encryption::Target {
        pool: &s.pool,
        image: s.image,
        volume_id: &s.content.id,
        ..*target
    });
    rbd_volume::encryption::prepare(target, kms, source.as_ref())
        .await
        .map_err(|e| Status::failed_precondition(format!("storing the volume's key: {e}")))
}

/// A restore or clone must be encrypted exactly when its source is.
async fn check_source_encryption(
    cluster: &ceph_rbd::Cluster,
    source: &Located<'_>,
    params: &super::CreateParams,
) -> Result<(), Status> {
    let encrypted = rbd_volume::encryption::is_encrypted(cluster, &source.pool, source.image)
        .await
        .map_err(|e| {
            let status = ceph_status(e);
            Status::new(
                status.code(),
                format!("volume_content_source: {}", status.message()),
            )
        })?;
    rbd_volume::encryption::check_source(
        &format!("{}/{}", source.pool, source.image),
        encrypted,
        params.encryption.as_ref(),
    )
    .map_err(|e| Status::invalid_argument(format!("parameters: {e}")))
}

/// Makes the volume `new` as a clone of `source` (a snapshot or a volume).
async fn clone_from(
    ctl: &ControllerService,
    cluster: &ceph_rbd::Cluster,
    new: &NewImage<'_>,
    source: &Located<'_>,
) -> Result<rbd_volume::Ensured, Status> {
    let (pool, image) = (source.pool.as_str(), source.image);
    let from = match &source.content.source {
        Content::Snapshot(_) => Source::Snapshot { pool, image },
        Content::Volume(_) => Source::Volume { pool, image },
    };
    let clone = NewClone::of(new, from, &source.content.id, &ctl.driver_name);
    rbd_volume::clone_volume(cluster, &clone)
        .await
        .map_err(snapshot_status)
}

/// The pool spec of a content source, which must be on the new volume's cluster (a clone is made
/// inside one cluster): else `INVALID_ARGUMENT` naming both.
fn source_in(target: &ClusterRef, source: &ClusterRef, pool: String) -> Result<String, Status> {
    if source == target {
        Ok(pool)
    } else {
        Err(Status::invalid_argument(format!(
            "volume_content_source is on cluster {source}, the new volume on {target}: clones \
             and restores stay within one cluster (give the class the source's monitors or \
             clusterID)"
        )))
    }
}

pub(super) async fn delete(
    ctl: &ControllerService,
    req: csi::DeleteVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let Ok(id) = VolumeId::parse(volume_id) else {
        // Not one of ours, so nothing of ours exists for it: the spec's answer is OK.
        tracing::warn!(
            volume_id,
            "DeleteVolume of a malformed volume id: nothing to delete"
        );
        return Ok(());
    };
    let (user, key) = credentials(&req.secrets)?;
    let _guard = ctl.locks.lock_or_abort(volume_id)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    // The ID names only the image (in its namespace): its owner record must name a volume this
    // is the image of, and no other Kubernetes cluster. Snapshots and clones of it are detached
    // first (they keep working).
    let pool = id.pool_spec();
    let claimant = Claimant::image().in_kube_cluster(&ctl.kube_cluster);
    rbd_volume::encryption::delete_with_key(
        (&cluster, &pool, &id.image),
        volume_id,
        &ctl.kms_config,
        ctl.secrets.clone(),
        rbd_volume::delete_volume(&cluster, &pool, &id.image, &claimant, &ctl.hooks),
    )
    .await
    .map_err(volume_status)?;
    tracing::info!(volume_id, "volume deleted");
    Ok(())
}

pub(super) async fn expand(
    ctl: &ControllerService,
    req: csi::ControllerExpandVolumeRequest,
) -> Result<csi::ControllerExpandVolumeResponse, Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let range = req
        .capacity_range
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
    if range.required_bytes <= 0 && range.limit_bytes <= 0 {
        return Err(Status::invalid_argument(
            "capacity_range.required_bytes is required",
        ));
    }
    let id = VolumeId::parse(volume_id).map_err(Status::not_found)?;
    let (user, key) = credentials(&req.secrets)?;
    let new_size = volume::size_for_range(range.required_bytes, range.limit_bytes)
        .map_err(Status::out_of_range)?;
    let _guard = ctl.locks.lock_or_abort(volume_id)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    let grown = rbd_volume::grow(&cluster, &id.pool_spec(), &id.image, new_size, &ctl.hooks)
        .await
        .map_err(volume_status)?;
    if grown.size > grown.from {
        tracing::info!(
            volume_id,
            from = grown.from,
            to = grown.size,
            "volume expanded"
        );
    }
    let capacity = grown.size;
    let block = req.volume_capability.as_ref().is_some_and(|c| {
        matches!(
            c.access_type,
            Some(csi::volume_capability::AccessType::Block(_))
        )
    });
    Ok(csi::ControllerExpandVolumeResponse {
        capacity_bytes: to_i64(capacity),
        node_expansion_required: !block,
    })
}

pub(super) async fn validate(
    ctl: &ControllerService,
    req: csi::ValidateVolumeCapabilitiesRequest,
) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    if req.volume_capabilities.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    let id = VolumeId::parse(volume_id).map_err(Status::not_found)?;
    // With secrets we can (and must) say NOT_FOUND for a missing volume.
    if let Ok((user, key)) = credentials(&req.secrets) {
        let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
        cluster
            .image_info(&id.pool_spec(), &id.image)
            .await
            .map_err(ceph_status)?;
    }
    let checked = check_capabilities(&req.volume_capabilities)
        .and_then(|()| super::modify::parse(&req.mutable_parameters).map(drop));
    if let Err(status) = checked {
        return Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message: status.message().to_owned(),
        });
    }
    Ok(csi::ValidateVolumeCapabilitiesResponse {
        confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        }),
        message: String::new(),
    })
}

/// Space available for new volumes: the cluster's raw available bytes (memstore clusters
/// without a mgr report 0). Needs [`crate::CsiConfig::probe`] credentials: `GetCapacity` carries
/// no secrets.
pub(super) async fn capacity(
    ctl: &ControllerService,
    req: csi::GetCapacityRequest,
) -> Result<csi::GetCapacityResponse, Status> {
    let creds = ctl.capacity_cluster.as_ref().ok_or_else(|| {
        Status::failed_precondition(
            "GetCapacity needs cluster credentials (CsiConfig.probe); none configured",
        )
    })?;
    let default_monitors = ctl
        .default_monitors
        .as_deref()
        .unwrap_or(creds.monitors.as_str());
    let params = create_params(&req.parameters, Some(default_monitors))?;
    let info = ctl.cluster_info(&params.cluster)?;
    // the pool (and namespace) a volume of these parameters would get at this topology
    let place = place(
        &params,
        info.as_ref(),
        req.accessible_topology
            .as_ref()
            .map(|t| csi::TopologyRequirement {
                requisite: vec![t.clone()],
                preferred: Vec::new(),
            })
            .as_ref(),
        &ctl.driver_name,
    )?;
    let cluster = ctl.cluster(&place.cluster, &creds.user, &creds.key).await?;
    // The pool must exist; its usage is what we can report per pool.
    cluster.pool_stats(&place.pool).await.map_err(ceph_status)?;
    let stats = cluster.cluster_stats().await.map_err(ceph_status)?;
    Ok(csi::GetCapacityResponse {
        available_capacity: to_i64(stats.avail_bytes),
        maximum_volume_size: Some(to_i64(volume::MAX_SIZE)),
        minimum_volume_size: Some(to_i64(volume::MIB)),
    })
}
