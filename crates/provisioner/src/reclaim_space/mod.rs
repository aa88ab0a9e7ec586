//! csi-addons' `ReclaimSpaceJob` (`csiaddons.openshift.io/v1alpha1`, namespaced), served over a
//! [`SpaceReclaimer`] backend for the volumes it serves: the space the target claim's volume no
//! longer uses is given back to the storage, once per job.
//!
//! # Flow, per ReclaimSpaceJob without a `status.result`
//!
//! 1. `status.startTime` is recorded.
//! 2. The claim `spec.target.persistentVolumeClaim` (in the job's namespace) and its bound
//!    PersistentVolume are read. A volume the backend does not serve
//!    ([`SpaceReclaimer::serves`]) is left alone when its CSI driver is installed (another
//!    controller serves it), else the job fails naming the field.
//! 3. The node the volume is attached to (a VolumeAttachment of the PV with `status.attached`)
//!    is looked up: the backend decides from it which side reclaims (the node that has the
//!    volume staged, or the storage directly). The node side is handed to the node plugin
//!    through annotations on the job ([`node`]).
//! 4. [`SpaceReclaimer::reclaim`] runs, bounded by `spec.timeout` (seconds; default
//!    [`DEFAULT_TIMEOUT`]).
//! 5. `status.result` `Succeeded` with `reclaimedSpace` (bytes, as a quantity), `message`,
//!    `completionTime`; or `Failed` with `message` and a `Failed` condition. An Event on the
//!    claim says either (`ReclaimSpaceSucceeded`, `ReclaimSpaceFailed`), and the metrics count
//!    the bytes reclaimed and the failures per volume.
//!
//! **Retries**: bad input (`spec.target.persistentVolumeClaim` empty, no such claim, not bound,
//! a volume of another driver) fails at once. Other failures are retried with backoff while
//! `status.retries` < `spec.backOffLimit` (default 6) and less than
//! `spec.retryDeadlineSeconds` (default 600) have passed since `startTime`; then the job fails.
//! A finished job is never run again: a new job runs another reclaim.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Metrics;
use crate::events::{EventRecorder, EventType};
use crate::network_fence::GROUP;
use crate::queue::{Backoff, WorkQueue};
use crate::volume::BoxError;

pub mod cron;
pub mod cronjob;
pub mod node;
pub mod schedule;

pub use node::{NodeAnswer, NodeHandOff, NodeSpaceReclaimer};

/// How long a reclaim may take when `spec.timeout` does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_mins(3);
/// `spec.backOffLimit` when not set (csi-addons' default).
pub const DEFAULT_BACKOFF_LIMIT: i32 = 6;
/// `spec.retryDeadlineSeconds` when not set (csi-addons' default).
pub const DEFAULT_RETRY_DEADLINE_SECONDS: i64 = 600;
const TARGET_FIELD: &str = "spec.target.persistentVolumeClaim";

/// A ReclaimSpaceJob, with the fields read.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ReclaimSpaceJob {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// What to reclaim.
    #[serde(default)]
    pub spec: ReclaimSpaceJobSpec,
    /// What was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ReclaimSpaceJobStatus>,
}

/// `spec` of a ReclaimSpaceJob.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceJobSpec {
    /// The target volume.
    #[serde(default)]
    pub target: Target,
    /// Retries allowed before the job fails (0..60; default [`DEFAULT_BACKOFF_LIMIT`]).
    #[serde(default, rename = "backOffLimit")]
    pub back_off_limit: Option<i32>,
    /// Seconds after `startTime` within which the job may be retried (default
    /// [`DEFAULT_RETRY_DEADLINE_SECONDS`]).
    #[serde(default)]
    pub retry_deadline_seconds: Option<i64>,
    /// Seconds one reclaim may take (default [`DEFAULT_TIMEOUT`]).
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// `spec.target`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The name of the PersistentVolumeClaim, in the job's namespace.
    #[serde(default)]
    pub persistent_volume_claim: String,
}

/// `status` of a ReclaimSpaceJob.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceJobStatus {
    /// `Succeeded` or `Failed` once the job is done.
    #[serde(default)]
    pub result: Option<String>,
    /// What was done, or why it failed.
    #[serde(default)]
    pub message: Option<String>,
    /// Bytes given back, as a quantity.
    #[serde(default)]
    pub reclaimed_space: Option<String>,
    /// Conditions (`Failed` when the job failed).
    #[serde(default)]
    pub conditions: Vec<serde_json::Value>,
    /// How many times the reclaim was retried.
    #[serde(default)]
    pub retries: Option<i32>,
    /// When the job was first worked on.
    #[serde(default)]
    pub start_time: Option<Time>,
    /// When it finished.
    #[serde(default)]
    pub completion_time: Option<Time>,
}

custom_resource!(
    ReclaimSpaceJob,
    GROUP,
    "v1alpha1",
    "ReclaimSpaceJob",
    "reclaimspacejobs",
    NamespaceResourceScope
);

/// What a backend is asked to reclaim.
#[derive(Clone, Copy)]
pub struct ReclaimRequest<'a> {
    /// The target claim.
    pub claim: &'a PersistentVolumeClaim,
    /// Its bound volume (one [`SpaceReclaimer::serves`]).
    pub volume: &'a PersistentVolume,
    /// The node the volume is attached to, if any.
    pub node: Option<&'a str>,
    /// Hands the node's part to the node plugin of [`ReclaimRequest::node`].
    pub on_node: &'a dyn NodeHandOff,
}

/// What a reclaim did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reclaimed {
    /// Bytes given back to the storage.
    pub bytes: u64,
    /// What was done, for `status.message` and the Event.
    pub message: String,
}

/// Why a reclaim failed.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimSpaceError {
    /// Bad input or a state retrying cannot change: `Failed` at once.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field, e.g. `spec.target.persistentVolumeClaim`.
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// Anything else: retried within the job's limits.
    #[error(transparent)]
    Failed(BoxError),
}

impl ReclaimSpaceError {
    /// An [`ReclaimSpaceError::Invalid`] naming `field`.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ReclaimSpaceError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A [`ReclaimSpaceError::Failed`].
    pub fn failed(error: impl Into<BoxError>) -> Self {
        ReclaimSpaceError::Failed(error.into())
    }
}

/// A backend that gives a volume's unused space back to the storage.
#[async_trait]
pub trait SpaceReclaimer: Send + Sync {
    /// Whether `volume` is one of this backend's.
    fn serves(&self, volume: &PersistentVolume) -> bool;

    /// The CSI driver name the node plugins answer under ([`node::request_annotation`]).
    fn driver_name(&self) -> &str;

    /// Reclaims the space of `request.volume` (deciding from `request.node` where).
    async fn reclaim(&self, request: &ReclaimRequest<'_>) -> Result<Reclaimed, ReclaimSpaceError>;
}

/// Settings of the ReclaimSpaceJob controller.
#[derive(Clone, Debug)]
pub struct ReclaimSpaceConfig {
    /// Per-job retry backoff. Default: 1 s doubling to 5 min.
    pub backoff: Backoff,
    /// Where the bytes reclaimed and the failures are counted.
    pub metrics: Metrics,
    /// Event `source.component`.
    pub component: String,
}

impl Default for ReclaimSpaceConfig {
    fn default() -> Self {
        Self {
            backoff: Backoff::default(),
            metrics: Metrics::unregistered(),
            component: "reclaimspace-controller".into(),
        }
    }
}

/// The controllers of ReclaimSpaceJobs ([`run`]) and ReclaimSpaceCronJobs ([`cronjob::run`])
/// as a task for [`crate::Controller::with_companion`]; the schedule annotations are
/// [`schedule::controller`]'s.
pub fn task(
    client: Client,
    backend: Arc<dyn SpaceReclaimer>,
    config: ReclaimSpaceConfig,
) -> crate::Companion {
    Box::pin(async move {
        let component = config.component.clone();
        tokio::join!(
            run(client.clone(), backend, config),
            cronjob::run(client, component),
        );
    })
}

/// What one sync ended with.
enum Outcome {
    Done,
    Retry(String),
}

struct Context {
    client: Client,
    backend: Arc<dyn SpaceReclaimer>,
    recorder: EventRecorder,
    metrics: Metrics,
}

/// Runs until dropped (or the watch ends). Where the CRD is not installed, the watch is tried
/// again with a delay doubling up to a minute (one warning every ten minutes at most).
pub async fn run(client: Client, backend: Arc<dyn SpaceReclaimer>, config: ReclaimSpaceConfig) {
    let queue: Arc<WorkQueue<(String, String)>> = Arc::new(WorkQueue::new(config.backoff));
    let context = Arc::new(Context {
        client: client.clone(),
        backend,
        recorder: EventRecorder::new(client.clone(), &config.component, &config.component),
        metrics: config.metrics,
    });
    tracing::info!("watching ReclaimSpaceJobs");
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (queue, context) = (Arc::clone(&queue), Arc::clone(&context));
        tasks.spawn(async move {
            while let Some(key) = queue.get().await {
                match sync(&context, &key.0, &key.1).await {
                    Outcome::Done => queue.forget(&key),
                    Outcome::Retry(error) => {
                        tracing::warn!(reclaimspacejob = %format!("{}/{}", key.0, key.1), %error, "ReclaimSpaceJob failed; retrying");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        });
    }
    let api: Api<ReclaimSpaceJob> = Api::all(client);
    // a job is queued when it appears (no startTime yet) and at every (re)list while it has
    // no result; the changes of its status that a retry writes do not queue it again, so the
    // retry waits for its backoff
    crate::custom_watch::watch(api, "ReclaimSpaceJob", |job: ReclaimSpaceJob, listed| {
        let status = job.status.as_ref();
        let unfinished = status.and_then(|s| s.result.as_ref()).is_none();
        let started = status.and_then(|s| s.start_time.as_ref()).is_some();
        if unfinished && (listed || !started) {
            queue.add((job.namespace().unwrap_or_default(), job.name_any()));
        }
    })
    .await;
    queue.shut_down();
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The job's target: claim and bound volume, or why there is none.
async fn target(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(PersistentVolumeClaim, PersistentVolume), ReclaimSpaceError> {
    if name.is_empty() {
        return Err(ReclaimSpaceError::invalid(
            TARGET_FIELD,
            "must name a PersistentVolumeClaim",
        ));
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim = claims
        .get_opt(name)
        .await
        .map_err(ReclaimSpaceError::failed)?
        .ok_or_else(|| {
            ReclaimSpaceError::invalid(
                TARGET_FIELD,
                format!("PersistentVolumeClaim {namespace}/{name} does not exist"),
            )
        })?;
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ReclaimSpaceError::invalid(
                TARGET_FIELD,
                format!("PersistentVolumeClaim {namespace}/{name} is not bound to a volume"),
            )
        })?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volume = volumes
        .get_opt(&volume_name)
        .await
        .map_err(ReclaimSpaceError::failed)?
        .ok_or_else(|| {
            ReclaimSpaceError::invalid(
                TARGET_FIELD,
                format!("the volume {volume_name} of {namespace}/{name} does not exist"),
            )
        })?;
    Ok((claim, volume))
}

/// The node `volume` is attached to: a VolumeAttachment of it with `status.attached`.
async fn attached_node(client: &Client, volume: &str) -> Result<Option<String>, kube::Error> {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let list = attachments.list(&ListParams::default()).await?;
    Ok(list.items.into_iter().find_map(|va| {
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        (attached && va.spec.source.persistent_volume_name.as_deref() == Some(volume))
            .then_some(va.spec.node_name)
    }))
}

/// The CSI driver of `volume` when it is installed (a CSIDriver of that name exists).
async fn installed_driver(client: &Client, volume: &PersistentVolume) -> Option<String> {
    let driver = volume.spec.as_ref()?.csi.as_ref()?.driver.clone();
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    matches!(drivers.get_opt(&driver).await, Ok(Some(_))).then_some(driver)
}

fn failed_status(message: &str, retries: i32, start: &Time) -> serde_json::Value {
    json!({"status": {
        "result": "Failed",
        "message": message,
        "retries": retries,
        "startTime": start,
        "completionTime": now(),
        "conditions": [{
            "type": "Failed",
            "status": "True",
            "reason": "ReclaimSpaceFailed",
            "message": message,
            "lastTransitionTime": now(),
        }],
    }})
}

fn succeeded_status(reclaimed: &Reclaimed, retries: i32, start: &Time) -> serde_json::Value {
    json!({"status": {
        "result": "Succeeded",
        "message": reclaimed.message,
        "reclaimedSpace": crate::quantity::format_bytes(reclaimed.bytes),
        "retries": retries,
        "startTime": start,
        "completionTime": now(),
    }})
}

/// Whether a failed attempt may be retried: fewer retries than `spec.backOffLimit` and within
/// `spec.retryDeadlineSeconds` of the start.
fn may_retry(spec: &ReclaimSpaceJobSpec, retries: i32, elapsed: Duration) -> bool {
    let limit = spec.back_off_limit.unwrap_or(DEFAULT_BACKOFF_LIMIT);
    let deadline = spec
        .retry_deadline_seconds
        .unwrap_or(DEFAULT_RETRY_DEADLINE_SECONDS);
    retries < limit && elapsed < Duration::from_secs(u64::try_from(deadline).unwrap_or(0))
}

fn timeout_of(spec: &ReclaimSpaceJobSpec) -> Duration {
    spec.timeout
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
}

async fn sync(context: &Context, namespace: &str, name: &str) -> Outcome {
    let api: Api<ReclaimSpaceJob> = Api::namespaced(context.client.clone(), namespace);
    let job = match api.get_opt(name).await {
        Ok(Some(job)) => job,
        Ok(None) => return Outcome::Done,
        Err(e) => {
            return Outcome::Retry(format!("reading ReclaimSpaceJob {namespace}/{name}: {e}"));
        }
    };
    let status = job.status.clone().unwrap_or_default();
    if status.result.is_some() {
        return Outcome::Done;
    }
    let retries = status.retries.unwrap_or(0);
    let start = if let Some(start) = status.start_time {
        start
    } else {
        let start = now();
        let patch = json!({"status": {"startTime": start, "retries": 0}});
        if let Outcome::Retry(e) = write_status(&api, name, &patch).await {
            return Outcome::Retry(e);
        }
        start
    };
    let result = attempt(context, &job, namespace).await;
    let claim = job.spec.target.persistent_volume_claim.as_str();
    match result {
        Attempt::LeftAlone => Outcome::Done,
        Attempt::Done(claim_object, volume, Ok(reclaimed)) => {
            tracing::info!(reclaimspacejob = %format!("{namespace}/{name}"), bytes = reclaimed.bytes, message = %reclaimed.message, "ReclaimSpaceJob succeeded");
            context.metrics.reclaimed(&volume, reclaimed.bytes);
            if let Some(claim) = claim_object.as_deref() {
                context.recorder.publish(
                    claim,
                    EventType::Normal,
                    "ReclaimSpaceSucceeded",
                    &format!("ReclaimSpaceJob {name}: {}", reclaimed.message),
                );
            }
            write_status(&api, name, &succeeded_status(&reclaimed, retries, &start)).await
        }
        Attempt::Done(claim_object, volume, Err(error)) => {
            let final_failure = matches!(error, ReclaimSpaceError::Invalid { .. })
                || !may_retry(&job.spec, retries, elapsed_since(&start));
            if final_failure {
                context.metrics.reclaim_failed(&volume);
                finish_failed(
                    context,
                    &api,
                    name,
                    claim_object.as_deref(),
                    &error.to_string(),
                    retries,
                    &start,
                )
                .await
            } else {
                let patch =
                    json!({"status": {"retries": retries + 1, "message": error.to_string()}});
                match write_status(&api, name, &patch).await {
                    Outcome::Done => Outcome::Retry(format!("claim {namespace}/{claim}: {error}")),
                    retry @ Outcome::Retry(_) => retry,
                }
            }
        }
    }
}

async fn finish_failed(
    context: &Context,
    api: &Api<ReclaimSpaceJob>,
    name: &str,
    claim: Option<&PersistentVolumeClaim>,
    message: &str,
    retries: i32,
    start: &Time,
) -> Outcome {
    tracing::warn!(reclaimspacejob = name, %message, "ReclaimSpaceJob failed");
    if let Some(claim) = claim {
        context.recorder.publish(
            claim,
            EventType::Warning,
            "ReclaimSpaceFailed",
            &format!("ReclaimSpaceJob {name}: {message}"),
        );
    }
    write_status(api, name, &failed_status(message, retries, start)).await
}

fn elapsed_since(start: &Time) -> Duration {
    let now = k8s_openapi::jiff::Timestamp::now();
    u64::try_from(now.as_second() - start.0.as_second())
        .map(Duration::from_secs)
        .unwrap_or_default()
}

/// What one attempt came to.
enum Attempt {
    /// A volume another installed driver serves.
    LeftAlone,
    /// The claim (when it exists), the volume's name (empty when unknown) and the outcome.
    Done(
        Option<Box<PersistentVolumeClaim>>,
        String,
        Result<Reclaimed, ReclaimSpaceError>,
    ),
}

async fn attempt(context: &Context, job: &ReclaimSpaceJob, namespace: &str) -> Attempt {
    let claim_name = &job.spec.target.persistent_volume_claim;
    let (claim, volume) = match target(&context.client, namespace, claim_name).await {
        Ok(found) => found,
        Err(e) => return Attempt::Done(None, String::new(), Err(e)),
    };
    let volume_name = volume.name_any();
    if !context.backend.serves(&volume) {
        if installed_driver(&context.client, &volume).await.is_some() {
            return Attempt::LeftAlone;
        }
        let problem = format!(
            "the volume {volume_name} of {namespace}/{claim_name} is not one this provisioner \
             serves{}",
            volume
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .map(|c| format!(" (its CSI driver {:?} is not installed)", c.driver))
                .unwrap_or_default()
        );
        return Attempt::Done(
            Some(Box::new(claim)),
            volume_name,
            Err(ReclaimSpaceError::invalid(TARGET_FIELD, problem)),
        );
    }
    let node = match attached_node(&context.client, &volume_name).await {
        Ok(node) => node,
        Err(e) => {
            return Attempt::Done(
                Some(Box::new(claim)),
                volume_name,
                Err(ReclaimSpaceError::failed(format!(
                    "listing VolumeAttachments: {e}"
                ))),
            );
        }
    };
    let timeout = timeout_of(&job.spec);
    let hand_off = node::JobHandOff::new(
        Api::namespaced(context.client.clone(), namespace),
        &job.name_any(),
        context.backend.driver_name(),
    );
    let request = ReclaimRequest {
        claim: &claim,
        volume: &volume,
        node: node.as_deref(),
        on_node: &hand_off,
    };
    let result = match tokio::time::timeout(timeout, context.backend.reclaim(&request)).await {
        Ok(result) => result,
        Err(_) => Err(ReclaimSpaceError::failed(match hand_off.waiting_on() {
            Some(node) => format!(
                "node {node} did not answer within spec.timeout ({} s): is the node plugin \
                 running there, with access to the Kubernetes API?",
                timeout.as_secs()
            ),
            None => format!(
                "the reclaim did not finish within spec.timeout ({} s)",
                timeout.as_secs()
            ),
        })),
    };
    Attempt::Done(Some(Box::new(claim)), volume_name, result)
}

async fn write_status(
    api: &Api<ReclaimSpaceJob>,
    name: &str,
    patch: &serde_json::Value,
) -> Outcome {
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Outcome::Done,
        Err(e) => Outcome::Retry(format!(
            "updating the status of ReclaimSpaceJob {name}: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stop_at_the_back_off_limit_and_the_deadline() {
        let spec = ReclaimSpaceJobSpec::default();
        assert!(may_retry(&spec, 0, Duration::from_secs(1)));
        assert!(may_retry(&spec, 5, Duration::from_secs(599)));
        assert!(!may_retry(&spec, 6, Duration::from_secs(1)));
        assert!(!may_retry(&spec, 0, Duration::from_mins(10)));
        let none = ReclaimSpaceJobSpec {
            back_off_limit: Some(0),
            ..ReclaimSpaceJobSpec::default()
        };
        assert!(!may_retry(&none, 0, Duration::from_secs(0)));
    }

    #[test]
    fn the_timeout_is_the_spec_s_or_the_default() {
        let mut spec = ReclaimSpaceJobSpec::default();
        assert_eq!(timeout_of(&spec), DEFAULT_TIMEOUT);
        spec.timeout = Some(90);
        assert_eq!(timeout_of(&spec), Duration::from_secs(90));
    }

    #[test]
    fn statuses_carry_csi_addons_fields() {
        let start = now();
        let ok = succeeded_status(
            &Reclaimed {
                bytes: 64 << 20,
                message: "sparsified".into(),
            },
            1,
            &start,
        );
        assert_eq!(ok["status"]["result"], "Succeeded");
        assert_eq!(ok["status"]["reclaimedSpace"], "64Mi");
        assert!(ok["status"]["completionTime"].is_string());
        let failed = failed_status("spec.target.persistentVolumeClaim: x", 0, &start);
        assert_eq!(failed["status"]["result"], "Failed");
        assert_eq!(failed["status"]["conditions"][0]["type"], "Failed");
    }
}
