//! The node side of a ReclaimSpaceJob: when a filesystem volume is attached to a node, its free
//! space is the node's to trim, so the controller hands the work to the node plugin there,
//! through two annotations on the job itself (no sidecar, no extra connection to the node):
//!
//! 1. the controller ([`JobHandOff`]) writes [`request_annotation`] — `{"id", "node",
//!    "volumeHandle"}`, a new `id` per attempt — and watches the job;
//! 2. the node plugin of that node ([`agent`]) watches ReclaimSpaceJobs, sees a request for its
//!    node that has no answer yet, runs its [`NodeSpaceReclaimer`] on the volume and writes
//!    [`result_annotation`] — `{"id", "node", "succeeded", "message", "discarded"}`;
//! 3. the controller takes the answer whose `id` is its request's and finishes the job. A node
//!    that does not answer within `spec.timeout` fails the attempt naming the node; a retry
//!    writes a new `id`, so a late answer to an old request is never taken for a new one.
//!
//! The annotation keys start with the CSI driver's name (`rbd.csi.ceph.com/node-reclaim-request`),
//! so two drivers built on this library never answer each other's requests. The node plugin
//! needs `get`, `list`, `watch` and `patch` on `reclaimspacejobs`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ReclaimSpaceError, ReclaimSpaceJob};

/// The annotation a controller asks a node with: `<driver>/node-reclaim-request`.
#[must_use]
pub fn request_annotation(driver: &str) -> String {
    format!("{driver}/node-reclaim-request")
}

/// The annotation a node answers with: `<driver>/node-reclaim-result`.
#[must_use]
pub fn result_annotation(driver: &str) -> String {
    format!("{driver}/node-reclaim-result")
}

/// What the controller asks of a node (the value of [`request_annotation`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRequest {
    /// New for every attempt.
    pub id: String,
    /// The node that is to reclaim.
    pub node: String,
    /// The CSI volume handle of the volume staged there.
    pub volume_handle: String,
}

/// What the node answered (the value of [`result_annotation`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResult {
    /// The [`NodeRequest::id`] answered.
    pub id: String,
    /// The node that answered.
    pub node: String,
    /// Whether the node's part succeeded.
    pub succeeded: bool,
    /// What was done, or why it failed.
    pub message: String,
    /// Bytes the node discarded (its filesystem's answer to the trim), when it trimmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discarded: Option<u64>,
}

/// What a node did for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAnswer {
    /// One sentence for the job's message.
    pub message: String,
    /// Bytes discarded on the node, when it trimmed.
    pub discarded: Option<u64>,
}

/// Asks the node a volume is attached to to reclaim its space there (given to the backend in
/// [`super::ReclaimRequest::on_node`]).
#[async_trait]
pub trait NodeHandOff: Send + Sync {
    /// Has the node plugin of `node` reclaim the space of `volume_handle`, staged there, and
    /// waits for its answer (bounded by the job's `spec.timeout`, outside).
    ///
    /// # Errors
    /// [`ReclaimSpaceError::Failed`] when the node failed (its message) or the job could not be
    /// written.
    async fn reclaim_on_node(
        &self,
        node: &str,
        volume_handle: &str,
    ) -> Result<NodeAnswer, ReclaimSpaceError>;
}

/// The node side: reclaims the space of a volume staged on this node.
#[async_trait]
pub trait NodeSpaceReclaimer: Send + Sync {
    /// Reclaims the space of `volume_handle` on this node.
    ///
    /// # Errors
    /// Why it could not (a sentence for the job's message).
    async fn reclaim(&self, volume_handle: &str) -> Result<NodeAnswer, String>;
}

/// [`NodeHandOff`] through the annotations of one ReclaimSpaceJob.
pub struct JobHandOff {
    api: Api<ReclaimSpaceJob>,
    job: String,
    driver: String,
    /// The node asked and not yet answered (for the message of a timeout).
    waiting_on: Mutex<Option<String>>,
}

impl JobHandOff {
    /// Hands off through the job `name` of `api`, with `driver`'s annotations.
    #[must_use]
    pub fn new(api: Api<ReclaimSpaceJob>, name: &str, driver: &str) -> Self {
        Self {
            api,
            job: name.to_owned(),
            driver: driver.to_owned(),
            waiting_on: Mutex::new(None),
        }
    }

    /// The node asked and not answered yet, if any.
    #[must_use]
    pub fn waiting_on(&self) -> Option<String> {
        self.waiting_on.lock().ok().and_then(|w| w.clone())
    }

    fn set_waiting(&self, node: Option<&str>) {
        if let Ok(mut w) = self.waiting_on.lock() {
            *w = node.map(str::to_owned);
        }
    }
}

fn new_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}-{:09}", now.as_secs(), now.subsec_nanos())
}

/// The answer to request `id` in `job`'s annotations, if there is one.
fn answer_of(job: &ReclaimSpaceJob, driver: &str, id: &str) -> Option<NodeResult> {
    let value = job.annotations().get(&result_annotation(driver))?;
    serde_json::from_str::<NodeResult>(value)
        .ok()
        .filter(|r| r.id == id)
}

#[async_trait]
impl NodeHandOff for JobHandOff {
    async fn reclaim_on_node(
        &self,
        node: &str,
        volume_handle: &str,
    ) -> Result<NodeAnswer, ReclaimSpaceError> {
        let request = NodeRequest {
            id: new_id(),
            node: node.to_owned(),
            volume_handle: volume_handle.to_owned(),
        };
        let value = serde_json::to_string(&request).map_err(ReclaimSpaceError::failed)?;
        let patch = json!({"metadata": {"annotations": {request_annotation(&self.driver): value}}});
        self.api
            .patch(&self.job, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                ReclaimSpaceError::failed(format!(
                    "asking node {node} to reclaim (annotating ReclaimSpaceJob {}): {e}",
                    self.job
                ))
            })?;
        self.set_waiting(Some(node));
        tracing::info!(reclaimspacejob = %self.job, node, volume_handle, id = %request.id, "asked the node plugin to reclaim");
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.job));
        let mut events = std::pin::pin!(watcher(self.api.clone(), config));
        let mut delay = Duration::from_millis(200);
        let answer = loop {
            match events.next().await {
                Some(Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job))) => {
                    if let Some(answer) = answer_of(&job, &self.driver, &request.id) {
                        break answer;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    // the watcher resumes by itself; pace its retries
                    tracing::debug!(error = %e, "watching ReclaimSpaceJob for the node's answer");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                None => {
                    return Err(ReclaimSpaceError::failed(format!(
                        "the watch of ReclaimSpaceJob {} ended before node {node} answered",
                        self.job
                    )));
                }
            }
        };
        self.set_waiting(None);
        if answer.succeeded {
            Ok(NodeAnswer {
                message: answer.message,
                discarded: answer.discarded,
            })
        } else {
            Err(ReclaimSpaceError::failed(format!(
                "node {node}: {}",
                answer.message
            )))
        }
    }
}

/// The node agent as a future: watches ReclaimSpaceJobs (every namespace) for requests to
/// `node` under `driver`'s annotations and answers each once with `reclaimer`. Runs until
/// dropped; where the CRD is not installed, looks for it again at most once a minute.
pub async fn agent(
    client: Client,
    driver: String,
    node: String,
    reclaimer: Arc<dyn NodeSpaceReclaimer>,
) {
    let api: Api<ReclaimSpaceJob> = Api::all(client.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String, NodeRequest)>();
    let worker = {
        let (client, driver, node) = (client.clone(), driver.clone(), node.clone());
        async move {
            let mut answered: HashSet<String> = HashSet::new();
            let mut running = tokio::task::JoinSet::new();
            while let Some((namespace, name, request)) = rx.recv().await {
                if !answered.insert(request.id.clone()) {
                    continue;
                }
                let (client, driver, node, reclaimer) = (
                    client.clone(),
                    driver.clone(),
                    node.clone(),
                    Arc::clone(&reclaimer),
                );
                running.spawn(async move {
                    answer(
                        &client,
                        &driver,
                        &node,
                        &*reclaimer,
                        &namespace,
                        &name,
                        request,
                    )
                    .await;
                });
                while running.try_join_next().is_some() {}
            }
        }
    };
    let request_key = request_annotation(&driver);
    let result_key = result_annotation(&driver);
    tracing::info!(%node, %driver, "answering ReclaimSpaceJobs' requests for this node");
    let mine = node;
    let watch =
        crate::custom_watch::watch(api, "ReclaimSpaceJob", move |job: ReclaimSpaceJob, _| {
            if job.status.as_ref().is_some_and(|s| s.result.is_some()) {
                return;
            }
            let Some(request) = job
                .annotations()
                .get(&request_key)
                .and_then(|v| serde_json::from_str::<NodeRequest>(v).ok())
            else {
                return;
            };
            if request.node != mine {
                return;
            }
            let answered = job
                .annotations()
                .get(&result_key)
                .and_then(|v| serde_json::from_str::<NodeResult>(v).ok())
                .is_some_and(|r| r.id == request.id);
            if !answered {
                let _ = tx.send((job.namespace().unwrap_or_default(), job.name_any(), request));
            }
        });
    tokio::join!(watch, worker);
}

async fn answer(
    client: &Client,
    driver: &str,
    node: &str,
    reclaimer: &dyn NodeSpaceReclaimer,
    namespace: &str,
    name: &str,
    request: NodeRequest,
) {
    let job = format!("{namespace}/{name}");
    tracing::info!(reclaimspacejob = %job, volume_handle = %request.volume_handle, id = %request.id, "reclaiming space on this node");
    let result = match reclaimer.reclaim(&request.volume_handle).await {
        Ok(done) => NodeResult {
            id: request.id,
            node: node.to_owned(),
            succeeded: true,
            message: done.message,
            discarded: done.discarded,
        },
        Err(message) => {
            tracing::warn!(reclaimspacejob = %job, %message, "reclaiming space on this node failed");
            NodeResult {
                id: request.id,
                node: node.to_owned(),
                succeeded: false,
                message,
                discarded: None,
            }
        }
    };
    let api: Api<ReclaimSpaceJob> = Api::namespaced(client.clone(), namespace);
    let value = match serde_json::to_string(&result) {
        Ok(value) => value,
        Err(e) => {
            tracing::error!(error = %e, "encoding a node's reclaim result");
            return;
        }
    };
    let patch = json!({"metadata": {"annotations": {result_annotation(driver): value}}});
    // a few tries: the controller waits for this answer until the job's timeout
    let mut delay = Duration::from_millis(500);
    for _ in 0..5 {
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(e) => {
                tracing::warn!(reclaimspacejob = %job, error = %e, "writing the node's reclaim result; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_counts_only_for_its_request() {
        let mut job = ReclaimSpaceJob::default();
        let result = NodeResult {
            id: "1-000000001".into(),
            node: "n1".into(),
            succeeded: true,
            message: "trimmed".into(),
            discarded: Some(4096),
        };
        job.metadata.annotations = Some(
            [(
                result_annotation("rbd.csi.ceph.com"),
                serde_json::to_string(&result).unwrap_or_default(),
            )]
            .into(),
        );
        assert_eq!(
            answer_of(&job, "rbd.csi.ceph.com", "1-000000001"),
            Some(result)
        );
        assert_eq!(answer_of(&job, "rbd.csi.ceph.com", "2-000000001"), None);
        assert_eq!(answer_of(&job, "other.csi.example", "1-000000001"), None);
    }

    #[test]
    fn requests_and_results_are_camel_case_json() {
        let request = NodeRequest {
            id: "7".into(),
            node: "n1".into(),
            volume_handle: "0001-0009-c-0000000000000001-abc".into(),
        };
        let v = serde_json::to_value(&request).unwrap_or_default();
        assert_eq!(v["volumeHandle"], "0001-0009-c-0000000000000001-abc");
        assert_eq!(
            request_annotation("rbd.csi.ceph.com"),
            "rbd.csi.ceph.com/node-reclaim-request"
        );
    }
}
