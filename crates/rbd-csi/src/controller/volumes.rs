//! The controller calls' logic.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ceph_rbd::{CreateOptions, Features};
use tonic::Status;

use super::params::{create_params, credentials};
use super::{ControllerService, META_CLAIM, META_PROVISIONER, META_PV, ceph_status};
use crate::node::request::access;
use crate::proto::csi;
use crate::status::require;
use crate::volume::{self, VolumeId, context};

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Every capability must be one we can serve.
fn check_capabilities(caps: &[csi::VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    for (i, cap) in caps.iter().enumerate() {
        access(Some(cap), &format!("volume_capabilities[{i}]"))?;
    }
    Ok(())
}

pub(super) async fn create(
    ctl: &ControllerService,
    req: csi::CreateVolumeRequest,
) -> Result<csi::CreateVolumeResponse, Status> {
    let name = require(&req.name, "name")?;
    check_capabilities(&req.volume_capabilities)?;
    if req.volume_content_source.is_some() {
        return Err(Status::invalid_argument(
            "volume_content_source (snapshots, clones) is not supported",
        ));
    }
    let params = create_params(&req.parameters, ctl.default_monitors.as_deref())?;
    let (user, key) = credentials(&req.secrets)?;
    let (required, limit) = req
        .capacity_range
        .as_ref()
        .map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let size = volume::size_for_range(required, limit).map_err(Status::out_of_range)?;
    let image = volume::image_name(name);
    let volume_id = VolumeId::new(&params.monitors, &params.pool, &image)
        .encode()
        .map_err(Status::invalid_argument)?;
    let features = params
        .image_features
        .as_deref()
        .map(Features::parse)
        .transpose()
        .map_err(|e| Status::invalid_argument(format!("parameters.imageFeatures: {e}")))?;
    let _guard = ctl.locks.lock_or_abort(name)?;
    let cluster = ctl.cluster(&params.monitors, &user, &key).await?;
    let pool = params.pool.as_str();

    let existing = match cluster.image_info(pool, &image).await {
        Ok(info) => Some(info.size),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(ceph_status(e)),
    };
    let capacity = if let Some(existing_size) = existing {
        check_owner(&cluster, pool, &image, name).await?;
        if !volume::size_compatible(existing_size, required, limit) {
            return Err(Status::already_exists(format!(
                "volume {name} exists with {existing_size} bytes, incompatible with \
                 required_bytes={required} limit_bytes={limit}"
            )));
        }
        tracing::info!(name, pool, image = %image, "volume already exists");
        existing_size
    } else {
        let opts = CreateOptions {
            features,
            data_pool: params.data_pool.clone(),
            ..CreateOptions::default()
        };
        match cluster.create_image(pool, &image, size, &opts).await {
            Ok(()) => {}
            // Lost a race with another creator of the same name: ownership decides below.
            Err(e) if e.is_already_exists() => check_owner(&cluster, pool, &image, name).await?,
            Err(e) => return Err(ceph_status(e)),
        }
        tracing::info!(name, pool, image = %image, size, "volume created");
        size
    };
    // one open for the whole record, the PV key last (a record cut short reads as none)
    let mut owner = vec![(META_PROVISIONER.to_owned(), ctl.driver_name.clone())];
    if let Some(claim) = &params.claim {
        owner.push((META_CLAIM.to_owned(), claim.clone()));
    }
    owner.push((META_PV.to_owned(), name.to_owned()));
    cluster
        .metadata_set_many(pool, &image, owner, None)
        .await
        .map_err(ceph_status)?;

    let mut volume_context = HashMap::from([
        (context::MONITORS.to_owned(), params.monitors.clone()),
        (context::POOL.to_owned(), params.pool.clone()),
        (context::IMAGE.to_owned(), image.clone()),
    ]);
    if let Some(u) = &params.node_user {
        volume_context.insert(context::USER.to_owned(), u.clone());
    }
    if let Some(m) = params.mounter {
        volume_context.insert(context::MOUNTER.to_owned(), m.as_str().to_owned());
    }
    Ok(csi::CreateVolumeResponse {
        volume: Some(csi::Volume {
            capacity_bytes: to_i64(capacity),
            volume_id,
            volume_context,
            content_source: None,
            accessible_topology: Vec::new(),
        }),
    })
}

/// `ALREADY_EXISTS` unless the image is unowned (a crash between create and the metadata write:
/// ours to finish) or owned by `name`.
async fn check_owner(
    cluster: &ceph_rbd::Cluster,
    pool: &str,
    image: &str,
    name: &str,
) -> Result<(), Status> {
    match cluster
        .metadata_get(pool, image, META_PV)
        .await
        .map_err(ceph_status)?
    {
        Some(owner) if owner != name => Err(Status::already_exists(format!(
            "image {pool}/{image} exists and belongs to {owner:?}, not {name:?}"
        ))),
        _ => Ok(()),
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
    let cluster = ctl.cluster(&id.monitors, &user, &key).await?;
    // EBUSY with no watcher left is the tail of a client that just closed the image (its watch
    // is still being torn down): retry briefly. Real watchers (a mapped volume) fail at once.
    let mut delay = Duration::from_millis(100);
    let deadline = Instant::now() + BUSY_RETRY_FOR;
    loop {
        match cluster.remove_image(&id.pool, &id.image).await {
            Ok(()) => {
                tracing::info!(volume_id, "volume deleted");
                return Ok(());
            }
            Err(e) if e.is_not_found() => return Ok(()),
            Err(ceph_rbd::Error::Busy { .. }) if Instant::now() + delay < deadline => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => return Err(ceph_status(e)),
        }
    }
}

/// How long `DeleteVolume` retries an EBUSY without watchers.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(3);

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
    let cluster = ctl.cluster(&id.monitors, &user, &key).await?;
    let current = cluster
        .image_info(&id.pool, &id.image)
        .await
        .map_err(ceph_status)?
        .size;
    let capacity = if current >= new_size {
        current
    } else {
        cluster
            .resize_image(&id.pool, &id.image, new_size, false)
            .await
            .map_err(ceph_status)?;
        tracing::info!(volume_id, from = current, to = new_size, "volume expanded");
        new_size
    };
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
        let cluster = ctl.cluster(&id.monitors, &user, &key).await?;
        cluster
            .image_info(&id.pool, &id.image)
            .await
            .map_err(ceph_status)?;
    }
    if let Err(status) = check_capabilities(&req.volume_capabilities) {
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
    let cluster = ctl
        .cluster(&params.monitors, &creds.user, &creds.key)
        .await?;
    // The pool must exist; its usage is what we can report per pool.
    cluster
        .pool_stats(&params.pool)
        .await
        .map_err(ceph_status)?;
    let stats = cluster.cluster_stats().await.map_err(ceph_status)?;
    Ok(csi::GetCapacityResponse {
        available_capacity: to_i64(stats.avail_bytes),
        maximum_volume_size: Some(to_i64(volume::MAX_SIZE)),
        minimum_volume_size: Some(to_i64(volume::MIB)),
    })
}
