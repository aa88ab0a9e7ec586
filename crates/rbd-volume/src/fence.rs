//! Fencing: keeping a node that Kubernetes declared lost from writing to its volumes any more,
//! by blocklisting its Ceph client instances on the OSDs (`ceph osd blocklist`), and taking the
//! blocklisting back (unfence).
//!
//! **Whose clients.** [`plan`] reads, for each image the caller names, what the image says
//! about the node (no Kubernetes here):
//! - the [`StagedBy`] record, when it names the node: its client instance's address (the
//!   mapping's own client for krbd and rbd-nbd, the pool's rbd-fuse instance for the fuse
//!   mapper);
//! - the holders of the image's exclusive lock, when the image is published to the node or its
//!   staged-by record names it (a volume staged by an older version has no staged-by record:
//!   its lock holder is all there is to go by, and only while the publication names the node).
//!
//! Clients of this process (the caller passes their global IDs) are never blocklisted.
//! Blocklisting is per client instance (`ip:port/nonce`), never per IP: other nodes behind the
//! same address (NAT, one host) keep working.
//!
//! **In which order.** [`fence`] blocklists every address first, then breaks the blocklisted
//! holders' exclusive locks (`rbd_break_lock`; librbd blocklists the holder again on the way,
//! for its own default hour, so those addresses are added again afterwards with the caller's
//! expiry), and only then removes the node from the images' publication records. A volume is
//! thus never free for another node while the lost node's clients can still write.
//!
//! **Expiry.** Entries are added with an expiry ([`DEFAULT_EXPIRY`]: five years, as ceph-csi's
//! NetworkFence does), so that a record lost with its Node object does not blocklist forever;
//! [`unfence`] removes them.
//!
//! **Ranges.** [`blocklist_cidr`] blocklists a CIDR with `osd blocklist range add` (Ceph 17.2.1
//! and later, and later Pacific point releases such as 16.2.15); on a cluster that does not know
//! the command, a CIDR of at most [`MAX_EXPANDED_ADDRESSES`] addresses becomes one entry per IP
//! (`ip:0/0`, every instance on that IP); a larger one is refused.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use ceph_rbd::{Cluster, Locker};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::publish::{self, META_PUBLISHED, PublishError};
use crate::staged::{META_STAGED_BY, StagedBy};

/// How long a fence's blocklist entries last unless removed: five years (157784760 s), what
/// ceph-csi's NetworkFence asks for.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(157_784_760);

/// The largest CIDR turned into per-address entries where the cluster has no range blocklist.
pub const MAX_EXPANDED_ADDRESSES: u32 = 256;

/// Why fencing or unfencing failed.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// Ceph failed or refused.
    #[error(transparent)]
    Ceph(#[from] ceph_rbd::Error),
    /// A publication record could not be changed.
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// A client address that is not `ip:port/nonce`.
    #[error("client address {address:?}: {problem}")]
    BadAddress { address: String, problem: String },
    /// A CIDR that is not `ADDRESS/PREFIX`, or that cannot be blocklisted on this cluster.
    #[error("cidr {cidr:?}: {problem}")]
    BadCidr { cidr: String, problem: String },
    /// `osd blocklist ls` answered something this code does not read.
    #[error("osd blocklist ls: unreadable output: {0}")]
    BadListing(String),
}

/// Why a client instance is fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The image's staged-by record names the node and this client.
    StagedBy,
    /// The client holds the exclusive lock of an image published to or staged by the node.
    LockHolder,
}

/// A client instance [`plan`] found, on one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suspect {
    /// `ip:port/nonce`.
    pub address: String,
    /// `client.<id>` when known.
    pub client: Option<String>,
    pub reason: Reason,
    /// The lock to break (lock holders only): (client, cookie).
    pub lock: Option<(String, String)>,
}

/// What one image says about the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImagePlan {
    /// The pool spec (`pool` or `pool/namespace`).
    pub pool: String,
    pub image: String,
    /// The image's publication record names the node.
    pub published_to_node: bool,
    /// The image's staged-by record names the node.
    pub staged_by_node: bool,
    /// The image has a staged-by record at all (volumes staged by older versions have none).
    pub has_staged_by: bool,
    pub suspects: Vec<Suspect>,
}

impl ImagePlan {
    /// Whether the image has anything to do with the node.
    #[must_use]
    pub fn concerns_node(&self) -> bool {
        self.published_to_node || self.staged_by_node || !self.suspects.is_empty()
    }
}

/// What [`fence`] did to one image.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedImage {
    pub pool: String,
    pub image: String,
    /// The addresses blocklisted for this image.
    pub addresses: Vec<String>,
    /// Exclusive lock holders broken out (`client.<id>`).
    pub locks_broken: Vec<String>,
    /// The node was removed from the image's publication record.
    pub unpublished: bool,
}

/// What [`fence`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    /// Every address blocklisted (sorted, no duplicates).
    pub addresses: Vec<String>,
    /// The images that concern the node.
    pub images: Vec<FencedImage>,
}

/// Checks an `ip:port/nonce` client address (what watchers and lockers list).
///
/// # Errors
/// [`FenceError::BadAddress`] naming the problem.
pub fn check_address(address: &str) -> Result<(), FenceError> {
    let bad = |problem: &str| FenceError::BadAddress {
        address: address.to_owned(),
        problem: problem.to_owned(),
    };
    let (host_port, nonce) = address
        .rsplit_once('/')
        .ok_or_else(|| bad("not ip:port/nonce (no /nonce)"))?;
    nonce
        .parse::<u64>()
        .map_err(|_| bad("the nonce is not a number"))?;
    let (host, port) = host_port
        .rsplit_once(':')
        .ok_or_else(|| bad("not ip:port/nonce (no :port)"))?;
    port.parse::<u16>()
        .map_err(|_| bad("the port is not a number"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.parse::<IpAddr>()
        .map_err(|_| bad("the host is not an IP address"))?;
    Ok(())
}

/// A parsed CIDR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub address: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Parses `ADDRESS/PREFIX` (IPv4 or IPv6).
    ///
    /// # Errors
    /// [`FenceError::BadCidr`] naming the problem.
    pub fn parse(cidr: &str) -> Result<Cidr, FenceError> {
        let bad = |problem: &str| FenceError::BadCidr {
            cidr: cidr.to_owned(),
            problem: problem.to_owned(),
        };
        let (address, prefix) = cidr
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("not ADDRESS/PREFIX (e.g. 10.0.0.5/32)"))?;
        let address: IpAddr = address
            .parse()
            .map_err(|_| bad("the address is not an IPv4 or IPv6 address"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| bad("the prefix length is not a number"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad(&format!(
                "the prefix length {prefix} is longer than {max} bits"
            )));
        }
        Ok(Cidr { address, prefix })
    }

    /// How many addresses the CIDR holds (saturating).
    #[must_use]
    pub fn size(&self) -> u128 {
        let bits = if self.address.is_ipv4() { 32 } else { 128 };
        let host_bits = u32::from(bits - self.prefix);
        1u128.checked_shl(host_bits).unwrap_or(u128::MAX)
    }

    /// Its addresses, when there are at most `limit`.
    #[must_use]
    pub fn addresses(&self, limit: u32) -> Option<Vec<IpAddr>> {
        if self.size() > u128::from(limit) {
            return None;
        }
        let n = u32::try_from(self.size()).ok()?;
        Some(match self.address {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                let base = u32::from(a) & mask;
                (0..n).map(|i| IpAddr::V4((base + i).into())).collect()
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                let base = u128::from(a) & mask;
                (0..n)
                    .map(|i| IpAddr::V6((base + u128::from(i)).into()))
                    .collect()
            }
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

fn blocklist_command(op: &str, addr: &str, range: bool, expiry: Option<Duration>) -> String {
    let mut command = json!({"prefix": "osd blocklist", "blocklistop": op, "addr": addr});
    if range {
        command["range"] = json!("range");
    }
    if let Some(expiry) = expiry {
        command["expire"] = json!(expiry.as_secs_f64());
    }
    command.to_string()
}

/// Blocklists the client instance `address` (`ip:port/nonce`) for `expiry`.
///
/// # Errors
/// A malformed address; Ceph's refusal.
pub async fn blocklist_add(
    cluster: &Cluster,
    address: &str,
    expiry: Duration,
) -> Result<(), FenceError> {
    check_address(address)?;
    cluster
        .mon_command(
            "osd blocklist add",
            &blocklist_command("add", address, false, Some(expiry)),
        )
        .await?;
    tracing::info!(address, "client instance blocklisted");
    Ok(())
}

/// Removes `address`'s blocklist entry (none is a success).
///
/// # Errors
/// Ceph's refusal.
pub async fn blocklist_rm(cluster: &Cluster, address: &str) -> Result<(), FenceError> {
    cluster
        .mon_command(
            "osd blocklist rm",
            &blocklist_command("rm", address, false, None),
        )
        .await?;
    tracing::info!(address, "blocklist entry removed");
    Ok(())
}

/// What [`blocklist_cidr`] added, so that [`unblocklist_cidr`] removes the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CidrEntry {
    /// One `osd blocklist range` entry.
    Range(String),
    /// One entry per IP (`ip:0/0`): the cluster has no range blocklist.
    Addresses(Vec<String>),
}

/// Blocklists every client in `cidr` for `expiry` (see the module docs for clusters without
/// range blocklists).
///
/// # Errors
/// A malformed CIDR, or one too large to expand on a cluster without range blocklists
/// ([`FenceError::BadCidr`]); Ceph's refusal.
pub async fn blocklist_cidr(
    cluster: &Cluster,
    cidr: &str,
    expiry: Duration,
) -> Result<CidrEntry, FenceError> {
    let parsed = Cidr::parse(cidr)?;
    let text = parsed.to_string();
    match cluster
        .mon_command(
            "osd blocklist range add",
            &blocklist_command("add", &text, true, Some(expiry)),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(cidr = %text, "range blocklisted");
            Ok(CidrEntry::Range(text))
        }
        Err(ceph_rbd::Error::InvalidArgument { reason, .. })
            if reason.contains("invalid command") || reason.contains("unrecognized") =>
        {
            let Some(ips) = parsed.addresses(MAX_EXPANDED_ADDRESSES) else {
                return Err(FenceError::BadCidr {
                    cidr: cidr.to_owned(),
                    problem: format!(
                        "this Ceph cluster has no range blocklist (osd blocklist range: Ceph \
                         17.2.1 and later) and the CIDR holds more than \
                         {MAX_EXPANDED_ADDRESSES} addresses to blocklist one by one"
                    ),
                });
            };
            let mut entries = Vec::new();
            for ip in ips {
                let entry = match ip {
                    IpAddr::V4(ip) => format!("{ip}:0/0"),
                    IpAddr::V6(ip) => format!("[{ip}]:0/0"),
                };
                cluster
                    .mon_command(
                        "osd blocklist add",
                        &blocklist_command("add", &entry, false, Some(expiry)),
                    )
                    .await?;
                entries.push(entry);
            }
            tracing::info!(cidr = %text, entries = entries.len(), "CIDR blocklisted address by address");
            Ok(CidrEntry::Addresses(entries))
        }
        Err(ceph_rbd::Error::InvalidArgument { reason, .. }) => Err(FenceError::BadCidr {
            cidr: cidr.to_owned(),
            problem: format!("refused by Ceph: {reason}"),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Removes what [`blocklist_cidr`] added.
///
/// # Errors
/// Ceph's refusal.
pub async fn unblocklist_cidr(cluster: &Cluster, entry: &CidrEntry) -> Result<(), FenceError> {
    match entry {
        CidrEntry::Range(cidr) => {
            cluster
                .mon_command(
                    "osd blocklist range rm",
                    &blocklist_command("rm", cidr, true, None),
                )
                .await?;
            tracing::info!(cidr, "range blocklist entry removed");
        }
        CidrEntry::Addresses(addresses) => {
            for address in addresses {
                blocklist_rm(cluster, address).await?;
            }
        }
    }
    Ok(())
}

/// Removes the blocklisting of `cidr` whichever way [`blocklist_cidr`] made it on this
/// cluster: the range entry, or on a cluster without range blocklists the per-IP entries.
/// Not blocklisted is a success.
///
/// # Errors
/// A malformed CIDR; Ceph's refusal.
pub async fn unblocklist_cidr_text(cluster: &Cluster, cidr: &str) -> Result<(), FenceError> {
    let parsed = Cidr::parse(cidr)?;
    let text = parsed.to_string();
    match unblocklist_cidr(cluster, &CidrEntry::Range(text.clone())).await {
        Ok(()) => Ok(()),
        Err(FenceError::Ceph(ceph_rbd::Error::InvalidArgument { reason, .. }))
            if reason.contains("invalid command") || reason.contains("unrecognized") =>
        {
            let ips =
                parsed
                    .addresses(MAX_EXPANDED_ADDRESSES)
                    .ok_or_else(|| FenceError::BadCidr {
                        cidr: cidr.to_owned(),
                        problem: format!(
                            "this Ceph cluster has no range blocklist and the CIDR holds more \
                         than {MAX_EXPANDED_ADDRESSES} addresses"
                        ),
                    })?;
            let entries = ips
                .into_iter()
                .map(|ip| match ip {
                    IpAddr::V4(ip) => format!("{ip}:0/0"),
                    IpAddr::V6(ip) => format!("[{ip}]:0/0"),
                })
                .collect();
            unblocklist_cidr(cluster, &CidrEntry::Addresses(entries)).await
        }
        Err(e) => Err(e),
    }
}

/// One entry of `osd blocklist ls`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlocklistEntry {
    /// `ip:port/nonce`, or for a range `ip:0/prefix` as Ceph lists it.
    pub address: String,
    pub range: bool,
    /// The expiry as Ceph prints it.
    pub until: String,
}

#[derive(Deserialize)]
struct ListedEntry {
    #[serde(default)]
    addr: Option<String>,
    #[serde(default)]
    range: Option<String>,
    #[serde(default)]
    until: String,
}

/// Parses `osd blocklist ls --format json`: Ceph prints the addresses' list and, on releases
/// with range blocklists, the ranges' list right after it.
///
/// # Errors
/// [`FenceError::BadListing`].
pub fn parse_blocklist(out: &str) -> Result<Vec<BlocklistEntry>, FenceError> {
    let mut entries = Vec::new();
    for list in serde_json::Deserializer::from_str(out).into_iter::<Vec<ListedEntry>>() {
        let list = list.map_err(|e| FenceError::BadListing(e.to_string()))?;
        for e in list {
            match (e.addr, e.range) {
                (Some(address), _) => entries.push(BlocklistEntry {
                    address,
                    range: false,
                    until: e.until,
                }),
                (None, Some(address)) => entries.push(BlocklistEntry {
                    address,
                    range: true,
                    until: e.until,
                }),
                (None, None) => {}
            }
        }
    }
    Ok(entries)
}

/// The cluster's blocklist.
///
/// # Errors
/// Ceph's; an unreadable answer.
pub async fn blocklist(cluster: &Cluster) -> Result<Vec<BlocklistEntry>, FenceError> {
    let reply = cluster
        .mon_command(
            "osd blocklist ls",
            &json!({"prefix": "osd blocklist ls", "format": "json"}).to_string(),
        )
        .await?;
    parse_blocklist(&reply.out)
}

/// Decides which clients of `image` to fence for `node`, from its records and lock holders
/// (pure: the rules in the module docs). `own` are the global IDs of this process's clients.
#[must_use]
pub fn judge(
    node: &str,
    published: &[publish::Publication],
    staged_by: Option<&StagedBy>,
    lockers: &[Locker],
    own: &HashSet<u64>,
) -> (bool, bool, Vec<Suspect>) {
    let published_to_node = published.iter().any(|p| p.node == node);
    let staged_by_node = staged_by.is_some_and(|s| s.node == node);
    let mut suspects = Vec::new();
    if let Some(by) = staged_by.filter(|s| s.node == node)
        && let Some(address) = &by.address
        && !by.client.is_some_and(|id| own.contains(&id))
    {
        suspects.push(Suspect {
            address: address.clone(),
            client: by.client.map(|id| format!("client.{id}")),
            reason: Reason::StagedBy,
            lock: None,
        });
    }
    // Lock holders count where the node is the one writer the records name: published there,
    // or staged there (an older version's volume has no staged-by record: its publication is
    // all that names the node). A staged-by record naming another node says that node writes.
    let node_writes =
        (published_to_node && staged_by.is_none_or(|s| s.node == node)) || staged_by_node;
    if node_writes {
        for locker in lockers {
            if locker.id.is_some_and(|id| own.contains(&id)) || locker.address.is_empty() {
                continue;
            }
            suspects.push(Suspect {
                address: locker.address.clone(),
                client: Some(locker.client.clone()),
                reason: Reason::LockHolder,
                lock: Some((locker.client.clone(), locker.cookie.clone())),
            });
        }
    }
    (published_to_node, staged_by_node, suspects)
}

/// What `pool`/`image` says about `node` (see [`judge`]); `None` when the image is gone.
///
/// # Errors
/// Ceph's; an unreadable publication record.
pub async fn plan(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    node: &str,
    own: &HashSet<u64>,
) -> Result<Option<ImagePlan>, FenceError> {
    let metadata = match cluster.metadata_list(pool, image).await {
        Ok(m) => m,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let published = publish::parse_record(image, metadata.get(META_PUBLISHED).map(String::as_str))?;
    let staged_by = metadata
        .get(META_STAGED_BY)
        .and_then(|v| StagedBy::parse(v));
    // the lock holders matter only where the records name the node (one image open fewer
    // for every other image of the driver)
    let names_node = published.iter().any(|p| p.node == node)
        || staged_by.as_ref().is_some_and(|s| s.node == node);
    let lockers = if names_node {
        match cluster.lockers(pool, image).await {
            Ok(l) => l,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    } else {
        Vec::new()
    };
    let (published_to_node, staged_by_node, suspects) =
        judge(node, &published, staged_by.as_ref(), &lockers, own);
    Ok(Some(ImagePlan {
        pool: pool.to_owned(),
        image: image.to_owned(),
        published_to_node,
        staged_by_node,
        has_staged_by: staged_by.is_some(),
        suspects,
    }))
}

/// Fences `node` on `cluster` for the images `images` ((pool spec, image) pairs; images that do
/// not concern the node are left alone): blocklists the clients [`plan`] finds for `expiry`,
/// breaks their exclusive locks, then removes the node from the images' publication records.
/// Idempotent: running it again after a partial failure completes it.
///
/// # Errors
/// The first failure; nothing after it is done (the publication records are changed last).
pub async fn fence(
    cluster: &Cluster,
    node: &str,
    images: &[(String, String)],
    own: &HashSet<u64>,
    expiry: Duration,
) -> Result<Fenced, FenceError> {
    let mut plans = Vec::new();
    for (pool, image) in images {
        if let Some(plan) = plan(cluster, pool, image, node, own).await? {
            plans.push(plan);
        }
    }
    execute(cluster, node, plans, expiry).await
}

/// The acting half of [`fence`], for callers that made the [`plan`]s themselves (e.g. many
/// images read concurrently): blocklists, breaks locks, unpublishes. Plans that do not concern
/// the node are skipped.
///
/// # Errors
/// The first failure; the publication records are changed last.
pub async fn execute(
    cluster: &Cluster,
    node: &str,
    plans: Vec<ImagePlan>,
    expiry: Duration,
) -> Result<Fenced, FenceError> {
    let plans: Vec<ImagePlan> = plans.into_iter().filter(ImagePlan::concerns_node).collect();
    let addresses: BTreeSet<String> = plans
        .iter()
        .flat_map(|p| p.suspects.iter().map(|s| s.address.clone()))
        .collect();
    for address in &addresses {
        blocklist_add(cluster, address, expiry).await?;
    }
    let mut report = Fenced {
        addresses: addresses.iter().cloned().collect(),
        images: Vec::new(),
    };
    let mut relisted = BTreeSet::new();
    for plan in &plans {
        let mut fenced = FencedImage {
            pool: plan.pool.clone(),
            image: plan.image.clone(),
            addresses: plan
                .suspects
                .iter()
                .map(|s| s.address.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            ..FencedImage::default()
        };
        for suspect in &plan.suspects {
            let Some((client, cookie)) = &suspect.lock else {
                continue;
            };
            match cluster
                .break_lock(&plan.pool, &plan.image, client, cookie)
                .await
            {
                Ok(()) => {
                    tracing::info!(pool = %plan.pool, image = %plan.image, %client, "exclusive lock broken");
                    fenced.locks_broken.push(client.clone());
                    relisted.insert(suspect.address.clone());
                }
                // the holder let go meanwhile (or the image went): nothing to break
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        report.images.push(fenced);
    }
    // librbd blocklisted the broken holders again for its own default: ours again
    for address in &relisted {
        blocklist_add(cluster, address, expiry).await?;
    }
    for (plan, fenced) in plans.iter().zip(report.images.iter_mut()) {
        if plan.published_to_node {
            let done = publish::unpublish(cluster, &plan.pool, &plan.image, Some(node)).await?;
            fenced.unpublished = done == publish::Unpublished::Removed;
        }
    }
    Ok(report)
}

/// Removes the blocklist entries of `addresses` (unfence).
///
/// # Errors
/// The first failure.
pub async fn unfence(cluster: &Cluster, addresses: &[String]) -> Result<(), FenceError> {
    for address in addresses {
        blocklist_rm(cluster, address).await?;
    }
    Ok(())
}

/// `fenced`'s addresses grouped by image, for messages: `pool/image: addr, addr`.
#[must_use]
pub fn describe(fenced: &Fenced) -> BTreeMap<String, String> {
    fenced
        .images
        .iter()
        .map(|i| {
            let mut what = Vec::new();
            if !i.addresses.is_empty() {
                what.push(format!("blocklisted {}", i.addresses.join(", ")));
            }
            if !i.locks_broken.is_empty() {
                what.push(format!(
                    "broke the exclusive lock of {}",
                    i.locks_broken.join(", ")
                ));
            }
            if i.unpublished {
                what.push("removed the node from the publication record".to_owned());
            }
            if what.is_empty() {
                what.push("no client of the node found".to_owned());
            }
            (format!("{}/{}", i.pool, i.image), what.join("; "))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publish::{Publication, Sharing};

    fn locker(id: u64, address: &str) -> Locker {
        Locker {
            client: format!("client.{id}"),
            id: Some(id),
            cookie: "auto 1".into(),
            address: address.into(),
        }
    }

    fn published(node: &str) -> Vec<Publication> {
        vec![Publication {
            node: node.into(),
            sharing: Sharing::SingleNode,
            readonly: false,
        }]
    }

    fn staged(node: &str, id: u64, address: &str) -> StagedBy {
        StagedBy {
            node: node.into(),
            client: Some(id),
            address: Some(address.into()),
            pool_wide: false,
        }
    }

    #[test]
    fn the_staged_by_client_and_the_lock_holder_of_the_nodes_image_are_suspects() {
        let by = staged("a", 10, "1.2.3.4:0/10");
        let (p, s, suspects) = judge(
            "a",
            &published("a"),
            Some(&by),
            &[locker(10, "1.2.3.4:0/10")],
            &HashSet::new(),
        );
        assert!(p && s);
        assert_eq!(suspects.len(), 2);
        assert_eq!(suspects[0].reason, Reason::StagedBy);
        assert_eq!(suspects[1].reason, Reason::LockHolder);
        assert_eq!(
            suspects[1].lock,
            Some(("client.10".into(), "auto 1".into()))
        );
    }

    #[test]
    fn another_nodes_records_and_our_own_clients_are_left_alone() {
        // staged by b, lock held by b's client: fencing a leaves it
        let by = staged("b", 11, "1.2.3.4:0/11");
        let (_, _, suspects) = judge(
            "a",
            &[],
            Some(&by),
            &[locker(11, "1.2.3.4:0/11")],
            &HashSet::new(),
        );
        assert!(suspects.is_empty(), "{suspects:?}");
        // our own client holding the lock of a's image
        let own = HashSet::from([99]);
        let (_, _, suspects) = judge(
            "a",
            &published("a"),
            None,
            &[locker(99, "1.2.3.4:0/99")],
            &own,
        );
        assert!(suspects.is_empty(), "{suspects:?}");
    }

    #[test]
    fn an_older_volume_without_a_staged_by_record_is_fenced_by_its_lock_holder_only() {
        let (p, s, suspects) = judge(
            "a",
            &published("a"),
            None,
            &[locker(12, "10.0.0.1:0/12")],
            &HashSet::new(),
        );
        assert!(p && !s);
        assert_eq!(suspects.len(), 1);
        assert_eq!(suspects[0].address, "10.0.0.1:0/12");
        // and not at all when it is not published to the node
        let (_, _, suspects) = judge(
            "a",
            &[],
            None,
            &[locker(12, "10.0.0.1:0/12")],
            &HashSet::new(),
        );
        assert!(suspects.is_empty());
    }

    #[test]
    fn addresses_and_cidrs_are_checked_naming_the_problem() {
        check_address("127.0.0.1:0/3360436473").unwrap();
        check_address("[::1]:6800/12").unwrap();
        let e = check_address("127.0.0.1").unwrap_err().to_string();
        assert!(e.contains("127.0.0.1") && e.contains("nonce"), "{e}");
        let c = Cidr::parse("10.0.0.0/30").unwrap();
        assert_eq!(c.size(), 4);
        assert_eq!(
            c.addresses(256).unwrap(),
            ["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"].map(|a| a.parse::<IpAddr>().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/8").unwrap().addresses(256).is_none());
        assert_eq!(Cidr::parse("fd00::/120").unwrap().size(), 256);
        for (bad, problem) in [
            ("10.0.0.0", "ADDRESS/PREFIX"),
            ("10.0.0.300/24", "not an IPv4 or IPv6"),
            ("10.0.0.0/33", "longer than 32"),
            ("10.0.0.0/x", "not a number"),
        ] {
            let e = Cidr::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(problem), "{e}");
        }
    }

    #[test]
    fn the_blocklist_listing_with_ranges_parses() {
        let out = r#"[{"addr":"127.0.0.1:0/999","until":"2026-12-05T18:47:41.270455+0000"}][{"range":"10.0.0.0:0/30","until":"2026-12-05T18:47:41.266647+0000"}]"#;
        let entries = parse_blocklist(out).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].address, "127.0.0.1:0/999");
        assert!(!entries[0].range);
        assert_eq!(entries[1].address, "10.0.0.0:0/30");
        assert!(entries[1].range);
        assert!(parse_blocklist("[]").unwrap().is_empty());
        assert!(parse_blocklist("").unwrap().is_empty());
        assert!(parse_blocklist("nope").is_err());
    }
}
