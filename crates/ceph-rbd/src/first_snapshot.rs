//! A snapshot of an image nobody has open, taken with RADOS calls: the first snapshot of an
//! image this client has just made, and (under librbd's exclusive lock, [`take`]) the temporary
//! snapshot of a snapshot's source.
//!
//! librbd takes a snapshot on an open image: the open (an `ImageCtx` with its own copy of the
//! whole configuration, a watch on the header), the exclusive lock and the object map's lock
//! acquired and released, a refresh: about a third of the client CPU of a CSI snapshot, for an
//! image (a snapshot image, cloned a moment earlier) that no one else has ever opened. On such
//! an image, the snapshot is the writes librbd's `SnapshotCreateRequest` makes, in its order:
//!
//! 1. a snapshot ID from the pool (a self-managed snapshot, as librbd allocates);
//! 2. the `rbd` class's `snapshot_add` on the header: name, ID, user namespace (the class
//!    records the size, parent overlap and flags; `ESTALE`: the header has seen a newer ID,
//!    another is taken; `EEXIST`: the name is taken, the ID is released);
//! 3. with object-map: the head's object map copied to the snapshot's
//!    (`rbd_object_map.<id>.<snap id, 16 hex digits>`), read before step 2 as it is unchanged
//!    while nobody writes, then with fast-diff `object_map_snap_add` on the head's map;
//! 4. a header-update notification.
//!
//! A crash between 2 and 3 leaves a snapshot without its object map, as one of librbd would:
//! librbd then reads that snapshot without the map. An image somebody watches (open or mapped
//! somewhere) or with a feature whose snapshot librbd does more for (journaling, a separate data
//! pool, migration, a mirroring non-primary image) is left to librbd: [`Taken::LeftToLibrbd`].

use crate::cls_lock;
use crate::error::Error;
use crate::features::Features;
use crate::header::{NOSNAP, object_map_name};
use crate::raw::{IoCtx, Watch, WriteStep};

static TAKEN_PLAIN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many snapshots this process took without librbd (see the `first_snapshot` module).
pub fn snapshots_without_librbd() -> u64 {
    TAKEN_PLAIN.load(std::sync::atomic::Ordering::Relaxed)
}

/// What [`take`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// The snapshot exists now, with this ID.
    Snapshot(u64),
    /// Nothing: the image is watched or has a feature only librbd handles; take it with librbd.
    LeftToLibrbd,
}

/// Whether [`take`] holds librbd's exclusive lock while it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Under {
    /// No lock: an image this client has just made, whose name nobody else has seen used.
    Nothing,
    /// An image somebody else may open meanwhile (a snapshot's source).
    ExclusiveLock,
}

/// Features whose snapshot is the steps above; anything else goes to librbd.
pub(crate) const HANDLED: Features = Features::from_bits(
    Features::LAYERING.bits()
        | Features::STRIPINGV2.bits()
        | Features::EXCLUSIVE_LOCK.bits()
        | Features::OBJECT_MAP.bits()
        | Features::FAST_DIFF.bits()
        | Features::DEEP_FLATTEN.bits()
        // set with the operation features a clone v2 child carries
        | Features::OPERATIONS.bits(),
);

/// How long the header-update notifications wait for a watcher's answer (librbd's default
/// notification timeout).
pub(crate) const NOTIFY_TIMEOUT_MS: u64 = 5000;

/// librbd's exclusive lock on an image's header (`RBD_LOCK_NAME`), the tag it and the kernel
/// client give it, and the prefix of its cookie, followed by the owner's watch handle.
const RBD_LOCK: &str = "rbd_lock";
const RBD_LOCK_TAG: &str = "internal";
const RBD_LOCK_COOKIE_PREFIX: &str = "auto";

/// `snapshot_add`'s input: name, ID, and the user snapshot namespace (a versioned
/// `SnapshotNamespace`: version 1, compatible 1, length 4, namespace type 0 = user).
fn snapshot_add_input(name: &str, snap_id: u64) -> Vec<u8> {
    let mut input = Vec::new();
    crate::denc::put_bytes(&mut input, name.as_bytes());
    input.extend_from_slice(&snap_id.to_le_bytes());
    input.extend_from_slice(&[1, 1]);
    input.extend_from_slice(&4u32.to_le_bytes());
    input.extend_from_slice(&0u32.to_le_bytes());
    input
}

/// Steps 1 to 3 of the module's text on the image whose ID is `id`, with `features`; with
/// `lock` (librbd's exclusive lock held: its cookie), the header write asserts it, as librbd's
/// does. Nothing is written when the head's object map is missing or unreadable (librbd's to
/// rebuild or flag): [`Taken::LeftToLibrbd`].
fn snapshot_steps(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    features: Features,
    snap: &str,
    lock: Option<&str>,
) -> Result<Taken, Error> {
    let header = format!("rbd_header.{id}");
    let head_map = if features.contains(Features::OBJECT_MAP) {
        let name = object_map_name(id, NOSNAP);
        match io.exec(op, target, &name, "rbd", "object_map_load", &[]) {
            Ok(map) => Some(map),
            Err(e) if e.is_not_found() || matches!(e, Error::InvalidArgument { .. }) => {
                return Ok(Taken::LeftToLibrbd);
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let snap_id = add_to_header(io, op, target, &header, snap, lock)?;
    if let Some(map) = head_map {
        io.write_op(
            op,
            target,
            &object_map_name(id, snap_id),
            &[WriteStep::rbd("object_map_save", &map)],
        )?;
        if features.contains(Features::FAST_DIFF) {
            io.write_op(
                op,
                target,
                &object_map_name(id, NOSNAP),
                &[WriteStep::rbd("object_map_snap_add", &[])],
            )?;
        }
    }
    Ok(Taken::Snapshot(snap_id))
}

/// Takes snapshot `snap` of the format-2 image whose ID is `id` (`target` names it in errors)
/// with RADOS calls when nobody has the image open: what librbd does on an image only it has
/// open, without building an image context (whose read of the header reads every snapshot the
/// image has, four object-class calls each). In order:
///
/// 1. with [`Under::ExclusiveLock`], a watch on the header, and `rbd_lock` locked exclusively
///    with librbd's tag and a cookie naming the watch (`auto <handle>`), as librbd and the
///    kernel client lock it: whoever opens the image now sees a live owner and asks it for the
///    lock (answered with nothing, they retry) instead of breaking it; taken by somebody
///    already (`EBUSY`): left to librbd;
/// 2. nobody but this client answers a header-update notification (anyone who does has the
///    image open: librbd's snapshot quiesces them and asks the lock's owner for it); under
///    the lock, the answer holds until step 4;
/// 3. the snapshot's steps (module text), the header write asserting the lock if held;
/// 4. a header-update notification for anyone who opened it meanwhile, then (with the lock)
///    unlocked and unwatched: the notification goes first, so that a client waiting for the
///    lock has the new snapshot context before it can write.
///
/// # Errors
/// `AlreadyExists` when a snapshot of that name exists, Ceph errors.
pub(crate) fn take(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    snap: &str,
    under: Under,
) -> Result<Taken, Error> {
    if crate::librbd_only::librbd_only() {
        return Ok(Taken::LeftToLibrbd);
    }
    if let Some(why) = io.compat().refuses(crate::compat::FastPath::Snapshot) {
        tracing::debug!(image = %target, why, "snapshot through librbd");
        return Ok(Taken::LeftToLibrbd);
    }
    let header = format!("rbd_header.{id}");
    let features = crate::header::features(io, op, target, id)?;
    if features.bits() & !HANDLED.bits() != 0 {
        return Ok(Taken::LeftToLibrbd);
    }
    // An empty notification is the header update librbd and the kernel client acknowledge:
    // whoever answers has the image open, and librbd's snapshot quiesces and locks for them.
    // Under the lock, the probe comes after the lock is taken, so that its answer holds until
    // the snapshot is written: a client that opens the image after it finds the lock owned
    // and waits (librbd and krbd ask the owner, and retry) until the lock goes.
    if under == Under::Nothing && io.notify_watchers(op, target, &header, NOTIFY_TIMEOUT_MS)? > 0 {
        return Ok(Taken::LeftToLibrbd);
    }
    let lock = if under == Under::ExclusiveLock {
        let Some(lock) = ExclusiveLock::take(io, op, target, &header)? else {
            return Ok(Taken::LeftToLibrbd);
        };
        if lock.others_watch()? {
            lock.release()?;
            return Ok(Taken::LeftToLibrbd);
        }
        crate::steps::hit(crate::steps::SNAPSHOT_LOCKED, target);
        Some(lock)
    } else {
        None
    };
    let cookie = lock.as_ref().map(|lock| lock.cookie.as_str());
    let taken = snapshot_steps(io, op, target, id, features, snap, cookie);
    // The header-update notification goes out while the lock (and its watch) is still held,
    // as librbd notifies before its snapshot completes: a client that opened or mapped the
    // image meanwhile re-reads the header, and with it the new snapshot context, before it
    // can take the lock and write. Notified after the unlock, it could write with its old
    // context first, and the OSDs would keep no copy for the snapshot: not point-in-time.
    let notified = match &taken {
        Ok(Taken::Snapshot(_)) => io
            .notify_watchers(op, target, &header, NOTIFY_TIMEOUT_MS)
            .map(drop),
        _ => Ok(()),
    };
    let locked = lock.is_some();
    let released = lock.map_or(Ok(()), ExclusiveLock::release);
    if locked {
        crate::steps::hit(crate::steps::SNAPSHOT_UNLOCKED, target);
    }
    let taken = taken?;
    notified?;
    released?;
    if matches!(taken, Taken::Snapshot(_)) {
        TAKEN_PLAIN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(taken)
}

/// librbd's exclusive lock on an image's header, held by this client as librbd holds it: the
/// lock with a cookie naming a watch this client keeps on the header meanwhile.
pub(crate) struct ExclusiveLock<'a> {
    io: &'a IoCtx<'a>,
    op: &'static str,
    target: &'a str,
    header: &'a str,
    cookie: String,
    /// `None` once released.
    watch: Option<Watch<'a>>,
}

impl<'a> ExclusiveLock<'a> {
    /// Watches `header` and locks it; `None` (and no watch) when somebody holds the lock.
    pub(crate) fn take(
        io: &'a IoCtx<'a>,
        op: &'static str,
        target: &'a str,
        header: &'a str,
    ) -> Result<Option<ExclusiveLock<'a>>, Error> {
        let watch = io.watch(op, target, header)?;
        let cookie = format!("{RBD_LOCK_COOKIE_PREFIX} {}", watch.handle());
        let lock = cls_lock::lock(RBD_LOCK, &cookie, RBD_LOCK_TAG, "", 0);
        let locked = io.write_op(op, target, header, &[WriteStep::lock("lock", &lock)]);
        match locked {
            Ok(()) => Ok(Some(ExclusiveLock {
                io,
                op,
                target,
                header,
                cookie,
                watch: Some(watch),
            })),
            Err(Error::Busy { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether a client other than this one watches the header: more than one watcher (this
    /// lock's own watch among them) answers a header-update notification.
    pub(crate) fn others_watch(&self) -> Result<bool, Error> {
        let watchers =
            self.io
                .notify_watchers(self.op, self.target, self.header, NOTIFY_TIMEOUT_MS)?;
        Ok(watchers > 1)
    }

    /// Unwatches without unlocking: for a header that was removed, and its lock with it.
    pub(crate) fn forget(mut self) {
        self.watch.take();
    }

    /// Unlocks, then unwatches: in this order, as a lock whose owner no longer watches is one
    /// the next client breaks (blocklisting this client). The unlock is retried once (a
    /// timeout); the watch goes either way.
    pub(crate) fn release(mut self) -> Result<(), Error> {
        self.unlock()
    }

    fn unlock(&mut self) -> Result<(), Error> {
        let Some(watch) = self.watch.take() else {
            return Ok(());
        };
        let unlock = cls_lock::unlock(RBD_LOCK, &self.cookie);
        let step = [WriteStep::lock("unlock", &unlock)];
        let unlocked = self
            .io
            .write_op(self.op, self.target, self.header, &step)
            .or_else(|_| self.io.write_op(self.op, self.target, self.header, &step));
        drop(watch);
        unlocked
    }
}

impl Drop for ExclusiveLock<'_> {
    /// Released on every path out, an error or a panic included.
    fn drop(&mut self) {
        if let Err(e) = self.unlock() {
            tracing::warn!(target = self.target, error = %e, "releasing an image's exclusive lock failed");
        }
    }
}

/// Steps 1 and 2: a snapshot ID, recorded on the header under `snap`; the ID is released
/// when the header refuses it.
fn add_to_header(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    header: &str,
    snap: &str,
    lock: Option<&str>,
) -> Result<u64, Error> {
    let assert = lock.map(|cookie| cls_lock::assert_locked(RBD_LOCK, cookie, RBD_LOCK_TAG));
    let mut attempts = 0;
    loop {
        attempts += 1;
        let snap_id = io.selfmanaged_snap_create(op, target)?;
        let input = snapshot_add_input(snap, snap_id);
        let mut steps = Vec::with_capacity(2);
        if let Some(assert) = &assert {
            steps.push(WriteStep::lock("assert_locked", assert));
        }
        steps.push(WriteStep::rbd("snapshot_add", &input));
        let added = io.write_op(op, target, header, &steps);
        match added {
            Ok(()) => return Ok(snap_id),
            Err(e) => {
                if let Err(release) = io.selfmanaged_snap_remove(op, target, snap_id) {
                    tracing::warn!(target, snap_id, error = %release, "releasing an unused snapshot ID failed");
                }
                // ESTALE: the header has a newer snapshot sequence than this ID
                let stale = matches!(e, Error::Other { errno, .. } if errno == libc::ESTALE);
                if !stale || attempts == 3 {
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_add_input_is_name_id_and_user_namespace() {
        assert_eq!(
            snapshot_add_input("s", 0x0102),
            [
                1, 0, 0, 0, b's', // name
                2, 1, 0, 0, 0, 0, 0, 0, // ID
                1, 1, 4, 0, 0, 0, 0, 0, 0, 0, // namespace: v1, compat 1, 4 bytes, user
            ]
        );
    }

    /// Against the test binary's micro-ceph, with data written (so the head's object map has
    /// objects that exist): an image somebody has open is left to librbd; one nobody has open
    /// gets a snapshot whose object map `rbd object-map check` finds valid, fast-diff sees no
    /// change since it, librbd lists it; a second of that name is refused, its ID released.
    #[tokio::test]
    async fn a_watched_image_is_left_to_librbd_and_an_unwatched_one_gets_a_snapshot_librbd_reads() {
        let c = micro_ceph::cluster();
        let cluster = crate::cluster::test_cluster().await;
        let (pool, image, spec) = image_with_data(&cluster, "first-snap").await;
        let take_now = |snap: &'static str| take_by(&cluster, &pool, &image, snap, Under::Nothing);

        let holder = micro_ceph::ImageHolder::open(c, &pool, &image).unwrap();
        assert_eq!(take_now("s1").await.unwrap(), Taken::LeftToLibrbd);
        drop(holder);
        let Taken::Snapshot(snap_id) = take_now("s1").await.unwrap() else {
            panic!("an image nobody watches is left to librbd");
        };
        let listed = cluster.snap_list(&pool, &image).await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|s| (s.id, s.name.as_str(), s.size))
                .collect::<Vec<_>>(),
            [(snap_id, "s1", 16 << 20)]
        );
        maps_valid_and_unchanged_since(c, &spec, "s1");
        let since_creation = c
            .rbd(&["diff", "--format", "json", &format!("{spec}@s1")])
            .unwrap();
        assert_ne!(
            since_creation.trim(),
            "[]",
            "the data written is in the snapshot"
        );

        let again = take_now("s1").await.unwrap_err();
        assert!(again.is_already_exists(), "{again}");
        assert_eq!(cluster.snap_list(&pool, &image).await.unwrap().len(), 1);
        cluster.snap_remove(&pool, &image, "s1").await.unwrap();
        cluster.remove_image(&pool, &image).await.unwrap();
    }

    /// A new 16 MiB image with exclusive-lock, object-map and fast-diff, 8 MiB written (so the
    /// head's object map has objects that exist): pool, image, `pool/image`.
    async fn image_with_data(
        cluster: &std::sync::Arc<crate::Cluster>,
        prefix: &str,
    ) -> (String, String, String) {
        let c = micro_ceph::cluster();
        let (pool, image) = (c.pool.clone(), format!("{prefix}-{}", std::process::id()));
        let spec = format!("{pool}/{image}");
        let options = crate::CreateOptions {
            features: Some(
                Features::LAYERING
                    | Features::EXCLUSIVE_LOCK
                    | Features::OBJECT_MAP
                    | Features::FAST_DIFF
                    | Features::DEEP_FLATTEN,
            ),
            ..crate::CreateOptions::default()
        };
        cluster
            .create_image(&pool, &image, 16 << 20, &options)
            .await
            .unwrap();
        c.rbd(&[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "64K",
            "--io-total",
            "8M",
            &spec,
        ])
        .unwrap();
        (pool, image, spec)
    }

    /// [`take`] of snapshot `snap` of `pool/image`.
    async fn take_by(
        cluster: &std::sync::Arc<crate::Cluster>,
        pool: &str,
        image: &str,
        snap: &'static str,
        under: Under,
    ) -> Result<Taken, Error> {
        let (image, target) = (image.to_owned(), format!("{pool}/{image}"));
        cluster
            .with_pool("snap test", pool, target.clone(), move |io| {
                let id = crate::header::image_id(io, "snap test", &target, &image)?;
                take(io, "snap test", &target, &id, snap, under)
            })
            .await
    }

    /// The object maps of `spec@snap` and of the head are valid (`check` flags an invalid
    /// one, so the flags are read after it), and fast-diff sees no change since `snap` (the
    /// head's objects were marked clean at the snapshot).
    fn maps_valid_and_unchanged_since(c: &micro_ceph::MicroCeph, spec: &str, snap: &str) {
        for at in [format!("{spec}@{snap}"), spec.to_owned()] {
            c.rbd(&["object-map", "check", &at]).unwrap();
            let info = c.rbd(&["info", "--format", "json", &at]).unwrap();
            assert!(info.contains("\"flags\":[]"), "{at}: {info}");
        }
        let diff = c
            .rbd(&[
                "diff",
                "--whole-object",
                "--format",
                "json",
                "--from-snap",
                snap,
                spec,
            ])
            .unwrap();
        assert_eq!(diff.trim(), "[]", "fast-diff: nothing changed since {snap}");
    }

    /// A child process killed and reaped however the test ends.
    struct Reaped(std::process::Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Point-in-time under the lock: a librbd client that opens the source after the watcher
    /// probe (while the lock is held, before the snapshot is written) and writes a marker
    /// waits for the lock; the header-update notification reaches it before the lock is
    /// released, so it writes with the new snapshot context and the OSDs keep the snapshot's
    /// copy. The pause after the release gives the writer every chance to write before
    /// anything else happens: notified only after the release (as this code once did), its
    /// write lands inside the snapshot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_opens_the_source_under_the_lock_writes_after_the_snapshot() {
        use std::io::BufRead;
        use std::sync::mpsc;
        use std::sync::{Arc, Mutex};
        use std::time::Duration;
        const MARKER: &str = "written-after-the-snapshot";
        let c = micro_ceph::cluster();
        let cluster = crate::cluster::test_cluster().await;
        let (pool, image, spec) = image_with_data(&cluster, "pit-snap").await;

        let (at_tx, at_rx) = mpsc::channel::<&'static str>();
        let (resume_tx, resume_rx) = mpsc::channel::<()>();
        let resume_rx = Mutex::new(resume_rx);
        let paused = spec.clone();
        let _hook = crate::steps::install(Arc::new(move |step, target| {
            if target == paused
                && (step == crate::steps::SNAPSHOT_LOCKED
                    || step == crate::steps::SNAPSHOT_UNLOCKED)
            {
                at_tx.send(step).unwrap();
                resume_rx
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(120))
                    .unwrap();
            }
        }));
        let taking = {
            let (cluster, pool, image) = (Arc::clone(&cluster), pool.clone(), image.clone());
            tokio::spawn(async move {
                take_by(&cluster, &pool, &image, "s1", Under::ExclusiveLock).await
            })
        };
        let (writer_pool, writer_image) = (pool.clone(), image.clone());
        tokio::task::spawn_blocking(move || {
            let wait = Duration::from_secs(60);
            assert_eq!(
                at_rx.recv_timeout(wait).unwrap(),
                crate::steps::SNAPSHOT_LOCKED
            );
            let mut writer = Reaped(
                std::process::Command::new("/usr/bin/python3")
                    .args(["-c", WRITER])
                    .arg(&c.conf_path)
                    .args([&writer_pool, &writer_image, MARKER])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            let (lines_tx, lines) = mpsc::channel();
            let stdout = writer.0.stdout.take().unwrap();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let _ = lines_tx.send(line.unwrap_or_default());
                }
            });
            assert_eq!(lines.recv_timeout(wait).unwrap(), "opened");
            resume_tx.send(()).unwrap();
            assert_eq!(
                at_rx.recv_timeout(wait).unwrap(),
                crate::steps::SNAPSHOT_UNLOCKED
            );
            assert_eq!(
                lines.recv_timeout(wait).unwrap(),
                "written",
                "the writer wrote once the lock was released"
            );
            resume_tx.send(()).unwrap();
            assert!(writer.0.wait().unwrap().success());
        })
        .await
        .unwrap();
        let taken = taking.await.unwrap().unwrap();
        assert!(matches!(taken, Taken::Snapshot(_)), "{taken:?}");

        let head = read_at(c, &pool, &image, None, MARKER.len());
        assert_eq!(head, MARKER, "the head has the write");
        let snap = read_at(c, &pool, &image, Some("s1"), MARKER.len());
        assert_ne!(snap, MARKER, "the write made after the snapshot is in it");
        c.rbd(&["object-map", "check", &format!("{spec}@s1")])
            .unwrap();
        cluster.snap_remove(&pool, &image, "s1").await.unwrap();
        cluster.remove_image(&pool, &image).await.unwrap();
    }

    /// A librbd client (python-rbd): opens `pool/image`, says `opened`, writes its marker at
    /// offset 0, says `written`.
    const WRITER: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    print('opened', flush=True)
    img.write(sys.argv[4].encode(), 0)
    print('written', flush=True)
io.close(); c.shutdown()
";

    /// `len` bytes at offset 0 of `pool/image` (at `snap`), read by python-rbd.
    fn read_at(
        c: &micro_ceph::MicroCeph,
        pool: &str,
        image: &str,
        snap: Option<&str>,
        len: usize,
    ) -> String {
        const READ: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
snap = sys.argv[4] or None
with rbd.Image(io, sys.argv[3], snapshot=snap, read_only=True) as img:
    sys.stdout.write(img.read(0, int(sys.argv[5])).decode('latin1'))
io.close(); c.shutdown()
";
        let out = std::process::Command::new("/usr/bin/python3")
            .args(["-c", READ])
            .arg(&c.conf_path)
            .args([pool, image, snap.unwrap_or(""), &len.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// librbd's exclusive lock as [`take`] holds it: a separate librbd client that
    /// writes meanwhile sees a live owner and waits (it neither breaks the lock nor blocklists
    /// this client), and writes once it is released; a lock somebody else holds, or a watcher,
    /// leaves the snapshot to librbd; the snapshot taken under the lock is one librbd reads,
    /// with valid object maps, and no lock or watch is left behind.
    #[tokio::test]
    async fn a_writer_waits_for_the_header_lock_and_a_held_lock_or_a_watcher_leaves_it_to_librbd() {
        use std::time::{Duration, Instant};
        let c = micro_ceph::cluster();
        let cluster = crate::cluster::test_cluster().await;
        let (pool, image, spec) = image_with_data(&cluster, "locked-snap").await;

        let (lock_c, lock_target, lock_image) = (c, spec.clone(), image.clone());
        cluster
            .with_pool("lock test", &pool, spec.clone(), move |io| {
                let id = crate::header::image_id(io, "lock test", &lock_target, &lock_image)?;
                let header = format!("rbd_header.{id}");
                let lock = ExclusiveLock::take(io, "lock test", &lock_target, &header)?
                    .expect("nobody holds the lock");
                // a second holder is refused while it is held
                assert!(
                    ExclusiveLock::take(io, "lock test", &lock_target, &header)?.is_none(),
                    "the lock is exclusive"
                );
                let mut writer = Reaped(
                    lock_c
                        .cli("rbd")
                        .args(["bench", "--io-type", "write", "--io-size", "4K"])
                        .args(["--io-total", "4K", "--io-threads", "1", &lock_target])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .unwrap(),
                );
                // the writer asks for the lock (answered with nothing) and keeps asking; it
                // must not get it, nor break it, while it is held
                let held = Instant::now();
                while held.elapsed() < Duration::from_secs(3) {
                    assert!(
                        writer.0.try_wait().unwrap().is_none(),
                        "a writer finished while the lock was held"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                let blocklist = lock_c
                    .cli("ceph")
                    .args(["osd", "blocklist", "ls"])
                    .output()
                    .unwrap();
                let blocklist = String::from_utf8_lossy(&blocklist.stdout);
                assert!(
                    !blocklist.contains(':'),
                    "a client was blocklisted: {blocklist}"
                );
                lock.release()?;
                let released = Instant::now();
                let status = loop {
                    if let Some(status) = writer.0.try_wait().unwrap() {
                        break status;
                    }
                    assert!(
                        released.elapsed() < Duration::from_secs(60),
                        "the writer did not write after the release"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                };
                assert!(status.success(), "the writer failed");
                Ok(())
            })
            .await
            .unwrap();

        let take_now =
            |snap: &'static str| take_by(&cluster, &pool, &image, snap, Under::ExclusiveLock);
        // watched: librbd's
        let holder = micro_ceph::ImageHolder::open(c, &pool, &image).unwrap();
        assert_eq!(take_now("s1").await.unwrap(), Taken::LeftToLibrbd);
        drop(holder);
        // locked by somebody else (an advisory lock of the same name): librbd's
        c.rbd(&["lock", "add", &spec, "someone"]).unwrap();
        assert_eq!(take_now("s1").await.unwrap(), Taken::LeftToLibrbd);
        let lockers = c.rbd(&["lock", "ls", "--format", "json", &spec]).unwrap();
        let locker = lockers
            .split('"')
            .skip_while(|s| *s != "locker")
            .nth(2)
            .expect("a locker")
            .to_string();
        c.rbd(&["lock", "rm", &spec, "someone", &locker]).unwrap();

        let Taken::Snapshot(snap_id) = take_now("s1").await.unwrap() else {
            panic!("an image nobody watches or locks is left to librbd");
        };
        let listed = cluster.snap_list(&pool, &image).await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|s| (s.id, s.name.as_str()))
                .collect::<Vec<_>>(),
            [(snap_id, "s1")]
        );
        maps_valid_and_unchanged_since(c, &spec, "s1");
        // no lock and no watch left
        let lockers = c.rbd(&["lock", "ls", "--format", "json", &spec]).unwrap();
        assert!(!lockers.contains("locker"), "{lockers}");
        let status = c.rbd(&["status", "--format", "json", &spec]).unwrap();
        assert!(status.contains("\"watchers\":[]"), "{status}");
        // the name again: refused, nothing added, nothing held
        let again = take_now("s1").await.unwrap_err();
        assert!(again.is_already_exists(), "{again}");
        assert_eq!(cluster.snap_list(&pool, &image).await.unwrap().len(), 1);
        let lockers = c.rbd(&["lock", "ls", "--format", "json", &spec]).unwrap();
        assert!(!lockers.contains("locker"), "{lockers}");
        cluster.snap_remove(&pool, &image, "s1").await.unwrap();
        cluster.remove_image(&pool, &image).await.unwrap();
    }
}
