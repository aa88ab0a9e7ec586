//! `ListVolumes` with `VOLUME_CONDITION`: CSI translated onto the volume core's listing
//! ([`rbd_volume::list`]).
//!
//! **What is listed**: the images of this driver (owner record naming the driver: the proof of
//! ownership) in every cluster, pool and RADOS namespace this controller has served since it
//! started (created, or snapshotted a volume in), plus `rbd` of the default monitors
//! (`--monitors`), with the controller's own credentials (`ListVolumes` carries no secrets; a
//! cluster they cannot open is skipped with a warning). Each location is listed inside its own
//! namespace, so a namespace never shows another's images, and IDs are rebuilt the way
//! `CreateVolume` made them (monitors or `clusterID`, namespace). Namespaces this controller has
//! not served are not discovered (no listing of a pool's namespaces: an image there may be
//! another tenant's). Snapshot images and clone intermediates never. Each entry carries `status.volume_condition`: abnormal
//! with the reason when the image or its parent cannot be read.
//!
//! **Pages**: entries are ordered by volume ID; `next_token` is the last ID returned and the next
//! page starts strictly after it, so a token survives deletions between pages. A token that is
//! not a volume ID is `ABORTED`, as the spec asks. No `published_node_ids`: volumes need no
//! `ControllerPublish` here (`LIST_VOLUMES_PUBLISHED_NODES` is not offered).

use rbd_volume::clusters::ClusterRef;
use rbd_volume::list::{Condition, list_volumes};
use tonic::Status;

use super::{ControllerService, pages, volume_status};
use crate::proto::csi;
use crate::volume::{VolumeId, context};

/// The content source recorded on a volume, as CSI's message (`None` when none or unreadable).
fn content_source(id: &str) -> Option<csi::VolumeContentSource> {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let r#type = if rbd_volume::SnapshotId::parse(id).is_ok() {
        Type::Snapshot(SnapshotSource {
            snapshot_id: id.to_owned(),
        })
    } else if VolumeId::parse(id).is_ok() {
        Type::Volume(VolumeSource {
            volume_id: id.to_owned(),
        })
    } else {
        return None;
    };
    Some(csi::VolumeContentSource {
        r#type: Some(r#type),
    })
}

fn entry_id(entry: &csi::list_volumes_response::Entry) -> &str {
    entry.volume.as_ref().map_or("", |v| v.volume_id.as_str())
}

pub(super) async fn list(
    ctl: &ControllerService,
    req: csi::ListVolumesRequest,
) -> Result<csi::ListVolumesResponse, Status> {
    let max = pages::max_entries(req.max_entries)?;
    if !req.starting_token.is_empty() && VolumeId::parse(&req.starting_token).is_err() {
        return Err(Status::aborted(format!(
            "starting_token {:?} is not a token ListVolumes returned",
            req.starting_token
        )));
    }
    let probe = ctl.capacity_cluster.as_ref().ok_or_else(|| {
        Status::failed_precondition(
            "ListVolumes needs the controller's own cluster credentials (--probe-key-file): \
             the call carries no secrets",
        )
    })?;
    let mut entries = Vec::new();
    for (cluster_ref, pool_spec) in ctl.known_locations() {
        let cluster = match ctl.cluster(&cluster_ref, &probe.user, &probe.key).await {
            Ok(cluster) => cluster,
            Err(e) => {
                // the probe user may have no key on another cluster: its volumes are not listed
                tracing::warn!(cluster = %cluster_ref, error = %e.message(), "ListVolumes skips a cluster it cannot open");
                continue;
            }
        };
        let (pool, namespace) = ceph_rbd::split_pool_spec(&pool_spec).map_err(Status::internal)?;
        for volume in list_volumes(&cluster, &pool_spec, &ctl.driver_name)
            .await
            .map_err(volume_status)?
        {
            let Ok(volume_id) =
                VolumeId::located(cluster_ref.clone(), pool, namespace, &volume.image).encode()
            else {
                continue;
            };
            let (abnormal, message) = match volume.condition {
                Condition::Normal => (false, "the image is readable".to_owned()),
                Condition::Abnormal(why) => (true, why),
            };
            let mut volume_context: std::collections::HashMap<String, String> = [
                (context::POOL.to_owned(), pool.to_owned()),
                (context::IMAGE.to_owned(), volume.image.clone()),
            ]
            .into();
            match &cluster_ref {
                ClusterRef::Monitors(m) => {
                    volume_context.insert(context::MONITORS.to_owned(), m.clone())
                }
                ClusterRef::Named(n) => {
                    volume_context.insert(context::CLUSTER_ID.to_owned(), n.clone())
                }
            };
            if !namespace.is_empty() {
                volume_context.insert(context::NAMESPACE.to_owned(), namespace.to_owned());
            }
            entries.push(csi::list_volumes_response::Entry {
                volume: Some(csi::Volume {
                    capacity_bytes: volume
                        .size
                        .map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX)),
                    volume_id,
                    volume_context,
                    content_source: content_source(&volume.content_source),
                    accessible_topology: Vec::new(),
                }),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: Vec::new(),
                    volume_condition: Some(csi::VolumeCondition { abnormal, message }),
                }),
            });
        }
    }
    let (entries, next_token) = pages::page(entries, entry_id, &req.starting_token, max);
    Ok(csi::ListVolumesResponse {
        entries,
        next_token,
    })
}
