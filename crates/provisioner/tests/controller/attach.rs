//! The VolumeAttachment controller over an in-memory [`Attacher`], against the emulator: the
//! VolumeAttachments are made here, as kube-controller-manager makes them for pods on nodes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use kube_emulator::Emulator;
use provisioner::attach::{
    ANN_NODE_ID, Access, AttachControllerConfig, AttachError, AttachRequest, Attacher,
    DetachRequest,
};
use serde_json::json;

use crate::common::{
    BACKOFF, ControllerEnv, DEADLINE, init_tracing, wait_for, wait_gone, wait_until,
};

const DRIVER: &str = "memory.example.com";
const FINALIZER: &str = "external-attacher/memory-example-com";
/// The node's CSI node ID, unlike its name, so a test sees which one the backend gets.
const NODE: &str = "node-a";
const NODE_ID: &str = "node-a-id";

/// Attachments are entries in a set: (volume handle, node ID).
#[derive(Default)]
struct MemoryAttacher {
    attached: Mutex<BTreeSet<(String, String)>>,
    /// Every call: ("attach" | "detach", volume handle, node ID).
    calls: Mutex<Vec<(&'static str, String, String)>>,
    /// The access the last attach was given.
    access: Mutex<Option<Access>>,
    /// While set, attaches fail with this message.
    attach_fails: Mutex<Option<String>>,
    /// While set, detaches fail with this message.
    detach_fails: Mutex<Option<String>>,
}

fn handle(volume: &PersistentVolume) -> String {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default()
}

impl MemoryAttacher {
    fn calls(&self, op: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _, _)| *o == op)
            .count()
    }

    fn attached(&self) -> Vec<(String, String)> {
        self.attached.lock().unwrap().iter().cloned().collect()
    }
}

impl MemoryAttacher {
    /// Records the call; the volume handle and node ID, or the failure set for `op`.
    fn call(
        &self,
        op: &'static str,
        volume: &PersistentVolume,
        node_id: &str,
        fails: &Mutex<Option<String>>,
    ) -> Result<(String, String), AttachError> {
        let key = (handle(volume), node_id.to_owned());
        self.calls
            .lock()
            .unwrap()
            .push((op, key.0.clone(), key.1.clone()));
        match fails.lock().unwrap().clone() {
            Some(message) => Err(AttachError::new(message)),
            None => Ok(key),
        }
    }
}

#[async_trait]
impl Attacher for MemoryAttacher {
    fn driver_name(&self) -> String {
        DRIVER.to_owned()
    }

    async fn attach(
        &self,
        request: &AttachRequest<'_>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        *self.access.lock().unwrap() = Some(request.access);
        let key = self.call(
            "attach",
            request.volume,
            request.node_id,
            &self.attach_fails,
        )?;
        let context = [("devicePath".to_owned(), format!("/dev/memory/{}", key.0))].into();
        self.attached.lock().unwrap().insert(key);
        Ok(context)
    }

    async fn detach(&self, request: &DetachRequest<'_>) -> Result<(), AttachError> {
        let key = self.call(
            "detach",
            request.volume,
            request.node_id,
            &self.detach_fails,
        )?;
        self.attached.lock().unwrap().remove(&key);
        Ok(())
    }
}

type Env = ControllerEnv<MemoryAttacher>;

/// The emulator with node `node-a` registered for our driver, a ReadWriteOnce CSI volume
/// `pv-1` (handle `vol-1`) and the attach controller.
async fn env() -> Env {
    init_tracing();
    let emulator = Emulator::new();
    let client = emulator.client();
    Api::<CSINode>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": NODE},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE_ID}]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    create_volume(&client, "pv-1", &[]).await;
    let backend = Arc::new(MemoryAttacher::default());
    let config = AttachControllerConfig {
        backoff: BACKOFF,
        ..Default::default()
    };
    Env::start(emulator, backend.clone(), |client| {
        provisioner::attach::run(client, backend, config)
    })
}

async fn create_volume(client: &Client, name: &str, finalizers: &[&str]) {
    let handle = name.replace("pv-", "vol-");
    Api::<PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name, "finalizers": finalizers},
                "spec": {
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "csi": {"driver": DRIVER, "volumeHandle": handle},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

impl ControllerEnv<MemoryAttacher> {
    fn attachments(&self) -> Api<VolumeAttachment> {
        Api::all(self.client.clone())
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    async fn attachment(&self, name: &str, source: serde_json::Value) {
        self.attachments()
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"attacher": DRIVER, "nodeName": NODE, "source": source},
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }

    /// Deletes `va-1` (kube-controller-manager's part when the volume's last pod goes).
    async fn delete_attachment(&self) {
        self.attachments()
            .delete("va-1", &DeleteParams::default())
            .await
            .unwrap();
    }

    /// `va-1` for `pv-1` on node-a, attached.
    async fn attached(&self) -> VolumeAttachment {
        self.attachment("va-1", json!({"persistentVolumeName": "pv-1"}))
            .await;
        wait_for(&self.attachments(), "va-1", "attached", is_attached).await
    }
}

fn is_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

fn attach_error(va: &VolumeAttachment) -> Option<String> {
    va.status.as_ref()?.attach_error.as_ref()?.message.clone()
}

fn detach_error(va: &VolumeAttachment) -> Option<String> {
    va.status.as_ref()?.detach_error.as_ref()?.message.clone()
}

fn has_finalizer(object: &impl kube::Resource) -> bool {
    object
        .meta()
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

#[tokio::test]
async fn attach_puts_finalizers_on_both_records_the_node_id_and_sets_attached() {
    let env = env().await;
    let va = env.attached().await;
    assert!(has_finalizer(&va), "{va:?}");
    assert_eq!(
        va.annotations().get(ANN_NODE_ID).map(String::as_str),
        Some(NODE_ID)
    );
    let status = va.status.unwrap();
    assert_eq!(
        status.attachment_metadata,
        Some([("devicePath".to_owned(), "/dev/memory/vol-1".to_owned())].into())
    );
    assert_eq!(status.attach_error, None);
    let pv = env.volumes().get("pv-1").await.unwrap();
    assert!(has_finalizer(&pv), "{pv:?}");
    // the backend got the node ID (not the node name) and the PV's access
    assert_eq!(
        env.backend.attached(),
        [("vol-1".to_owned(), NODE_ID.to_owned())]
    );
    assert_eq!(
        *env.backend.access.lock().unwrap(),
        Some(Access {
            multi_node: false,
            read_only: false
        })
    );
    assert_eq!(env.backend.calls("attach"), 1);
}

#[tokio::test]
async fn a_failed_attach_sets_attach_error_and_is_retried_until_it_succeeds() {
    let env = env().await;
    *env.backend.attach_fails.lock().unwrap() = Some("volume busy on node-z".to_owned());
    env.attachment("va-1", json!({"persistentVolumeName": "pv-1"}))
        .await;
    let va = wait_for(&env.attachments(), "va-1", "attachError", |va| {
        attach_error(va).is_some()
    })
    .await;
    assert_eq!(attach_error(&va).as_deref(), Some("volume busy on node-z"));
    assert!(!is_attached(&va));
    // finalizers go on before the attach is tried, so a delete meanwhile still detaches
    assert!(has_finalizer(&va));
    wait_until("the attach retried", || env.backend.calls("attach") >= 3).await;
    *env.backend.attach_fails.lock().unwrap() = None;
    let va = wait_for(&env.attachments(), "va-1", "attached", is_attached).await;
    assert_eq!(attach_error(&va), None);
    assert_eq!(
        env.backend.attached(),
        [("vol-1".to_owned(), NODE_ID.to_owned())]
    );
}

#[tokio::test]
async fn an_inline_volume_gets_an_attach_error_naming_the_problem() {
    let env = env().await;
    env.attachment(
        "va-inline",
        json!({"inlineVolumeSpec": {"csi": {"driver": DRIVER, "volumeHandle": "vol-9"}}}),
    )
    .await;
    let va = wait_for(&env.attachments(), "va-inline", "attachError", |va| {
        attach_error(va).is_some()
    })
    .await;
    let message = attach_error(&va).unwrap();
    assert!(
        message.contains("inline volumes are not supported"),
        "{message}"
    );
    assert_eq!(env.backend.calls("attach"), 0);
}

/// The status write before the finalizer's removal changes the VolumeAttachment: the removal
/// must not fail on that and detach a second time.
#[tokio::test]
async fn a_deleted_attachment_is_detached_once_and_its_finalizer_removed() {
    let env = env().await;
    env.attached().await;
    env.delete_attachment().await;
    wait_gone(&env.attachments(), "va-1").await;
    assert_eq!(env.backend.attached(), Vec::<(String, String)>::new());
    let detaches: Vec<_> = env
        .backend
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(op, _, _)| *op == "detach")
        .cloned()
        .collect();
    assert_eq!(
        detaches,
        [("detach", "vol-1".to_owned(), NODE_ID.to_owned())]
    );
}

#[tokio::test]
async fn a_failed_detach_sets_detach_error_and_keeps_the_finalizer_until_it_succeeds() {
    let env = env().await;
    env.attached().await;
    *env.backend.detach_fails.lock().unwrap() = Some("device still mapped".to_owned());
    env.delete_attachment().await;
    let va = wait_for(&env.attachments(), "va-1", "detachError", |va| {
        detach_error(va).is_some()
    })
    .await;
    assert_eq!(detach_error(&va).as_deref(), Some("device still mapped"));
    assert!(has_finalizer(&va));
    assert!(is_attached(&va), "still attached while the detach fails");
    wait_until("the detach retried", || env.backend.calls("detach") >= 3).await;
    *env.backend.detach_fails.lock().unwrap() = None;
    wait_gone(&env.attachments(), "va-1").await;
    assert_eq!(env.backend.attached(), Vec::<(String, String)>::new());
}

/// Polls until PV `name` is gone or no longer carries our finalizer.
async fn wait_released(env: &Env, name: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let pv = env.volumes().get_opt(name).await.unwrap();
        if !pv.as_ref().is_some_and(has_finalizer) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name} to lose {FINALIZER}: {pv:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_deleted_volume_keeps_the_finalizer_until_its_last_attachment_goes() {
    let env = env().await;
    env.attached().await;
    env.volumes()
        .delete("pv-1", &DeleteParams::default())
        .await
        .unwrap();
    let pv = wait_for(&env.volumes(), "pv-1", "being deleted", |pv| {
        pv.metadata.deletion_timestamp.is_some()
    })
    .await;
    assert!(has_finalizer(&pv), "{pv:?}");
    env.delete_attachment().await;
    wait_gone(&env.attachments(), "va-1").await;
    wait_released(&env, "pv-1").await;
}

/// A finalizer left behind (the attachment went while the controller was down): released once
/// the volume is deleted, as no attachment names it.
#[tokio::test]
async fn a_deleted_volume_no_attachment_names_is_released() {
    let env = env().await;
    create_volume(&env.client, "pv-2", &[FINALIZER]).await;
    env.volumes()
        .delete("pv-2", &DeleteParams::default())
        .await
        .unwrap();
    wait_released(&env, "pv-2").await;
    assert_eq!(env.backend.calls("detach"), 0);
}
