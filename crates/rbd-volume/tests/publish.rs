//! The publication record against a private Ceph cluster: concurrent publishes through several
//! connections (separate librados clients, so nothing in this process orders them; the OSD
//! does) never put a single-node volume on two nodes and never lose a multi-node volume's entry;
//! a record written by an older version (or by `rbd image-meta set`) is read and extended.

use std::collections::BTreeSet;
use std::sync::Arc;

use ceph_rbd::{Cluster, ClusterConfig, CreateOptions, Secret};
use rbd_volume::publish::{
    self, META_PUBLISHED, Publication, PublishError, Published, Sharing, Unpublished,
};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

const MIB: u64 = 1 << 20;
/// Separate connections the racing calls are spread over.
const CONNECTIONS: usize = 4;

async fn connections() -> Vec<Arc<Cluster>> {
    let ceph = micro_ceph::cluster();
    let cfg = ClusterConfig::new(&ceph.monitors, "admin", Secret::new(ceph.admin_key.clone()));
    let mut all = Vec::new();
    for _ in 0..CONNECTIONS {
        all.push(Arc::new(Cluster::connect(&cfg).await.unwrap()));
    }
    all
}

/// A fresh image `name` (an earlier run's removed first).
async fn fresh_image(cluster: &Cluster, name: &str) {
    let pool = &micro_ceph::cluster().pool;
    let _ = cluster.remove_image(pool, name).await;
    cluster
        .create_image(pool, name, 8 * MIB, &CreateOptions::default())
        .await
        .unwrap();
}

fn wanted(node: &str, sharing: Sharing, readonly: bool) -> Publication {
    Publication {
        node: node.to_owned(),
        sharing,
        readonly,
    }
}

/// The record as `rbd image-meta get` shows it, parsed as plain JSON (not by our types).
fn record_as_rbd_shows_it(image: &str) -> serde_json::Value {
    let ceph = micro_ceph::cluster();
    let text = ceph
        .rbd(&[
            "image-meta",
            "get",
            &format!("{}/{image}", ceph.pool),
            META_PUBLISHED,
        ])
        .unwrap();
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("record {text:?}: {e}"))
}

/// Runs one publish per entry of `calls`, each on connection `i % CONNECTIONS`, all released
/// at once; returns (node, result) per call.
async fn race(
    clusters: &[Arc<Cluster>],
    image: &str,
    calls: Vec<Publication>,
) -> Vec<(String, Result<Published, PublishError>)> {
    let start = Arc::new(Barrier::new(calls.len()));
    let mut tasks = JoinSet::new();
    for (i, wanted) in calls.into_iter().enumerate() {
        let cluster = Arc::clone(&clusters[i % clusters.len()]);
        let start = Arc::clone(&start);
        let image = image.to_owned();
        tasks.spawn(async move {
            start.wait().await;
            let pool = &micro_ceph::cluster().pool;
            let result = publish::publish(&cluster, pool, &image, &wanted).await;
            (wanted.node, result)
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        results.push(joined.unwrap());
    }
    results
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishes_of_a_single_node_volume_to_two_nodes_record_exactly_one() {
    let clusters = connections().await;
    let image = "publish-race-rwo";
    fresh_image(&clusters[0], image).await;
    // 50 calls per node, interleaved, so both nodes race on every connection
    let calls = (0..100)
        .map(|i| {
            let node = if i % 2 == 0 { "node-a" } else { "node-b" };
            wanted(node, Sharing::SingleNode, false)
        })
        .collect();
    let results = race(&clusters, image, calls).await;

    let winners: BTreeSet<&str> = results
        .iter()
        .filter(|(_, r)| r.is_ok())
        .map(|(node, _)| node.as_str())
        .collect();
    assert_eq!(winners.len(), 1, "nodes that got the volume: {winners:?}");
    let winner = *winners.first().unwrap();
    for (node, result) in &results {
        if node == winner {
            assert!(result.is_ok(), "{node}: {result:?}");
        } else {
            assert!(
                matches!(result, Err(PublishError::PublishedElsewhere { others, .. }) if others == &[winner]),
                "{node}: {result:?}"
            );
        }
    }
    let recorded = results
        .iter()
        .filter(|(_, r)| matches!(r, Ok(Published::Recorded)))
        .count();
    assert_eq!(
        recorded, 1,
        "one call wrote the record, the others found it"
    );

    let record = record_as_rbd_shows_it(image);
    assert_eq!(
        record,
        serde_json::json!([{"node": winner, "sharing": "single-node", "readonly": false}])
    );
    let pool = &micro_ceph::cluster().pool;
    assert_eq!(
        publish::publications(&clusters[1], pool, image)
            .await
            .unwrap(),
        [wanted(winner, Sharing::SingleNode, false)]
    );
    clusters[0].remove_image(pool, image).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_publishes_of_a_multi_node_volume_record_every_node() {
    let clusters = connections().await;
    let image = "publish-race-rox";
    fresh_image(&clusters[0], image).await;
    let nodes: Vec<String> = (0..10).map(|i| format!("reader-{i}")).collect();
    // every node three times over, so writers of the same entry race too
    let calls = (0..30)
        .map(|i| wanted(&nodes[i % nodes.len()], Sharing::MultiNode, true))
        .collect();
    for (node, result) in race(&clusters, image, calls).await {
        assert!(result.is_ok(), "{node}: {result:?}");
    }

    let record = record_as_rbd_shows_it(image);
    let recorded: BTreeSet<&str> = record
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["node"].as_str().unwrap())
        .collect();
    assert_eq!(record.as_array().unwrap().len(), nodes.len(), "{record}");
    assert_eq!(
        recorded,
        nodes.iter().map(String::as_str).collect::<BTreeSet<_>>()
    );

    // and concurrent unpublishes leave none behind
    let pool = &micro_ceph::cluster().pool;
    let mut tasks = JoinSet::new();
    for (i, node) in nodes.iter().enumerate() {
        let cluster = Arc::clone(&clusters[i % clusters.len()]);
        let node = node.clone();
        tasks.spawn(async move {
            let pool = &micro_ceph::cluster().pool;
            publish::unpublish(&cluster, pool, "publish-race-rox", Some(&node)).await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        assert!(matches!(joined.unwrap(), Ok(Unpublished::Removed)));
    }
    assert_eq!(record_as_rbd_shows_it(image), serde_json::json!([]));
    clusters[0].remove_image(pool, image).await.unwrap();
}

#[tokio::test]
async fn a_record_written_by_rbd_image_meta_set_is_read_and_extended() {
    let clusters = connections().await;
    let image = "publish-old-record";
    fresh_image(&clusters[0], image).await;
    let ceph = micro_ceph::cluster();
    let spec = format!("{}/{image}", ceph.pool);
    // as an older version wrote it (librbd's metadata_set)
    ceph.rbd(&[
        "image-meta",
        "set",
        &spec,
        META_PUBLISHED,
        r#"[{"node":"old-node","sharing":"multi-node","readonly":true}]"#,
    ])
    .unwrap();
    let pool = &ceph.pool;
    let new = wanted("new-node", Sharing::MultiNode, true);
    assert_eq!(
        publish::publish(&clusters[0], pool, image, &new)
            .await
            .unwrap(),
        Published::Recorded
    );
    assert_eq!(
        record_as_rbd_shows_it(image),
        serde_json::json!([
            {"node": "old-node", "sharing": "multi-node", "readonly": true},
            {"node": "new-node", "sharing": "multi-node", "readonly": true},
        ])
    );
    // a single-node request is refused while readers have it
    let err = publish::publish(
        &clusters[1],
        pool,
        image,
        &wanted("writer", Sharing::SingleNode, false),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, PublishError::PublishedElsewhere { .. }),
        "{err}"
    );
    clusters[0].remove_image(pool, image).await.unwrap();
}
