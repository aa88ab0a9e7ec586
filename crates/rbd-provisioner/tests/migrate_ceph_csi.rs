//! `rbd-provisioner migrate` of ceph-csi's RBD volumes, end to end on the emulator and
//! micro-ceph. Volumes are laid out as ceph-csi 3.12 writes them, from its source's constants
//! (not from our code): the image `csi-vol-<uuid>`, the journal objects `csi.volumes.default`
//! (`csi.volume.<PV name>` → uuid) and `csi.volume.<uuid>` (`csi.imagename`, `csi.volname`,
//! `csi.imageid`, `csi.volume.owner`), the handle `0001-<len>-<clusterID>-<pool ID>-<uuid>`,
//! secrets with `userID`/`userKey`, and the PV, claim and class as the external-provisioner
//! makes them for `rbd.csi.ceph.com`. `migrate` moves the PV to our driver in place; our node
//! plugin stages it and reads the file written before (the same bytes); a second run changes
//! nothing; ceph-csi's journal is left as it was; our provisioner deletes it with its claim.
//! Bad input (an unknown cluster ID, a handle that does not parse, a journal entry missing) is
//! refused and changes nothing.
//!
//! Snapshots are laid out as ceph-csi's CreateSnapshot leaves them (a temporary snapshot of the
//! source, cloned (v2, `layering,deep-flatten`) to `csi-snap-<uuid>`, the temporary snapshot
//! removed, the snapshot `csi-snap-<uuid>@csi-snap-<uuid>`; the journal `csi.snaps.default` and
//! `csi.snap.<uuid>` with `csi.imagename`, `csi.snapname`, `csi.source`, `csi.imageid`), and the
//! content's status written as its csi-snapshotter writes it. After `migrate`, our driver
//! restores, deletes and serves them; the migrated volume is expanded, snapshotted and cloned
//! by our controller, under the classes `migrate` printed.
//!
//! Encrypted volumes and their snapshots are laid out as ceph-csi's `metadata` KMS with a
//! `secretName` leaves them (a LUKS2 header by `cryptsetup`, the passphrase wrapped in Python
//! after its `secretsMetadataKMS.EncryptDEK`, the journal's `csi.volume.encryptKMS`): after
//! `migrate`, the key our node would read by our IDs opens the header, ceph-csi still reads the
//! key, and our driver restores the snapshot encrypted. The LUKS data path itself is the VM's
//! (`vm_kernel`).

#[path = "support/node.rs"]
mod node;
#[path = "support/snapshots.rs"]
mod snapshots;
mod support;

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use support::Harness;

const OURS: &str = "rbd.provisioner.ceph.io";
const CEPH_CSI: &str = "rbd.csi.ceph.com";
const CLUSTER_ID: &str = "rook-ceph";
const SECRET: &str = "csi-rbd-secret";
const CLASS: &str = "csi-rbd-sc";

/// A volume as ceph-csi made it.
struct CephCsiVolume {
    pv: String,
    claim: String,
    uuid: String,
    image: String,
    handle: String,
}

fn uuid() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let hex = |n: usize, rng: &mut rand::rngs::ThreadRng| -> String {
        (0..n)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
            .collect()
    };
    format!(
        "{}-{}-{}-{}-{}",
        hex(8, &mut rng),
        hex(4, &mut rng),
        hex(4, &mut rng),
        hex(4, &mut rng),
        hex(12, &mut rng)
    )
}

/// The pool's ID (`ceph osd pool ls detail`).
fn pool_id(h: &Harness) -> i64 {
    let pools: Value = serde_json::from_str(
        &h.ceph
            .ceph(&["osd", "pool", "ls", "detail", "--format", "json"])
            .unwrap(),
    )
    .unwrap();
    pools
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool_name"] == h.ceph.pool.as_str())
        .and_then(|p| p["pool_id"].as_i64())
        .unwrap()
}

/// ceph-csi's `CSIIdentifier.ComposeCSIID`: version, cluster ID length (4 hex digits each),
/// cluster ID, pool ID (16 hex digits), uuid.
fn ceph_csi_handle(cluster_id: &str, pool_id: i64, uuid: &str) -> String {
    format!(
        "0001-{:04x}-{cluster_id}-{pool_id:016x}-{uuid}",
        cluster_id.len()
    )
}

/// `rados setomapval` in the pool's RADOS namespace `ns` (empty: the default one).
fn setomapval(h: &Harness, ns: &str, object: &str, key: &str, value: &str) {
    let mut args = vec!["-p", h.ceph.pool.as_str()];
    if !ns.is_empty() {
        args.extend(["-N", ns]);
    }
    args.extend(["setomapval", object, key, value]);
    h.ceph.rados(&args).unwrap();
}

/// `pool[/ns]/name`.
fn spec(h: &Harness, ns: &str, name: &str) -> String {
    if ns.is_empty() {
        format!("{}/{name}", h.ceph.pool)
    } else {
        format!("{}/{ns}/{name}", h.ceph.pool)
    }
}

/// The image's ID (`rbd info`).
fn image_id(h: &Harness, ns: &str, image: &str) -> String {
    let info: Value = serde_json::from_str(
        &h.ceph
            .rbd(&["info", "--format", "json", &spec(h, ns, image)])
            .unwrap(),
    )
    .unwrap();
    info["id"].as_str().unwrap().to_owned()
}

/// The class, secret and cluster config of a ceph-csi installation, and our CSIDriver.
async fn setup(h: &Harness) -> std::path::PathBuf {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(h.client.clone());
    let class = serde_json::from_value(json!({
        "metadata": {"name": CLASS},
        "provisioner": CEPH_CSI,
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": true,
        "parameters": {
            "clusterID": CLUSTER_ID, "pool": h.ceph.pool, "imageFeatures": "layering",
            "csi.storage.k8s.io/provisioner-secret-name": SECRET,
            "csi.storage.k8s.io/provisioner-secret-namespace": "default",
            "csi.storage.k8s.io/controller-expand-secret-name": SECRET,
            "csi.storage.k8s.io/controller-expand-secret-namespace": "default",
            "csi.storage.k8s.io/node-stage-secret-name": SECRET,
            "csi.storage.k8s.io/node-stage-secret-namespace": "default",
            "csi.storage.k8s.io/fstype": "ext4",
        },
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    h.create_secret(
        "default",
        SECRET,
        &[("userID", "admin"), ("userKey", &h.ceph.admin_key)],
    )
    .await;
    let drivers: Api<CSIDriver> = Api::all(h.client.clone());
    let driver = serde_json::from_value(json!({"metadata": {"name": OURS}, "spec": {}})).unwrap();
    drivers
        .create(&PostParams::default(), &driver)
        .await
        .unwrap();
    // ceph-csi's config.json
    let config = h.dir.path().join("ceph-csi-config.json");
    let monitors: Vec<&str> = h.ceph.monitors.split(',').collect();
    std::fs::write(
        &config,
        json!([{"clusterID": CLUSTER_ID, "monitors": monitors}]).to_string(),
    )
    .unwrap();
    config
}

/// A 64 MiB volume for claim `claim` as ceph-csi and the external-provisioner make it.
/// `journal`: whether its journal entry is written; `tweak` edits the PV first.
async fn ceph_csi_volume(
    h: &Harness,
    claim: &str,
    journal: bool,
    tweak: impl FnOnce(&mut Value),
) -> CephCsiVolume {
    ceph_csi_volume_in(h, claim, (CLUSTER_ID, "", CLASS), journal, tweak).await
}

/// [`ceph_csi_volume`] in the RADOS namespace `ns` of a cluster ID whose `rbd.radosNamespace`
/// it is, of StorageClass `class`.
async fn ceph_csi_volume_in(
    h: &Harness,
    claim: &str,
    (cluster_id, ns, class): (&str, &str, &str),
    journal: bool,
    tweak: impl FnOnce(&mut Value),
) -> CephCsiVolume {
    let uuid = uuid();
    let image = format!("csi-vol-{uuid}");
    h.ceph
        .rbd(&[
            "create",
            "--size",
            "64M",
            "--image-feature",
            "layering",
            &spec(h, ns, &image),
        ])
        .unwrap();
    let c = h.create_claim(claim, class, "64Mi", false).await;
    let claim_uid = c.metadata.uid.clone().unwrap();
    let pv = format!("pvc-{claim_uid}");
    if journal {
        let id = image_id(h, ns, &image);
        setomapval(
            h,
            ns,
            "csi.volumes.default",
            &format!("csi.volume.{pv}"),
            &uuid,
        );
        let object = format!("csi.volume.{uuid}");
        setomapval(h, ns, &object, "csi.imagename", &image);
        setomapval(h, ns, &object, "csi.volname", &pv);
        setomapval(h, ns, &object, "csi.imageid", &id);
        setomapval(h, ns, &object, "csi.volume.owner", "default");
    }
    let handle = ceph_csi_handle(cluster_id, pool_id(h), &uuid);
    let mut volume = json!({
        "metadata": {
            "name": pv,
            "annotations": {
                "pv.kubernetes.io/provisioned-by": CEPH_CSI,
                "volume.kubernetes.io/provisioner-deletion-secret-name": SECRET,
                "volume.kubernetes.io/provisioner-deletion-secret-namespace": "default",
            },
            "finalizers": ["kubernetes.io/pv-protection",
                           "external-provisioner.volume.kubernetes.io/finalizer"],
        },
        "spec": {
            "capacity": {"storage": "64Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class,
            "volumeMode": "Filesystem",
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                         "namespace": "default", "name": claim, "uid": claim_uid,
                         "resourceVersion": c.metadata.resource_version.clone().unwrap()},
            "csi": {
                "driver": CEPH_CSI,
                "volumeHandle": handle,
                "fsType": "ext4",
                "volumeAttributes": {
                    "clusterID": cluster_id,
                    "pool": h.ceph.pool,
                    "journalPool": h.ceph.pool,
                    "imageName": image,
                    "imageFeatures": "layering",
                    "storage.kubernetes.io/csiProvisionerIdentity":
                        "1733400000000-8081-rbd.csi.ceph.com",
                },
                "nodeStageSecretRef": {"name": SECRET, "namespace": "default"},
                "controllerExpandSecretRef": {"name": SECRET, "namespace": "default"},
            },
        },
    });
    if !ns.is_empty() {
        volume["spec"]["csi"]["volumeAttributes"]["radosNamespace"] = json!(ns);
    }
    tweak(&mut volume);
    let volume: PersistentVolume = serde_json::from_value(volume).unwrap();
    h.volumes()
        .create(&PostParams::default(), &volume)
        .await
        .unwrap();
    h.wait_bound(claim).await;
    CephCsiVolume {
        pv,
        claim: claim.to_owned(),
        uuid,
        image,
        handle,
    }
}

fn migrate(h: &Harness, config: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
        .arg("migrate")
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .arg("--cluster-config")
        .arg(config)
        .args(["--wait", "20s", "-o", "json"])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RBD_PROVISIONER_CRASH_AT")
        .env_remove("PROVISIONER_NAME")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    support::output_text(out)
}

fn report(out: &Output) -> BTreeMap<String, Value> {
    support::migrate_report(out)
}

/// ceph-csi's journal of `v`: its key in the directory `csi.volumes.default` (which other
/// tests of this binary share) and its own object's omap, as `rados` prints them.
fn journal(h: &Harness, v: &CephCsiVolume) -> String {
    let pool = &h.ceph.pool;
    format!(
        "{}\n{}",
        h.ceph
            .rados(&[
                "-p",
                pool,
                "getomapval",
                "csi.volumes.default",
                &format!("csi.volume.{}", v.pv),
            ])
            .unwrap(),
        h.ceph
            .rados(&[
                "-p",
                pool,
                "listomapvals",
                &format!("csi.volume.{}", v.uuid)
            ])
            .unwrap()
    )
}

/// A PV object (not in the API) with our driver and a handle naming `image` by monitors, for
/// writing the image's filesystem before the migration through our node plugin, as ceph-csi's
/// would have.
fn before_pv(h: &Harness, image: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "before"},
        "spec": {"csi": {
            "driver": OURS,
            "volumeHandle": format!("v1/{}/{}/{image}", h.ceph.monitors, h.ceph.pool),
            "fsType": "ext4",
            "volumeAttributes": {"monitors": h.ceph.monitors, "pool": h.ceph.pool,
                                 "imageName": image},
            "nodeStageSecretRef": {"name": SECRET, "namespace": "default"},
        }},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ceph_csi_volume_is_taken_over_in_place_and_keeps_its_bytes() {
    let h = Harness::start().await;
    let config = setup(&h).await;
    let v = ceph_csi_volume(&h, "app-data", true, |_| {}).await;
    let plugin_dir = h.dir.path().join("node");
    let plugin = node::NodePlugin::start_args(
        &plugin_dir,
        "node-1",
        &[&format!("--cluster-config={}", config.display())],
        None,
    );
    let data: Vec<u8> = (0..1u32 << 20)
        .map(|i| u8::try_from(i % 253).unwrap())
        .collect();
    plugin
        .with_mounted(&h.client, &before_pv(&h, &v.image), |target| {
            std::fs::write(target.join("data.bin"), &data).unwrap();
        })
        .await;
    let journal_before = journal(&h, &v);
    let pv_before = h.volumes().get(&v.pv).await.unwrap();

    // dry run: the new PV, nothing changed
    let out = migrate(&h, &config, &["--all", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out));
    let row = &report(&out)[&v.pv];
    assert_eq!(row["result"], "would-migrate", "{row}");
    let new_csi = &row["newPV"]["spec"]["csi"];
    assert_eq!(new_csi["driver"], OURS);
    assert_eq!(
        new_csi["volumeHandle"],
        format!("v2/{CLUSTER_ID}/{}/{}", h.ceph.pool, v.image)
    );
    assert_eq!(new_csi["nodeStageSecretRef"]["name"], SECRET);
    assert_eq!(new_csi["volumeAttributes"]["imageName"], v.image.as_str());
    assert_eq!(
        h.volumes()
            .get(&v.pv)
            .await
            .unwrap()
            .metadata
            .resource_version,
        pv_before.metadata.resource_version
    );

    // the migration
    let out = migrate(&h, &config, &["--all"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(report(&out)[&v.pv]["result"], "migrated", "{}", text(&out));
    let pv = h.volumes().get(&v.pv).await.unwrap();
    let csi = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
    assert_eq!(csi.driver, OURS);
    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["provisioner.ceph.com/migrated-from"], CEPH_CSI);
    assert_eq!(
        annotations["provisioner.ceph.com/ceph-csi-volume-handle"],
        v.handle
    );
    assert_eq!(
        pv.spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Delete")
    );
    let claim = h.claims().get(&v.claim).await.unwrap();
    assert_eq!(
        claim.status.unwrap().phase.as_deref(),
        Some("Bound"),
        "the claim stays bound"
    );
    // the way back stays open: ceph-csi's journal is untouched; our owner record is beside it
    assert_eq!(journal(&h, &v), journal_before);
    assert_eq!(
        h.image_meta(&v.image, "provisioner.ceph.com/pv").as_deref(),
        Some(v.pv.as_str())
    );

    // our node plugin stages the migrated PV and reads the same bytes
    let read = plugin
        .with_mounted(&h.client, &pv, |target| {
            std::fs::read(target.join("data.bin")).unwrap()
        })
        .await;
    assert!(read == data, "the file reads back unchanged");

    // a second run changes nothing
    let out = migrate(&h, &config, &["--all"]);
    assert!(out.status.success(), "{}", text(&out));
    let again = h.volumes().get(&v.pv).await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        pv.metadata.resource_version
    );
    drop(plugin);

    // our provisioner deletes it with its claim
    delete_through_ours(&h, &config, &v).await;
    assert!(
        !h.images().contains(&v.image),
        "the image goes with its claim: {:?}",
        h.images()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ceph_csi_volumes_are_refused_and_left_as_they_are() {
    let h = Harness::start().await;
    let config = setup(&h).await;
    // an unknown cluster ID, a handle that does not parse, no journal entry
    let pool = pool_id(&h);
    let unknown = ceph_csi_volume(&h, "unknown-cluster", true, |pv| {
        let csi = &mut pv["spec"]["csi"];
        let uuid = csi["volumeHandle"].as_str().unwrap()
            [csi["volumeHandle"].as_str().unwrap().len() - 36..]
            .to_owned();
        csi["volumeHandle"] = json!(ceph_csi_handle("elsewhere", pool, &uuid));
        csi["volumeAttributes"]["clusterID"] = json!("elsewhere");
    })
    .await;
    let bad = ceph_csi_volume(&h, "bad-handle", true, |pv| {
        pv["spec"]["csi"]["volumeHandle"] = json!("0001-garbage");
    })
    .await;
    let orphan = ceph_csi_volume(&h, "no-journal", false, |_| {}).await;
    let good = ceph_csi_volume(&h, "good", true, |_| {}).await;
    let mut versions = BTreeMap::new();
    for v in [&unknown, &bad, &orphan] {
        let pv = h.volumes().get(&v.pv).await.unwrap();
        versions.insert(v.pv.clone(), pv.metadata.resource_version);
    }

    let out = migrate(&h, &config, &["--all"]);
    assert!(
        !out.status.success(),
        "refusals fail the run: {}",
        text(&out)
    );
    let rows = report(&out);
    let detail = |v: &CephCsiVolume| rows[&v.pv]["detail"].as_str().unwrap().to_owned();
    assert_eq!(rows[&unknown.pv]["result"], "refused");
    assert!(
        detail(&unknown).contains("elsewhere"),
        "{}",
        detail(&unknown)
    );
    assert_eq!(rows[&bad.pv]["result"], "refused");
    assert!(
        detail(&bad).contains("spec.csi.volumeHandle"),
        "{}",
        detail(&bad)
    );
    assert_eq!(rows[&orphan.pv]["result"], "refused");
    assert!(
        detail(&orphan).contains(&format!("csi.volume.{}", orphan.uuid)),
        "{}",
        detail(&orphan)
    );
    assert_eq!(rows[&good.pv]["result"], "migrated", "{}", text(&out));
    for (name, version) in &versions {
        let pv = h.volumes().get(name).await.unwrap();
        assert_eq!(&pv.metadata.resource_version, version, "{name} changed");
        assert_eq!(
            pv.spec.unwrap().csi.unwrap().driver,
            CEPH_CSI,
            "{name} is still ceph-csi's"
        );
    }
    for v in [&unknown, &bad, &orphan] {
        assert_eq!(h.image_meta(&v.image, "provisioner.ceph.com/pv"), None);
    }
}

/// The way back of docs/migration.md, step by step: after it, the PV is ceph-csi's again as it
/// was (the same spec, annotations and claim), the claim is bound to it, and ceph-csi's journal
/// never changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_way_back_gives_the_volume_to_ceph_csi_again() {
    let h = Harness::start().await;
    let config = setup(&h).await;
    let v = ceph_csi_volume(&h, "roundtrip", true, |_| {}).await;
    let original = h.volumes().get(&v.pv).await.unwrap();
    let journal_before = journal(&h, &v);
    let out = migrate(&h, &config, &["--pv", &v.pv]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(report(&out)[&v.pv]["result"], "migrated", "{}", text(&out));

    // 1. the recorded PV
    let records: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(h.client.clone(), "kube-system");
    let record = records.get(&format!("rbd-migrate-{}", v.pv)).await.unwrap();
    let mut recorded: PersistentVolume = serde_json::from_str(&record.data.unwrap()["pv"]).unwrap();
    // 2. the CSI PV: Retain, deleted, finalizers dropped
    let retain = json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    let volumes = h.volumes();
    volumes
        .patch(
            &v.pv,
            &Default::default(),
            &kube::api::Patch::Merge(&retain),
        )
        .await
        .unwrap();
    volumes
        .delete(&v.pv, &DeleteParams::default())
        .await
        .unwrap();
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    let _ = volumes
        .patch(
            &v.pv,
            &Default::default(),
            &kube::api::Patch::Merge(&no_finalizers),
        )
        .await;
    h.wait_pv_gone(&v.pv).await;
    // 3. the recorded PV created again, without uid, resourceVersion and status
    recorded.metadata.uid = None;
    recorded.metadata.resource_version = None;
    recorded.metadata.creation_timestamp = None;
    recorded.metadata.deletion_timestamp = None;
    recorded.status = None;
    let policy = recorded
        .spec
        .as_ref()
        .unwrap()
        .persistent_volume_reclaim_policy
        .clone();
    recorded
        .spec
        .as_mut()
        .unwrap()
        .persistent_volume_reclaim_policy = Some("Retain".into());
    volumes
        .create(&PostParams::default(), &recorded)
        .await
        .unwrap();
    // 4. the policy restored
    let restore = json!({"spec": {"persistentVolumeReclaimPolicy": policy}});
    volumes
        .patch(
            &v.pv,
            &Default::default(),
            &kube::api::Patch::Merge(&restore),
        )
        .await
        .unwrap();

    h.wait_bound(&v.claim).await;
    let back = volumes.get(&v.pv).await.unwrap();
    assert_eq!(
        serde_json::to_value(&back.spec).unwrap(),
        serde_json::to_value(&original.spec).unwrap(),
        "the PV is ceph-csi's again, as it was"
    );
    assert_eq!(back.metadata.annotations, original.metadata.annotations);
    assert_eq!(
        journal(&h, &v),
        journal_before,
        "ceph-csi's journal never changed"
    );
    assert!(h.images().contains(&v.image));
}

/// Our provisioner deletes the migrated `v` with its claim.
async fn delete_through_ours(h: &Harness, config: &std::path::Path, v: &CephCsiVolume) {
    let _provisioner = h.spawn(
        &[
            "--leader-elect=false",
            &format!("--cluster-config={}", config.display()),
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ],
        &[],
    );
    h.claims()
        .delete(&v.claim, &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&v.pv).await;
}

/// `-o json` report's VolumeSnapshotContent rows, by content name.
fn content_report(out: &Output) -> BTreeMap<String, Value> {
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)));
    v["snapshotContents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["content"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

/// `-o json` report's translated class `name`.
fn translated_class(out: &Output, name: &str) -> Value {
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no class {name}: {}", text(out)))
        .clone()
}

const SNAPSHOT_CLASS: &str = "csi-rbdplugin-snapclass";

/// ceph-csi's VolumeSnapshotClass.
async fn ceph_csi_snapshot_class(h: &Harness) {
    let parameters = json!({
        "clusterID": CLUSTER_ID,
        "csi.storage.k8s.io/snapshotter-secret-name": SECRET,
        "csi.storage.k8s.io/snapshotter-secret-namespace": "default",
    });
    snapshots::create_snapshot_class(h, SNAPSHOT_CLASS, CEPH_CSI, parameters).await;
}

/// A snapshot `name` of `v`'s claim as ceph-csi's driver and csi-snapshotter make it; returns
/// its content's name and the snapshot image.
async fn ceph_csi_snapshot(h: &Harness, v: &CephCsiVolume, name: &str) -> (String, String) {
    let vs = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"volumeSnapshotClassName": SNAPSHOT_CLASS,
                 "source": {"persistentVolumeClaimName": v.claim}},
    });
    let vs = snapshots::snapshots(h)
        .create(&PostParams::default(), &serde_json::from_value(vs).unwrap())
        .await
        .unwrap();
    let vs_uid = vs.metadata.uid.clone().unwrap();
    let content = format!("snapcontent-{vs_uid}");
    let contents = snapshots::contents(h);
    h.until("the snapshot-controller's content", snapshots::WAIT, || {
        let contents = contents.clone();
        let content = content.clone();
        async move { contents.get_opt(&content).await.ok().flatten() }
    })
    .await;
    // ceph-csi's CreateSnapshot (internal/rbd/controllerserver.go doSnapshotClone)
    let uuid = uuid();
    let snap = format!("csi-snap-{uuid}");
    let source = format!("{}/{}", h.ceph.pool, v.image);
    h.ceph
        .rbd(&["snap", "create", &format!("{source}@{snap}")])
        .unwrap();
    h.ceph
        .rbd(&[
            "clone",
            "--rbd-default-clone-format",
            "2",
            "--image-feature",
            "layering",
            "--image-feature",
            "deep-flatten",
            &format!("{source}@{snap}"),
            &format!("{}/{snap}", h.ceph.pool),
        ])
        .unwrap();
    h.ceph
        .rbd(&["snap", "rm", &format!("{source}@{snap}")])
        .unwrap();
    h.ceph
        .rbd(&["snap", "create", &format!("{}/{snap}@{snap}", h.ceph.pool)])
        .unwrap();
    let request = format!("snapshot-{vs_uid}");
    setomapval(
        h,
        "",
        "csi.snaps.default",
        &format!("csi.snap.{request}"),
        &uuid,
    );
    let object = format!("csi.snap.{uuid}");
    setomapval(h, "", &object, "csi.imagename", &snap);
    setomapval(h, "", &object, "csi.snapname", &request);
    setomapval(h, "", &object, "csi.source", &v.image);
    setomapval(h, "", &object, "csi.imageid", &image_id(h, "", &snap));
    // its csi-snapshotter's status
    let status = json!({"status": {
        "snapshotHandle": ceph_csi_handle(CLUSTER_ID, pool_id(h), &uuid),
        "readyToUse": true,
        "creationTime": 1_733_400_000_000_000_000_i64,
        "restoreSize": 64 << 20,
    }});
    contents
        .patch_status(
            &content,
            &Default::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    snapshots::wait_ready(h, name).await;
    (content, snap)
}

/// The StorageClass `migrate` printed for ceph-csi's, applied as docs/migration.md says
/// (deleted and created again).
async fn apply_translated_class(h: &Harness, translated: &Value) {
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(h.client.clone());
    let name = translated["metadata"]["name"].as_str().unwrap();
    classes
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(translated.clone()).unwrap(),
        )
        .await
        .unwrap();
}

/// `v`'s claim asks for 128 MiB; our provisioner grows the image.
async fn grow_to_128_mib(h: &Harness, v: &CephCsiVolume) {
    let grow = json!({"spec": {"resources": {"requests": {"storage": "128Mi"}}}});
    h.claims()
        .patch(
            &v.claim,
            &Default::default(),
            &kube::api::Patch::Merge(&grow),
        )
        .await
        .unwrap();
    h.until("the migrated image grown", snapshots::WAIT, || async {
        (h.image_size(&v.image) == 128 << 20).then_some(())
    })
    .await;
}

fn file_data(seed: u32) -> Vec<u8> {
    (0..1u32 << 20)
        .map(|i| u8::try_from((i + seed) % 251).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ceph_csi_snapshots_are_taken_over_and_our_driver_serves_them() {
    let h = snapshots::harness().await;
    let config = setup(&h).await;
    ceph_csi_snapshot_class(&h).await;
    let v = ceph_csi_volume(&h, "db", true, |_| {}).await;
    let plugin = node::NodePlugin::start_args(
        &h.dir.path().join("node"),
        "node-1",
        &[&format!("--cluster-config={}", config.display())],
        None,
    );
    let (then, now) = (file_data(0), file_data(7));
    let write = |data: Vec<u8>| {
        move |target: &std::path::Path| std::fs::write(target.join("data.bin"), &data).unwrap()
    };
    plugin
        .with_mounted(&h.client, &before_pv(&h, &v.image), write(then.clone()))
        .await;
    let (content, snap) = ceph_csi_snapshot(&h, &v, "before").await;
    plugin
        .with_mounted(&h.client, &before_pv(&h, &v.image), write(now.clone()))
        .await;
    let snap_journal = || {
        h.ceph
            .rados(&[
                "-p",
                &h.ceph.pool,
                "listomapvals",
                &format!("csi.snap.{}", &snap[9..]),
            ])
            .unwrap()
    };
    let journal_before = snap_journal();
    let contents = snapshots::contents(&h);
    let content_before = contents.get(&content).await.unwrap();

    // dry run: what would change, and the classes translated; nothing changed
    let out = migrate(&h, &config, &["--all", "--dry-run"]);
    assert!(out.status.success(), "{}", text(&out));
    let row = &content_report(&out)[&content];
    assert_eq!(row["result"], "would-migrate", "{row}");
    let ours = format!("s2/{CLUSTER_ID}/{}/{snap}", h.ceph.pool);
    assert_eq!(row["change"]["status"]["snapshotHandle"], ours.as_str());
    assert_eq!(row["snapshot"], "default/before");
    let class = translated_class(&out, CLASS);
    assert_eq!(class["translated"]["provisioner"], "ceph.com/rbd");
    assert_eq!(class["problem"], Value::Null, "{class}");
    let snapshot_class = translated_class(&out, SNAPSHOT_CLASS);
    assert_eq!(snapshot_class["translated"]["driver"], OURS);
    assert_eq!(
        contents
            .get(&content)
            .await
            .unwrap()
            .metadata
            .resource_version,
        content_before.metadata.resource_version
    );

    // the migration: the PV and the content
    let out = migrate(&h, &config, &["--all"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(report(&out)[&v.pv]["result"], "migrated", "{}", text(&out));
    assert_eq!(
        content_report(&out)[&content]["result"],
        "migrated",
        "{}",
        text(&out)
    );
    let c = contents.get(&content).await.unwrap();
    assert_eq!(c.data["spec"]["driver"], OURS);
    assert_eq!(c.data["status"]["snapshotHandle"], ours.as_str());
    assert_eq!(
        c.data["spec"]["source"], content_before.data["spec"]["source"],
        "the source stays as it was"
    );
    assert_eq!(
        c.metadata.annotations.as_ref().unwrap()["provisioner.ceph.com/ceph-csi-snapshot-handle"],
        content_before.data["status"]["snapshotHandle"]
            .as_str()
            .unwrap()
    );
    let vs = snapshots::snapshots(&h).get("before").await.unwrap();
    assert_eq!(vs.data["status"]["readyToUse"], true, "{:?}", vs.data);
    assert_eq!(
        vs.data["status"]["boundVolumeSnapshotContentName"],
        content.as_str()
    );
    assert!(vs.data["status"].get("error").is_none(), "{:?}", vs.data);
    assert_eq!(
        snap_journal(),
        journal_before,
        "ceph-csi's journal is left as it was"
    );
    // a second run changes nothing: --all no longer selects it; named, it is already ours
    let out = migrate(&h, &config, &["--all"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !content_report(&out).contains_key(&content),
        "{}",
        text(&out)
    );
    let out = migrate(&h, &config, &["--snapshot-content", &content]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(content_report(&out)[&content]["result"], "already-migrated");
    assert_eq!(
        contents
            .get(&content)
            .await
            .unwrap()
            .metadata
            .resource_version,
        c.metadata.resource_version
    );

    // the user applies the printed class; our provisioner serves the rest
    apply_translated_class(&h, &class["translated"]).await;
    let _provisioner = h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            &format!("--cluster-config={}", config.display()),
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ],
        &[],
    );
    // restore of ceph-csi's snapshot: the bytes as of the snapshot
    snapshots::create_claim_from(&h, "restored", "64Mi", "VolumeSnapshot", "before").await;
    let (_, restored) = h.wait_bound("restored").await;
    let read = |pv: PersistentVolume| {
        let plugin = &plugin;
        let client = h.client.clone();
        async move {
            plugin
                .with_mounted(&client, &pv, |t| std::fs::read(t.join("data.bin")).unwrap())
                .await
        }
    };
    assert!(
        read(restored).await == then,
        "the restore holds the snapshot's bytes"
    );
    // expansion of the migrated volume
    grow_to_128_mib(&h, &v).await;
    // a snapshot and a clone of the migrated volume by our driver
    snapshots::create_snapshot(&h, "after", &v.claim).await;
    snapshots::wait_ready(&h, "after").await;
    snapshots::create_claim_from(&h, "copy", "128Mi", "PersistentVolumeClaim", &v.claim).await;
    let (_, copy) = h.wait_bound("copy").await;
    assert!(
        read(copy).await == now,
        "the clone holds the volume's bytes"
    );
    let (_, migrated) = h.wait_bound(&v.claim).await;
    assert!(read(migrated).await == now);

    // deletes: the source while snapshots hang off it, then ceph-csi's snapshot, then the rest
    snapshots::delete_claim(&h, &v.claim).await;
    assert!(!h.images().contains(&v.image), "{:?}", h.images());
    let vs_api = snapshots::snapshots(&h);
    vs_api
        .delete("before", &DeleteParams::default())
        .await
        .unwrap();
    snapshots::wait_gone(&h, &contents, &content).await;
    assert!(!h.images().contains(&snap), "{:?}", h.images());
    snapshots::delete_claim(&h, "restored").await;
    snapshots::delete_claim(&h, "copy").await;
    vs_api
        .delete("after", &DeleteParams::default())
        .await
        .unwrap();
    snapshots::wait_gone(&h, &vs_api, "after").await;
    let trash = snapshots::trash(&h);
    assert!(
        !trash.contains(&snap),
        "ceph-csi's snapshot image is purged: {trash}"
    );
    drop(plugin);
}

/// A volume in a RADOS namespace (the cluster config's `rbd.radosNamespace` of its cluster ID)
/// keeps it: the new handle names it, our node plugin stages it, our provisioner deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_ceph_csi_volume_keeps_its_namespace() {
    let h = Harness::start().await;
    let config = setup(&h).await;
    let ns = format!("tenant-{}", &uuid()[..8]);
    h.ceph
        .rbd(&["namespace", "create", &format!("{}/{ns}", h.ceph.pool)])
        .unwrap();
    let cluster = "rook-ceph-tenant";
    let monitors: Vec<&str> = h.ceph.monitors.split(',').collect();
    std::fs::write(
        &config,
        json!([{"clusterID": CLUSTER_ID, "monitors": monitors},
               {"clusterID": cluster, "monitors": monitors, "rbd": {"radosNamespace": ns}}])
        .to_string(),
    )
    .unwrap();
    let v = ceph_csi_volume_in(&h, "tenant-data", (cluster, &ns, CLASS), true, |_| {}).await;
    let plugin = node::NodePlugin::start_args(
        &h.dir.path().join("node"),
        "node-1",
        &[&format!("--cluster-config={}", config.display())],
        None,
    );
    let data = file_data(3);
    let mut before = before_pv(&h, &v.image);
    let csi = before.spec.as_mut().unwrap().csi.as_mut().unwrap();
    csi.volume_handle = format!("v1/{}/{}/{ns}/{}", h.ceph.monitors, h.ceph.pool, v.image);
    csi.volume_attributes
        .as_mut()
        .unwrap()
        .insert("radosNamespace".into(), ns.clone());
    plugin
        .with_mounted(&h.client, &before, |t| {
            std::fs::write(t.join("data.bin"), &data).unwrap()
        })
        .await;

    let out = migrate(&h, &config, &["--pv", &v.pv]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(report(&out)[&v.pv]["result"], "migrated", "{}", text(&out));
    let pv = h.volumes().get(&v.pv).await.unwrap();
    assert_eq!(
        node::volume_handle(&pv),
        format!("v2/{cluster}/{}/{ns}/{}", h.ceph.pool, v.image)
    );
    let read = plugin
        .with_mounted(&h.client, &pv, |t| {
            std::fs::read(t.join("data.bin")).unwrap()
        })
        .await;
    assert!(read == data, "the file reads back unchanged");
    drop(plugin);
    delete_through_ours(&h, &config, &v).await;
    let left = h
        .ceph
        .rbd(&["ls", &format!("{}/{ns}", h.ceph.pool)])
        .unwrap();
    assert!(
        !left.contains(&v.image),
        "the image goes with its claim: {left}"
    );
    // ceph-csi's journal objects are its own; gone, the namespace can go
    for object in [
        "csi.volumes.default".to_owned(),
        format!("csi.volume.{}", v.uuid),
    ] {
        h.ceph
            .rados(&["-p", &h.ceph.pool, "-N", &ns, "rm", &object])
            .unwrap();
    }
    h.ceph
        .rbd(&["namespace", "remove", &format!("{}/{ns}", h.ceph.pool)])
        .unwrap();
}

const KEK_SECRET: &str = "ceph-csi-kek";
/// ceph-csi's encrypted StorageClass.
const SEALED_CLASS: &str = "csi-rbd-sc-sealed";
const KEK: &str = "a-kek-ceph-csi-and-we-share";

/// `python3 -c <script> <args>`: its printed line when it succeeded.
fn python(script: &str, args: &[&str]) -> Option<String> {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8(out.stdout).unwrap().trim().to_owned())
}

/// ceph-csi's `secretsMetadataKMS.EncryptDEK` (internal/kms/secretskms.go), in Python: the KEK
/// `scrypt.Key(passphrase, volumeID, 32768, 8, 1, 32)`, AES-256-GCM under a random 12-byte
/// nonce, stored as Go marshals `{DEK, Nonce []byte}`: `{"dek":...,"nonce":...}`.
fn ceph_csi_wrap(dek: &str, volume_id: &str) -> String {
    python(
        "import sys, os, json, base64, hashlib
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
dek, kek, salt = sys.argv[1:4]
key = hashlib.scrypt(kek.encode(), salt=salt.encode(), n=32768, r=8, p=1, maxmem=64 << 20, dklen=32)
nonce = os.urandom(12)
sealed = AESGCM(key).encrypt(nonce, dek.encode(), None)
print(json.dumps({'dek': base64.b64encode(sealed).decode(), 'nonce': base64.b64encode(nonce).decode()}, separators=(',', ':')))
",
        &[dek, KEK, volume_id],
    )
    .expect("python3 with cryptography wraps the key")
}

/// ceph-csi's `secretsMetadataKMS.DecryptDEK`, in Python: `json.Unmarshal` into `{DEK, Nonce}`
/// (other fields ignored), the KEK from `volume_id`; `None` when it does not open.
fn ceph_csi_unwrap(stored: &str, volume_id: &str) -> Option<String> {
    python(
        "import sys, json, base64, hashlib
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
stored, kek, salt = sys.argv[1:4]
v = json.loads(stored)
key = hashlib.scrypt(kek.encode(), salt=salt.encode(), n=32768, r=8, p=1, maxmem=64 << 20, dklen=32)
print(AESGCM(key).decrypt(base64.b64decode(v['nonce']), base64.b64decode(v['dek']), None).decode())
",
        &[stored, KEK, volume_id],
    )
}

/// ceph-csi's `generateNewEncryptionPassphrase(20)`: 20 random bytes, URL-safe base64.
fn ceph_csi_passphrase() -> String {
    python(
        "import os, base64; print(base64.urlsafe_b64encode(os.urandom(20)).decode())",
        &[],
    )
    .expect("python3 makes a passphrase")
}

/// The LUKS2 header ceph-csi's node plugin writes on first use (`cryptsetup -q luksFormat
/// --type luks2 --hash sha256 <device> -d /dev/stdin`; a small Argon2 memory here, for the
/// tests' time), on a 64 MiB file.
fn luks_file(dir: &std::path::Path, passphrase: &str) -> std::path::PathBuf {
    let file = dir.join(format!("luks-{}.img", &uuid()[..8]));
    std::fs::File::create(&file)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    assert!(cryptsetup(
        &[
            "-q",
            "luksFormat",
            "--type",
            "luks2",
            "--hash",
            "sha256",
            "--pbkdf-memory",
            "32768"
        ],
        &file,
        passphrase
    ));
    file
}

/// `cryptsetup <args> <file> -d -` with `passphrase` on its stdin, as ceph-csi's node plugin
/// and ours hand it over; whether it succeeded.
fn cryptsetup(args: &[&str], file: &std::path::Path, passphrase: &str) -> bool {
    use std::io::Write;
    let mut child = Command::new("cryptsetup")
        .args(args)
        .arg(file)
        .args(["-d", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(passphrase.as_bytes())
        .unwrap();
    child.wait().unwrap().success()
}

/// Whether `passphrase` opens the LUKS header of image `image` (`rbd export`, then cryptsetup's
/// `--test-passphrase`, which reads the header as `luksOpen` does).
fn luks_opens(h: &Harness, image: &str, passphrase: &str) -> bool {
    let file = h.dir.path().join(format!("export-{image}"));
    let _ = std::fs::remove_file(&file);
    h.ceph
        .rbd(&[
            "export",
            &format!("{}/{image}", h.ceph.pool),
            file.to_str().unwrap(),
        ])
        .unwrap();
    let opened = cryptsetup(&["luksOpen", "--test-passphrase"], &file, passphrase);
    std::fs::remove_file(&file).unwrap();
    opened
}

/// The key our node plugin would unlock image `image` with: the KMS entry `kms_id` of
/// `kms_config` read by volume (or snapshot) ID `id`, as the node reads it at stage.
async fn our_key(
    h: &Harness,
    kms_config: &std::path::Path,
    kms_id: &str,
    image: &str,
    id: &str,
    tenant: Option<&str>,
) -> Option<String> {
    use rbd_volume::encryption;
    let store: std::sync::Arc<dyn encryption::secrets::SecretStore> =
        std::sync::Arc::new(rbd_csi::kube_secrets::KubeSecrets::new(h.client.clone()));
    let kms = encryption::load_kms(kms_config, Some(store), kms_id)
        .await
        .unwrap();
    let cluster = h.ceph_cluster().await;
    let target = encryption::Target {
        cluster: &cluster,
        pool: &h.ceph.pool,
        image,
        volume_id: id,
        tenant,
    };
    kms.fetch_dek(&target)
        .await
        .unwrap()
        .map(|d| d.expose().to_owned())
}

/// ceph-csi's encrypted volume for claim `claim` with KMS entry `kms_id` (`None`: its default
/// KMS): the PV's attributes, the journal's `csi.volume.encryptKMS`/`encryptionType`, the
/// image's LUKS2 header and its metadata `rbd.csi.ceph.com/encrypted` and the wrapped
/// `rbd.csi.ceph.com/dek`. Returns the volume and its LUKS passphrase.
async fn ceph_csi_encrypted_volume(
    h: &Harness,
    claim: &str,
    kms_id: Option<&str>,
) -> (CephCsiVolume, String) {
    let v = ceph_csi_volume_in(h, claim, (CLUSTER_ID, "", SEALED_CLASS), true, |pv| {
        let attributes = &mut pv["spec"]["csi"]["volumeAttributes"];
        attributes["encrypted"] = json!("true");
        if let Some(id) = kms_id {
            attributes["encryptionKMSID"] = json!(id);
        }
    })
    .await;
    let object = format!("csi.volume.{}", v.uuid);
    setomapval(
        h,
        "",
        &object,
        "csi.volume.encryptKMS",
        kms_id.unwrap_or("default"),
    );
    setomapval(h, "", &object, "csi.volume.encryptionType", "block");
    let passphrase = ceph_csi_passphrase();
    // the LUKS2 header, as ceph-csi's node plugin wrote it on the volume's first stage
    let header = luks_file(h.dir.path(), &passphrase);
    let image = spec(h, "", &v.image);
    h.ceph.rbd(&["rm", &image]).unwrap();
    h.ceph
        .rbd(&[
            "import",
            "--image-feature",
            "layering",
            header.to_str().unwrap(),
            &image,
        ])
        .unwrap();
    std::fs::remove_file(&header).unwrap();
    setomapval(h, "", &object, "csi.imageid", &image_id(h, "", &v.image));
    h.ceph
        .rbd(&[
            "image-meta",
            "set",
            &image,
            "rbd.csi.ceph.com/encrypted",
            "encrypted",
        ])
        .unwrap();
    if kms_id.is_some() {
        let wrapped = ceph_csi_wrap(&passphrase, &v.handle);
        h.ceph
            .rbd(&[
                "image-meta",
                "set",
                &image,
                "rbd.csi.ceph.com/dek",
                &wrapped,
            ])
            .unwrap();
    }
    (v, passphrase)
}

/// ceph-csi's encrypted volumes (its `metadata` KMS with a `secretName`) are taken over with
/// their snapshots: the key, which ceph-csi wrapped with its own volume (snapshot) ID as the
/// salt, then opens by our IDs, as our node reads it, and opens the LUKS header; ceph-csi's
/// fields of the key are kept (the way back); our driver restores the snapshot encrypted and
/// deletes all. What cannot work is refused and left as it was: ceph-csi's default KMS, its
/// `metadata` KMS without `secretName`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_ceph_csi_volumes_and_snapshots_are_taken_over_with_their_keys() {
    let h = snapshots::harness().await;
    let config = setup(&h).await;
    ceph_csi_snapshot_class(&h).await;
    h.create_secret("default", KEK_SECRET, &[("encryptionPassphrase", KEK)])
        .await;
    let kms_config = h.dir.path().join("kms-config.json");
    std::fs::write(
        &kms_config,
        json!({
            "sealed": {"encryptionKMSType": "metadata", "secretName": KEK_SECRET},
            "plain": {"encryptionKMSType": "metadata"},
        })
        .to_string(),
    )
    .unwrap();
    let kms_arg = format!("--kms-config={}", kms_config.display());
    // ceph-csi's encrypted class: its own, with encrypted and encryptionKMSID
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(h.client.clone());
    let mut sealed = classes.get(CLASS).await.unwrap();
    sealed.metadata = kube::api::ObjectMeta {
        name: Some(SEALED_CLASS.into()),
        ..Default::default()
    };
    let parameters = sealed.parameters.get_or_insert_with(Default::default);
    parameters.insert("encrypted".into(), "true".into());
    parameters.insert("encryptionKMSID".into(), "sealed".into());
    classes
        .create(&PostParams::default(), &sealed)
        .await
        .unwrap();
    let (v, passphrase) = ceph_csi_encrypted_volume(&h, "sealed", Some("sealed")).await;
    let (content, snap) = ceph_csi_snapshot(&h, &v, "sealed-snap").await;
    // ceph-csi's CreateSnapshot of an encrypted volume: the journal names the KMS, the key is
    // wrapped again for the snapshot's ID (copyEncryptionConfig)
    let snap_handle = ceph_csi_handle(CLUSTER_ID, pool_id(&h), &snap[9..]);
    setomapval(
        &h,
        "",
        &format!("csi.snap.{}", &snap[9..]),
        "csi.volume.encryptKMS",
        "sealed",
    );
    h.ceph
        .rbd(&[
            "image-meta",
            "set",
            &spec(&h, "", &snap),
            "rbd.csi.ceph.com/dek",
            &ceph_csi_wrap(&passphrase, &snap_handle),
        ])
        .unwrap();
    let (default_kms, _) = ceph_csi_encrypted_volume(&h, "one-passphrase", None).await;
    let (plain, _) = ceph_csi_encrypted_volume(&h, "storage-class-kek", Some("plain")).await;
    let dek_before = h.image_meta(&v.image, "rbd.csi.ceph.com/dek").unwrap();
    let journal_before = journal(&h, &v);

    let out = migrate(&h, &config, &["--all", &kms_arg]);
    let rows = report(&out);
    assert_eq!(rows[&v.pv]["result"], "migrated", "{}", text(&out));
    assert_eq!(
        content_report(&out)[&content]["result"],
        "migrated",
        "{}",
        text(&out)
    );
    let why = rows[&default_kms.pv]["detail"].as_str().unwrap();
    assert!(why.contains("ceph-csi's default KMS"), "{why}");
    let why = rows[&plain.pv]["detail"].as_str().unwrap();
    assert!(
        why.contains("\"plain\"") && why.contains("secretName"),
        "{why}"
    );
    for refused in [&default_kms, &plain] {
        assert_eq!(rows[&refused.pv]["result"], "refused");
        let pv = h.volumes().get(&refused.pv).await.unwrap();
        assert_eq!(pv.spec.unwrap().csi.unwrap().driver, CEPH_CSI);
        assert_eq!(
            h.image_meta(&refused.image, "provisioner.ceph.com/encryption-kms-id"),
            None
        );
    }

    // the volume: its attributes name the KMS and the tenant; the key records ceph-csi's ID as
    // its salt, ceph-csi's fields as they were; our node's read opens the header
    let pv = h.volumes().get(&v.pv).await.unwrap();
    let csi = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
    let attributes = csi.volume_attributes.as_ref().unwrap();
    assert_eq!(attributes["encryptionKMSID"], "sealed");
    assert_eq!(attributes["csi.storage.k8s.io/pvc/namespace"], "default");
    let dek: Value =
        serde_json::from_str(&h.image_meta(&v.image, "rbd.csi.ceph.com/dek").unwrap()).unwrap();
    let before: Value = serde_json::from_str(&dek_before).unwrap();
    assert_eq!(dek["salt"], v.handle.as_str());
    assert_eq!(
        (&dek["dek"], &dek["nonce"]),
        (&before["dek"], &before["nonce"])
    );
    assert_eq!(
        journal(&h, &v),
        journal_before,
        "ceph-csi's journal is left as it was"
    );
    // the way back: ceph-csi's read of the value is unchanged
    let salted = h.image_meta(&v.image, "rbd.csi.ceph.com/dek").unwrap();
    assert_eq!(
        ceph_csi_unwrap(&salted, &v.handle).as_deref(),
        Some(passphrase.as_str())
    );
    let key = our_key(
        &h,
        &kms_config,
        "sealed",
        &v.image,
        &csi.volume_handle,
        Some("default"),
    )
    .await;
    assert_eq!(key.as_deref(), Some(passphrase.as_str()));
    assert!(luks_opens(&h, &v.image, &passphrase));
    // the snapshot: the same, by our snapshot ID
    let ours = format!("s2/{CLUSTER_ID}/{}/{snap}", h.ceph.pool);
    let key = our_key(&h, &kms_config, "sealed", &snap, &ours, Some("default")).await;
    assert_eq!(key.as_deref(), Some(passphrase.as_str()));
    // a second run changes nothing
    let again = migrate(&h, &config, &["--pv", &v.pv, &kms_arg]);
    assert_eq!(
        report(&again)[&v.pv]["result"],
        "already-migrated",
        "{}",
        text(&again)
    );
    let again = migrate(&h, &config, &["--snapshot-content", &content, &kms_arg]);
    assert_eq!(
        content_report(&again)[&content]["result"],
        "already-migrated"
    );

    // the user applies the printed form of ceph-csi's encrypted class; our provisioner serves
    // the rest: a restore of ceph-csi's snapshot, a clone and a snapshot of the taken-over
    // volume, each opened by the same key under its own ID; expansion; deletes
    let sealed_class = translated_class(&out, SEALED_CLASS);
    assert_eq!(sealed_class["problem"], Value::Null, "{sealed_class}");
    let translated = &sealed_class["translated"];
    assert_eq!(translated["parameters"]["encrypted"], "true");
    assert_eq!(translated["parameters"]["encryptionKMSID"], "sealed");
    apply_translated_class(&h, translated).await;
    let _provisioner = h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            &format!("--cluster-config={}", config.display()),
            &kms_arg,
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ],
        &[],
    );
    let passphrase = passphrase.as_str();
    let opened = |image: String, id: String| {
        let (h, kms_config) = (&h, &kms_config);
        async move {
            let key = our_key(h, kms_config, "sealed", &image, &id, Some("default")).await;
            assert_eq!(
                key.as_deref(),
                Some(passphrase),
                "the key of {image} by {id}"
            );
            luks_opens(h, &image, passphrase)
        }
    };
    snapshots::create_claim_of_class_from(
        &h,
        "restored",
        SEALED_CLASS,
        "64Mi",
        "VolumeSnapshot",
        "sealed-snap",
    )
    .await;
    snapshots::create_claim_of_class_from(
        &h,
        "copy",
        SEALED_CLASS,
        "64Mi",
        "PersistentVolumeClaim",
        &v.claim,
    )
    .await;
    let mut made = Vec::new();
    for claim in ["restored", "copy"] {
        let (_, pv) = h.wait_bound(claim).await;
        let image = Harness::image_name(&pv);
        let id = node::volume_handle(&pv);
        assert!(opened(image.clone(), id).await, "{claim}: the header opens");
        made.push(image);
    }
    snapshots::create_snapshot(&h, "ours", &v.claim).await;
    let vs = snapshots::wait_ready(&h, "ours").await;
    let ours_content = vs.data["status"]["boundVolumeSnapshotContentName"]
        .as_str()
        .unwrap()
        .to_owned();
    let handle = snapshots::contents(&h)
        .get(&ours_content)
        .await
        .unwrap()
        .data["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_owned();
    let ours_image = handle.rsplit('/').next().unwrap().to_owned();
    let key = our_key(
        &h,
        &kms_config,
        "sealed",
        &ours_image,
        &handle,
        Some("default"),
    )
    .await;
    assert_eq!(key.as_deref(), Some(passphrase));
    made.push(ours_image);
    grow_to_128_mib(&h, &v).await;

    let vs_api = snapshots::snapshots(&h);
    for (snapshot, content) in [("sealed-snap", &content), ("ours", &ours_content)] {
        vs_api
            .delete(snapshot, &DeleteParams::default())
            .await
            .unwrap();
        snapshots::wait_gone(&h, &snapshots::contents(&h), content).await;
    }
    for claim in ["restored", "copy", v.claim.as_str()] {
        snapshots::delete_claim(&h, claim).await;
    }
    let images = h.images();
    for gone in made.iter().chain([&v.image, &snap]) {
        assert!(!images.contains(gone), "{gone}: {images:?}");
    }
}
