//! Snapshots, restores and clones whose flatten outlasts one attempt, and a restore whose
//! snapshot went to the trash between a crashed attempt and its retry, against a private Ceph
//! cluster: the retry converges and the owner can delete the image.
//!
//! The flatten is made to outlast the attempt for real: the first attempt runs on a connection
//! with a 1 s operation timeout (its calls give up after 3 s) and the image is 4 GiB of 4 KiB
//! objects, whose flatten takes librbd several seconds (about 5 s per 4 GiB on an idle test
//! machine). librbd goes on flattening after the attempt gave up, as it does after a CSI
//! deadline. Each test checks that the owner record is on the image while the flatten runs,
//! waits for librbd to finish it, then retries on an ordinary connection (repeated while this
//! process still answers `InProgress`, up to a deadline).

use std::future::Future;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};
use rbd_volume::snapshot::{META_DEPTH, META_SNAPSHOT, snapshot_image_name};
use rbd_volume::{
    Claimant, Deleted, Ensured, Error, Fit, Hooks, META_PV, NewClone, NewImage, NewSnapshot,
    Outcome, Owner, Snapshot, SnapshotDeleted, SnapshotError, SnapshotOwner, Source,
};

const MIB: u64 = 1 << 20;
/// Large and of small objects: a flatten takes librbd seconds.
const LARGE: u64 = 4 << 30;
const SMALL_OBJECTS: u64 = 4096;
const DRIVER: &str = "rbd.provisioner.ceph.io";
/// How long a retry may wait for the flatten the first attempt left running.
const CONVERGE_WITHIN: Duration = Duration::from_secs(300);

async fn connect(op_timeout: Duration) -> Arc<ceph_rbd::Cluster> {
    let ceph = micro_ceph::cluster();
    // a pool of its own: the impatient connection is never the ordinary one
    let pool = ConnectionPool::new(PoolOptions::default());
    pool.get(
        &ClusterConfig::new(&ceph.monitors, "admin", Secret::new(ceph.admin_key.clone()))
            .with_op_timeout(op_timeout),
    )
    .await
    .unwrap()
}

async fn cluster() -> Arc<ceph_rbd::Cluster> {
    connect(Duration::from_secs(60)).await
}

/// A connection whose calls give up after 3 s (1 s operation timeout + 2 s).
async fn impatient_cluster() -> Arc<ceph_rbd::Cluster> {
    connect(Duration::from_secs(1)).await
}

fn pool() -> &'static str {
    &micro_ceph::cluster().pool
}

const IO: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    if sys.argv[4] == 'w':
        img.write(sys.argv[5].encode(), 0)
    else:
        sys.stdout.write(img.read(0, int(sys.argv[5])).decode('latin1'))
io.close(); c.shutdown()
";

/// Runs python-rbd (librbd, not our code) on `image`: `w` writes `arg` at offset 0, `r` reads
/// `arg` bytes there.
fn python_io(image: &str, op: &str, arg: &str) -> String {
    let ceph = micro_ceph::cluster();
    let out = Command::new("/usr/bin/python3")
        .args(["-c", IO])
        .arg(&ceph.conf_path)
        .arg(&ceph.pool)
        .arg(image)
        .arg(op)
        .arg(arg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python-rbd {op} {image}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn read(image: &str, len: usize) -> String {
    python_io(image, "r", &len.to_string())
}

fn owner(pv: &str) -> Owner {
    Owner {
        pv: pv.into(),
        claim: format!("ns/{pv}"),
        provisioner: DRIVER.into(),
        kube_cluster: "uid-a".into(),
    }
}

fn volume_id(image: &str) -> String {
    format!("v1/{}/{}/{image}", micro_ceph::cluster().monitors, pool())
}

fn snapshot_owner(source: &str, name: &str) -> SnapshotOwner {
    SnapshotOwner {
        name: name.into(),
        source: volume_id(source),
        driver: DRIVER.into(),
        kube_cluster: "uid-a".into(),
    }
}

async fn snapshot(
    cluster: &ceph_rbd::Cluster,
    source: &str,
    name: &str,
) -> Result<Snapshot, SnapshotError> {
    rbd_volume::create_snapshot(
        cluster,
        &NewSnapshot {
            pool: pool(),
            source_image: source,
            image: &snapshot_image_name(name),
            owner: &snapshot_owner(source, name),
        },
    )
    .await
}

async fn clone(
    cluster: &ceph_rbd::Cluster,
    image: &str,
    size: u64,
    source: Source<'_>,
    source_id: &str,
) -> Result<Ensured, SnapshotError> {
    rbd_volume::clone_volume(
        cluster,
        &NewClone {
            pool: pool(),
            image,
            size,
            options: &CreateOptions::default(),
            owner: &owner(image),
            fit: Fit::Within {
                required: size,
                limit: 0,
            },
            source,
            source_id,
            driver: DRIVER,
        },
    )
    .await
}

async fn restore(
    cluster: &ceph_rbd::Cluster,
    image: &str,
    size: u64,
    snap: &str,
) -> Result<Ensured, SnapshotError> {
    clone(
        cluster,
        image,
        size,
        Source::Snapshot {
            pool: pool(),
            image: snap,
        },
        &format!("snapshot {snap}"),
    )
    .await
}

async fn delete_volume(cluster: &ceph_rbd::Cluster, image: &str) -> Deleted {
    rbd_volume::delete_volume(
        cluster,
        pool(),
        image,
        &Claimant::volume(image).in_kube_cluster("uid-a"),
        &Hooks::default(),
    )
    .await
    .unwrap()
}

fn in_progress(e: &SnapshotError) -> bool {
    matches!(
        e,
        SnapshotError::Volume(Error::Ceph(ceph_rbd::Error::InProgress { .. }))
    )
}

/// Repeats `attempt` while the flatten an earlier attempt left running makes it answer
/// `InProgress`, up to [`CONVERGE_WITHIN`]; any other error fails the test.
async fn retry_until_done<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SnapshotError>>,
{
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        match attempt().await {
            Ok(done) => return done,
            Err(e) if in_progress(&e) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("the retry of the {what} failed: {e}"),
        }
    }
}

/// Asserts that `result` is the timeout of an attempt whose flatten outlasted it.
fn assert_outlasted<T: std::fmt::Debug>(what: &str, result: Result<T, SnapshotError>) {
    match result {
        Err(SnapshotError::Volume(e)) if e.is_timeout() => {}
        other => panic!(
            "the first {what} should have timed out during its flatten (make the image larger \
             if it finished in time): {other:?}"
        ),
    }
}

/// Waits until librbd finished the flatten an attempt left running (the image has no parent).
async fn wait_until_flattened(cluster: &ceph_rbd::Cluster, image: &str) {
    let deadline = Instant::now() + CONVERGE_WITHIN;
    while cluster.parent(pool(), image).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "{image} still not flattened after {CONVERGE_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The metadata key `key` of `image` as stored (own or inherited).
async fn meta(cluster: &ceph_rbd::Cluster, image: &str, key: &str) -> Option<String> {
    cluster.metadata_get(pool(), image, key).await.unwrap()
}

/// The image is flattened and records depth 0.
async fn assert_flattened(cluster: &ceph_rbd::Cluster, image: &str) {
    assert_eq!(
        cluster.parent(pool(), image).await.unwrap(),
        None,
        "{image}"
    );
    assert_eq!(
        cluster
            .metadata_get(pool(), image, META_DEPTH)
            .await
            .unwrap()
            .as_deref(),
        Some("0"),
        "{image}"
    );
}

/// A volume `name` of [`LARGE`] bytes in [`SMALL_OBJECTS`], with `text` at offset 0.
async fn large_volume(cluster: &ceph_rbd::Cluster, name: &str, text: &str) {
    let options = CreateOptions {
        object_size: Some(SMALL_OBJECTS),
        ..CreateOptions::default()
    };
    rbd_volume::ensure(
        cluster,
        &NewImage {
            pool: pool(),
            image: name,
            size: LARGE,
            options: &options,
            owner: &owner(name),
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
    .unwrap();
    python_io(name, "w", text);
}

/// A [`LARGE`] volume `<prefix>-r` three parents deep, with `text` at offset 0: a volume that
/// is itself a clone made outside the provisioner (as a migrated ceph-csi clone is: depth 1,
/// no depth recorded), snapshotted and restored. A restore or clone of it is 5 deep, over
/// the limit: flattened when created.
async fn three_deep_volume(cluster: &ceph_rbd::Cluster, prefix: &str, text: &str) -> String {
    let (root, outside, restored) = (
        format!("{prefix}-root"),
        format!("{prefix}-x"),
        format!("{prefix}-r"),
    );
    // made outside the provisioner too: no owner record for the clone to inherit
    let options = CreateOptions {
        object_size: Some(SMALL_OBJECTS),
        ..CreateOptions::default()
    };
    cluster
        .create_image(pool(), &root, LARGE, &options)
        .await
        .unwrap();
    python_io(&root, "w", text);
    cluster.snap_create(pool(), &root, "base").await.unwrap();
    cluster
        .clone_image(
            pool(),
            &root,
            "base",
            pool(),
            &outside,
            &CreateOptions::default(),
        )
        .await
        .unwrap();
    rbd_volume::ensure(
        cluster,
        &NewImage {
            pool: pool(),
            image: &outside,
            size: LARGE,
            options: &CreateOptions::default(),
            owner: &owner(&outside),
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
    .unwrap();
    let snap = snapshot(cluster, &outside, &format!("{prefix}-snapshot"))
        .await
        .unwrap();
    restore(cluster, &restored, LARGE, &snap.image)
        .await
        .unwrap();
    assert_eq!(
        rbd_volume::snapshot::depth(cluster, pool(), &restored)
            .await
            .unwrap(),
        3
    );
    restored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_flatten_outlasts_the_attempt_is_completed_by_the_retry_and_deletable() {
    let cluster = cluster().await;
    // a restore of a restore: 4 parents deep, so its snapshot image (5) is flattened
    let mut source = "flat-snap-0".to_owned();
    large_volume(&cluster, &source, "flat-snap data").await;
    for generation in 1..=2 {
        let snap = snapshot(&cluster, &source, &format!("flat-snap-s{generation}"))
            .await
            .unwrap();
        source = format!("flat-snap-{generation}");
        restore(&cluster, &source, LARGE, &snap.image)
            .await
            .unwrap();
    }
    assert_eq!(
        rbd_volume::snapshot::depth(&cluster, pool(), &source)
            .await
            .unwrap(),
        4
    );

    let started = Instant::now();
    let first = snapshot(&*impatient_cluster().await, &source, "flat-snap-deep").await;
    assert_outlasted("snapshot", first);
    // the record is there while librbd still flattens
    let image = snapshot_image_name("flat-snap-deep");
    assert_eq!(
        meta(&cluster, &image, META_SNAPSHOT).await.as_deref(),
        Some("flat-snap-deep")
    );
    wait_until_flattened(&cluster, &image).await;
    let snap = retry_until_done("snapshot", || snapshot(&cluster, &source, "flat-snap-deep")).await;
    eprintln!(
        "snapshot converged {:?} after the first attempt began",
        started.elapsed()
    );
    assert_eq!(snap.owner, snapshot_owner(&source, "flat-snap-deep"));
    assert_flattened(&cluster, &snap.image).await;
    assert!(
        cluster.snap_list(pool(), &source).await.unwrap().is_empty(),
        "the temporary snapshot is removed"
    );
    let restored = restore(&cluster, "flat-snap-restored", LARGE, &snap.image)
        .await
        .unwrap();
    assert_eq!(restored.outcome, Outcome::Created);
    assert_eq!(read("flat-snap-restored", 14), "flat-snap data");

    assert_eq!(
        delete_volume(&cluster, "flat-snap-restored").await,
        Deleted::Removed
    );
    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::Removed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_flatten_outlasts_the_attempt_is_completed_by_the_retry_and_deletable() {
    let cluster = cluster().await;
    let source = three_deep_volume(&cluster, "flat-restore", "flat-restore data").await;
    let snap = snapshot(&cluster, &source, "flat-restore-snapshot2")
        .await
        .unwrap();
    let image = "flat-restore-deep";

    let started = Instant::now();
    let first = restore(&*impatient_cluster().await, image, LARGE, &snap.image).await;
    assert_outlasted("restore", first);
    // the record is there while librbd still flattens
    assert_eq!(meta(&cluster, image, META_PV).await.as_deref(), Some(image));
    wait_until_flattened(&cluster, image).await;
    let restored =
        retry_until_done("restore", || restore(&cluster, image, LARGE, &snap.image)).await;
    eprintln!(
        "restore converged {:?} after the first attempt began",
        started.elapsed()
    );
    assert_eq!(
        restored,
        Ensured {
            outcome: Outcome::Reused,
            size: LARGE
        }
    );
    assert_flattened(&cluster, image).await;
    assert_eq!(read(image, 17), "flat-restore data");

    assert_eq!(delete_volume(&cluster, image).await, Deleted::Removed);
    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::Removed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_clone_whose_flatten_outlasts_the_attempt_is_completed_by_the_retry_and_deletable()
{
    let cluster = cluster().await;
    let source = three_deep_volume(&cluster, "flat-clone", "flat-clone data").await;
    let image = "flat-clone-deep";
    let source_id = volume_id(&source);
    let from = Source::Volume {
        pool: pool(),
        image: &source,
    };

    let started = Instant::now();
    let first = clone(&*impatient_cluster().await, image, LARGE, from, &source_id).await;
    assert_outlasted("clone", first);
    // the record is there while librbd still flattens
    assert_eq!(meta(&cluster, image, META_PV).await.as_deref(), Some(image));
    wait_until_flattened(&cluster, image).await;
    let cloned =
        retry_until_done("clone", || clone(&cluster, image, LARGE, from, &source_id)).await;
    eprintln!(
        "clone converged {:?} after the first attempt began",
        started.elapsed()
    );
    assert_eq!(
        cloned,
        Ensured {
            outcome: Outcome::Reused,
            size: LARGE
        }
    );
    assert_flattened(&cluster, image).await;
    assert_eq!(read(image, 15), "flat-clone data");

    // the clone and its intermediate go; the source can go after it
    assert_eq!(delete_volume(&cluster, image).await, Deleted::Removed);
    let intermediate = rbd_volume::snapshot::clone_intermediate_name(pool(), image);
    assert!(!cluster.image_exists(pool(), &intermediate).await.unwrap());
    assert_eq!(delete_volume(&cluster, &source).await, Deleted::Removed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_snapshot_was_trashed_after_a_crash_is_completed_by_the_retry() {
    let cluster = cluster().await;
    let source = "trashed-parent-src";
    rbd_volume::ensure(
        &cluster,
        &NewImage {
            pool: pool(),
            image: source,
            size: 8 * MIB,
            options: &CreateOptions::default(),
            owner: &owner(source),
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
    .unwrap();
    python_io(source, "w", "before the snapshot");
    let snap = snapshot(&cluster, source, "trashed-parent-snapshot")
        .await
        .unwrap();
    let image = "trashed-parent-restore";

    // what a restore killed after its clone and before its record leaves
    cluster
        .clone_image(
            pool(),
            &snap.image,
            &snap.image,
            pool(),
            image,
            &CreateOptions::default(),
        )
        .await
        .unwrap();
    // the snapshot is deleted meanwhile: its image waits in the trash for the restore
    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::Trashed
    );

    let restored = restore(&cluster, image, 8 * MIB, &snap.image)
        .await
        .unwrap();
    assert_eq!(
        restored,
        Ensured {
            outcome: Outcome::Adopted,
            size: 8 * MIB
        }
    );
    assert_eq!(read(image, 19), "before the snapshot");
    // no longer hanging off a trashed image, which is purged
    assert_flattened(&cluster, image).await;
    let trash: Vec<String> = cluster
        .trash_list(pool())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(!trash.contains(&snap.image), "left in the trash: {trash:?}");
    // a second retry reuses it
    let again = restore(&cluster, image, 8 * MIB, &snap.image)
        .await
        .unwrap();
    assert_eq!(again.outcome, Outcome::Reused);

    assert_eq!(delete_volume(&cluster, image).await, Deleted::Removed);
    assert_eq!(delete_volume(&cluster, source).await, Deleted::Removed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_finished_restore_whose_snapshot_was_trashed_since_is_not_flattened() {
    let cluster = cluster().await;
    let source = "trashed-later-src";
    rbd_volume::ensure(
        &cluster,
        &NewImage {
            pool: pool(),
            image: source,
            size: 8 * MIB,
            options: &CreateOptions::default(),
            owner: &owner(source),
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
    .unwrap();
    let snap = snapshot(&cluster, source, "trashed-later-snapshot")
        .await
        .unwrap();
    let image = "trashed-later-restore";
    restore(&cluster, image, 8 * MIB, &snap.image)
        .await
        .unwrap();
    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::Trashed
    );

    let again = restore(&cluster, image, 8 * MIB, &snap.image)
        .await
        .unwrap();
    assert_eq!(again.outcome, Outcome::Reused);
    let parent = cluster.parent(pool(), image).await.unwrap();
    assert!(
        parent.is_some_and(|p| p.in_trash),
        "a finished restore keeps its trashed parent until it is deleted"
    );

    assert_eq!(delete_volume(&cluster, image).await, Deleted::Removed);
    assert_eq!(delete_volume(&cluster, source).await, Deleted::Removed);
}
