//! krbd's snapshot limit, against a private Ceph cluster, with limits small enough to reach
//! (max 8, min 4: this binary's own process, so no other test sees them): each snapshot leaves
//! a trashed temporary snapshot on its source while its snapshot image depends on it, and the
//! source's snapshot count must stay within the limits while every snapshot keeps its own
//! bytes (a digest of `rbd export` taken at its moment).

mod common;

use common::{MIB, cluster, delete_volume, digest, ensure, restore, snapshot, spec, write};
use rbd_volume::SnapshotError;
use rbd_volume::snapshot_limit::{SnapshotLimits, set_snapshot_limits};

const MAX: u32 = 8;
const MIN: u32 = 4;

fn small_limits() {
    set_snapshot_limits(SnapshotLimits::new(MAX, MIN).unwrap());
}

/// Every snapshot of the source (user, trashed, group), as krbd counts them.
fn snapshots_of(image: &str) -> usize {
    micro_ceph::cluster()
        .rbd(&["snap", "ls", "--all", "--format", "json", &spec(image)])
        .map(|out| {
            serde_json::from_str::<Vec<serde_json::Value>>(&out)
                .unwrap()
                .len()
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sources_snapshot_count_stays_within_the_limits_and_every_snapshot_keeps_its_bytes() {
    small_limits();
    let cluster = cluster().await;
    let source = "limit-src";
    ensure(&cluster, source, 16 * MIB).await.unwrap();
    let mut taken = Vec::new();
    let mut most = 0;
    for i in 0..u64::from(MAX + 1) {
        // each moment its own bytes, in one of four objects
        write(
            source,
            (i % 4) * 4 * MIB,
            &format!("the state of moment {i}"),
        );
        let at_moment = digest(source);
        let snap = snapshot(&cluster, source, &format!("limit-{i}"))
            .await
            .unwrap();
        let count = snapshots_of(source);
        most = most.max(count);
        assert!(
            count <= MIN as usize + 1 && count <= MAX as usize,
            "after snapshot {i}: {count} snapshots on the source (min {MIN}, max {MAX})"
        );
        taken.push((snap, at_moment));
    }
    for (snap, at_moment) in &taken {
        assert_eq!(
            &digest(&format!("{}@{}", snap.image, snap.image)),
            at_moment,
            "{}",
            snap.image
        );
    }
    // the oldest (flattened) and the newest (still a clone) restore their moments
    for (name, (snap, at_moment)) in [
        ("limit-restore-old", &taken[0]),
        ("limit-restore-new", &taken[taken.len() - 1]),
    ] {
        restore(&cluster, name, 16 * MIB, snap).await.unwrap();
        assert_eq!(&digest(name), at_moment, "{name}");
        delete_volume(&cluster, name).await;
    }
    println!(
        "RELIABILITY snapshot-limit: {} snapshots of one source with max {MAX} min {MIN}: at most {most} snapshots on it at once, every snapshot with its moment's bytes",
        taken.len()
    );
    for (snap, _) in &taken {
        rbd_volume::delete_snapshot(&cluster, &snap.pool, &snap.image)
            .await
            .unwrap();
    }
    delete_volume(&cluster, source).await;
}

/// Snapshots that are not ours (an operator's) past `max`: nothing to flatten, the request is
/// refused naming the limit, and nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_past_the_limit_with_snapshots_not_ours_is_refused_naming_it() {
    small_limits();
    let cluster = cluster().await;
    let source = "limit-foreign-src";
    ensure(&cluster, source, 4 * MIB).await.unwrap();
    for i in 0..=MAX {
        micro_ceph::cluster()
            .rbd(&["snap", "create", &format!("{}@operator-{i}", spec(source))])
            .unwrap();
    }
    let refused = snapshot(&cluster, source, "limit-foreign")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &refused,
            SnapshotError::TooManySnapshots { count, max, .. } if *count == MAX + 1 && *max == MAX
        ),
        "{refused:?}"
    );
    assert!(
        refused.to_string().contains("max-snapshots-on-image"),
        "{refused}"
    );
    let made = rbd_volume::snapshot::snapshot_image_name("limit-foreign");
    assert!(!cluster.image_exists(common::pool(), &made).await.unwrap());
    assert_eq!(snapshots_of(source), MAX as usize + 1);
}

/// Snapshots of one source requested 8 at a time past `min`, as a Kubernetes client sends
/// them: the requests flatten the same snapshot images at once, each is answered (a refusal
/// past `max` is retried, as the CSI sidecar retries RESOURCE_EXHAUSTED), and the source ends
/// within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_requested_at_once_past_the_limit_all_succeed_and_stay_within_it() {
    small_limits();
    let cluster = cluster().await;
    let source = "limit-burst-src";
    ensure(&cluster, source, 4 * MIB).await.unwrap();
    write(source, 0, "burst");
    let at_moment = digest(source);
    for i in 0..MIN {
        snapshot(&cluster, source, &format!("limit-burst-{i}"))
            .await
            .unwrap();
    }
    let requests = (MIN..MIN + 8).map(|i| {
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let name = format!("limit-burst-{i}");
            let mut refused = 0;
            loop {
                match snapshot(&cluster, source, &name).await {
                    Ok(snap) => return (snap, refused),
                    Err(SnapshotError::TooManySnapshots { .. }) if refused < 5 => refused += 1,
                    Err(e) => panic!("{name}: {e}"),
                }
            }
        })
    });
    let mut refusals = 0;
    let mut taken = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        let (snap, refused) = request.await.unwrap();
        refusals += refused;
        taken.push(snap);
    }
    let count = snapshots_of(source);
    assert!(count <= MAX as usize, "{count} snapshots on the source");
    for snap in taken.iter().step_by(3) {
        assert_eq!(
            digest(&format!("{}@{}", snap.image, snap.image)),
            at_moment,
            "{}",
            snap.image
        );
    }
    println!(
        "RELIABILITY snapshot-limit burst: 8 at once past min {MIN}: {refusals} refusals past max {MAX} retried, {count} snapshots on the source after"
    );
}
