//! End to end: `topologyConstrainedPools` with WaitForFirstConsumer. Emulated nodes labelled with
//! zones, a pool per zone in micro-ceph, the scheduler's `volume.kubernetes.io/selected-node`
//! set by the test; the PV lands in the zone's pool with the zone's node affinity, and a node
//! no pool serves gets its claim rescheduled.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::Harness;

const ZONE: &str = "topology.kubernetes.io/zone";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

async fn create_node(h: &Harness, name: &str, zone: Option<&str>) {
    let nodes: Api<Node> = Api::all(h.client.clone());
    let labels = match zone {
        Some(z) => json!({ ZONE: z, "kubernetes.io/hostname": name }),
        None => json!({ "kubernetes.io/hostname": name }),
    };
    let node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

async fn select_node(h: &Harness, claim: &str, node: &str) {
    let patch = json!({"metadata": {"annotations": { SELECTED_NODE: node }}});
    h.claims()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn pool_images(h: &Harness, pool: &str) -> Vec<String> {
    h.ceph
        .rbd(&["ls", pool])
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The pool of an in-tree PV.
fn pool_of(pv: &PersistentVolume) -> String {
    let rbd = pv.spec.as_ref().and_then(|s| s.rbd.as_ref()).unwrap();
    rbd.pool.clone().unwrap()
}

/// The PV's required node affinity as (key, operator, values) triples.
fn affinity(pv: &PersistentVolume) -> Vec<(String, String, Vec<String>)> {
    let terms = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    assert!(terms.len() <= 1, "{terms:?}");
    terms
        .iter()
        .flat_map(|t| t.match_expressions.clone().unwrap_or_default())
        .map(|e| (e.key, e.operator, e.values.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_first_consumer_claims_get_the_pool_and_affinity_of_the_selected_nodes_zone() {
    let h = Harness::start().await;
    h.create_pool("zone-b");
    create_node(&h, "node-a", Some("a")).await;
    create_node(&h, "node-b", Some("b")).await;
    create_node(&h, "node-c", Some("c")).await;
    create_node(&h, "node-unlabelled", None).await;
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
            "--topology-labels",
            ZONE,
        ],
        &[],
    );
    let pools = json!([
        {"poolName": h.ceph.pool, "domainSegments": [{"domainLabel": "zone", "value": "a"}]},
        {"poolName": "zone-b", "domainSegments": [{"domainLabel": "zone", "value": "b"}]},
    ]);
    let mut params: std::collections::BTreeMap<String, String> = h.params().into_iter().collect();
    params.insert("topologyConstrainedPools".into(), pools.to_string());
    let classes: Api<StorageClass> = Api::all(h.client.clone());
    let mut class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "zoned"}, "provisioner": "ceph.com/rbd",
        "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete",
    }))
    .unwrap();
    class.parameters = Some(params.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    // the same pools with Immediate binding: no node, the class's pool (as ceph-csi does)
    let mut immediate = class.clone();
    immediate.metadata.name = Some("zoned-now".into());
    immediate.volume_binding_mode = Some("Immediate".into());
    classes
        .create(&PostParams::default(), &immediate)
        .await
        .unwrap();

    for claim in ["in-b", "in-a", "in-c", "unlabelled"] {
        h.create_claim(claim, "zoned", "16Mi", false).await;
    }
    h.create_claim("now", "zoned-now", "16Mi", false).await;
    select_node(&h, "in-b", "node-b").await;
    select_node(&h, "in-a", "node-a").await;
    select_node(&h, "in-c", "node-c").await;
    select_node(&h, "unlabelled", "node-unlabelled").await;

    let (_, in_b) = h.wait_bound("in-b").await;
    let image = Harness::image_name(&in_b);
    assert_eq!(pool_of(&in_b), "zone-b");
    assert!(pool_images(&h, "zone-b").contains(&image));
    assert!(!pool_images(&h, &h.ceph.pool).contains(&image));
    assert_eq!(
        affinity(&in_b),
        [(ZONE.to_string(), "In".to_string(), vec!["b".to_string()])]
    );
    let (_, in_a) = h.wait_bound("in-a").await;
    assert_eq!(pool_of(&in_a), h.ceph.pool);
    assert_eq!(
        affinity(&in_a),
        [(ZONE.to_string(), "In".to_string(), vec!["a".to_string()])]
    );
    let (_, now) = h.wait_bound("now").await;
    assert_eq!(pool_of(&now), h.ceph.pool);
    assert!(affinity(&now).is_empty());

    // no pool serves zone c (or a node without the label): rescheduled, selected-node removed,
    // an event naming the node and its labels, nothing created
    for (claim, node, labels) in [
        ("in-c", "node-c", format!("{ZONE}=c")),
        ("unlabelled", "node-unlabelled", format!("{ZONE} unset")),
    ] {
        let message = h
            .until(
                &format!("the reschedule event of {claim}"),
                Duration::from_secs(30),
                || async {
                    h.events_for(claim)
                        .await
                        .into_iter()
                        .find_map(|e| e.message.filter(|m| m.contains("asking the scheduler")))
                },
            )
            .await;
        assert!(
            message.contains(node) && message.contains(&labels),
            "{message}"
        );
        h.until(
            &format!("selected-node removed from {claim}"),
            Duration::from_secs(30),
            || async {
                let c = h.claims().get(claim).await.ok()?;
                let annotations = c.metadata.annotations.unwrap_or_default();
                (!annotations.contains_key(SELECTED_NODE)).then_some(())
            },
        )
        .await;
        let c = h.claims().get(claim).await.unwrap();
        assert!(c.spec.unwrap().volume_name.is_none());
    }
    assert_eq!(
        h.volumes()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );

    // the scheduler picks node-b for in-c next: it lands in zone b
    select_node(&h, "in-c", "node-b").await;
    let (_, in_c) = h.wait_bound("in-c").await;
    assert_eq!(pool_of(&in_c), "zone-b");

    for (claim, pv) in [("in-b", &in_b), ("in-c", &in_c)] {
        h.claims()
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
        h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    }
    assert!(pool_images(&h, "zone-b").is_empty());
}
