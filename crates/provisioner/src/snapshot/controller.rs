//! The VolumeSnapshotContent controller: external-snapshotter v8.3's sidecar-controller
//! (`pkg/sidecar-controller`) over a [`Snapshotter`] backend. See the [module docs](super) for
//! the flow.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::snapshotter::{
    CheckSnapshot, CreateSnapshot, DeleteSnapshot, SnapshotError, SnapshotInfo, SnapshotSecrets,
    Snapshotter,
};
use super::types::{VolumeSnapshotClass, VolumeSnapshotContent};
use super::{
    ANN_BEING_CREATED, ANN_BEING_DELETED, ANN_SECRET_NAME, ANN_SECRET_NAMESPACE, CONTENT_FINALIZER,
    LIST_SECRET_NAME, LIST_SECRET_NAMESPACE, SECRET_NAME, SECRET_NAMESPACE,
};
use crate::events::{EventRecorder, EventType};
use crate::queue::{Backoff, WorkQueue};
use crate::volume::SecretRef;

/// How often every content is looked at again (the sidecar's `--resync-period`).
const RESYNC: Duration = Duration::from_mins(15);

/// Settings of the content controller.
#[derive(Clone, Debug)]
pub struct ContentControllerConfig {
    /// Contents handled at once. Default: 10.
    pub workers: usize,
    /// Per-content retry backoff. Default: 1 s doubling to 5 min (the sidecar's).
    pub backoff: Backoff,
    /// Event source component. Default: `snapshot-controller`.
    pub component: String,
    /// Event source host (the instance's identity). Default: empty.
    pub identity: String,
    /// How long to wait before looking again for the snapshot API when it is not installed.
    /// Default: 10 s.
    pub api_poll: Duration,
}

impl Default for ContentControllerConfig {
    fn default() -> Self {
        ContentControllerConfig {
            workers: 10,
            backoff: Backoff {
                base_delay: Duration::from_secs(1),
                max_delay: Duration::from_mins(5),
            },
            component: "snapshot-controller".into(),
            identity: String::new(),
            api_poll: Duration::from_secs(10),
        }
    }
}

struct ContentController {
    client: Client,
    backend: Arc<dyn Snapshotter>,
    drivers: Vec<String>,
    queue: WorkQueue<String>,
    recorder: EventRecorder,
}

/// What a failed step reports.
struct Failure {
    message: String,
    /// The snapshot may exist (a timeout): keep the being-created annotation.
    uncertain: bool,
}

impl Failure {
    fn new(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            uncertain: false,
        }
    }
}

impl From<SnapshotError> for Failure {
    fn from(e: SnapshotError) -> Self {
        Failure {
            uncertain: e.is_uncertain(),
            message: e.to_string(),
        }
    }
}

/// The controller as a task for [`crate::Controller::with_companion`].
pub fn task(
    client: Client,
    backend: Arc<dyn Snapshotter>,
    config: ContentControllerConfig,
) -> crate::Companion {
    Box::pin(async move { run(client, backend, config).await })
}

fn contents(client: &Client) -> Api<VolumeSnapshotContent> {
    Api::all(client.clone())
}

/// Runs until dropped (or the content watch ends).
pub async fn run(client: Client, backend: Arc<dyn Snapshotter>, config: ContentControllerConfig) {
    let recorder = EventRecorder::new(client.clone(), &config.component, &config.identity);
    let ctl = Arc::new(ContentController {
        client: client.clone(),
        drivers: backend.driver_names(),
        backend,
        queue: WorkQueue::new(config.backoff),
        recorder,
    });
    // No snapshot CRDs (no snapshot add-on): nothing to do until they appear.
    let api = contents(&client);
    let mut said = false;
    loop {
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if !said {
                    tracing::info!(
                        "no VolumeSnapshotContent API (snapshot CRDs not installed); snapshots are off until it appears"
                    );
                    said = true;
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing VolumeSnapshotContents failed"),
        }
        tokio::time::sleep(config.api_poll).await;
    }
    tracing::info!(drivers = ?ctl.drivers, "watching VolumeSnapshotContents");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..config.workers.max(1) {
        let ctl = Arc::clone(&ctl);
        tasks.spawn(async move { ctl.worker().await });
    }
    let resync = Arc::clone(&ctl);
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(RESYNC).await;
            if let Ok(list) = contents(&resync.client).list(&ListParams::default()).await {
                for c in list.items {
                    if resync.ours(&c) {
                        resync.queue.add(c.name_any());
                    }
                }
            }
        }
    });
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    loop {
        match stream.next().await {
            Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) => {
                if ctl.ours(&c) && !settled(&c) {
                    ctl.queue.add(c.name_any());
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "VolumeSnapshotContent watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None => break,
        }
    }
    ctl.queue.shut_down();
}

fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or_else(
        |_| now_nanos(),
        |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
    )
}

fn has_annotation(c: &VolumeSnapshotContent, key: &str) -> bool {
    c.annotations().contains_key(key)
}

fn object_ref(c: &VolumeSnapshotContent) -> ObjectReference {
    ObjectReference {
        api_version: Some("snapshot.storage.k8s.io/v1".into()),
        kind: Some("VolumeSnapshotContent".into()),
        name: c.metadata.name.clone(),
        uid: c.metadata.uid.clone(),
        resource_version: c.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// Nothing to do for this content as the watch shows it: ready, its create finished, not
/// deleted (a sync would read it again only to find so). Its next change is another event; the
/// resync still looks at every content.
pub(super) fn settled(c: &VolumeSnapshotContent) -> bool {
    c.metadata.deletion_timestamp.is_none() && c.is_ready() && !has_annotation(c, ANN_BEING_CREATED)
}

/// The sidecar's `shouldDelete`: deleted, and either marked by the snapshot-controller or a
/// pre-provisioned content never bound.
pub(super) fn should_delete(c: &VolumeSnapshotContent) -> bool {
    if c.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let unbound_static = c.spec.source.snapshot_handle.is_some() && c.bound_uid().is_none();
    unbound_static || has_annotation(c, ANN_BEING_DELETED)
}

/// A secret named by two entries of `map`.
fn secret_ref(map: &BTreeMap<String, String>, name: &str, namespace: &str) -> Option<SecretRef> {
    Some(SecretRef {
        name: map.get(name)?.clone(),
        namespace: map.get(namespace)?.clone(),
    })
}

/// The secrets the content's annotations and its class's parameters name. Pure.
pub(super) fn secrets(
    content: &VolumeSnapshotContent,
    class: Option<&VolumeSnapshotClass>,
) -> SnapshotSecrets {
    let params = class.and_then(|c| c.parameters.as_ref());
    SnapshotSecrets {
        snapshotter: secret_ref(content.annotations(), ANN_SECRET_NAME, ANN_SECRET_NAMESPACE),
        list: params.and_then(|p| secret_ref(p, LIST_SECRET_NAME, LIST_SECRET_NAMESPACE)),
    }
}

/// The class's parameters without the sidecar's own secret keys. Pure.
pub(super) fn backend_parameters(class: Option<&VolumeSnapshotClass>) -> BTreeMap<String, String> {
    let known = [
        SECRET_NAME,
        SECRET_NAMESPACE,
        LIST_SECRET_NAME,
        LIST_SECRET_NAMESPACE,
    ];
    class
        .and_then(|c| c.parameters.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| !known.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl ContentController {
    fn ours(&self, c: &VolumeSnapshotContent) -> bool {
        self.drivers.contains(&c.spec.driver)
    }

    async fn worker(&self) {
        while let Some(name) = self.queue.get().await {
            if self.sync(&name).await {
                self.queue.forget(&name);
            } else {
                self.queue.add_rate_limited(name.clone());
            }
            self.queue.done(&name);
        }
    }

    /// One look at the content `name`; false to retry it.
    async fn sync(&self, name: &str) -> bool {
        let content = match contents(&self.client).get_opt(name).await {
            Ok(Some(c)) => c,
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!(content = name, error = %e, "reading VolumeSnapshotContent failed");
                return false;
            }
        };
        if !self.ours(&content) {
            return true;
        }
        let result = if should_delete(&content) {
            self.delete(&content).await
        } else if content.metadata.deletion_timestamp.is_some() {
            // deleted, but its snapshot is not: the snapshot-controller marks it first
            Ok(())
        } else if content.is_ready() {
            if has_annotation(&content, ANN_BEING_CREATED) {
                self.annotate(name, ANN_BEING_CREATED, None)
                    .await
                    .map_err(Failure::new)
            } else {
                Ok(())
            }
        } else {
            self.create(&content).await.map(drop)
        };
        match result {
            Ok(()) => true,
            Err(f) => {
                tracing::warn!(content = name, error = %f.message, "VolumeSnapshotContent sync failed");
                false
            }
        }
    }

    async fn annotate(&self, name: &str, key: &str, value: Option<&str>) -> Result<(), String> {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        contents(&self.client)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| format!("annotating VolumeSnapshotContent {name}: {e}"))
    }

    async fn patch_status(&self, name: &str, status: Value) -> Result<(), String> {
        let patch = json!({ "status": status });
        contents(&self.client)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| format!("updating the status of VolumeSnapshotContent {name}: {e}"))
    }

    /// Records a failure: `status.error` (readyToUse false) and a Warning event; nothing when
    /// the same error is recorded already (as the sidecar).
    async fn report(&self, content: &VolumeSnapshotContent, reason: &str, message: &str) {
        let name = content.name_any();
        if content.error_message() == Some(message) {
            return;
        }
        self.recorder
            .record(object_ref(content), EventType::Warning, reason, message);
        let time = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut status = json!({"error": {"time": time, "message": message}});
        if !content.is_ready() {
            status["readyToUse"] = json!(false);
        }
        if let Err(e) = self.patch_status(&name, status).await {
            tracing::warn!(content = %name, error = %e, "could not record the error");
        }
    }

    /// The content's class, if it names one.
    async fn class(
        &self,
        content: &VolumeSnapshotContent,
    ) -> Result<Option<VolumeSnapshotClass>, Failure> {
        let Some(class_name) = content
            .spec
            .volume_snapshot_class_name
            .as_deref()
            .filter(|s| !s.is_empty())
        else {
            return Ok(None);
        };
        let api: Api<VolumeSnapshotClass> = Api::all(self.client.clone());
        api.get_opt(class_name)
            .await
            .map_err(|e| Failure::new(format!("reading VolumeSnapshotClass {class_name}: {e}")))
    }

    /// Creates (or finds) the snapshot and fills the status. Returns the snapshot handle.
    async fn create(&self, content: &VolumeSnapshotContent) -> Result<String, Failure> {
        let result = self.create_inner(content).await;
        if let Err(f) = &result {
            // the sidecar's reasons: a dynamic snapshot's create, a pre-provisioned one's check
            let (reason, what) = if content.spec.source.snapshot_handle.is_some() {
                (
                    "SnapshotContentCheckandUpdateFailed",
                    "Failed to check and update snapshot content",
                )
            } else {
                ("SnapshotCreationFailed", "Failed to create snapshot")
            };
            let message = format!("{what}: {}", f.message);
            self.report(content, reason, &message).await;
            if !f.uncertain && has_annotation(content, ANN_BEING_CREATED) {
                let _ = self
                    .annotate(&content.name_any(), ANN_BEING_CREATED, None)
                    .await;
            }
        }
        result
    }

    async fn create_inner(&self, content: &VolumeSnapshotContent) -> Result<String, Failure> {
        let name = content.name_any();
        if let Some(handle) = &content.spec.source.snapshot_handle {
            let class = self.class(content).await?;
            let request = CheckSnapshot {
                handle: handle.clone(),
                secrets: secrets(content, class.as_ref()),
            };
            let info = self
                .backend
                .check_snapshot(&request)
                .await
                .map_err(Failure::from)?;
            self.ready(&name, &info).await?;
            return Ok(info.handle);
        }
        let Some(volume_handle) = &content.spec.source.volume_handle else {
            return Err(Failure::new(
                "spec.source has neither volumeHandle nor snapshotHandle",
            ));
        };
        let ref_uid = content
            .bound_uid()
            .ok_or_else(|| Failure::new("spec.volumeSnapshotRef.uid is empty (not bound yet)"))?;
        let class = self.class(content).await?;
        let request = CreateSnapshot {
            name: format!("snapshot-{ref_uid}"),
            source_volume: volume_handle.clone(),
            class_name: class.as_ref().map(ResourceExt::name_any),
            parameters: backend_parameters(class.as_ref()),
            secrets: secrets(content, class.as_ref()),
        };
        if !has_annotation(content, ANN_BEING_CREATED) {
            self.annotate(&name, ANN_BEING_CREATED, Some("yes"))
                .await
                .map_err(Failure::new)?;
        }
        let info = self
            .backend
            .create_snapshot(&request)
            .await
            .map_err(Failure::from)?;
        self.ready(&name, &info).await?;
        tracing::info!(content = %name, snapshot_handle = %info.handle, "snapshot ready");
        Ok(info.handle)
    }

    async fn ready(&self, name: &str, info: &SnapshotInfo) -> Result<(), Failure> {
        let mut status = json!({
            "snapshotHandle": info.handle,
            "readyToUse": true,
            "creationTime": nanos(info.created),
            "error": null,
        });
        if info.size_bytes > 0 {
            status["restoreSize"] = json!(info.size_bytes);
        }
        self.patch_status(name, status).await.map_err(|m| Failure {
            message: m,
            uncertain: true,
        })?;
        self.annotate(name, ANN_BEING_CREATED, None)
            .await
            .map_err(Failure::new)
    }

    /// Deletes the snapshot by the content's policy, clears the status, drops the finalizer.
    async fn delete(&self, content: &VolumeSnapshotContent) -> Result<(), Failure> {
        let name = content.name_any();
        let mut handle = content
            .status_handle()
            .map(str::to_owned)
            .or_else(|| content.spec.source.snapshot_handle.clone());
        if has_annotation(content, ANN_BEING_CREATED) {
            // a create was cut short (crash, timeout): finish it so nothing is left behind
            handle = Some(self.create(content).await?);
        }
        let policy = content.spec.deletion_policy.as_deref().unwrap_or("Delete");
        if policy == "Delete"
            && let Some(handle) = handle
        {
            let result = self.delete_snapshot(content, handle).await;
            if let Err(f) = &result {
                let message = format!("Failed to delete snapshot: {}", f.message);
                self.recorder.record(
                    object_ref(content),
                    EventType::Warning,
                    "SnapshotDeleteError",
                    &message,
                );
            }
            result?;
            // the sidecar's clearVolumeContentStatus: the snapshot's fields go, an error stays
            let cleared = json!({
                "snapshotHandle": null,
                "readyToUse": null,
                "creationTime": null,
                "restoreSize": null,
            });
            self.patch_status(&name, cleared)
                .await
                .map_err(Failure::new)?;
        }
        if content.finalizers().iter().any(|f| f == CONTENT_FINALIZER) {
            self.remove_finalizer(&name).await?;
        }
        tracing::info!(content = %name, policy, "VolumeSnapshotContent released");
        Ok(())
    }

    /// Removes our finalizer from the content as it is now (written on the resourceVersion
    /// read, so another writer's finalizer is never dropped; read again on a conflict).
    async fn remove_finalizer(&self, name: &str) -> Result<(), Failure> {
        crate::finalizers::remove(&contents(&self.client), name, CONTENT_FINALIZER)
            .await
            .map_err(|e| Failure::new(format!("removing the finalizer of {name}: {e}")))
    }

    async fn delete_snapshot(
        &self,
        content: &VolumeSnapshotContent,
        handle: String,
    ) -> Result<(), Failure> {
        let class = if content.spec.volume_snapshot_class_name.is_some() {
            self.class(content).await?
        } else {
            None
        };
        let request = DeleteSnapshot {
            handle,
            source_volume: content.spec.source.volume_handle.clone(),
            secrets: secrets(content, class.as_ref()),
        };
        self.backend
            .delete_snapshot(&request)
            .await
            .map_err(Failure::from)?;
        tracing::info!(content = %content.name_any(), snapshot_handle = %request.handle, "snapshot deleted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(v: Value) -> VolumeSnapshotContent {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn deletion_waits_for_the_snapshot_controller_unless_unbound_and_static() {
        let deleted =
            json!({"metadata": {"name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let mut dynamic = deleted.clone();
        dynamic["spec"] =
            json!({"source": {"volumeHandle": "v1/m/p/i"}, "volumeSnapshotRef": {"uid": "u"}});
        assert!(!should_delete(&content(dynamic.clone())));
        dynamic["metadata"]["annotations"] = json!({ANN_BEING_DELETED: "yes"});
        assert!(should_delete(&content(dynamic)));
        let mut unbound = deleted.clone();
        unbound["spec"] =
            json!({"source": {"snapshotHandle": "s1/m/p/i"}, "volumeSnapshotRef": {"name": "vs"}});
        assert!(should_delete(&content(unbound)));
        let live = json!({"metadata": {"name": "c", "annotations": {ANN_BEING_DELETED: "yes"}}});
        assert!(!should_delete(&content(live)));
    }

    #[test]
    fn only_a_ready_finished_live_content_is_settled() {
        let ready = json!({"metadata": {"name": "c"},
            "status": {"readyToUse": true, "snapshotHandle": "s1/m/p/i"}});
        assert!(settled(&content(ready.clone())));
        let mut creating = ready.clone();
        creating["metadata"]["annotations"] = json!({ANN_BEING_CREATED: "yes"});
        assert!(
            !settled(&content(creating)),
            "its annotation is still to go"
        );
        let mut deleted = ready.clone();
        deleted["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(!settled(&content(deleted)));
        let mut unready = ready;
        unready["status"]["readyToUse"] = json!(false);
        assert!(!settled(&content(unready)));
    }

    #[test]
    fn ready_needs_the_flag_and_a_handle() {
        let c = |status: Value| content(json!({"metadata": {"name": "c"}, "status": status}));
        assert!(c(json!({"readyToUse": true, "snapshotHandle": "s1/m/p/i"})).is_ready());
        assert!(!c(json!({"readyToUse": true})).is_ready());
        assert!(!c(json!({"readyToUse": false, "snapshotHandle": "s1/m/p/i"})).is_ready());
    }

    #[test]
    fn secrets_come_from_the_annotations_and_the_class_and_are_not_backend_parameters() {
        let c = content(json!({"metadata": {"name": "c", "annotations": {
            ANN_SECRET_NAME: "s", ANN_SECRET_NAMESPACE: "ns",
        }}}));
        let class: VolumeSnapshotClass = serde_json::from_value(json!({
            "metadata": {"name": "k"}, "driver": "d",
            "parameters": {
                SECRET_NAME: "s", SECRET_NAMESPACE: "ns",
                LIST_SECRET_NAME: "l", LIST_SECRET_NAMESPACE: "lns",
                "pool": "fast",
            },
        }))
        .unwrap();
        let found = secrets(&c, Some(&class));
        let named = |namespace: &str, name: &str| {
            Some(SecretRef {
                namespace: namespace.into(),
                name: name.into(),
            })
        };
        assert_eq!(found.snapshotter, named("ns", "s"));
        assert_eq!(found.list, named("lns", "l"));
        assert_eq!(
            backend_parameters(Some(&class)),
            [("pool".to_string(), "fast".to_string())].into()
        );
        let bare = content(json!({"metadata": {"name": "c"}}));
        assert_eq!(secrets(&bare, None), SnapshotSecrets::default());
    }
}
