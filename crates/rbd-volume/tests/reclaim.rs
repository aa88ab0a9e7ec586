//! Controller-side reclaim (sparsify of a volume staged nowhere) against a private Ceph
//! cluster: zeroed space goes back to the pool, data reads back unchanged, a volume in use is
//! left alone.

mod common;

use common::{MIB, cluster, digest, ensure, fill, pool, spec};
use rbd_volume::publish::{Publication, Sharing, publish};
use rbd_volume::{ReclaimError, reclaim_space};

#[tokio::test]
async fn sparsify_gives_zeroed_space_back_and_keeps_the_data() {
    let ceph = cluster().await;
    let image = "reclaim-zeroed";
    ensure(&ceph, image, 32 * MIB).await.unwrap();
    // some data and 16 MiB zeroed (as `dd if=/dev/zero` over freed space leaves it)
    fill(image, 0, 4 * MIB, 0x42);
    fill(image, 12 * MIB, 16 * MIB, 0);
    let data = digest(image);

    let reclaimed = reclaim_space(&ceph, pool(), image).await.unwrap();

    assert_eq!(reclaimed.before, 20 * MIB);
    assert_eq!(reclaimed.after, 4 * MIB);
    assert_eq!(reclaimed.bytes(), 16 * MIB);
    assert_eq!(ceph.used_bytes(pool(), image).await.unwrap(), 4 * MIB);
    assert_eq!(digest(image), data, "every byte reads back unchanged");
}

#[tokio::test]
async fn sparsify_of_an_image_of_data_keeps_every_byte() {
    let ceph = cluster().await;
    let image = "reclaim-data";
    ensure(&ceph, image, 8 * MIB).await.unwrap();
    fill(image, 0, 8 * MIB, 0xa5);
    // zeroed blocks inside objects that hold data: holes punched there, the objects stay
    fill(image, MIB, 64 << 10, 0);
    fill(image, 6 * MIB + 4096, 4096, 0);
    let data = digest(image);

    let reclaimed = reclaim_space(&ceph, pool(), image).await.unwrap();

    assert_eq!((reclaimed.before, reclaimed.after), (8 * MIB, 8 * MIB));
    assert_eq!(digest(image), data);
}

#[tokio::test]
async fn a_watched_image_is_not_sparsified() {
    let ceph = cluster().await;
    let image = "reclaim-watched";
    ensure(&ceph, image, 16 * MIB).await.unwrap();
    fill(image, 0, 8 * MIB, 0);
    let holder = micro_ceph::ImageHolder::open(micro_ceph::cluster(), pool(), image).unwrap();

    let refused = reclaim_space(&ceph, pool(), image).await.unwrap_err();

    match &refused {
        ReclaimError::InUse {
            nodes, watchers, ..
        } => {
            assert!(nodes.is_empty());
            assert_eq!(watchers.len(), 1, "{watchers:?}");
        }
        e => panic!("expected InUse, got {e}"),
    }
    assert!(refused.to_string().contains(&spec(image)), "{refused}");
    assert_eq!(ceph.used_bytes(pool(), image).await.unwrap(), 8 * MIB);
    drop(holder);
    assert_eq!(
        reclaim_space(&ceph, pool(), image).await.unwrap().after,
        0,
        "once the client is gone the zeroed objects go"
    );
}

#[tokio::test]
async fn a_published_image_is_not_sparsified() {
    let ceph = cluster().await;
    let image = "reclaim-published";
    ensure(&ceph, image, 16 * MIB).await.unwrap();
    fill(image, 0, 4 * MIB, 0);
    publish(
        &ceph,
        pool(),
        image,
        &Publication {
            node: "node-a".into(),
            sharing: Sharing::SingleNode,
            readonly: false,
        },
    )
    .await
    .unwrap();

    let refused = reclaim_space(&ceph, pool(), image).await.unwrap_err();

    assert!(
        matches!(&refused, ReclaimError::InUse { nodes, .. } if nodes == &["node-a"]),
        "{refused}"
    );
    assert_eq!(ceph.used_bytes(pool(), image).await.unwrap(), 4 * MIB);
}

#[tokio::test]
async fn a_missing_image_is_not_found() {
    let ceph = cluster().await;
    let missing = reclaim_space(&ceph, pool(), "reclaim-missing")
        .await
        .unwrap_err();
    assert!(
        matches!(
            missing,
            ReclaimError::Ceph(ceph_rbd::Error::NotFound { .. })
        ),
        "{missing}"
    );
}
