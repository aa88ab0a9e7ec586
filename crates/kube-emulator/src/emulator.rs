//! The public entry point: [`Emulator`] and its builder.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::controller;
use crate::faults::Faults;
use crate::resources;
use crate::server::ServerHandle;
use crate::store::{Action, Origin, Store};
use crate::util::now_time;

/// Events kept per resource for watch resumption, by default.
pub const DEFAULT_WATCH_HISTORY: usize = 10_000;
/// Capacity of one watcher's queue; a watcher that falls this far behind is dropped.
const WATCH_QUEUE: usize = 4096;

/// State shared by the HTTP layer, the controller and the handle.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub faults: Faults,
    pub stats: Arc<crate::stats::Stats>,
    /// Every request, when recording is on (see [`EmulatorBuilder::record_requests`]).
    log: Option<Mutex<Vec<RequestRecord>>>,
}

/// One API request, as RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestRecord {
    /// The client's `User-Agent` header (empty when it sent none).
    pub user_agent: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// API group (`""` for core).
    pub group: String,
    /// Plural resource, with `/subresource` when addressed.
    pub resource: String,
    /// Namespace of a namespaced request.
    pub namespace: Option<String>,
}

impl Shared {
    pub(crate) fn recording(&self) -> bool {
        self.log.is_some()
    }

    pub(crate) fn record(&self, request: RequestRecord) {
        if let Some(log) = &self.log {
            log.lock().unwrap_or_else(|e| e.into_inner()).push(request);
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    controller: Option<tokio::task::AbortHandle>,
    snapshot_controller: Option<tokio::task::AbortHandle>,
    probe: Option<tokio::task::AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for c in [&self.controller, &self.snapshot_controller]
            .into_iter()
            .chain([&self.probe])
            .flatten()
        {
            c.abort();
        }
    }
}

/// An in-memory Kubernetes API server (plus the PV controller slice). Cheap to clone.
#[derive(Clone)]
pub struct Emulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator").finish_non_exhaustive()
    }
}

/// Options for [`Emulator`].
#[derive(Debug, Clone)]
pub struct EmulatorBuilder {
    pv_controller: bool,
    snapshot_controller: bool,
    snapshot_crds: bool,
    csi_addons_crds: bool,
    watch_history: usize,
    resync_period: Duration,
    record_requests: bool,
    controller_limit: Option<controller::ClientLimit>,
}

impl Default for EmulatorBuilder {
    fn default() -> Self {
        EmulatorBuilder {
            pv_controller: true,
            snapshot_controller: true,
            snapshot_crds: false,
            csi_addons_crds: false,
            watch_history: DEFAULT_WATCH_HISTORY,
            resync_period: Duration::from_secs(15),
            record_requests: false,
            controller_limit: None,
        }
    }
}

impl EmulatorBuilder {
    /// Runs the PV controller slice (binding, provisioning annotations, protection, events).
    /// Default: on.
    pub fn pv_controller(mut self, on: bool) -> Self {
        self.pv_controller = on;
        self
    }

    /// Runs the snapshot-controller slice (VolumeSnapshot -> VolumeSnapshotContent binding and
    /// status, protection finalizers, deletion by policy; see the README). It acts only once the
    /// `snapshot.storage.k8s.io` CRDs are created. Default: on.
    pub fn snapshot_controller(mut self, on: bool) -> Self {
        self.snapshot_controller = on;
        self
    }

    /// Creates the `snapshot.storage.k8s.io/v1` CRDs of `deploy/snapshot-crds/` at start (as on
    /// a cluster with the snapshot add-on installed). Default: off.
    pub fn snapshot_crds(mut self, on: bool) -> Self {
        self.snapshot_crds = on;
        self
    }

    /// Creates the csi-addons CRDs of `deploy/csi-addons-crds/` (`NetworkFence`,
    /// `ReclaimSpaceJob`, `ReclaimSpaceCronJob`, `VolumeReplicationClass`, `VolumeReplication`)
    /// at start (as on a cluster with csi-addons installed). Default: off.
    pub fn csi_addons_crds(mut self, on: bool) -> Self {
        self.csi_addons_crds = on;
        self
    }

    /// Watch events kept per resource for resuming watches (default 10 000).
    pub fn watch_history(mut self, events: usize) -> Self {
        self.watch_history = events;
        self
    }

    /// PV controller resync period (default 15 s, as kube-controller-manager).
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period;
        self
    }

    /// Keeps a log of every request (user agent, verb, group, resource, namespace), read with
    /// [`Emulator::requests`]; for RBAC coverage checks. Default: off (the log grows without
    /// bound).
    pub fn record_requests(mut self, on: bool) -> Self {
        self.record_requests = on;
        self
    }

    /// kube-controller-manager's default `--kube-api-qps` (per controller client).
    pub const KCM_CLIENT_QPS: f64 = controller::limiter::KCM_CLIENT_QPS;
    /// kube-controller-manager's default `--kube-api-burst` (per controller client).
    pub const KCM_CLIENT_BURST: u32 = controller::limiter::KCM_CLIENT_BURST;

    /// Rate-limits the PV controller slice's API writes as kube-controller-manager's clients are
    /// limited: client-go's token bucket (`qps` tokens per second, up to `burst` stored, starting
    /// full), one bucket per controller (PV binder, pvc-protection, pv-protection, expand), one
    /// token per write or event. [`Self::KCM_CLIENT_QPS`] and [`Self::KCM_CLIENT_BURST`] are
    /// kube-controller-manager's defaults
    /// (`--kube-api-qps 20 --kube-api-burst 30`), which make binding a burst of claims take about
    /// 5 writes / 20 per second = 0.25 s per claim, as on a real cluster. Default: no limit (tests
    /// stay fast). A `qps` that is not positive turns the limit off.
    pub fn controller_client_limit(mut self, qps: f64, burst: u32) -> Self {
        self.controller_limit = (qps > 0.0).then_some(controller::ClientLimit { qps, burst });
        self
    }

    /// Builds the emulator. Must be called inside a tokio runtime when a controller is on.
    pub fn build(self) -> Emulator {
        let store = Arc::new(Store::new(self.watch_history, WATCH_QUEUE));
        for ns in ["default", "kube-node-lease", "kube-public", "kube-system"] {
            seed_namespace(&store, ns);
        }
        if self.snapshot_crds {
            for yaml in crate::crd::SNAPSHOT_CRDS {
                if let Err(e) = crate::crd::install(&store, yaml) {
                    tracing::error!(error = %e, "installing a snapshot CRD failed");
                }
            }
        }
        if self.csi_addons_crds {
            for yaml in crate::crd::CSI_ADDONS_CRDS {
                if let Err(e) = crate::crd::install(&store, yaml) {
                    tracing::error!(error = %e, "installing a csi-addons CRD failed");
                }
            }
        }
        let controller = self.pv_controller.then(|| {
            let rx = store.subscribe();
            tokio::spawn(controller::run(
                store.clone(),
                rx,
                self.resync_period,
                self.controller_limit,
            ))
            .abort_handle()
        });
        let snapshot_controller = self.snapshot_controller.then(|| {
            let rx = store.subscribe();
            tokio::spawn(crate::snapshots::run(store.clone(), rx, self.resync_period))
                .abort_handle()
        });
        let stats = Arc::new(crate::stats::Stats::default());
        // Without a runtime (a synchronous test building an emulator without controllers) there
        // is nothing to probe.
        let probe = tokio::runtime::Handle::try_current().ok().map(|rt| {
            rt.spawn(crate::stats::Stats::probe(stats.clone()))
                .abort_handle()
        });
        let shared = Arc::new(Shared {
            faults: Faults::new(store.clone()),
            store,
            stats,
            log: self.record_requests.then(|| Mutex::new(Vec::new())),
        });
        Emulator {
            inner: Arc::new(Inner {
                shared,
                controller,
                snapshot_controller,
                probe,
            }),
        }
    }
}

fn seed_namespace(store: &Store, name: &str) {
    let obj = json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": now_time(),
            "labels": {"kubernetes.io/metadata.name": name},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    });
    let key = (String::new(), name.to_string());
    if let Err(e) = store.write(
        resources::core("namespaces").storage,
        &key,
        Origin::Client,
        |_, _| Ok(Action::Put(obj)),
    ) {
        tracing::error!(namespace = name, error = %e, "seeding namespace failed");
    }
}

impl Emulator {
    /// An emulator with defaults (PV controller on). Must be called inside a tokio runtime.
    pub fn new() -> Emulator {
        EmulatorBuilder::default().build()
    }

    pub fn builder() -> EmulatorBuilder {
        EmulatorBuilder::default()
    }

    /// A kube client talking to this emulator in-process (no socket), default namespace `default`.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.router(), "default")
    }

    /// The HTTP API as an axum router.
    pub fn router(&self) -> axum::Router {
        crate::api::router(self.inner.shared.clone())
    }

    /// Serves the API over plain HTTP on `addr` (port 0 picks a free port).
    pub async fn serve(&self, addr: std::net::SocketAddr) -> std::io::Result<ServerHandle> {
        ServerHandle::start(self.router(), self.inner.shared.store.clone(), addr).await
    }

    /// Fault injection.
    pub fn faults(&self) -> &Faults {
        &self.inner.shared.faults
    }

    /// HTTP requests served so far for `verb` (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection`) and `resource` (plural, or `plural/subresource`);
    /// `"*"` matches anything.
    pub fn request_count(&self, verb: &str, resource: &str) -> u64 {
        self.inner.shared.stats.total(verb, resource)
    }

    /// Requests by client, verb and resource, and the stalls seen (the JSON `GET
    /// /emulator/stats` serves).
    pub fn stats(&self) -> serde_json::Value {
        self.inner.shared.stats.to_json()
    }

    /// The requests served so far, in order (empty unless built with
    /// [`EmulatorBuilder::record_requests`]).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.inner
            .shared
            .log
            .as_ref()
            .map(|log| log.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .unwrap_or_default()
    }

    /// The number of open watch streams (for tests).
    pub fn open_watches(&self) -> usize {
        self.inner.shared.store.watcher_count()
    }
}

impl Default for Emulator {
    fn default() -> Self {
        Emulator::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn emulator_is_shareable_across_tasks() {
        assert_send_sync::<Emulator>();
    }

    #[tokio::test]
    async fn default_namespaces_exist_at_start() {
        let emu = Emulator::new();
        for ns in ["default", "kube-system", "kube-node-lease"] {
            assert!(
                emu.inner.shared.store.get("namespaces", "", ns).is_some(),
                "{ns}"
            );
        }
    }
}
