//! csi-addons' `VolumeReplication` and `VolumeReplicationClass`
//! (`replication.storage.openshift.io/v1alpha1`), served over a [`VolumeReplicator`] backend: a
//! claim's volume replicated to a peer storage cluster, primary (takes writes, replicated) or
//! secondary (a copy of the peer's primary), as the csi-addons controller and its sidecar do
//! together for a CSI driver.
//!
//! # Flow, per VolumeReplication
//!
//! 1. Its class `spec.volumeReplicationClass` is read. A class of another provisioner leaves
//!    the object to that provisioner's controller. A missing class, parameters the backend
//!    refuses ([`VolumeReplicator::check_parameters`]), a `spec.dataSource` that is not a claim
//!    bound to a volume this backend serves: the condition `Validated` is `False`
//!    (`PrerequisiteNotMet`) with the reason in its message and in `status.message`, `state`
//!    `Unknown`, nothing is changed in the storage. A missing class or claim is looked for again
//!    every minute.
//! 2. The finalizer [`FINALIZER`] is put on: the replication is disabled before the object
//!    goes.
//! 3. `spec.replicationState`:
//!    - `primary`: [`VolumeReplicator::primary`] (replication enabled, the copy promoted, forced
//!      only with the annotation [`FORCE_PROMOTE_ANNOTATION`] `"true"`: a peer still primary is
//!      otherwise never overruled; what is due on the class's interval). Conditions as
//!      csi-addons sets them: `Completed` (`Promoted` or `FailedToPromote`), `Degraded`
//!      (`Healthy`; `VolumeDegraded` while the peer does not replay; `Error` on failure),
//!      `Resyncing` (`NotResyncing`), `Validated` (`PrerequisiteMet`). `state` `Primary`.
//!    - `secondary`: [`VolumeReplicator::secondary`] (demoted; with `spec.autoResync`, a copy
//!      that diverged from the peer's primary resynced); `Completed` `Demoted`, `Degraded`
//!      `VolumeDegraded` until the copy replays the peer's primary, then `Healthy`. `state`
//!      `Secondary`.
//!    - `resync`: [`VolumeReplicator::resync`] (demoted, a resync asked for once); `Resyncing`
//!      `True` (`ResyncTriggered`) until the copy replays again.
//! 4. `status.lastSyncTime`, `lastSyncBytes` and `lastSyncDuration` are the last completed
//!    sync the backend reports; `lastStartTime` and `lastCompletionTime` bound the last
//!    operation. The object is looked at again every scheduling interval (a primary) or
//!    [`STATUS_INTERVAL`], and the status written only when it changed.
//!
//! Deleted: [`VolumeReplicator::disable`] (for a primary the peer's copy goes with it: the
//! replication is over), then the finalizer removed. A claim deleted while replicated is the
//! backend's to handle in its volume deletion.
//!
//! Failures other than bad input are retried with backoff, each with a Warning Event on the
//! VolumeReplication.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::events::{EventRecorder, EventType};
use crate::queue::{Backoff, WorkQueue};
use crate::volume::BoxError;

mod conditions;

pub use conditions::{Condition, Conditions};

/// The API group of csi-addons' replication.
pub const GROUP: &str = "replication.storage.openshift.io";
/// The finalizer held while the replication may be enabled (csi-addons' own name for it).
pub const FINALIZER: &str = "replication.storage.openshift.io";
/// `"true"` on a VolumeReplication: promote even while the peer's copy is primary (the peer
/// site is lost). A person's decision: both copies then take writes until one is demoted.
pub const FORCE_PROMOTE_ANNOTATION: &str = "rbd.provisioner.ceph.io/force-promote";
/// How often a VolumeReplication without a scheduling interval (a secondary, or a primary
/// whose snapshots another scheduler takes) is looked at again for its status.
pub const STATUS_INTERVAL: Duration = Duration::from_mins(1);
/// How often a missing class or claim is looked for again.
const MISSING_RETRY: Duration = Duration::from_mins(1);

/// A VolumeReplicationClass, with the fields read.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VolumeReplicationClass {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The provisioner and its parameters.
    #[serde(default)]
    pub spec: VolumeReplicationClassSpec,
}

/// `spec` of a VolumeReplicationClass.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VolumeReplicationClassSpec {
    /// The CSI driver whose volumes the class replicates.
    #[serde(default)]
    pub provisioner: String,
    /// The driver's parameters (`mirroringMode`, `schedulingInterval`, ...).
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// A VolumeReplication, with the fields read.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct VolumeReplication {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// What is asked.
    #[serde(default)]
    pub spec: VolumeReplicationSpec,
    /// What is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeReplicationStatus>,
}

/// `spec` of a VolumeReplication.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeReplicationSpec {
    /// The VolumeReplicationClass.
    #[serde(default)]
    pub volume_replication_class: String,
    /// `primary`, `secondary` or `resync`.
    #[serde(default)]
    pub replication_state: String,
    /// The claim (`kind: PersistentVolumeClaim`, core group), in the object's namespace.
    #[serde(default)]
    pub data_source: DataSource,
    /// Resync a secondary that diverged from the peer's primary.
    #[serde(default)]
    pub auto_resync: bool,
    /// An existing replication's ID (not read: the volume's own is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_handle: Option<String>,
}

/// `spec.dataSource` (a TypedLocalObjectReference).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DataSource {
    /// The group (empty for the core group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// The kind.
    #[serde(default)]
    pub kind: String,
    /// The name.
    #[serde(default)]
    pub name: String,
}

/// `status` of a VolumeReplication.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeReplicationStatus {
    /// `Primary`, `Secondary` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// What was done, or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `Completed`, `Degraded`, `Resyncing`, `Validated`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation the status is of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the last operation started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_start_time: Option<Time>,
    /// When it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_completion_time: Option<Time>,
    /// When the last completed sync's data was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Bytes the last sync copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_bytes: Option<i64>,
    /// How long it took (a Go duration, e.g. `3s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_duration: Option<String>,
}

custom_resource!(
    VolumeReplicationClass,
    GROUP,
    "v1alpha1",
    "VolumeReplicationClass",
    "volumereplicationclasses",
    ClusterResourceScope
);
custom_resource!(
    VolumeReplication,
    GROUP,
    "v1alpha1",
    "VolumeReplication",
    "volumereplications",
    NamespaceResourceScope
);

/// The volume a replication step is for.
#[derive(Clone, Copy)]
pub struct ReplicationRequest<'a> {
    /// The claim (`spec.dataSource`).
    pub claim: &'a PersistentVolumeClaim,
    /// Its bound volume, one [`VolumeReplicator::serves`].
    pub volume: &'a PersistentVolume,
    /// The class's parameters.
    pub parameters: &'a BTreeMap<String, String>,
}

/// A replicated volume as the backend sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicationInfo {
    /// This copy is the primary one.
    pub primary: bool,
    /// The replication runs: for a primary, the peer replays it; for a secondary, it replays
    /// the peer's primary.
    pub replaying: bool,
    /// What the storage says of the replication, for messages.
    pub description: String,
    /// When the last completed sync's data was taken.
    pub last_sync_time: Option<k8s_openapi::jiff::Timestamp>,
    /// Bytes it copied.
    pub last_sync_bytes: Option<u64>,
    /// How long it took.
    pub last_sync_duration: Option<Duration>,
}

/// Why a replication step failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// Bad input or a state retrying cannot change (e.g. a pool without mirroring): the
    /// condition says it, nothing is retried until the object changes.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field, e.g. `parameters.mirroringMode`.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// Anything else: retried with backoff.
    #[error(transparent)]
    Failed(BoxError),
}

impl ReplicationError {
    /// A [`ReplicationError::Invalid`] naming `field`.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ReplicationError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A [`ReplicationError::Failed`].
    pub fn failed(error: impl Into<BoxError>) -> Self {
        ReplicationError::Failed(error.into())
    }
}

/// A backend that replicates its volumes to a peer storage cluster.
#[async_trait]
pub trait VolumeReplicator: Send + Sync {
    /// The `spec.provisioner` of the classes this backend serves (its CSI driver name).
    fn provisioner_name(&self) -> &str;

    /// Whether `volume` is one of this backend's.
    fn serves(&self, volume: &PersistentVolume) -> bool;

    /// Checks a class's parameters; the scheduling interval they set (the controller looks at
    /// a primary again every interval), if any.
    ///
    /// # Errors
    /// [`ReplicationError::Invalid`] naming the parameter.
    fn check_parameters(
        &self,
        parameters: &BTreeMap<String, String>,
    ) -> Result<Option<Duration>, ReplicationError>;

    /// Makes and keeps this copy primary: replication enabled, the copy promoted (`force`:
    /// even while the peer's copy is still primary), whatever a primary's replication has due
    /// now (e.g. a mirror snapshot on the class's interval). Called once per look.
    async fn primary(
        &self,
        request: &ReplicationRequest<'_>,
        force: bool,
    ) -> Result<ReplicationInfo, ReplicationError>;

    /// Makes and keeps this copy secondary (demoted); with `auto_resync`, a copy that diverged
    /// from the peer's primary is resynced.
    async fn secondary(
        &self,
        request: &ReplicationRequest<'_>,
        auto_resync: bool,
    ) -> Result<ReplicationInfo, ReplicationError>;

    /// Makes this copy secondary and asks for it to be copied again from the peer's primary,
    /// unless `triggered` (asked by an earlier look) or it replays the peer's primary already.
    async fn resync(
        &self,
        request: &ReplicationRequest<'_>,
        triggered: bool,
    ) -> Result<ReplicationInfo, ReplicationError>;

    /// Disables the replication of the volume. Idempotent; a volume already gone is fine.
    async fn disable(&self, request: &ReplicationRequest<'_>) -> Result<(), ReplicationError>;
}

/// Settings of the VolumeReplication controller.
#[derive(Clone, Debug)]
pub struct ReplicationConfig {
    /// Per-object retry backoff. Default: 1 s doubling to 5 min.
    pub backoff: Backoff,
    /// Event `source.component`.
    pub component: String,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            component: "volumereplication-controller".into(),
        }
    }
}

/// The VolumeReplication controller as a task for [`crate::Controller::with_companion`].
pub fn task(
    client: Client,
    backend: Arc<dyn VolumeReplicator>,
    config: ReplicationConfig,
) -> crate::Companion {
    Box::pin(run(client, backend, config))
}

/// What one sync ended with.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Look again after this long.
    After(Duration),
    /// Nothing more until the object changes.
    Done,
    /// Failed: retried with backoff.
    Retry(String),
}

struct Context {
    client: Client,
    backend: Arc<dyn VolumeReplicator>,
    recorder: EventRecorder,
}

/// Runs until dropped (or the watch ends). Where the CRD is not installed, the watch is tried
/// again with a delay doubling up to a minute (one warning every ten minutes at most).
pub async fn run(client: Client, backend: Arc<dyn VolumeReplicator>, config: ReplicationConfig) {
    let queue: Arc<WorkQueue<(String, String)>> = Arc::new(WorkQueue::new(config.backoff));
    let context = Arc::new(Context {
        client: client.clone(),
        backend,
        recorder: EventRecorder::new(client.clone(), &config.component, &config.component),
    });
    tracing::info!("watching VolumeReplications");
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (queue, context) = (Arc::clone(&queue), Arc::clone(&context));
        tasks.spawn(async move {
            while let Some(key) = queue.get().await {
                match Box::pin(sync(&context, &key.0, &key.1)).await {
                    Outcome::Done => queue.forget(&key),
                    Outcome::After(delay) => {
                        queue.forget(&key);
                        queue.add_after(key.clone(), delay);
                    }
                    Outcome::Retry(error) => {
                        tracing::warn!(volumereplication = %format!("{}/{}", key.0, key.1), %error, "VolumeReplication failed; retrying");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        });
    }
    let api: Api<VolumeReplication> = Api::all(client);
    // queued at every change of its spec (a change of its status is this controller's own
    // write), its deletion, a force annotation not acted on yet, and at every (re)list
    crate::custom_watch::watch(api, "VolumeReplication", |vr: VolumeReplication, listed| {
        let observed = vr.status.as_ref().and_then(|s| s.observed_generation);
        // the force annotation changes no generation
        let forced = vr
            .annotations()
            .get(FORCE_PROMOTE_ANNOTATION)
            .is_some_and(|v| v == "true")
            && vr.status.as_ref().and_then(|s| s.state.as_deref()) != Some("Primary");
        if listed
            || forced
            || vr.metadata.deletion_timestamp.is_some()
            || observed != vr.metadata.generation
        {
            queue.add((vr.namespace().unwrap_or_default(), vr.name_any()));
        }
    })
    .await;
    queue.shut_down();
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// What the object is for, once checked.
struct Target {
    parameters: BTreeMap<String, String>,
    interval: Option<Duration>,
    claim: PersistentVolumeClaim,
    volume: PersistentVolume,
}

/// Why there is no [`Target`].
enum NoTarget {
    /// Another provisioner's class.
    NotOurs,
    /// Bad input: the message; whether to look again later (something missing may appear).
    Invalid(String, bool),
    /// Retried with backoff.
    Failed(String),
}

async fn target(
    context: &Context,
    vr: &VolumeReplication,
    namespace: &str,
) -> Result<Target, NoTarget> {
    let class_name = &vr.spec.volume_replication_class;
    if class_name.is_empty() {
        return Err(NoTarget::Invalid(
            "spec.volumeReplicationClass: must name a VolumeReplicationClass".into(),
            false,
        ));
    }
    let classes: Api<VolumeReplicationClass> = Api::all(context.client.clone());
    let class = match classes.get_opt(class_name).await {
        Ok(Some(class)) => class,
        Ok(None) => {
            return Err(NoTarget::Invalid(
                format!(
                    "spec.volumeReplicationClass: VolumeReplicationClass {class_name} does not exist"
                ),
                true,
            ));
        }
        Err(e) => {
            return Err(NoTarget::Failed(format!(
                "reading VolumeReplicationClass {class_name}: {e}"
            )));
        }
    };
    if class.spec.provisioner != context.backend.provisioner_name() {
        return Err(NoTarget::NotOurs);
    }
    let interval = context
        .backend
        .check_parameters(&class.spec.parameters)
        .map_err(|e| {
            NoTarget::Invalid(format!("VolumeReplicationClass {class_name}: {e}"), false)
        })?;
    let source = &vr.spec.data_source;
    if source.kind != "PersistentVolumeClaim"
        || source.api_group.as_deref().is_some_and(|g| !g.is_empty())
    {
        return Err(NoTarget::Invalid(
            format!(
                "spec.dataSource: kind {:?}{} is not replicated here; name a PersistentVolumeClaim",
                source.kind,
                source
                    .api_group
                    .as_deref()
                    .filter(|g| !g.is_empty())
                    .map(|g| format!(" of group {g}"))
                    .unwrap_or_default()
            ),
            false,
        ));
    }
    let (claim, volume) = bound_volume(context, namespace, &source.name).await?;
    Ok(Target {
        parameters: class.spec.parameters,
        interval,
        claim,
        volume,
    })
}

/// The claim `name` and its bound volume, one the backend serves.
async fn bound_volume(
    context: &Context,
    namespace: &str,
    name: &str,
) -> Result<(PersistentVolumeClaim, PersistentVolume), NoTarget> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), namespace);
    let claim = match claims.get_opt(name).await {
        Ok(Some(claim)) => claim,
        Ok(None) => {
            return Err(NoTarget::Invalid(
                format!("spec.dataSource: PersistentVolumeClaim {namespace}/{name} does not exist"),
                true,
            ));
        }
        Err(e) => {
            return Err(NoTarget::Failed(format!(
                "reading claim {namespace}/{name}: {e}"
            )));
        }
    };
    let Some(volume_name) = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|v| !v.is_empty())
    else {
        return Err(NoTarget::Invalid(
            format!(
                "spec.dataSource: PersistentVolumeClaim {namespace}/{name} is not bound to a volume yet"
            ),
            true,
        ));
    };
    let volumes: Api<PersistentVolume> = Api::all(context.client.clone());
    let volume = match volumes.get_opt(&volume_name).await {
        Ok(Some(volume)) => volume,
        Ok(None) => {
            return Err(NoTarget::Invalid(
                format!(
                    "spec.dataSource: the volume {volume_name} of {namespace}/{name} does not exist"
                ),
                true,
            ));
        }
        Err(e) => {
            return Err(NoTarget::Failed(format!(
                "reading volume {volume_name}: {e}"
            )));
        }
    };
    if !context.backend.serves(&volume) {
        let driver = volume
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| format!(" (CSI driver {:?})", c.driver))
            .unwrap_or_default();
        return Err(NoTarget::Invalid(
            format!(
                "spec.dataSource: the volume {volume_name}{driver} of {namespace}/{} is not one of {}'s",
                name,
                context.backend.provisioner_name()
            ),
            false,
        ));
    }
    Ok((claim, volume))
}

/// Bad input: `Validated` `False` with `message`, an Event when it is news.
async fn refuse(
    context: &Context,
    api: &Api<VolumeReplication>,
    vr: &VolumeReplication,
    status: &VolumeReplicationStatus,
    message: &str,
    look_again: bool,
) -> Outcome {
    let generation = vr.metadata.generation;
    let mut next = status.clone();
    next.state = Some("Unknown".into());
    next.message = Some(message.to_owned());
    next.observed_generation = generation;
    conditions::failed_validation(&mut next.conditions, message, generation);
    if next != *status {
        context
            .recorder
            .publish(vr, EventType::Warning, "PrerequisiteNotMet", message);
    }
    match write_status(api, &vr.name_any(), status, &next).await {
        Some(e) => Outcome::Retry(e),
        None if look_again => Outcome::After(MISSING_RETRY),
        None => Outcome::Done,
    }
}

async fn sync(context: &Context, namespace: &str, name: &str) -> Outcome {
    let api: Api<VolumeReplication> = Api::namespaced(context.client.clone(), namespace);
    let vr = match api.get_opt(name).await {
        Ok(Some(vr)) => vr,
        Ok(None) => return Outcome::Done,
        Err(e) => {
            return Outcome::Retry(format!("reading VolumeReplication {namespace}/{name}: {e}"));
        }
    };
    let ours = vr.finalizers().iter().any(|f| f == FINALIZER);
    if vr.metadata.deletion_timestamp.is_some() {
        return if ours {
            finalize(context, &api, &vr, namespace).await
        } else {
            Outcome::Done
        };
    }
    let generation = vr.metadata.generation;
    let status = vr.status.clone().unwrap_or_default();
    let target = match target(context, &vr, namespace).await {
        Ok(target) => target,
        Err(NoTarget::NotOurs) => return Outcome::Done,
        Err(NoTarget::Failed(e)) => return Outcome::Retry(e),
        Err(NoTarget::Invalid(message, look_again)) => {
            return refuse(context, &api, &vr, &status, &message, look_again).await;
        }
    };
    if !ours && let Err(e) = crate::finalizers::add(&api, name, FINALIZER).await {
        return Outcome::Retry(format!(
            "adding the finalizer to VolumeReplication {namespace}/{name}: {e}"
        ));
    }
    let request = ReplicationRequest {
        claim: &target.claim,
        volume: &target.volume,
        parameters: &target.parameters,
    };
    let force = vr
        .annotations()
        .get(FORCE_PROMOTE_ANNOTATION)
        .is_some_and(|v| v == "true");
    let started = now();
    let mut next = status.clone();
    next.observed_generation = generation;
    let result = match vr.spec.replication_state.as_str() {
        "primary" => primary(context, &request, force, &mut next).await,
        "secondary" => secondary(context, &request, vr.spec.auto_resync, &mut next).await,
        "resync" => resync(context, &request, &mut next).await,
        other => Err(ReplicationError::invalid(
            "spec.replicationState",
            format!("{other:?} is not one of primary, secondary, resync"),
        )),
    };
    let delay = match &result {
        Ok(()) if vr.spec.replication_state == "primary" => target
            .interval
            .unwrap_or(STATUS_INTERVAL)
            .max(Duration::from_secs(10)),
        _ => STATUS_INTERVAL,
    };
    let outcome = match result {
        Ok(()) => {
            if next.last_start_time.is_none() || status.observed_generation != generation {
                next.last_start_time = Some(started);
                next.last_completion_time = Some(now());
            }
            Outcome::After(delay)
        }
        Err(e) => {
            let message = e.to_string();
            next.message = Some(message.clone());
            let reason = conditions::failed(
                &mut next.conditions,
                &vr.spec.replication_state,
                &message,
                generation,
            );
            if next != status {
                context
                    .recorder
                    .publish(&vr, EventType::Warning, reason, &message);
            }
            match e {
                ReplicationError::Invalid { .. } => Outcome::Done,
                ReplicationError::Failed(_) => {
                    Outcome::Retry(format!("VolumeReplication {namespace}/{name}: {message}"))
                }
            }
        }
    };
    match write_status(&api, name, &status, &next).await {
        Some(e) => Outcome::Retry(e),
        None => outcome,
    }
}

/// Copies the backend's sync report into the status.
fn record_sync(status: &mut VolumeReplicationStatus, info: &ReplicationInfo) {
    if let Some(time) = info.last_sync_time {
        status.last_sync_time = Some(Time(time));
        status.last_sync_bytes = info.last_sync_bytes.and_then(|b| i64::try_from(b).ok());
        status.last_sync_duration = info.last_sync_duration.map(|d| format!("{}s", d.as_secs()));
    }
}

async fn primary(
    context: &Context,
    request: &ReplicationRequest<'_>,
    force: bool,
    next: &mut VolumeReplicationStatus,
) -> Result<(), ReplicationError> {
    let info = context.backend.primary(request, force).await?;
    record_sync(next, &info);
    next.state = Some("Primary".into());
    next.message = Some(if info.replaying {
        "volume is primary and replicated to the peer".into()
    } else {
        format!(
            "volume is primary; the peer does not replay it: {}",
            info.description
        )
    });
    conditions::promoted(
        &mut next.conditions,
        info.replaying,
        &info.description,
        next.observed_generation,
    );
    Ok(())
}

async fn secondary(
    context: &Context,
    request: &ReplicationRequest<'_>,
    auto_resync: bool,
    next: &mut VolumeReplicationStatus,
) -> Result<(), ReplicationError> {
    let info = context.backend.secondary(request, auto_resync).await?;
    record_sync(next, &info);
    next.state = Some("Secondary".into());
    next.message = Some(if info.replaying {
        "volume is secondary and replays the peer's primary".into()
    } else {
        format!(
            "volume is secondary and does not replay the peer's primary yet: {}",
            info.description
        )
    });
    conditions::demoted(
        &mut next.conditions,
        info.replaying,
        &info.description,
        next.observed_generation,
    );
    Ok(())
}

async fn resync(
    context: &Context,
    request: &ReplicationRequest<'_>,
    next: &mut VolumeReplicationStatus,
) -> Result<(), ReplicationError> {
    let triggered = next
        .conditions
        .iter()
        .any(|c| c.type_ == "Resyncing" && c.status == "True");
    let info = context.backend.resync(request, triggered).await?;
    record_sync(next, &info);
    next.state = Some("Secondary".into());
    next.message = Some(if info.replaying && triggered {
        "volume is resynced and replays the peer's primary".into()
    } else if info.replaying {
        "volume is secondary and replays the peer's primary".into()
    } else {
        format!(
            "volume is resyncing from the peer's primary: {}",
            info.description
        )
    });
    conditions::resyncing(
        &mut next.conditions,
        !info.replaying,
        next.observed_generation,
    );
    Ok(())
}

async fn finalize(
    context: &Context,
    api: &Api<VolumeReplication>,
    vr: &VolumeReplication,
    namespace: &str,
) -> Outcome {
    let name = vr.name_any();
    match target(context, vr, namespace).await {
        Ok(target) => {
            let request = ReplicationRequest {
                claim: &target.claim,
                volume: &target.volume,
                parameters: &target.parameters,
            };
            if let Err(e) = context.backend.disable(&request).await {
                let message = format!("disabling the replication: {e}");
                context
                    .recorder
                    .publish(vr, EventType::Warning, "FailedToDisable", &message);
                return Outcome::Retry(format!("VolumeReplication {namespace}/{name}: {message}"));
            }
        }
        Err(NoTarget::Failed(e)) => return Outcome::Retry(e),
        // another provisioner's, or nothing to disable (no class, no claim any more)
        Err(NoTarget::NotOurs | NoTarget::Invalid(..)) => {}
    }
    match crate::finalizers::remove(api, &name, FINALIZER).await {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Retry(format!(
            "removing the finalizer of VolumeReplication {namespace}/{name}: {e}"
        )),
    }
}

/// Writes `next` when it differs from `current`; the error, if the write failed.
async fn write_status(
    api: &Api<VolumeReplication>,
    name: &str,
    current: &VolumeReplicationStatus,
    next: &VolumeReplicationStatus,
) -> Option<String> {
    if next == current {
        return None;
    }
    let patch = json!({ "status": next });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .err()
        .map(|e| format!("updating the status of VolumeReplication {name}: {e}"))
}
