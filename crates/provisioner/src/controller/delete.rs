//! Deletion: released PV of ours with reclaim policy Delete -> backend delete -> PV delete ->
//! our finalizer removed.
//!
//! # Guarantees
//! - Only PVs with our `pv.kubernetes.io/provisioned-by` are touched; Retain leaves
//!   everything (except our own finalizer once the PV is being deleted).
//! - The StorageClass is never needed: the backend reads what it needs from the PV.
//! - A backend refusal (volume in use) is a `VolumeFailedDelete` Warning and a retry with
//!   backoff; the PV stays.
//! - With [`crate::Config::wait_for_detach`] (the default) the backend is not asked while a
//!   VolumeAttachment names the PV (kubelet unstages before the attach/detach controller
//!   detaches, seconds later): a `VolumeFailedDelete` Warning in external-provisioner's words
//!   ("persistentvolume P is still attached to node N") and a retry, at once when the
//!   VolumeAttachment goes. Until the VolumeAttachments are listed, deletions wait too.
//! - Decisions made on the (possibly stale) cache are confirmed with a fresh read before the
//!   backend is called, so a finished deletion is not repeated.
//! - Each step is idempotent, so a restart anywhere converges (the backend treats an
//!   already-deleted volume as success; a missing PV is fine).

use std::time::Instant;

use futures::FutureExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;

use super::{Retry, Shared, Work, error_chain};
use crate::events::EventType;
use crate::pv::{self, FINALIZER, VolumeDecision};
use crate::volume::DeleteError;

/// Event reason for a failed deletion (upstream's).
pub(crate) const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

pub(super) async fn sync_volume(shared: &Shared, name: &str) -> Result<(), Retry> {
    let Some(volume) = shared.volumes.get(&ObjectRef::new(name)) else {
        return Ok(());
    };
    match pv::decide(&*volume, &shared.names) {
        VolumeDecision::Keep => Ok(()),
        VolumeDecision::RemoveFinalizer => remove_finalizer(shared, name).await,
        VolumeDecision::Delete => {
            // The cache may lag behind our own last deletion: confirm with a fresh read
            // before asking the backend.
            let api: Api<PersistentVolume> = Api::all(shared.client.clone());
            match api.get_opt(name).await {
                Ok(Some(fresh)) if pv::decide(&fresh, &shared.names) == VolumeDecision::Delete => {
                    delete(shared, &fresh, name).await
                }
                Ok(_) => Ok(()),
                Err(error) => {
                    tracing::warn!(volume = name, %error, "could not read PV");
                    Err(Retry)
                }
            }
        }
    }
}

async fn delete(shared: &Shared, volume: &PersistentVolume, name: &str) -> Result<(), Retry> {
    if !shared.provisioner.should_delete(volume) {
        return Ok(());
    }
    if let Some(wait) = attached_to(shared, name) {
        tracing::info!(volume = name, reason = %wait.why, "deletion waits for a detach");
        // not listed yet at the first try is the moment after a start: no Warning for that
        let first = shared.queue.failures(&Work::Volume(name.to_owned())) == 0;
        if wait.listed || !first {
            shared.event(volume, EventType::Warning, VOLUME_FAILED_DELETE, &wait.why);
        }
        return Err(Retry);
    }
    let class = volume
        .spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.clone())
        .unwrap_or_default();
    let started = Instant::now();
    match shared.provisioner.delete(volume).await {
        Ok(()) => {}
        Err(DeleteError::Ignored(error)) => {
            tracing::debug!(volume = name, error = %error, "backend ignored the deletion");
            return Ok(());
        }
        Err(error) => {
            shared.metrics.delete_failed(&class);
            let why = error_chain(&error);
            tracing::warn!(volume = name, error = %why, "deleting volume failed");
            shared.event(volume, EventType::Warning, VOLUME_FAILED_DELETE, &why);
            return Err(Retry);
        }
    }
    shared.config.step("before-pv-delete");
    let api: Api<PersistentVolume> = Api::all(shared.client.clone());
    let params = DeleteParams {
        preconditions: volume.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(error) => {
            tracing::warn!(volume = name, %error, "deleting the PV failed");
            return Err(Retry);
        }
    }
    shared.config.step("after-pv-delete");
    shared.metrics.deleted(&class, started.elapsed());
    tracing::info!(volume = name, "deleted");
    if pv::has_finalizer(volume) {
        remove_finalizer(shared, name).await?;
    }
    Ok(())
}

/// Why a deletion waits.
struct Wait {
    why: String,
    /// The VolumeAttachments are listed (`false`: not yet, so the PV may be attached).
    listed: bool,
}

/// Why PV `name`'s volume must not be deleted yet: a VolumeAttachment names it (the node it
/// is attached to), or the VolumeAttachments are not listed yet. `None` to go ahead (also when
/// [`crate::Config::wait_for_detach`] is off).
fn attached_to(shared: &Shared, name: &str) -> Option<Wait> {
    let store = shared.attachments.as_ref()?;
    if store.wait_until_ready().now_or_never().is_none() {
        return Some(Wait {
            why: format!(
                "persistentvolume {name} may still be attached: VolumeAttachments are not listed \
                 yet (the provisioner needs list and watch on storage.k8s.io volumeattachments)"
            ),
            listed: false,
        });
    }
    let mut nodes: Vec<String> = store
        .state()
        .iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name))
        .map(|va| va.spec.node_name.clone())
        .collect();
    nodes.sort();
    (!nodes.is_empty()).then(|| Wait {
        why: format!(
            "persistentvolume {name} is still attached to node {}: its volume is deleted once \
             the VolumeAttachment is gone (detached)",
            nodes.join(", ")
        ),
        listed: true,
    })
}

/// Removes our finalizer from the current PV (read fresh; the write is conditional on its
/// resourceVersion, so we never drop someone else's concurrent change).
async fn remove_finalizer(shared: &Shared, name: &str) -> Result<(), Retry> {
    let api: Api<PersistentVolume> = Api::all(shared.client.clone());
    let current = match api.get_opt(name).await {
        Ok(Some(current)) => current,
        Ok(None) => return Ok(()),
        Err(error) => {
            tracing::warn!(volume = name, %error, "could not read PV to remove our finalizer");
            return Err(Retry);
        }
    };
    let finalizers = current.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let remaining: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": remaining,
            "resourceVersion": current.metadata.resource_version,
        }
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => {
            tracing::warn!(volume = name, %error, "could not remove our finalizer");
            Err(Retry)
        }
    }
}
