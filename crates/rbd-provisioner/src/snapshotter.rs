//! The built-in VolumeSnapshotContent controller: what the csi-snapshotter sidecar
//! (external-snapshotter v8.3 `pkg/sidecar-controller`) does for our driver, in this binary, on
//! the volume core's snapshots ([`rbd_volume::snapshot`]). The common snapshot-controller (a
//! cluster add-on) turns VolumeSnapshots into contents; this fills them.
//!
//! Ours: contents whose `spec.driver` is the CSI driver name (`--csi-driver-name`, what the
//! snapshot-controller copies from a VolumeSnapshotClass naming our driver) or the provisioner
//! name (`--provisioner-name`). Snapshots need a CSI PV: the snapshot-controller takes the
//! source from the PV's `spec.csi.volumeHandle` and refuses in-tree `rbd` PVs.
//!
//! Per content, as the sidecar:
//! - dynamic (`spec.source.volumeHandle`), no ready status: annotate
//!   `snapshot.storage.kubernetes.io/volumesnapshot-being-created: yes`, create the snapshot
//!   (request name `snapshot-<VolumeSnapshot uid>`; class parameters other than
//!   `csi.storage.k8s.io/snapshotter-{,list-}secret-{name,namespace}` are an error), patch
//!   `/status` (`snapshotHandle`, `readyToUse`, `creationTime` in ns, `restoreSize` in bytes),
//!   drop the annotation. A failure goes to `status.error` and a `SnapshotCreationFailed`
//!   event, and is retried with the per-item backoff (1 s doubling to 5 min); the annotation
//!   stays only for a timeout (the snapshot may exist).
//! - pre-provisioned (`spec.source.snapshotHandle`): the snapshot is looked up in Ceph; found
//!   = ready, with its size and creation time.
//! - deleted (deletion timestamp and `volumesnapshot-being-deleted`, or a pre-provisioned
//!   content never bound): with policy `Delete` the snapshot is deleted, then the status's
//!   snapshot fields are cleared and the finalizer `volumesnapshotcontent-bound-protection`
//!   removed. A content still marked being-created is first completed (the create is
//!   idempotent; the sidecar likewise retries the create before it deletes), so a crash between
//!   annotation and status leaks nothing.
//!
//! Credentials: the secret the deletion-secret annotations name (set by the snapshot-controller
//! from the class parameters `csi.storage.k8s.io/snapshotter-secret-name`/`-namespace`; user
//! from its `userID`/`adminId` entry, else `admin`); without them, for a dynamic content, the
//! admin secret recorded on the source PV (as the provisioner's delete uses it); for a
//! pre-provisioned content, the class's `csi.storage.k8s.io/snapshotter-list-secret-*`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use provisioner::events::{EventRecorder, EventType};
use provisioner::queue::{Backoff, WorkQueue};
use rbd_csi::volume::VolumeId;
use rbd_volume::snapshot::{self, SnapshotError, SnapshotId, SnapshotOwner};
use serde_json::{Value, json};

use crate::backend::RbdBackend;
use crate::sources::{contents, snapshot_resource, str_at};
use crate::{crashpoint, monitors, secrets};

/// The content's finalizer (the snapshot-controller adds it, we remove it).
pub const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
pub const ANN_BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
pub const ANN_BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
pub const ANN_SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
pub const ANN_SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
const LIST_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-list-secret-name";
const LIST_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-list-secret-namespace";
/// Class parameters the sidecar strips (everything else `csi.storage.k8s.io/` is an error).
const KNOWN_PARAMS: [&str; 4] = [
    "csi.storage.k8s.io/snapshotter-secret-name",
    "csi.storage.k8s.io/snapshotter-secret-namespace",
    LIST_SECRET_NAME,
    LIST_SECRET_NAMESPACE,
];
/// How often every content is looked at again (the sidecar's `--resync-period`).
const RESYNC: Duration = Duration::from_secs(15 * 60);

/// Settings.
#[derive(Clone, Debug)]
pub struct SnapshotterConfig {
    pub workers: usize,
    /// Per-content retry backoff (upstream: 1 s doubling to 5 min).
    pub backoff: Backoff,
    /// Event source component.
    pub component: String,
    pub identity: String,
}

impl Default for SnapshotterConfig {
    fn default() -> Self {
        SnapshotterConfig {
            workers: 10,
            backoff: Backoff {
                base_delay: Duration::from_secs(1),
                max_delay: Duration::from_secs(300),
            },
            component: "rbd-provisioner-snapshotter".into(),
            identity: String::new(),
        }
    }
}

struct Snapshotter {
    client: Client,
    backend: Arc<RbdBackend>,
    queue: WorkQueue<String>,
    recorder: EventRecorder,
}

/// What a failed sync reports.
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

/// The controller as a task for [`provisioner::Controller::with_companion`].
pub fn task(backend: Arc<RbdBackend>, config: SnapshotterConfig) -> provisioner::Companion {
    Box::pin(async move { run(backend, config).await })
}

/// Runs until dropped.
pub async fn run(backend: Arc<RbdBackend>, config: SnapshotterConfig) {
    let client = backend.client().clone();
    let recorder = EventRecorder::new(client.clone(), &config.component, &config.identity);
    let ctl = Arc::new(Snapshotter {
        client: client.clone(),
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
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    tracing::info!(
        drivers = ?ctl.backend.snapshot_drivers(),
        "watching VolumeSnapshotContents"
    );
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
                if ctl.ours(&c) {
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

fn has_annotation(c: &DynamicObject, key: &str) -> bool {
    c.annotations().contains_key(key)
}

fn object_ref(c: &DynamicObject) -> ObjectReference {
    ObjectReference {
        api_version: Some("snapshot.storage.k8s.io/v1".into()),
        kind: Some("VolumeSnapshotContent".into()),
        name: c.metadata.name.clone(),
        uid: c.metadata.uid.clone(),
        resource_version: c.metadata.resource_version.clone(),
        ..Default::default()
    }
}

impl Snapshotter {
    fn ours(&self, c: &DynamicObject) -> bool {
        let driver = str_at(&c.data, "/spec/driver").unwrap_or_default();
        self.backend.snapshot_drivers().contains(&driver)
    }

    async fn worker(&self) {
        while let Some(name) = self.queue.get().await {
            match self.sync(&name).await {
                Ok(()) => self.queue.forget(&name),
                Err(()) => {
                    self.queue.add_rate_limited(name.clone());
                }
            }
            self.queue.done(&name);
        }
    }

    async fn sync(&self, name: &str) -> Result<(), ()> {
        let api = contents(&self.client);
        let content = match api.get_opt(name).await {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(()),
            Err(e) => {
                tracing::warn!(content = name, error = %e, "reading VolumeSnapshotContent failed");
                return Err(());
            }
        };
        if !self.ours(&content) {
            return Ok(());
        }
        let result = if should_delete(&content) {
            self.delete(&content).await
        } else if content.metadata.deletion_timestamp.is_some() {
            // deleted, but its snapshot is not: the snapshot-controller marks it first
            Ok(())
        } else if is_ready(&content) {
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
            Ok(()) => Ok(()),
            Err(f) => {
                tracing::warn!(content = name, error = %f.message, "VolumeSnapshotContent sync failed");
                Err(())
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
    async fn report(&self, content: &DynamicObject, reason: &str, message: &str) {
        let name = content.name_any();
        if str_at(&content.data, "/status/error/message") == Some(message) {
            return;
        }
        self.recorder
            .record(object_ref(content), EventType::Warning, reason, message);
        let time = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut status = json!({"error": {"time": time, "message": message}});
        if !is_ready(content) {
            status["readyToUse"] = json!(false);
        }
        if let Err(e) = self.patch_status(&name, status).await {
            tracing::warn!(content = %name, error = %e, "could not record the error");
        }
    }

    /// Creates (or finds) the snapshot and fills the status. Returns the snapshot handle.
    async fn create(&self, content: &DynamicObject) -> Result<String, Failure> {
        let name = content.name_any();
        let result = self.create_inner(content).await;
        match &result {
            Ok(_) => {}
            Err(f) => {
                // the sidecar's reasons: a dynamic snapshot's create, a pre-provisioned one's check
                let (reason, what) =
                    if str_at(&content.data, "/spec/source/snapshotHandle").is_some() {
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
                    let _ = self.annotate(&name, ANN_BEING_CREATED, None).await;
                }
            }
        }
        result
    }

    async fn create_inner(&self, content: &DynamicObject) -> Result<String, Failure> {
        let name = content.name_any();
        let c = &content.data;
        if let Some(handle) = str_at(c, "/spec/source/snapshotHandle") {
            return self.check_pre_provisioned(content, handle).await;
        }
        let Some(volume_handle) = str_at(c, "/spec/source/volumeHandle") else {
            return Err(Failure::new(
                "spec.source has neither volumeHandle nor snapshotHandle",
            ));
        };
        let ref_uid = str_at(c, "/spec/volumeSnapshotRef/uid")
            .filter(|u| !u.is_empty())
            .ok_or_else(|| Failure::new("spec.volumeSnapshotRef.uid is empty (not bound yet)"))?;
        self.check_class_parameters(content).await?;
        let source = VolumeId::parse(volume_handle).map_err(|e| {
            Failure::new(format!("spec.source.volumeHandle {volume_handle:?}: {e}"))
        })?;
        let request = format!("snapshot-{ref_uid}");
        if !has_annotation(content, ANN_BEING_CREATED) {
            self.annotate(&name, ANN_BEING_CREATED, Some("yes"))
                .await
                .map_err(Failure::new)?;
        }
        crashpoint::hit("before-snapshot-create");
        let (user, key) = self.credentials(content, Some(volume_handle)).await?;
        let cluster = self.cluster(&source.cluster, &user, key).await?;
        let image = snapshot::snapshot_image_name(&request);
        let owner = SnapshotOwner {
            name: request.clone(),
            source: volume_handle.to_owned(),
            driver: self.backend.snapshot_drivers()[0].to_owned(),
            kube_cluster: self.backend.kube_cluster().to_owned(),
        };
        let snap = snapshot::create_snapshot(
            &cluster,
            &snapshot::NewSnapshot {
                pool: &source.pool_spec(),
                source_image: &source.image,
                image: &image,
                owner: &owner,
            },
        )
        .await
        .map_err(|e| Failure {
            uncertain: matches!(&e, SnapshotError::Volume(v) if v.is_timeout()),
            message: e.to_string(),
        })?;
        crashpoint::hit("after-snapshot-create");
        let handle = SnapshotId::located(
            source.cluster.clone(),
            &source.pool,
            &source.namespace,
            &snap.image,
        )
        .encode()
        .map_err(Failure::new)?;
        self.ready(&name, &handle, &snap).await?;
        tracing::info!(content = %name, snapshot_handle = %handle, "snapshot ready");
        Ok(handle)
    }

    async fn ready(
        &self,
        name: &str,
        handle: &str,
        snap: &snapshot::Snapshot,
    ) -> Result<(), Failure> {
        let mut status = json!({
            "snapshotHandle": handle,
            "readyToUse": true,
            "creationTime": nanos(snap.created),
            "error": null,
        });
        if snap.size > 0 {
            status["restoreSize"] = json!(snap.size);
        }
        self.patch_status(name, status).await.map_err(|m| Failure {
            message: m,
            uncertain: true,
        })?;
        self.annotate(name, ANN_BEING_CREATED, None)
            .await
            .map_err(Failure::new)
    }

    async fn check_pre_provisioned(
        &self,
        content: &DynamicObject,
        handle: &str,
    ) -> Result<String, Failure> {
        let id = SnapshotId::parse(handle)
            .map_err(|e| Failure::new(format!("spec.source.snapshotHandle {handle:?}: {e}")))?;
        let (user, key) = self.credentials(content, None).await?;
        let cluster = self.cluster(&id.cluster, &user, key).await?;
        let snap = snapshot::find_snapshot(&cluster, &id.pool_spec(), &id.image)
            .await
            .map_err(|e| Failure::new(e.to_string()))?
            .ok_or_else(|| {
                Failure::new(format!(
                    "spec.source.snapshotHandle {handle:?}: no such snapshot in pool {}",
                    id.pool
                ))
            })?;
        self.ready(&content.name_any(), handle, &snap).await?;
        Ok(handle.to_owned())
    }

    /// The class's parameters: only the sidecar's own `csi.storage.k8s.io/` keys are allowed.
    async fn check_class_parameters(&self, content: &DynamicObject) -> Result<(), Failure> {
        let Some(class) = self.class(content).await? else {
            return Ok(());
        };
        let params = class.data.get("parameters").and_then(Value::as_object);
        for key in params.into_iter().flat_map(|p| p.keys()) {
            if !KNOWN_PARAMS.contains(&key.as_str()) {
                return Err(Failure::new(format!(
                    "VolumeSnapshotClass {} parameters: unknown parameter {key:?} (snapshots of \
                     this driver take only the csi.storage.k8s.io/snapshotter-* secret parameters)",
                    class.name_any()
                )));
            }
        }
        Ok(())
    }

    async fn class(&self, content: &DynamicObject) -> Result<Option<DynamicObject>, Failure> {
        let Some(class_name) =
            str_at(&content.data, "/spec/volumeSnapshotClassName").filter(|s| !s.is_empty())
        else {
            return Ok(None);
        };
        let api: Api<DynamicObject> = Api::all_with(
            self.client.clone(),
            &snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses"),
        );
        api.get_opt(class_name)
            .await
            .map_err(|e| Failure::new(format!("reading VolumeSnapshotClass {class_name}: {e}")))
    }

    async fn cluster(
        &self,
        cluster: &rbd_volume::ClusterRef,
        user: &str,
        key: ceph_rbd::Secret,
    ) -> Result<Arc<ceph_rbd::Cluster>, Failure> {
        let monitors = self.backend.monitors_of(cluster).map_err(Failure::new)?;
        let monitors = monitors::resolve(&monitors)
            .await
            .map_err(|e| Failure::new(e.to_string()))?;
        self.backend
            .cluster(&monitors, user, key)
            .await
            .map_err(|e| Failure {
                uncertain: e.is_connection_failure(),
                message: e.to_string(),
            })
    }

    /// User and key (see the module docs).
    async fn credentials(
        &self,
        content: &DynamicObject,
        volume_handle: Option<&str>,
    ) -> Result<(String, ceph_rbd::Secret), Failure> {
        let annotations = content.annotations();
        if let (Some(name), Some(ns)) = (
            annotations.get(ANN_SECRET_NAME),
            annotations.get(ANN_SECRET_NAMESPACE),
        ) {
            return self.secret(ns, name).await;
        }
        if let Some(handle) = volume_handle {
            let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
            let list = pvs
                .list(&ListParams::default())
                .await
                .map_err(|e| Failure::new(format!("listing PersistentVolumes: {e}")))?;
            if let Some(pv) = list.items.iter().find(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|c| c.volume_handle == handle)
            }) {
                let (_, _, user, key) = self.backend.access_for(pv).await.map_err(Failure::new)?;
                return Ok((user, key));
            }
        }
        if let Some(class) = self.class(content).await? {
            let p = |k: &str| {
                class
                    .data
                    .pointer(&format!("/parameters/{}", k.replace('/', "~1")))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            if let (Some(name), Some(ns)) = (p(LIST_SECRET_NAME), p(LIST_SECRET_NAMESPACE)) {
                return self.secret(&ns, &name).await;
            }
        }
        Err(Failure::new(format!(
            "no Ceph credentials for this snapshot: set the VolumeSnapshotClass parameters \
             csi.storage.k8s.io/snapshotter-secret-name/-namespace (the annotations \
             {ANN_SECRET_NAME}/{ANN_SECRET_NAMESPACE} on the content){}",
            if volume_handle.is_some() {
                ", or keep the source PersistentVolume"
            } else {
                ""
            }
        )))
    }

    async fn secret(&self, ns: &str, name: &str) -> Result<(String, ceph_rbd::Secret), Failure> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let secret = api
            .get_opt(name)
            .await
            .map_err(|e| Failure::new(format!("reading secret {ns}/{name}: {e}")))?
            .ok_or_else(|| Failure::new(format!("secret {ns}/{name} not found")))?;
        let entry = |k: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
                .or_else(|| {
                    secret
                        .string_data
                        .as_ref()
                        .and_then(|d| d.get(k))
                        .map(|v| v.trim().to_string())
                })
                .filter(|v| !v.is_empty())
        };
        let user = ["userID", "adminId", "adminID"]
            .iter()
            .find_map(|k| entry(k))
            .unwrap_or_else(|| "admin".into());
        match secrets::key_from(&secret) {
            secrets::Found::Key(key) => Ok((user, key)),
            _ => Err(Failure::new(format!(
                "secret {ns}/{name} has no Ceph key entry (\"userKey\" or \"key\")"
            ))),
        }
    }

    /// Deletes the snapshot by the content's policy, clears the status, drops the finalizer.
    async fn delete(&self, content: &DynamicObject) -> Result<(), Failure> {
        let name = content.name_any();
        let mut handle = str_at(&content.data, "/status/snapshotHandle")
            .or_else(|| str_at(&content.data, "/spec/source/snapshotHandle"))
            .map(str::to_owned);
        if has_annotation(content, ANN_BEING_CREATED) {
            // a create was cut short (crash, timeout): finish it so nothing is left behind
            handle = Some(self.create(content).await?);
        }
        let policy = str_at(&content.data, "/spec/deletionPolicy").unwrap_or("Delete");
        if policy == "Delete"
            && let Some(handle) = handle
        {
            let result = self.delete_snapshot(content, &handle).await;
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
        let finalizers: Vec<String> = content
            .finalizers()
            .iter()
            .filter(|f| *f != CONTENT_FINALIZER)
            .cloned()
            .collect();
        if finalizers.len() != content.finalizers().len() {
            let current = contents(&self.client)
                .get_opt(&name)
                .await
                .map_err(|e| Failure::new(e.to_string()))?;
            if let Some(current) = current {
                let kept: Vec<String> = current
                    .finalizers()
                    .iter()
                    .filter(|f| *f != CONTENT_FINALIZER)
                    .cloned()
                    .collect();
                let patch = json!({"metadata": {
                    "finalizers": kept,
                    "resourceVersion": current.metadata.resource_version,
                }});
                contents(&self.client)
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| Failure::new(format!("removing the finalizer of {name}: {e}")))?;
            }
        }
        tracing::info!(content = %name, policy, "VolumeSnapshotContent released");
        Ok(())
    }

    async fn delete_snapshot(&self, content: &DynamicObject, handle: &str) -> Result<(), Failure> {
        let Ok(id) = SnapshotId::parse(handle) else {
            tracing::warn!(handle, "not a snapshot handle of ours: nothing to delete");
            return Ok(());
        };
        let volume_handle = str_at(&content.data, "/spec/source/volumeHandle");
        let (user, key) = self.credentials(content, volume_handle).await?;
        let cluster = self.cluster(&id.cluster, &user, key).await?;
        crashpoint::hit("before-snapshot-delete");
        let deleted = snapshot::delete_snapshot(&cluster, &id.pool_spec(), &id.image)
            .await
            .map_err(|e| Failure::new(e.to_string()))?;
        crashpoint::hit("after-snapshot-delete");
        tracing::info!(content = %content.name_any(), snapshot_handle = handle, ?deleted, "snapshot deleted");
        Ok(())
    }
}

fn is_ready(c: &DynamicObject) -> bool {
    c.data
        .pointer("/status/readyToUse")
        .and_then(Value::as_bool)
        == Some(true)
        && str_at(&c.data, "/status/snapshotHandle").is_some_and(|h| !h.is_empty())
}

/// The sidecar's `shouldDelete`: deleted, and either marked by the snapshot-controller or a
/// pre-provisioned content never bound.
fn should_delete(c: &DynamicObject) -> bool {
    if c.metadata.deletion_timestamp.is_none() {
        return false;
    }
    let unbound_static = str_at(&c.data, "/spec/source/snapshotHandle").is_some()
        && str_at(&c.data, "/spec/volumeSnapshotRef/uid")
            .unwrap_or_default()
            .is_empty();
    unbound_static || has_annotation(c, ANN_BEING_DELETED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(v: Value) -> DynamicObject {
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
    fn ready_needs_the_flag_and_a_handle() {
        let c = |status: Value| content(json!({"metadata": {"name": "c"}, "status": status}));
        assert!(is_ready(&c(
            json!({"readyToUse": true, "snapshotHandle": "s1/m/p/i"})
        )));
        assert!(!is_ready(&c(json!({"readyToUse": true}))));
        assert!(!is_ready(&c(
            json!({"readyToUse": false, "snapshotHandle": "s1/m/p/i"})
        )));
    }
}
