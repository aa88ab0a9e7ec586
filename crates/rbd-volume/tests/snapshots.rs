//! Snapshots, restores and volume clones against a private Ceph cluster, data checked through
//! python-rbd (librbd, not our code): a restore reads what was written before the snapshot and
//! is grown when larger; deleting the source keeps snapshots and restores working; deleting a
//! snapshot that a restore still needs trashes it until the restore goes; a 10-deep chain of
//! clones stays readable and no image is ever more than `MAX_CHAIN_DEPTH` parents deep.

use std::process::Command;
use std::sync::Arc;

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};
use rbd_volume::snapshot::{
    META_CLONE_INTERMEDIATE, META_CONTENT_SOURCE, META_DEPTH, depth, snapshot_image_name,
};
use rbd_volume::{
    Claimant, Deleted, Ensured, Fit, Hooks, MAX_CHAIN_DEPTH, NewClone, NewImage, NewSnapshot,
    Outcome, Owner, Snapshot, SnapshotDeleted, SnapshotError, SnapshotOwner, Source,
};

const MIB: u64 = 1 << 20;
const DRIVER: &str = "rbd.provisioner.ceph.io";

async fn cluster() -> Arc<ceph_rbd::Cluster> {
    let ceph = micro_ceph::cluster();
    let pool = ConnectionPool::new(PoolOptions::default());
    pool.get(&ClusterConfig::new(
        &ceph.monitors,
        "admin",
        Secret::new(ceph.admin_key.clone()),
    ))
    .await
    .unwrap()
}

fn pool() -> &'static str {
    &micro_ceph::cluster().pool
}

const IO: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    if sys.argv[4] == 'w':
        img.write(sys.argv[6].encode(), int(sys.argv[5]))
    else:
        sys.stdout.write(img.read(int(sys.argv[5]), int(sys.argv[6])).decode('latin1'))
io.close(); c.shutdown()
";

/// Runs python-rbd on `image`: `w` writes `arg` at `offset`, `r` reads `arg` bytes.
fn python_io(image: &str, op: &str, offset: u64, arg: &str) -> String {
    let ceph = micro_ceph::cluster();
    let out = Command::new("/usr/bin/python3")
        .args(["-c", IO])
        .arg(&ceph.conf_path)
        .arg(&ceph.pool)
        .arg(image)
        .arg(op)
        .arg(offset.to_string())
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

fn write(image: &str, offset: u64, text: &str) {
    python_io(image, "w", offset, text);
}

fn read(image: &str, offset: u64, len: usize) -> String {
    python_io(image, "r", offset, &len.to_string())
}

fn owner(pv: &str) -> Owner {
    Owner {
        pv: pv.into(),
        claim: String::new(),
        provisioner: DRIVER.into(),
        kube_cluster: String::new(),
    }
}

fn volume_id(image: &str) -> String {
    format!("v1/{}/{}/{image}", micro_ceph::cluster().monitors, pool())
}

async fn volume(cluster: &ceph_rbd::Cluster, image: &str, size: u64) {
    let owner = Owner {
        claim: format!("ns/{image}"),
        ..owner(image)
    };
    rbd_volume::ensure(
        cluster,
        &NewImage {
            pool: pool(),
            image,
            size,
            options: &CreateOptions::default(),
            owner: &owner,
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
    .unwrap();
}

async fn snapshot(cluster: &ceph_rbd::Cluster, source: &str, name: &str) -> Snapshot {
    let owner = SnapshotOwner {
        name: name.into(),
        source: volume_id(source),
        driver: DRIVER.into(),
        kube_cluster: String::new(),
    };
    rbd_volume::create_snapshot(
        cluster,
        &NewSnapshot {
            pool: pool(),
            source_image: source,
            image: &snapshot_image_name(name),
            owner: &owner,
        },
    )
    .await
    .unwrap()
}

async fn clone(
    cluster: &ceph_rbd::Cluster,
    image: &str,
    size: u64,
    source: Source<'_>,
    source_id: &str,
) -> Result<Ensured, SnapshotError> {
    let owner = owner(image);
    rbd_volume::clone_volume(
        cluster,
        &NewClone {
            pool: pool(),
            image,
            size,
            options: &CreateOptions::default(),
            owner: &owner,
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

async fn restore(cluster: &ceph_rbd::Cluster, image: &str, size: u64, snap: &Snapshot) -> Ensured {
    clone(
        cluster,
        image,
        size,
        Source::Snapshot {
            pool: &snap.pool,
            image: &snap.image,
        },
        &format!("snapshot {}", snap.image),
    )
    .await
    .unwrap()
}

async fn delete_volume(cluster: &ceph_rbd::Cluster, image: &str) -> Deleted {
    rbd_volume::delete_volume(
        cluster,
        pool(),
        image,
        &Claimant::image(),
        &Hooks::default(),
    )
    .await
    .unwrap()
}

async fn trash_names(cluster: &ceph_rbd::Cluster) -> Vec<String> {
    cluster
        .trash_list(pool())
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

#[tokio::test]
async fn a_restore_reads_the_data_from_before_the_snapshot_and_a_larger_one_is_grown() {
    let cluster = cluster().await;
    let source = "snap-data-src";
    volume(&cluster, source, 8 * MIB).await;
    write(source, 0, "before the snapshot");
    write(source, 7 * MIB, "end of the source");

    let snap = snapshot(&cluster, source, "snapshot-data").await;
    assert_eq!(snap.size, 8 * MIB);
    assert_eq!(snap.owner.source, volume_id(source));
    // the source keeps no snapshot of ours: the temporary one went to its snapshot trash
    assert!(cluster.snap_list(pool(), source).await.unwrap().is_empty());
    // retried: the same snapshot
    assert_eq!(snapshot(&cluster, source, "snapshot-data").await, snap);
    let listed = rbd_volume::list_snapshots(&cluster, pool()).await.unwrap();
    assert!(listed.contains(&snap), "{listed:?}");

    write(source, 0, "AFTER  the snapshot");
    let restored = restore(&cluster, "snap-data-restore", 16 * MIB, &snap).await;
    assert_eq!(restored.outcome, Outcome::Created);
    assert_eq!(restored.size, 16 * MIB, "grown past the source's 8 MiB");
    assert_eq!(
        cluster
            .image_info(pool(), "snap-data-restore")
            .await
            .unwrap()
            .size,
        16 * MIB
    );
    assert_eq!(read("snap-data-restore", 0, 19), "before the snapshot");
    // librbd copies a parent's metadata into its clones: none of the source's record shows
    let snap_meta = cluster.metadata_list(pool(), &snap.image).await.unwrap();
    let as_volume = Owner::from_metadata(&snap_meta).unwrap();
    assert_eq!(
        (
            as_volume.pv.as_str(),
            as_volume.claim.as_str(),
            as_volume.provisioner.as_str()
        ),
        ("", "", "-"),
        "the snapshot image is no volume's image"
    );
    let restore_meta = cluster
        .metadata_list(pool(), "snap-data-restore")
        .await
        .unwrap();
    assert_eq!(
        Owner::from_metadata(&restore_meta),
        Some(owner("snap-data-restore"))
    );
    assert_eq!(
        restore_meta[META_CONTENT_SOURCE],
        format!("snapshot {}", snap.image)
    );
    assert_eq!(restore_meta[META_CLONE_INTERMEDIATE], "");
    assert_eq!(read("snap-data-restore", 7 * MIB, 17), "end of the source");
    assert_eq!(read(source, 0, 19), "AFTER  the snapshot");
    // a retry finds it; another source for the same volume is refused
    let again = restore(&cluster, "snap-data-restore", 16 * MIB, &snap).await;
    assert_eq!(again.outcome, Outcome::Reused);
    let other = clone(
        &cluster,
        "snap-data-restore",
        16 * MIB,
        Source::Volume {
            pool: pool(),
            image: source,
        },
        &volume_id(source),
    )
    .await;
    assert!(
        matches!(other, Err(SnapshotError::OtherContent { .. })),
        "{other:?}"
    );
    // a snapshot name reused for another source is refused
    volume(&cluster, "snap-data-other", 8 * MIB).await;
    let other_owner = SnapshotOwner {
        name: "snapshot-data".into(),
        source: volume_id("snap-data-other"),
        driver: DRIVER.into(),
        kube_cluster: String::new(),
    };
    let refused = rbd_volume::create_snapshot(
        &cluster,
        &NewSnapshot {
            pool: pool(),
            source_image: "snap-data-other",
            image: &snapshot_image_name("snapshot-data"),
            owner: &other_owner,
        },
    )
    .await;
    assert!(
        matches!(refused, Err(SnapshotError::OtherSnapshot { .. })),
        "{refused:?}"
    );
    // a restore smaller than its source is refused before anything is made
    let small = rbd_volume::clone_volume(
        &cluster,
        &NewClone {
            pool: pool(),
            image: "snap-data-small",
            size: 4 * MIB,
            options: &CreateOptions::default(),
            owner: &owner("snap-data-small"),
            fit: Fit::Within {
                required: 4 * MIB,
                limit: 4 * MIB,
            },
            source: Source::Snapshot {
                pool: pool(),
                image: &snap.image,
            },
            source_id: "s",
            driver: DRIVER,
        },
    )
    .await;
    assert!(
        matches!(small, Err(SnapshotError::TooSmall { .. })),
        "{small:?}"
    );
    assert!(
        !cluster
            .image_exists(pool(), "snap-data-small")
            .await
            .unwrap()
    );

    for image in ["snap-data-restore", source, "snap-data-other"] {
        assert_eq!(delete_volume(&cluster, image).await, Deleted::Removed);
    }
    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::Removed
    );
    assert!(!cluster.image_exists(pool(), &snap.image).await.unwrap());
}

#[tokio::test]
async fn deleting_the_source_keeps_its_snapshot_and_restores_working() {
    let cluster = cluster().await;
    let source = "snap-src-gone";
    volume(&cluster, source, 8 * MIB).await;
    write(source, MIB, "kept after the source is gone");
    let snap = snapshot(&cluster, source, "snapshot-src-gone").await;
    restore(&cluster, "snap-src-gone-r1", 8 * MIB, &snap).await;

    // the source has a clone (the snapshot image): deleting it still succeeds
    assert_eq!(delete_volume(&cluster, source).await, Deleted::Removed);
    assert!(!cluster.image_exists(pool(), source).await.unwrap());
    assert!(!trash_names(&cluster).await.contains(&source.to_string()));
    let found = rbd_volume::find_snapshot(&cluster, pool(), &snap.image)
        .await
        .unwrap()
        .expect("the snapshot survives its source");
    assert_eq!(found.owner.source, volume_id(source));
    assert_eq!(
        cluster.parent(pool(), &snap.image).await.unwrap(),
        None,
        "the snapshot image was flattened off its source"
    );
    assert_eq!(
        read("snap-src-gone-r1", MIB, 29),
        "kept after the source is gone"
    );
    // and a new restore after the source is gone has the data too
    restore(&cluster, "snap-src-gone-r2", 8 * MIB, &snap).await;
    assert_eq!(
        read("snap-src-gone-r2", MIB, 29),
        "kept after the source is gone"
    );

    for image in ["snap-src-gone-r1", "snap-src-gone-r2"] {
        assert_eq!(delete_volume(&cluster, image).await, Deleted::Removed);
    }
    rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
        .await
        .unwrap();
    assert!(!cluster.image_exists(pool(), &snap.image).await.unwrap());
}

#[tokio::test]
async fn a_snapshot_deleted_while_a_restore_needs_it_waits_in_the_trash_until_the_restore_goes() {
    let cluster = cluster().await;
    let source = "snap-del-src";
    volume(&cluster, source, 8 * MIB).await;
    write(source, 0, "restored data");
    let snap = snapshot(&cluster, source, "snapshot-del").await;
    restore(&cluster, "snap-del-r", 8 * MIB, &snap).await;

    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::Trashed
    );
    assert_eq!(
        rbd_volume::find_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        None,
        "a deleted snapshot is not found"
    );
    assert!(trash_names(&cluster).await.contains(&snap.image));
    assert_eq!(read("snap-del-r", 0, 13), "restored data");
    // a second delete is fine, and the source no longer depends on anything
    assert_eq!(
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap(),
        SnapshotDeleted::AlreadyGone
    );
    assert_eq!(delete_volume(&cluster, source).await, Deleted::Removed);
    assert_eq!(read("snap-del-r", 0, 13), "restored data");

    // the restore's delete purges the trashed snapshot image it was the last clone of
    assert_eq!(
        delete_volume(&cluster, "snap-del-r").await,
        Deleted::Removed
    );
    assert!(
        !trash_names(&cluster).await.contains(&snap.image),
        "the trashed snapshot image is purged"
    );
}

#[tokio::test]
async fn a_ten_deep_chain_of_clones_stays_readable_and_is_flattened_at_the_depth_limit() {
    let cluster = cluster().await;
    let names: Vec<String> = (0..=10).map(|i| format!("chain-{i}")).collect();
    volume(&cluster, &names[0], 8 * MIB).await;
    write(&names[0], 0, "generation 0");
    let mut flattened = 0;
    for i in 1..=10 {
        let parent = &names[i - 1];
        clone(
            &cluster,
            &names[i],
            8 * MIB,
            Source::Volume {
                pool: pool(),
                image: parent,
            },
            &volume_id(parent),
        )
        .await
        .unwrap();
        write(&names[i], (i as u64) * 4096, &format!("generation {i}"));
        let d = depth(&cluster, pool(), &names[i]).await.unwrap();
        assert!(d <= MAX_CHAIN_DEPTH, "{} is {d} deep", names[i]);
        if cluster.parent(pool(), &names[i]).await.unwrap().is_none() {
            flattened += 1;
        }
        // every image a read may walk is within the limit: count the real parents
        let mut hops = 0;
        let mut at = names[i].clone();
        while let Some(p) = cluster.parent(pool(), &at).await.unwrap() {
            hops += 1;
            at = p.image;
        }
        assert!(
            hops <= MAX_CHAIN_DEPTH,
            "{} reads through {hops} parents",
            names[i]
        );
    }
    assert!(flattened >= 1, "the chain was flattened somewhere");
    assert_eq!(read(&names[10], 0, 12), "generation 0");
    for i in 1..=10 {
        let text = format!("generation {i}");
        assert_eq!(read(&names[10], (i as u64) * 4096, text.len()), text);
    }
    assert!(
        cluster
            .metadata_get(pool(), &names[10], META_DEPTH)
            .await
            .unwrap()
            .is_some()
    );

    // deleting from the root down keeps every later generation readable
    for i in 0..10 {
        assert_eq!(delete_volume(&cluster, &names[i]).await, Deleted::Removed);
        assert_eq!(read(&names[10], 0, 12), "generation 0");
    }
    assert_eq!(delete_volume(&cluster, &names[10]).await, Deleted::Removed);
    let left: Vec<String> = cluster
        .list_images(pool())
        .await
        .unwrap()
        .into_iter()
        .filter(|i| i.starts_with("chain-") || i.starts_with("csi-clone-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let trash: Vec<String> = trash_names(&cluster)
        .await
        .into_iter()
        .filter(|n| n.starts_with("csi-clone-"))
        .collect();
    assert!(trash.is_empty(), "left in the trash: {trash:?}");
}

#[tokio::test]
async fn what_a_crash_leaves_midway_is_completed_by_the_retry_or_cleaned_up_by_the_source_delete() {
    let cluster = cluster().await;
    let source = "snap-crash-src";
    volume(&cluster, source, 8 * MIB).await;
    write(source, 0, "crash-safe");
    let options = CreateOptions::default();

    // a crash after the temporary snapshot: the retry clones from it and removes it
    let image = snapshot_image_name("snapshot-crash-a");
    let temp = format!("csi-tmp-{image}");
    cluster.snap_create(pool(), source, &temp).await.unwrap();
    let a = snapshot(&cluster, source, "snapshot-crash-a").await;
    assert!(cluster.snap_list(pool(), source).await.unwrap().is_empty());

    // a crash after the clone, before its record: adopted and completed
    let image = snapshot_image_name("snapshot-crash-b");
    let temp = format!("csi-tmp-{image}");
    cluster.snap_create(pool(), source, &temp).await.unwrap();
    cluster
        .clone_image(pool(), source, &temp, pool(), &image, &options)
        .await
        .unwrap();
    assert_eq!(
        rbd_volume::find_snapshot(&cluster, pool(), &image)
            .await
            .unwrap(),
        None,
        "an unrecorded clone is no snapshot yet"
    );
    let b = snapshot(&cluster, source, "snapshot-crash-b").await;
    assert_eq!(b.image, image);
    assert!(cluster.snap_list(pool(), source).await.unwrap().is_empty());

    // a restore cut before its record: adopted, grown and recorded
    cluster
        .clone_image(pool(), &b.image, &b.image, pool(), "snap-crash-r", &options)
        .await
        .unwrap();
    let r = restore(&cluster, "snap-crash-r", 16 * MIB, &b).await;
    assert_eq!((r.outcome, r.size), (Outcome::Adopted, 16 * MIB));
    assert_eq!(read("snap-crash-r", 0, 10), "crash-safe");

    // a snapshot never retried leaves its temporary snapshot: the source's delete removes it
    cluster
        .snap_create(pool(), source, "csi-tmp-never-retried")
        .await
        .unwrap();
    assert_eq!(delete_volume(&cluster, source).await, Deleted::Removed);
    assert_eq!(read("snap-crash-r", 0, 10), "crash-safe");

    assert_eq!(
        delete_volume(&cluster, "snap-crash-r").await,
        Deleted::Removed
    );
    for snap in [a, b] {
        rbd_volume::delete_snapshot(&cluster, pool(), &snap.image)
            .await
            .unwrap();
        assert!(!cluster.image_exists(pool(), &snap.image).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_delete_finds_the_clone_intermediate_in_another_pool() {
    let ceph = micro_ceph::cluster();
    let other = "intermediates";
    if !ceph
        .rbd(&["pool", "ls"])
        .is_ok_and(|pools| pools.lines().any(|p| p == other))
    {
        let out = ceph
            .cli("ceph")
            .args(["osd", "pool", "create", other, "8"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ceph.rbd(&["pool", "init", other]).unwrap();
    }
    let cluster = cluster().await;
    // the source in the other pool, its clone in the default one: the intermediate is made in
    // the source's pool
    let source = "far-source";
    ceph.rbd(&["create", "--size", "8M", &format!("{other}/{source}")])
        .unwrap();
    let copy = "near-clone";
    clone(
        &cluster,
        copy,
        8 * MIB,
        Source::Volume {
            pool: other,
            image: source,
        },
        &format!("v1/m/{other}/{source}"),
    )
    .await
    .unwrap();
    let intermediate = rbd_volume::snapshot::clone_intermediate_name(pool(), copy);
    let in_other = || {
        ceph.rbd(&["ls", other])
            .unwrap()
            .lines()
            .any(|l| l == intermediate)
    };
    assert!(in_other(), "the intermediate is not in {other}");
    // the first delete removes the volume, then fails on the intermediate (held open)
    let holder = micro_ceph::ImageHolder::open(ceph, other, &intermediate).unwrap();
    let first = rbd_volume::delete_volume(
        &cluster,
        pool(),
        copy,
        &Claimant::volume(copy),
        &Hooks::default(),
    )
    .await;
    assert!(first.is_err(), "{first:?}");
    assert!(in_other());
    drop(holder);
    // the retry, with the volume and its record gone, still finds and removes it
    let retry = rbd_volume::delete_volume(
        &cluster,
        pool(),
        copy,
        &Claimant::volume(copy),
        &Hooks::default(),
    )
    .await
    .unwrap();
    assert_eq!(retry, Deleted::AlreadyGone);
    assert!(!in_other(), "the intermediate in {other} leaked");
    ceph.rbd(&["rm", &format!("{other}/{source}")]).unwrap();
}

/// A connection as a user whose client configuration (the monitors' central configuration,
/// which the client reads when it connects) sets `rbd_default_clone_format` to `1`.
async fn cluster_with_clone_format_1() -> Arc<ceph_rbd::Cluster> {
    let ceph = micro_ceph::cluster();
    let user = "clone-format-1";
    let ceph_cli = |args: &[&str]| {
        let out = ceph.cli("ceph").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ceph {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let entity = format!("client.{user}");
    let key = ceph_cli(&[
        "auth",
        "get-or-create-key",
        &entity,
        "mon",
        "profile rbd",
        "osd",
        "profile rbd",
    ]);
    ceph_cli(&["config", "set", &entity, "rbd_default_clone_format", "1"]);
    let pool = ConnectionPool::new(PoolOptions::default());
    pool.get(&ClusterConfig::new(&ceph.monitors, user, Secret::new(key)))
        .await
        .unwrap()
}

fn rbd_json(args: &[&str]) -> serde_json::Value {
    let out = micro_ceph::cluster().rbd(args).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("rbd {}: {e}: {out}", args.join(" ")))
}

/// `rbd info --format json` of `pool/image`.
fn info(image: &str) -> serde_json::Value {
    rbd_json(&["info", "--format", "json", &format!("{}/{image}", pool())])
}

fn op_features(info: &serde_json::Value) -> Vec<String> {
    info["op_features"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// With `rbd_default_clone_format=1` in the client's configuration, every clone is librbd's
/// clone v1, never the RADOS-level clone v2: seen at the moment each clone exists (a snapshot
/// image, a restore, a volume clone's intermediate and the clone), it has its parent, no
/// `clone-child` operation feature, and its parent snapshot is protected. Each is then
/// flattened (this layout keeps no snapshot on a source) and every one holds its own
/// source's bytes; a snapshot made the old way (clone v2) restores and deletes on it too;
/// deleting them all leaves no image, snapshot or trash entry behind.
#[tokio::test]
async fn with_clone_format_1_every_clone_is_a_protected_snapshot_clone_v1_holding_its_bytes() {
    let admin = cluster().await;
    let source = "clone-v1-src";
    volume(&admin, source, 8 * MIB).await;
    write(source, 0, "before the snapshot");
    write(source, 5 * MIB, "second object");
    let v1 = cluster_with_clone_format_1().await;
    assert_eq!(v1.clone_format().await.unwrap(), ceph_rbd::CloneFormat::V1);

    let (restored, cloned) = ("clone-v1-restore", "clone-v1-clone");
    let ours: Vec<String> = vec![
        snapshot_image_name("clone-v1-snap"),
        restored.to_owned(),
        rbd_volume::snapshot::clone_intermediate_name(pool(), cloned),
        cloned.to_owned(),
    ];

    // what each clone v1 looks like the moment librbd made it
    let seen: Arc<std::sync::Mutex<Vec<(String, serde_json::Value, serde_json::Value)>>> =
        Arc::default();
    let prefix = format!("{}/", pool());
    let _hook = ceph_rbd::steps::install({
        let (seen, ours) = (Arc::clone(&seen), ours.clone());
        Arc::new(move |step, at| {
            let Some(image) = at.strip_prefix(&prefix) else {
                return;
            };
            if step != ceph_rbd::steps::CLONE_V1_MADE || !ours.iter().any(|o| o == image) {
                return;
            }
            let clone = info(image);
            let parent = &clone["parent"];
            let parent_snap = rbd_json(&[
                "info",
                "--format",
                "json",
                &format!(
                    "{}/{}@{}",
                    parent["pool"].as_str().unwrap_or_default(),
                    parent["image"].as_str().unwrap_or_default(),
                    parent["snapshot"].as_str().unwrap_or_default()
                ),
            ]);
            seen.lock()
                .unwrap()
                .push((image.to_owned(), clone, parent_snap));
        })
    });

    let snap = snapshot(&v1, source, "clone-v1-snap").await;
    write(source, 0, "after the snapshot!");
    restore(&v1, restored, 8 * MIB, &snap).await;
    clone(
        &v1,
        cloned,
        8 * MIB,
        Source::Volume {
            pool: pool(),
            image: source,
        },
        &volume_id(source),
    )
    .await
    .unwrap();

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let names: Vec<String> = seen.iter().map(|(image, _, _)| image.clone()).collect();
    assert_eq!(names, ours, "snapshot, restore, intermediate, clone");
    for (image, clone, parent_snap) in &seen {
        assert!(clone["parent"].is_object(), "{image}: {clone}");
        assert!(
            !op_features(clone).iter().any(|f| f == "clone-child"),
            "{image}: {clone}"
        );
        assert_eq!(parent_snap["protected"], "true", "{image}: {parent_snap}");
    }

    // flattened, each with its own source's bytes
    assert_eq!(read(restored, 0, 19), "before the snapshot");
    assert_eq!(read(restored, 5 * MIB, 13), "second object");
    assert_eq!(read(cloned, 0, 19), "after the snapshot!");
    assert_eq!(read(cloned, 5 * MIB, 13), "second object");
    assert_eq!(read(&snap.image, 0, 19), "before the snapshot");
    for image in [snap.image.as_str(), restored, cloned] {
        let info = info(image);
        assert!(info.get("parent").is_none(), "{image}: {info}");
        assert!(op_features(&info).is_empty(), "{image}: {info}");
    }
    let source_snaps = micro_ceph::cluster()
        .rbd(&["snap", "ls", "--all", &format!("{}/{source}", pool())])
        .unwrap();
    assert!(source_snaps.trim().is_empty(), "{source_snaps}");

    // a snapshot made the old way (clone v2, on a connection that clones v2) restores and
    // deletes through the clone-v1 connection
    let old = snapshot(&admin, source, "clone-v1-old").await;
    assert!(
        info(&old.image)["op_features"]
            .to_string()
            .contains("clone-child")
    );
    let old_restored = "clone-v1-old-restore";
    restore(&v1, old_restored, 8 * MIB, &old).await;
    assert_eq!(read(old_restored, 0, 19), "after the snapshot!");
    assert!(info(old_restored).get("parent").is_none());
    delete_volume(&v1, old_restored).await;
    rbd_volume::delete_snapshot(&v1, pool(), &old.image)
        .await
        .unwrap();

    // everything deletes, the protected snapshot `N@N` with its image
    for image in [restored, cloned, source] {
        assert_eq!(delete_volume(&v1, image).await, Deleted::Removed, "{image}");
    }
    rbd_volume::delete_snapshot(&v1, pool(), &snap.image)
        .await
        .unwrap();
    let left = admin.list_images(pool()).await.unwrap();
    let trashed = trash_names(&admin).await;
    for image in ours
        .iter()
        .map(String::as_str)
        .chain([source, old.image.as_str(), old_restored])
    {
        assert!(!left.iter().any(|i| i == image), "{image}: {left:?}");
        assert!(!trashed.iter().any(|i| i == image), "{image}: {trashed:?}");
    }
}
