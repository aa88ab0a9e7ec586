//! Shared helpers for the controller tests (run against `kube_emulator::Emulator`).
#![allow(dead_code)]

pub mod backend;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Resource};
use provisioner::queue::Backoff;
use provisioner::{Config, Controller, ControllerError, LeaderElectionConfig, LeaderElector};
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use self::backend::FakeBackend;

pub const PROVISIONER: &str = "test.example.com/fake";
pub const NS: &str = "default";
pub const DEADLINE: Duration = Duration::from_secs(15);
/// Per-item retry backoff shrunk for tests.
pub const BACKOFF: Backoff = Backoff {
    base_delay: Duration::from_millis(50),
    max_delay: Duration::from_millis(400),
};

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// An emulator and a controller task over an in-memory backend; the task ends with it.
pub struct ControllerEnv<B> {
    _emulator: kube_emulator::Emulator,
    pub client: Client,
    pub backend: Arc<B>,
    controller: JoinHandle<()>,
}

impl<B> ControllerEnv<B> {
    /// Runs `controller` (given the emulator's client) next to `emulator`.
    pub fn start<F>(
        emulator: kube_emulator::Emulator,
        backend: Arc<B>,
        controller: impl FnOnce(Client) -> F,
    ) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let client = emulator.client();
        let controller = tokio::spawn(controller(client.clone()));
        ControllerEnv {
            _emulator: emulator,
            client,
            backend,
            controller,
        }
    }
}

impl<B> Drop for ControllerEnv<B> {
    fn drop(&mut self) {
        self.controller.abort();
    }
}

/// Defaults shrunk for tests: fast backoff, quick PV save retries.
pub fn config() -> Config {
    let mut config = Config::new(PROVISIONER);
    config.workers = 4;
    config.backoff = BACKOFF;
    config.volume_save_attempts = 3;
    config.volume_save_interval = Duration::from_millis(20);
    config.shutdown_grace_period = Duration::from_secs(2);
    config
}

/// A controller running in a task.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    pub handle: JoinHandle<Result<(), ControllerError>>,
}

impl Running {
    /// Graceful shutdown.
    pub async fn stop(mut self) -> Result<(), ControllerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DEADLINE, &mut self.handle)
            .await
            .expect("controller did not stop in time")
            .expect("controller task panicked")
    }

    /// Asks for a graceful shutdown without waiting for it.
    pub fn request_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Simulated crash: the task is killed wherever it is.
    pub async fn crash(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }
}

pub fn start(client: Client, config: Config, backend: Arc<FakeBackend>, expand: bool) -> Running {
    let mut controller = Controller::new(client, config, backend.clone());
    if expand {
        controller = controller.with_expander(backend);
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        handle,
    }
}

pub fn election(client: Client, identity: &str) -> LeaderElector {
    let mut config = LeaderElectionConfig::new(PROVISIONER, NS, identity);
    config.lease_duration = Duration::from_millis(1500);
    config.renew_deadline = Duration::from_millis(1000);
    config.retry_period = Duration::from_millis(200);
    LeaderElector::new(client, config)
}

pub fn start_elected(
    client: Client,
    config: Config,
    backend: Arc<FakeBackend>,
    identity: &str,
) -> Running {
    let controller = Controller::new(client.clone(), config, backend);
    let (stop, stopped) = oneshot::channel::<()>();
    let elector = election(client, identity);
    let handle = tokio::spawn(controller.run_with_leader_election(elector, async move {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        handle,
    }
}

pub struct ClassSpec {
    pub wait_for_first_consumer: bool,
    pub reclaim_policy: &'static str,
    pub allow_expansion: bool,
}

impl Default for ClassSpec {
    fn default() -> Self {
        Self {
            wait_for_first_consumer: false,
            reclaim_policy: "Delete",
            allow_expansion: false,
        }
    }
}

pub async fn create_class(client: &Client, name: &str, spec: ClassSpec) -> StorageClass {
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": { "name": name },
        "provisioner": PROVISIONER,
        "reclaimPolicy": spec.reclaim_policy,
        "volumeBindingMode": if spec.wait_for_first_consumer { "WaitForFirstConsumer" } else { "Immediate" },
        "allowVolumeExpansion": spec.allow_expansion,
        "parameters": { "pool": "rbd" },
    }))
    .unwrap();
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("create StorageClass")
}

pub fn claim(name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": { "name": name, "namespace": NS },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": { "requests": { "storage": size } },
        },
    }))
    .unwrap()
}

pub async fn create_claim(client: &Client, claim: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    claims(client)
        .create(&PostParams::default(), claim)
        .await
        .expect("create claim")
}

pub async fn create_node(client: &Client, name: &str) -> Node {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": name },
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create node")
}

pub fn claims(client: &Client) -> Api<PersistentVolumeClaim> {
    Api::namespaced(client.clone(), NS)
}

pub fn volumes(client: &Client) -> Api<PersistentVolume> {
    Api::all(client.clone())
}

/// Polls `name` until `predicate` holds; panics with the last state after `DEADLINE`.
pub async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, predicate: impl Fn(&K) -> bool) -> K
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let current = api.get_opt(name).await.expect("get");
        if let Some(object) = &current
            && predicate(object)
        {
            return object.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name}: {what}; last state: {current:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `name` no longer exists.
pub async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let current = api.get_opt(name).await.expect("get");
        if current.is_none() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name} to go: {current:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `condition` until true.
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Events about the object named `object` (events of cluster-scoped objects live in `default`).
pub async fn events_for(client: &Client, object: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|event| event.involved_object.name.as_deref() == Some(object))
        .collect()
}

/// Waits for an event about `object` with `reason` whose message contains `text`.
pub async fn wait_for_event(client: &Client, object: &str, reason: &str, text: &str) -> Event {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let events = events_for(client, object).await;
        if let Some(event) = events.iter().find(|event| {
            event.reason.as_deref() == Some(reason)
                && event.message.as_deref().unwrap_or_default().contains(text)
        }) {
            return event.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for event {reason} containing {text:?} on {object}; events: {:#?}",
            events
                .iter()
                .map(|e| (e.reason.clone(), e.message.clone(), e.count))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn phase(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub fn volume_phase(volume: &PersistentVolume) -> Option<&str> {
    volume.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub fn uid(object: &impl Resource) -> String {
    object.meta().uid.clone().expect("uid")
}

/// Creates a claim and waits until it is Bound to the PV we provisioned.
pub async fn provisioned_claim(
    client: &Client,
    name: &str,
    class: &str,
) -> (PersistentVolumeClaim, PersistentVolume) {
    let created = create_claim(client, &claim(name, class, "1Gi")).await;
    let pv_name = format!("pvc-{}", uid(&created));
    let bound = wait_for(&claims(client), name, "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    let volume = volumes(client).get(&pv_name).await.expect("PV");
    (bound, volume)
}
