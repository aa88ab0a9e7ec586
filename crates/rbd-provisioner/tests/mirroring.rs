//! The disaster-recovery test bed: two micro-ceph clusters (site-a, site-b) on 127.0.0.1,
//! peers of each other for the pool in image mode (`rbd mirror pool peer bootstrap create` and
//! `import`, as an operator does), an `rbd-mirror` daemon for each, all stopped with the
//! clusters. Through the volume core's mirroring steps (`rbd_volume::mirror`): an image
//! mirrored by snapshots on site-a reaches site-b with the bytes of its mirror snapshot, and
//! site-a reports the last sync as site-b's daemon tells it; a
//! planned failover (demote on a, promote on b) brings writes made on b back to a; failing back
//! makes a primary again; with site-a's daemon killed, b is force-promoted and keeps its data.
//!
//! On the non-primary copy, rbd-mirror takes the snapshot before it copies the data into the
//! image: the replicated bytes are read from the non-primary image itself once the copy is
//! complete, compared with the primary's mirror snapshot.

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ceph_rbd::MirrorImageState;
use micro_ceph::MicroCeph;
use rbd_volume::mirror::{self, Schedule};
use support::admin_connection as connect;

const SIZE: u64 = 32 << 20;
/// How long a replication may take on a loaded 2-vCPU machine.
const WAIT: Duration = Duration::from_secs(180);
const HOUR: Duration = Duration::from_secs(3600);

/// Runs a python-rbd script against `ceph`'s pool: argv is conf, pool, image, then `args`.
fn python(ceph: &MicroCeph, script: &str, image: &str, args: &[&str]) -> String {
    try_python(ceph, script, image, args).unwrap_or_else(|e| panic!("python-rbd: {e}"))
}

/// As [`python`]; the script's stderr when it fails.
fn try_python(
    ceph: &MicroCeph,
    script: &str,
    image: &str,
    args: &[&str],
) -> Result<String, String> {
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(&ceph.conf_path)
        .args([&ceph.pool, image])
        .args(args)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Writes 4 MiB of bytes made from `seed` at `offset` of the image (a writer's I/O, through
/// librbd).
fn write(ceph: &MicroCeph, image: &str, offset: u64, seed: u8) {
    python(
        ceph,
        "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
seed = int(sys.argv[5])
with rbd.Image(io, sys.argv[3]) as img:
    img.write(bytes((i * 7 + seed) % 251 for i in range(4 << 20)), int(sys.argv[4]))
io.close(); c.shutdown()
",
        image,
        &[&offset.to_string(), &seed.to_string()],
    );
}

/// The md5 of the whole image as of snapshot `snap_id` (`None`: the image itself).
fn md5(ceph: &MicroCeph, image: &str, snap_id: Option<u64>) -> String {
    try_md5(ceph, image, snap_id).unwrap_or_else(|e| panic!("python-rbd: {e}"))
}

/// As [`md5`]; the error while the image cannot be read (a resync replaces it).
fn try_md5(ceph: &MicroCeph, image: &str, snap_id: Option<u64>) -> Result<String, String> {
    let snap = snap_id.map_or_else(|| "-".to_owned(), |id| id.to_string());
    try_python(
        ceph,
        "import sys, hashlib, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3], read_only=True) as img:
    if sys.argv[4] != '-':
        img.set_snap_by_id(int(sys.argv[4]))
    print(hashlib.md5(img.read(0, img.size())).hexdigest())
io.close(); c.shutdown()
",
        image,
        &[&snap],
    )
}

/// Polls `check` until it gives a value, at most [`WAIT`].
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Until `to`'s non-primary copy of `image` holds the bytes `from`'s mirror snapshot `snap`
/// holds.
async fn replicated(from: &MicroCeph, to: &MicroCeph, image: &str, snap: u64, what: &str) {
    let want = md5(from, image, Some(snap));
    let to_cluster = connect(to).await;
    until(what, || {
        let (to_cluster, want) = (to_cluster.clone(), want.clone());
        async move {
            let info = to_cluster.mirror_image_info(&to.pool, image).await.ok()?;
            (info.state == MirrorImageState::Enabled
                && !info.primary
                // during a resync the daemon removes the copy and makes it again
                && try_md5(to, image, None).is_ok_and(|got| got == want))
            .then_some(())
        }
    })
    .await;
}

/// Whether `site`'s copy of `image` is primary.
async fn is_primary(site: &ceph_rbd::Cluster, ceph: &MicroCeph, image: &str) -> bool {
    site.mirror_image_info(&ceph.pool, image)
        .await
        .unwrap()
        .primary
}

/// Promotes `image` on `site` (without force) once its copy has the peer's demotion: librbd
/// refuses until then.
async fn promote_once_demoted(
    site: &Arc<ceph_rbd::Cluster>,
    ceph: &MicroCeph,
    image: &str,
    what: &str,
) {
    until(what, || {
        let site = site.clone();
        let pool = ceph.pool.clone();
        async move { mirror::promote(&site, &pool, image, false).await.ok() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sites_replicate_fail_over_and_back_and_survive_a_lost_site() {
    let (a, b) =
        tokio::task::spawn_blocking(|| MicroCeph::start_two_sites().expect("the two sites"))
            .await
            .unwrap();
    let (site_a, site_b) = (connect(&a).await, connect(&b).await);
    let image = "dr-volume";
    site_a
        .create_image(&a.pool, image, SIZE, &Default::default())
        .await
        .unwrap();
    write(&a, image, 0, 1);

    // mirrored by snapshots from site-a: b gets a non-primary copy with the snapshot's bytes
    mirror::enable(&site_a, &a.pool, image).await.unwrap();
    mirror::enable(&site_a, &a.pool, image).await.unwrap();
    write(&a, image, 8 << 20, 2);
    let snap = mirror::snapshot_if_due(
        &site_a,
        &a.pool,
        image,
        Schedule::every(Duration::ZERO),
        SystemTime::now(),
    )
    .await
    .unwrap()
    .expect("a snapshot is due at once with no interval");
    assert_eq!(
        mirror::snapshot_if_due(
            &site_a,
            &a.pool,
            image,
            Schedule::every(HOUR),
            SystemTime::now()
        )
        .await
        .unwrap(),
        None,
        "the next is due in an hour"
    );
    replicated(&a, &b, image, snap, "site-b's copy of the mirror snapshot").await;
    let taken = site_a
        .mirror_snapshots(&a.pool, image)
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.id == snap)
        .unwrap()
        .created;
    // site-a reports the sync as site-b's daemon tells it
    let replication = until("site-a's view of the sync", || {
        let site_a = site_a.clone();
        let pool = a.pool.clone();
        async move {
            let r = mirror::replication(&site_a, &pool, image).await.ok()?;
            r.last_sync.is_some_and(|s| s.time >= taken).then_some(r)
        }
    })
    .await;
    assert!(replication.primary, "{replication:?}");
    assert!(replication.replaying(), "{replication:?}");
    let at_b = mirror::replication(&site_b, &b.pool, image).await.unwrap();
    assert!(!at_b.primary);
    assert_eq!(at_b.global_id, replication.global_id);
    // a secondary takes no snapshot when due
    assert_eq!(
        mirror::snapshot_if_due(
            &site_b,
            &b.pool,
            image,
            Schedule::every(Duration::ZERO),
            SystemTime::now()
        )
        .await
        .unwrap(),
        None
    );

    // planned failover: demote a, promote b once it has the demotion; writes on b reach a
    mirror::demote(&site_a, &a.pool, image).await.unwrap();
    mirror::demote(&site_a, &a.pool, image).await.unwrap();
    promote_once_demoted(
        &site_b,
        &b,
        image,
        "site-b promoted after site-a's demotion",
    )
    .await;
    assert!(is_primary(&site_b, &b, image).await);
    assert!(!is_primary(&site_a, &a, image).await);
    write(&b, image, 16 << 20, 3);
    let snap = site_b.mirror_image_snapshot(&b.pool, image).await.unwrap();
    replicated(&b, &a, image, snap, "site-a's copy of site-b's writes").await;

    // failback: demote b, promote a
    mirror::demote(&site_b, &b.pool, image).await.unwrap();
    promote_once_demoted(
        &site_a,
        &a,
        image,
        "site-a promoted after site-b's demotion",
    )
    .await;
    write(&a, image, 24 << 20, 4);
    let snap = site_a.mirror_image_snapshot(&a.pool, image).await.unwrap();
    replicated(&a, &b, image, snap, "site-b's copy after the failback").await;
    let synced = md5(&a, image, Some(snap));

    // site-a lost at once: its daemon killed, a write after the last mirror snapshot never
    // reaches b; b is force-promoted and holds the data as of the last sync
    a.kill_rbd_mirror();
    write(&a, image, 0, 5);
    mirror::promote(&site_b, &b.pool, image, true)
        .await
        .unwrap();
    assert!(is_primary(&site_b, &b, image).await);
    assert_eq!(md5(&b, image, None), synced, "site-b holds the last sync");
    // both primary now: site-a's copy is demoted and resynced from b on request
    mirror::demote(&site_a, &a.pool, image).await.unwrap();
    mirror::resync(&site_a, &a.pool, image).await.unwrap();
    a.start_rbd_mirror().expect("site-a's rbd-mirror again");
    let snap = site_b.mirror_image_snapshot(&b.pool, image).await.unwrap();
    replicated(&b, &a, image, snap, "site-a resynced from site-b").await;

    // the clusters' stop takes their daemons with them
    let dirs = [a.dir.display().to_string(), b.dir.display().to_string()];
    drop((site_a, site_b));
    tokio::task::spawn_blocking(move || drop((a, b)))
        .await
        .unwrap();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("rbd-mirror") && dirs.iter().any(|d| c.contains(d.as_str())))
        .collect();
    assert!(left.is_empty(), "rbd-mirror left running: {left:?}");
}
