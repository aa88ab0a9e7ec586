//! The CSI `GroupController` service (`CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT`): volume group
//! snapshots translated onto the volume core's [`rbd_volume::group`].
//!
//! **Group snapshot ID** `g1/<monitors>/<pool>[/<namespace>]/csi-group-<32 hex>` (`g2/<clusterID>/...`
//! for a `clusterID` class; SHA-256 of the request name): with the call's secrets it locates the members without a journal. Each member is an
//! ordinary snapshot (`s1/...` ID, `csi-snap-...` image) that `CreateVolume` restores from and
//! `DeleteSnapshot` deletes; its `group_snapshot_id` is set in group responses.
//!
//! All source volumes must be in one pool and namespace of one cluster (`FAILED_PRECONDITION`
//! otherwise), as
//! an RBD group's images are here. `snapshot_ids` of `GetVolumeGroupSnapshot` must be exactly
//! the members, and those of `DeleteVolumeGroupSnapshot` must include every member still there
//! and name no other snapshot (`INVALID_ARGUMENT` on a mismatch, as the spec asks).

use std::collections::BTreeSet;

use rbd_volume::group::{
    self, GroupError, GroupSnapshot, GroupSnapshotId, Member, NewGroupSnapshot,
};
use rbd_volume::snapshot::{self as volume_snapshot, SnapshotId};
use tonic::{Request, Response, Status};

use super::snapshots::{call_or_probe_credentials, entry, only_co_parameters};
use super::{ControllerService, volume_status};
use crate::proto::csi::{
    self, group_controller_server::GroupController, group_controller_service_capability,
};
use crate::status::require;
use crate::volume::VolumeId;

/// Maps a group snapshot error to its CSI code.
#[allow(clippy::needless_pass_by_value)]
fn group_status(e: GroupError) -> Status {
    match e {
        GroupError::Volume(e) => volume_status(e),
        GroupError::OtherSources { .. } => Status::already_exists(e.to_string()),
        GroupError::InOtherGroup { .. } | GroupError::MemberDeleted { .. } => {
            Status::failed_precondition(e.to_string())
        }
        GroupError::SourceNotFound(_) => Status::not_found(e.to_string()),
    }
}

/// The CSI message of a group snapshot found in Ceph.
fn group_message(
    id: &GroupSnapshotId,
    found: &GroupSnapshot,
) -> Result<csi::VolumeGroupSnapshot, Status> {
    let group_snapshot_id = id.encode().map_err(Status::internal)?;
    let mut snapshots = Vec::with_capacity(found.members.len());
    for member in &found.members {
        let mut snapshot = entry(&id.cluster, member)?;
        snapshot.group_snapshot_id.clone_from(&group_snapshot_id);
        snapshots.push(snapshot);
    }
    // The members' snapshots are cut after their copies: the earliest is closest to the instant
    // of the group snapshot.
    let creation_time = snapshots
        .iter()
        .filter_map(|s| s.creation_time)
        .min_by_key(|t| (t.seconds, t.nanos));
    Ok(csi::VolumeGroupSnapshot {
        group_snapshot_id,
        snapshots,
        creation_time,
        ready_to_use: found.is_complete(),
    })
}

/// The snapshot IDs of the group's members.
fn member_ids(id: &GroupSnapshotId, images: &[String]) -> BTreeSet<String> {
    images
        .iter()
        .map(|image| {
            SnapshotId::located(id.cluster.clone(), &id.pool, &id.namespace, image).to_string()
        })
        .collect()
}

async fn create(
    ctl: &ControllerService,
    req: csi::CreateVolumeGroupSnapshotRequest,
) -> Result<csi::VolumeGroupSnapshot, Status> {
    let name = require(&req.name, "name")?;
    if req.source_volume_ids.is_empty() {
        return Err(Status::invalid_argument("source_volume_ids is required"));
    }
    only_co_parameters(&req.parameters, "group snapshots")?;
    let mut sources = Vec::with_capacity(req.source_volume_ids.len());
    for (i, source) in req.source_volume_ids.iter().enumerate() {
        if req.source_volume_ids[..i].contains(source) {
            return Err(Status::invalid_argument(format!(
                "source_volume_ids[{i}]: {source:?} is listed twice"
            )));
        }
        let id = VolumeId::parse(source)
            .map_err(|e| Status::not_found(format!("source_volume_ids[{i}]: {e}")))?;
        sources.push(id);
    }
    let first = &sources[0];
    if let Some((i, other)) = sources
        .iter()
        .enumerate()
        .find(|(_, s)| s.cluster != first.cluster || s.pool_spec() != first.pool_spec())
    {
        return Err(Status::failed_precondition(format!(
            "source_volume_ids[{i}] is in pool {:?} of cluster {}, source_volume_ids[0] in pool \
             {:?} of {}: a group snapshot's volumes must share one pool (and namespace)",
            other.pool_spec(),
            other.cluster,
            first.pool_spec(),
            first.cluster
        )));
    }
    let group = group::group_name(name);
    let id = GroupSnapshotId::located(first.cluster.clone(), &first.pool, &first.namespace, &group);
    let group_snapshot_id = id.encode().map_err(Status::invalid_argument)?;
    for source in &req.source_volume_ids {
        let member = group::member_image_name(&group, source);
        SnapshotId::located(id.cluster.clone(), &id.pool, &id.namespace, &member)
            .encode()
            .map_err(Status::invalid_argument)?;
    }
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    let _guard = ctl.locks.lock_or_abort(&group_snapshot_id)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    let pool = id.pool_spec();
    ctl.remember(&id.cluster, &pool);
    let members: Vec<Member<'_>> = sources
        .iter()
        .zip(&req.source_volume_ids)
        .map(|(s, source_id)| Member {
            image: &s.image,
            source_id,
        })
        .collect();
    let found = group::create_group_snapshot(
        &cluster,
        &NewGroupSnapshot {
            pool: &pool,
            group: &group,
            name,
            members: &members,
            driver: &ctl.driver_name,
            kube_cluster: &ctl.kube_cluster,
        },
    )
    .await
    .map_err(group_status)?;
    tracing::info!(
        group_snapshot_id,
        members = found.members.len(),
        "group snapshot ready"
    );
    group_message(&id, &found)
}

async fn get(
    ctl: &ControllerService,
    req: csi::GetVolumeGroupSnapshotRequest,
) -> Result<csi::VolumeGroupSnapshot, Status> {
    let group_snapshot_id = require(&req.group_snapshot_id, "group_snapshot_id")?;
    let id = GroupSnapshotId::parse(group_snapshot_id)
        .map_err(|e| Status::not_found(format!("group_snapshot_id: {e}")))?;
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    let found = group::find_group_snapshot(&cluster, &id.pool_spec(), &id.group)
        .await
        .map_err(volume_status)?
        .filter(|g| !g.members.is_empty())
        .ok_or_else(|| Status::not_found(format!("group snapshot {group_snapshot_id}")))?;
    if !req.snapshot_ids.is_empty() {
        let images: Vec<String> = found.members.iter().map(|m| m.image.clone()).collect();
        let members = member_ids(&id, &images);
        let given: BTreeSet<String> = req.snapshot_ids.iter().cloned().collect();
        if given != members {
            return Err(Status::invalid_argument(format!(
                "snapshot_ids {:?} are not the members of group snapshot {group_snapshot_id}: {:?}",
                req.snapshot_ids, members
            )));
        }
    }
    group_message(&id, &found)
}

async fn delete(
    ctl: &ControllerService,
    req: csi::DeleteVolumeGroupSnapshotRequest,
) -> Result<(), Status> {
    let group_snapshot_id = require(&req.group_snapshot_id, "group_snapshot_id")?;
    let Ok(id) = GroupSnapshotId::parse(group_snapshot_id) else {
        tracing::warn!(
            group_snapshot_id,
            "DeleteVolumeGroupSnapshot of a malformed id: nothing to delete"
        );
        return Ok(());
    };
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    let _guard = ctl.locks.lock_or_abort(group_snapshot_id)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    if !req.snapshot_ids.is_empty() {
        let images = group::member_images(&cluster, &id.pool_spec(), &id.group)
            .await
            .map_err(volume_status)?;
        let members = member_ids(&id, &images);
        if let Some(missing) = members.iter().find(|m| !req.snapshot_ids.contains(m)) {
            return Err(Status::invalid_argument(format!(
                "snapshot_ids do not list {missing:?}, a member of group snapshot {group_snapshot_id}"
            )));
        }
        for given in req.snapshot_ids.iter().filter(|s| !members.contains(*s)) {
            // a member deleted already is fine; another existing snapshot is a mismatch
            let Ok(other) = SnapshotId::parse(given) else {
                continue;
            };
            if volume_snapshot::find_snapshot(&cluster, &other.pool_spec(), &other.image)
                .await
                .map_err(volume_status)?
                .is_some()
            {
                return Err(Status::invalid_argument(format!(
                    "snapshot_ids lists {given:?}, which is not a member of group snapshot {group_snapshot_id}"
                )));
            }
        }
    }
    let deleted = group::delete_group_snapshot(&cluster, &id.pool_spec(), &id.group)
        .await
        .map_err(volume_status)?;
    tracing::info!(
        group_snapshot_id,
        members = deleted.len(),
        "group snapshot deleted"
    );
    Ok(())
}

#[tonic::async_trait]
impl GroupController for ControllerService {
    async fn group_controller_get_capabilities(
        &self,
        _request: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        use group_controller_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(csi::GroupControllerGetCapabilitiesResponse {
            capabilities: vec![csi::GroupControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                })),
            }],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        Ok(Response::new(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(create(self, request.into_inner()).await?),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        delete(self, request.into_inner()).await?;
        Ok(Response::new(csi::DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        Ok(Response::new(csi::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(get(self, request.into_inner()).await?),
        }))
    }
}
