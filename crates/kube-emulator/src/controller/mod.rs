//! The slice of kube-controller-manager that provisioning depends on: the PV binder
//! (external-provisioning annotations and events, binding of pre-bound volumes, Released
//! volumes), the pvc/pv-protection controllers, the expand controller's CSI event and, for CSI
//! drivers that require attach, the attach/detach controller's VolumeAttachments (`attach.rs`).
//!
//! Flow: the controller subscribes to store changes. A client write to a claim or volume syncs
//! that object; deletions and pod changes sync the objects that depend on them; every
//! `resync` period everything is synced again (which is what bumps the aggregated
//! `ExternalProvisioning` event, as in the recordings). Notifications of the controller's own
//! writes do not re-sync the same object (kube-controller-manager keeps its own writes in its
//! cache, so they do not count as updates). Syncs go through a deduplicating work queue (a key
//! queued again before it is processed is synced once), and the controller keeps indexes of
//! volumes by claim and claims by class, so a burst of N claims costs O(N), not O(N^2).
//!
//! Optionally (off by default; `EmulatorBuilder::controller_client_limit`) every write and event
//! waits for a token of its controller's client rate limit, as kube-controller-manager's clients
//! do (`--kube-api-qps 20 --kube-api-burst 30` by default): per provisioned and bound claim the
//! binder sends five requests (claim annotations, `ExternalProvisioning` event, PV status, claim,
//! claim status), which is what bounds a real control plane at about 4 claims/s.

mod attach;
mod claims;
mod index;
pub(crate) mod limiter;
mod matching;
mod recorder;
mod volumes;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::store::{Action, Change, EventType, Origin, Store, Written};
use crate::util::{self, str_at};
use limiter::TokenBucket;

pub(crate) const PVCS: &str = "persistentvolumeclaims";
pub(crate) const PVS: &str = "persistentvolumes";

/// A client-side rate limit for the controllers' API clients (see [`limiter`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClientLimit {
    pub qps: f64,
    pub burst: u32,
}

/// Which kube-controller-manager controller (and so which API client) makes a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// The PV binder (`persistent-volume-binder`): annotations, binding, phases, its events.
    Binder,
    /// The pvc-protection controller.
    PvcProtection,
    /// The pv-protection controller.
    PvProtection,
    /// The expand controller (its `ExternalExpanding` event).
    Expand,
    /// The attach/detach controller (its Multi-Attach events).
    AttachDetach,
}

/// One token bucket per controller client, as kube-controller-manager builds one client (with
/// its own limiter) per controller.
struct Limits {
    binder: TokenBucket,
    pvc_protection: TokenBucket,
    pv_protection: TokenBucket,
    expand: TokenBucket,
    attach_detach: TokenBucket,
}

impl Limits {
    fn new(limit: ClientLimit) -> Limits {
        let bucket = || TokenBucket::new(limit.qps, limit.burst);
        Limits {
            binder: bucket(),
            pvc_protection: bucket(),
            pv_protection: bucket(),
            expand: bucket(),
            attach_detach: bucket(),
        }
    }

    fn of(&self, client: Client) -> &TokenBucket {
        match client {
            Client::Binder => &self.binder,
            Client::PvcProtection => &self.pvc_protection,
            Client::PvProtection => &self.pv_protection,
            Client::Expand => &self.expand,
            Client::AttachDetach => &self.attach_detach,
        }
    }
}

/// A unit of work, deduplicated while queued (client-go's workqueue: a key added again before it
/// is processed is synced once, with the object's state at that time).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Work {
    Claim(String, String),
    Volume(String),
    /// VolumeAttachments against what pods need (one reconcile of everything).
    Attachments,
}

#[derive(Default)]
struct Queue {
    order: VecDeque<Work>,
    queued: HashSet<Work>,
}

impl Queue {
    fn push(&mut self, w: Work) {
        if self.queued.insert(w.clone()) {
            self.order.push_back(w);
        }
    }

    fn pop(&mut self) -> Option<Work> {
        let w = self.order.pop_front()?;
        self.queued.remove(&w);
        Some(w)
    }
}

pub(crate) struct Controller {
    store: Arc<Store>,
    recorder: recorder::Recorder,
    /// (claim uid, requested size) already reported as `ExternalExpanding`.
    expanding_reported: HashSet<(String, String)>,
    /// Client rate limits; `None`: unthrottled.
    limits: Option<Limits>,
    index: index::Index,
    queue: Queue,
}

impl Controller {
    /// Applies `f` to a copy of the current object and stores it if it changed. With a rate
    /// limit, a write that would change something first waits for a token of `client`'s bucket
    /// (a controller decides from its cache and sends only writes that change the object); `f` is
    /// then applied to the object as it is when the write happens.
    async fn modify(
        &self,
        client: Client,
        storage: &'static str,
        ns: &str,
        name: &str,
        f: impl Fn(&mut Value),
    ) -> Option<Arc<Value>> {
        if let Some(limits) = &self.limits {
            let current = self.store.get(storage, ns, name)?;
            let mut next = (*current).clone();
            f(&mut next);
            if next == *current {
                return Some(current);
            }
            limits.of(client).wait().await;
        }
        let key = (ns.to_string(), name.to_string());
        let result = self
            .store
            .write(storage, &key, Origin::Controller, |_, existing| {
                let Some(old) = existing else {
                    return Ok(Action::Abort);
                };
                let mut next = (**old).clone();
                f(&mut next);
                Ok(Action::Put(next))
            });
        match result {
            Ok(Written::Aborted) => None,
            Ok(w) => w.object().cloned(),
            Err(e) => {
                tracing::warn!(resource = storage, namespace = ns, name, error = %e, "controller write failed");
                None
            }
        }
    }

    /// Records an event through `client` (waiting for its token when rate limited).
    async fn emit(
        &mut self,
        client: Client,
        obj: &Value,
        event_type: &str,
        reason: &str,
        message: &str,
        component: &str,
    ) {
        let bucket = self.limits.as_ref().map(|l| l.of(client));
        self.recorder
            .emit(
                &self.store,
                bucket,
                obj,
                event_type,
                reason,
                message,
                component,
            )
            .await;
    }

    /// Updates the index with a store change and queues the syncs it calls for.
    fn on_change(&mut self, ch: &Change) {
        let obj = &ch.object;
        self.index.observe(ch.storage, ch.kind, obj);
        let ns = util::ns_of(obj).to_string();
        let name = util::name_of(obj).to_string();
        let by_client = ch.origin == Origin::Client;
        if matches!(
            ch.storage,
            PVCS | PVS | "pods" | "csidrivers" | attach::VOLUME_ATTACHMENTS
        ) {
            self.queue.push(Work::Attachments);
        }
        match ch.storage {
            PVCS => {
                if ch.kind == EventType::Deleted {
                    for pv in self.index.volumes_of_claim(&ns, &name) {
                        self.queue.push(Work::Volume(pv));
                    }
                } else if by_client {
                    self.queue.push(Work::Claim(ns, name));
                }
            }
            PVS => {
                if ch.kind == EventType::Deleted {
                    if let (Some(cns), Some(cname)) = (
                        str_at(obj, "/spec/claimRef/namespace"),
                        str_at(obj, "/spec/claimRef/name"),
                    ) {
                        self.queue
                            .push(Work::Claim(cns.to_string(), cname.to_string()));
                    }
                } else if by_client {
                    self.queue.push(Work::Volume(name));
                }
            }
            "pods" => {
                for claim in claims::pod_claims(obj) {
                    self.queue.push(Work::Claim(ns.clone(), claim));
                }
            }
            "storageclasses" if by_client => {
                for (cns, cname) in self.index.claims_of_class(&name) {
                    let unbound = self
                        .store
                        .get(PVCS, &cns, &cname)
                        .is_some_and(|c| str_at(&c, "/status/phase") != Some("Bound"));
                    if unbound {
                        self.queue.push(Work::Claim(cns, cname));
                    }
                }
            }
            _ => {}
        }
    }

    /// The periodic resync: every claim, then every volume, then the VolumeAttachments.
    fn resync_all(&mut self) {
        let (claims, _) = self.store.list(PVCS, None);
        for c in &claims {
            self.queue.push(Work::Claim(
                util::ns_of(c).to_string(),
                util::name_of(c).to_string(),
            ));
        }
        let (volumes, _) = self.store.list(PVS, None);
        for v in &volumes {
            self.queue.push(Work::Volume(util::name_of(v).to_string()));
        }
        self.queue.push(Work::Attachments);
    }

    async fn process(&mut self, w: Work) {
        match w {
            Work::Claim(ns, name) => self.sync_claim(&ns, &name).await,
            Work::Volume(name) => self.sync_volume(&name).await,
            Work::Attachments => self.sync_attachments().await,
        }
    }
}

/// Runs the controller until the store's subscription ends (or the task is aborted).
pub(crate) async fn run(
    store: Arc<Store>,
    mut rx: mpsc::UnboundedReceiver<Arc<Change>>,
    resync: Duration,
    limit: Option<ClientLimit>,
) {
    let mut ctl = Controller {
        store,
        recorder: recorder::Recorder::default(),
        expanding_reported: HashSet::new(),
        limits: limit.map(Limits::new),
        index: index::Index::default(),
        queue: Queue::default(),
    };
    // Objects stored before the subscription (none when the emulator builds the controller).
    for storage in [PVS, PVCS] {
        for obj in ctl.store.list(storage, None).0 {
            ctl.index.observe(storage, EventType::Added, &obj);
        }
    }
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Take in every change that is there (index first, so syncs see all earlier writes).
        loop {
            match rx.try_recv() {
                Ok(ch) => ctl.on_change(&ch),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
        if tick.tick().now_or_never().is_some() {
            ctl.resync_all();
        }
        if let Some(w) = ctl.queue.pop() {
            ctl.process(w).await;
            // a long queue must not hold a runtime thread
            tokio::task::consume_budget().await;
            continue;
        }
        tokio::select! {
            ch = rx.recv() => match ch {
                Some(ch) => ctl.on_change(&ch),
                None => return,
            },
            _ = tick.tick() => ctl.resync_all(),
        }
    }
}
