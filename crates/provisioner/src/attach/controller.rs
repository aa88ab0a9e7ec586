//! The VolumeAttachment controller: external-attacher over an [`Attacher`] backend. See the
//! [module docs](super) for the flow.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::attacher::{AttachRequest, Attacher, DetachRequest};
use super::{ANN_NODE_ID, access, finalizer};
use crate::fencing::Fencing;
use crate::finalizers;
use crate::queue::{Backoff, WorkQueue};

/// Settings of the VolumeAttachment controller.
#[derive(Clone, Debug)]
pub struct AttachControllerConfig {
    /// Per-VolumeAttachment retry backoff. Default: 1 s doubling to 5 min.
    pub backoff: Backoff,
    /// How often every VolumeAttachment and PV is looked at again. Default: 5 min.
    pub resync: Duration,
    /// Fencing of out-of-service nodes ([`crate::fencing`]): when set, a volume is detached
    /// from an out-of-service node, or attached while its records name one, only once that
    /// node is fenced. Default: none.
    pub fencing: Option<Arc<Fencing>>,
}

impl Default for AttachControllerConfig {
    fn default() -> Self {
        AttachControllerConfig {
            backoff: Backoff::default(),
            resync: Duration::from_mins(5),
            fencing: None,
        }
    }
}

struct AttachController {
    client: Client,
    backend: Arc<dyn Attacher>,
    driver: String,
    finalizer: String,
    queue: WorkQueue<String>,
    fencing: Option<Arc<Fencing>>,
}

/// The controller as a task for [`crate::Controller::with_companion`].
pub fn task(
    client: Client,
    backend: Arc<dyn Attacher>,
    config: AttachControllerConfig,
) -> crate::Companion {
    Box::pin(async move { run(client, backend, config).await })
}

/// Runs until dropped (or the VolumeAttachment watch ends).
pub async fn run(client: Client, backend: Arc<dyn Attacher>, config: AttachControllerConfig) {
    let driver = backend.driver_name();
    let ctl = Arc::new(AttachController {
        client: client.clone(),
        backend,
        finalizer: finalizer(&driver),
        driver,
        queue: WorkQueue::new(config.backoff),
        fencing: config.fencing.clone(),
    });
    tracing::info!(driver = %ctl.driver, "watching VolumeAttachments");
    // Held by this future: when it is dropped (lease lost), these go too.
    let mut tasks = tokio::task::JoinSet::new();
    let worker = Arc::clone(&ctl);
    tasks.spawn(async move { worker.worker().await });
    let resync = Arc::clone(&ctl);
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(config.resync).await;
            resync.resync().await;
        }
    });
    let pvs = Arc::clone(&ctl);
    tasks.spawn(async move { pvs.watch_volumes().await });
    let api: Api<VolumeAttachment> = Api::all(client);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    loop {
        match stream.next().await {
            Some(Ok(watcher::Event::Apply(va) | watcher::Event::InitApply(va))) => {
                if va.spec.attacher == ctl.driver {
                    ctl.queue.add(va.name_any());
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "VolumeAttachment watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None => break,
        }
    }
    ctl.queue.shut_down();
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl AttachController {
    async fn worker(&self) {
        while let Some(name) = self.queue.get().await {
            match Box::pin(self.sync(&name)).await {
                Ok(()) => self.queue.forget(&name),
                Err(message) => {
                    tracing::warn!(volumeattachment = %name, error = %message, "VolumeAttachment sync failed");
                    self.queue.add_rate_limited(name.clone());
                }
            }
            self.queue.done(&name);
        }
    }

    fn is_being_deleted_with_our_finalizer(&self, pv: &PersistentVolume) -> bool {
        pv.metadata.deletion_timestamp.is_some() && pv.finalizers().contains(&self.finalizer)
    }

    /// Releases PVs being deleted that keep our finalizer, as their watch events come.
    async fn watch_volumes(&self) {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(pv) | watcher::Event::InitApply(pv))
                    if self.is_being_deleted_with_our_finalizer(&pv) =>
                {
                    if let Err(e) = self.release_volume(&pv.name_any()).await {
                        tracing::warn!(pv = %pv.name_any(), error = %e, "releasing the PV failed");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "PersistentVolume watch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Removes our finalizer from PV `name` when no VolumeAttachment of ours names it.
    async fn release_volume(&self, name: &str) -> Result<(), String> {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let list = vas
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let attached = list.items.iter().any(|va| {
            va.spec.attacher == self.driver
                && va.spec.source.persistent_volume_name.as_deref() == Some(name)
        });
        if attached {
            return Ok(());
        }
        self.remove_pv_finalizer(name).await
    }

    /// Every VolumeAttachment of ours again, and PVs being deleted that keep our finalizer. Both
    /// are listed in pages, the PVs by their metadata only: a resync of a cluster with thousands
    /// of PVs holds one page at a time.
    async fn resync(&self) {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let mut named = BTreeSet::new();
        let mut ours = Vec::new();
        let listed = crate::paged::for_each(&vas, &ListParams::default(), |va| {
            if va.spec.attacher == self.driver {
                if let Some(pv) = &va.spec.source.persistent_volume_name {
                    named.insert(pv.clone());
                }
                ours.push(va.name_any());
            }
        })
        .await;
        if let Err(e) = listed {
            tracing::warn!(error = %e, "listing VolumeAttachments for the resync failed");
            return;
        }
        for name in ours {
            self.queue.add(name);
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut releasable = Vec::new();
        let listed = crate::paged::for_each_metadata(&pvs, &ListParams::default(), |pv| {
            let name = pv.name_any();
            if pv.metadata.deletion_timestamp.is_some()
                && pv.finalizers().contains(&self.finalizer)
                && !named.contains(&name)
            {
                releasable.push(name);
            }
        })
        .await;
        if let Err(e) = listed {
            tracing::warn!(error = %e, "listing PersistentVolumes for the resync failed");
            return;
        }
        for name in releasable {
            if let Err(e) = self.remove_pv_finalizer(&name).await {
                tracing::warn!(pv = %name, error = %e, "removing the attacher's PV finalizer failed");
            }
        }
    }

    async fn sync(&self, name: &str) -> Result<(), String> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        let Some(va) = api.get_opt(name).await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        if va.spec.attacher != self.driver {
            return Ok(());
        }
        if va.metadata.deletion_timestamp.is_some() {
            if !va.finalizers().contains(&self.finalizer) {
                return Ok(());
            }
            return self.sync_deleted(&va).await;
        }
        if va.status.as_ref().is_some_and(|s| s.attached) {
            return Ok(());
        }
        match self.attach(&va).await {
            Ok(context) => {
                self.set_status(
                    name,
                    json!({"attached": true, "attachmentMetadata": context, "attachError": null}),
                )
                .await?;
                tracing::info!(volumeattachment = %name, node = %va.spec.node_name, "volume attached");
                Ok(())
            }
            Err(message) => {
                let error = json!({"time": now(), "message": message});
                self.set_status(name, json!({"attached": false, "attachError": error}))
                    .await?;
                Err(message)
            }
        }
    }

    /// A VolumeAttachment being deleted with our finalizer: detach, status, finalizer, and the
    /// PV it leaves.
    async fn sync_deleted(&self, va: &VolumeAttachment) -> Result<(), String> {
        let name = va.name_any();
        if let Err(message) = self.detach(va).await {
            let error = json!({"time": now(), "message": message});
            self.set_status(&name, json!({"detachError": error}))
                .await?;
            return Err(message);
        }
        self.set_status(&name, json!({"attached": false, "detachError": null}))
            .await?;
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        finalizers::remove(&vas, &name, &self.finalizer)
            .await
            .map_err(|e| format!("removing the finalizer of VolumeAttachment {name}: {e}"))?;
        // a PV waiting for its last VolumeAttachment to go
        match &va.spec.source.persistent_volume_name {
            Some(pv) => self.release_if_deleting(pv).await,
            None => Ok(()),
        }
    }

    /// The PV a VolumeAttachment names.
    async fn volume(&self, va: &VolumeAttachment) -> Result<Option<PersistentVolume>, String> {
        let Some(pv_name) = &va.spec.source.persistent_volume_name else {
            return Err("the VolumeAttachment names no PersistentVolume (inline volumes are not supported by this driver)".to_owned());
        };
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        pvs.get_opt(pv_name)
            .await
            .map_err(|e| format!("reading PersistentVolume {pv_name}: {e}"))
    }

    /// The CSI node ID of `node`: our driver's entry in its CSINode.
    async fn node_id(&self, node: &str) -> Result<String, String> {
        let api: Api<CSINode> = Api::all(self.client.clone());
        let csi_node = api
            .get_opt(node)
            .await
            .map_err(|e| format!("reading CSINode {node}: {e}"))?
            .ok_or_else(|| {
                format!("CSINode {node} does not exist (is the node plugin registered?)")
            })?;
        csi_node
            .spec
            .drivers
            .iter()
            .find(|d| d.name == self.driver)
            .map(|d| d.node_id.clone())
            .ok_or_else(|| format!("CSINode {node} does not contain driver {}", self.driver))
    }

    async fn attach(&self, va: &VolumeAttachment) -> Result<BTreeMap<String, String>, String> {
        let name = va.name_any();
        let volume = self.volume(va).await?.ok_or_else(|| {
            format!(
                "PersistentVolume {} not found",
                va.spec
                    .source
                    .persistent_volume_name
                    .as_deref()
                    .unwrap_or_default()
            )
        })?;
        // a PV no access mode of CSI fits is never attached (no finalizers: nothing to detach)
        let access =
            access(&volume).map_err(|e| format!("PersistentVolume {}: {e}", volume.name_any()))?;
        let node_id = self.node_id(&va.spec.node_name).await?;
        // finalizers first, so that a detach always follows an attach that may have happened
        if !va.finalizers().contains(&self.finalizer)
            || va.annotations().get(ANN_NODE_ID) != Some(&node_id)
        {
            let mut finalizers = va.finalizers().to_vec();
            if !finalizers.contains(&self.finalizer) {
                finalizers.push(self.finalizer.clone());
            }
            let patch = json!({"metadata": {
                "finalizers": finalizers,
                "annotations": {ANN_NODE_ID: node_id},
                "resourceVersion": va.metadata.resource_version,
            }});
            let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
            vas.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("adding the finalizer to VolumeAttachment {name}: {e}"))?;
        }
        if !volume.finalizers().contains(&self.finalizer) {
            let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
            finalizers::add(&pvs, &volume.name_any(), &self.finalizer)
                .await
                .map_err(|e| format!("adding the finalizer to PersistentVolume: {e}"))?;
        }
        // a node the volume's records name that is out of service is fenced first
        if let Some(fencing) = &self.fencing {
            fencing.before_attach(&volume, &node_id).await?;
        }
        let request = AttachRequest {
            volume: &volume,
            node_id: &node_id,
            access,
        };
        self.backend
            .attach(&request)
            .await
            .map_err(|e| e.to_string())
    }

    async fn detach(&self, va: &VolumeAttachment) -> Result<(), String> {
        let Some(volume) = self.volume(va).await? else {
            // the PV is gone (and with it, by its reclaim policy, usually the volume): nothing
            // names the volume any more
            tracing::warn!(volumeattachment = %va.name_any(), "the PV is gone; detached without unpublishing");
            return Ok(());
        };
        // Kubernetes force-detaches the volumes of an out-of-service node: fence it first, so
        // the volume is free for another node only once the lost one can no longer write
        if let Some(fencing) = &self.fencing {
            fencing.fence_if_out_of_service(&va.spec.node_name).await?;
        }
        let node_id = match va.annotations().get(ANN_NODE_ID) {
            Some(id) => id.clone(),
            None => self.node_id(&va.spec.node_name).await?,
        };
        let request = DetachRequest {
            volume: &volume,
            node_id: &node_id,
        };
        self.backend
            .detach(&request)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(volumeattachment = %va.name_any(), node = %node_id, "volume detached");
        Ok(())
    }

    async fn set_status(&self, name: &str, status: serde_json::Value) -> Result<(), String> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .map(drop)
        .map_err(|e| format!("updating the status of VolumeAttachment {name}: {e}"))
    }

    async fn release_if_deleting(&self, name: &str) -> Result<(), String> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match pvs.get_opt(name).await.map_err(|e| e.to_string())? {
            Some(pv) if self.is_being_deleted_with_our_finalizer(&pv) => {
                self.release_volume(name).await
            }
            _ => Ok(()),
        }
    }

    async fn remove_pv_finalizer(&self, name: &str) -> Result<(), String> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        finalizers::remove(&pvs, name, &self.finalizer)
            .await
            .map_err(|e| format!("removing the finalizer of PersistentVolume {name}: {e}"))
    }
}
