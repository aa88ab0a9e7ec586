//! The built-in attach controller: the external-attacher sidecar's work for our CSI driver.
//!
//! What the sidecar does for a CSI driver with `attachRequired: true`, acting on the
//! VolumeAttachment objects of our driver (`spec.attacher`) and publishing through the volume
//! core ([`rbd_volume::publish`]), the implementation the CSI controller's
//! `ControllerPublishVolume` uses too.
//!
//! For each VolumeAttachment of ours, as the sidecar does (same names, so the two can take turns):
//! 1. not being deleted and not `status.attached`: the finalizer
//!    `external-attacher/<driver, non-alphanumerics as '-'>` on the VolumeAttachment and on its
//!    PV, the node's CSI node ID read from its CSINode (kept in the annotation
//!    `csi.alpha.kubernetes.io/node-id`), then the publish: `status.attached: true`,
//!    `attachmentMetadata` (the publish context, empty), no `attachError`; a refusal or failure
//!    sets `status.attachError` (`time`, `message`) and is retried with backoff;
//! 2. being deleted (`deletionTimestamp`) with our finalizer: the unpublish, then
//!    `status.attached: false` and the finalizer removed; a failure sets `status.detachError`;
//! 3. a PV being deleted that carries our finalizer and that no VolumeAttachment names any
//!    more: the finalizer removed (on the PV's watch events and the periodic resync).
//!
//! The publication key is the PV's admin secret (the provisioner's deletion secret), so PVs made
//! before publishing existed need nothing new. A VolumeAttachment of an inline volume
//! (`spec.source.inlineVolumeSpec`) gets an `attachError`: only PVs are ours.
//!
//! It runs in the provisioner (leader elected with it) unless `--attacher=false` (the sidecar
//! deployment style, where external-attacher does this through the CSI controller).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use provisioner::queue::{Backoff, WorkQueue};
use rbd_volume::publish::{self, Publication, Sharing};
use serde_json::json;

use crate::backend::RbdBackend;

/// The annotation holding the CSI node ID a VolumeAttachment was published to (external-attacher's).
pub const ANN_NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";

/// How often every VolumeAttachment and PV is looked at again.
const RESYNC: Duration = Duration::from_secs(5 * 60);

/// external-attacher's finalizer for `driver`: `external-attacher/` and the driver name with
/// every character other than `[a-zA-Z0-9-]` replaced by `-` (and an `X` after a trailing `-`).
#[must_use]
pub fn finalizer(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.ends_with('-') {
        name.push('X');
    }
    format!("external-attacher/{name}")
}

/// Single- or multi-node, and read-only, as external-attacher derives them from a PV: a PV
/// whose access modes are all `ReadOnlyMany`, or whose CSI source says `readOnly`, is read-only;
/// one without `ReadWriteMany`/`ReadOnlyMany` is single-node.
#[must_use]
pub fn access(volume: &PersistentVolume) -> (Sharing, bool) {
    let spec = volume.spec.as_ref();
    let modes = spec
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    let multi = modes
        .iter()
        .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany");
    let readonly = (!modes.is_empty() && modes.iter().all(|m| m == "ReadOnlyMany"))
        || spec
            .and_then(|s| s.csi.as_ref())
            .and_then(|c| c.read_only)
            .unwrap_or(false);
    (
        if multi {
            Sharing::MultiNode
        } else {
            Sharing::SingleNode
        },
        readonly,
    )
}

struct Attacher {
    client: Client,
    backend: Arc<RbdBackend>,
    driver: String,
    finalizer: String,
    queue: WorkQueue<String>,
}

/// The controller as a task for [`provisioner::Controller::with_companion`].
pub fn task(backend: Arc<RbdBackend>, driver: String, backoff: Backoff) -> provisioner::Companion {
    Box::pin(async move { run(backend, driver, backoff).await })
}

/// Runs until dropped.
pub async fn run(backend: Arc<RbdBackend>, driver: String, backoff: Backoff) {
    let client = backend.client().clone();
    let ctl = Arc::new(Attacher {
        client: client.clone(),
        backend,
        finalizer: finalizer(&driver),
        driver,
        queue: WorkQueue::new(backoff),
    });
    tracing::info!(driver = %ctl.driver, "watching VolumeAttachments");
    let mut tasks = tokio::task::JoinSet::new();
    let worker = Arc::clone(&ctl);
    tasks.spawn(async move { worker.worker().await });
    let resync = Arc::clone(&ctl);
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(RESYNC).await;
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

impl Attacher {
    async fn worker(&self) {
        while let Some(name) = self.queue.get().await {
            match self.sync(&name).await {
                Ok(()) => self.queue.forget(&name),
                Err(message) => {
                    tracing::warn!(volumeattachment = %name, error = %message, "VolumeAttachment sync failed");
                    self.queue.add_rate_limited(name.clone());
                }
            }
            self.queue.done(&name);
        }
    }

    /// Releases PVs being deleted that keep our finalizer, as their watch events come.
    async fn watch_volumes(&self) {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(pv) | watcher::Event::InitApply(pv))
                    if pv.metadata.deletion_timestamp.is_some()
                        && pv.finalizers().contains(&self.finalizer) =>
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

    /// Every VolumeAttachment of ours again, and PVs being deleted that keep our finalizer.
    async fn resync(&self) {
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let Ok(list) = vas.list(&ListParams::default()).await else {
            return;
        };
        let mut named = std::collections::BTreeSet::new();
        for va in list.items {
            if va.spec.attacher == self.driver {
                if let Some(pv) = &va.spec.source.persistent_volume_name {
                    named.insert(pv.clone());
                }
                self.queue.add(va.name_any());
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let Ok(list) = pvs.list(&ListParams::default()).await else {
            return;
        };
        for pv in list.items {
            let name = pv.name_any();
            if pv.metadata.deletion_timestamp.is_some()
                && pv.finalizers().contains(&self.finalizer)
                && !named.contains(&name)
                && let Err(e) = self.remove_pv_finalizer(&name).await
            {
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
            return match self.detach(&va).await {
                Ok(()) => {
                    self.set_status(name, json!({"attached": false, "detachError": null}))
                        .await?;
                    self.remove_va_finalizer(&va).await?;
                    // a PV waiting for its last VolumeAttachment to go
                    match &va.spec.source.persistent_volume_name {
                        Some(pv) => self.release_if_deleting(pv).await,
                        None => Ok(()),
                    }
                }
                Err(message) => {
                    let error = json!({"time": now(), "message": message});
                    self.set_status(name, json!({"detachError": error})).await?;
                    Err(message)
                }
            };
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
        let node_id = self.node_id(&va.spec.node_name).await?;
        // finalizers first, so that a detach always follows an attach that may have happened
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
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
            vas.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("adding the finalizer to VolumeAttachment {name}: {e}"))?;
        }
        if !volume.finalizers().contains(&self.finalizer) {
            let mut finalizers = volume.finalizers().to_vec();
            finalizers.push(self.finalizer.clone());
            let patch = json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": volume.metadata.resource_version,
            }});
            let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
            pvs.patch(
                &volume.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("adding the finalizer to PersistentVolume: {e}"))?;
        }
        let (sharing, readonly) = access(&volume);
        let (location, monitors, user, key) = self.backend.access_for(&volume).await?;
        let cluster = self
            .backend
            .cluster(&monitors, &user, key)
            .await
            .map_err(|e| e.to_string())?;
        let wanted = Publication {
            node: node_id,
            sharing,
            readonly,
        };
        publish::publish(&cluster, &location.pool_spec(), &location.image, &wanted)
            .await
            .map_err(|e| e.to_string())?;
        Ok(BTreeMap::new())
    }

    async fn detach(&self, va: &VolumeAttachment) -> Result<(), String> {
        let Some(volume) = self.volume(va).await? else {
            // the PV is gone (and with it, by its reclaim policy, usually the image): nothing
            // names the image any more
            tracing::warn!(volumeattachment = %va.name_any(), "the PV is gone; detached without unpublishing");
            return Ok(());
        };
        let node_id = match va.annotations().get(ANN_NODE_ID) {
            Some(id) => id.clone(),
            None => self.node_id(&va.spec.node_name).await?,
        };
        let (location, monitors, user, key) = self.backend.access_for(&volume).await?;
        let cluster = self
            .backend
            .cluster(&monitors, &user, key)
            .await
            .map_err(|e| e.to_string())?;
        publish::unpublish(
            &cluster,
            &location.pool_spec(),
            &location.image,
            Some(&node_id),
        )
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

    async fn remove_va_finalizer(&self, va: &VolumeAttachment) -> Result<(), String> {
        let name = va.name_any();
        let finalizers: Vec<&String> = va
            .finalizers()
            .iter()
            .filter(|f| **f != self.finalizer)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": va.metadata.resource_version,
        }});
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!(
                "removing the finalizer of VolumeAttachment {name}: {e}"
            )),
        }
    }

    async fn release_if_deleting(&self, name: &str) -> Result<(), String> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        match pvs.get_opt(name).await.map_err(|e| e.to_string())? {
            Some(pv)
                if pv.metadata.deletion_timestamp.is_some()
                    && pv.finalizers().contains(&self.finalizer) =>
            {
                self.release_volume(name).await
            }
            _ => Ok(()),
        }
    }

    async fn remove_pv_finalizer(&self, name: &str) -> Result<(), String> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(pv) = pvs.get_opt(name).await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let finalizers: Vec<&String> = pv
            .finalizers()
            .iter()
            .filter(|f| **f != self.finalizer)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": pv.metadata.resource_version,
        }});
        pvs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finalizer_is_external_attachers() {
        assert_eq!(
            finalizer("rbd.provisioner.ceph.io"),
            "external-attacher/rbd-provisioner-ceph-io"
        );
        assert_eq!(finalizer("a.b/"), "external-attacher/a-b-X");
    }

    fn pv(modes: &[&str], read_only: Option<bool>) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pv"},
            "spec": {
                "accessModes": modes,
                "csi": {"driver": "d", "volumeHandle": "h", "readOnly": read_only},
            }
        }))
        .unwrap()
    }

    #[test]
    fn access_follows_the_pv() {
        assert_eq!(
            access(&pv(&["ReadWriteOnce"], None)),
            (Sharing::SingleNode, false)
        );
        assert_eq!(
            access(&pv(&["ReadWriteOncePod"], None)),
            (Sharing::SingleNode, false)
        );
        assert_eq!(
            access(&pv(&["ReadOnlyMany"], None)),
            (Sharing::MultiNode, true)
        );
        assert_eq!(
            access(&pv(&["ReadWriteMany"], None)),
            (Sharing::MultiNode, false)
        );
        assert_eq!(
            access(&pv(&["ReadWriteOnce"], Some(true))),
            (Sharing::SingleNode, true)
        );
    }
}
