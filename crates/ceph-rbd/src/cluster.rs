//! The async API: one [`Cluster`] per connection, every call run on the blocking pool and bounded
//! by the operation timeout.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::raw::{IoCtx, Rados, WriteStep};
use crate::{ClusterConfig, Error};

/// Options for creating or cloning an image. `Default` gives librbd's defaults, format 2.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// Image format, 1 or 2 (default 2).
    pub format: Option<u8>,
    /// Feature set; `None` leaves librbd's `rbd_default_features`.
    pub features: Option<crate::Features>,
    /// Erasure-coded (or other) pool for the data objects.
    pub data_pool: Option<String>,
    /// Object size in bytes: a power of two from 4 KiB to 32 MiB (default 4 MiB).
    pub object_size: Option<u64>,
    /// Stripe unit in bytes (a divisor of the object size).
    pub stripe_unit: Option<u64>,
    /// Number of objects striped over.
    pub stripe_count: Option<u64>,
}

/// What `stat` tells about an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub size: u64,
    pub object_size: u64,
    pub features: crate::Features,
    /// The image id (stable across renames).
    pub id: String,
    /// Prefix of the image's data objects (`rbd_data.<id>`).
    pub block_name_prefix: String,
    /// When the image was created.
    pub created: std::time::SystemTime,
}

/// One snapshot of an image, of any namespace ([`Cluster::snapshot_entries`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapEntry {
    pub id: u64,
    /// For a snapshot in the snapshot trash (removed while clones v2 depend on it): the name
    /// it had. `None` for every other snapshot.
    pub trashed_as: Option<String>,
}

/// A client watching an image: a mapped device or an open handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watcher {
    /// `ip:port/nonce` of the client.
    pub address: String,
    pub id: u64,
    pub cookie: u64,
}

/// A holder of an image's `rbd_lock` (the exclusive lock librbd and krbd take to write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locker {
    /// The locking entity, `client.<global id>`.
    pub client: String,
    /// Its global id, when the entity is a client.
    pub id: Option<u64>,
    /// The lock cookie (`auto <handle>` for librbd's and krbd's exclusive lock).
    pub cookie: String,
    /// `ip:port/nonce` of the holding client instance.
    pub address: String,
}

/// What a monitor command returned ([`Cluster::mon_command`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MonReply {
    /// The output buffer (JSON when the command asked for `"format": "json"`).
    pub out: String,
    /// The status line (`ceph` prints it on stderr).
    pub status: String,
}

/// One snapshot of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapInfo {
    pub id: u64,
    pub name: String,
    pub size: u64,
    pub protected: bool,
    /// When the snapshot was taken.
    pub created: std::time::SystemTime,
}

/// The snapshot a clone was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentSpec {
    /// The parent's pool (without its namespace: see [`ParentSpec::pool_spec`]).
    pub pool: String,
    /// RADOS namespace of the parent (empty: the default one).
    pub namespace: String,
    pub image: String,
    pub image_id: String,
    /// The parent image was moved to the trash.
    pub in_trash: bool,
    /// Empty when the snapshot is no longer a user snapshot (clone v2: removed while clones
    /// exist, now in the snapshot trash).
    pub snap: String,
    pub snap_id: u64,
}

impl ParentSpec {
    /// The parent's pool spec, `pool` or `pool/namespace`, what the calls here take.
    #[must_use]
    pub fn pool_spec(&self) -> String {
        crate::namespace::pool_spec(&self.pool, &self.namespace)
    }
}

/// One snapshot of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSnapInfo {
    pub name: String,
    /// False while (or if) the group snapshot was not taken on every image.
    pub complete: bool,
}

/// An image's snapshot that belongs to a group snapshot (group namespace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageGroupSnap {
    /// The image's snapshot ID (what opening the image at it needs).
    pub id: u64,
    /// ID of the pool the group lives in.
    pub group_pool: i64,
    pub group: String,
    /// The group snapshot's name.
    pub group_snap: String,
}

/// One image in a pool's trash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrashEntry {
    pub id: String,
    pub name: String,
    /// Unix time before which the entry may not be removed without `force`.
    pub deferment_end: i64,
}

/// Usage of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    pub used_bytes: u64,
    pub objects: u64,
}

/// Raw capacity of the whole cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterStats {
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub avail_bytes: u64,
}

/// A connection to one cluster as one user. Cheap to share (`Arc`); get it from a
/// [`ConnectionPool`](crate::ConnectionPool).
pub struct Cluster {
    rados: Arc<Rados>,
    op_timeout: Duration,
    monitors: String,
    healthy: AtomicBool,
    /// False while the last operation timed out (until one completes again).
    responsive: AtomicBool,
    /// Bounds the blocking threads this connection may have inside librados/librbd: calls stuck
    /// on an unreachable OSD keep their permit until they return.
    permits: Arc<tokio::sync::Semaphore>,
    /// Threads inside librados/librbd for this connection now.
    running: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts one thread inside librados/librbd until dropped.
struct Running(Arc<std::sync::atomic::AtomicUsize>);

impl Running {
    fn enter(count: &Arc<std::sync::atomic::AtomicUsize>) -> Running {
        count.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(count))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Blocking calls one connection may have running at once (see [`Cluster::run`]).
pub const MAX_CALLS_PER_CONNECTION: usize = 64;

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("monitors", &self.monitors)
            .field("op_timeout", &self.op_timeout)
            .field("healthy", &self.is_healthy())
            .finish_non_exhaustive()
    }
}

/// Images with a changing operation in flight or queued in this process (`monitors|pool/image`):
/// one FIFO lock per image, present while anyone holds or waits for it.
fn in_flight() -> &'static std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
    static MAP: std::sync::OnceLock<
        std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::OnceLock::new();
    MAP.get_or_init(Default::default)
}

/// How many operations may wait for one image at once; one more is refused at once.
pub const MAX_QUEUED_PER_IMAGE: usize = 64;

/// Drops `key`'s lock from the map when nobody holds or waits for it any more.
fn forget_if_idle(key: &str) {
    let mut map = in_flight()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if map
        .get(key)
        .is_some_and(|lock| Arc::strong_count(lock) == 1)
    {
        map.remove(key);
    }
}

/// Holds an image's operation lock; dropping it lets the next queued operation run.
pub(crate) struct InFlight {
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        drop(self.guard.take());
        forget_if_idle(&self.key);
    }
}

pub(crate) fn check_image_name(op: &'static str, pool: &str, name: &str) -> Result<(), Error> {
    let target = format!("{pool}/{name}");
    if let Err(reason) = crate::namespace::split_pool_spec(pool) {
        return Err(Error::invalid(op, target, reason));
    }
    if name.is_empty() {
        return Err(Error::invalid(op, target, "image name is empty"));
    }
    if let Some(c) = name.chars().find(|c| matches!(c, '/' | '@' | '\0')) {
        return Err(Error::invalid(
            op,
            target,
            format!("image name may not contain {c:?}"),
        ));
    }
    Ok(())
}

impl Cluster {
    /// Connects, bounded by the configured connect timeout. Prefer [`ConnectionPool::get`](crate::ConnectionPool::get).
    pub async fn connect(cfg: &ClusterConfig) -> Result<Cluster, Error> {
        let span = tracing::debug_span!("ceph.connect", monitors = %cfg.monitors, user = %cfg.user);
        let cfg2 = cfg.clone();
        let deadline = cfg.connect_timeout + Duration::from_secs(2);
        let target = format!("client.{}@{}", cfg.user, cfg.monitors);
        let joined = tokio::time::timeout(
            deadline,
            tokio::task::spawn_blocking({
                let call = crate::lifecycle::Call::start();
                move || {
                    call.enter();
                    let _call = call;
                    Rados::connect(&cfg2)
                }
            }),
        )
        .instrument(span)
        .await;
        let rados = match joined {
            Err(_) => {
                return Err(Error::Timeout {
                    op: "connect",
                    target,
                    after: deadline,
                });
            }
            Ok(Err(join)) => {
                return Err(Error::invalid(
                    "connect",
                    target,
                    format!("connect task failed: {join}"),
                ));
            }
            Ok(Ok(Err(Error::Timeout { op, target, .. }))) => {
                // msgr2 reports a refused key as a timeout: find out which it was
                if crate::probe::any_monitor_answers(&cfg.monitors, Duration::from_secs(2)).await {
                    return Err(Error::PermissionDenied { op, target });
                }
                return Err(Error::Timeout {
                    op,
                    target,
                    after: cfg.connect_timeout,
                });
            }
            Ok(Ok(r)) => r?,
        };
        Ok(Cluster {
            rados: Arc::new(rados),
            op_timeout: cfg.op_timeout,
            monitors: cfg.monitors.clone(),
            healthy: AtomicBool::new(true),
            responsive: AtomicBool::new(true),
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_CALLS_PER_CONNECTION)),
            running: Arc::default(),
        })
    }

    /// False once an operation failed in a way that says the connection itself is broken (shut
    /// down, blocklisted, refused); the pool then reconnects on the next `get`.
    ///
    /// A timeout does not count: it says an OSD, a PG or one image's lock holder is slow, not
    /// that the connection is, and librados reconnects to monitors and OSDs by itself. Replacing
    /// the connection then would let a second client of this process open images the stuck
    /// calls still hold, and shut the old handle down under librbd's feet (the abort once seen
    /// under failover, RELIABILITY.md bug 6).
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// False while the last operation on this connection timed out (Ceph slow or unreachable),
    /// true again once one completes.
    pub fn is_responsive(&self) -> bool {
        self.responsive.load(Ordering::Relaxed)
    }

    /// Threads inside librados/librbd for this connection right now (stuck calls included).
    pub fn calls_running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// The configured per-operation bound.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// Runs `f` on the blocking pool with a span and the op timeout.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        target: String,
        f: impl FnOnce(&Rados) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let rados = Arc::clone(&self.rados);
        let span = tracing::debug_span!("ceph.op", op, target = %target);
        let started = tokio::time::Instant::now();
        // Monitor commands end at librados' rados_mon_op_timeout; OSD ops have no librados
        // timeout (librbd does not survive one), so this deadline bounds how long the caller
        // waits. The librbd call itself runs on until Ceph answers.
        let deadline = started + self.op_timeout + Duration::from_secs(2);
        let timeout = |op, target| Error::Timeout {
            op,
            target,
            after: deadline - started,
        };
        // No more than MAX_CALLS_PER_CONNECTION threads wait inside librbd: when calls stuck
        // on a long outage hold every permit, new calls time out without taking a thread.
        let permit = match tokio::time::timeout_at(
            deadline,
            Arc::clone(&self.permits).acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_closed)) => return Err(Error::invalid(op, target, "connection closed")),
            Err(_) => {
                self.responsive.store(false, Ordering::Relaxed);
                return Err(timeout(op, target));
            }
        };
        // counted until the call itself returns, also after our deadline gave up on it
        let call = crate::lifecycle::Call::start();
        let running = Arc::clone(&self.running);
        let blocking = tokio::task::spawn_blocking(move || {
            call.enter();
            let _call = call;
            let _permit = permit;
            let _running = Running::enter(&running);
            f(&rados)
        });
        let result = match tokio::time::timeout_at(deadline, blocking)
            .instrument(span.clone())
            .await
        {
            Err(_) => Err(timeout(op, target)),
            Ok(Err(join)) => Err(Error::invalid(
                op,
                target,
                format!("operation task failed: {join}"),
            )),
            Ok(Ok(Err(Error::Timeout { op, target, .. }))) => Err(Error::Timeout {
                op,
                target,
                after: self.op_timeout,
            }),
            Ok(Ok(r)) => r,
        };
        match &result {
            Err(e @ Error::Timeout { .. }) => {
                tracing::debug!(error = %e, "Ceph did not answer in time");
                self.responsive.store(false, Ordering::Relaxed);
            }
            Err(e) if e.is_connection_failure() => {
                self.healthy.store(false, Ordering::Relaxed);
            }
            _ => self.responsive.store(true, Ordering::Relaxed),
        }
        span.in_scope(|| {
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                ok = result.is_ok(),
                "done"
            )
        });
        result
    }

    /// The clone format librbd makes on this connection (the client's
    /// `rbd_default_clone_format`: `1` v1, `2` and `auto` v2), probed once per connection with
    /// the rest of [`crate::compat`].
    ///
    /// # Errors
    /// Timeouts (the probe is one monitor command).
    pub async fn clone_format(&self) -> Result<crate::CloneFormat, Error> {
        Ok(self.compat().await?.clone_format)
    }

    pub(crate) async fn compat(&self) -> Result<crate::compat::Compat, Error> {
        // known after the first probe: no call on the blocking pool
        if let Some(known) = self.rados.known_compat() {
            return Ok(known);
        }
        self.run("probe cluster", self.monitors.clone(), |rados| {
            Ok(rados.compat())
        })
        .await
    }

    /// Runs `f` with an I/O context on `pool`.
    pub(crate) async fn with_pool<T: Send + 'static>(
        &self,
        op: &'static str,
        pool: &str,
        target: String,
        f: impl FnOnce(&IoCtx<'_>) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let pool = pool.to_string();
        self.run(op, target, move |rados| f(&rados.ioctx(&pool)?))
            .await
    }

    /// Runs `f` on the open image `pool/name`.
    pub(crate) async fn with_image<T: Send + 'static>(
        &self,
        op: &'static str,
        pool: &str,
        name: &str,
        read_only: bool,
        f: impl FnOnce(&crate::raw::Image<'_>) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        check_image_name(op, pool, name)?;
        let guard = if read_only {
            None
        } else {
            Some(self.claim_image(op, pool, name).await?)
        };
        let name = name.to_string();
        self.with_pool(op, pool, format!("{pool}/{name}"), move |io| {
            let _guard = guard;
            f(&io.open(&name, read_only)?)
        })
        .await
    }

    /// Waits for `pool/name`'s turn (first come, first served) and holds it until the guard is
    /// dropped (by the blocking call itself, so also after our deadline gave up waiting for it):
    /// two handles of one process on one image would contend for its exclusive lock, and librbd
    /// does not survive one of them closing mid-request.
    ///
    /// [`Error::InProgress`] when the turn does not come within the operation timeout (the
    /// operation ahead is still running: Ceph has not answered it), or when
    /// [`MAX_QUEUED_PER_IMAGE`] operations already wait for the image.
    pub(crate) async fn claim_image(
        &self,
        op: &'static str,
        pool: &str,
        name: &str,
    ) -> Result<InFlight, Error> {
        let key = format!("{}|{pool}/{name}", self.monitors);
        let target = format!("{pool}/{name}");
        let lock = {
            let mut map = in_flight()
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let lock = Arc::clone(map.entry(key.clone()).or_default());
            // the map's reference, the holder's, the waiters' and this one
            let queued = Arc::strong_count(&lock).saturating_sub(3);
            if queued >= MAX_QUEUED_PER_IMAGE {
                return Err(Error::InProgress {
                    op,
                    target,
                    why: format!("{queued} other operations on this image are already queued"),
                });
            }
            lock
        };
        let started = Instant::now();
        match tokio::time::timeout(self.op_timeout, lock.lock_owned()).await {
            Ok(guard) => {
                let waited = started.elapsed();
                if waited > Duration::from_millis(100) {
                    tracing::debug!(image = %target, op, ?waited, "waited for the operation ahead on the image");
                }
                Ok(InFlight {
                    key,
                    guard: Some(guard),
                })
            }
            Err(_) => {
                forget_if_idle(&key);
                Err(Error::InProgress {
                    op,
                    target,
                    why: format!(
                        "the operation ahead of it is still running after {:?} (Ceph has not \
                         answered it: slow or unreachable, or the image is locked by a client \
                         that died)",
                        self.op_timeout
                    ),
                })
            }
        }
    }

    /// The turn of `pool/name`'s parent image, for an operation on `pool/name` that may make
    /// librbd open its parent: removing or flattening a clone detaches it, and the last clone
    /// of a trashed snapshot removes that snapshot through an open of the parent, with its
    /// exclusive lock. Two such opens in this process (two clones of one source removed at
    /// once: deleting many snapshots of one volume) contend for that lock, which librbd does not
    /// survive ([`Cluster::claim_image`]). `None` when it has no parent, or one without a name
    /// (in the RBD trash). Take it before the image's own turn: every caller takes a parent's
    /// turn first.
    pub(crate) async fn parent_turn(
        &self,
        op: &'static str,
        pool: &str,
        name: &str,
    ) -> Result<Option<InFlight>, Error> {
        let (pool_spec, name) = (pool.to_string(), name.to_string());
        let target = format!("{pool}/{name}");
        let parent = self
            .run(op, target.clone(), move |rados| {
                let io = rados.ioctx(&pool_spec)?;
                let id = match crate::header::image_id(&io, op, &target, &name) {
                    Ok(id) => id,
                    Err(e) if e.is_not_found() => return Ok(None),
                    Err(e) => return Err(e),
                };
                // no header: a partial image (a create killed midway) has no parent
                let parent = match crate::header::parent(&io, op, &target, &id) {
                    Ok(Some(parent)) => parent,
                    Ok(None) => return Ok(None),
                    Err(e) if e.is_not_found() => return Ok(None),
                    Err(e) => return Err(e),
                };
                let parent_pool = crate::namespace::pool_spec(
                    &rados.pool_name(parent.pool_id)?,
                    &parent.namespace,
                );
                let parent_io = rados.ioctx(&parent_pool)?;
                match crate::header::image_name(&parent_io, op, &target, &parent.image_id) {
                    Ok(parent) => Ok(Some((parent_pool, parent))),
                    Err(e) if e.is_not_found() => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        match parent {
            Some((parent_pool, parent)) => {
                Ok(Some(self.claim_image(op, &parent_pool, &parent).await?))
            }
            None => Ok(None),
        }
    }

    /// Creates an image of `size` bytes. A plain image (see `create`: format 2, plain features,
    /// no data pool or striping, in a validated pool without mirroring or `rbd_default_*`
    /// overrides) is created with RADOS calls, any other by librbd.
    pub async fn create_image(
        &self,
        pool: &str,
        name: &str,
        size: u64,
        opts: &CreateOptions,
    ) -> Result<(), Error> {
        let op = "create image";
        check_image_name(op, pool, name)?;
        if let Some(f) = opts.features {
            f.validate()?;
        }
        let guard = self.claim_image(op, pool, name).await?;
        let (name, opts) = (name.to_string(), opts.clone());
        let target = format!("{pool}/{name}");
        let lock_secs = crate::create::creator_lock_secs(self.op_timeout);
        self.with_pool(op, pool, target.clone(), move |io| {
            let _guard = guard;
            match crate::create::create_plain(io, op, &target, &name, size, &opts, lock_secs)? {
                crate::create::Plain::Created(_) => Ok(()),
                crate::create::Plain::No(why) => {
                    tracing::debug!(image = %target, why, "creating through librbd");
                    io.create_image(&name, size, &opts)
                }
            }
        })
        .await
    }

    /// The values of the omap keys `keys` of the RADOS object `oid` in `pool` (`pool/namespace`
    /// for a RADOS namespace); a key that is not set is absent from the map. For objects other
    /// projects keep (e.g. ceph-csi's journal), not images.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the object does not exist; timeouts.
    pub async fn omap_get(
        &self,
        pool: &str,
        oid: &str,
        keys: &[&str],
    ) -> Result<std::collections::BTreeMap<String, Vec<u8>>, Error> {
        let target = format!("{pool}/{oid}");
        let (oid, keys): (String, Vec<String>) = (
            oid.to_owned(),
            keys.iter().map(|k| (*k).to_owned()).collect(),
        );
        self.with_pool("read omap", pool, target.clone(), move |io| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            io.omap_get("read omap", &target, &oid, &keys)
        })
        .await
    }

    /// The name of the pool whose ID is `id`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no pool has that ID.
    pub async fn pool_name(&self, id: i64) -> Result<String, Error> {
        self.run("look up pool", format!("pool id {id}"), move |rados| {
            rados.pool_name(id)
        })
        .await
    }

    /// Size, features, id and object prefix of an image.
    pub async fn image_info(&self, pool: &str, name: &str) -> Result<ImageInfo, Error> {
        self.with_image("stat image", pool, name, true, |img| img.info())
            .await
    }

    /// Whether the image exists.
    pub async fn image_exists(&self, pool: &str, name: &str) -> Result<bool, Error> {
        match self
            .with_image("open image", pool, name, true, |_| Ok(()))
            .await
        {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Names of the cluster's pools.
    pub async fn list_pools(&self) -> Result<Vec<String>, Error> {
        self.run("list pools", String::new(), |rados| rados.pool_list())
            .await
    }

    /// Names of all images in the pool.
    pub async fn list_images(&self, pool: &str) -> Result<Vec<String>, Error> {
        self.with_pool("list images", pool, pool.to_string(), |io| io.list_images())
            .await
    }

    /// Removes an image. Refuses with [`Error::InUse`] (naming the watchers) while the image is
    /// mapped or open elsewhere, and with [`Error::NotFound`] when it does not exist.
    pub async fn remove_image(&self, pool: &str, name: &str) -> Result<(), Error> {
        match self.remove_image_checked(pool, name, |_| Ok(())).await? {
            Ok(()) => Ok(()),
            // the check above never refuses
            Err(reason) => Err(Error::invalid(
                "remove image",
                format!("{pool}/{name}"),
                reason,
            )),
        }
    }

    /// Takes the name of the partial image `pool/name` (an ID object without header) for a
    /// repair: `Ok(true)` when this client may remove it (no creator holds the creator lock,
    /// its lock expired, or this client holds it: the lock is now ours), `Ok(false)` while
    /// another client holds it (its create may still be running). Without an ID object there
    /// is nothing to claim: `Ok(true)`.
    pub async fn claim_partial_image(&self, pool: &str, name: &str) -> Result<bool, Error> {
        let op = "claim partially created image";
        check_image_name(op, pool, name)?;
        let target = format!("{pool}/{name}");
        let id_object = format!("rbd_id.{name}");
        let lock =
            crate::create::creator_lock_op(crate::create::creator_lock_secs(self.op_timeout));
        let result = self
            .with_pool(op, pool, target.clone(), move |io| {
                io.write_op(
                    op,
                    &target,
                    &id_object,
                    &[WriteStep::AssertExists, WriteStep::lock("lock", &lock)],
                )
            })
            .await;
        match result {
            // taken, or already ours (this client and cookie: EEXIST), or no ID object
            Ok(()) => Ok(true),
            Err(e) if e.is_already_exists() || e.is_not_found() => Ok(true),
            Err(Error::Busy { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes an image if `check` accepts its metadata (e.g. the owner record). The metadata is
    /// read from the image header without opening the image (see `header`). A plain format-2
    /// image nobody watches is then removed with RADOS calls, without librbd (see `remove`);
    /// any other goes through librbd's remove, which refuses a watched image (EBUSY), and only
    /// then is the image opened to name its watchers.
    /// `Ok(Err(reason))` when `check` refused; the other outcomes as [`Cluster::remove_image`].
    /// A partial image (no header) has no metadata: `check` sees an empty map.
    pub async fn remove_image_checked(
        &self,
        pool: &str,
        name: &str,
        check: impl FnOnce(&BTreeMap<String, String>) -> Result<(), String> + Send + 'static,
    ) -> Result<Result<(), String>, Error> {
        check_image_name("remove image", pool, name)?;
        let parent_guard = self.parent_turn("remove image", pool, name).await?;
        let guard = self.claim_image("remove image", pool, name).await?;
        let name = name.to_string();
        let target = format!("{pool}/{name}");
        self.with_pool("remove image", pool, target.clone(), move |io| {
            let _guards = (parent_guard, guard);
            let op = "remove image";
            // Not found: gone, or a partial image (a create killed midway: id object, no
            // header) with no metadata; rbd_remove still cleans that up, or says ENOENT.
            let (id, meta) = match crate::header::image_id(io, op, &target, &name) {
                Ok(id) => match crate::header::metadata(io, op, &target, &id) {
                    Ok(meta) => (Some(id), meta),
                    Err(e) if e.is_not_found() => (None, BTreeMap::new()),
                    Err(e) => return Err(e),
                },
                // format 1, or no image: librbd reads the metadata, or says ENOENT
                Err(e) if e.is_not_found() => match io.open(&name, true) {
                    Ok(img) => (None, img.metadata_list()?),
                    Err(e) if e.is_not_found() => (None, BTreeMap::new()),
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            };
            if let Err(reason) = check(&meta) {
                return Ok(Err(reason));
            }
            // A plain, unwatched image is removed without librbd's ImageCtx (see `remove`);
            // anything else, and a watched image, goes through librbd.
            if let Some(id) = id {
                match crate::remove::remove_plain(io, op, &target, &name, &id)? {
                    crate::remove::Plain::Removed { objects } => {
                        tracing::debug!(image = %target, objects, "removed without librbd");
                        return Ok(Ok(()));
                    }
                    crate::remove::Plain::No(why) => {
                        tracing::debug!(image = %target, why, "removing through librbd");
                    }
                }
            }
            match io.remove_image(&name) {
                // Watched: name the watchers (none left: the tail of a client that just closed
                // it; the caller may retry).
                Err(Error::Busy { .. }) => {
                    let watchers = match io.open(&name, true) {
                        Ok(img) => img.watchers()?,
                        Err(e) if e.is_not_found() => Vec::new(),
                        Err(e) => return Err(e),
                    };
                    if watchers.is_empty() {
                        Err(Error::Busy { op, target })
                    } else {
                        Err(Error::InUse {
                            op,
                            target,
                            watchers: watchers.into_iter().map(|w| w.address).collect(),
                        })
                    }
                }
                other => other.map(Ok),
            }
        })
        .await
    }

    /// Resizes an image. Shrinking is refused unless `allow_shrink`.
    pub async fn resize_image(
        &self,
        pool: &str,
        name: &str,
        new_size: u64,
        allow_shrink: bool,
    ) -> Result<(), Error> {
        self.with_image("resize image", pool, name, false, move |img| {
            let current = img.info()?.size;
            if new_size < current && !allow_shrink {
                return Err(Error::InvalidArgument {
                    op: "resize image",
                    target: String::new(),
                    reason: format!("shrinking from {current} to {new_size} bytes was not allowed"),
                });
            }
            img.resize(new_size, allow_shrink)
        })
        .await
        .map_err(|e| match e {
            Error::InvalidArgument { op, target, reason } if target.is_empty() => {
                Error::InvalidArgument {
                    op,
                    target: format!("{pool}/{name}"),
                    reason,
                }
            }
            e => e,
        })
    }

    /// Clients watching the image (mapped devices, open handles).
    pub async fn watchers(&self, pool: &str, name: &str) -> Result<Vec<crate::Watcher>, Error> {
        self.with_image("list watchers", pool, name, true, |img| img.watchers())
            .await
    }

    /// The holders of the image's `rbd_lock` ([`Locker`]); empty when nobody holds it.
    pub async fn lockers(&self, pool: &str, name: &str) -> Result<Vec<Locker>, Error> {
        self.with_image("list lockers", pool, name, true, |img| img.lockers())
            .await
    }

    /// Sets one metadata value.
    pub async fn metadata_set(
        &self,
        pool: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), Error> {
        let (key, value) = (key.to_string(), value.to_string());
        self.with_image("set image metadata", pool, name, false, move |img| {
            img.metadata_set(&key, &value)
        })
        .await
    }

    /// Sets several metadata keys, in order, with one open of the image (each open copies
    /// librbd's whole configuration: one open instead of one per key matters at scale).
    /// `after_each` is called with each key once it is written (fault-injection hook).
    pub async fn metadata_set_many(
        &self,
        pool: &str,
        name: &str,
        entries: Vec<(String, String)>,
        after_each: Option<fn(&str)>,
    ) -> Result<(), Error> {
        self.with_image("set image metadata", pool, name, false, move |img| {
            for (key, value) in &entries {
                img.metadata_set(key, value)?;
                if let Some(hook) = after_each {
                    hook(key);
                }
            }
            Ok(())
        })
        .await
    }

    /// All metadata of an image.
    pub async fn metadata_list(
        &self,
        pool: &str,
        name: &str,
    ) -> Result<BTreeMap<String, String>, Error> {
        self.with_image("list image metadata", pool, name, true, |img| {
            img.metadata_list()
        })
        .await
    }

    pub async fn snap_create(&self, pool: &str, image: &str, snap: &str) -> Result<(), Error> {
        let snap = snap.to_string();
        self.with_image("create snapshot", pool, image, false, move |img| {
            img.snap_create(&snap)
        })
        .await
    }

    /// Removes snapshot `pool/image@snap`, unprotecting it first where it is protected (a
    /// clone v1's parent snapshot); one that clones v2 still need goes to the image's
    /// snapshot trash.
    ///
    /// # Errors
    /// Not found, busy (protected with clones v1 left), Ceph errors.
    pub async fn snap_remove(&self, pool: &str, image: &str, snap: &str) -> Result<(), Error> {
        let snap = snap.to_string();
        self.with_image("remove snapshot", pool, image, false, move |img| {
            img.snap_remove(&snap)
        })
        .await
    }

    pub async fn snap_protect(&self, pool: &str, image: &str, snap: &str) -> Result<(), Error> {
        let snap = snap.to_string();
        self.with_image("protect snapshot", pool, image, false, move |img| {
            img.snap_protect(&snap)
        })
        .await
    }

    pub async fn snap_unprotect(&self, pool: &str, image: &str, snap: &str) -> Result<(), Error> {
        let snap = snap.to_string();
        self.with_image("unprotect snapshot", pool, image, false, move |img| {
            img.snap_unprotect(&snap)
        })
        .await
    }

    /// How many snapshots `pool/image` has, of every namespace (user, group, trash: what krbd
    /// counts against its limit of 510), read from its header without opening it (a format-1
    /// image is opened).
    ///
    /// # Errors
    /// Not found, Ceph errors.
    pub async fn snapshot_count(&self, pool: &str, image: &str) -> Result<usize, Error> {
        let op = "count snapshots";
        check_image_name(op, pool, image)?;
        let image = image.to_string();
        let target = format!("{pool}/{image}");
        self.with_pool(op, pool, target.clone(), move |io| {
            match crate::header::image_id(io, op, &target, &image) {
                Ok(id) => Ok(crate::header::snapshot_ids(io, op, &target, &id)?.len()),
                // format 1 (no ID object), or missing: librbd says which
                Err(e) if e.is_not_found() => Ok(io.open(&image, true)?.snap_entries_all()?.len()),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Every snapshot of `pool/image`, of every namespace, oldest first, with the name a
    /// trashed one had (one open of the image).
    ///
    /// # Errors
    /// Not found, Ceph errors.
    pub async fn snapshot_entries(&self, pool: &str, image: &str) -> Result<Vec<SnapEntry>, Error> {
        self.with_image("list snapshots", pool, image, true, |img| {
            img.snap_entries_all()
        })
        .await
    }

    pub async fn snap_list(&self, pool: &str, image: &str) -> Result<Vec<crate::SnapInfo>, Error> {
        self.with_image("list snapshots", pool, image, true, |img| img.snap_list())
            .await
    }

    /// Clones `pool/parent@snap` to `dest_pool/dest_name` in the clone format of this
    /// connection ([`Cluster::clone_format`]): v2 needs no protection; for v1 the snapshot is
    /// protected first (it then stays protected until it is removed: [`Cluster::snap_remove`]
    /// unprotects it, which librbd refuses while clones v1 of it remain).
    pub async fn clone_image(
        &self,
        pool: &str,
        parent: &str,
        snap: &str,
        dest_pool: &str,
        dest_name: &str,
        opts: &CreateOptions,
    ) -> Result<(), Error> {
        check_image_name("clone image", pool, parent)?;
        check_image_name("clone image", dest_pool, dest_name)?;
        let (pool_s, parent, snap, dest_pool, dest_name, opts) = (
            pool.to_string(),
            parent.to_string(),
            snap.to_string(),
            dest_pool.to_string(),
            dest_name.to_string(),
            opts.clone(),
        );
        let target = format!("{pool_s}/{parent}@{snap}");
        self.run("clone image", target, move |rados| {
            let src = rados.ioctx(&pool_s)?;
            let dst = rados.ioctx(&dest_pool)?;
            src.clone_image(&parent, &snap, &dst, &dest_name, &opts)
        })
        .await
    }

    /// The snapshot `pool/name` was cloned from, `None` if it is no clone (or was flattened).
    pub async fn parent(&self, pool: &str, name: &str) -> Result<Option<ParentSpec>, Error> {
        self.with_image("read image parent", pool, name, true, |img| img.parent())
            .await
    }

    /// Creates an (empty) group of images.
    pub async fn group_create(&self, pool: &str, group: &str) -> Result<(), Error> {
        let group = group.to_string();
        self.with_pool(
            "create group",
            pool,
            format!("{pool}/group:{group}"),
            move |io| io.group_create(&group),
        )
        .await
    }

    /// Removes a group (its images stay; its group snapshots go).
    pub async fn group_remove(&self, pool: &str, group: &str) -> Result<(), Error> {
        let group = group.to_string();
        self.with_pool(
            "remove group",
            pool,
            format!("{pool}/group:{group}"),
            move |io| io.group_remove(&group),
        )
        .await
    }

    /// Adds `image_pool/image` to the group `pool/group` (`add`), or removes it.
    pub async fn group_image(
        &self,
        pool: &str,
        group: &str,
        image_pool: &str,
        image: &str,
        add: bool,
    ) -> Result<(), Error> {
        check_image_name("group image", image_pool, image)?;
        let (group, image_pool, image) =
            (group.to_string(), image_pool.to_string(), image.to_string());
        let target = format!("{pool}/group:{group} {image_pool}/{image}");
        let pool = pool.to_string();
        self.run("group image", target, move |rados| {
            let group_io = rados.ioctx(&pool)?;
            let image_io = rados.ioctx(&image_pool)?;
            group_io.group_image(&group, &image_io, &image, add)
        })
        .await
    }

    /// Snapshots every image of the group at once (`create`), or removes that group snapshot.
    pub async fn group_snap(
        &self,
        pool: &str,
        group: &str,
        snap: &str,
        create: bool,
    ) -> Result<(), Error> {
        let (group, snap) = (group.to_string(), snap.to_string());
        let target = format!("{pool}/group:{group}@{snap}");
        self.with_pool("group snapshot", pool, target, move |io| {
            io.group_snap(&group, &snap, create)
        })
        .await
    }

    /// The group's snapshots.
    pub async fn group_snap_list(
        &self,
        pool: &str,
        group: &str,
    ) -> Result<Vec<GroupSnapInfo>, Error> {
        let group = group.to_string();
        let target = format!("{pool}/group:{group}");
        self.with_pool("list group snapshots", pool, target, move |io| {
            io.group_snap_list(&group)
        })
        .await
    }

    /// The snapshots `pool/image` carries for group snapshots.
    pub async fn image_group_snaps(
        &self,
        pool: &str,
        image: &str,
    ) -> Result<Vec<ImageGroupSnap>, Error> {
        self.with_image("list group snapshots of image", pool, image, true, |img| {
            img.group_snaps()
        })
        .await
    }

    /// The group `pool/image` belongs to, `(pool id, group name)`; `None` when in none.
    pub async fn image_group(
        &self,
        pool: &str,
        image: &str,
    ) -> Result<Option<(i64, String)>, Error> {
        self.with_image("read image group", pool, image, true, |img| img.group())
            .await
    }

    /// Copies `pool/image` as it was at the group snapshot `group@group_snap` (of a group in
    /// `pool`) to a new image `dest_pool/dest_name`: a full copy of the data (flattened, no
    /// parent), without snapshots. `NotFound` when the image carries no such group snapshot.
    ///
    /// This is how a group snapshot's member becomes cloneable on Ceph 16, where an image's
    /// group snapshot can be rolled back to but not cloned (`rbd_clone4` is Ceph 19's).
    #[allow(clippy::too_many_arguments)]
    pub async fn copy_group_snapshot(
        &self,
        pool: &str,
        image: &str,
        group: &str,
        group_snap: &str,
        dest_pool: &str,
        dest_name: &str,
        opts: &CreateOptions,
    ) -> Result<(), Error> {
        let op = "copy group snapshot";
        check_image_name(op, pool, image)?;
        check_image_name(op, dest_pool, dest_name)?;
        let (pool, image, group, group_snap, dest_pool, dest_name, opts) = (
            pool.to_string(),
            image.to_string(),
            group.to_string(),
            group_snap.to_string(),
            dest_pool.to_string(),
            dest_name.to_string(),
            opts.clone(),
        );
        let target =
            format!("{pool}/{image}@group:{group}@{group_snap} -> {dest_pool}/{dest_name}");
        self.run(op, target.clone(), move |rados| {
            let src = rados.ioctx(&pool)?;
            let dst = rados.ioctx(&dest_pool)?;
            let group_pool = src.pool_id();
            let img = src.open(&image, true)?;
            let snap = img
                .group_snaps()?
                .into_iter()
                .find(|s| {
                    s.group_pool == group_pool && s.group == group && s.group_snap == group_snap
                })
                .ok_or_else(|| Error::NotFound {
                    op,
                    target: target.clone(),
                })?;
            img.deep_copy_at(snap.id, &dst, &dest_name, &opts)
        })
        .await
    }

    /// Copies the parent's data into a clone so it no longer depends on it.
    pub async fn flatten(&self, pool: &str, name: &str) -> Result<(), Error> {
        // the flatten ends by detaching the clone from its parent (see `parent_turn`)
        let parent_guard = self.parent_turn("flatten image", pool, name).await?;
        self.with_image("flatten image", pool, name, false, move |img| {
            let _parent_guard = parent_guard;
            img.flatten()
        })
        .await
    }

    /// Moves an image to the pool's trash; it may not be removed for `delay`.
    pub async fn trash_move(&self, pool: &str, name: &str, delay: Duration) -> Result<(), Error> {
        check_image_name("move image to trash", pool, name)?;
        let name = name.to_string();
        self.with_pool(
            "move image to trash",
            pool,
            format!("{pool}/{name}"),
            move |io| io.trash_move(&name, delay.as_secs()),
        )
        .await
    }

    /// Whether librbd's remove moves images of `pool` to the RBD trash
    /// (`rbd_move_to_trash_on_remove`, set for the pool with `rbd config pool set` or for the
    /// client). Removals then leave images in the trash with the configured expiry
    /// ([`Cluster::remove_image_checked`]).
    pub async fn trash_on_remove(&self, pool: &str) -> Result<bool, Error> {
        let op = "read rbd_move_to_trash_on_remove";
        let target = pool.to_string();
        self.with_pool(op, pool, target.clone(), move |io| {
            crate::remove::trash_on_remove(io, op, &target)
        })
        .await
    }

    /// All metadata of the image with ID `id` (e.g. one in the trash), read from its header.
    pub async fn metadata_by_id(
        &self,
        pool: &str,
        id: &str,
    ) -> Result<BTreeMap<String, String>, Error> {
        let op = "list image metadata";
        let id = id.to_string();
        let target = format!("{pool}/<image id {id}>");
        self.with_pool(op, pool, target.clone(), move |io| {
            crate::header::metadata(io, op, &target, &id)
        })
        .await
    }

    pub async fn trash_list(&self, pool: &str) -> Result<Vec<crate::TrashEntry>, Error> {
        self.with_pool("list trash", pool, pool.to_string(), |io| io.trash_list())
            .await
    }

    pub async fn trash_restore(&self, pool: &str, id: &str, new_name: &str) -> Result<(), Error> {
        check_image_name("restore image from trash", pool, new_name)?;
        let (id, new_name) = (id.to_string(), new_name.to_string());
        self.with_pool(
            "restore image from trash",
            pool,
            format!("{pool}/{new_name}"),
            move |io| io.trash_restore(&id, &new_name),
        )
        .await
    }

    pub async fn trash_remove(&self, pool: &str, id: &str, force: bool) -> Result<(), Error> {
        let id = id.to_string();
        self.with_pool(
            "remove image from trash",
            pool,
            pool.to_string(),
            move |io| io.trash_remove(&id, force),
        )
        .await
    }

    /// Bytes and objects stored in a pool.
    pub async fn pool_stats(&self, pool: &str) -> Result<crate::PoolStats, Error> {
        self.with_pool("pool stats", pool, pool.to_string(), |io| io.pool_stats())
            .await
    }

    /// Raw capacity of the cluster.
    /// The cluster's fsid, as `ceph fsid` prints it (and krbd's sysfs `cluster_fsid` shows it).
    pub async fn fsid(&self) -> Result<String, Error> {
        self.run("read cluster fsid", self.monitors.clone(), |rados| {
            rados.fsid()
        })
        .await
    }

    /// Sends one monitor command in its JSON form (e.g. `{"prefix": "osd blocklist ls",
    /// "format": "json"}`) and returns its output buffer and status string.
    ///
    /// # Errors
    /// The monitor's refusal as an error for `op` (an `EINVAL` as [`Error::InvalidArgument`]
    /// whose reason is the monitor's status text, e.g. an unknown command); Ceph errors; a
    /// timeout (monitor commands end at `rados_mon_op_timeout`).
    pub async fn mon_command(&self, op: &'static str, command: &str) -> Result<MonReply, Error> {
        let command = command.to_string();
        let target = self.monitors.clone();
        self.run(op, self.monitors.clone(), move |rados| {
            let (rc, out, status) = rados.mon_command(&command)?;
            if rc == -libc::EINVAL {
                return Err(Error::invalid(op, target, status.trim().to_string()));
            }
            if rc < 0 {
                return Err(Error::from_errno(rc, op, target));
            }
            Ok(MonReply { out, status })
        })
        .await
    }

    /// The global ID of this connection's client instance (`client.<id>`, as watchers and
    /// lockers name it).
    pub async fn instance_id(&self) -> Result<u64, Error> {
        self.run("read instance id", self.monitors.clone(), |rados| {
            Ok(rados.instance_id())
        })
        .await
    }

    /// Breaks the holder `client` (`client.<id>`, with `cookie`) out of the image's `rbd_lock`,
    /// as `rbd lock rm` does. librbd blocklists the holder first (`rbd_blocklist_on_break_lock`,
    /// on by default, for `rbd_blocklist_expire_seconds`, by default the monitors' one hour):
    /// a caller that wants a longer blocklisting adds it again afterwards.
    ///
    /// # Errors
    /// `NotFound` when the image or that holder is gone; Ceph errors.
    pub async fn break_lock(
        &self,
        pool: &str,
        name: &str,
        client: &str,
        cookie: &str,
    ) -> Result<(), Error> {
        let (client, cookie) = (client.to_string(), cookie.to_string());
        self.with_image("break lock", pool, name, true, move |img| {
            img.break_lock(&client, &cookie)
        })
        .await
    }

    pub async fn cluster_stats(&self) -> Result<crate::ClusterStats, Error> {
        self.run("cluster stats", self.monitors.clone(), |rados| {
            rados.cluster_stats()
        })
        .await
    }
}

/// A connection to the unit-test binary's micro-ceph, as `client.admin`.
#[cfg(test)]
pub(crate) async fn test_cluster() -> std::sync::Arc<Cluster> {
    let c = micro_ceph::cluster();
    let config = crate::ClusterConfig::new(
        c.monitors.clone(),
        "admin",
        crate::Secret::new(c.admin_key.clone()),
    );
    crate::ConnectionPool::new(crate::PoolOptions::default())
        .get(&config)
        .await
        .expect("connecting to the test cluster")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_are_checked_before_any_call() {
        assert!(check_image_name("x", "rbd", "ok-name_1.2").is_ok());
        let e = check_image_name("create image", "rbd", "a/b").unwrap_err();
        assert!(e.to_string().contains("may not contain '/'"), "{e}");
        assert!(check_image_name("x", "rbd", "a@b").is_err());
        assert!(check_image_name("x", "rbd", "").is_err());
        assert!(check_image_name("x", "", "img").is_err());
    }
}
