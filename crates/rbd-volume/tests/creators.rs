//! Two creators of one image at once (a Lease handover: the previous leader's create still in
//! flight when the new leader provisions the same claim), against a private Ceph cluster: only
//! the creator that holds the name repairs a half-created image.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, Features, PoolOptions, Secret};
use rbd_volume::{Error, Fit, Hooks, NewImage, Outcome, Owner};

const MIB: u64 = 1 << 20;

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

/// Runs a Ceph CLI (`rbd`, `rados`) on the test cluster; its stdout.
fn cli(program: &str, args: &[&str]) -> String {
    let ceph = micro_ceph::cluster();
    let out = Command::new(program)
        .arg("-c")
        .arg(&ceph.conf_path)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a create leaves between its ID object and its header: made with the CLI (an image,
/// then its header removed).
fn half_created(image: &str) {
    let pool = &micro_ceph::cluster().pool;
    let spec = format!("{pool}/{image}");
    cli("rbd", &["create", &spec, "--size", "8M"]);
    let info = cli("rbd", &["info", "--format", "json", &spec]);
    let id = info
        .split("\"id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    cli("rados", &["-p", pool, "rm", &format!("rbd_header.{id}")]);
}

fn id_object_exists(image: &str) -> bool {
    let ceph = micro_ceph::cluster();
    Command::new("rados")
        .arg("-c")
        .arg(&ceph.conf_path)
        .args(["-p", &ceph.pool, "stat", &format!("rbd_id.{image}")])
        .output()
        .unwrap()
        .status
        .success()
}

async fn ensure(cluster: &ceph_rbd::Cluster, image: &str) -> Result<Outcome, Error> {
    let owner = Owner {
        pv: image.into(),
        claim: format!("ns/{image}"),
        provisioner: "ceph.com/rbd".into(),
        kube_cluster: "uid-a".into(),
    };
    rbd_volume::ensure(
        cluster,
        &NewImage {
            pool: &micro_ceph::cluster().pool,
            image,
            size: 8 * MIB,
            // plain: created with RADOS calls, which take the creator lock
            options: &CreateOptions {
                features: Some(Features::LAYERING | Features::EXCLUSIVE_LOCK),
                ..CreateOptions::default()
            },
            owner: &owner,
            fit: Fit::Grow,
        },
        &Hooks::default(),
    )
    .await
    .map(|ensured| ensured.outcome)
}

#[tokio::test]
async fn a_half_created_image_whose_creator_holds_the_name_is_not_repaired_by_another() {
    let cluster = cluster().await;
    let image = "creators-held";
    half_created(image);
    // the other creator (another client: the rados CLI) holds the name for 8 s
    let pool = &micro_ceph::cluster().pool;
    let held_from = Instant::now();
    cli(
        "rados",
        &[
            "-p",
            pool,
            "lock",
            "get",
            &format!("rbd_id.{image}"),
            "rbd-provisioner.create",
            "--lock-cookie",
            "create",
            "--lock-duration",
            "8",
        ],
    );

    let refused = ensure(&cluster, image).await;
    assert!(
        matches!(refused, Err(Error::BeingCreated { .. })),
        "{refused:?}"
    );
    assert!(
        id_object_exists(image),
        "the other creator's partial image was removed"
    );

    // once its claim on the name expires (a creator that died), the image is repaired
    let deadline = Instant::now() + Duration::from_secs(60);
    let outcome = loop {
        match ensure(&cluster, image).await {
            Ok(outcome) => break outcome,
            Err(Error::BeingCreated { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("the repair failed: {e}"),
        }
    };
    assert_eq!(outcome, Outcome::Recreated);
    assert!(
        held_from.elapsed() >= Duration::from_secs(7),
        "repaired {:?} after the lock was taken, before it expired",
        held_from.elapsed()
    );
    rbd_volume::delete(
        &cluster,
        pool,
        image,
        &rbd_volume::Claimant::volume(image),
        &Hooks::default(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_half_created_image_nobody_holds_is_repaired_at_once() {
    let cluster = cluster().await;
    let image = "creators-crashed";
    // a create that crashed (the CLI's create takes no creator lock, like librbd's)
    half_created(image);
    assert_eq!(ensure(&cluster, image).await.unwrap(), Outcome::Recreated);
    // the plain create holds the name for its creator: this client may repair it, another not
    let pool = &micro_ceph::cluster().pool;
    let locks = cli(
        "rados",
        &["-p", pool, "lock", "list", &format!("rbd_id.{image}")],
    );
    assert!(locks.contains("rbd-provisioner.create"), "{locks}");
    assert!(cluster.claim_partial_image(pool, image).await.unwrap());
    rbd_volume::delete(
        &cluster,
        pool,
        image,
        &rbd_volume::Claimant::volume(image),
        &Hooks::default(),
    )
    .await
    .unwrap();
}
