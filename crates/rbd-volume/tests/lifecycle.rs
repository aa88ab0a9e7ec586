//! The volume core against a private Ceph cluster: the hooks fire at the crash points in order,
//! an adopted image is grown and recorded (provisioner fit), a delete by volume name refuses
//! another volume's image, grow never shrinks.

use std::sync::Mutex;

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};
use rbd_volume::{
    Claimant, Deleted, Error, Fit, Hooks, META_CLAIM, META_PROVISIONER, META_PV, NewImage, Outcome,
    Owner, Step,
};

const MIB: u64 = 1 << 20;

async fn cluster() -> std::sync::Arc<ceph_rbd::Cluster> {
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

fn owner(pv: &str) -> Owner {
    Owner {
        pv: pv.into(),
        claim: "ns/claim".into(),
        provisioner: "ceph.com/rbd".into(),
        kube_cluster: String::new(),
    }
}

static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_step(step: Step) {
    SEEN.lock().unwrap().push(step.name().to_string());
}

fn record_key(key: &str) {
    SEEN.lock().unwrap().push(key.to_string());
}

const RECORDING: Hooks = Hooks {
    step: record_step,
    owner_key_written: record_key,
};

#[tokio::test]
async fn hooks_fire_at_each_step_in_order_and_the_pv_key_goes_last() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let image = "core-hooks";
    let owner = owner("pvc-hooks");
    let new = NewImage {
        pool,
        image,
        size: 8 * MIB,
        options: &CreateOptions::default(),
        owner: &owner,
        fit: Fit::Grow,
    };
    let ensured = rbd_volume::ensure(&cluster, &new, &RECORDING)
        .await
        .unwrap();
    assert_eq!(ensured.outcome, Outcome::Created);
    let grown = rbd_volume::grow(&cluster, pool, image, 16 * MIB, &RECORDING)
        .await
        .unwrap();
    assert_eq!((grown.from, grown.size), (8 * MIB, 16 * MIB));
    let same = rbd_volume::grow(&cluster, pool, image, 4 * MIB, &RECORDING)
        .await
        .unwrap();
    assert_eq!(same.size, 16 * MIB, "never shrinks");
    let claimant = Claimant::volume("pvc-hooks");
    let deleted = rbd_volume::delete(&cluster, pool, image, &claimant, &RECORDING)
        .await
        .unwrap();
    assert_eq!(deleted, Deleted::Removed);
    let again = rbd_volume::delete(&cluster, pool, image, &claimant, &RECORDING)
        .await
        .unwrap();
    assert_eq!(again, Deleted::AlreadyGone);
    assert_eq!(
        *SEEN.lock().unwrap(),
        [
            "after-image-create",
            META_PROVISIONER,
            META_CLAIM,
            META_PV,
            "after-image-metadata",
            "after-image-resize",
            "after-image-remove",
        ]
    );
}

#[tokio::test]
async fn an_adopted_smaller_image_is_grown_and_recorded_and_another_volumes_is_refused() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let image = "core-adopt";
    let _ = cluster.remove_image(pool, image).await;
    cluster
        .create_image(pool, image, 4 * MIB, &CreateOptions::default())
        .await
        .unwrap();
    let mine = owner("pvc-adopt");
    let new = NewImage {
        pool,
        image,
        size: 8 * MIB,
        options: &CreateOptions::default(),
        owner: &mine,
        fit: Fit::Grow,
    };
    let ensured = rbd_volume::ensure(&cluster, &new, &Hooks::default())
        .await
        .unwrap();
    assert_eq!(ensured.outcome, Outcome::Adopted);
    assert_eq!(ensured.size, 8 * MIB);
    assert_eq!(cluster.image_info(pool, image).await.unwrap().size, 8 * MIB);
    let meta = cluster.metadata_list(pool, image).await.unwrap();
    assert_eq!(meta[META_PV], "pvc-adopt");
    assert_eq!(meta[META_CLAIM], "ns/claim");

    // the same image is another volume's for anyone else: not reused, not deleted
    let theirs = owner("pvc-other");
    let err = rbd_volume::ensure(
        &cluster,
        &NewImage {
            owner: &theirs,
            ..new
        },
        &Hooks::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Foreign { .. }), "{err}");
    let err = rbd_volume::delete(
        &cluster,
        pool,
        image,
        &Claimant::volume("pvc-other"),
        &Hooks::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "image {pool}/{image} belongs to PV pvc-adopt (claim ns/claim), not pvc-other; refusing to delete it"
        )
    );
    assert!(cluster.image_exists(pool, image).await.unwrap());
    // CSI's fit: an existing image outside the range is a mismatch, not resized
    let err = rbd_volume::ensure(
        &cluster,
        &NewImage {
            fit: Fit::Within {
                required: 16 * MIB,
                limit: 0,
            },
            ..new
        },
        &Hooks::default(),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::SizeMismatch { size, .. } if size == 8 * MIB),
        "{err}"
    );
    rbd_volume::delete(&cluster, pool, image, &Claimant::image(), &Hooks::default())
        .await
        .unwrap_err();
    rbd_volume::delete(
        &cluster,
        pool,
        image,
        &Claimant::volume("pvc-adopt"),
        &Hooks::default(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn volumes_in_namespaces_are_ensured_and_deleted_there_and_a_missing_one_is_named() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let namespace = format!("core-ns-{}", std::process::id());
    cluster.namespace_create(pool, &namespace).await.unwrap();
    let spec = ceph_rbd::pool_spec(pool, &namespace);
    let image = "core-ns-volume";
    let owner = owner("pvc-ns");
    let options = CreateOptions::default();
    let new = |pool| NewImage {
        pool,
        image,
        size: 8 * MIB,
        options: &options,
        owner: &owner,
        fit: Fit::Grow,
    };
    let ensured = rbd_volume::ensure(&cluster, &new(&spec), &Hooks::default())
        .await
        .unwrap();
    assert_eq!(ensured.outcome, Outcome::Created);
    let meta = cluster.metadata_list(&spec, image).await.unwrap();
    assert_eq!(meta[META_PV], "pvc-ns");
    assert!(!cluster.image_exists(pool, image).await.unwrap());
    // deleting through the default namespace finds nothing; the namespace's image stays
    let claimant = Claimant::volume("pvc-ns");
    rbd_volume::delete(&cluster, pool, image, &claimant, &Hooks::default())
        .await
        .unwrap();
    assert!(cluster.image_exists(&spec, image).await.unwrap());
    rbd_volume::delete(&cluster, &spec, image, &claimant, &Hooks::default())
        .await
        .unwrap();
    assert!(!cluster.image_exists(&spec, image).await.unwrap());

    let missing = ceph_rbd::pool_spec(pool, "core-ns-never-created");
    let err = rbd_volume::ensure(&cluster, &new(&missing), &Hooks::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MissingNamespace { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("radosNamespace") && text.contains("core-ns-never-created"),
        "{text}"
    );
    rbd_volume::check_namespace(&cluster, &spec).await.unwrap();
    assert!(
        rbd_volume::check_namespace(&cluster, &missing)
            .await
            .is_err()
    );
}
