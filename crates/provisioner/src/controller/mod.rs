//! The provisioning controller: reflectors, a work queue and the worker flows.
//!
//! - [`informers`]: watches claims, volumes and classes into reflector stores and queues work.
//! - [`provision`]: claim -> backend volume -> saved PV.
//! - [`delete`]: released PV -> backend delete -> PV delete -> finalizer removed.
//! - [`expand`]: larger request -> backend expand -> PV capacity -> claim status.
//! - [`modify`]: VolumeAttributesClass named -> backend modify -> PV class -> claim status.
//!
//! Work is keyed by claim UID (provisioning, expansion) and PV name (deletion); each key is
//! handled by one worker at a time and retried with per-key exponential backoff.

mod cached;
mod delete;
mod expand;
mod informers;
mod modify;
mod provision;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Client, Resource};
use tokio::task::JoinSet;

use self::cached::{CachedClaim, CachedVolume};

use crate::config::Config;
use crate::events::{EventRecorder, EventType};
use crate::leader::{LeaderElector, LeaderError};
use crate::metrics::Metrics;
use crate::modify::Modifier;
use crate::queue::WorkQueue;
use crate::volume::{Expander, ProvisionOptions, Provisioner};

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The leader lease was lost: all work was stopped at once; the process should exit.
    #[error("leader lease lost")]
    LeaseLost,
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// A reflector or worker task ended unexpectedly.
    #[error("controller task ended unexpectedly")]
    TaskEnded,
}

/// One unit of work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Work {
    /// Provision for the claim with this UID (or finish an in-background one).
    Claim(String),
    /// Delete (or release the finalizer of) the PV with this name.
    Volume(String),
    /// Expand the volume of the claim with this UID.
    Resize(String),
    /// Modify the volume of the claim with this UID to its VolumeAttributesClass.
    Modify(String),
}

/// The work failed and should be retried with backoff.
#[derive(Debug)]
pub(crate) struct Retry;

/// State shared by the informers and workers.
pub(crate) struct Shared {
    client: Client,
    config: Config,
    names: Vec<String>,
    provisioner: Arc<dyn Provisioner>,
    expander: Option<Arc<dyn Expander>>,
    modifier: Option<Arc<dyn Modifier>>,
    metrics: Metrics,
    recorder: EventRecorder,
    /// Claims: unbound ones serialised whole, bound ones reduced to what decisions read
    /// ([`CachedClaim`]).
    claims: Store<CachedClaim>,
    /// PVs as [`CachedVolume`]s: what decisions read; flows act on a fresh read.
    volumes: Store<CachedVolume>,
    classes: Store<StorageClass>,
    /// VolumeAttachments, with [`Config::wait_for_detach`]: a PV one names is not deleted.
    attachments: Option<Store<VolumeAttachment>>,
    /// Claim UID -> where the claim lives, maintained from the watch.
    claim_index: Mutex<HashMap<String, ObjectRef<CachedClaim>>>,
    /// Claim UID -> options of a provisioning the backend reported as still in progress.
    in_background: Mutex<HashMap<String, ProvisionOptions>>,
    /// Claim UID -> a provisioned volume whose PV could not be saved yet (retried until saved).
    unsaved: Mutex<HashMap<String, PersistentVolume>>,
    /// See [`Controller::with_claim_observer`].
    claim_observers: Vec<ClaimObserver>,
    queue: WorkQueue<Work>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The maps stay consistent even if a holder panicked (single inserts/removes).
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// The claim with `uid`, if it still exists in the cache.
    fn claim_by_uid(&self, uid: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let reference = lock(&self.claim_index).get(uid).cloned()?;
        let claim = self.claims.get(&reference);
        match claim {
            Some(claim) if claim.meta().uid.as_deref() == Some(uid) => Some(claim.view()),
            _ => {
                lock(&self.claim_index).remove(uid);
                None
            }
        }
    }

    fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        self.recorder.publish(object, event_type, reason, message);
    }
}

/// The external-provisioning controller.
pub struct Controller {
    client: Client,
    config: Config,
    provisioner: Arc<dyn Provisioner>,
    expander: Option<Arc<dyn Expander>>,
    modifier: Option<Arc<dyn Modifier>>,
    metrics: Metrics,
    companions: Vec<Companion>,
    claim_observers: Vec<ClaimObserver>,
}

/// A task run alongside the controller's own (see [`Controller::with_companion`]).
pub type Companion = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Called with every claim the controller's claim watch delivers (see
/// [`Controller::with_claim_observer`]).
pub type ClaimObserver = Arc<dyn Fn(&PersistentVolumeClaim) + Send + Sync>;

impl Controller {
    /// A controller provisioning with `provisioner`.
    #[must_use]
    pub fn new(client: Client, config: Config, provisioner: Arc<dyn Provisioner>) -> Self {
        Self {
            client,
            config,
            provisioner,
            expander: None,
            modifier: None,
            metrics: Metrics::unregistered(),
            companions: Vec::new(),
            claim_observers: Vec::new(),
        }
    }

    /// Also hand every claim the claim watch delivers (listed, changed or deleted; whole, before
    /// the controller trims it for its cache) to `observer`, so another controller of the binary
    /// needs no claim watch of its own. It runs on the watch task: it must be quick and never
    /// block (queue work for a companion).
    #[must_use]
    pub fn with_claim_observer(mut self, observer: ClaimObserver) -> Self {
        self.claim_observers.push(observer);
        self
    }

    /// Also run `task` (e.g. another controller of the same binary) while this controller runs:
    /// started once the caches are synced, stopped with the controller's own tasks (at
    /// shutdown, or at once when the lease is lost). A companion that ends by itself ends the
    /// controller with [`ControllerError::TaskEnded`].
    #[must_use]
    pub fn with_companion(mut self, task: Companion) -> Self {
        self.companions.push(task);
        self
    }

    /// Also expand volumes with `expander`.
    #[must_use]
    pub fn with_expander(mut self, expander: Arc<dyn Expander>) -> Self {
        self.expander = Some(expander);
        self
    }

    /// Also modify volumes by VolumeAttributesClass with `modifier` (without one, claims'
    /// `volumeAttributesClassName` is left alone).
    #[must_use]
    pub fn with_modifier(mut self, modifier: Arc<dyn Modifier>) -> Self {
        self.modifier = Some(modifier);
        self
    }

    /// Report to these metrics (see [`Metrics::new`]).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Runs until `shutdown` resolves, then lets in-flight operations finish for up to
    /// `Config::shutdown_grace_period`.
    ///
    /// # Errors
    /// [`ControllerError::TaskEnded`] if an internal task ended on its own.
    pub async fn run<F>(self, shutdown: F) -> Result<(), ControllerError>
    where
        F: Future<Output = ()> + Send,
    {
        let (claims, claim_writer) = reflector::store();
        let (volumes, volume_writer) = reflector::store();
        let (classes, class_writer) = reflector::store();
        let (attachments, attachment_writer) = reflector::store();
        let attachment_writer = self.config.wait_for_detach.then_some(attachment_writer);
        let recorder = EventRecorder::new(
            self.client.clone(),
            &self.config.provisioner_name,
            &self.config.identity,
        );
        let queue = WorkQueue::with_metrics(
            self.config.backoff,
            self.metrics.queue_depth.clone(),
            self.metrics.queue_retries.clone(),
        );
        let shared = Arc::new(Shared {
            names: self.config.all_names(),
            client: self.client,
            config: self.config,
            provisioner: self.provisioner,
            expander: self.expander,
            modifier: self.modifier,
            metrics: self.metrics,
            recorder,
            claims,
            volumes,
            classes,
            attachments: attachment_writer.is_some().then_some(attachments),
            claim_index: Mutex::new(HashMap::new()),
            in_background: Mutex::new(HashMap::new()),
            unsaved: Mutex::new(HashMap::new()),
            claim_observers: self.claim_observers,
            queue,
        });

        // Dropping a JoinSet aborts its tasks: if this future is dropped (lease lost), all
        // work stops at once.
        let mut background = JoinSet::new();
        background.spawn(informers::watch_claims(Arc::clone(&shared), claim_writer));
        background.spawn(informers::watch_volumes(Arc::clone(&shared), volume_writer));
        background.spawn(informers::watch_classes(Arc::clone(&shared), class_writer));
        // not waited for below: without it only deletions wait (see `delete::attached_to`)
        if let Some(writer) = attachment_writer {
            background.spawn(informers::watch_attachments(Arc::clone(&shared), writer));
        }
        let mut workers = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);

        let ready = async {
            let _ = shared.claims.wait_until_ready().await;
            let _ = shared.volumes.wait_until_ready().await;
            let _ = shared.classes.wait_until_ready().await;
        };
        tokio::select! {
            () = ready => {}
            () = &mut shutdown => return Ok(()),
            _ = background.join_next() => return Err(ControllerError::TaskEnded),
        }
        tracing::info!(
            provisioner = %shared.config.provisioner_name,
            workers = shared.config.workers,
            "caches synced, starting workers"
        );
        background.spawn(informers::resync(Arc::clone(&shared)));
        for task in self.companions {
            background.spawn(task);
        }
        for _ in 0..shared.config.workers.max(1) {
            workers.spawn(worker(Arc::clone(&shared)));
        }

        let result = tokio::select! {
            () = &mut shutdown => Ok(()),
            _ = background.join_next() => Err(ControllerError::TaskEnded),
            _ = workers.join_next() => Err(ControllerError::TaskEnded),
        };
        background.abort_all();
        shared.queue.shut_down();
        let drained = tokio::time::timeout(shared.config.shutdown_grace_period, async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("in-flight operations did not finish within the grace period");
        }
        result
    }

    /// Waits to become leader, then runs until `shutdown` (releasing the lease) or until the
    /// lease is lost (stopping all work at once and returning [`ControllerError::LeaseLost`]).
    ///
    /// # Errors
    /// [`ControllerError::LeaseLost`] when leadership was lost; others as [`Controller::run`].
    pub async fn run_with_leader_election<F>(
        self,
        elector: LeaderElector,
        shutdown: F,
    ) -> Result<(), ControllerError>
    where
        F: Future<Output = ()> + Send,
    {
        let mut shutdown = Box::pin(shutdown);
        let lease = elector.config().lease_name.clone();
        let metrics = self.metrics.clone();
        metrics.set_leader(&lease, false);
        let mut leadership = tokio::select! {
            leadership = elector.acquire() => leadership?,
            () = &mut shutdown => return Ok(()),
        };
        metrics.set_leader(&lease, true);
        // Whether the stop was requested: a lease lost while draining after that ends the
        // drain early, but the process still ends as asked (status 0), not as a lost leader.
        let requested = std::sync::atomic::AtomicBool::new(false);
        let stop = async {
            (&mut shutdown).await;
            requested.store(true, std::sync::atomic::Ordering::SeqCst);
        };
        let result = tokio::select! {
            result = self.run(stop) => result,
            () = leadership.lost() => {
                if requested.load(std::sync::atomic::Ordering::SeqCst) {
                    tracing::warn!(%lease, "lease lost while shutting down; in-flight work stopped");
                    metrics.set_leader(&lease, false);
                    return Ok(());
                }
                Err(ControllerError::LeaseLost)
            }
        };
        metrics.set_leader(&lease, false);
        if !matches!(result, Err(ControllerError::LeaseLost)) {
            // An unreachable API server must not hold the exit up: the lease then simply
            // expires for the successor.
            let bound = elector.config().renew_deadline;
            match tokio::time::timeout(bound, leadership.release()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(%error, "could not release the lease"),
                Err(_) => tracing::warn!(
                    ?bound,
                    "could not release the lease: the API server did not answer in time"
                ),
            }
        }
        result
    }
}

async fn worker(shared: Arc<Shared>) {
    while let Some(work) = shared.queue.get().await {
        let result = match &work {
            // Boxed: the provisioning future is large (options, claim, class, PV).
            Work::Claim(uid) => Box::pin(provision::sync_claim(&shared, uid)).await,
            Work::Volume(name) => delete::sync_volume(&shared, name).await,
            Work::Resize(uid) => expand::sync_resize(&shared, uid).await,
            Work::Modify(uid) => modify::sync_modify(&shared, uid).await,
        };
        if let Err(Retry) = result {
            let failures = shared.queue.add_rate_limited(work.clone());
            tracing::debug!(?work, failures, "retrying with backoff");
        } else {
            shared.queue.forget(&work);
        }
        shared.queue.done(&work);
    }
}

/// `error` and its sources joined by `: ` (what events and logs show).
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chain_joins_sources() {
        let error = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(error_chain(&error), "outer: disk on fire");
    }
}
