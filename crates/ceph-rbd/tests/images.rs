//! Image operations against a real micro-ceph cluster.

mod common;

use std::time::Duration;

use ceph_rbd::{CreateOptions, Error, Features};
use common::*;

const MIB: u64 = 1 << 20;

#[tokio::test]
async fn creates_stats_lists_and_removes_an_image() {
    let cluster = connect().await;
    let pool = pool_name();
    let name = unique("basic");
    let features = Features::parse("layering,exclusive-lock,object-map,fast-diff").unwrap();
    let opts = CreateOptions {
        features: Some(features),
        ..Default::default()
    };
    cluster
        .create_image(&pool, &name, 64 * MIB, &opts)
        .await
        .unwrap();

    let info = cluster.image_info(&pool, &name).await.unwrap();
    assert_eq!(info.size, 64 * MIB);
    assert_eq!(info.features.bits() & features.bits(), features.bits());
    assert_eq!(info.object_size, 4 * MIB);
    assert!(!info.id.is_empty());
    assert_eq!(info.block_name_prefix, format!("rbd_data.{}", info.id));
    assert!(cluster.image_exists(&pool, &name).await.unwrap());
    assert!(cluster.list_images(&pool).await.unwrap().contains(&name));

    cluster.remove_image(&pool, &name).await.unwrap();
    assert!(!cluster.image_exists(&pool, &name).await.unwrap());
    assert!(!cluster.list_images(&pool).await.unwrap().contains(&name));
}

#[tokio::test]
async fn creates_with_object_size_and_striping() {
    let cluster = connect().await;
    let pool = pool_name();
    let name = unique("striped");
    let opts = CreateOptions {
        object_size: Some(MIB),
        stripe_unit: Some(64 * 1024),
        stripe_count: Some(4),
        features: Some(Features::LAYERING),
        ..Default::default()
    };
    cluster
        .create_image(&pool, &name, 16 * MIB, &opts)
        .await
        .unwrap();
    let info = cluster.image_info(&pool, &name).await.unwrap();
    assert_eq!(info.object_size, MIB);
    assert!(
        info.features.contains(Features::STRIPINGV2),
        "{}",
        info.features
    );
    cluster.remove_image(&pool, &name).await.unwrap();

    let bad = CreateOptions {
        object_size: Some(3000),
        ..Default::default()
    };
    let e = cluster
        .create_image(&pool, &name, MIB, &bad)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("object size 3000"), "{e}");
}

#[tokio::test]
async fn refuses_invalid_feature_combinations_before_calling_ceph() {
    let cluster = connect().await;
    let opts = CreateOptions {
        features: Some(Features::LAYERING | Features::OBJECT_MAP),
        ..Default::default()
    };
    let e = cluster
        .create_image(&pool_name(), &unique("badfeat"), MIB, &opts)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("object-map requires exclusive-lock"),
        "{e}"
    );
}

#[tokio::test]
async fn create_of_an_existing_name_is_already_exists() {
    let (cluster, pool, name) = with_image("dup", MIB).await;
    let e = cluster
        .create_image(&pool, &name, MIB, &CreateOptions::default())
        .await
        .unwrap_err();
    assert!(e.is_already_exists(), "{e}");
    assert!(e.to_string().contains(&format!("{pool}/{name}")), "{e}");
    cluster.remove_image(&pool, &name).await.unwrap();
}

#[tokio::test]
async fn missing_images_and_pools_are_not_found() {
    let cluster = connect().await;
    let pool = pool_name();
    let name = unique("ghost");
    let e = cluster.image_info(&pool, &name).await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(
        e.to_string(),
        format!("open image {pool}/{name}: not found")
    );
    assert!(
        cluster
            .remove_image(&pool, &name)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        cluster
            .resize_image(&pool, &name, MIB, false)
            .await
            .unwrap_err()
            .is_not_found()
    );
    let e = cluster.list_images("no-such-pool").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(e.to_string().contains("no-such-pool"), "{e}");
}

#[tokio::test]
async fn remove_of_a_watched_image_is_refused_naming_the_watcher() {
    let (cluster, pool, name) = with_image("watched", MIB).await;
    let guard = micro_ceph::ImageHolder::open(micro_ceph::cluster(), &pool, &name).unwrap();
    let watchers = cluster.watchers(&pool, &name).await.unwrap();
    assert!(
        watchers[0].address.starts_with("127.0.0.1:"),
        "{watchers:?}"
    );

    match cluster.remove_image(&pool, &name).await.unwrap_err() {
        Error::InUse {
            watchers: addrs, ..
        } => assert_eq!(addrs, vec![watchers[0].address.clone()]),
        e => panic!("expected InUse, got {e}"),
    }
    assert!(cluster.image_exists(&pool, &name).await.unwrap());

    drop(guard);
    // the client closed the image cleanly, so its watch is gone at once
    assert!(cluster.watchers(&pool, &name).await.unwrap().is_empty());
    cluster.remove_image(&pool, &name).await.unwrap();
}

#[tokio::test]
async fn resize_grows_and_shrinks_only_when_allowed() {
    let cluster = connect().await;
    let pool = pool_name();
    let name = unique("resize");
    cluster
        .create_image(&pool, &name, 8 * MIB, &CreateOptions::default())
        .await
        .unwrap();
    cluster
        .resize_image(&pool, &name, 32 * MIB, false)
        .await
        .unwrap();
    assert_eq!(
        cluster.image_info(&pool, &name).await.unwrap().size,
        32 * MIB
    );

    let e = cluster
        .resize_image(&pool, &name, 16 * MIB, false)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains(&format!("{pool}/{name}")), "{e}");
    assert_eq!(
        cluster.image_info(&pool, &name).await.unwrap().size,
        32 * MIB
    );

    cluster
        .resize_image(&pool, &name, 16 * MIB, true)
        .await
        .unwrap();
    assert_eq!(
        cluster.image_info(&pool, &name).await.unwrap().size,
        16 * MIB
    );
    cluster.remove_image(&pool, &name).await.unwrap();
}

#[tokio::test]
async fn metadata_round_trips() {
    let (cluster, pool, name) = with_image("meta", MIB).await;
    assert_eq!(
        cluster
            .metadata_get(&pool, &name, "owner.pv")
            .await
            .unwrap(),
        None
    );
    cluster
        .metadata_set(&pool, &name, "owner.pv", "pvc-123")
        .await
        .unwrap();
    cluster
        .metadata_set(&pool, &name, "owner.claim", "default/data")
        .await
        .unwrap();
    let long = "x".repeat(5000);
    cluster
        .metadata_set(&pool, &name, "long", &long)
        .await
        .unwrap();
    assert_eq!(
        cluster
            .metadata_get(&pool, &name, "owner.pv")
            .await
            .unwrap()
            .as_deref(),
        Some("pvc-123")
    );
    assert_eq!(
        cluster
            .metadata_get(&pool, &name, "long")
            .await
            .unwrap()
            .as_deref(),
        Some(long.as_str())
    );
    // an empty value sorts between the others: it must not shift the pairs after it
    cluster
        .metadata_set(&pool, &name, "m.empty", "")
        .await
        .unwrap();
    let all = cluster.metadata_list(&pool, &name).await.unwrap();
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(all["owner.claim"], "default/data");
    assert_eq!(all["owner.pv"], "pvc-123");
    assert_eq!(all["m.empty"], "");
    assert_eq!(all["long"].len(), 5000);
    cluster.remove_image(&pool, &name).await.unwrap();
}

#[tokio::test]
async fn snapshots_clones_and_flatten() {
    let cluster = connect().await;
    let pool = pool_name();
    let parent = unique("parent");
    let child = unique("child");
    cluster
        .create_image(&pool, &parent, 8 * MIB, &CreateOptions::default())
        .await
        .unwrap();
    cluster.snap_create(&pool, &parent, "s1").await.unwrap();
    assert!(
        cluster
            .snap_create(&pool, &parent, "s1")
            .await
            .unwrap_err()
            .is_already_exists()
    );
    cluster.snap_protect(&pool, &parent, "s1").await.unwrap();
    let snaps = cluster.snap_list(&pool, &parent).await.unwrap();
    assert_eq!(snaps.len(), 1);
    assert_eq!(
        (snaps[0].name.as_str(), snaps[0].size, snaps[0].protected),
        ("s1", 8 * MIB, true)
    );

    cluster
        .clone_image(
            &pool,
            &parent,
            "s1",
            &pool,
            &child,
            &CreateOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        cluster.image_info(&pool, &child).await.unwrap().size,
        8 * MIB
    );
    // the parent has a clone and a snapshot: it cannot go
    let e = cluster.remove_image(&pool, &parent).await.unwrap_err();
    assert!(
        matches!(e, Error::HasDependents { .. } | Error::Busy { .. }),
        "{e}"
    );

    cluster.flatten(&pool, &child).await.unwrap();
    cluster.snap_unprotect(&pool, &parent, "s1").await.unwrap();
    cluster.snap_remove(&pool, &parent, "s1").await.unwrap();
    assert!(cluster.snap_list(&pool, &parent).await.unwrap().is_empty());
    assert!(
        cluster
            .snap_remove(&pool, &parent, "s1")
            .await
            .unwrap_err()
            .is_not_found()
    );
    cluster.remove_image(&pool, &child).await.unwrap();
    cluster.remove_image(&pool, &parent).await.unwrap();
}

#[tokio::test]
async fn trash_move_list_restore_and_remove() {
    let (cluster, pool, name) = with_image("trash", MIB).await;
    cluster
        .trash_move(&pool, &name, Duration::ZERO)
        .await
        .unwrap();
    assert!(!cluster.image_exists(&pool, &name).await.unwrap());
    let entry = cluster
        .trash_list(&pool)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.name == name)
        .unwrap();

    cluster
        .trash_restore(&pool, &entry.id, &name)
        .await
        .unwrap();
    assert!(cluster.image_exists(&pool, &name).await.unwrap());

    cluster
        .trash_move(&pool, &name, Duration::from_secs(3600))
        .await
        .unwrap();
    let entry = cluster
        .trash_list(&pool)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.name == name)
        .unwrap();
    // deferred: only a forced removal may take it
    assert!(cluster.trash_remove(&pool, &entry.id, false).await.is_err());
    cluster.trash_remove(&pool, &entry.id, true).await.unwrap();
    assert!(
        !cluster
            .trash_list(&pool)
            .await
            .unwrap()
            .iter()
            .any(|e| e.name == name)
    );
}

#[tokio::test]
async fn pool_and_cluster_stats_report_capacity() {
    let cluster = connect().await;
    // Usage figures come from the mgr's PG statistics. micro-ceph runs without a mgr, so Ceph
    // reports zeros here; the calls must still succeed and stay consistent.
    let stats = cluster.cluster_stats().await.unwrap();
    assert!(stats.avail_bytes <= stats.total_bytes, "{stats:?}");
    assert!(stats.used_bytes <= stats.total_bytes, "{stats:?}");
    cluster.pool_stats(&pool_name()).await.unwrap();
    assert!(
        cluster
            .pool_stats("no-such-pool")
            .await
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn bad_image_names_are_invalid_arguments() {
    let cluster = connect().await;
    let e = cluster
        .create_image(&pool_name(), "a/b", MIB, &CreateOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

#[tokio::test]
async fn a_partially_created_image_can_be_removed_and_created_again() {
    let (cluster, pool, name) = with_image("partial", MIB).await;
    let info = cluster.image_info(&pool, &name).await.unwrap();
    let age = std::time::SystemTime::now()
        .duration_since(info.created)
        .unwrap();
    assert!(age < Duration::from_secs(60), "created {age:?} ago");
    // what a create killed midway leaves: the id object and directory entry, no header
    let out = micro_ceph::cluster()
        .cli("rados")
        .args(["-p", &pool, "rm", &format!("rbd_header.{}", info.id)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        cluster
            .image_info(&pool, &name)
            .await
            .unwrap_err()
            .is_not_found()
    );
    let again = cluster
        .create_image(&pool, &name, MIB, &CreateOptions::default())
        .await;
    assert!(again.unwrap_err().is_already_exists());

    cluster.remove_image(&pool, &name).await.unwrap();
    cluster
        .create_image(&pool, &name, MIB, &CreateOptions::default())
        .await
        .unwrap();
    cluster.remove_image(&pool, &name).await.unwrap();
    assert!(
        cluster
            .remove_image(&pool, &name)
            .await
            .unwrap_err()
            .is_not_found()
    );
}

/// Clones are v2: the parent snapshot need not be protected, and can be removed while a clone of it
/// lives (it waits in the snapshot trash until the clone no longer needs it).
#[tokio::test]
async fn clone_v2_lets_the_parent_snapshot_go_while_the_clone_lives() {
    let cluster = connect().await;
    let pool = pool_name();
    let parent = unique("v2parent");
    let child = unique("v2child");
    cluster
        .create_image(&pool, &parent, 8 * MIB, &CreateOptions::default())
        .await
        .unwrap();
    let before = std::time::SystemTime::now() - Duration::from_secs(60);
    cluster.snap_create(&pool, &parent, "s1").await.unwrap();
    let snaps = cluster.snap_list(&pool, &parent).await.unwrap();
    assert!(snaps[0].created > before, "{snaps:?}");
    assert!(!snaps[0].protected);
    cluster
        .clone_image(
            &pool,
            &parent,
            "s1",
            &pool,
            &child,
            &CreateOptions::default(),
        )
        .await
        .unwrap();
    let spec = cluster.parent(&pool, &child).await.unwrap().unwrap();
    assert_eq!(
        (spec.pool.as_str(), spec.image.as_str(), spec.snap.as_str()),
        (pool.as_str(), parent.as_str(), "s1")
    );
    assert_eq!(cluster.parent(&pool, &parent).await.unwrap(), None);

    // the snapshot goes (to the trash) although the clone still needs it
    cluster.snap_remove(&pool, &parent, "s1").await.unwrap();
    assert!(cluster.snap_list(&pool, &parent).await.unwrap().is_empty());
    let spec = cluster.parent(&pool, &child).await.unwrap().unwrap();
    assert_eq!(spec.image, parent);
    // the parent image itself must wait for the clone
    assert!(cluster.remove_image(&pool, &parent).await.is_err());
    cluster.flatten(&pool, &child).await.unwrap();
    assert_eq!(cluster.parent(&pool, &child).await.unwrap(), None);
    cluster.remove_image(&pool, &parent).await.unwrap();
    cluster.remove_image(&pool, &child).await.unwrap();
}

/// A group snapshot covers all of the group's images at once; removing it and the group leaves
/// the images.
#[tokio::test]
async fn group_snapshots_cover_every_image_at_once() {
    let cluster = connect().await;
    let pool = pool_name();
    let group = unique("grp");
    let images = [unique("gimg"), unique("gimg")];
    for image in &images {
        cluster
            .create_image(&pool, image, 4 * MIB, &CreateOptions::default())
            .await
            .unwrap();
    }
    cluster.group_create(&pool, &group).await.unwrap();
    assert!(
        cluster
            .group_create(&pool, &group)
            .await
            .unwrap_err()
            .is_already_exists()
    );
    for image in &images {
        cluster
            .group_image(&pool, &group, &pool, image, true)
            .await
            .unwrap();
    }
    cluster
        .group_snap(&pool, &group, "gs1", true)
        .await
        .unwrap();
    let snaps = cluster.group_snap_list(&pool, &group).await.unwrap();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!((snaps[0].name.as_str(), snaps[0].complete), ("gs1", true));
    // the images carry it in the group namespace: not among their own snapshots
    for image in &images {
        assert!(cluster.snap_list(&pool, image).await.unwrap().is_empty());
    }
    cluster
        .group_snap(&pool, &group, "gs1", false)
        .await
        .unwrap();
    assert!(
        cluster
            .group_snap_list(&pool, &group)
            .await
            .unwrap()
            .is_empty()
    );
    cluster
        .group_image(&pool, &group, &pool, &images[0], false)
        .await
        .unwrap();
    cluster.group_remove(&pool, &group).await.unwrap();
    // gone: removing again is a no-op (librbd), and the name can be taken again
    cluster.group_remove(&pool, &group).await.unwrap();
    cluster.group_create(&pool, &group).await.unwrap();
    cluster.group_remove(&pool, &group).await.unwrap();
    for image in &images {
        cluster.remove_image(&pool, image).await.unwrap();
    }
}

/// Metadata written on the header without opening the image is what librbd reads, and the
/// unopened listing agrees with librbd's; missing images are not found.
#[tokio::test]
async fn metadata_written_and_read_without_opening_matches_librbd() {
    let (cluster, pool, name) = with_image("meta-unopened", MIB).await;
    let long = "y".repeat(3000);
    cluster
        .metadata_set_unopened(
            &pool,
            &name,
            vec![
                ("owner.pv".into(), "pvc-9".into()),
                ("owner.claim".into(), "ns/claim".into()),
                ("m.empty".into(), String::new()),
                ("long".into(), long.clone()),
            ],
        )
        .await
        .unwrap();
    let librbd = cluster.metadata_list(&pool, &name).await.unwrap();
    assert_eq!(librbd.len(), 4, "{librbd:?}");
    assert_eq!(librbd["owner.pv"], "pvc-9");
    assert_eq!(librbd["m.empty"], "");
    assert_eq!(librbd["long"], long);
    cluster
        .metadata_set(&pool, &name, "later", "by-librbd")
        .await
        .unwrap();
    let unopened = cluster.metadata_list_unopened(&pool, &name).await.unwrap();
    assert_eq!(unopened, cluster.metadata_list(&pool, &name).await.unwrap());
    assert_eq!(unopened["later"], "by-librbd");

    // more keys than one listing page returns
    let many: Vec<(String, String)> = (0..1500)
        .map(|i| (format!("k{i:05}"), i.to_string()))
        .collect();
    cluster
        .metadata_set_unopened(&pool, &name, many)
        .await
        .unwrap();
    let all = cluster.metadata_list_unopened(&pool, &name).await.unwrap();
    assert_eq!(all.len(), 1505);
    assert_eq!(all["k01499"], "1499");

    cluster.remove_image(&pool, &name).await.unwrap();
    for e in [
        cluster
            .metadata_list_unopened(&pool, &name)
            .await
            .unwrap_err(),
        cluster
            .metadata_set_unopened(&pool, &name, vec![("a".into(), "b".into())])
            .await
            .unwrap_err(),
    ] {
        assert!(e.is_not_found(), "{e}");
    }
}

/// A checked removal reads the owner record without opening the image, refuses what the check
/// refuses, and still names the watchers of a watched image.
#[tokio::test]
async fn checked_removal_refuses_by_metadata_and_names_watchers() {
    let (cluster, pool, name) = with_image("checked", MIB).await;
    cluster
        .metadata_set_unopened(&pool, &name, vec![("owner.pv".into(), "pvc-a".into())])
        .await
        .unwrap();
    let refused = cluster
        .remove_image_checked(&pool, &name, |meta| {
            if meta.get("owner.pv").map(String::as_str) == Some("pvc-b") {
                Ok(())
            } else {
                Err(format!("owned by {:?}", meta.get("owner.pv")))
            }
        })
        .await
        .unwrap();
    assert_eq!(refused, Err("owned by Some(\"pvc-a\")".to_string()));
    assert!(cluster.image_exists(&pool, &name).await.unwrap());

    let guard = micro_ceph::ImageHolder::open(micro_ceph::cluster(), &pool, &name).unwrap();
    match cluster
        .remove_image_checked(&pool, &name, |_| Ok(()))
        .await
        .unwrap_err()
    {
        Error::InUse { watchers, .. } => {
            assert_eq!(watchers.len(), 1, "{watchers:?}");
            assert!(watchers[0].starts_with("127.0.0.1:"), "{watchers:?}");
        }
        e => panic!("expected InUse, got {e}"),
    }
    drop(guard);
    assert_eq!(
        cluster
            .remove_image_checked(&pool, &name, |meta| {
                assert_eq!(meta["owner.pv"], "pvc-a");
                Ok(())
            })
            .await
            .unwrap(),
        Ok(())
    );
    assert!(!cluster.image_exists(&pool, &name).await.unwrap());
}

/// The record, size and snapshot of a clone are written and read through the new image's
/// header: what they report must be what librbd reports on an opened image.
#[tokio::test]
async fn a_recorded_clone_reports_what_librbd_reads_back() {
    let (cluster, pool, source) = with_image("recsrc", 8 * MIB).await;
    let (snapshot, restore) = (unique("recsnap"), unique("recrest"));
    let job = |parent: &str, snap: &str, image: &str, temporary, snapshot: Option<String>| {
        ceph_rbd::CloneJob {
            parent_pool: pool.clone(),
            parent: parent.to_string(),
            snap: snap.to_string(),
            temporary,
            pool: pool.clone(),
            image: image.to_string(),
            options: CreateOptions::default(),
            snapshot,
        }
    };
    let made = cluster
        .clone_recorded(
            job(&source, "tmp", &snapshot, true, Some(snapshot.clone())),
            |facts| {
                assert_eq!(facts.map(|f| f.size), Some(8 * MIB));
                ceph_rbd::CloneRecord {
                    metadata: vec![("a".into(), "1".into()), ("b".into(), String::new())],
                    size: None,
                }
            },
        )
        .await
        .unwrap();
    let listed = cluster.snap_list(&pool, &snapshot).await.unwrap();
    assert_eq!(made.snapshot.as_ref(), listed.first(), "{listed:?}");
    assert_eq!(made.size, 8 * MIB);
    let meta = cluster.metadata_list(&pool, &snapshot).await.unwrap();
    assert_eq!((meta["a"].as_str(), meta["b"].as_str()), ("1", ""));
    // the temporary snapshot is gone from the source's user snapshots
    assert!(cluster.snap_list(&pool, &source).await.unwrap().is_empty());

    // a restore that grows: opened for the resize, size from the header otherwise
    let grown = cluster
        .clone_recorded(job(&snapshot, &snapshot, &restore, false, None), |_| {
            ceph_rbd::CloneRecord {
                metadata: vec![("c".into(), "3".into())],
                size: Some(12 * MIB),
            }
        })
        .await
        .unwrap();
    assert_eq!((grown.size, grown.snapshot), (12 * MIB, None));
    assert_eq!(
        cluster.image_info(&pool, &restore).await.unwrap().size,
        12 * MIB
    );
    assert_eq!(
        cluster.metadata_get(&pool, &restore, "c").await.unwrap(),
        Some("3".to_string())
    );
    cluster.remove_image(&pool, &restore).await.unwrap();
    // read without opening: a missing image is NotFound, not a missing key
    let gone = cluster
        .metadata_get(&pool, &restore, "c")
        .await
        .unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    let gone = cluster
        .metadata_list_unopened(&pool, &restore)
        .await
        .unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    cluster
        .snap_remove(&pool, &snapshot, &snapshot)
        .await
        .unwrap();
    cluster.remove_image(&pool, &snapshot).await.unwrap();
    cluster.remove_image(&pool, &source).await.unwrap();
}

/// Writes `len` bytes of `byte` at `offset` of `image` with python-rbd (librbd, not our code).
fn fill(pool: &str, image: &str, offset: u64, len: u64, byte: u8) {
    micro_ceph::cluster()
        .fill_image(pool, image, offset, len, byte)
        .unwrap();
}

/// `rbd du`'s used size of the image's head.
fn rbd_du(pool: &str, image: &str) -> u64 {
    let out = micro_ceph::cluster()
        .rbd(&["du", "--format", "json", &format!("{pool}/{image}")])
        .unwrap();
    let du: serde_json::Value = serde_json::from_str(&out).unwrap();
    du["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["snapshot"].is_null())
        .unwrap()["used_size"]
        .as_u64()
        .unwrap()
}

/// SHA-256 of the image's bytes as `rbd export` writes them.
fn export_digest(pool: &str, image: &str) -> String {
    use sha2::{Digest, Sha256};
    let file = std::env::temp_dir().join(unique("export"));
    micro_ceph::cluster()
        .rbd(&[
            "export",
            "--no-progress",
            &format!("{pool}/{image}"),
            file.to_str().unwrap(),
        ])
        .unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    format!("{:x}", Sha256::digest(&bytes))
}

#[tokio::test]
async fn sparsify_frees_zeroed_objects_and_keeps_every_byte() {
    let (cluster, pool, name) = with_image("sparsify", 64 * MIB).await;
    // 16 MiB of data, then 16 MiB of written zeros further on: 8 allocated 4 MiB objects
    fill(&pool, &name, 0, 16 * MIB, 0x5a);
    fill(&pool, &name, 32 * MIB, 16 * MIB, 0);
    let before = cluster.used_bytes(&pool, &name).await.unwrap();
    assert_eq!(before, 32 * MIB);
    assert_eq!(before, rbd_du(&pool, &name));
    let digest = export_digest(&pool, &name);

    cluster.sparsify(&pool, &name).await.unwrap();

    let after = cluster.used_bytes(&pool, &name).await.unwrap();
    assert_eq!(
        after,
        16 * MIB,
        "the zeroed objects are gone, the data stays"
    );
    assert_eq!(after, rbd_du(&pool, &name));
    assert_eq!(export_digest(&pool, &name), digest);
    // nothing left to free: a second run changes nothing
    cluster.sparsify(&pool, &name).await.unwrap();
    assert_eq!(cluster.used_bytes(&pool, &name).await.unwrap(), 16 * MIB);
    cluster.remove_image(&pool, &name).await.unwrap();
}

#[tokio::test]
async fn used_bytes_without_fast_diff_counts_whole_objects_as_rbd_du_does() {
    let cluster = connect().await;
    let (pool, name) = (pool_name(), unique("du-plain"));
    let opts = CreateOptions {
        features: Some(Features::parse("layering").unwrap()),
        ..Default::default()
    };
    cluster
        .create_image(&pool, &name, 16 * MIB, &opts)
        .await
        .unwrap();
    assert_eq!(cluster.used_bytes(&pool, &name).await.unwrap(), 0);
    fill(&pool, &name, 5 * MIB, MIB, 1);
    fill(&pool, &name, 12 * MIB, 4096, 1);
    let used = cluster.used_bytes(&pool, &name).await.unwrap();
    assert_eq!(used, 8 * MIB, "two objects of 4 MiB exist");
    assert_eq!(used, rbd_du(&pool, &name));
    cluster.remove_image(&pool, &name).await.unwrap();
}

#[tokio::test]
async fn sparsify_and_used_bytes_of_a_missing_image_are_not_found() {
    let cluster = connect().await;
    let pool = pool_name();
    assert!(matches!(
        cluster.sparsify(&pool, "no-such-image").await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        cluster.used_bytes(&pool, "no-such-image").await,
        Err(Error::NotFound { .. })
    ));
}
