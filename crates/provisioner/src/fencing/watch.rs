//! The Node watch: fences Nodes that get the out-of-service taint and unfences them when it
//! goes (see the [module docs](super)).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::{Fencing, is_out_of_service};
use crate::queue::{Backoff, WorkQueue};

/// Settings of the Node watch.
#[derive(Clone, Debug)]
pub struct FencingConfig {
    /// Per-Node retry backoff. Default: 1 s doubling to 5 min.
    pub backoff: Backoff,
    /// How often every Node is looked at again. Default: 5 min.
    pub resync: Duration,
}

impl Default for FencingConfig {
    fn default() -> Self {
        FencingConfig {
            backoff: Backoff::default(),
            resync: Duration::from_mins(5),
        }
    }
}

/// The Node watch as a task for [`crate::Controller::with_companion`].
pub fn task(client: Client, fencing: Arc<Fencing>, config: FencingConfig) -> crate::Companion {
    Box::pin(async move { run(client, fencing, config).await })
}

/// Whether `node` needs a look: out of service, or carrying a fence record.
fn interesting(fencing: &Fencing, node: &Node) -> bool {
    is_out_of_service(node) || node.annotations().contains_key(&fencing.annotation)
}

/// Runs until dropped (or the Node watch ends).
pub async fn run(client: Client, fencing: Arc<Fencing>, config: FencingConfig) {
    let queue: Arc<WorkQueue<String>> = Arc::new(WorkQueue::new(config.backoff));
    tracing::info!(driver = %fencing.driver, "watching Nodes for the out-of-service taint");
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (queue, fencing) = (Arc::clone(&queue), Arc::clone(&fencing));
        tasks.spawn(async move {
            while let Some(node) = queue.get().await {
                let result = match fencing.fence_if_out_of_service(&node).await {
                    Ok(super::NodeState::Fenced) => Ok(()),
                    Ok(super::NodeState::InService) => fencing.unfence_if_back(&node).await,
                    Err(e) => Err(e),
                };
                match result {
                    Ok(()) => queue.forget(&node),
                    Err(error) => {
                        tracing::warn!(%node, %error, "fencing failed; retrying");
                        queue.add_rate_limited(node.clone());
                    }
                }
                queue.done(&node);
            }
        });
    }
    {
        let (queue, fencing, client) = (Arc::clone(&queue), Arc::clone(&fencing), client.clone());
        tasks.spawn(async move {
            loop {
                tokio::time::sleep(config.resync).await;
                let nodes: Api<Node> = Api::all(client.clone());
                if let Ok(list) = nodes.list(&ListParams::default()).await {
                    for node in list.items.iter().filter(|n| interesting(&fencing, n)) {
                        queue.add(node.name_any());
                    }
                }
            }
        });
    }
    let api: Api<Node> = Api::all(client);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    loop {
        match stream.next().await {
            Some(Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node))) => {
                if interesting(&fencing, &node) {
                    queue.add(node.name_any());
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "Node watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            None => break,
        }
    }
    queue.shut_down();
}
