//! The RBD backend's attaching: [`provisioner::attach::Attacher`] on the volume core.
//!
//! An attach is a publish of the volume's image to the node ([`rbd_volume::publish`], what the
//! CSI controller's `ControllerPublishVolume` does too): recorded in the image's metadata, and
//! refused while another node has a single-node volume, naming that node. A detach removes the
//! node's publication. The library's VolumeAttachment controller does the Kubernetes side.
//!
//! Ours: VolumeAttachments of the CSI driver name (`--csi-driver-name`). The key is the PV's
//! admin secret (the provisioner's deletion secret), so PVs made before attaching existed need
//! nothing new. The publish context is empty.

use std::collections::BTreeMap;

use async_trait::async_trait;
use provisioner::attach::{Access, AttachError, AttachRequest, Attacher, DetachRequest};
use rbd_volume::publish::{self, Publication, Sharing};

use crate::backend::RbdBackend;

fn sharing(access: Access) -> Sharing {
    if access.multi_node {
        Sharing::MultiNode
    } else {
        Sharing::SingleNode
    }
}

#[async_trait]
impl Attacher for RbdBackend {
    fn driver_name(&self) -> String {
        self.csi_driver().to_owned()
    }

    async fn attach(
        &self,
        request: &AttachRequest<'_>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        let (location, cluster) = self
            .connect_to_pv(request.volume)
            .await
            .map_err(AttachError::new)?;
        let wanted = Publication {
            node: request.node_id.to_owned(),
            sharing: sharing(request.access),
            readonly: request.access.read_only,
        };
        publish::publish(&cluster, &location.pool_spec(), &location.image, &wanted)
            .await
            .map_err(AttachError::new)?;
        Ok(BTreeMap::new())
    }

    async fn detach(&self, request: &DetachRequest<'_>) -> Result<(), AttachError> {
        let (location, cluster) = self
            .connect_to_pv(request.volume)
            .await
            .map_err(AttachError::new)?;
        publish::unpublish(
            &cluster,
            &location.pool_spec(),
            &location.image,
            Some(request.node_id),
        )
        .await
        .map_err(AttachError::new)?;
        Ok(())
    }
}
