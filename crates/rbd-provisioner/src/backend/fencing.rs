//! The RBD backend's fencing of out-of-service nodes: [`provisioner::fencing::NodeFencer`] on
//! the volume core's [`rbd_volume::fence`].
//!
//! A fence groups the driver's PVs by the Ceph connection their admin secret gives (monitors,
//! user, Secret), and in each cluster blocklists the node's client instances that the images'
//! records and exclusive locks name, breaks those locks and removes the node from the
//! publication records ([`rbd_volume::fence::fence`]). The record kept on the Node lists, per
//! cluster, the monitors, the Ceph user, the admin Secret's namespace and name (never its key)
//! and the addresses blocklisted, which is all the unfence needs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use provisioner::fencing::{FenceError, FenceOutcome, NodeFencer};
use provisioner::network_fence::{NetworkFenceError, NetworkFenceRequest, NetworkFencer};
use rbd_volume::ClusterRef;
use rbd_volume::fence;
use rbd_volume::publish;
use rbd_volume::staged::{META_STAGED_BY, StagedBy};
use serde::{Deserialize, Serialize};

use crate::backend::{RbdBackend, monitors, secrets};

/// The fence record kept on the Node (JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub clusters: Vec<ClusterRecord>,
}

/// What was blocklisted in one cluster, and how to reach it again.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRecord {
    pub monitors: String,
    pub user: String,
    pub secret_namespace: String,
    pub secret_name: String,
    pub addresses: Vec<String>,
}

/// [`NodeFencer`] for the RBD backend.
pub struct RbdFencer {
    backend: Arc<RbdBackend>,
    expiry: Duration,
}

impl RbdFencer {
    /// Fencing through `backend`'s connections; blocklist entries last `expiry`.
    #[must_use]
    pub fn new(backend: Arc<RbdBackend>, expiry: Duration) -> Arc<RbdFencer> {
        Arc::new(RbdFencer { backend, expiry })
    }
}

type GroupKey = (String, String, String, String);

/// How many images' records a fence reads at once.
const PLAN_CONCURRENCY: usize = 16;

struct Group {
    cluster: Arc<ceph_rbd::Cluster>,
    /// (pool spec, image) -> PV name
    images: BTreeMap<(String, String), String>,
}

#[async_trait]
impl NodeFencer for RbdFencer {
    fn driver_name(&self) -> String {
        self.backend.csi_driver().to_owned()
    }

    async fn fence(
        &self,
        node: &str,
        volumes: &[PersistentVolume],
    ) -> Result<FenceOutcome, FenceError> {
        let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
        let mut unreadable = Vec::new();
        for pv in volumes {
            let (location, monitors, user, key) = match self.backend.access_for(pv).await {
                Ok(access) => access,
                Err(e) => {
                    unreadable.push(format!("{}: {e}", pv.name_any()));
                    continue;
                }
            };
            let (secret, _) = self
                .backend
                .admin_secret_for(pv)
                .await
                .map_err(FenceError::new)?;
            let group_key = (
                monitors.clone(),
                user.clone(),
                secret.namespace,
                secret.name,
            );
            if !groups.contains_key(&group_key) {
                let cluster = self
                    .backend
                    .cluster(&monitors, &user, key)
                    .await
                    .map_err(FenceError::new)?;
                groups.insert(
                    group_key.clone(),
                    Group {
                        cluster,
                        images: BTreeMap::new(),
                    },
                );
            }
            if let Some(group) = groups.get_mut(&group_key) {
                group.images.insert(
                    (location.pool_spec(), location.image.clone()),
                    pv.name_any(),
                );
            }
        }
        let own: Arc<HashSet<u64>> = Arc::new(
            self.backend
                .connections()
                .instance_ids()
                .await
                .into_iter()
                .collect(),
        );
        let mut record = Record::default();
        let mut volumes_done = Vec::new();
        let (mut addresses, mut locks, mut unpublished) = (BTreeSet::new(), 0, 0);
        for ((monitors, user, secret_namespace, secret_name), group) in &groups {
            // every image's records read, PLAN_CONCURRENCY at a time (an image open each)
            let keys: Vec<(String, String)> = group.images.keys().cloned().collect();
            let plans: Vec<Option<fence::ImagePlan>> =
                futures::stream::iter(keys.into_iter().map(|(pool, image)| {
                    let (cluster, own, node) = (
                        Arc::clone(&group.cluster),
                        Arc::clone(&own),
                        node.to_owned(),
                    );
                    async move { fence::plan(&cluster, &pool, &image, &node, &own).await }
                }))
                .buffer_unordered(PLAN_CONCURRENCY)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(FenceError::new)?;
            let fenced = fence::execute(
                &group.cluster,
                node,
                plans.into_iter().flatten().collect(),
                self.expiry,
            )
            .await
            .map_err(FenceError::new)?;
            for (image, message) in fence::describe(&fenced) {
                let pv = fenced
                    .images
                    .iter()
                    .find(|i| format!("{}/{}", i.pool, i.image) == image)
                    .and_then(|i| group.images.get(&(i.pool.clone(), i.image.clone())));
                if let Some(pv) = pv {
                    volumes_done.push((pv.clone(), format!("image {image}: {message}")));
                }
            }
            locks += fenced
                .images
                .iter()
                .map(|i| i.locks_broken.len())
                .sum::<usize>();
            unpublished += fenced.images.iter().filter(|i| i.unpublished).count();
            addresses.extend(fenced.addresses.iter().cloned());
            if !fenced.addresses.is_empty() {
                record.clusters.push(ClusterRecord {
                    monitors: monitors.clone(),
                    user: user.clone(),
                    secret_namespace: secret_namespace.clone(),
                    secret_name: secret_name.clone(),
                    addresses: fenced.addresses.clone(),
                });
            }
        }
        let mut summary = if addresses.is_empty() {
            format!(
                "no Ceph client of the node found on the {} volume(s) of driver {}: nothing \
                 blocklisted",
                volumes.len(),
                self.backend.csi_driver()
            )
        } else {
            format!(
                "blocklisted {} Ceph client instance(s) ({}), broke {locks} exclusive lock(s), \
                 removed the node from {unpublished} publication record(s); blocklist entries \
                 expire in {}s unless the taint is removed first",
                addresses.len(),
                addresses.iter().cloned().collect::<Vec<_>>().join(", "),
                self.expiry.as_secs()
            )
        };
        if !unreadable.is_empty() {
            summary.push_str(&format!(
                "; volumes not checked (their admin secret or cluster could not be read): {}",
                unreadable.join("; ")
            ));
        }
        let text = serde_json::to_string(&record).map_err(FenceError::new)?;
        Ok(FenceOutcome {
            record: text,
            summary,
            volumes: volumes_done,
        })
    }

    async fn unfence(&self, _node: &str, record: &str) -> Result<String, FenceError> {
        let record: Record = serde_json::from_str(record).map_err(|e| {
            FenceError::new(format!(
                "the Node's fence record is not one this provisioner wrote: {e}"
            ))
        })?;
        let mut removed = Vec::new();
        for cluster in &record.clusters {
            let key = secrets::read_key(
                self.backend.client(),
                &cluster.secret_namespace,
                &cluster.secret_name,
            )
            .await
            .map_err(FenceError::new)?;
            let monitors_resolved = monitors::resolve(&cluster.monitors)
                .await
                .map_err(FenceError::new)?;
            let connection = self
                .backend
                .cluster(&monitors_resolved, &cluster.user, key)
                .await
                .map_err(FenceError::new)?;
            fence::unfence(&connection, &cluster.addresses)
                .await
                .map_err(FenceError::new)?;
            removed.extend(cluster.addresses.iter().cloned());
        }
        Ok(if removed.is_empty() {
            "nothing was blocklisted".to_owned()
        } else {
            format!(
                "removed the blocklist entries of {} Ceph client instance(s) ({})",
                removed.len(),
                removed.join(", ")
            )
        })
    }

    async fn nodes_of(&self, volume: &PersistentVolume) -> Result<Vec<String>, FenceError> {
        let (location, cluster) = self
            .backend
            .connect_to_pv(volume)
            .await
            .map_err(FenceError::new)?;
        let metadata = match cluster
            .metadata_list(&location.pool_spec(), &location.image)
            .await
        {
            Ok(m) => m,
            Err(e) if e.is_not_found() => return Ok(Vec::new()),
            Err(e) => return Err(FenceError::new(e)),
        };
        let mut nodes: BTreeSet<String> = publish::parse_record(
            &location.image,
            metadata.get(publish::META_PUBLISHED).map(String::as_str),
        )
        .map_err(FenceError::new)?
        .into_iter()
        .map(|p| p.node)
        .collect();
        if let Some(by) = metadata
            .get(META_STAGED_BY)
            .and_then(|v| StagedBy::parse(v))
        {
            nodes.insert(by.node);
        }
        Ok(nodes.into_iter().collect())
    }
}

/// The `spec.parameters` keys a NetworkFence of our driver may carry.
const NETWORK_FENCE_PARAMETERS: [&str; 3] = ["clusterID", "monitors", "adminId"];

impl RbdFencer {
    /// The connection a NetworkFence asks for: its cluster (`clusterID` of the cluster config,
    /// or `monitors`), the Ceph user (`adminId`, default `admin`) and the key in `spec.secret`.
    async fn network_fence_cluster(
        &self,
        request: &NetworkFenceRequest<'_>,
    ) -> Result<Arc<ceph_rbd::Cluster>, NetworkFenceError> {
        if let Some(key) = request
            .parameters
            .keys()
            .find(|k| !NETWORK_FENCE_PARAMETERS.contains(&k.as_str()))
        {
            return Err(NetworkFenceError::invalid(
                format!("spec.parameters.{key}"),
                format!(
                    "unknown parameter (known: {})",
                    NETWORK_FENCE_PARAMETERS.join(", ")
                ),
            ));
        }
        let cluster = match (
            request.parameters.get("clusterID"),
            request.parameters.get("monitors"),
        ) {
            (Some(id), None) => ClusterRef::Named(id.clone()),
            (None, Some(monitors)) => ClusterRef::Monitors(monitors.clone()),
            _ => {
                return Err(NetworkFenceError::invalid(
                    "spec.parameters",
                    "exactly one of clusterID (an entry of the cluster config) and monitors is \
                     required",
                ));
            }
        };
        let monitors = self
            .backend
            .monitors_of(&cluster)
            .map_err(|e| NetworkFenceError::invalid("spec.parameters", e))?;
        let monitors = monitors::resolve(&monitors)
            .await
            .map_err(|e| NetworkFenceError::invalid("spec.parameters.monitors", e.to_string()))?;
        let secret = request
            .secret
            .filter(|s| !s.name.is_empty() && !s.namespace.is_empty())
            .ok_or_else(|| {
                NetworkFenceError::invalid(
                    "spec.secret",
                    "name and namespace of the Secret holding the Ceph key are required",
                )
            })?;
        let key = secrets::read_key(self.backend.client(), &secret.namespace, &secret.name)
            .await
            .map_err(NetworkFenceError::failed)?;
        let user = request
            .parameters
            .get("adminId")
            .filter(|u| !u.is_empty())
            .map_or("admin", String::as_str);
        self.backend
            .cluster(&monitors, user, key)
            .await
            .map_err(NetworkFenceError::failed)
    }

    /// The CIDRs, each checked, naming `spec.cidrs[i]`.
    fn checked_cidrs(request: &NetworkFenceRequest<'_>) -> Result<(), NetworkFenceError> {
        for (i, cidr) in request.cidrs.iter().enumerate() {
            fence::Cidr::parse(cidr).map_err(|e| cidr_error(i, e))?;
        }
        Ok(())
    }
}

fn cidr_error(i: usize, e: fence::FenceError) -> NetworkFenceError {
    match e {
        fence::FenceError::BadCidr { cidr, problem } => {
            NetworkFenceError::invalid(format!("spec.cidrs[{i}]"), format!("{cidr:?}: {problem}"))
        }
        other => NetworkFenceError::failed(other),
    }
}

#[async_trait]
impl NetworkFencer for RbdFencer {
    fn driver_name(&self) -> String {
        self.backend.csi_driver().to_owned()
    }

    async fn fence(&self, request: &NetworkFenceRequest<'_>) -> Result<String, NetworkFenceError> {
        Self::checked_cidrs(request)?;
        let cluster = self.network_fence_cluster(request).await?;
        let mut done = Vec::new();
        for (i, cidr) in request.cidrs.iter().enumerate() {
            let entry = fence::blocklist_cidr(&cluster, cidr, self.expiry)
                .await
                .map_err(|e| cidr_error(i, e))?;
            done.push(match entry {
                fence::CidrEntry::Range(range) => format!("{range} (range entry)"),
                fence::CidrEntry::Addresses(list) => {
                    format!("{cidr} ({} address entries)", list.len())
                }
            });
        }
        Ok(format!(
            "blocklisted {} for {}s",
            done.join(", "),
            self.expiry.as_secs()
        ))
    }

    async fn unfence(
        &self,
        request: &NetworkFenceRequest<'_>,
    ) -> Result<String, NetworkFenceError> {
        Self::checked_cidrs(request)?;
        let cluster = self.network_fence_cluster(request).await?;
        for (i, cidr) in request.cidrs.iter().enumerate() {
            fence::unblocklist_cidr_text(&cluster, cidr)
                .await
                .map_err(|e| cidr_error(i, e))?;
        }
        Ok(format!(
            "removed the blocklisting of {}",
            request.cidrs.join(", ")
        ))
    }
}
