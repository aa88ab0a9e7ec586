//! `rbd-provisioner migrate` end to end on the emulator and micro-ceph: PVs exactly as the old
//! `ceph.com/rbd` provisioner wrote them (in-tree `spec.rbd`, random image name, `secretRef`
//! without a namespace, `rbdProvisionerIdentity`), bound to their claims, replaced in place by
//! CSI PVs of our driver.
//!
//! The first test is the bar on image deletion: after every step a run can be killed at, and
//! after every run, the pool holds exactly the images it held before.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use kube::api::PostParams;
use rbd_csi::proto::csi::node_client::NodeClient;
use rbd_csi::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use rbd_csi::proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use serde_json::{Value, json};
use support::{ADMIN_SECRET, ADMIN_SECRET_NS, Harness};
use tonic::transport::{Channel, Endpoint, Uri};

const DRIVER: &str = "rbd.provisioner.ceph.io";
const CLASS: &str = "rbd-legacy";
const USER_SECRET: &str = "ceph-user";

/// Crash points of a replacement, in order (apply.rs).
const STEPS: [&str; 8] = [
    "migrate-after-owner-record",
    "migrate-after-record",
    "migrate-after-retain",
    "migrate-after-delete",
    "migrate-after-finalizers",
    "migrate-after-create",
    "migrate-after-policy",
    "migrate-after-claim-update",
];

/// What the old provisioner left for one claim.
struct Legacy {
    claim: String,
    claim_uid: String,
    pv: String,
    image: String,
}

fn random_hex(n: usize) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
        .collect()
}

/// The class, the user secret (in the claims' namespace, as the old provisioner's users had it)
/// and the CSIDriver object (unless `driver` is false).
async fn setup(h: &Harness, driver: bool) {
    h.create_class(CLASS, &h.params(), "Delete").await;
    h.create_secret("default", USER_SECRET, &[("key", &h.ceph.admin_key)])
        .await;
    if driver {
        create_driver(h).await;
    }
}

async fn create_driver(h: &Harness) {
    let api: Api<CSIDriver> = Api::all(h.client.clone());
    let d = serde_json::from_value(json!({"metadata": {"name": DRIVER}, "spec": {}})).unwrap();
    api.create(&PostParams::default(), &d).await.unwrap();
}

/// An image of `size_mib` and a PV for claim `claim` as the old provisioner wrote them; the
/// claim is bound to it by the emulated PV controller. `tweak` edits the PV first.
async fn legacy_volume(
    h: &Harness,
    claim: &str,
    size_mib: u64,
    capacity: &str,
    tweak: impl FnOnce(&mut Value),
) -> Legacy {
    // the old provisioner: a random UUID after the prefix
    let image = format!(
        "kubernetes-dynamic-pvc-{}-{}-11e9-{}-{}",
        random_hex(8),
        random_hex(4),
        random_hex(4),
        random_hex(12)
    );
    if size_mib > 0 {
        h.ceph
            .rbd(&[
                "create",
                "--size",
                &format!("{size_mib}M"),
                "--image-feature",
                "layering",
                &format!("{}/{image}", h.ceph.pool),
            ])
            .unwrap();
    }
    let c = h.create_claim(claim, CLASS, capacity, false).await;
    let uid = c.metadata.uid.clone().unwrap();
    let pv_name = format!("pvc-{uid}");
    let mut pv = json!({
        "metadata": {
            "name": pv_name,
            "annotations": {
                "pv.kubernetes.io/provisioned-by": "ceph.com/rbd",
                "rbdProvisionerIdentity": "ceph.com/rbd",
            },
        },
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": CLASS,
            "volumeMode": "Filesystem",
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                         "namespace": "default", "name": claim, "uid": uid,
                         "resourceVersion": c.metadata.resource_version.clone().unwrap()},
            "rbd": {
                "monitors": h.ceph.monitors.split(',').collect::<Vec<_>>(),
                "image": image,
                "pool": h.ceph.pool,
                "user": "admin",
                "secretRef": {"name": USER_SECRET},
                "fsType": "ext4",
            },
        },
    });
    tweak(&mut pv);
    let pv: PersistentVolume = serde_json::from_value(pv).unwrap();
    h.volumes()
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    h.wait_bound(claim).await;
    Legacy {
        claim: claim.to_string(),
        claim_uid: uid,
        pv: pv_name,
        image,
    }
}

/// `rbd-provisioner migrate ARGS` with `env`; waits for it.
fn migrate(h: &Harness, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
        .arg("migrate")
        .arg("--kubeconfig")
        .arg(&h.kubeconfig)
        .args(["--wait", "20s"])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("RBD_PROVISIONER_CRASH_AT")
        .env_remove("PROVISIONER_NAME")
        .envs(env.iter().copied())
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

/// Which of `images` the pool holds (the cluster is shared by the tests of this binary, which
/// run in parallel: each test watches its own images).
fn present(h: &Harness, images: &BTreeSet<String>) -> BTreeSet<String> {
    h.images()
        .into_iter()
        .filter(|i| images.contains(i))
        .collect()
}

async fn claim(h: &Harness, name: &str) -> PersistentVolumeClaim {
    h.claims().get(name).await.unwrap()
}

/// What must hold after any step: the claim is the same object and still names its PV, and
/// no second PV claims it.
async fn assert_claim_keeps_its_volume(h: &Harness, l: &Legacy, when: &str) {
    let c = claim(h, &l.claim).await;
    assert_eq!(c.metadata.uid.as_deref(), Some(&*l.claim_uid), "{when}");
    assert_eq!(
        c.spec.unwrap().volume_name.as_deref(),
        Some(&*l.pv),
        "{when}: the claim names another volume"
    );
    let claiming: Vec<String> = h
        .volumes()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.as_deref())
                == Some(&*l.claim_uid)
        })
        .filter_map(|pv| pv.metadata.name)
        .collect();
    assert!(
        claiming.is_empty() || claiming == [l.pv.clone()],
        "{when}: PVs claiming the claim: {claiming:?}"
    );
}

/// The end state of a migrated volume.
async fn assert_migrated(h: &Harness, l: &Legacy) -> PersistentVolume {
    let (c, pv) = h.wait_bound(&l.claim).await;
    assert_eq!(c.metadata.uid.as_deref(), Some(&*l.claim_uid));
    assert_eq!(pv.metadata.name.as_deref(), Some(&*l.pv));
    let spec = pv.spec.clone().unwrap();
    assert!(spec.rbd.is_none());
    let csi = spec.csi.clone().unwrap();
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(
        csi.volume_handle,
        format!("v1/{}/{}/{}", h.ceph.monitors, h.ceph.pool, l.image)
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some(&*l.claim_uid));
    let ann = pv.metadata.annotations.clone().unwrap();
    assert_eq!(ann["pv.kubernetes.io/provisioned-by"], "ceph.com/rbd");
    assert_eq!(ann["rbdProvisionerIdentity"], "ceph.com/rbd");
    assert_eq!(ann["provisioner.ceph.com/migrated-from"], "rbd");
    assert_eq!(
        h.image_meta(&l.image, "provisioner.ceph.com/pv").as_deref(),
        Some(&*l.pv)
    );
    assert_eq!(
        h.image_meta(&l.image, "provisioner.ceph.com/claim"),
        Some(format!("default/{}", l.claim))
    );
    let records: Api<ConfigMap> = Api::namespaced(h.client.clone(), ADMIN_SECRET_NS);
    let record = records.get(&format!("rbd-migrate-{}", l.pv)).await.unwrap();
    let data = record.data.unwrap();
    // the record holds the original PV: secret references, never a key
    assert!(data.values().all(|v| !v.contains(&h.ceph.admin_key)));
    let original: PersistentVolume = serde_json::from_str(&data["pv"]).unwrap();
    assert!(original.spec.unwrap().rbd.is_some());
    assert_eq!(data["state"], "done");
    assert_eq!(data["reclaimPolicy"], "Delete");
    pv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_step_of_a_migration_deletes_an_image_and_every_crash_converges() {
    let h = Harness::start().await;
    setup(&h, true).await;
    // one legacy volume per crash point, and one bystander that is never selected
    let mut volumes = Vec::new();
    for (i, _) in STEPS.iter().enumerate() {
        volumes.push(legacy_volume(&h, &format!("crash-{i}"), 16, "16Mi", |_| {}).await);
    }
    let bystander = legacy_volume(&h, "bystander", 16, "16Mi", |_| {}).await;
    // our provisioner runs meanwhile, with its PV finalizer: it must neither delete an image
    // nor hold the old PV object
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--add-finalizer",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ],
        &[],
    );
    let before: BTreeSet<String> = volumes
        .iter()
        .chain([&bystander])
        .map(|l| l.image.clone())
        .collect();
    assert_eq!(present(&h, &before), before);

    for (step, l) in STEPS.iter().zip(&volumes) {
        let out = migrate(&h, &["--pv", &l.pv], &[("RBD_PROVISIONER_CRASH_AT", step)]);
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains(step),
            "{step}: the run was not aborted there: {}",
            text(&out)
        );
        assert_eq!(present(&h, &before), before, "an image changed at {step}");
        assert_claim_keeps_its_volume(&h, l, step).await;

        let out = migrate(&h, &["--pv", &l.pv, "-o", "json"], &[]);
        assert!(
            out.status.success(),
            "{step}: the rerun failed: {}",
            text(&out)
        );
        assert_eq!(report(&out)[&l.pv]["result"], "migrated", "{}", text(&out));
        assert_eq!(
            present(&h, &before),
            before,
            "an image changed after the rerun of {step}"
        );
        assert_claim_keeps_its_volume(&h, l, step).await;
        assert_migrated(&h, l).await;

        // and once more: nothing to do
        let out = migrate(&h, &["--pv", &l.pv, "-o", "json"], &[]);
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(report(&out)[&l.pv]["result"], "already-migrated");
    }
    // the bystander was never touched
    let pv = h.volumes().get(&bystander.pv).await.unwrap();
    assert!(pv.spec.unwrap().rbd.is_some());
    assert_eq!(
        h.image_meta(&bystander.image, "provisioner.ceph.com/pv"),
        None
    );
    assert_eq!(present(&h, &before), before);
}

// --- the fuse data path (the node service of the same binary) ---------------------------------

/// The node plugin process; stopped on drop.
struct NodePlugin {
    child: Child,
    socket: PathBuf,
}

impl NodePlugin {
    fn start(dir: &Path) -> NodePlugin {
        let socket = dir.join("csi.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .args([
                "csi",
                "--services=node",
                "--default-mounter=fuse",
                "--node-id=node-1",
            ])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--runtime-dir={}", dir.join("run").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("node.log")).unwrap())
            .spawn()
            .unwrap();
        NodePlugin { child, socket }
    }

    async fn client(&self) -> NodeClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::UnixStream::connect(&self.socket).await.is_err() {
            assert!(Instant::now() < deadline, "the node plugin never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let path = self.socket.clone();
        let channel = Endpoint::try_from("http://[::]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .unwrap();
        NodeClient::new(channel)
    }
}

impl Drop for NodePlugin {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*p))
}

/// Stages and publishes `handle` with `context` and `secrets` under `dir`, runs `f` on the
/// mounted directory, then unpublishes and unstages.
async fn with_mounted<T>(
    node: &mut NodeClient<Channel>,
    dir: &Path,
    handle: &str,
    context: HashMap<String, String>,
    secrets: HashMap<String, String>,
    f: impl FnOnce(&Path) -> T,
) -> T {
    let staging = dir.join("staging");
    let target = dir.join("pods/p1/volume");
    let cap = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: handle.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets,
        volume_context: context.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    node.node_publish_volume(NodePublishVolumeRequest {
        volume_id: handle.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        volume_context: context,
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(mounted(&target));
    let result = f(&target);
    node.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: handle.into(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    node.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: handle.into(),
        staging_target_path: staging.display().to_string(),
    })
    .await
    .unwrap();
    assert!(!mounted(&target) && !mounted(&staging));
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_pv_is_replaced_in_place_keeps_its_data_and_goes_with_its_claim() {
    let h = Harness::start().await;
    setup(&h, false).await;
    let l = legacy_volume(&h, "app-data", 64, "64Mi", |_| {}).await;
    let before = BTreeSet::from([l.image.clone()]);
    let key = HashMap::from([("key".to_string(), h.ceph.admin_key.clone())]);

    // a file written into the image through the fuse data path (what the in-tree plugin did:
    // ext4 made on the blank image, then the pod's data)
    let dir = tempfile::tempdir().unwrap();
    let plugin = NodePlugin::start(dir.path());
    let mut node = plugin.client().await;
    let legacy_ctx = HashMap::from([
        ("monitors".to_string(), h.ceph.monitors.clone()),
        ("pool".to_string(), h.ceph.pool.clone()),
        ("imageName".to_string(), l.image.clone()),
        ("userID".to_string(), "admin".to_string()),
    ]);
    let legacy_handle = format!("v1/{}/{}/{}", h.ceph.monitors, h.ceph.pool, l.image);
    with_mounted(
        &mut node,
        &dir.path().join("before"),
        &legacy_handle,
        legacy_ctx,
        key.clone(),
        |target| std::fs::write(target.join("hello.txt"), b"written before the migration"),
    )
    .await
    .unwrap();

    // no CSIDriver object yet: refused, nothing changed
    let pv_before = h.volumes().get(&l.pv).await.unwrap();
    let out = migrate(&h, &["--all", "--dry-run"], &[]);
    assert!(!out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("refused") && stdout.contains("CSIDriver"),
        "{}",
        text(&out)
    );
    create_driver(&h).await;

    // dry run: the exact new PV, no secret value, nothing changed
    let out = migrate(&h, &["--all", "--dry-run"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains(&format!("# PV {} would become:", l.pv)),
        "{stdout}"
    );
    assert!(
        stdout.contains("would-migrate") && stdout.contains(&l.image),
        "{stdout}"
    );
    assert!(
        !stdout.contains(&h.ceph.admin_key)
            && !String::from_utf8_lossy(&out.stderr).contains(&h.ceph.admin_key)
    );
    let json_out = migrate(&h, &["--all", "--dry-run", "-o", "json"], &[]);
    let row = &report(&json_out)[&l.pv];
    assert_eq!(row["result"], "would-migrate");
    assert_eq!(
        row["newPV"]["spec"]["csi"]["nodeStageSecretRef"]["namespace"],
        "default"
    );
    assert_eq!(
        row["newPV"]["spec"]["csi"]["nodeStageSecretRef"]["name"],
        USER_SECRET
    );
    assert_eq!(
        row["newPV"]["spec"]["csi"]["controllerExpandSecretRef"]["name"],
        ADMIN_SECRET
    );
    let pv_after = h.volumes().get(&l.pv).await.unwrap();
    assert_eq!(
        pv_after.metadata.resource_version,
        pv_before.metadata.resource_version
    );
    assert_eq!(h.image_meta(&l.image, "provisioner.ceph.com/pv"), None);

    // the migration
    let out = migrate(&h, &["--all"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains(&l.pv) && stdout.contains("migrated") && stdout.contains("claim Bound"),
        "{stdout}"
    );
    assert_eq!(present(&h, &before), before);
    let pv = assert_migrated(&h, &l).await;

    // our node service stages and publishes exactly what the migrated PV says
    let csi = pv.spec.clone().unwrap().csi.unwrap();
    let stage_ref = csi.node_stage_secret_ref.clone().unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(h.client.clone(), stage_ref.namespace.as_deref().unwrap());
    let secret = secrets
        .get(stage_ref.name.as_deref().unwrap())
        .await
        .unwrap();
    let stage_secrets: HashMap<String, String> = secret
        .data
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect();
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    let read = with_mounted(
        &mut node,
        &dir.path().join("after"),
        &csi.volume_handle,
        csi.volume_attributes.clone().unwrap().into_iter().collect(),
        stage_secrets,
        |target| std::fs::read(target.join("hello.txt")),
    )
    .await
    .unwrap();
    assert_eq!(read, b"written before the migration");

    // a second run is a no-op
    let rv = h
        .volumes()
        .get(&l.pv)
        .await
        .unwrap()
        .metadata
        .resource_version;
    let out = migrate(&h, &["--all"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to do"),
        "{}",
        text(&out)
    );
    assert_eq!(
        h.volumes()
            .get(&l.pv)
            .await
            .unwrap()
            .metadata
            .resource_version,
        rv
    );

    // our provisioner expands it (image and PV) with the secrets the migration recorded
    let _p = h.spawn_default();
    h.resize_claims(std::slice::from_ref(&l.claim), "128Mi")
        .await;
    h.until("image grown", Duration::from_secs(30), || async {
        (h.image_size(&l.image) == 128 << 20).then_some(())
    })
    .await;
    h.until("PV capacity grown", Duration::from_secs(30), || async {
        let pv = h.volumes().get(&l.pv).await.ok()?;
        (pv.spec?.capacity?["storage"].0 == "128Mi").then_some(())
    })
    .await;

    // deleting the claim removes the image (class Delete), through our provisioner
    h.claims()
        .delete(&l.claim, &Default::default())
        .await
        .unwrap();
    h.wait_pv_gone(&l.pv).await;
    h.until("image removed", Duration::from_secs(30), || async {
        (!h.images().contains(&l.image)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_are_refused_one_by_one_and_the_others_migrate() {
    let h = Harness::start().await;
    setup(&h, true).await;
    let good = legacy_volume(&h, "good", 16, "16Mi", |_| {}).await;
    let no_secret = legacy_volume(&h, "no-secret", 16, "16Mi", |pv| {
        pv["spec"]["rbd"]["secretRef"]["name"] = json!("missing-secret");
    })
    .await;
    let no_image = legacy_volume(&h, "no-image", 0, "16Mi", |_| {}).await;
    let smaller = legacy_volume(&h, "smaller", 16, "32Mi", |_| {}).await;
    // a static PV an admin wrote, with the key in a file on the nodes
    let keyring = legacy_volume(&h, "keyring", 16, "16Mi", |pv| {
        pv["metadata"]["annotations"] = json!({});
        pv["spec"]["persistentVolumeReclaimPolicy"] = json!("Retain");
        let rbd = pv["spec"]["rbd"].as_object_mut().unwrap();
        rbd.remove("secretRef");
        rbd.insert("keyring".into(), json!("/etc/ceph/keyring"));
    })
    .await;
    let in_use = legacy_volume(&h, "in-use", 16, "16Mi", |_| {}).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "app", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "in-use"}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let before: BTreeSet<String> = [&good, &no_secret, &smaller, &keyring, &in_use]
        .iter()
        .map(|l| l.image.clone())
        .collect();
    assert_eq!(present(&h, &before), before);
    let refused = [&no_secret, &no_image, &smaller, &keyring, &in_use];
    let mut versions = BTreeMap::new();
    for l in refused {
        let pv = h.volumes().get(&l.pv).await.unwrap();
        versions.insert(l.pv.clone(), pv.metadata.resource_version);
    }

    // the dry run shows every refusal and changes nothing
    let out = migrate(&h, &["--all", "--dry-run"], &[]);
    assert!(!out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(table.matches(" refused ").count(), 5, "{table}");
    assert!(
        table.contains(&format!("{} would become", good.pv)),
        "{table}"
    );
    for l in refused {
        let pv = h.volumes().get(&l.pv).await.unwrap();
        assert_eq!(pv.metadata.resource_version, versions[&l.pv]);
    }

    let out = migrate(&h, &["--all", "-o", "json"], &[]);
    assert!(
        !out.status.success(),
        "refusals must fail the run: {}",
        text(&out)
    );
    let rows = report(&out);
    assert_eq!(rows.len(), 6, "{}", text(&out));
    assert_eq!(rows[&good.pv]["result"], "migrated", "{}", text(&out));
    let expect = [
        (&no_secret, "secret default/missing-secret not found"),
        (&no_image, "does not exist"),
        (&smaller, "less than the PV's capacity"),
        (&keyring, "no secretRef, only keyring \"/etc/ceph/keyring\""),
        (&in_use, "used by pod(s) default/app"),
    ];
    for (l, reason) in expect {
        let row = &rows[&l.pv];
        assert_eq!(row["result"], "refused", "{}: {row}", l.claim);
        assert!(
            row["detail"].as_str().unwrap().contains(reason),
            "{}: {row}",
            l.claim
        );
        // untouched
        let pv = h.volumes().get(&l.pv).await.unwrap();
        assert!(pv.spec.unwrap().rbd.is_some());
        assert_eq!(pv.metadata.resource_version, versions[&l.pv]);
        assert_claim_keeps_its_volume(&h, l, "refused").await;
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("5 of 6 selected PV(s)"));
    assert_eq!(present(&h, &before), before);
    assert_migrated(&h, &good).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provisioner_still_deletes_a_legacy_pv_that_was_not_migrated() {
    let h = Harness::start().await;
    setup(&h, true).await;
    let l = legacy_volume(&h, "old-style", 16, "16Mi", |_| {}).await;
    let _p = h.spawn_default();
    h.claims()
        .delete(&l.claim, &Default::default())
        .await
        .unwrap();
    h.wait_pv_gone(&l.pv).await;
    h.until("image removed", Duration::from_secs(30), || async {
        (!h.images().contains(&l.image)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_replaced_during_a_migration_never_gets_a_pv_with_reclaim_policy_delete() {
    let h = Harness::start().await;
    setup(&h, true).await;
    let l = legacy_volume(&h, "replaced", 16, "16Mi", |_| {}).await;
    let image = BTreeSet::from([l.image.clone()]);
    // the CSI PV is saved (with Retain), then the run dies before it restores Delete
    let out = migrate(
        &h,
        &["--pv", &l.pv],
        &[("RBD_PROVISIONER_CRASH_AT", "migrate-after-create")],
    );
    assert!(!out.status.success(), "{}", text(&out));
    // meanwhile the claim is deleted and made again under the same name (another object)
    h.claims()
        .delete(&l.claim, &Default::default())
        .await
        .unwrap();
    h.until("the claim deleted", Duration::from_secs(30), || async {
        matches!(h.claims().get_opt(&l.claim).await, Ok(None)).then_some(())
    })
    .await;
    let again = h.create_claim(&l.claim, CLASS, "16Mi", false).await;
    assert_ne!(again.metadata.uid.as_deref(), Some(l.claim_uid.as_str()));

    let out = migrate(&h, &["--pv", &l.pv, "-o", "json"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let pv = h.volumes().get(&l.pv).await.unwrap();
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref()),
        Some("Retain"),
        "the PV of a replaced claim got its Delete policy back: {}",
        text(&out)
    );
    assert_eq!(present(&h, &image), image);

    h.claims()
        .delete(&l.claim, &Default::default())
        .await
        .unwrap();
    h.volumes()
        .delete(&l.pv, &Default::default())
        .await
        .unwrap();
    h.wait_pv_gone(&l.pv).await;
    // (a client that just closed the image may still be leaving it: retried)
    let spec = format!("{}/{}", h.ceph.pool, l.image);
    h.until("the image removed", Duration::from_secs(30), || async {
        h.ceph.rbd(&["rm", &spec]).ok()
    })
    .await;
}
