//! csi-addons' `NetworkFence` (`csiaddons.openshift.io/v1alpha1`, cluster-scoped), served for
//! one CSI driver over a [`NetworkFencer`] backend, as the csi-addons controller and sidecar do
//! together for drivers that implement its fence service: the CIDRs of `spec.cidrs` are cut off
//! from the storage (`fenceState: Fenced`) or let back (`Unfenced`).
//!
//! # Flow, per NetworkFence whose `spec.driver` is ours
//!
//! 1. The finalizer [`FINALIZER`] is put on (so a deleted fence is taken back first).
//! 2. `spec.fenceState` `Fenced`: [`NetworkFencer::fence`]; `Unfenced`:
//!    [`NetworkFencer::unfence`]. Then `status.result` `Succeeded` or `Failed`, `status.message`
//!    and the condition `Fenced` (`True` once fenced, `False` once unfenced or failed, with the
//!    `observedGeneration`). A generation already done is not done again.
//! 3. Deleted: the CIDRs unfenced, then the finalizer removed.
//!
//! Bad input is `Failed` with a message naming the field (`spec.driver`, `spec.cidrs[1]`,
//! `spec.fenceState`, `spec.secret`, `spec.parameters`) and is not retried until the object
//! changes; other failures are retried with backoff.
//!
//! A NetworkFence naming another driver that is installed (its CSIDriver exists) is left to
//! that driver; one naming no installed driver is `Failed` (`spec.driver`).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::storage::v1::CSIDriver;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::core::ClusterResourceScope;
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::queue::{Backoff, WorkQueue};
use crate::volume::BoxError;

/// The API group of csi-addons.
pub const GROUP: &str = "csiaddons.openshift.io";
/// The finalizer held while a fence may be in place (csi-addons' own name for it).
pub const FINALIZER: &str = "csiaddons.openshift.io/network-fence";

/// A NetworkFence, with the fields read.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NetworkFence {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    #[serde(default)]
    /// What to fence.
    pub spec: NetworkFenceSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// What was done.
    pub status: Option<NetworkFenceStatus>,
}

/// `spec` of a NetworkFence.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkFenceSpec {
    #[serde(default)]
    /// The CSI driver that serves the object.
    pub driver: String,
    /// `Fenced` or `Unfenced` (the CRD defaults it to `Fenced`).
    #[serde(default)]
    pub fence_state: String,
    #[serde(default)]
    /// The CIDR blocks to fence.
    pub cidrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The Secret with the credentials to fence with.
    pub secret: Option<SecretReference>,
    #[serde(default)]
    /// Driver parameters.
    pub parameters: BTreeMap<String, String>,
}

/// `spec.secret`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct SecretReference {
    #[serde(default)]
    /// Name of the Secret.
    pub name: String,
    #[serde(default)]
    /// Namespace of the Secret.
    pub namespace: String,
}

/// `status` of a NetworkFence.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct NetworkFenceStatus {
    #[serde(default)]
    /// `Succeeded` or `Failed`.
    pub result: Option<String>,
    #[serde(default)]
    /// What was done, or why it failed.
    pub message: Option<String>,
    #[serde(default)]
    /// The `Fenced` condition.
    pub conditions: Vec<serde_json::Value>,
}

custom_resource!(
    NetworkFence,
    GROUP,
    "v1alpha1",
    "NetworkFence",
    "networkfences",
    ClusterResourceScope
);

/// What a backend is asked to fence or unfence.
#[derive(Clone, Copy, Debug)]
pub struct NetworkFenceRequest<'a> {
    /// The NetworkFence's name.
    pub name: &'a str,
    /// `spec.cidrs`.
    pub cidrs: &'a [String],
    /// `spec.secret`.
    pub secret: Option<&'a SecretReference>,
    /// `spec.parameters`.
    pub parameters: &'a BTreeMap<String, String>,
}

/// Why a fence or unfence failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkFenceError {
    /// Bad input: `Failed`, not retried until the object changes.
    #[error("{field}: {problem}")]
    Invalid {
        /// The field, e.g. `spec.cidrs[1]`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// Anything else: `Failed`, retried with backoff.
    #[error(transparent)]
    Failed(BoxError),
}

impl NetworkFenceError {
    /// An [`NetworkFenceError::Invalid`] naming `field`.
    pub fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        NetworkFenceError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A [`NetworkFenceError::Failed`].
    pub fn failed(error: impl Into<BoxError>) -> Self {
        NetworkFenceError::Failed(error.into())
    }
}

/// A backend that cuts CIDRs off from the storage and lets them back.
#[async_trait]
pub trait NetworkFencer: Send + Sync {
    /// The CSI driver name whose NetworkFences (`spec.driver`) this backend serves.
    fn driver_name(&self) -> String;

    /// Fences `request.cidrs` (idempotent); returns the message for `status.message`.
    async fn fence(&self, request: &NetworkFenceRequest<'_>) -> Result<String, NetworkFenceError>;

    /// Unfences `request.cidrs` (idempotent: not fenced is a success); returns the message.
    async fn unfence(&self, request: &NetworkFenceRequest<'_>)
    -> Result<String, NetworkFenceError>;
}

/// Settings of the NetworkFence controller.
#[derive(Clone, Debug, Default)]
pub struct NetworkFenceConfig {
    /// Per-object retry backoff. Default: 1 s doubling to 5 min.
    pub backoff: Backoff,
}

/// The controller as a task for [`crate::Controller::with_companion`].
pub fn task(
    client: Client,
    backend: Arc<dyn NetworkFencer>,
    config: NetworkFenceConfig,
) -> crate::Companion {
    Box::pin(async move { run(client, backend, config).await })
}

/// What one sync ended with.
enum Outcome {
    Done,
    Retry(String),
}

/// Runs until dropped (or the watch ends). Where the CRD is not installed, the watch is tried
/// again with a delay doubling up to a minute (one warning every ten minutes at most).
pub async fn run(client: Client, backend: Arc<dyn NetworkFencer>, config: NetworkFenceConfig) {
    let driver = backend.driver_name();
    let queue: Arc<WorkQueue<String>> = Arc::new(WorkQueue::new(config.backoff));
    tracing::info!(%driver, "watching NetworkFences");
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (queue, client, backend) = (Arc::clone(&queue), client.clone(), Arc::clone(&backend));
        tasks.spawn(async move {
            while let Some(name) = queue.get().await {
                match sync(&client, backend.as_ref(), &name).await {
                    Outcome::Done => queue.forget(&name),
                    Outcome::Retry(error) => {
                        tracing::warn!(networkfence = %name, %error, "NetworkFence failed; retrying");
                        queue.add_rate_limited(name.clone());
                    }
                }
                queue.done(&name);
            }
        });
    }
    let api: Api<NetworkFence> = Api::all(client);
    crate::custom_watch::watch(api, "NetworkFence", |nf: NetworkFence, _| {
        queue.add(nf.name_any());
    })
    .await;
    queue.shut_down();
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The condition and status written after an attempt.
fn status(
    generation: Option<i64>,
    fenced: bool,
    result: &Result<String, String>,
    unfencing: bool,
) -> serde_json::Value {
    let (outcome, message, reason, condition) = match result {
        Ok(message) if unfencing => ("Succeeded", message.clone(), "UnfenceSucceeded", "False"),
        Ok(message) => (
            "Succeeded",
            message.clone(),
            "FenceSucceeded",
            if fenced { "True" } else { "False" },
        ),
        Err(message) if unfencing => ("Failed", message.clone(), "UnfenceFailed", "Unknown"),
        Err(message) => ("Failed", message.clone(), "FenceFailed", "False"),
    };
    let mut condition = json!({
        "type": "Fenced",
        "status": condition,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    });
    if let Some(generation) = generation {
        condition["observedGeneration"] = json!(generation);
    }
    json!({"status": {"result": outcome, "message": message, "conditions": [condition]}})
}

/// Whether `nf`'s status already records this generation's outcome as a success.
fn done_already(nf: &NetworkFence) -> bool {
    let Some(status) = &nf.status else {
        return false;
    };
    let generation = nf.metadata.generation;
    status.result.as_deref() == Some("Succeeded")
        && generation.is_some()
        && status
            .conditions
            .iter()
            .any(|c| c["observedGeneration"].as_i64() == generation)
}

/// Whether `nf`'s status already holds this failure (so it is not written again).
fn failed_already(nf: &NetworkFence, message: &str) -> bool {
    nf.status.as_ref().is_some_and(|s| {
        s.result.as_deref() == Some("Failed") && s.message.as_deref() == Some(message)
    })
}

/// A NetworkFence naming another driver: left to it when that driver is installed, else
/// `Failed` naming `spec.driver`.
async fn sync_foreign(
    client: &Client,
    api: &Api<NetworkFence>,
    nf: &NetworkFence,
    ours: &str,
) -> Outcome {
    let name = nf.name_any();
    let spec = &nf.spec;
    let problem = if spec.driver.is_empty() {
        Some("must name the CSI driver".to_owned())
    } else {
        let drivers: Api<CSIDriver> = Api::all(client.clone());
        match drivers.get_opt(&spec.driver).await {
            Ok(Some(_)) => None,
            Ok(None) => Some(format!(
                "no CSIDriver named {:?} is installed ({ours} is served here)",
                spec.driver
            )),
            Err(e) => return Outcome::Retry(format!("reading CSIDriver {}: {e}", spec.driver)),
        }
    };
    if let Some(problem) = problem
        && nf.metadata.deletion_timestamp.is_none()
    {
        let message = format!("spec.driver: {problem}");
        if !failed_already(nf, &message) {
            return write_status(
                api,
                &name,
                status(nf.metadata.generation, false, &Err(message), false),
            )
            .await;
        }
    }
    Outcome::Done
}

/// A NetworkFence being deleted: unfenced, then its finalizer removed.
async fn sync_deleted(
    api: &Api<NetworkFence>,
    backend: &dyn NetworkFencer,
    nf: &NetworkFence,
    request: &NetworkFenceRequest<'_>,
) -> Outcome {
    let name = request.name;
    if !nf.finalizers().iter().any(|f| f == FINALIZER) {
        return Outcome::Done;
    }
    match backend.unfence(request).await {
        // nothing can have been fenced for bad input
        Ok(_) | Err(NetworkFenceError::Invalid { .. }) => {}
        Err(NetworkFenceError::Failed(e)) => {
            return Outcome::Retry(format!("unfencing deleted NetworkFence {name}: {e}"));
        }
    }
    match crate::finalizers::remove(api, name, FINALIZER).await {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Retry(format!(
            "removing the finalizer of NetworkFence {name}: {e}"
        )),
    }
}

async fn sync(client: &Client, backend: &dyn NetworkFencer, name: &str) -> Outcome {
    let api: Api<NetworkFence> = Api::all(client.clone());
    let nf = match api.get_opt(name).await {
        Ok(Some(nf)) => nf,
        Ok(None) => return Outcome::Done,
        Err(e) => return Outcome::Retry(format!("reading NetworkFence {name}: {e}")),
    };
    let ours = backend.driver_name();
    let spec = &nf.spec;
    if spec.driver != ours {
        return sync_foreign(client, &api, &nf, &ours).await;
    }
    let request = NetworkFenceRequest {
        name,
        cidrs: &spec.cidrs,
        secret: spec.secret.as_ref(),
        parameters: &spec.parameters,
    };
    if nf.metadata.deletion_timestamp.is_some() {
        return sync_deleted(&api, backend, &nf, &request).await;
    }
    if done_already(&nf) {
        return Outcome::Done;
    }
    if !nf.finalizers().iter().any(|f| f == FINALIZER)
        && let Err(e) = crate::finalizers::add(&api, name, FINALIZER).await
    {
        return Outcome::Retry(format!("adding the finalizer to NetworkFence {name}: {e}"));
    }
    let unfencing = match spec.fence_state.as_str() {
        "Fenced" | "" => false,
        "Unfenced" => true,
        other => {
            let message = format!("spec.fenceState: {other:?} is neither Fenced nor Unfenced");
            if failed_already(&nf, &message) {
                return Outcome::Done;
            }
            return write_status(
                &api,
                name,
                status(nf.metadata.generation, false, &Err(message), false),
            )
            .await;
        }
    };
    let result = if spec.cidrs.is_empty() {
        Err(NetworkFenceError::invalid(
            "spec.cidrs",
            "at least one CIDR is required",
        ))
    } else if unfencing {
        backend.unfence(&request).await
    } else {
        backend.fence(&request).await
    };
    match result {
        Ok(message) => {
            tracing::info!(networkfence = name, %message, unfencing, "NetworkFence done");
            write_status(
                &api,
                name,
                status(nf.metadata.generation, !unfencing, &Ok(message), unfencing),
            )
            .await
        }
        Err(NetworkFenceError::Invalid { field, problem }) => {
            let message = format!("{field}: {problem}");
            if failed_already(&nf, &message) {
                return Outcome::Done;
            }
            write_status(
                &api,
                name,
                status(nf.metadata.generation, false, &Err(message), unfencing),
            )
            .await
        }
        Err(NetworkFenceError::Failed(e)) => {
            let message = e.to_string();
            let written = write_status(
                &api,
                name,
                status(
                    nf.metadata.generation,
                    false,
                    &Err(message.clone()),
                    unfencing,
                ),
            )
            .await;
            match written {
                Outcome::Done => Outcome::Retry(message),
                retry @ Outcome::Retry(_) => retry,
            }
        }
    }
}

async fn write_status(api: &Api<NetworkFence>, name: &str, patch: serde_json::Value) -> Outcome {
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Outcome::Done,
        Err(e) => Outcome::Retry(format!("updating the status of NetworkFence {name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_succeeded_generation_is_not_done_again() {
        let mut nf: NetworkFence = serde_json::from_value(json!({
            "metadata": {"name": "f", "generation": 2},
            "spec": {"driver": "d", "fenceState": "Fenced", "cidrs": ["10.0.0.1/32"]},
        }))
        .unwrap();
        assert!(!done_already(&nf));
        let written = status(Some(2), true, &Ok("ok".into()), false);
        nf.status = serde_json::from_value(written["status"].clone()).unwrap();
        assert!(done_already(&nf));
        assert_eq!(written["status"]["conditions"][0]["status"], "True");
        nf.metadata.generation = Some(3);
        assert!(!done_already(&nf));
        let failed = status(Some(3), false, &Err("spec.cidrs[0]: bad".into()), false);
        assert_eq!(failed["status"]["result"], "Failed");
        assert_eq!(failed["status"]["conditions"][0]["reason"], "FenceFailed");
    }
}
