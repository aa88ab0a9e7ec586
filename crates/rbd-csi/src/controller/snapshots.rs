//! `CreateSnapshot`, `DeleteSnapshot`, `ListSnapshots`: CSI translated onto the volume core's
//! snapshots ([`rbd_volume::snapshot`]).
//!
//! **Snapshot ID** `s1/<monitors>/<pool>[/<namespace>]/csi-snap-<32 hex>` (`s2/<clusterID>/...`
//! for a volume of a `clusterID` class; [`SnapshotId`]): the snapshot image is named after the
//! SHA-256 of the request name, in the source volume's pool and namespace, so a retried
//! `CreateSnapshot` finds it and the ID alone (with the call's secrets) locates it.
//!
//! **Listing** reads the snapshot images' records: by ID (one image), by source volume (the
//! snapshot images of the source's pool and namespace), or all (the snapshot images of every
//! cluster, pool and namespace this controller has served since it started, plus `rbd` of the
//! default monitors: Ceph 16's librbd offers us no pool list without the `ceph-rbd` crate growing
//! one). Entries are ordered by snapshot ID and the
//! `next_token` is the last ID returned, so a page continues after it even when it (or any
//! other snapshot) was deleted between pages.

use std::collections::HashMap;
use std::sync::Arc;

use rbd_volume::snapshot::{self, Snapshot, SnapshotError, SnapshotId, SnapshotOwner};
use tonic::Status;

use rbd_volume::clusters::ClusterRef;

use super::params::credentials;
use super::{ControllerService, pages, volume_status};
use crate::proto::csi;
use crate::status::require;
use crate::volume::VolumeId;

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Maps a snapshot error to its CSI code.
#[allow(clippy::needless_pass_by_value)]
pub(super) fn snapshot_status(e: SnapshotError) -> Status {
    match e {
        SnapshotError::Volume(e) => volume_status(e),
        SnapshotError::OtherSnapshot { .. } | SnapshotError::OtherContent { .. } => {
            Status::already_exists(e.to_string())
        }
        SnapshotError::NotFound(_) => Status::not_found(e.to_string()),
        SnapshotError::TooSmall { .. } => Status::out_of_range(e.to_string()),
        SnapshotError::TooManySnapshots { .. } => Status::resource_exhausted(e.to_string()),
    }
}

/// User and key from the call's secrets; without any, the controller's own (`probe`)
/// credentials, as external-snapshotter (and external-resizer for modify) call without secrets
/// unless the class names some.
pub(super) fn call_or_probe_credentials(
    ctl: &ControllerService,
    secrets: &HashMap<String, String>,
) -> Result<(String, String), Status> {
    match (&ctl.capacity_cluster, secrets.is_empty()) {
        (Some(probe), true) => Ok((probe.user.clone(), probe.key.clone())),
        _ => credentials(secrets),
    }
}

/// The CSI message of `snap` (found on `cluster`; its `pool` is a pool spec, `pool[/namespace]`).
pub(super) fn entry(cluster: &ClusterRef, snap: &Snapshot) -> Result<csi::Snapshot, Status> {
    let (pool, namespace) = ceph_rbd::split_pool_spec(&snap.pool).map_err(Status::internal)?;
    let snapshot_id = SnapshotId::located(cluster.clone(), pool, namespace, &snap.image)
        .encode()
        .map_err(Status::internal)?;
    let since = snap
        .created
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Ok(csi::Snapshot {
        size_bytes: to_i64(snap.size),
        snapshot_id,
        source_volume_id: snap.owner.source.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
    })
}

/// Snapshots take no parameters of their own: any key outside `csi.storage.k8s.io/*` is
/// `INVALID_ARGUMENT`, named.
pub(super) fn only_co_parameters(
    parameters: &HashMap<String, String>,
    what: &str,
) -> Result<(), Status> {
    for key in parameters.keys() {
        if !key.starts_with("csi.storage.k8s.io/") {
            return Err(Status::invalid_argument(format!(
                "unknown parameter {key:?} ({what} take no parameters besides csi.storage.k8s.io/*)"
            )));
        }
    }
    Ok(())
}

pub(super) async fn create(
    ctl: &ControllerService,
    req: csi::CreateSnapshotRequest,
) -> Result<csi::CreateSnapshotResponse, Status> {
    let name = require(&req.name, "name")?;
    let source_id = require(&req.source_volume_id, "source_volume_id")?;
    only_co_parameters(&req.parameters, "snapshots")?;
    let source = VolumeId::parse(source_id)
        .map_err(|e| Status::not_found(format!("source_volume_id: {e}")))?;
    let image = snapshot::snapshot_image_name(name);
    let snapshot_id = SnapshotId::located(
        source.cluster.clone(),
        &source.pool,
        &source.namespace,
        &image,
    )
    .encode()
    .map_err(|e| Status::invalid_argument(format!("source_volume_id: {e}")))?;
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    // the same key as DeleteSnapshot's: a create and a delete of one snapshot never overlap
    let _guard = ctl.locks.lock_or_abort(&snapshot_id)?;
    let cluster = ctl.cluster(&source.cluster, &user, &key).await?;
    let pool = source.pool_spec();
    ctl.remember(&source.cluster, &pool);
    let owner = SnapshotOwner {
        name: name.to_owned(),
        source: source_id.to_owned(),
        driver: ctl.driver_name.clone(),
        kube_cluster: ctl.kube_cluster.clone(),
    };
    let snap = snapshot::create_snapshot(
        &cluster,
        &snapshot::NewSnapshot {
            pool: &pool,
            source_image: &source.image,
            image: &image,
            owner: &owner,
        },
    )
    .await
    .map_err(snapshot_status)?;
    let snapshot_target = rbd_volume::encryption::Target {
        cluster: &cluster,
        pool: &pool,
        image: &image,
        volume_id: &snapshot_id,
        tenant: None,
    };
    let source_target = rbd_volume::encryption::Target {
        image: &source.image,
        volume_id: source_id,
        ..snapshot_target
    };
    copy_key(ctl, &snapshot_target, &source_target).await?;
    tracing::info!(snapshot_id, source_volume_id = source_id, "snapshot ready");
    Ok(csi::CreateSnapshotResponse {
        snapshot: Some(entry(&source.cluster, &snap)?),
    })
}

pub(super) async fn delete(
    ctl: &ControllerService,
    req: csi::DeleteSnapshotRequest,
) -> Result<(), Status> {
    let snapshot_id = require(&req.snapshot_id, "snapshot_id")?;
    let Ok(id) = SnapshotId::parse(snapshot_id) else {
        tracing::warn!(
            snapshot_id,
            "DeleteSnapshot of a malformed snapshot id: nothing to delete"
        );
        return Ok(());
    };
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    let _guard = ctl.locks.lock_or_abort(snapshot_id)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    let pool = id.pool_spec();
    let deleted = rbd_volume::encryption::delete_with_key(
        (&cluster, &pool, &id.image),
        snapshot_id,
        &ctl.kms_config,
        ctl.secrets.clone(),
        snapshot::delete_snapshot(&cluster, &pool, &id.image),
    )
    .await
    .map_err(volume_status)?;
    tracing::info!(snapshot_id, ?deleted, "snapshot deleted");
    Ok(())
}

/// A snapshot of an encrypted volume gets its own copy of the volume's key where the KMS keeps
/// keys apart from the image ([`rbd_volume::encryption::copy_key_to_snapshot`]).
async fn copy_key(
    ctl: &ControllerService,
    snapshot: &rbd_volume::encryption::Target<'_>,
    source: &rbd_volume::encryption::Target<'_>,
) -> Result<(), Status> {
    use rbd_volume::encryption::EncryptionError;
    rbd_volume::encryption::copy_key_to_snapshot(
        snapshot,
        source,
        &ctl.kms_config,
        ctl.secrets.clone(),
    )
    .await
    .map_err(|e| match e {
        EncryptionError::Ceph { id, source } if id.is_empty() => {
            Status::unavailable(format!("reading the source's KMS entry: {source}"))
        }
        e => Status::failed_precondition(format!("copying the volume's key: {e}")),
    })
}

pub(super) async fn list(
    ctl: &ControllerService,
    req: csi::ListSnapshotsRequest,
) -> Result<csi::ListSnapshotsResponse, Status> {
    let max = pages::max_entries(req.max_entries)?;
    if !req.starting_token.is_empty() && SnapshotId::parse(&req.starting_token).is_err() {
        return Err(Status::aborted(format!(
            "starting_token {:?} is not a token ListSnapshots returned",
            req.starting_token
        )));
    }
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    let mut entries: Vec<csi::Snapshot> = Vec::new();
    if !req.snapshot_id.is_empty() {
        let Ok(id) = SnapshotId::parse(&req.snapshot_id) else {
            return Ok(csi::ListSnapshotsResponse::default());
        };
        let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
        if let Some(snap) = snapshot::find_snapshot(&cluster, &id.pool_spec(), &id.image)
            .await
            .map_err(volume_status)?
            && (req.source_volume_id.is_empty() || snap.owner.source == req.source_volume_id)
        {
            entries.push(entry(&id.cluster, &snap)?);
        }
    } else if !req.source_volume_id.is_empty() {
        let Ok(source) = VolumeId::parse(&req.source_volume_id) else {
            return Ok(csi::ListSnapshotsResponse::default());
        };
        let cluster = ctl.cluster(&source.cluster, &user, &key).await?;
        for snap in snapshot::list_snapshots(&cluster, &source.pool_spec())
            .await
            .map_err(volume_status)?
        {
            if snap.owner.source == req.source_volume_id {
                entries.push(entry(&source.cluster, &snap)?);
            }
        }
    } else {
        // every location served since start (with the call's credentials: a cluster they do
        // not open is skipped, as its snapshots are not this caller's to see)
        for (cluster_ref, pool) in ctl.known_locations() {
            let cluster: Arc<ceph_rbd::Cluster> = match ctl.cluster(&cluster_ref, &user, &key).await
            {
                Ok(cluster) => cluster,
                Err(e) => {
                    tracing::warn!(cluster = %cluster_ref, error = %e.message(), "ListSnapshots skips a cluster it cannot open");
                    continue;
                }
            };
            for snap in snapshot::list_snapshots(&cluster, &pool)
                .await
                .map_err(volume_status)?
            {
                entries.push(entry(&cluster_ref, &snap)?);
            }
        }
    }
    let (entries, next_token) = pages::page(
        entries,
        |e| e.snapshot_id.as_str(),
        &req.starting_token,
        max,
    );
    Ok(csi::ListSnapshotsResponse {
        entries: entries
            .into_iter()
            .map(|snapshot| csi::list_snapshots_response::Entry {
                snapshot: Some(snapshot),
            })
            .collect(),
        next_token,
    })
}
