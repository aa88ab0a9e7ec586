//! `ControllerPublishVolume` and `ControllerUnpublishVolume`: translations onto the volume core's
//! [`rbd_volume::publish`] (the node recorded on the image; a single-node volume refused on a
//! second node with `FAILED_PRECONDITION`, a republish with another access or read-only flag with
//! `ALREADY_EXISTS`).
//!
//! **Credentials**: the request's secrets (a PV's `controllerPublishSecretRef`), else the
//! `--probe-key-file` user's. With neither (a PV made before publishing existed, on a controller
//! without a probe key) nothing can be read or recorded: the publish succeeds without a record
//! (refusing would leave such volumes unattachable after an upgrade), says so in a warning and in
//! the publish context ([`CONTEXT_RECORD`], which external-attacher copies to the
//! `VolumeAttachment`'s `status.attachmentMetadata`), and Kubernetes' own Multi-Attach check and
//! the node's one-writer check (watchers judged by node identity, `crate::node::access`) remain
//! the protection.
//!
//! **Nodes**: a plugin that also serves the node (`--services=all`) is that one node: a publish
//! to any other node ID is `NOT_FOUND`, and with `--max-volumes-per-node` a publish beyond that
//! many volumes of the pool on the node is `RESOURCE_EXHAUSTED`. A controller-only plugin takes
//! the node IDs Kubernetes sends (those of the `CSINode` objects).

use std::collections::HashMap;

use rbd_volume::publish::{self as core, Publication, PublishError, Sharing};
use tonic::Status;

use super::params::credentials;
use super::{ControllerService, ceph_status};
use crate::node::request::{access, mode};
use crate::proto::csi;
use crate::proto::csi::volume_capability::access_mode::Mode;
use crate::status::require;
use crate::volume::VolumeId;

/// Publish-context key present when the publish wrote no record (no credentials): its value says
/// why. Absent when the node was recorded.
pub const CONTEXT_RECORD: &str = "provisioner.ceph.com/single-writer-record";

/// [`CONTEXT_RECORD`]'s value for a publish without credentials.
pub const RECORD_NOT_WRITTEN: &str =
    "not written: no controllerPublishSecretRef secrets and no --probe-key-file";

/// Single-node or multi-node, from the capability's access mode.
fn sharing(mode: Mode) -> Sharing {
    match mode {
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            Sharing::MultiNode
        }
        _ => Sharing::SingleNode,
    }
}

/// Maps a publish error to its CSI code.
#[allow(clippy::needless_pass_by_value)]
fn publish_status(e: PublishError) -> Status {
    match e {
        PublishError::Ceph(e) => ceph_status(e),
        PublishError::PublishedElsewhere { .. } => Status::failed_precondition(e.to_string()),
        PublishError::Incompatible { .. } => Status::already_exists(e.to_string()),
        PublishError::InvalidNode(_) => Status::invalid_argument(e.to_string()),
        PublishError::BadRecord { .. } => Status::internal(e.to_string()),
        PublishError::Contended { .. } => Status::aborted(e.to_string()),
    }
}

impl ControllerService {
    /// The Ceph user and key for a publish or unpublish: the request's, else the probe user's.
    fn publish_credentials(
        &self,
        secrets: &HashMap<String, String>,
    ) -> Result<Option<(String, String)>, Status> {
        if !secrets.is_empty() {
            return credentials(secrets).map(Some);
        }
        Ok(self
            .capacity_cluster
            .as_ref()
            .map(|p| (p.user.clone(), p.key.clone())))
    }

    /// `NOT_FOUND` for a node other than this plugin's own, when it serves one.
    fn check_node(&self, node: &str) -> Result<(), Status> {
        match &self.local_node {
            Some(local) if local != node => Err(Status::not_found(format!(
                "node_id {node:?}: no such node (this plugin serves node {local:?} only)"
            ))),
            _ => Ok(()),
        }
    }
}

pub(super) async fn publish(
    ctl: &ControllerService,
    req: csi::ControllerPublishVolumeRequest,
) -> Result<csi::ControllerPublishVolumeResponse, Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let node = require(&req.node_id, "node_id")?;
    access(req.volume_capability.as_ref(), "volume_capability")?;
    let wanted = Publication {
        node: node.to_owned(),
        sharing: sharing(mode(req.volume_capability.as_ref())),
        readonly: req.readonly,
    };
    let id = VolumeId::parse(volume_id).map_err(Status::not_found)?;
    let _guard = ctl.locks.lock_or_abort(volume_id)?;
    let Some((user, key)) = ctl.publish_credentials(&req.secrets)? else {
        ctl.check_node(node)?;
        tracing::warn!(
            volume_id,
            node,
            "no credentials for ControllerPublishVolume (no controllerPublishSecretRef, no \
             --probe-key-file): published without the single-writer record, so a second node \
             is not refused by this driver"
        );
        return Ok(csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(
                CONTEXT_RECORD.to_owned(),
                RECORD_NOT_WRITTEN.to_owned(),
            )]),
        });
    };
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    let pool = id.pool_spec();
    let current = core::publications(&cluster, &pool, &id.image)
        .await
        .map_err(publish_status)?;
    ctl.check_node(node)?;
    let limit = usize::try_from(ctl.max_volumes_per_node).unwrap_or(0);
    if ctl.local_node.is_some() && limit > 0 && !current.iter().any(|p| p.node == node) {
        let published = core::count_published_on_node(&cluster, &pool, node)
            .await
            .map_err(publish_status)?;
        if published >= limit {
            return Err(Status::resource_exhausted(format!(
                "node {node} already has {published} volumes of pool {pool} published \
                 (--max-volumes-per-node {limit})"
            )));
        }
    }
    core::publish(&cluster, &pool, &id.image, &wanted)
        .await
        .map_err(publish_status)?;
    Ok(csi::ControllerPublishVolumeResponse::default())
}

pub(super) async fn unpublish(
    ctl: &ControllerService,
    req: csi::ControllerUnpublishVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    // An ID that is not one of ours names no volume: it is not published anywhere.
    let Ok(id) = VolumeId::parse(volume_id) else {
        return Ok(());
    };
    let node = (!req.node_id.is_empty()).then_some(req.node_id.as_str());
    let _guard = ctl.locks.lock_or_abort(volume_id)?;
    let Some((user, key)) = ctl.publish_credentials(&req.secrets)? else {
        return Ok(());
    };
    let cluster = ctl.cluster(&id.cluster, &user, &key).await?;
    match core::unpublish(&cluster, &id.pool_spec(), &id.image, node).await {
        Ok(_) => Ok(()),
        // the pool or namespace is gone with the image
        Err(PublishError::Ceph(e)) if e.is_not_found() => Ok(()),
        Err(e) => Err(publish_status(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_node_modes_are_single_node() {
        for m in [
            Mode::SingleNodeWriter,
            Mode::SingleNodeReaderOnly,
            Mode::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter,
        ] {
            assert_eq!(sharing(m), Sharing::SingleNode, "{m:?}");
        }
        for m in [
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter,
        ] {
            assert_eq!(sharing(m), Sharing::MultiNode, "{m:?}");
        }
    }

    #[test]
    fn refusals_map_to_the_spec_codes() {
        let elsewhere = PublishError::PublishedElsewhere {
            image: "i".into(),
            node: "b".into(),
            others: vec!["a".into()],
            reason: "the request is for single-node access",
        };
        assert_eq!(
            publish_status(elsewhere).code(),
            tonic::Code::FailedPrecondition
        );
        let incompatible = PublishError::Incompatible {
            image: "i".into(),
            node: "a".into(),
            existing: "single-node".into(),
            wanted: "single-node read-only".into(),
        };
        assert_eq!(
            publish_status(incompatible).code(),
            tonic::Code::AlreadyExists
        );
    }
}
