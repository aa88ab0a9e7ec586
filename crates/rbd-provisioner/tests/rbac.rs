//! The RBAC in deploy/rbac.yaml covers every API call the provisioner makes: a full run (Immediate
//! and WaitForFirstConsumer claims, filesystem and block, a failure, expansion, a
//! VolumeAttributesClass named on a claim, a refused and then successful delete, leader election,
//! CSIDriver lookup, a ReclaimSpaceJob) against an emulator that records each request with its
//! User-Agent, then every request of ours is matched against the rules.

mod support;

use std::collections::HashSet;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube_emulator::{Emulator, RequestRecord};
use micro_ceph::ImageHolder;
use serde_json::json;
use support::Harness;

/// Namespace the kustomization deploys into (Role rules apply there only).
const DEPLOY_NAMESPACE: &str = "rbd-provisioner";

struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    /// `None` for ClusterRole rules.
    namespace: Option<String>,
}

fn strings(v: &serde_yaml::Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn rules() -> Vec<Rule> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let doc: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
        let namespace = match doc["kind"].as_str() {
            Some("ClusterRole") => None,
            Some("Role") => Some(DEPLOY_NAMESPACE.to_string()),
            _ => continue,
        };
        for rule in doc["rules"].as_sequence().unwrap() {
            out.push(Rule {
                groups: strings(&rule["apiGroups"]),
                resources: strings(&rule["resources"]),
                verbs: strings(&rule["verbs"]),
                namespace: namespace.clone(),
            });
        }
    }
    out
}

fn allowed(rules: &[Rule], r: &RequestRecord) -> bool {
    rules.iter().any(|rule| {
        rule.groups.contains(&r.group)
            && rule.resources.contains(&r.resource)
            && rule.verbs.contains(&r.verb)
            && rule
                .namespace
                .as_ref()
                .is_none_or(|ns| r.namespace.as_ref() == Some(ns))
    })
}

/// Runs a ReclaimSpaceJob for `claim` to its end.
async fn reclaim_space(h: &Harness, claim: &str) {
    let resource =
        kube::api::ApiResource::erase::<provisioner::reclaim_space::ReclaimSpaceJob>(&());
    let jobs: Api<kube::api::DynamicObject> =
        Api::namespaced_with(h.client.clone(), "default", &resource);
    let job = json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1",
        "kind": "ReclaimSpaceJob",
        "metadata": {"name": format!("reclaim-{claim}"), "namespace": "default"},
        "spec": {"target": {"persistentVolumeClaim": claim}},
    });
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job).unwrap(),
    )
    .await
    .unwrap();
    h.wait_event(claim, "ReclaimSpaceSucceeded").await;
    h.until(
        "the ReclaimSpaceJob's status",
        std::time::Duration::from_secs(30),
        || async {
            let job = jobs.get(&format!("reclaim-{claim}")).await.ok()?;
            (job.data["status"]["result"] == "Succeeded").then_some(())
        },
    )
    .await;
}

/// A schedule on `claim`: its cron job made, run (its jobs made, run, the oldest deleted beyond
/// the history limit, its status written), then deleted with the schedule.
async fn reclaim_on_a_schedule(h: &Harness, claim: &str) {
    const SCHEDULE: &str = "reclaimspace.csiaddons.openshift.io/schedule";
    let resource =
        kube::api::ApiResource::erase::<provisioner::reclaim_space::ReclaimSpaceJob>(&());
    let jobs: Api<kube::api::DynamicObject> =
        Api::namespaced_with(h.client.clone(), "default", &resource);
    let set = |schedule: Option<&str>| json!({"metadata": {"annotations": {SCHEDULE: schedule}}});
    h.claims()
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(&set(Some("@every 1s"))),
        )
        .await
        .unwrap();
    // more successes than the history keeps (3): the first job is deleted
    let first = h
        .until(
            "a first scheduled job",
            std::time::Duration::from_secs(30),
            || async {
                let list = jobs.list(&Default::default()).await.ok()?;
                list.items
                    .into_iter()
                    .filter(|j| j.metadata.owner_references.is_some())
                    .filter_map(|j| j.metadata.name)
                    .min()
            },
        )
        .await;
    h.until(
        "the first scheduled job deleted beyond the history limit",
        std::time::Duration::from_secs(60),
        || async { jobs.get_opt(&first).await.ok()?.is_none().then_some(()) },
    )
    .await;
    h.claims()
        .patch(claim, &PatchParams::default(), &Patch::Merge(&set(None)))
        .await
        .unwrap();
    let resource = kube::api::ApiResource::erase::<
        provisioner::reclaim_space::cronjob::ReclaimSpaceCronJob,
    >(&());
    let cron_jobs: Api<kube::api::DynamicObject> =
        Api::namespaced_with(h.client.clone(), "default", &resource);
    h.until(
        "the cron job deleted with its schedule",
        std::time::Duration::from_secs(30),
        || async {
            cron_jobs
                .list(&Default::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_rbac_covers_every_request_of_a_full_run() {
    let h = Harness::start_on(
        Emulator::builder()
            .record_requests(true)
            .csi_addons_crds(true)
            .build(),
    )
    .await;
    h.create_namespace(DEPLOY_NAMESPACE).await;
    let _p = h.spawn(
        &[
            "--leader-elect=true",
            &format!("--leader-election-namespace={DEPLOY_NAMESPACE}"),
            "--leader-election-retry-period=200ms",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
            "--topology-labels=topology.kubernetes.io/zone",
        ],
        &[],
    );
    // Immediate filesystem + block, with expansion and a watched delete
    h.create_class("rbd", &h.params(), "Delete").await;
    h.create_claim("fs", "rbd", "32Mi", false).await;
    h.create_claim("blk", "rbd", "16Mi", true).await;
    let (_, fs_pv) = h.wait_bound("fs").await;
    h.wait_bound("blk").await;
    // a VolumeAttributesClass named on a claim: the class is read, the claim's status written
    // (an in-tree PV: Infeasible)
    let vacs: Api<k8s_openapi::api::storage::v1::VolumeAttributesClass> =
        Api::all(h.client.clone());
    let gold = json!({"metadata": {"name": "gold"}, "driverName": "rbd.provisioner.ceph.io",
                      "parameters": {"rbd_qos_iops_limit": "100"}});
    vacs.create(
        &PostParams::default(),
        &serde_json::from_value(gold).unwrap(),
    )
    .await
    .unwrap();
    let name_gold = json!({"spec": {"volumeAttributesClassName": "gold"}});
    h.claims()
        .patch("blk", &PatchParams::default(), &Patch::Merge(&name_gold))
        .await
        .unwrap();
    h.wait_event("blk", "VolumeModifyFailed").await;
    // a ReclaimSpaceJob: its claim, PV and VolumeAttachments read, the image sparsified, its
    // status written and an event on the claim
    reclaim_space(&h, "blk").await;
    reclaim_on_a_schedule(&h, "blk").await;
    let patch = json!({"spec": {"resources": {"requests": {"storage": "64Mi"}}}});
    h.claims()
        .patch("fs", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    h.wait_event("fs", "FileSystemResizeRequired").await;
    let holder = ImageHolder::open(h.ceph, &h.ceph.pool, &Harness::image_name(&fs_pv)).unwrap();
    h.claims()
        .delete("fs", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_event(
        fs_pv.metadata.name.as_deref().unwrap(),
        "VolumeFailedDelete",
    )
    .await;
    drop(holder);
    h.wait_pv_gone(fs_pv.metadata.name.as_deref().unwrap())
        .await;

    // WaitForFirstConsumer: the selected Node is read
    let nodes: Api<Node> = Api::all(h.client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-1",
                "labels": {"topology.kubernetes.io/zone": "a"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(h.client.clone());
    let mut wffc: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "wffc"}, "provisioner": "ceph.com/rbd", "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .unwrap();
    // with per-zone pools: node-1's zone has one, node-2's has none (the claim is rescheduled:
    // its selected-node annotation removed)
    let mut params: std::collections::BTreeMap<String, String> = h.params().into_iter().collect();
    params.insert(
        "topologyConstrainedPools".into(),
        json!([{"poolName": h.ceph.pool, "domainSegments": [{"domainLabel": "zone", "value": "a"}]}])
            .to_string(),
    );
    wffc.parameters = Some(params);
    classes.create(&PostParams::default(), &wffc).await.unwrap();
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-2",
                "labels": {"topology.kubernetes.io/zone": "b"}}}))
            .unwrap(),
        )
        .await
        .unwrap();
    // fencing: node-2 declared out of service gets its fence record (a Node patch) and events
    nodes
        .patch(
            "node-2",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
                "value": "nodeshutdown", "effect": "NoExecute"}]}}),
            ),
        )
        .await
        .unwrap();
    h.wait_event("node-2", "NodeFenced").await;
    h.create_claim("elsewhere", "wffc", "8Mi", false).await;
    let to_node_2 =
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-2"}}});
    h.claims()
        .patch(
            "elsewhere",
            &PatchParams::default(),
            &Patch::Merge(&to_node_2),
        )
        .await
        .unwrap();
    h.wait_event_containing(
        "elsewhere",
        "ProvisioningFailed",
        &["node-2", "asking the scheduler"],
    )
    .await;
    h.until(
        "selected-node removed from elsewhere",
        std::time::Duration::from_secs(30),
        || async {
            let c = h.claims().get("elsewhere").await.ok()?;
            let annotations = c.metadata.annotations.unwrap_or_default();
            (!annotations.contains_key("volume.kubernetes.io/selected-node")).then_some(())
        },
    )
    .await;
    h.create_claim("late", "wffc", "8Mi", false).await;
    let select =
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-1"}}});
    h.claims()
        .patch("late", &PatchParams::default(), &Patch::Merge(&select))
        .await
        .unwrap();
    h.wait_bound("late").await;

    // a failure: events are created and then updated
    let mut bad = h.params();
    bad.push(("imageFeatures".into(), "fast-diff".into()));
    h.create_class("bad", &bad, "Delete").await;
    h.create_claim("broken", "bad", "8Mi", false).await;
    h.wait_event("broken", "ProvisioningFailed").await;

    let ours: HashSet<RequestRecord> = h
        .emu
        .requests()
        .into_iter()
        .filter(|r| r.user_agent.starts_with("rbd-provisioner/"))
        .map(|r| RequestRecord {
            user_agent: String::new(),
            ..r
        })
        .collect();
    assert!(
        ours.iter().any(|r| r.resource == "leases"),
        "no Lease request recorded: {ours:?}"
    );
    assert!(ours.iter().any(|r| r.resource == "secrets"), "{ours:?}");
    let rules = rules();
    let denied: Vec<&RequestRecord> = ours.iter().filter(|r| !allowed(&rules, r)).collect();
    assert!(
        denied.is_empty(),
        "requests the deploy/ RBAC would forbid: {denied:#?}"
    );
    for r in &ours {
        eprintln!(
            "used: {} {}/{} in {:?}",
            r.verb, r.group, r.resource, r.namespace
        );
    }
}
