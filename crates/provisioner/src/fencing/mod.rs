//! Fencing lost nodes: Kubernetes' non-graceful node shutdown, storage side.
//!
//! An operator who knows a node is down (or cut off) taints it
//! `node.kubernetes.io/out-of-service` ([`TAINT_OUT_OF_SERVICE`], effect `NoExecute` or
//! `NoSchedule`, any value such as `nodeshutdown`); Kubernetes then force-deletes its pods and
//! force-detaches their VolumeAttachments at once. Kubernetes does not stop the node itself from
//! writing: if it is cut off rather than down, it still writes to volumes that are being attached
//! elsewhere. A backend implementing [`NodeFencer`] cuts the node's storage clients off; this
//! module decides when, records what was done, and takes it back.
//!
//! # When
//!
//! - A Node with the taint and no fence record: [`Fencing::fence_if_out_of_service`] asks
//!   [`NodeFencer::fence`] with every PersistentVolume of the backend's CSI driver (the backend
//!   finds which of them the node used), stores the returned record in the Node's annotation
//!   [`fence_annotation`]`(driver)`, and records events: `NodeFenced` on the Node, `VolumeFenced`
//!   on each PV concerned. It runs from the Node watch ([`task`]) and, before anything else,
//!   from the VolumeAttachment controller ([`crate::attach`]) when it is about to detach a
//!   volume from a node that is out of service (Kubernetes' force-detach) or to attach a volume
//!   whose records name such a node ([`NodeFencer::nodes_of`]): so no volume of a lost node
//!   moves before the node is fenced. A failure is an event (`NodeFenceFailed`, Warning) and
//!   is retried; the detach or attach waits for it.
//! - A Node with a fence record and without the taint: [`NodeFencer::unfence`] with the record,
//!   then the annotation removed and `NodeUnfenced` recorded on the Node.
//! - Without the taint nothing is fenced: a node that is slow or not ready is not a dead one.
//!
//! # The record
//!
//! The annotation holds whatever the backend returned (it must name no secret): it lives with
//! the Node, is written by whichever replica leads, survives restarts and leader changes, and
//! `kubectl describe node` shows it. Fencing is done once per taint: while the record is there,
//! the node counts as fenced.

mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{Api, ListParams, Patch, PatchParams};

use kube::{Client, ResourceExt};
use serde_json::json;

pub use watch::{FencingConfig, run, task};

use crate::events::{EventRecorder, EventType};
use crate::volume::BoxError;

/// The taint of Kubernetes' non-graceful node shutdown.
pub const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// The Node annotation holding the fence record of `driver`'s backend: `<driver>/fenced`.
#[must_use]
pub fn fence_annotation(driver: &str) -> String {
    format!("{driver}/fenced")
}

/// Whether `node` carries the out-of-service taint (effect `NoExecute` or `NoSchedule`, as
/// Kubernetes' attach/detach controller and pod GC read it).
#[must_use]
pub fn is_out_of_service(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints.iter().any(|t| {
                t.key == TAINT_OUT_OF_SERVICE
                    && (t.effect == "NoExecute" || t.effect == "NoSchedule")
            })
        })
}

/// What a fence did, as [`NodeFencer::fence`] reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FenceOutcome {
    /// What to keep on the Node so that [`NodeFencer::unfence`] can take it back (no secrets).
    pub record: String,
    /// One line for the Node's event: what was fenced.
    pub summary: String,
    /// Per PersistentVolume concerned (by name): what was done for it.
    pub volumes: Vec<(String, String)>,
}

/// Why a fence or an unfence failed; its `Display` goes into the event.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct FenceError(BoxError);

impl FenceError {
    /// A [`FenceError`] from any error or message.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Self(error.into())
    }
}

/// A storage backend that can cut a node's storage clients off, and let them back.
#[async_trait]
pub trait NodeFencer: Send + Sync {
    /// The CSI driver whose PersistentVolumes are the backend's.
    fn driver_name(&self) -> String;

    /// Cuts `node` off from `volumes` (every PV of the driver; the backend finds those the node
    /// used) and returns the record to keep. Idempotent: called again after a failure, or with
    /// the node already cut off, it completes the job.
    async fn fence(
        &self,
        node: &str,
        volumes: &[PersistentVolume],
    ) -> Result<FenceOutcome, FenceError>;

    /// Takes back what the fence recorded in `record` did; returns a line for the event.
    async fn unfence(&self, node: &str, record: &str) -> Result<String, FenceError>;

    /// The nodes `volume`'s own records say have it or write it (e.g. its publication record),
    /// which must be fenced first if they are out of service before the volume is attached
    /// elsewhere. The default: none.
    async fn nodes_of(&self, _volume: &PersistentVolume) -> Result<Vec<String>, FenceError> {
        Ok(Vec::new())
    }
}

/// Fencing and unfencing of Nodes for one [`NodeFencer`], one Node at a time.
pub struct Fencing {
    client: Client,
    fencer: Arc<dyn NodeFencer>,
    driver: String,
    annotation: String,
    recorder: EventRecorder,
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

/// What [`Fencing::fence_if_out_of_service`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// The node is not out of service (or gone): nothing fenced.
    InService,
    /// The node is out of service and fenced (now or before).
    Fenced,
}

impl Fencing {
    /// Fencing through `fencer`; events are recorded as `component`.
    #[must_use]
    pub fn new(client: Client, fencer: Arc<dyn NodeFencer>, component: &str) -> Arc<Fencing> {
        let driver = fencer.driver_name();
        Arc::new(Fencing {
            recorder: EventRecorder::new(client.clone(), component, component),
            client,
            annotation: fence_annotation(&driver),
            driver,
            fencer,
            locks: std::sync::Mutex::default(),
        })
    }

    /// The CSI driver served.
    #[must_use]
    pub fn driver(&self) -> &str {
        &self.driver
    }

    fn lock_of(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(locks.entry(node.to_owned()).or_default())
    }

    /// Fences `node` if it is out of service and not fenced yet (see the module docs).
    ///
    /// # Errors
    /// Reading the Node or the PVs, the backend's fence, or writing the record failed (a
    /// `NodeFenceFailed` event says why); the caller retries.
    pub async fn fence_if_out_of_service(&self, node: &str) -> Result<NodeState, String> {
        let lock = self.lock_of(node);
        let _guard = lock.lock().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Some(current) = nodes
            .get_opt(node)
            .await
            .map_err(|e| format!("reading Node {node}: {e}"))?
        else {
            return Ok(NodeState::InService);
        };
        if !is_out_of_service(&current) {
            return Ok(NodeState::InService);
        }
        if current.annotations().contains_key(&self.annotation) {
            return Ok(NodeState::Fenced);
        }
        let result = self.fence(node).await;
        match result {
            Ok(outcome) => {
                let patch =
                    json!({"metadata": {"annotations": {&self.annotation: outcome.record}}});
                nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| format!("recording the fence on Node {node}: {e}"))?;
                tracing::warn!(node, summary = %outcome.summary, "node out of service: fenced");
                self.recorder.publish(
                    &current,
                    EventType::Warning,
                    "NodeFenced",
                    &format!(
                        "node is out of service ({TAINT_OUT_OF_SERVICE}): {}",
                        outcome.summary
                    ),
                );
                let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
                for (pv, message) in &outcome.volumes {
                    if let Ok(Some(pv)) = pvs.get_opt(pv).await {
                        self.recorder.publish(
                            &pv,
                            EventType::Warning,
                            "VolumeFenced",
                            &format!("node {node} is out of service: {message}"),
                        );
                    }
                }
                Ok(NodeState::Fenced)
            }
            Err(message) => {
                self.recorder.publish(
                    &current,
                    EventType::Warning,
                    "NodeFenceFailed",
                    &format!(
                        "node is out of service ({TAINT_OUT_OF_SERVICE}) but could not be \
                         fenced; retrying: {message}"
                    ),
                );
                Err(message)
            }
        }
    }

    async fn fence(&self, node: &str) -> Result<FenceOutcome, String> {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let mut volumes: Vec<PersistentVolume> = Vec::new();
        crate::paged::for_each(&pvs, &ListParams::default(), |pv| {
            let ours = pv
                .spec
                .as_ref()
                .and_then(|s| s.csi.as_ref())
                .is_some_and(|c| c.driver == self.driver);
            if ours {
                volumes.push(pv);
            }
        })
        .await
        .map_err(|e| format!("listing PersistentVolumes: {e}"))?;
        self.fencer
            .fence(node, &volumes)
            .await
            .map_err(|e| format!("fencing node {node}: {e}"))
    }

    /// Unfences `node` if it has a fence record and no longer the taint.
    ///
    /// # Errors
    /// Reading the Node, the backend's unfence or removing the record failed (an
    /// `NodeUnfenceFailed` event says why); the caller retries.
    pub async fn unfence_if_back(&self, node: &str) -> Result<(), String> {
        let lock = self.lock_of(node);
        let _guard = lock.lock().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Some(current) = nodes
            .get_opt(node)
            .await
            .map_err(|e| format!("reading Node {node}: {e}"))?
        else {
            return Ok(());
        };
        if is_out_of_service(&current) {
            return Ok(());
        }
        let Some(record) = current.annotations().get(&self.annotation).cloned() else {
            return Ok(());
        };
        match self.fencer.unfence(node, &record).await {
            Ok(summary) => {
                let patch = json!({"metadata": {"annotations": {&self.annotation: null}}});
                nodes
                    .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| format!("removing the fence record of Node {node}: {e}"))?;
                tracing::info!(node, %summary, "node back in service: unfenced");
                self.recorder.publish(
                    &current,
                    EventType::Normal,
                    "NodeUnfenced",
                    &format!("the {TAINT_OUT_OF_SERVICE} taint is gone: {summary}"),
                );
                Ok(())
            }
            Err(e) => {
                let message = format!("unfencing node {node}: {e}");
                self.recorder.publish(
                    &current,
                    EventType::Warning,
                    "NodeUnfenceFailed",
                    &format!("{message}; retrying"),
                );
                Err(message)
            }
        }
    }

    /// Before `volume` is attached to `target`: fences every other node its records name that
    /// is out of service (see [`NodeFencer::nodes_of`]).
    ///
    /// # Errors
    /// Reading the records or a fence failed; the attach waits.
    pub async fn before_attach(
        &self,
        volume: &PersistentVolume,
        target: &str,
    ) -> Result<(), String> {
        let nodes = self
            .fencer
            .nodes_of(volume)
            .await
            .map_err(|e| format!("reading the nodes of the volume: {e}"))?;
        for node in nodes.iter().filter(|n| *n != target) {
            self.fence_if_out_of_service(node).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: &serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"taints": taints}}))
            .unwrap()
    }

    #[test]
    fn only_the_out_of_service_taint_with_its_effects_counts() {
        let taint = |key: &str, effect: &str| json!([{"key": key, "value": "nodeshutdown", "effect": effect}]);
        assert!(is_out_of_service(&node(&taint(
            TAINT_OUT_OF_SERVICE,
            "NoExecute"
        ))));
        assert!(is_out_of_service(&node(&taint(
            TAINT_OUT_OF_SERVICE,
            "NoSchedule"
        ))));
        assert!(!is_out_of_service(&node(&taint(
            TAINT_OUT_OF_SERVICE,
            "PreferNoSchedule"
        ))));
        assert!(!is_out_of_service(&node(&taint(
            "node.kubernetes.io/unreachable",
            "NoExecute"
        ))));
        assert!(!is_out_of_service(&node(&json!([]))));
        assert_eq!(
            fence_annotation("rbd.provisioner.ceph.io"),
            "rbd.provisioner.ceph.io/fenced"
        );
    }
}
