//! csi-addons' VolumeReplication, end to end on the two-site test bed: two micro-ceph clusters
//! (site-a, site-b) peered for the pool in image mode with an `rbd-mirror` daemon each, the
//! emulated API server (with the csi-addons CRDs) and the provisioner binary on site-a.
//!
//! A claim with a primary VolumeReplication of a class with a one-minute interval: its image is
//! mirrored, site-b's copy holds the same bytes and `lastSyncTime` is set within two intervals.
//! Bad input is a `Validated` `False` condition naming the field (an unknown class, a journal
//! class, no such claim, a claim of another driver's volume), a pool without mirroring a
//! `FailedToPromote` one, with nothing changed in Ceph; a class of another provisioner is left
//! alone. Deleting the claim removes site-a's image and leaves
//! site-b's copy, which site-b can then promote (without force). The VolumeReplication of the
//! deleted claim goes when deleted.
//!
//! A planned failover and failback with a second emulated Kubernetes cluster for site-b and its
//! own provisioner: `rbd-provisioner dr list` there shows the copy, `dr adopt --promote` makes
//! its PV (Retain, site-b's cluster in the handle) and claim and a primary VolumeReplication,
//! which is promoted once site-a's is secondary; site-b's writes reach site-a, and site-a is
//! primary again with them once site-b is secondary. The owner record follows the primary.
//! Then site-a is lost at once (its provisioner and daemon killed): site-b, force-promoted by
//! the annotation, holds the last sync, not site-a's later write; site-a back, a `resync` on
//! its VolumeReplication makes its copy site-b's again.

mod support;

use std::time::Duration;

use ceph_rbd::MirrorImageState;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
use micro_ceph::MicroCeph;
use serde_json::json;
use support::Harness;

const MIB: u64 = 1 << 20;
/// Two one-minute intervals and the sync, on a loaded 2-vCPU machine.
const SYNC_WAIT: Duration = Duration::from_secs(200);
const WAIT: Duration = Duration::from_secs(60);
const DRIVER: &str = rbd_csi::DEFAULT_DRIVER_NAME;

fn replications(h: &Harness) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<provisioner::replication::VolumeReplication>(&());
    Api::namespaced_with(h.client.clone(), "default", &resource)
}

async fn create_replication_class(
    h: &Harness,
    name: &str,
    provisioner: &str,
    parameters: serde_json::Value,
) {
    let resource = ApiResource::erase::<provisioner::replication::VolumeReplicationClass>(&());
    let api: Api<DynamicObject> = Api::all_with(h.client.clone(), &resource);
    let object = serde_json::from_value(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1",
        "kind": "VolumeReplicationClass",
        "metadata": {"name": name},
        "spec": {"provisioner": provisioner, "parameters": parameters},
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

async fn create_replication(h: &Harness, name: &str, class: &str, claim: &str) {
    let object = serde_json::from_value(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1",
        "kind": "VolumeReplication",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "volumeReplicationClass": class,
            "replicationState": "primary",
            "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": claim},
            "autoResync": false,
        },
    }))
    .unwrap();
    replications(h)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// The status of VolumeReplication `name` once `check` accepts it.
async fn wait_status(
    h: &Harness,
    name: &str,
    timeout: Duration,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    h.until(
        &format!("VolumeReplication {name}: {what}"),
        timeout,
        || async {
            let vr = replications(h).get(name).await.ok()?;
            let status = vr.data.get("status")?.clone();
            check(&status).then_some(status)
        },
    )
    .await
}

fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> &'a serde_json::Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&serde_json::Value::Null)
}

/// A refused VolumeReplication: `Validated` `False` with a message containing `field`.
async fn wait_refused(h: &Harness, name: &str, field: &str) -> String {
    let status = wait_status(h, name, WAIT, "refused", |s| {
        condition(s, "Validated")["status"] == "False"
    })
    .await;
    let validated = condition(&status, "Validated");
    assert_eq!(validated["reason"], "PrerequisiteNotMet", "{status}");
    let message = validated["message"].as_str().unwrap().to_owned();
    assert!(message.contains(field), "{name}: {message}");
    assert_eq!(status["state"], "Unknown", "{status}");
    assert_eq!(status["message"].as_str(), Some(message.as_str()));
    message
}

/// The two sites, peered with their daemons; they stop with this process (their guardians),
/// daemons included.
async fn sites() -> (&'static MicroCeph, &'static MicroCeph) {
    tokio::task::spawn_blocking(|| {
        let (a, b) = MicroCeph::start_two_sites().expect("the two sites");
        (&*Box::leak(Box::new(a)), &*Box::leak(Box::new(b)))
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_replicated_to_the_peer_site_and_its_deletion_leaves_the_peer_copy() {
    let (a, b) = sites().await;
    let h = Harness::start_with(
        kube_emulator::Emulator::builder()
            .csi_addons_crds(true)
            .build(),
        a,
    )
    .await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let provisioner = h.spawn_default();
    create_replication_class(
        &h,
        "every-minute",
        DRIVER,
        json!({"mirroringMode": "snapshot", "schedulingInterval": "1m",
               "replication.storage.openshift.io/replication-secret-name": "ignored"}),
    )
    .await;
    let (site_a, site_b) = (
        support::admin_connection(a).await,
        support::admin_connection(b).await,
    );

    // a claim's data replicated: site-b's copy holds the same bytes, lastSyncTime set
    h.create_claim("data", "rbd", "32Mi", false).await;
    let (_, pv) = h.wait_bound("data").await;
    let image = Harness::image_name(&pv);
    a.fill_image(&a.pool, &image, 0, 8 * MIB, 0x5a).unwrap();
    a.fill_image(&a.pool, &image, 20 * MIB, 4 * MIB, 0xc3)
        .unwrap();
    let want = support::export_digest(a, &image);
    create_replication(&h, "data", "every-minute", "data").await;
    let status = wait_status(&h, "data", WAIT, "primary", |s| s["state"] == "Primary").await;
    let completed = condition(&status, "Completed");
    assert_eq!(
        (&completed["status"], &completed["reason"]),
        (&json!("True"), &json!("Promoted")),
        "{status}"
    );
    assert_eq!(
        condition(&status, "Validated")["status"],
        "True",
        "{status}"
    );
    let info = site_a.mirror_image_info(&a.pool, &image).await.unwrap();
    assert!(info.primary && info.snapshot_mode == Some(true), "{info:?}");
    let status = wait_status(&h, "data", SYNC_WAIT, "lastSyncTime", |s| {
        s["lastSyncTime"].is_string()
    })
    .await;
    assert!(status["lastSyncDuration"].is_string(), "{status}");
    wait_copy(
        &h,
        b,
        &site_b,
        &image,
        &want,
        "site-b's copy with site-a's bytes",
    )
    .await;
    let finalizers = replications(&h)
        .get("data")
        .await
        .unwrap()
        .metadata
        .finalizers;
    assert_eq!(
        finalizers,
        Some(vec![provisioner::replication::FINALIZER.to_owned()])
    );

    // bad input: a condition naming the field, nothing changed in Ceph
    create_replication(&h, "no-class", "no-such-class", "data").await;
    wait_refused(&h, "no-class", "spec.volumeReplicationClass").await;
    create_replication_class(&h, "journal", DRIVER, json!({"mirroringMode": "journal"})).await;
    h.create_claim("other", "rbd", "16Mi", false).await;
    let (_, other_pv) = h.wait_bound("other").await;
    let other = Harness::image_name(&other_pv);
    create_replication(&h, "journal", "journal", "other").await;
    let message = wait_refused(&h, "journal", "parameters.mirroringMode").await;
    assert!(message.contains("snapshot"), "{message}");
    create_replication(&h, "no-claim", "every-minute", "no-such-claim").await;
    wait_refused(&h, "no-claim", "spec.dataSource").await;
    h.create_pool("unmirrored");
    let mut params = h.params();
    for (k, v) in &mut params {
        if k == "pool" {
            "unmirrored".clone_into(v);
        }
    }
    h.create_class("unmirrored", &params, "Delete").await;
    h.create_claim("plain", "unmirrored", "16Mi", false).await;
    let (_, plain_pv) = h.wait_bound("plain").await;
    let plain = Harness::image_name(&plain_pv);
    create_replication(&h, "plain", "every-minute", "plain").await;
    let status = wait_status(&h, "plain", WAIT, "refused", |s| {
        condition(s, "Completed")["status"] == "False"
    })
    .await;
    let completed = condition(&status, "Completed");
    assert_eq!(completed["reason"], "FailedToPromote", "{status}");
    assert!(
        completed["message"]
            .as_str()
            .unwrap()
            .contains("is not mirrored in image mode"),
        "{status}"
    );
    // a claim bound to another driver's volume
    let foreign_pv = serde_json::from_value(json!({
        "metadata": {"name": "foreign-pv"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": "default", "name": "foreign"},
            "csi": {"driver": "other.csi.example.com", "volumeHandle": "vol-1"},
        },
    }))
    .unwrap();
    h.volumes()
        .create(&PostParams::default(), &foreign_pv)
        .await
        .unwrap();
    let foreign_claim = serde_json::from_value(json!({
        "metadata": {"name": "foreign", "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": "foreign-pv",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    h.claims()
        .create(&PostParams::default(), &foreign_claim)
        .await
        .unwrap();
    h.wait_bound("foreign").await;
    create_replication(&h, "foreign", "every-minute", "foreign").await;
    let message = wait_refused(&h, "foreign", "spec.dataSource").await;
    assert!(message.contains("other.csi.example.com"), "{message}");
    // another provisioner's class: left to it
    create_replication_class(&h, "theirs", "other.csi.example.com", json!({})).await;
    create_replication(&h, "theirs", "theirs", "other").await;
    for (pool, image) in [("rbd", &other), ("unmirrored", &plain)] {
        let info = site_a.mirror_image_info(pool, image).await.unwrap();
        assert_eq!(info.state, MirrorImageState::Disabled, "{pool}/{image}");
    }
    let theirs = replications(&h).get("theirs").await.unwrap();
    assert!(theirs.data.get("status").is_none(), "{theirs:?}");
    assert!(theirs.metadata.finalizers.unwrap_or_default().is_empty());

    // the claim deleted: site-a's image goes, site-b keeps its copy and can promote it
    h.claims()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv.metadata.name.clone().unwrap()).await;
    assert!(
        site_a.mirror_image_info(&a.pool, &image).await.is_err(),
        "site-a's image is removed"
    );
    h.until("site-b promotes its copy", WAIT, || async {
        site_b
            .mirror_image_promote(&b.pool, &image, false)
            .await
            .ok()
    })
    .await;
    assert_eq!(
        support::export_digest(b, &image),
        want,
        "site-b's copy keeps the bytes"
    );
    // the VolumeReplication of a deleted claim goes when deleted
    replications(&h)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    h.until("VolumeReplication data gone", WAIT, || async {
        matches!(replications(&h).get_opt("data").await, Ok(None)).then_some(())
    })
    .await;
    h.assert_nowhere(&a.admin_key, &[provisioner.log_text()])
        .await;
}

/// Runs `rbd-provisioner dr` against `h`'s API server with its class `rbd`; its stdout.
async fn dr(h: &Harness, args: &[&str]) -> String {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"));
    command
        .args(["dr", "--kubeconfig"])
        .arg(&h.kubeconfig)
        .args(["--storage-class", "rbd"])
        .args(args)
        .env_remove("RUST_LOG");
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "dr {args:?}: {stdout}{stderr}");
    stdout
}

/// Sets `replicationState` of VolumeReplication `name`.
async fn set_state(h: &Harness, name: &str, state: &str) {
    replications(h)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicationState": state}})),
        )
        .await
        .unwrap();
}

async fn site_harness(ceph: &'static MicroCeph) -> (Harness, support::Process) {
    let h = Harness::start_with(
        kube_emulator::Emulator::builder()
            .csi_addons_crds(true)
            .build(),
        ceph,
    )
    .await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let provisioner = h.spawn_default();
    create_replication_class(
        &h,
        "every-minute",
        DRIVER,
        json!({"schedulingInterval": "1m"}),
    )
    .await;
    (h, provisioner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_planned_and_unplanned_through_the_dr_command_and_back() {
    let (a, b) = sites().await;
    let ((ha, mut pa), (hb, _pb)) = tokio::join!(site_harness(a), site_harness(b));
    let (site_a, site_b) = (
        support::admin_connection(a).await,
        support::admin_connection(b).await,
    );

    // site-a's claim, replicated
    ha.create_claim("app", "rbd", "32Mi", false).await;
    let (_, pv) = ha.wait_bound("app").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    a.fill_image(&a.pool, &image, 0, 8 * MIB, 0x11).unwrap();
    let written_on_a = support::export_digest(a, &image);
    create_replication(&ha, "app", "every-minute", "app").await;
    wait_copy(&hb, b, &site_b, &image, &written_on_a, "site-b's copy").await;
    let listed = dr(&hb, &["list", "--namespace", "default"]).await;
    let row = listed
        .lines()
        .find(|l| l.starts_with(&image))
        .unwrap_or_else(|| panic!("{image} not listed: {listed}"));
    assert!(
        row.contains("default/app") && row.contains(&pv_name),
        "{row}"
    );
    assert!(row.contains("secondary") && row.ends_with("no"), "{row}");

    // planned failover: site-a secondary, then site-b's claim made and promoted by dr adopt
    set_state(&ha, "app", "secondary").await;
    wait_status(&ha, "app", WAIT, "secondary", |s| s["state"] == "Secondary").await;
    dr(
        &hb,
        &[
            "adopt",
            "--namespace",
            "default",
            "--replication-class",
            "every-minute",
            "--promote",
        ],
    )
    .await;
    let (_, pv_b) = hb.wait_bound("app").await;
    assert_eq!(pv_b.metadata.name.as_deref(), Some(pv_name.as_str()));
    let spec = pv_b.spec.clone().unwrap();
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    let handle = spec.csi.unwrap().volume_handle;
    assert!(
        handle.contains(&b.monitors) && handle.ends_with(&image),
        "{handle}"
    );
    wait_status(&hb, "app", SYNC_WAIT, "promoted on site-b", |s| {
        s["state"] == "Primary"
    })
    .await;
    assert_eq!(support::export_digest(b, &image), written_on_a);
    assert!(
        dr(&hb, &["list"])
            .await
            .lines()
            .any(|l| l.starts_with(&image) && l.ends_with("yes"))
    );
    // adopting again changes nothing
    dr(&hb, &["adopt", "--namespace", "default"]).await;

    // site-b's writes reach site-a
    b.fill_image(&b.pool, &image, 16 * MIB, 4 * MIB, 0x22)
        .unwrap();
    let written_on_b = support::export_digest(b, &image);
    wait_copy(
        &ha,
        a,
        &site_a,
        &image,
        &written_on_b,
        "site-a's copy of site-b's writes",
    )
    .await;

    // failback: site-b secondary, site-a primary again
    set_state(&hb, "app", "secondary").await;
    wait_status(&hb, "app", WAIT, "secondary", |s| s["state"] == "Secondary").await;
    set_state(&ha, "app", "primary").await;
    wait_status(&ha, "app", SYNC_WAIT, "primary again", |s| {
        s["state"] == "Primary"
    })
    .await;
    assert_eq!(support::export_digest(a, &image), written_on_b);
    // the owner record follows the primary: site-a's cluster again
    let meta = site_a
        .metadata_list_unopened(&a.pool, &image)
        .await
        .unwrap();
    assert_eq!(
        meta.get(rbd_volume::owner::META_KUBE_CLUSTER),
        Some(&ha.kube_cluster_id().await)
    );
    wait_copy(
        &hb,
        b,
        &site_b,
        &image,
        &written_on_b,
        "site-b's copy after the failback",
    )
    .await;

    // unplanned: site-a lost at once (its provisioner and daemon killed); a write there after
    // the last sync never reaches site-b, which is force-promoted through its VolumeReplication
    pa.kill();
    a.kill_rbd_mirror();
    a.fill_image(&a.pool, &image, 0, 4 * MIB, 0x33).unwrap();
    replications(&hb)
        .patch(
            "app",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({
                "metadata": {"annotations": {provisioner::replication::FORCE_PROMOTE_ANNOTATION: "true"}},
                "spec": {"replicationState": "primary"},
            })),
        )
        .await
        .unwrap();
    wait_status(&hb, "app", SYNC_WAIT, "force-promoted", |s| {
        s["state"] == "Primary"
    })
    .await;
    assert_eq!(
        support::export_digest(b, &image),
        written_on_b,
        "site-b holds the last sync"
    );
    // site-a back: still primary (never both primary with neither told: its status says so
    // until asked); resync makes it a copy of site-b's again
    a.start_rbd_mirror().unwrap();
    let _pa = ha.spawn_default();
    set_state(&ha, "app", "resync").await;
    wait_status(&ha, "app", SYNC_WAIT, "resynced", |s| {
        s["state"] == "Secondary" && condition(s, "Resyncing")["status"] == "False"
    })
    .await;
    wait_copy(
        &ha,
        a,
        &site_a,
        &image,
        &written_on_b,
        "site-a resynced from site-b",
    )
    .await;
}

/// Until `ceph`'s non-primary copy of `image` holds the bytes whose digest is `want`.
async fn wait_copy(
    h: &Harness,
    ceph: &'static MicroCeph,
    site: &ceph_rbd::Cluster,
    image: &str,
    want: &str,
    what: &str,
) {
    h.until(what, SYNC_WAIT, || async {
        let info = site.mirror_image_info(&ceph.pool, image).await.ok()?;
        (info.state == MirrorImageState::Enabled
            && !info.primary
            && support::export_digest(ceph, image) == want)
            .then_some(())
    })
    .await;
}
