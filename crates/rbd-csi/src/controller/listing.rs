//! `ListVolumes` with `VOLUME_CONDITION`: CSI translated onto the volume core's listing
//! ([`rbd_volume::list`]).
//!
//! **What is listed**: the images of this driver (owner record naming the driver) in every pool
//! this controller has served since it started, plus `rbd`, under the controller's default
//! monitors (`--monitors`) with its own credentials (`ListVolumes` carries no secrets). Snapshot
//! images and clone intermediates never. Each entry carries `status.volume_condition`: abnormal
//! with the reason when the image or its parent cannot be read.
//!
//! **Pages**: entries are ordered by volume ID; `next_token` is the last ID returned and the next
//! page starts strictly after it, so a token survives deletions between pages. A token that is
//! not a volume ID is `ABORTED`, as the spec asks. No `published_node_ids`: volumes need no
//! `ControllerPublish` here (`LIST_VOLUMES_PUBLISHED_NODES` is not offered).

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
    let monitors = ctl
        .default_monitors
        .clone()
        .unwrap_or_else(|| probe.monitors.clone());
    let cluster = ctl.cluster(&monitors, &probe.user, &probe.key).await?;
    let mut entries = Vec::new();
    for pool in ctl.known_pools() {
        for volume in list_volumes(&cluster, &pool, &ctl.driver_name)
            .await
            .map_err(volume_status)?
        {
            let Ok(volume_id) = VolumeId::new(&monitors, &pool, &volume.image).encode() else {
                continue;
            };
            let (abnormal, message) = match volume.condition {
                Condition::Normal => (false, "the image is readable".to_owned()),
                Condition::Abnormal(why) => (true, why),
            };
            entries.push(csi::list_volumes_response::Entry {
                volume: Some(csi::Volume {
                    capacity_bytes: volume
                        .size
                        .map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX)),
                    volume_id,
                    volume_context: [
                        (context::MONITORS.to_owned(), monitors.clone()),
                        (context::POOL.to_owned(), pool.clone()),
                        (context::IMAGE.to_owned(), volume.image.clone()),
                    ]
                    .into(),
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
