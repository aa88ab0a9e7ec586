//! [`SpaceReclaimer`] for the RBD backend: which side gives a volume's free space back, and
//! the controller side itself (the volume core's [`rbd_volume::reclaim_space`]).
//!
//! - **Attached to a node, block volume**: nothing is discarded (only the volume's user knows
//!   which of its blocks are free) and the image, in use, is not sparsified: `Succeeded` with
//!   0 bytes and a message saying so.
//! - **Attached to a node, filesystem volume**: the space is the node's to trim: the node
//!   plugin there is asked through the job ([`provisioner::reclaim_space::node`]) and trims the
//!   staged filesystem (`FITRIM`); the bytes reclaimed are the image's used size before the
//!   request minus after the answer (`rbd du --exact`: krbd truncates or zeroes the parts of
//!   objects a freed range covers rather than removing them, which a whole-object count would
//!   not show), which stays as it was on a mapping that passes
//!   no discards on (rbd-fuse), as the message then says.
//! - **Attached nowhere**: the image is sparsified when no node has it published and no client
//!   watches it; the bytes reclaimed are its used size before minus after (`rbd du --exact`).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use provisioner::reclaim_space::{ReclaimRequest, ReclaimSpaceError, Reclaimed, SpaceReclaimer};
use rbd_volume::ReclaimError;

use crate::backend::RbdBackend;
use crate::backend::pv_build::{ImageLocation, image_location};

const TARGET_FIELD: &str = "spec.target.persistentVolumeClaim";

/// [`SpaceReclaimer`] for the RBD backend.
pub struct RbdReclaimer {
    backend: Arc<RbdBackend>,
}

impl RbdReclaimer {
    /// Reclaims through `backend`'s connections.
    #[must_use]
    pub fn new(backend: Arc<RbdBackend>) -> Arc<RbdReclaimer> {
        Arc::new(RbdReclaimer { backend })
    }
}

/// The node's trim of a filesystem volume attached to `node`, measured by the image's used
/// size before and after.
async fn trim_on_node(
    request: &ReclaimRequest<'_>,
    node: &str,
    location: &ImageLocation,
    cluster: &ceph_rbd::Cluster,
) -> Result<Reclaimed, ReclaimSpaceError> {
    let volume = request.volume;
    let handle = volume
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .ok_or_else(|| {
            ReclaimSpaceError::invalid(
                TARGET_FIELD,
                format!(
                    "volume {} is an in-tree rbd volume attached to node {node}: its \
                         filesystem is trimmed on that node, which only a CSI volume's node \
                         plugin is asked to do; run fstrim on the mount, or reclaim once the \
                         volume is detached",
                    volume.name_any()
                ),
            )
        })?;
    let pool = location.pool_spec();
    let used = |what: &'static str| {
        let (pool, image) = (&pool, &location.image);
        async move {
            cluster
                .used_bytes_exact(pool, image)
                .await
                .map_err(|e| match e {
                    ceph_rbd::Error::NotFound { .. } => ReclaimSpaceError::invalid(
                        TARGET_FIELD,
                        format!(
                            "the image {pool}/{image} of volume {} does not exist",
                            volume.name_any()
                        ),
                    ),
                    e => ReclaimSpaceError::failed(format!(
                        "reading the used size of {pool}/{image} {what}: {e}"
                    )),
                })
        }
    };
    let before = used("before the trim").await?;
    let answer = request.on_node.reclaim_on_node(node, &handle).await?;
    let after = used("after the trim").await?;
    Ok(Reclaimed {
        bytes: before.saturating_sub(after),
        message: format!(
            "node {node}: {}; image {pool}/{}: {before} bytes used before, {after} after",
            answer.message, location.image
        ),
    })
}

fn is_block(volume: &PersistentVolume) -> bool {
    volume.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

#[async_trait]
impl SpaceReclaimer for RbdReclaimer {
    fn serves(&self, volume: &PersistentVolume) -> bool {
        image_location(volume, self.backend.csi_driver()).is_some()
    }

    fn driver_name(&self) -> &str {
        self.backend.csi_driver()
    }

    async fn reclaim(&self, request: &ReclaimRequest<'_>) -> Result<Reclaimed, ReclaimSpaceError> {
        let volume = request.volume;
        if let Some(node) = request.node
            && is_block(volume)
        {
            return Ok(Reclaimed {
                bytes: 0,
                message: format!(
                    "block volume {} is attached to node {node}: nothing discarded on the \
                     node (a block volume's free space is known only to its user) and the \
                     image, in use, not sparsified",
                    volume.name_any()
                ),
            });
        }
        let (location, cluster) = self
            .backend
            .connect_to_pv(volume)
            .await
            .map_err(ReclaimSpaceError::Failed)?;
        if let Some(node) = request.node {
            return trim_on_node(request, node, &location, &cluster).await;
        }
        let pool = location.pool_spec();
        match rbd_volume::reclaim_space(&cluster, &pool, &location.image).await {
            Ok(reclaimed) => Ok(Reclaimed {
                bytes: reclaimed.bytes(),
                message: format!(
                    "sparsified image {pool}/{}: {} bytes used before, {} after",
                    location.image, reclaimed.before, reclaimed.after
                ),
            }),
            Err(ReclaimError::Ceph(ceph_rbd::Error::NotFound { .. })) => {
                Err(ReclaimSpaceError::invalid(
                    TARGET_FIELD,
                    format!(
                        "the image {pool}/{} of volume {} does not exist",
                        location.image,
                        volume.name_any()
                    ),
                ))
            }
            // a node that has just detached may still watch it: retried
            Err(e) => Err(ReclaimSpaceError::failed(e)),
        }
    }
}
