//! `ControllerModifyVolume` (`MODIFY_VOLUME`, for Kubernetes' `VolumeAttributesClass`) and the
//! `mutable_parameters` of `CreateVolume`: librbd `rbd_qos_*` limits, parsed, validated and applied by
//! the volume core's [`rbd_volume::qos`] (the built-in provisioner uses the same).
//!
//! The keys are librbd's option names (`rbd_qos_iops_limit`, `rbd_qos_bps_limit`, their
//! `read_`/`write_` variants, bursts); an unknown key or a bad value is `INVALID_ARGUMENT`
//! naming it, and nothing is changed then. Only the keys given change (the spec: "SPs MUST NOT
//! modify volumes based on the absence of keys"); `0` lifts a limit. The limits are image
//! configuration: librbd-based mappings (rbd-nbd, fuse) enforce them, krbd does not.

use std::collections::HashMap;

use rbd_volume::qos::{self, Qos, QosError};
use tonic::Status;

use super::snapshots::call_or_probe_credentials;
use super::{ControllerService, ceph_status};
use crate::proto::csi;
use crate::status::require;
use crate::volume::VolumeId;

/// Maps a `QosError` to its CSI code: bad parameters are `INVALID_ARGUMENT`.
#[allow(clippy::needless_pass_by_value)]
pub(super) fn qos_status(e: QosError) -> Status {
    match e {
        QosError::Ceph(e) => ceph_status(e),
        e => Status::invalid_argument(format!("mutable_parameters: {e}")),
    }
}

/// `mutable_parameters` parsed and validated.
pub(super) fn parse(mutable_parameters: &HashMap<String, String>) -> Result<Qos, Status> {
    qos::parse(mutable_parameters).map_err(qos_status)
}

/// Applies `qos` to the volume's image (nothing when empty).
pub(super) async fn apply(
    cluster: &ceph_rbd::Cluster,
    pool: &str,
    image: &str,
    qos: &Qos,
) -> Result<(), Status> {
    if qos.is_empty() {
        return Ok(());
    }
    let applied = qos::apply(cluster, pool, image, qos)
        .await
        .map_err(qos_status)?;
    if !applied.changed.is_empty() {
        tracing::info!(pool, image, changed = ?applied.changed, "QoS limits set");
    }
    Ok(())
}

pub(super) async fn modify(
    ctl: &ControllerService,
    req: csi::ControllerModifyVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let qos = parse(&req.mutable_parameters)?;
    let id =
        VolumeId::parse(volume_id).map_err(|e| Status::not_found(format!("volume_id: {e}")))?;
    let (user, key) = call_or_probe_credentials(ctl, &req.secrets)?;
    let _guard = ctl.locks.lock_or_abort(volume_id)?;
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    let pool = id.pool_spec();
    // NOT_FOUND for a missing image, even when there is nothing to change
    cluster
        .image_info(&pool, &id.image)
        .await
        .map_err(ceph_status)?;
    apply(&cluster, &pool, &id.image, &qos).await
}
