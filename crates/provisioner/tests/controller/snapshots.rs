//! The VolumeSnapshotContent controller over an in-memory [`Snapshotter`], with the emulator's
//! snapshot-controller slice turning VolumeSnapshots into contents.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use kube_emulator::Emulator;
use provisioner::SecretRef;
use provisioner::snapshot::{
    ANN_BEING_CREATED, CheckSnapshot, ContentControllerConfig, CreateSnapshot, DeleteSnapshot,
    SnapshotError, SnapshotInfo, Snapshotter, VolumeSnapshot, VolumeSnapshotClass,
    VolumeSnapshotContent,
};
use serde_json::json;

use crate::common::{
    BACKOFF, ControllerEnv, NS, init_tracing, wait_for, wait_for_event, wait_gone,
};

const DRIVER: &str = "memory.example.com";
const CLASS: &str = "memory-snapshots";

/// How the next creates fail, while set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failing {
    No,
    /// Refused, nothing made.
    Final,
    /// Timed out after making the snapshot.
    Uncertain,
}

/// Snapshots are entries in a map: request name -> (source volume, size).
struct MemorySnapshotter {
    snapshots: Mutex<BTreeMap<String, (String, u64)>>,
    /// Every call: ("create" | "check" | "delete", name or handle).
    calls: Mutex<Vec<(&'static str, String)>>,
    /// The secrets the last create was given.
    create_secrets: Mutex<Option<SecretRef>>,
    failing: Mutex<Failing>,
    deletes_fail: AtomicBool,
}

impl MemorySnapshotter {
    fn new() -> Arc<Self> {
        Arc::new(MemorySnapshotter {
            snapshots: Mutex::default(),
            calls: Mutex::default(),
            create_secrets: Mutex::default(),
            failing: Mutex::new(Failing::No),
            deletes_fail: AtomicBool::new(false),
        })
    }

    fn names(&self) -> Vec<String> {
        self.snapshots.lock().unwrap().keys().cloned().collect()
    }

    fn calls(&self, op: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| *o == op)
            .count()
    }

    fn fail_creates(&self, how: Failing) {
        *self.failing.lock().unwrap() = how;
    }
}

#[async_trait]
impl Snapshotter for MemorySnapshotter {
    fn driver_names(&self) -> Vec<String> {
        vec![DRIVER.to_owned()]
    }

    async fn create_snapshot(
        &self,
        request: &CreateSnapshot,
    ) -> Result<SnapshotInfo, SnapshotError> {
        self.calls
            .lock()
            .unwrap()
            .push(("create", request.name.clone()));
        *self.create_secrets.lock().unwrap() = request.secrets.snapshotter.clone();
        if let Some((k, _)) = request.parameters.iter().next() {
            return Err(SnapshotError::final_error(format!(
                "unknown parameter {k:?}"
            )));
        }
        let failing = *self.failing.lock().unwrap();
        if failing == Failing::Final {
            return Err(SnapshotError::final_error(
                "the volume is not snapshottable now",
            ));
        }
        // idempotent: a retry finds the snapshot made before
        self.snapshots
            .lock()
            .unwrap()
            .entry(request.name.clone())
            .or_insert((request.source_volume.clone(), 1 << 30));
        if failing == Failing::Uncertain {
            return Err(SnapshotError::uncertain("timed out"));
        }
        Ok(SnapshotInfo {
            handle: request.name.clone(),
            size_bytes: 1 << 30,
            created: SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        })
    }

    async fn check_snapshot(&self, request: &CheckSnapshot) -> Result<SnapshotInfo, SnapshotError> {
        self.calls
            .lock()
            .unwrap()
            .push(("check", request.handle.clone()));
        let size = self
            .snapshots
            .lock()
            .unwrap()
            .get(&request.handle)
            .map(|(_, size)| *size)
            .ok_or_else(|| SnapshotError::retriable(format!("no snapshot {}", request.handle)))?;
        Ok(SnapshotInfo {
            handle: request.handle.clone(),
            size_bytes: size,
            created: SystemTime::now(),
        })
    }

    async fn delete_snapshot(&self, request: &DeleteSnapshot) -> Result<(), SnapshotError> {
        self.calls
            .lock()
            .unwrap()
            .push(("delete", request.handle.clone()));
        if self.deletes_fail.load(Ordering::SeqCst) {
            return Err(SnapshotError::retriable("the snapshot is in use"));
        }
        self.snapshots.lock().unwrap().remove(&request.handle);
        Ok(())
    }
}

type Env = ControllerEnv<MemorySnapshotter>;

fn dynamic<K: kube::Resource<DynamicType = ()>>(
    client: &Client,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<K>(&());
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

async fn create(api: &Api<DynamicObject>, object: serde_json::Value) {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap();
}

/// The emulator with the snapshot CRDs, a claim bound to a CSI volume `vol-1` of our driver, a
/// VolumeSnapshotClass (`parameters` beyond its snapshotter secret as given) and the content
/// controller.
async fn env(parameters: serde_json::Value) -> Env {
    init_tracing();
    let emulator = Emulator::builder().snapshot_crds(true).build();
    let client = emulator.client();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let claim = claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "data", "namespace": NS},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "volumeName": "pv-1", "resources": {"requests": {"storage": "1Gi"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "pv-1"},
                "spec": {
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "claimRef": {"kind": "PersistentVolumeClaim", "namespace": NS,
                                 "name": "data", "uid": claim.uid()},
                    "csi": {"driver": DRIVER, "volumeHandle": "vol-1"},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    wait_for(&claims, "data", "Bound", |c| {
        c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    })
    .await;
    let mut params = json!({
        "csi.storage.k8s.io/snapshotter-secret-name": "snap-creds",
        "csi.storage.k8s.io/snapshotter-secret-namespace": NS,
    });
    if let (Some(all), Some(extra)) = (params.as_object_mut(), parameters.as_object()) {
        all.extend(extra.clone());
    }
    create(
        &dynamic::<VolumeSnapshotClass>(&client, None),
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": CLASS}, "driver": DRIVER, "deletionPolicy": "Delete",
            "parameters": params,
        }),
    )
    .await;
    let backend = MemorySnapshotter::new();
    let config = ContentControllerConfig {
        workers: 2,
        backoff: BACKOFF,
        api_poll: Duration::from_millis(100),
        ..Default::default()
    };
    Env::start(emulator, backend.clone(), |client| {
        provisioner::snapshot::run(client, backend, config)
    })
}

impl ControllerEnv<MemorySnapshotter> {
    fn snapshots(&self) -> Api<VolumeSnapshot> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn contents(&self) -> Api<VolumeSnapshotContent> {
        Api::all(self.client.clone())
    }

    async fn snapshot(&self, name: &str) -> VolumeSnapshot {
        create(
            &dynamic::<VolumeSnapshot>(&self.client, Some(NS)),
            json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"volumeSnapshotClassName": CLASS,
                         "source": {"persistentVolumeClaimName": "data"}},
            }),
        )
        .await;
        self.snapshots().get(name).await.unwrap()
    }

    /// The content the snapshot-controller made for `vs`.
    async fn content_of(&self, vs: &VolumeSnapshot) -> String {
        let name = format!("snapcontent-{}", vs.uid().unwrap());
        wait_for(&self.contents(), &name, "created", |_| true).await;
        name
    }
}

#[tokio::test]
async fn a_snapshot_is_created_once_recorded_and_deleted_with_its_volume_snapshot() {
    let env = env(json!({})).await;
    let vs = env.snapshot("snap").await;
    let request = format!("snapshot-{}", vs.uid().unwrap());
    let ready = wait_for(
        &env.snapshots(),
        "snap",
        "readyToUse",
        VolumeSnapshot::is_ready,
    )
    .await;
    let content = env
        .contents()
        .get(&env.content_of(&vs).await)
        .await
        .unwrap();
    let status = content.status.clone().unwrap();
    assert_eq!(status.snapshot_handle.as_deref(), Some(request.as_str()));
    assert_eq!(status.restore_size, Some(1 << 30));
    assert_eq!(status.creation_time, Some(1_700_000_000_000_000_000));
    assert!(!content.annotations().contains_key(ANN_BEING_CREATED));
    assert_eq!(
        ready.status.and_then(|s| s.restore_size).map(|q| q.0),
        Some("1Gi".to_string())
    );
    assert_eq!(env.backend.names(), vec![request.clone()]);
    assert_eq!(env.backend.calls("create"), 1);
    // the snapshotter secret reaches the backend as a reference
    assert_eq!(
        *env.backend.create_secrets.lock().unwrap(),
        Some(SecretRef {
            namespace: NS.into(),
            name: "snap-creds".into()
        })
    );

    env.snapshots()
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&env.contents(), &content.name_any()).await;
    wait_gone(&env.snapshots(), "snap").await;
    assert!(env.backend.names().is_empty());
    assert_eq!(env.backend.calls("delete"), 1);
}

#[tokio::test]
async fn a_final_failure_is_recorded_on_the_content_and_retried_until_it_succeeds() {
    let env = env(json!({})).await;
    env.backend.fail_creates(Failing::Final);
    let vs = env.snapshot("snap").await;
    let name = env.content_of(&vs).await;
    let failed = wait_for(&env.contents(), &name, "status.error", |c| {
        c.error_message().is_some()
    })
    .await;
    assert_eq!(
        failed.error_message(),
        Some("Failed to create snapshot: the volume is not snapshottable now")
    );
    assert_eq!(failed.status.and_then(|s| s.ready_to_use), Some(false));
    wait_for_event(
        &env.client,
        &name,
        "SnapshotCreationFailed",
        "the volume is not snapshottable now",
    )
    .await;
    // nothing may exist after a final failure: the being-created mark goes
    wait_for(&env.contents(), &name, "no being-created mark", |c| {
        !c.annotations().contains_key(ANN_BEING_CREATED)
    })
    .await;
    assert!(env.backend.names().is_empty());

    env.backend.fail_creates(Failing::No);
    wait_for(&env.contents(), &name, "ready, error cleared", |c| {
        c.is_ready() && c.error_message().is_none()
    })
    .await;
    wait_for(
        &env.snapshots(),
        "snap",
        "readyToUse",
        VolumeSnapshot::is_ready,
    )
    .await;
}

#[tokio::test]
async fn an_uncertain_create_keeps_its_mark_and_a_deletion_completes_it_before_deleting() {
    let env = env(json!({})).await;
    env.backend.fail_creates(Failing::Uncertain);
    let vs = env.snapshot("snap").await;
    let name = env.content_of(&vs).await;
    let failed = wait_for(&env.contents(), &name, "status.error", |c| {
        c.error_message().is_some()
    })
    .await;
    assert!(failed.annotations().contains_key(ANN_BEING_CREATED));
    // the snapshot exists though the create timed out
    assert_eq!(env.backend.names().len(), 1);

    env.snapshots()
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    // deleted while uncertain: the content waits for the create to complete
    crate::common::wait_until("a create retried during the deletion", || {
        env.backend.calls("create") >= 3
    })
    .await;
    assert!(env.contents().get_opt(&name).await.unwrap().is_some());
    assert_eq!(env.backend.calls("delete"), 0);

    env.backend.fail_creates(Failing::No);
    wait_gone(&env.contents(), &name).await;
    assert!(env.backend.names().is_empty(), "{:?}", env.backend.names());
    assert_eq!(env.backend.calls("delete"), 1);
}

#[tokio::test]
async fn class_parameters_reach_the_backend_without_the_secret_keys() {
    let env = env(json!({"pool": "fast"})).await;
    let vs = env.snapshot("snap").await;
    let name = env.content_of(&vs).await;
    let failed = wait_for(&env.contents(), &name, "status.error", |c| {
        c.error_message().is_some()
    })
    .await;
    assert_eq!(
        failed.error_message(),
        Some("Failed to create snapshot: unknown parameter \"pool\"")
    );
}

#[tokio::test]
async fn a_failed_delete_keeps_the_content_and_its_finalizer_until_it_succeeds() {
    let env = env(json!({})).await;
    let vs = env.snapshot("snap").await;
    wait_for(
        &env.snapshots(),
        "snap",
        "readyToUse",
        VolumeSnapshot::is_ready,
    )
    .await;
    let name = env.content_of(&vs).await;
    env.backend.deletes_fail.store(true, Ordering::SeqCst);
    env.snapshots()
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_event(
        &env.client,
        &name,
        "SnapshotDeleteError",
        "the snapshot is in use",
    )
    .await;
    let kept = env.contents().get(&name).await.unwrap();
    assert!(
        kept.finalizers()
            .iter()
            .any(|f| f == provisioner::snapshot::CONTENT_FINALIZER)
    );
    assert_eq!(env.backend.names().len(), 1);

    env.backend.deletes_fail.store(false, Ordering::SeqCst);
    wait_gone(&env.contents(), &name).await;
    assert!(env.backend.names().is_empty());
}

#[tokio::test]
async fn a_pre_provisioned_content_is_ready_once_its_snapshot_is_found() {
    let env = env(json!({})).await;
    let contents = dynamic::<VolumeSnapshotContent>(&env.client, None);
    create(
        &contents,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "static"},
            "spec": {
                "driver": DRIVER, "deletionPolicy": "Retain",
                "source": {"snapshotHandle": "old-snapshot"},
                "volumeSnapshotRef": {"name": "restored", "namespace": NS},
            },
        }),
    )
    .await;
    let failed = wait_for(&env.contents(), "static", "status.error", |c| {
        c.error_message().is_some()
    })
    .await;
    assert_eq!(
        failed.error_message(),
        Some("Failed to check and update snapshot content: no snapshot old-snapshot")
    );
    env.backend
        .snapshots
        .lock()
        .unwrap()
        .insert("old-snapshot".into(), ("vol-0".into(), 2 << 30));
    let ready = wait_for(
        &env.contents(),
        "static",
        "ready",
        VolumeSnapshotContent::is_ready,
    )
    .await;
    assert_eq!(ready.status.and_then(|s| s.restore_size), Some(2 << 30));
    assert_eq!(env.backend.calls("create"), 0);
}

#[tokio::test]
async fn contents_of_other_drivers_are_left_alone() {
    let env = env(json!({})).await;
    let contents = dynamic::<VolumeSnapshotContent>(&env.client, None);
    create(
        &contents,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "theirs"},
            "spec": {
                "driver": "other.example.com", "deletionPolicy": "Delete",
                "source": {"snapshotHandle": "x"},
                "volumeSnapshotRef": {"name": "restored", "namespace": NS},
            },
        }),
    )
    .await;
    // a content of ours made after it is handled: the controller is running and saw both
    create(
        &contents,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
            "metadata": {"name": "ours"},
            "spec": {
                "driver": DRIVER, "deletionPolicy": "Retain",
                "source": {"snapshotHandle": "y"},
                "volumeSnapshotRef": {"name": "restored2", "namespace": NS},
            },
        }),
    )
    .await;
    wait_for(&env.contents(), "ours", "checked", |c| {
        c.error_message().is_some()
    })
    .await;
    let theirs = env.contents().get("theirs").await.unwrap();
    assert!(theirs.status.is_none(), "{:?}", theirs.status);
    let calls = env.backend.calls.lock().unwrap().clone();
    assert!(
        !calls.is_empty() && calls.iter().all(|c| *c == ("check", "y".to_string())),
        "{calls:?}"
    );
}
