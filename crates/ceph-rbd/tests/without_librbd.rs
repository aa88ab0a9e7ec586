//! Creating, cloning and removing images without librbd (the `create`, `plain_clone` and
//! `remove` modules): a plain image is created, and a snapshot of one cloned, with RADOS calls
//! exactly as librbd would (librbd then opens, writes, checks, flattens and removes them), and a
//! plain, unwatched image is removed leaving no object behind; anything else is left to librbd,
//! which does it as before. Against a real micro-ceph
//! cluster; objects are listed with the `rados` CLI, images inspected with the `rbd` CLI.

mod common;

use ceph_rbd::{
    CloneJob, CloneRecord, CreateOptions, Error, Features, cloned_without_librbd,
    created_without_librbd, pool_spec, removed_without_librbd,
};
use common::*;

const MIB: u64 = 1 << 20;
const PLAIN_FULL: &str = "layering,exclusive-lock,object-map,fast-diff,deep-flatten";

/// The counters are process-wide, and one test changes pool settings: the tests take turns.
static COUNTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every object of `spec` (`pool` or `pool/namespace`) whose name contains `needle`.
fn objects(spec: &str, needle: &str) -> Vec<String> {
    let (pool, ns) = spec.split_once('/').unwrap_or((spec, ""));
    micro_ceph::cluster()
        .rados(&["-p", pool, "--namespace", ns, "ls"])
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// Writes 64 scattered 4 KiB blocks, so several data objects exist.
fn scatter_writes(spec: &str, name: &str) {
    micro_ceph::cluster()
        .rbd(&[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "4096",
            "--io-total",
            "262144",
            "--io-pattern",
            "rand",
            &format!("{spec}/{name}"),
        ])
        .unwrap();
}

fn with_features(features: &str) -> CreateOptions {
    CreateOptions {
        features: Some(Features::parse(features).unwrap()),
        ..Default::default()
    }
}

async fn create(spec: &str, name: &str, size: u64, opts: &CreateOptions) {
    connect()
        .await
        .create_image(spec, name, size, opts)
        .await
        .unwrap();
}

/// Removes `spec/name` (written first) and checks that nothing of it is left: data objects,
/// header, object map, ID object, directory entry. Returns whether librbd was bypassed.
async fn remove_and_check_gone(spec: &str, name: &str) -> bool {
    let cluster = connect().await;
    let id = cluster.image_info(spec, name).await.unwrap().id;
    let data = objects(spec, &format!("rbd_data.{id}."));
    assert!(!data.is_empty(), "the writes made no data object");
    let before = removed_without_librbd();
    cluster.remove_image(spec, name).await.unwrap();
    let bypassed = removed_without_librbd() - before == 1;
    assert_eq!(objects(spec, &id), Vec::<String>::new(), "left behind");
    assert_eq!(
        objects(spec, &format!("rbd_id.{name}")),
        Vec::<String>::new()
    );
    assert!(
        !cluster
            .list_images(spec)
            .await
            .unwrap()
            .contains(&name.to_string())
    );
    assert!(!cluster.image_exists(spec, name).await.unwrap());
    // the name is free again
    cluster
        .create_image(spec, name, MIB, &CreateOptions::default())
        .await
        .unwrap();
    cluster.remove_image(spec, name).await.unwrap();
    bypassed
}

#[tokio::test]
async fn plain_images_are_removed_without_librbd_and_leave_no_object() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    let ns = unique("plain-ns");
    cluster.namespace_create(&pool_name(), &ns).await.unwrap();
    for spec in [pool_name(), pool_spec(&pool_name(), &ns)] {
        for features in ["layering", "layering,exclusive-lock,object-map", PLAIN_FULL] {
            let name = unique("plain");
            create(&spec, &name, 64 * MIB, &with_features(features)).await;
            scatter_writes(&spec, &name);
            assert!(
                remove_and_check_gone(&spec, &name).await,
                "{spec}/{name} ({features}) went through librbd"
            );
        }
    }
}

#[tokio::test]
async fn a_lost_object_map_means_every_object_is_removed() {
    let _turn = COUNTER.lock().await;
    let spec = pool_name();
    let name = unique("no-map");
    create(&spec, &name, 32 * MIB, &with_features(PLAIN_FULL)).await;
    scatter_writes(&spec, &name);
    let id = connect().await.image_info(&spec, &name).await.unwrap().id;
    micro_ceph::cluster()
        .rados(&["-p", &spec, "rm", &format!("rbd_object_map.{id}")])
        .unwrap();
    assert!(remove_and_check_gone(&spec, &name).await);
}

#[tokio::test]
async fn images_that_are_not_plain_are_removed_by_librbd() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    let spec = pool_name();

    // striping v2
    let striped = unique("striped");
    let opts = CreateOptions {
        stripe_unit: Some(64 * 1024),
        stripe_count: Some(4),
        ..with_features("layering")
    };
    create(&spec, &striped, 16 * MIB, &opts).await;
    scatter_writes(&spec, &striped);
    assert!(!remove_and_check_gone(&spec, &striped).await);

    // a clone (its parent's snapshot waits in the trash until the clone is gone)
    let parent = unique("parent");
    create(&spec, &parent, 16 * MIB, &with_features(PLAIN_FULL)).await;
    scatter_writes(&spec, &parent);
    cluster.snap_create(&spec, &parent, "base").await.unwrap();
    let child = unique("child");
    cluster
        .clone_image(
            &spec,
            &parent,
            "base",
            &spec,
            &child,
            &CreateOptions::default(),
        )
        .await
        .unwrap();
    scatter_writes(&spec, &child);
    assert!(!remove_and_check_gone(&spec, &child).await);

    // with a snapshot: librbd refuses, nothing is removed
    let before = removed_without_librbd();
    let e = cluster.remove_image(&spec, &parent).await.unwrap_err();
    assert!(matches!(e, Error::HasDependents { .. }), "{e}");
    assert_eq!(removed_without_librbd(), before);
    assert!(cluster.image_exists(&spec, &parent).await.unwrap());
    // the snapshot gone, the parent is plain again
    cluster.snap_remove(&spec, &parent, "base").await.unwrap();
    assert!(remove_and_check_gone(&spec, &parent).await);
}

#[tokio::test]
async fn a_watched_image_is_left_to_librbd_which_names_the_watcher() {
    let _turn = COUNTER.lock().await;
    let (cluster, pool, name) = with_image("watched-plain", 8 * MIB).await;
    let holder = micro_ceph::ImageHolder::open(micro_ceph::cluster(), &pool, &name).unwrap();
    let before = removed_without_librbd();
    let e = cluster.remove_image(&pool, &name).await.unwrap_err();
    assert!(matches!(e, Error::InUse { .. }), "{e}");
    assert_eq!(removed_without_librbd(), before);
    assert!(cluster.image_exists(&pool, &name).await.unwrap());
    drop(holder);
    cluster.remove_image(&pool, &name).await.unwrap();
    assert_eq!(removed_without_librbd(), before + 1);
}

/// `rbd info` of an image without what differs between two images (name, ID, timestamps).
fn info_shape(spec: &str, name: &str) -> serde_json::Value {
    let out = micro_ceph::cluster()
        .rbd(&["info", "--format", "json", &format!("{spec}/{name}")])
        .unwrap();
    let mut info: serde_json::Value = serde_json::from_str(&out).unwrap();
    let map = info.as_object_mut().unwrap();
    for key in [
        "name",
        "id",
        "block_name_prefix",
        "create_timestamp",
        "access_timestamp",
        "modify_timestamp",
    ] {
        assert!(map.remove(key).is_some(), "rbd info has no {key}");
    }
    info
}

/// python-rbd's `Image.stat()` of `spec/name`, as JSON.
fn python_stat(spec: &str, name: &str) -> serde_json::Value {
    const STAT: &str = "import sys, json, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2]); io.set_namespace(sys.argv[3])
img = rbd.Image(io, sys.argv[4], read_only=True)
print(json.dumps(img.stat(), default=str)); img.close(); io.close(); c.shutdown()";
    let (pool, ns) = spec.split_once('/').unwrap_or((spec, ""));
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", STAT])
        .arg(&micro_ceph::cluster().conf_path)
        .args([pool, ns, name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The image's ID is one librbd could have made (at most 14 characters), and `rbd info`,
/// python-rbd's `stat()` and `rbd status` read the same object prefix for it.
async fn assert_same_identity(cluster: &ceph_rbd::Cluster, spec: &str, name: &str) {
    let id = cluster.image_info(spec, name).await.unwrap().id;
    assert!(
        !id.is_empty() && id.len() <= 14 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    let prefix = format!("rbd_data.{id}");
    let out = micro_ceph::cluster()
        .rbd(&["info", "--format", "json", &format!("{spec}/{name}")])
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(info["id"], serde_json::json!(id));
    assert_eq!(info["block_name_prefix"], serde_json::json!(prefix));
    assert_eq!(
        python_stat(spec, name)["block_name_prefix"],
        serde_json::json!(prefix)
    );
    micro_ceph::cluster()
        .rbd(&["status", &format!("{spec}/{name}")])
        .unwrap();
}

/// librbd validates a pool ("overwrite validated" in rbd_info) when it first creates an image
/// there; until then images are created through librbd. Makes sure that happened, whichever
/// test of this binary runs first.
fn validate_pool() {
    let validate = unique("validate");
    micro_ceph::cluster()
        .rbd(&[
            "create",
            "--size",
            "1M",
            &format!("{}/{validate}", pool_name()),
        ])
        .unwrap();
    micro_ceph::cluster()
        .rbd(&[
            "rm",
            "--no-progress",
            &format!("{}/{validate}", pool_name()),
        ])
        .unwrap();
}

#[tokio::test]
async fn plain_images_are_created_without_librbd_as_librbd_creates_them() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    validate_pool();
    let ns = unique("create-ns");
    cluster.namespace_create(&pool_name(), &ns).await.unwrap();
    let owner = vec![
        ("provisioner.ceph.com/pv".to_string(), "pvc-1".to_string()),
        (
            "provisioner.ceph.com/claim".to_string(),
            "ns/claim".to_string(),
        ),
    ];
    for spec in [pool_name(), pool_spec(&pool_name(), &ns)] {
        for features in ["layering", "layering,exclusive-lock,object-map", PLAIN_FULL] {
            let (ours, theirs) = (unique("ours"), unique("theirs"));
            let before = created_without_librbd();
            create(&spec, &ours, 100 * MIB, &with_features(features)).await;
            cluster
                .metadata_set_unopened(&spec, &ours, owner.clone())
                .await
                .unwrap();
            assert_eq!(created_without_librbd(), before + 1, "{spec} {features}");
            micro_ceph::cluster()
                .rbd(&[
                    "create",
                    "--size",
                    "100M",
                    "--image-feature",
                    features,
                    &format!("{spec}/{theirs}"),
                ])
                .unwrap();
            assert_eq!(info_shape(&spec, &ours), info_shape(&spec, &theirs));
            assert_same_identity(&cluster, &spec, &ours).await;
            assert_eq!(
                cluster.metadata_list_unopened(&spec, &ours).await.unwrap(),
                owner.iter().cloned().collect()
            );
            assert!(cluster.list_images(&spec).await.unwrap().contains(&ours));
            // librbd uses it: writes, keeps its object map right, removes it
            scatter_writes(&spec, &ours);
            if features == PLAIN_FULL {
                micro_ceph::cluster()
                    .rbd(&["object-map", "check", &format!("{spec}/{ours}")])
                    .unwrap();
            }
            // no "object map invalid" or other flag after use
            assert_eq!(info_shape(&spec, &ours)["flags"], serde_json::json!([]));
            let id = cluster.image_info(&spec, &ours).await.unwrap().id;
            micro_ceph::cluster()
                .rbd(&["rm", &format!("{spec}/{ours}")])
                .unwrap();
            assert_eq!(objects(&spec, &id), Vec::<String>::new(), "left behind");
            cluster.remove_image(&spec, &theirs).await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_taken_name_is_refused_and_nothing_is_left_of_the_attempt() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    let spec = pool_name();
    let name = unique("taken");
    create(&spec, &name, MIB, &with_features(PLAIN_FULL)).await;
    let all = objects(&spec, "");
    let e = cluster
        .create_image(&spec, &name, MIB, &with_features(PLAIN_FULL))
        .await
        .unwrap_err();
    assert!(e.is_already_exists(), "{e}");
    assert_eq!(objects(&spec, ""), all, "the refused create left objects");
    cluster.remove_image(&spec, &name).await.unwrap();
}

#[tokio::test]
async fn images_that_are_not_plain_are_created_by_librbd() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    let spec = pool_name();
    let before = created_without_librbd();
    // librbd's default features, striping
    let defaults = unique("defaults");
    cluster
        .create_image(&spec, &defaults, MIB, &CreateOptions::default())
        .await
        .unwrap();
    let striped = unique("striped");
    let opts = CreateOptions {
        stripe_unit: Some(64 * 1024),
        stripe_count: Some(4),
        ..with_features("layering")
    };
    create(&spec, &striped, 16 * MIB, &opts).await;
    assert!(
        cluster
            .image_info(&spec, &striped)
            .await
            .unwrap()
            .features
            .contains(Features::STRIPINGV2)
    );
    // a pool override of librbd's defaults: librbd applies it
    micro_ceph::cluster()
        .rbd(&["config", "pool", "set", &spec, "rbd_default_order", "20"])
        .unwrap();
    let small = unique("pool-order");
    let made = cluster
        .create_image(&spec, &small, 4 * MIB, &with_features("layering"))
        .await;
    micro_ceph::cluster()
        .rbd(&["config", "pool", "rm", &spec, "rbd_default_order"])
        .unwrap();
    made.unwrap();
    assert_eq!(
        cluster.image_info(&spec, &small).await.unwrap().object_size,
        MIB
    );
    assert_eq!(created_without_librbd(), before);
    for name in [defaults, striped, small] {
        cluster.remove_image(&spec, &name).await.unwrap();
    }
}

/// What a create killed right after its first step leaves (librbd's order, and ours): the
/// directory entry alone. The name is taken until a remove clears it.
#[tokio::test]
async fn a_create_cut_after_its_directory_entry_is_cleared_by_remove() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    let spec = pool_name();
    let name = unique("cut");
    create(&spec, &name, MIB, &with_features(PLAIN_FULL)).await;
    let id = cluster.image_info(&spec, &name).await.unwrap().id;
    for object in [
        format!("rbd_header.{id}"),
        format!("rbd_object_map.{id}"),
        format!("rbd_id.{name}"),
    ] {
        micro_ceph::cluster()
            .rados(&["-p", &spec, "rm", &object])
            .unwrap();
    }
    let e = cluster
        .create_image(&spec, &name, MIB, &with_features(PLAIN_FULL))
        .await
        .unwrap_err();
    assert!(e.is_already_exists(), "{e}");
    match cluster.remove_image(&spec, &name).await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => panic!("{e}"),
    }
    create(&spec, &name, MIB, &with_features(PLAIN_FULL)).await;
    let listed = cluster.list_images(&spec).await.unwrap();
    assert_eq!(listed.iter().filter(|n| **n == name).count(), 1);
    cluster.remove_image(&spec, &name).await.unwrap();
    assert_eq!(objects(&spec, &name), Vec::<String>::new());
}

fn clone_job(parent: (&str, &str, &str), temporary: bool, child: (&str, &str)) -> CloneJob {
    CloneJob {
        parent_pool: parent.0.to_string(),
        parent: parent.1.to_string(),
        snap: parent.2.to_string(),
        temporary,
        pool: child.0.to_string(),
        image: child.1.to_string(),
        options: with_features(PLAIN_FULL),
        snapshot: None,
    }
}

/// `rbd export` of `what` (an image or `image@snap`), as bytes.
fn export(what: &str) -> Vec<u8> {
    let file = std::env::temp_dir().join(unique("export"));
    let path = file.to_str().unwrap();
    micro_ceph::cluster()
        .rbd(&["export", "--no-progress", what, path])
        .unwrap();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    bytes
}

/// `rbd snap ls --all` of `spec/name`: (name, namespace type) of every snapshot.
fn all_snapshots(spec: &str, name: &str) -> Vec<(String, String)> {
    cli_snapshots(spec, name)
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["namespace"]["type"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn clones_of_plain_images_are_made_without_librbd_as_librbd_makes_them() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    validate_pool();
    let pool = pool_name();
    let ns = unique("clone-ns");
    cluster.namespace_create(&pool, &ns).await.unwrap();
    let parent = unique("parent");
    micro_ceph::cluster()
        .rbd(&[
            "create",
            "--size",
            "16M",
            "--image-feature",
            PLAIN_FULL,
            &format!("{pool}/{parent}"),
        ])
        .unwrap();
    scatter_writes(&pool, &parent);
    micro_ceph::cluster()
        .rbd(&[
            "image-meta",
            "set",
            &format!("{pool}/{parent}"),
            "from-parent",
            "p",
        ])
        .unwrap();
    cluster.snap_create(&pool, &parent, "base").await.unwrap();
    // writes after the snapshot are not the clones'
    scatter_writes(&pool, &parent);
    let at_base = export(&format!("{pool}/{parent}@base"));

    // in the parent's namespace and in another one (clone v2 crosses namespaces)
    for spec in [pool.clone(), pool_spec(&pool, &ns)] {
        let (ours, theirs) = (unique("ours"), unique("theirs"));
        let before = cloned_without_librbd();
        let made = cluster
            .clone_recorded(
                clone_job((&pool, &parent, "base"), false, (&spec, &ours)),
                |_| CloneRecord {
                    metadata: vec![("record".into(), "r".into())],
                    size: None,
                },
            )
            .await
            .unwrap();
        assert_eq!(cloned_without_librbd(), before + 1, "{spec}");
        assert_eq!(made.size, 16 * MIB);
        micro_ceph::cluster()
            .rbd(&[
                "clone",
                "--rbd-default-clone-format",
                "2",
                "--image-feature",
                PLAIN_FULL,
                &format!("{pool}/{parent}@base"),
                &format!("{spec}/{theirs}"),
            ])
            .unwrap();
        // the same image as librbd's clone: features, operation features (clone child), size,
        // object size, parent (pool, namespace, image, snapshot, overlap), flags
        let shape = info_shape(&spec, &ours);
        assert_eq!(shape, info_shape(&spec, &theirs), "{spec}");
        assert_eq!(shape["parent"]["snapshot"], serde_json::json!("base"));
        assert_same_identity(&cluster, &spec, &ours).await;
        // the parent's metadata copied, then the record
        let meta = cluster.metadata_list_unopened(&spec, &ours).await.unwrap();
        assert_eq!(meta.get("from-parent").map(String::as_str), Some("p"));
        assert_eq!(meta.get("record").map(String::as_str), Some("r"));
        // the parent's snapshot counts it as a child
        let children = micro_ceph::cluster()
            .rbd(&[
                "children",
                "--format",
                "json",
                &format!("{pool}/{parent}@base"),
            ])
            .unwrap();
        let children: Vec<serde_json::Value> = serde_json::from_str(&children).unwrap();
        let listed: Vec<&str> = children
            .iter()
            .map(|c| c["image"].as_str().unwrap())
            .collect();
        assert!(
            listed.contains(&ours.as_str()) && listed.contains(&theirs.as_str()),
            "{children:?}"
        );
        // it reads the snapshot's data; librbd writes to it, keeps its object map and flattens it
        assert_eq!(export(&format!("{spec}/{ours}")), at_base);
        micro_ceph::cluster()
            .rbd(&["object-map", "check", &format!("{spec}/{ours}")])
            .unwrap();
        scatter_writes(&spec, &ours);
        micro_ceph::cluster()
            .rbd(&["object-map", "check", &format!("{spec}/{ours}")])
            .unwrap();
        micro_ceph::cluster()
            .rbd(&["flatten", "--no-progress", &format!("{spec}/{ours}")])
            .unwrap();
        assert!(cluster.parent(&spec, &ours).await.unwrap().is_none());
        assert_eq!(info_shape(&spec, &ours)["flags"], serde_json::json!([]));
        let id = cluster.image_info(&spec, &ours).await.unwrap().id;
        cluster.remove_image(&spec, &ours).await.unwrap();
        assert_eq!(objects(&spec, &id), Vec::<String>::new(), "left behind");
        cluster.remove_image(&spec, &theirs).await.unwrap();
    }
    // no clone left: the snapshot goes like any other
    cluster.snap_remove(&pool, &parent, "base").await.unwrap();
    assert_eq!(all_snapshots(&pool, &parent), Vec::new());

    cluster.remove_image(&pool, &parent).await.unwrap();

    // told no features, the clone has the parent's, as librbd's has
    for features in [PLAIN_FULL, "layering,exclusive-lock,object-map", "layering"] {
        let source = unique("inherit");
        micro_ceph::cluster()
            .rbd(&[
                "create",
                "--size",
                "4M",
                "--image-feature",
                features,
                &format!("{pool}/{source}"),
            ])
            .unwrap();
        cluster.snap_create(&pool, &source, "s").await.unwrap();
        let (ours, theirs) = (unique("ours"), unique("theirs"));
        let mut job = clone_job((&pool, &source, "s"), false, (&pool, &ours));
        job.options = CreateOptions::default();
        let before = cloned_without_librbd();
        cluster
            .clone_recorded(job, |_| CloneRecord::default())
            .await
            .unwrap();
        assert_eq!(cloned_without_librbd(), before + 1, "{features}");
        micro_ceph::cluster()
            .rbd(&[
                "clone",
                "--rbd-default-clone-format",
                "2",
                &format!("{pool}/{source}@s"),
                &format!("{pool}/{theirs}"),
            ])
            .unwrap();
        assert_eq!(
            info_shape(&pool, &ours),
            info_shape(&pool, &theirs),
            "{features}"
        );
        for image in [ours, theirs] {
            cluster.remove_image(&pool, &image).await.unwrap();
        }
        cluster.snap_remove(&pool, &source, "s").await.unwrap();
        cluster.remove_image(&pool, &source).await.unwrap();
    }

    // a parent with journaling is librbd's to clone
    let journaled = unique("journaled");
    micro_ceph::cluster()
        .rbd(&[
            "create",
            "--size",
            "4M",
            "--image-feature",
            "layering,exclusive-lock,journaling",
            &format!("{pool}/{journaled}"),
        ])
        .unwrap();
    cluster.snap_create(&pool, &journaled, "s").await.unwrap();
    let before = cloned_without_librbd();
    let by_librbd = unique("by-librbd");
    cluster
        .clone_recorded(
            clone_job((&pool, &journaled, "s"), false, (&pool, &by_librbd)),
            |_| CloneRecord::default(),
        )
        .await
        .unwrap();
    assert_eq!(cloned_without_librbd(), before);
    assert!(cluster.parent(&pool, &by_librbd).await.unwrap().is_some());
    cluster.remove_image(&pool, &by_librbd).await.unwrap();
    cluster.snap_remove(&pool, &journaled, "s").await.unwrap();
    cluster.remove_image(&pool, &journaled).await.unwrap();
}

#[tokio::test]
async fn a_temporary_snapshot_is_trashed_after_a_clone_without_librbd_and_goes_with_it() {
    let _turn = COUNTER.lock().await;
    let cluster = connect().await;
    validate_pool();
    let pool = pool_name();
    let source = unique("source");
    create(&pool, &source, 8 * MIB, &with_features(PLAIN_FULL)).await;
    scatter_writes(&pool, &source);
    // a node has it mapped: the temporary snapshot goes through librbd (which asks the holder),
    // and the holder is told when it goes to the trash
    let holder = micro_ceph::ImageHolder::open(micro_ceph::cluster(), &pool, &source).unwrap();
    let mut snapshots = Vec::new();
    for _ in 0..3 {
        let image = unique("snapimg");
        let mut job = clone_job(
            (&pool, &source, &format!("tmp-{image}")),
            true,
            (&pool, &image),
        );
        job.snapshot = Some(image.clone());
        let before = cloned_without_librbd();
        let made = cluster
            .clone_recorded(job, |facts| {
                assert_eq!(facts.map(|f| f.size), Some(8 * MIB));
                CloneRecord::default()
            })
            .await
            .unwrap();
        assert_eq!(cloned_without_librbd(), before + 1);
        assert_eq!(
            made.snapshot.as_ref().map(|s| s.name.as_str()),
            Some(image.as_str())
        );
        assert_eq!(
            export(&format!("{pool}/{image}@{image}")),
            export(&format!("{pool}/{source}"))
        );
        snapshots.push(image);
    }
    // no user snapshot is left on the source, one trashed snapshot per clone
    let all = all_snapshots(&pool, &source);
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all.iter().all(|(_, ns)| ns == "trash"), "{all:?}");
    assert!(cluster.snap_list(&pool, &source).await.unwrap().is_empty());
    let info = micro_ceph::cluster()
        .rbd(&[
            "info",
            "--format",
            "json",
            &format!("{pool}/{}", snapshots[0]),
        ])
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    // its parent is the trashed snapshot (renamed by the trash), not a user snapshot
    let parent_snap = info["parent"]["snapshot"].as_str().unwrap();
    assert!(all.iter().any(|(name, _)| name == parent_snap), "{info}");
    drop(holder);
    // each trashed snapshot goes with its clone
    for (gone, image) in snapshots.iter().enumerate() {
        cluster.snap_remove(&pool, image, image).await.unwrap();
        cluster.remove_image(&pool, image).await.unwrap();
        assert_eq!(all_snapshots(&pool, &source).len(), 2 - gone);
    }
    cluster.remove_image(&pool, &source).await.unwrap();
}

/// A librbd client that opens a plain image with exclusive-lock after the removal's watcher
/// probe (paused there: `ceph_rbd::steps::REMOVE_PROBED`) and writes: it finds the lock the
/// removal holds, as librbd's own remove holds it, and waits; the removal sees it before the
/// header goes and leaves the image, whole, to librbd (which takes the lock from the client
/// once it has written and closed, or refuses while it watches); no object is left. With the
/// probe alone, the client wrote while the data objects were being removed, and its data
/// object outlived the header (a leak nothing lists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_opens_an_image_being_removed_leaves_no_object_behind() {
    use std::io::BufRead;
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    let _turn = COUNTER.lock().await;
    let spec = pool_name();
    let name = unique("remove-locked");
    create(&spec, &name, 16 * MIB, &with_features(PLAIN_FULL)).await;
    scatter_writes(&spec, &name);
    let cluster = connect().await;
    let id = cluster.image_info(&spec, &name).await.unwrap().id;

    let (at_tx, at_rx) = mpsc::channel::<()>();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let resume_rx = Mutex::new(resume_rx);
    let paused = format!("{spec}/{name}");
    // only the first removal pauses: when librbd refuses while the writer watches, the test
    // removes the image again, through the same probe
    let first = std::sync::atomic::AtomicBool::new(true);
    let _hook = ceph_rbd::steps::install(Arc::new(move |step, target| {
        if step == ceph_rbd::steps::REMOVE_PROBED
            && target == paused
            && first.swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            at_tx.send(()).unwrap();
            resume_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(120))
                .unwrap();
        }
    }));
    let before = removed_without_librbd();
    let removing = {
        let (cluster, spec, name) = (Arc::clone(&cluster), spec.clone(), name.clone());
        tokio::spawn(async move { cluster.remove_image(&spec, &name).await })
    };
    let (writer_spec, writer_name) = (spec.clone(), name.clone());
    let (writer, lines) = tokio::task::spawn_blocking(move || {
        let wait = Duration::from_secs(60);
        at_rx.recv_timeout(wait).unwrap();
        let ceph = micro_ceph::cluster();
        let mut writer = std::process::Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    print('opened', flush=True)
    img.write(b'x' * 4096, 15 << 20)
    print('written', flush=True)
io.close(); c.shutdown()
",
            ])
            .arg(&ceph.conf_path)
            .args([&writer_spec, &writer_name])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = writer.stdout.take().unwrap();
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let _ = lines_tx.send(line.unwrap_or_default());
            }
        });
        assert_eq!(lines.recv_timeout(wait).unwrap(), "opened");
        // the writer asks for the lock (or writes, without it): the removal goes on
        resume_tx.send(()).unwrap();
        (writer, lines)
    })
    .await
    .unwrap();
    let removed = tokio::time::timeout(Duration::from_secs(60), removing)
        .await
        .expect("the removal finished")
        .unwrap();
    assert_eq!(
        removed_without_librbd(),
        before,
        "the removal noticed the client and left the image to librbd"
    );
    // librbd asks the writer for the lock: the writer writes into the image, which still
    // exists, closes it, and librbd removes it with the writer's data; or librbd finds it
    // still watched and refuses, naming it
    let mut writer = writer;
    let (status, said) = tokio::task::spawn_blocking(move || {
        let status = writer.wait().unwrap();
        (status, lines.try_iter().collect::<Vec<String>>())
    })
    .await
    .unwrap();
    assert!(
        status.success() && said.contains(&"written".to_string()),
        "{said:?}"
    );
    // refused while in use: InUse names the watcher, Busy is librbd's answer while the writer's
    // close is still being torn down; the writer has exited, so a later removal goes through
    if let Err(e) = removed {
        assert!(matches!(e, Error::InUse { .. } | Error::Busy { .. }), "{e}");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match cluster.remove_image(&spec, &name).await {
                Ok(()) => break,
                Err(Error::InUse { .. } | Error::Busy { .. })
                    if std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert!(!cluster.image_exists(&spec, &name).await.unwrap());
    assert_eq!(objects(&spec, &id), Vec::<String>::new(), "left behind");
}
