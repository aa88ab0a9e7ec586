//! csi-addons' ReclaimSpaceJob, end to end: the emulated API server (with the csi-addons
//! CRDs), this test binary's micro-ceph and the provisioner binary. A detached volume is
//! sparsified (its used size drops, its bytes stay); a filesystem volume attached to a node is
//! trimmed there by the node plugin of the same binary (fuse mapper: the trim's limit on that
//! path is pinned), and a node whose plugin does not answer fails the job naming it; a block
//! volume attached to a node is left alone and the job says so; bad targets fail with a
//! message naming the field. A schedule annotation on a StorageClass gives each of its claims a
//! ReclaimSpaceCronJob whose jobs run on the schedule; a claim's own schedule wins, a bad one is
//! reported on the claim, and removing the class's schedule deletes the cron jobs.

#[path = "support/node.rs"]
mod node;
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::Harness;

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
const FIELD: &str = "spec.target.persistentVolumeClaim";

fn jobs(h: &Harness) -> Api<DynamicObject> {
    let resource =
        kube::api::ApiResource::erase::<provisioner::reclaim_space::ReclaimSpaceJob>(&());
    Api::namespaced_with(h.client.clone(), "default", &resource)
}

async fn create_job(h: &Harness, name: &str, claim: &str) {
    create_job_with(h, name, json!({"target": {"persistentVolumeClaim": claim}})).await;
}

async fn create_job_with(h: &Harness, name: &str, spec: serde_json::Value) {
    let object = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1",
        "kind": "ReclaimSpaceJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }))
    .unwrap();
    jobs(h)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// Waits for the job to finish; returns its status.
async fn wait_done(h: &Harness, name: &str) -> serde_json::Value {
    h.until(&format!("ReclaimSpaceJob {name} done"), WAIT, || async {
        let job = jobs(h).get(name).await.ok()?;
        let status = job.data.get("status")?.clone();
        status.get("result").is_some().then_some(status)
    })
    .await
}

async fn harness() -> (Harness, support::Process) {
    let h = Harness::start_on(
        kube_emulator::Emulator::builder()
            .csi_addons_crds(true)
            .build(),
    )
    .await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let provisioner = h.spawn_default();
    (h, provisioner)
}

fn digest(image: &str) -> String {
    support::export_digest(micro_ceph::cluster(), image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_volume_is_sparsified_and_reads_back_unchanged() {
    let (h, provisioner) = harness().await;
    h.create_claim("data", "rbd", "64Mi", false).await;
    let (_, pv) = h.wait_bound("data").await;
    let image = Harness::image_name(&pv);
    let ceph = micro_ceph::cluster();
    // 8 MiB of data, and 16 MiB a guest zeroed
    ceph.fill_image(&ceph.pool, &image, 0, 8 * MIB, 0x6b)
        .unwrap();
    ceph.fill_image(&ceph.pool, &image, 32 * MIB, 16 * MIB, 0)
        .unwrap();
    let cluster = h.ceph_cluster().await;
    assert_eq!(
        cluster.used_bytes(&ceph.pool, &image).await.unwrap(),
        24 * MIB
    );
    let before = digest(&image);

    create_job(&h, "reclaim-data", "data").await;
    let status = wait_done(&h, "reclaim-data").await;

    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["reclaimedSpace"], "16Mi", "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("sparsified"),
        "{status}"
    );
    assert!(status["startTime"].is_string() && status["completionTime"].is_string());
    assert_eq!(
        cluster.used_bytes(&ceph.pool, &image).await.unwrap(),
        8 * MIB
    );
    assert_eq!(digest(&image), before, "every byte reads back unchanged");
    let event = h.wait_event("data", "ReclaimSpaceSucceeded").await;
    assert!(event.contains("reclaim-data"), "{event}");
    assert_no_key(&h, &provisioner, &status).await;
}

/// The admin key is in no job status, event, claim, PV or log line.
async fn assert_no_key(h: &Harness, provisioner: &support::Process, status: &serde_json::Value) {
    let key = &h.ceph.admin_key;
    assert!(!status.to_string().contains(key.as_str()));
    h.assert_nowhere(key, &[provisioner.log_text()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_volume_attached_to_a_node_is_left_alone_and_the_job_says_so() {
    let (h, _provisioner) = harness().await;
    h.create_claim("raw", "rbd", "16Mi", true).await;
    let (_, pv) = h.wait_bound("raw").await;
    let image = Harness::image_name(&pv);
    let ceph = micro_ceph::cluster();
    ceph.fill_image(&ceph.pool, &image, 0, 4 * MIB, 0).unwrap();
    attach(&h, &pv, "node-a").await;

    create_job(&h, "reclaim-raw", "raw").await;
    let status = wait_done(&h, "reclaim-raw").await;

    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["reclaimedSpace"], "0", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("node-a") && message.contains("nothing discarded"),
        "{message}"
    );
    let cluster = h.ceph_cluster().await;
    assert_eq!(
        cluster.used_bytes(&ceph.pool, &image).await.unwrap(),
        4 * MIB,
        "the zeroed object stays: the image is in use"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_still_watched_is_retried_until_its_client_goes() {
    let (h, _provisioner) = harness().await;
    h.create_claim("busy", "rbd", "16Mi", false).await;
    let (_, pv) = h.wait_bound("busy").await;
    let image = Harness::image_name(&pv);
    let ceph = micro_ceph::cluster();
    ceph.fill_image(&ceph.pool, &image, 0, 4 * MIB, 0).unwrap();
    // a client that still has the image open, as a node that has just detached may
    let holder = micro_ceph::ImageHolder::open(ceph, &ceph.pool, &image).unwrap();

    create_job_with(
        &h,
        "busy",
        json!({"target": {"persistentVolumeClaim": "busy"}, "backOffLimit": 30}),
    )
    .await;
    let retried = h
        .until("the job retried twice", WAIT, || async {
            let job = jobs(&h).get("busy").await.ok()?;
            let status = job.data.get("status")?.clone();
            (status["retries"].as_i64()? >= 2).then_some(status)
        })
        .await;
    assert!(retried.get("result").is_none(), "{retried}");
    let message = retried["message"].as_str().unwrap();
    assert!(
        message.contains("in use") && message.contains("watched by"),
        "{message}"
    );
    let cluster = h.ceph_cluster().await;
    assert_eq!(
        cluster.used_bytes(&ceph.pool, &image).await.unwrap(),
        4 * MIB
    );

    drop(holder);
    let status = wait_done(&h, "busy").await;
    assert_eq!(status["result"], "Succeeded", "{status}");
    assert_eq!(status["reclaimedSpace"], "4Mi", "{status}");
    assert!(status["retries"].as_i64().unwrap() >= 2, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_volume_attached_to_a_node_is_trimmed_there_by_its_node_plugin() {
    let (h, provisioner) = harness().await;
    install_csi_driver(&h).await;
    h.create_claim("fs", "rbd", "128Mi", false).await;
    let (_, pv) = h.wait_bound("fs").await;
    let image = Harness::image_name(&pv);
    let ceph = micro_ceph::cluster();
    attach(&h, &pv, "node-a").await;
    let plugin =
        node::NodePlugin::start_in_cluster(&h.dir.path().join("node-a"), "node-a", &h.kubeconfig);
    let target = plugin
        .mount(&h.client, &pv)
        .await
        .unwrap_or_else(|e| panic!("stage on node-a: {e:?}\n{}", plugin.log_text()));
    let kept: Vec<u8> = (0..MIB).map(|i| u8::try_from(i % 251).unwrap()).collect();
    std::fs::write(target.join("kept.bin"), &kept).unwrap();
    let big = vec![0x5a_u8; usize::try_from(64 * MIB).unwrap()];
    std::fs::write(target.join("big.bin"), &big).unwrap();
    syncfs(&target);
    std::fs::remove_file(target.join("big.bin")).unwrap();
    syncfs(&target);
    let cluster = h.ceph_cluster().await;
    let before = cluster.used_bytes(&ceph.pool, &image).await.unwrap();
    assert!(before >= 64 * MIB, "64 MiB written: {before}");

    create_job(&h, "trim-fs", "fs").await;
    let status = wait_done(&h, "trim-fs").await;

    assert_eq!(
        status["result"],
        "Succeeded",
        "{status}\n{}",
        plugin.log_text()
    );
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("node node-a") && message.contains("discarded"),
        "{message}"
    );
    // the fuse mapper's limit: rbd-fuse passes no discards to RADOS, and the job says so
    assert!(message.contains("rbd-fuse"), "{message}");
    assert_eq!(status["reclaimedSpace"], "0", "{status}");
    let job = jobs(&h).get("trim-fs").await.unwrap();
    let answer: serde_json::Value = serde_json::from_str(
        &job.metadata.annotations.unwrap()["rbd.provisioner.ceph.io/node-reclaim-result"],
    )
    .unwrap();
    assert_eq!(answer["node"], "node-a", "{answer}");
    assert!(
        answer["discarded"].as_u64().unwrap() >= 64 * MIB,
        "the freed 64 MiB were discarded on the node: {answer}"
    );
    assert_eq!(std::fs::read(target.join("kept.bin")).unwrap(), kept);
    let event = h.wait_event("fs", "ReclaimSpaceSucceeded").await;
    assert!(event.contains("node-a"), "{event}");
    plugin.unmount(&pv).await;
    h.assert_nowhere(
        &h.ceph.admin_key,
        &[provisioner.log_text(), plugin.log_text()],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_answer_fails_the_job_at_its_timeout_naming_the_node() {
    let (h, _provisioner) = harness().await;
    install_csi_driver(&h).await;
    h.create_claim("away", "rbd", "16Mi", false).await;
    let (_, pv) = h.wait_bound("away").await;
    // attached to a node where no plugin answers
    attach(&h, &pv, "node-gone").await;

    create_job_with(
        &h,
        "away",
        json!({"target": {"persistentVolumeClaim": "away"}, "timeout": 60, "backOffLimit": 0}),
    )
    .await;
    let status = h
        .until(
            "ReclaimSpaceJob away done",
            Duration::from_secs(120),
            || async {
                let job = jobs(&h).get("away").await.ok()?;
                let status = job.data.get("status")?.clone();
                status.get("result").is_some().then_some(status)
            },
        )
        .await;

    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("node node-gone did not answer within spec.timeout (60 s)"),
        "{message}"
    );
    let job = jobs(&h).get("away").await.unwrap();
    let request: serde_json::Value = serde_json::from_str(
        &job.metadata.annotations.unwrap()["rbd.provisioner.ceph.io/node-reclaim-request"],
    )
    .unwrap();
    assert_eq!(request["node"], "node-gone", "{request}");
    assert_eq!(
        request["volumeHandle"],
        pv.spec.unwrap().csi.unwrap().volume_handle,
        "{request}"
    );
}

const SCHEDULE: &str = "reclaimspace.csiaddons.openshift.io/schedule";
const CRONJOB: &str = "reclaimspace.csiaddons.openshift.io/cronjob";

fn cron_jobs(h: &Harness) -> Api<DynamicObject> {
    let resource = kube::api::ApiResource::erase::<
        provisioner::reclaim_space::cronjob::ReclaimSpaceCronJob,
    >(&());
    Api::namespaced_with(h.client.clone(), "default", &resource)
}

/// The name of the cron job recorded on `claim`, once there is one.
async fn recorded_cron_job(h: &Harness, claim: &str) -> String {
    h.until(&format!("a cron job recorded on {claim}"), WAIT, || async {
        let claim = h.claims().get(claim).await.ok()?;
        claim.metadata.annotations?.get(CRONJOB).cloned()
    })
    .await
}

async fn annotate_class(h: &Harness, class: &str, schedule: Option<&str>) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(h.client.clone());
    let patch = json!({"metadata": {"annotations": {SCHEDULE: schedule}}});
    classes
        .patch(class, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_on_a_storage_class_runs_jobs_for_its_claims_until_it_is_removed() {
    let (h, provisioner) = harness().await;
    let claims = h.claims();
    h.create_claim("one", "rbd", "16Mi", false).await;
    h.create_claim("two", "rbd", "16Mi", false).await;
    h.create_claim("own", "rbd", "16Mi", false).await;
    h.create_claim("bad", "rbd", "16Mi", false).await;
    for (claim, schedule) in [("own", "@every 1h"), ("bad", "every day")] {
        let patch = json!({"metadata": {"annotations": {SCHEDULE: schedule}}});
        claims
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    for claim in ["one", "two", "own", "bad"] {
        h.wait_bound(claim).await;
    }
    annotate_class(&h, "rbd", Some("@every 2s")).await;

    // each claim of the class: a managed cron job with the class's schedule, owned by the claim
    for claim in ["one", "two"] {
        let name = recorded_cron_job(&h, claim).await;
        let cron_job = cron_jobs(&h).get(&name).await.unwrap();
        assert_eq!(cron_job.data["spec"]["schedule"], "@every 2s");
        assert_eq!(
            cron_job.data["spec"]["jobTemplate"]["spec"]["target"]["persistentVolumeClaim"],
            claim
        );
        let owner = &cron_job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("PersistentVolumeClaim", claim)
        );
        // its jobs run on the schedule and succeed (the volume is attached nowhere: sparsified)
        let done = h
            .until(
                &format!("a scheduled job of {claim} succeeded"),
                WAIT,
                || async {
                    jobs(&h)
                        .list(&Default::default())
                        .await
                        .ok()?
                        .items
                        .into_iter()
                        .find(|j| {
                            j.metadata
                                .owner_references
                                .as_ref()
                                .is_some_and(|o| o[0].name == name)
                                && j.data["status"]["result"] == "Succeeded"
                        })
                },
            )
            .await;
        assert_eq!(done.data["spec"]["target"]["persistentVolumeClaim"], claim);
        assert!(
            done.metadata.annotations.as_ref().unwrap()["csiaddons.openshift.io/scheduled-at"]
                .ends_with('Z'),
            "{:?}",
            done.metadata.annotations
        );
        let status = h
            .until("the cron job's status", WAIT, || async {
                let c = cron_jobs(&h).get(&name).await.ok()?;
                c.data["status"]["lastSuccessfulTime"]
                    .is_string()
                    .then_some(c.data["status"].clone())
            })
            .await;
        assert!(status["lastScheduleTime"].is_string(), "{status}");
    }
    // the claim's own schedule wins over the class's
    let own = recorded_cron_job(&h, "own").await;
    assert_eq!(
        cron_jobs(&h).get(&own).await.unwrap().data["spec"]["schedule"],
        "@every 1h"
    );
    // a schedule that does not parse: reported on the claim, nothing made
    let event = h.wait_event("bad", "ReclaimSpaceScheduleInvalid").await;
    assert!(
        event.contains(SCHEDULE) && event.contains("the claim") && event.contains("every day"),
        "{event}"
    );
    let bad = claims.get("bad").await.unwrap();
    assert!(
        !bad.metadata.annotations.unwrap().contains_key(CRONJOB),
        "no cron job for a bad schedule"
    );

    // the class's schedule removed: its claims' cron jobs are deleted and their records go;
    // the claim with its own schedule keeps its cron job
    let one = recorded_cron_job(&h, "one").await;
    annotate_class(&h, "rbd", None).await;
    h.until("the class's cron jobs deleted", WAIT, || async {
        let names: Vec<String> = cron_jobs(&h)
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .map(|c| c.metadata.name.unwrap_or_default())
            .collect();
        (names == [own.clone()]).then_some(())
    })
    .await;
    assert!(
        !claims
            .get("one")
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(CRONJOB),
        "the record of {one} is removed"
    );
    assert_no_key(&h, &provisioner, &json!({})).await;
}

/// The CSIDriver object of the provisioner's CSI driver: its claims get CSI volumes.
async fn install_csi_driver(h: &Harness) {
    let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(h.client.clone());
    let driver = serde_json::from_value(json!({
        "metadata": {"name": "rbd.provisioner.ceph.io"},
        "spec": {"attachRequired": false, "volumeLifecycleModes": ["Persistent"]},
    }))
    .unwrap();
    drivers
        .create(&PostParams::default(), &driver)
        .await
        .unwrap();
}

/// `syncfs` on the filesystem of `path`.
fn syncfs(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path).unwrap();
    // SAFETY: syncfs on an open fd.
    assert_eq!(unsafe { libc::syncfs(dir.as_raw_fd()) }, 0);
}

/// A VolumeAttachment of `pv` on `node`, attached (by an attacher that is not ours).
async fn attach(h: &Harness, pv: &PersistentVolume, node: &str) {
    let api: Api<VolumeAttachment> = Api::all(h.client.clone());
    let name = format!("va-{node}");
    let va = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "attacher": "elsewhere.example.com",
            "nodeName": node,
            "source": {"persistentVolumeName": pv.metadata.name},
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &va).await.unwrap();
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"attached": true}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_targets_fail_with_a_message_naming_the_field() {
    let (h, provisioner) = harness().await;

    create_job(&h, "no-claim", "missing").await;
    let status = wait_done(&h, "no-claim").await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(FIELD) && message.contains("default/missing does not exist"),
        "{message}"
    );
    assert_eq!(status["conditions"][0]["type"], "Failed");

    // a claim bound to a volume of a CSI driver that is not installed
    let volumes: Api<PersistentVolume> = Api::all(h.client.clone());
    let foreign = serde_json::from_value(json!({
        "metadata": {"name": "foreign-pv"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "other.csi.example.com", "volumeHandle": "vol-1"},
            "claimRef": {"namespace": "default", "name": "foreign"},
        },
    }))
    .unwrap();
    volumes
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let claims = h.claims();
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "foreign", "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": "foreign-pv",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    create_job(&h, "foreign", "foreign").await;
    let status = wait_done(&h, "foreign").await;
    assert_eq!(status["result"], "Failed", "{status}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.starts_with(FIELD) && message.contains("other.csi.example.com"),
        "{message}"
    );
    let event = h.wait_event("foreign", "ReclaimSpaceFailed").await;
    assert!(event.contains(FIELD), "{event}");

    // an empty target
    create_job(&h, "empty", "").await;
    let status = wait_done(&h, "empty").await;
    assert_eq!(status["result"], "Failed", "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("must name a PersistentVolumeClaim"),
        "{status}"
    );
    assert_no_key(&h, &provisioner, &status).await;
}
