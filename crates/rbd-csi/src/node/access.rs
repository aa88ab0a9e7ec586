//! What the node asks the cluster before it maps an image: it connects as the caller (which
//! authenticates the caller's key: a wrong or revoked key fails here, also when the image is
//! already mapped on this node), reads the cluster's fsid (an existing mapping is reused only if
//! it is of that cluster), and, for a read-write stage of a single-node volume, decides by node
//! identity whether this node may be its writer ([`judge_writer`], under a lock:
//! [`ClusterCheck::writer_claim`]).
//!
//! **One writer per single-node volume.** A read-write `NodeStageVolume` of a `SINGLE_NODE_*`
//! volume:
//! 1. takes the exclusive RADOS lock [`STAGE_LOCK`] on the image's header (its own lock, not
//!    librbd's exclusive lock; expires by the OSD's clock after [`STAGE_LOCK_SECS`], so a node
//!    that dies mid-stage releases it). Another node's stage holding it: `ABORTED`, the CO
//!    retries;
//! 2. reads, still under the lock, the controller's publication record
//!    ([`rbd_volume::publish::META_PUBLISHED`]), the record [`META_STAGED_BY`] (the node that
//!    last staged it read-write, and the client instance of that mapping), the image's watchers
//!    and the holders of its exclusive lock, and decides ([`judge_writer`]) on evidence of a
//!    writer elsewhere: a publication to other nodes, the recorded mapping of another node
//!    still watching, or (no record yet) another client holding the exclusive lock. A watcher
//!    alone is no writer: rbd-fuse opens every image of its pool, the controller opens images
//!    to snapshot them;
//! 3. maps the image (its client watches the header from now on), and learns the one client
//!    that appeared with the mapping ([`OwnClients`] keeps it as this node's own);
//! 4. records this node and that client in [`META_STAGED_BY`] in one operation with
//!    `assert_locked` (a stage whose lock expired meanwhile writes nothing, and unmaps again),
//!    and unlocks.
//!
//! Two stages on two nodes at once thus decide one after the other, and the second sees the
//! first one's record and mapping. Clients are judged by identity (global ID), never by IP
//! address: nodes behind one address (NAT, host networking on one machine) are still two nodes.
//! The record also tells fencing which client instance to blocklist when the node is lost.
//!
//! Why this and not krbd's `exclusive` map option / `rbd-nbd --exclusive` (librbd's exclusive
//! lock held for the mapping's life): those refuse snapshots of a volume in use (the lock is
//! never handed over to the snapshotting client), and rbd-fuse has no such option. And why no
//! entry removed at `NodeUnstageVolume`: unstage carries no secrets, so the node cannot write to
//! Ceph then; [`META_STAGED_BY`] names the last writer, and a writer whose mapping is gone has no
//! watcher left, so its record stops counting by itself.
//!
//! **Caveats**: a writer whose watch the OSD dropped (a partitioned node, after
//! `osd_client_watch_timeout`) looks gone; Kubernetes' attach/detach (the publication record)
//! and fencing are the lines that hold there. With the rbd-fuse mapper the recorded client is
//! the pool's shared instance, whose watch proves no mapping: only the publication record
//! guards such volumes. A volume staged by an older version (no record) is guarded by its
//! exclusive lock, which a kernel mapping holds once it has written.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ceph_rbd::{Cluster, ClusterConfig, HeaderLock, Locked, Locker, Secret};
use rbd_volume::encryption::{Dek, Kms};
use rbd_volume::publish::Publication;
use tonic::Status;

use crate::mapper::{ImageSpec, Key};

/// How long the node waits to connect to the cluster.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one query may take.
const OP_TIMEOUT: Duration = Duration::from_secs(20);

/// A client watching an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watcher {
    /// `ip:port/nonce` (possibly with a `v1:`/`v2:` prefix).
    pub address: String,
    /// The client's global id (`client.<id>`).
    pub id: u64,
}

impl std::fmt::Display for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client.{} at {}", self.id, self.address)
    }
}

/// What the cluster says about an image, read with the caller's key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The cluster's fsid; `None` where a test stand-in cannot tell.
    pub fsid: Option<String>,
    /// Clients watching the image (mapped devices, open handles).
    pub watchers: Vec<Watcher>,
}

/// What a KMS may need to know of the volume besides its image.
#[derive(Debug, Clone, Copy)]
pub struct VolumeKeyRef<'a> {
    /// The CSI volume ID.
    pub volume_id: &'a str,
    /// The namespace of the volume's claim, when the volume context has it.
    pub tenant: Option<&'a str>,
}

/// Reads a [`ClusterView`] with the caller's key; replaceable in tests that have no cluster.
#[async_trait::async_trait]
pub trait ClusterCheck: Send + Sync {
    /// # Errors
    /// `PERMISSION_DENIED` for a key the cluster refuses, `NOT_FOUND` for a missing image,
    /// `UNAVAILABLE` when the cluster does not answer.
    async fn inspect(&self, image: &ImageSpec, key: &Key) -> Result<ClusterView, Status>;

    /// An encrypted volume's DEK from `kms`, read with the caller's key (`None`: none stored).
    ///
    /// # Errors
    /// As [`ClusterCheck::inspect`]; the KMS's errors name its entry.
    async fn fetch_dek(
        &self,
        image: &ImageSpec,
        _key: &Key,
        kms: &dyn Kms,
        _volume: &VolumeKeyRef<'_>,
    ) -> Result<Option<Dek>, Status> {
        Err(Status::failed_precondition(format!(
            "KMS entry {:?}: no cluster to read the key of image {image} from",
            kms.id()
        )))
    }

    /// Takes [`STAGE_LOCK`] on the image for a read-write stage by `node` and reads what
    /// [`judge_writer`] needs, with the caller's key. The default (stand-ins without a
    /// cluster) holds nothing and reads an empty state.
    ///
    /// # Errors
    /// `ABORTED` while another stage holds the lock; as [`ClusterCheck::inspect`].
    async fn writer_claim(
        &self,
        image: &ImageSpec,
        key: &Key,
        node: &str,
    ) -> Result<Box<dyn WriterClaim>, Status> {
        let _ = (image, key, node);
        Ok(Box::new(NoClaim::default()))
    }
}

/// The real check, through librados/librbd with a connection of its own for the call.
#[derive(Debug, Default)]
pub struct CephCheck;

#[async_trait::async_trait]
impl ClusterCheck for CephCheck {
    async fn inspect(&self, image: &ImageSpec, key: &Key) -> Result<ClusterView, Status> {
        let cfg = ClusterConfig::new(&image.monitors, &image.user, Secret::new(key.expose()))
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_op_timeout(OP_TIMEOUT);
        let cluster = Cluster::connect(&cfg).await.map_err(ceph_status)?;
        let fsid = cluster.fsid().await.map_err(ceph_status)?;
        let pool = ceph_rbd::pool_spec(&image.pool, &image.namespace);
        let watchers = cluster
            .watchers(&pool, &image.image)
            .await
            .map_err(ceph_status)?
            .into_iter()
            .map(|w| Watcher {
                address: w.address,
                id: w.id,
            })
            .collect();
        Ok(ClusterView {
            fsid: Some(fsid),
            watchers,
        })
    }

    async fn fetch_dek(
        &self,
        image: &ImageSpec,
        key: &Key,
        kms: &dyn Kms,
        volume: &VolumeKeyRef<'_>,
    ) -> Result<Option<Dek>, Status> {
        let cfg = ClusterConfig::new(&image.monitors, &image.user, Secret::new(key.expose()))
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_op_timeout(OP_TIMEOUT);
        let cluster = Cluster::connect(&cfg).await.map_err(ceph_status)?;
        let pool = ceph_rbd::pool_spec(&image.pool, &image.namespace);
        let target = rbd_volume::encryption::kms::Target {
            cluster: &cluster,
            pool: &pool,
            image: &image.image,
            volume_id: volume.volume_id,
            tenant: volume.tenant,
        };
        kms.fetch_dek(&target)
            .await
            .map_err(|e| Status::failed_precondition(format!("reading the volume's key: {e}")))
    }

    async fn writer_claim(
        &self,
        image: &ImageSpec,
        key: &Key,
        node: &str,
    ) -> Result<Box<dyn WriterClaim>, Status> {
        self.claim(image, key, node).await
    }
}

/// The CSI status of a Ceph error, saying what the node was doing.
fn ceph_status(e: ceph_rbd::Error) -> Status {
    let status = crate::controller::ceph_status(e);
    Status::new(
        status.code(),
        format!(
            "checking the caller's key and the image with the cluster: {}",
            status.message()
        ),
    )
}

pub use rbd_volume::staged::{META_STAGED_BY, StagedBy};
/// The RADOS lock on the image's header that a read-write stage of a single-node volume holds
/// from its decision until its [`META_STAGED_BY`] record is written.
pub const STAGE_LOCK: &str = "rbd-provisioner.stage";
/// How long [`STAGE_LOCK`] holds at most: longer than a map takes (each helper call is bounded
/// by 2 minutes, an rbd-fuse start by 30 s), short enough that a node that died mid-stage
/// blocks the volume only for minutes.
pub const STAGE_LOCK_SECS: u32 = 300;

/// What the writer decision reads under [`STAGE_LOCK`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriterState {
    /// The controller's publication record (empty: none, e.g. `attachRequired: false`).
    pub published: Vec<Publication>,
    /// The [`META_STAGED_BY`] record, if any.
    pub staged_by: Option<StagedBy>,
    /// Clients watching the image.
    pub watchers: Vec<Watcher>,
    /// Clients holding the image's exclusive lock (`rbd_lock`): writers.
    pub lockers: Vec<Locker>,
}

/// Whether node `node` may stage `image` read-write for single-node access, given `state`.
/// `Err` is the refusal's message. Decided by identity (node IDs, client instances), never by
/// address, and only on evidence of a writer, not of a reader: a watcher alone proves nothing
/// (an rbd-fuse instance of any node opens every image of its pool, the controller opens images
/// to snapshot them).
///
/// 1. a publication record naming other nodes and not `node`: refused (the volume is attached
///    elsewhere; a node never attached does not write it);
/// 2. a [`META_STAGED_BY`] record naming another node and the client instance of its mapping,
///    and that client still watches the image: refused (the image is still mapped read-write
///    there). A pool-wide client (rbd-fuse) watches every image of its pool while it runs, so
///    its watch counts only where the volume is not published to `node` (with attach, the
///    publication record is the line for such volumes);
/// 3. no [`META_STAGED_BY`] record at all (staged by an older version, or never staged), and a
///    client that is not one of this node's own (`own_clients`, [`OwnClients`]) holds the
///    image's exclusive lock: refused (krbd, rbd-nbd and librbd take it to write);
/// 4. otherwise allowed.
///
/// # Errors
/// The refusal, naming the nodes or the clients.
pub fn judge_writer(
    image: &ImageSpec,
    node: &str,
    state: &WriterState,
    own_clients: &HashSet<u64>,
) -> Result<(), String> {
    let published_here = state.published.iter().any(|p| p.node == node);
    if !state.published.is_empty() && !published_here {
        let others: Vec<&str> = state.published.iter().map(|p| p.node.as_str()).collect();
        return Err(format!(
            "image {image} is published to node(s) {} and not to this node {node}: a \
             single-node volume is staged read-write only on the node it is attached to \
             (ControllerPublishVolume)",
            others.join(", ")
        ));
    }
    match &state.staged_by {
        Some(by) if by.node != node => {
            let mapped_there = by
                .client
                .filter(|id| !own_clients.contains(id))
                .and_then(|id| state.watchers.iter().find(|w| w.id == id));
            // A pool-wide client (rbd-fuse) watches every image of its pool while it runs: its
            // watch proves the mapping only where no attachment says otherwise.
            if let Some(watcher) = mapped_there
                && !(by.pool_wide && published_here)
            {
                let how = if by.pool_wide {
                    "its rbd-fuse instance, which has the pool open, is still running"
                } else {
                    "its mapping is still there"
                };
                return Err(format!(
                    "image {image} is staged read-write on node {} and {how} (client {watcher} \
                     watches it), not on this node {node}: a single-node volume is staged on one \
                     node at a time",
                    by.node
                ));
            }
        }
        Some(_) => {}
        None => {
            let writers: Vec<String> = state
                .lockers
                .iter()
                .filter(|l| !l.id.is_some_and(|id| own_clients.contains(&id)))
                .map(|l| format!("{} at {}", l.client, l.address))
                .collect();
            if !writers.is_empty() {
                return Err(format!(
                    "image {image} is being written by another client ({} holds its exclusive \
                     lock) and no node of this driver has recorded staging it: a single-node \
                     volume is staged on one node at a time",
                    writers.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// The Ceph clients (global IDs) of this node's own mappings, per cluster fsid: learnt when a
/// read-write stage maps an image, as the one watcher that appeared with the mapping (under the
/// stage lock, so no other node's stage can add one meanwhile), kept in `<runtime
/// dir>/own-clients/<fsid>`, one ID a line. Global IDs are never reused by a cluster, so an ID
/// of a mapping that has gone is harmless: it never watches again. A client of this node that
/// watches an image it did not map (the rbd-fuse instance of the pool) is thus known as this
/// node's, by identity, not by address.
#[derive(Debug, Clone)]
pub struct OwnClients {
    dir: std::path::PathBuf,
}

impl OwnClients {
    /// The record under `runtime_dir`.
    #[must_use]
    pub fn new(runtime_dir: &std::path::Path) -> OwnClients {
        OwnClients {
            dir: runtime_dir.join("own-clients"),
        }
    }

    fn file(&self, fsid: Option<&str>) -> Option<std::path::PathBuf> {
        let fsid = fsid?;
        // an fsid is a UUID; anything else is never used as a file name
        fsid.bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-')
            .then(|| self.dir.join(fsid))
    }

    /// The recorded clients of the cluster `fsid` (none when it is unknown).
    #[must_use]
    pub fn of(&self, fsid: Option<&str>) -> HashSet<u64> {
        self.file(fsid)
            .and_then(|f| std::fs::read_to_string(f).ok())
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Records `id` as a client of this node in the cluster `fsid`.
    ///
    /// # Errors
    /// The filesystem's.
    pub fn record(&self, fsid: Option<&str>, id: u64) -> std::io::Result<()> {
        use std::io::Write;
        let Some(file) = self.file(fsid) else {
            return Ok(());
        };
        if self.of(fsid).contains(&id) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)?;
        writeln!(out, "{id}")
    }
}

/// The client that appeared with a mapping: the one client in `after` that is not in
/// `before` (one client may watch with several handles). When several appeared at once
/// (another node's rbd-fuse instance opening the pool meanwhile), the one among them that
/// `own` already knows as this node's; otherwise none is known.
#[must_use]
pub fn new_watcher(before: &[Watcher], after: &[Watcher], own: &HashSet<u64>) -> Option<Watcher> {
    let new: Vec<&Watcher> = after
        .iter()
        .filter(|w| !before.iter().any(|b| b.id == w.id))
        .collect();
    let first = new.first()?;
    if new.iter().all(|w| w.id == first.id) {
        return Some((*first).clone());
    }
    let mut known = new.iter().filter(|w| own.contains(&w.id));
    let mine = known.next()?;
    known.all(|w| w.id == mine.id).then(|| (*mine).clone())
}

/// A read-write stage's hold on [`STAGE_LOCK`] ([`ClusterCheck::writer_claim`]): what it read,
/// and the two ways to end it.
#[async_trait::async_trait]
pub trait WriterClaim: Send + Sync {
    /// What was read under the lock.
    fn state(&self) -> &WriterState;

    /// The image's watchers now (after the map, to learn this node's client).
    ///
    /// # Errors
    /// Ceph errors.
    async fn watchers_now(&self) -> Result<Vec<Watcher>, Status> {
        Ok(Vec::new())
    }

    /// Records this node in [`META_STAGED_BY`] (only while the lock is still held), with the
    /// client instance of its mapping when it is known (`client`; `pool_wide`: that client opens
    /// every image of its pool), and releases the lock.
    ///
    /// # Errors
    /// `ABORTED` when the lock expired and nothing was recorded; Ceph errors.
    async fn commit(
        self: Box<Self>,
        client: Option<Watcher>,
        pool_wide: bool,
    ) -> Result<(), Status>;

    /// Releases the lock without recording anything.
    async fn release(self: Box<Self>);
}

/// The claim of a check that has no cluster: nothing read, nothing held.
#[derive(Debug, Default)]
pub struct NoClaim(WriterState);

#[async_trait::async_trait]
impl WriterClaim for NoClaim {
    fn state(&self) -> &WriterState {
        &self.0
    }

    async fn commit(
        self: Box<Self>,
        _client: Option<Watcher>,
        _pool_wide: bool,
    ) -> Result<(), Status> {
        Ok(())
    }

    async fn release(self: Box<Self>) {}
}

/// A cookie for [`STAGE_LOCK`] unique to this holding: node, process, a counter, the time.
fn stage_cookie(node: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{node} {} {} {nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// [`CephCheck`]'s claim: the connection that holds the lock (a RADOS lock belongs to the
/// client instance that took it).
struct CephClaim {
    cluster: Arc<Cluster>,
    pool: String,
    image: String,
    node: String,
    lock: HeaderLock,
    state: WriterState,
    /// Set once committed or released; otherwise `Drop` releases the lock (a cancelled call).
    done: bool,
}

impl CephClaim {
    async fn unlock(&mut self) {
        self.done = true;
        if let Err(e) = self
            .cluster
            .header_unlock(&self.pool, &self.image, &self.lock)
            .await
        {
            tracing::warn!(pool = %self.pool, image = %self.image, error = %e,
                "releasing the stage lock failed; it expires by itself");
        }
    }
}

#[async_trait::async_trait]
impl WriterClaim for CephClaim {
    fn state(&self) -> &WriterState {
        &self.state
    }

    async fn watchers_now(&self) -> Result<Vec<Watcher>, Status> {
        watchers_of(&self.cluster, &self.pool, &self.image).await
    }

    async fn commit(
        mut self: Box<Self>,
        client: Option<Watcher>,
        pool_wide: bool,
    ) -> Result<(), Status> {
        if self.done {
            // a format-1 image: nothing held, nothing to record on
            return Ok(());
        }
        let record = StagedBy {
            node: self.node.clone(),
            client: client.as_ref().map(|w| w.id),
            address: client.map(|w| w.address),
            pool_wide,
        };
        let written = self
            .cluster
            .metadata_set_locked(
                &self.pool,
                &self.image,
                &self.lock,
                vec![(META_STAGED_BY.to_owned(), record.value())],
            )
            .await;
        self.unlock().await;
        match written {
            Ok(()) => Ok(()),
            Err(ceph_rbd::Error::Busy { .. }) => Err(Status::aborted(format!(
                "image {}/{}: the stage lock {STAGE_LOCK} expired before this node recorded \
                 itself as the writer; not staged",
                self.pool, self.image
            ))),
            Err(e) => Err(ceph_status(e)),
        }
    }

    async fn release(mut self: Box<Self>) {
        if !self.done {
            self.unlock().await;
        }
    }
}

impl Drop for CephClaim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (cluster, pool, image, lock) = (
            Arc::clone(&self.cluster),
            self.pool.clone(),
            self.image.clone(),
            self.lock.clone(),
        );
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = cluster.header_unlock(&pool, &image, &lock).await;
            });
        }
    }
}

impl CephCheck {
    async fn claim(
        &self,
        image: &ImageSpec,
        key: &Key,
        node: &str,
    ) -> Result<Box<dyn WriterClaim>, Status> {
        let cfg = ClusterConfig::new(&image.monitors, &image.user, Secret::new(key.expose()))
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_op_timeout(OP_TIMEOUT);
        let cluster = Arc::new(Cluster::connect(&cfg).await.map_err(ceph_status)?);
        let pool = ceph_rbd::pool_spec(&image.pool, &image.namespace);
        let lock = HeaderLock {
            name: STAGE_LOCK.to_owned(),
            cookie: stage_cookie(node),
            description: format!("rbd-csi NodeStageVolume read-write on node {node}"),
            secs: STAGE_LOCK_SECS,
        };
        let held = match cluster
            .header_lock(&pool, &image.image, &lock)
            .await
            .map_err(ceph_status)?
        {
            Locked::Taken => true,
            Locked::Busy => {
                return Err(Status::aborted(format!(
                    "image {image} is being staged read-write by another node right now (it \
                     holds the lock {STAGE_LOCK} on the image's header); retry later"
                )));
            }
            Locked::Format1 => {
                // No header object to lock or record on, no metadata to read: staged unlocked
                // and unrecorded (two stages at once are not serialised for such images). Not
                // covered by a test: Ceph 16 and later cannot create format-1 images.
                tracing::warn!(image = %image, "a format-1 image: staged without the stage lock");
                false
            }
        };
        let mut claim = CephClaim {
            cluster,
            pool,
            image: image.image.clone(),
            node: node.to_owned(),
            lock,
            state: WriterState::default(),
            done: !held,
        };
        // The lock is released (Drop) when a read fails.
        claim.state = if held {
            read_writer_state(&claim.cluster, &claim.pool, &claim.image).await?
        } else {
            // format 1 keeps no image metadata: no publication or writer record to read
            WriterState {
                watchers: watchers_of(&claim.cluster, &claim.pool, &claim.image).await?,
                ..WriterState::default()
            }
        };
        Ok(Box::new(claim))
    }
}

async fn read_writer_state(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<WriterState, Status> {
    let published = rbd_volume::publish::publications(cluster, pool, image)
        .await
        .map_err(|e| match e {
            rbd_volume::publish::PublishError::Ceph(e) => ceph_status(e),
            other => Status::failed_precondition(other.to_string()),
        })?;
    let staged_by = cluster
        .metadata_get(pool, image, META_STAGED_BY)
        .await
        .map_err(ceph_status)?
        .as_deref()
        .and_then(StagedBy::parse);
    let lockers = cluster.lockers(pool, image).await.map_err(ceph_status)?;
    Ok(WriterState {
        published,
        staged_by,
        watchers: watchers_of(cluster, pool, image).await?,
        lockers,
    })
}

async fn watchers_of(cluster: &Cluster, pool: &str, image: &str) -> Result<Vec<Watcher>, Status> {
    Ok(cluster
        .watchers(pool, image)
        .await
        .map_err(ceph_status)?
        .into_iter()
        .map(|w| Watcher {
            address: w.address,
            id: w.id,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use rbd_volume::publish::Sharing;

    use super::*;

    fn image() -> ImageSpec {
        ImageSpec {
            monitors: "m".into(),
            pool: "kube".into(),
            namespace: String::new(),
            image: "pvc-1".into(),
            user: "u".into(),
            map_options: None,
            unmap_options: None,
        }
    }

    fn published(nodes: &[&str]) -> Vec<Publication> {
        nodes
            .iter()
            .map(|n| Publication {
                node: (*n).to_owned(),
                sharing: Sharing::SingleNode,
                readonly: false,
            })
            .collect()
    }

    fn watched() -> Vec<Watcher> {
        vec![Watcher {
            address: "127.0.0.1:0/3360436473".into(),
            id: 4157,
        }]
    }

    #[test]
    fn a_node_the_volume_is_not_published_to_is_refused_naming_the_nodes() {
        let state = WriterState {
            published: published(&["node-a"]),
            ..WriterState::default()
        };
        let err = judge_writer(&image(), "node-b", &state, &HashSet::new()).unwrap_err();
        assert!(
            err.contains("node(s) node-a") && err.contains("node-b"),
            "{err}"
        );
        assert_eq!(
            judge_writer(&image(), "node-a", &state, &HashSet::new()),
            Ok(())
        );
    }

    fn staged_by(node: &str, client: Option<u64>, pool_wide: bool) -> StagedBy {
        StagedBy {
            node: node.to_owned(),
            client,
            address: client.map(|_| "127.0.0.1:0/3360436473".to_owned()),
            pool_wide,
        }
    }

    fn locked_by(id: u64) -> Vec<Locker> {
        vec![Locker {
            client: format!("client.{id}"),
            id: Some(id),
            cookie: "auto 1".into(),
            address: "127.0.0.1:0/1".into(),
        }]
    }

    #[test]
    fn another_nodes_recorded_mapping_that_still_watches_refuses_and_nothing_else_does() {
        let none = HashSet::new();
        // node-a's own mapping (client 4157) still watches: node-b is refused, whatever the
        // addresses (all 127.0.0.1 here: identity decides)
        let state = WriterState {
            staged_by: Some(staged_by("node-a", Some(4157), false)),
            watchers: watched(),
            ..WriterState::default()
        };
        let err = judge_writer(&image(), "node-b", &state, &none).unwrap_err();
        assert!(
            err.contains("staged read-write on node node-a") && err.contains("client.4157"),
            "{err}"
        );
        assert_eq!(judge_writer(&image(), "node-a", &state, &none), Ok(()));
        // node-a's mapping is gone; another client (another node's rbd-fuse instance, a
        // snapshotting controller) watches: not a writer
        let gone = WriterState {
            staged_by: Some(staged_by("node-a", Some(9000), false)),
            watchers: watched(),
            ..WriterState::default()
        };
        assert_eq!(judge_writer(&image(), "node-b", &gone, &none), Ok(()));
        // a pool-wide client (rbd-fuse) watches every image of its pool while it runs: it
        // refuses without an attachment, and an attachment to node-b overrules it
        let fuse = WriterState {
            staged_by: Some(staged_by("node-a", Some(4157), true)),
            watchers: watched(),
            ..WriterState::default()
        };
        let err = judge_writer(&image(), "node-b", &fuse, &none).unwrap_err();
        assert!(err.contains("rbd-fuse instance"), "{err}");
        let attached_to_b = WriterState {
            published: published(&["node-b"]),
            ..fuse
        };
        assert_eq!(
            judge_writer(&image(), "node-b", &attached_to_b, &none),
            Ok(())
        );
    }

    #[test]
    fn without_a_record_a_foreign_exclusive_lock_holder_refuses_and_a_mere_watcher_does_not() {
        let none = HashSet::new();
        // a fresh image that another node's rbd-fuse opened: a watcher, no writer
        let watched_only = WriterState {
            watchers: watched(),
            ..WriterState::default()
        };
        assert_eq!(
            judge_writer(&image(), "node-b", &watched_only, &none),
            Ok(())
        );
        // staged by an older version (no record) on a node whose kernel mapping wrote it
        let written = WriterState {
            watchers: watched(),
            lockers: locked_by(4157),
            ..WriterState::default()
        };
        let err = judge_writer(&image(), "node-b", &written, &none).unwrap_err();
        assert!(
            err.contains("client.4157") && err.contains("exclusive lock"),
            "{err}"
        );
        // this node's own client holding it is no other writer
        let own: HashSet<u64> = [4157].into();
        assert_eq!(judge_writer(&image(), "node-b", &written, &own), Ok(()));
        // once a node of this driver recorded its stage, the record decides, not the lock
        // (rbd-fuse keeps the lock after a node unstages)
        let recorded = WriterState {
            staged_by: Some(staged_by("node-a", None, true)),
            ..written
        };
        assert_eq!(judge_writer(&image(), "node-b", &recorded, &none), Ok(()));
    }

    #[test]
    fn a_writer_without_watchers_is_gone_and_does_not_block() {
        let state = WriterState {
            published: published(&["node-b"]),
            staged_by: Some(staged_by("node-a", Some(4157), false)),
            ..WriterState::default()
        };
        assert_eq!(
            judge_writer(&image(), "node-b", &state, &HashSet::new()),
            Ok(())
        );
    }

    #[test]
    fn own_clients_are_learnt_as_the_one_new_watcher_and_kept_per_cluster() {
        let w = |id| Watcher {
            address: "127.0.0.1:0/1".into(),
            id,
        };
        let none = HashSet::new();
        assert_eq!(new_watcher(&[w(1)], &[w(1), w(2)], &none), Some(w(2)));
        assert_eq!(new_watcher(&[w(1)], &[w(1)], &none), None);
        assert_eq!(
            new_watcher(&[], &[w(2), w(3)], &none),
            None,
            "two new: neither is known ours"
        );
        assert_eq!(
            new_watcher(&[], &[w(2), w(3)], &[3].into()),
            Some(w(3)),
            "two new: the one known as ours"
        );
        let tmp = tempfile::tempdir().unwrap();
        let own = OwnClients::new(tmp.path());
        let fsid = "2d1c6c24-1b4e-4f0e-9d55-1f0b8a1e2c3d";
        own.record(Some(fsid), 7).unwrap();
        own.record(Some(fsid), 7).unwrap();
        own.record(Some(fsid), 8).unwrap();
        assert_eq!(own.of(Some(fsid)), [7, 8].into());
        assert!(own.of(Some("another-0000")).is_empty());
        assert!(own.of(None).is_empty());
        // an fsid that is no UUID never becomes a path
        own.record(Some("../x"), 1).unwrap();
        assert!(!tmp.path().join("x").exists());
    }

    #[test]
    fn stage_cookies_are_unique_per_holding() {
        assert_ne!(stage_cookie("n"), stage_cookie("n"));
    }
}
