//! RADOS namespaces: `pool/namespace` pool specs keep images, snapshots, clones, metadata and
//! trash of one namespace apart from another's and from the default namespace's.

mod common;

use std::time::Duration;

use ceph_rbd::{CreateOptions, pool_spec};
use common::*;

#[tokio::test]
async fn images_of_one_namespace_are_invisible_to_another() {
    let cluster = connect().await;
    let pool = pool_name();
    let (a, b) = (unique("ns-a"), unique("ns-b"));
    for ns in [&a, &b] {
        assert!(!cluster.namespace_exists(&pool, ns).await.unwrap());
        cluster.namespace_create(&pool, ns).await.unwrap();
        assert!(cluster.namespace_exists(&pool, ns).await.unwrap());
    }
    let listed = cluster.namespace_list(&pool).await.unwrap();
    assert!(listed.contains(&a) && listed.contains(&b), "{listed:?}");
    let (in_a, in_b) = (pool_spec(&pool, &a), pool_spec(&pool, &b));
    let image = unique("same-name");
    let opts = CreateOptions::default();
    cluster
        .create_image(&in_a, &image, 4 << 20, &opts)
        .await
        .unwrap();
    // the same name in b is another image
    cluster
        .create_image(&in_b, &image, 8 << 20, &opts)
        .await
        .unwrap();
    assert_eq!(
        cluster.image_info(&in_a, &image).await.unwrap().size,
        4 << 20
    );
    assert_eq!(
        cluster.image_info(&in_b, &image).await.unwrap().size,
        8 << 20
    );
    assert!(!cluster.image_exists(&pool, &image).await.unwrap());
    assert!(!cluster.list_images(&pool).await.unwrap().contains(&image));
    assert_eq!(
        cluster.list_images(&in_a).await.unwrap(),
        vec![image.clone()]
    );

    // metadata, snapshots and clones stay in their namespace
    cluster.metadata_set(&in_a, &image, "k", "a").await.unwrap();
    assert!(
        cluster
            .metadata_get(&in_b, &image, "k")
            .await
            .unwrap()
            .is_none()
    );
    cluster.snap_create(&in_a, &image, "s").await.unwrap();
    assert!(cluster.snap_list(&in_b, &image).await.unwrap().is_empty());
    let clone = unique("clone");
    cluster
        .clone_image(&in_a, &image, "s", &in_a, &clone, &opts)
        .await
        .unwrap();
    let parent = cluster.parent(&in_a, &clone).await.unwrap().unwrap();
    assert_eq!(
        (parent.pool.as_str(), parent.namespace.as_str()),
        (pool.as_str(), a.as_str())
    );
    assert_eq!(parent.pool_spec(), in_a);

    // removing in b leaves a's image; the trash is per namespace too
    cluster.remove_image(&in_b, &image).await.unwrap();
    assert!(cluster.image_exists(&in_a, &image).await.unwrap());
    cluster
        .trash_move(&in_a, &clone, Duration::ZERO)
        .await
        .unwrap();
    assert!(cluster.trash_list(&in_b).await.unwrap().is_empty());
    assert_eq!(cluster.trash_list(&in_a).await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_image_in_a_missing_namespace_is_refused() {
    let cluster = connect().await;
    let spec = pool_spec(&pool_name(), &unique("never-created"));
    let e = cluster
        .create_image(&spec, &unique("img"), 4 << 20, &CreateOptions::default())
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e:?}");
}

#[tokio::test]
async fn malformed_pool_specs_are_refused_before_any_call() {
    let cluster = connect().await;
    for bad in ["rbd/", "rbd/a/b", "/ns"] {
        let e = cluster.image_exists(bad, "img").await.unwrap_err();
        assert!(e.to_string().contains(bad), "{e}");
    }
}
