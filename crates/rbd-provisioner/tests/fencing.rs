//! Fencing lost nodes, end to end: the emulated API server, this test binary's micro-ceph, the
//! provisioner binary (attach controller and Node watch) and two node plugins of the same
//! binary on this host ("node-a", "node-b", fuse mapper: each node's client is its own rbd-fuse
//! instance, both on 127.0.0.1). A node tainted `node.kubernetes.io/out-of-service` has its
//! Ceph client instance blocklisted before its volume moves; removing the taint removes the
//! blocklist entry.

#[path = "support/node.rs"]
mod node;
mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use node::NodePlugin;
use serde_json::json;
use support::Harness;

const DRIVER: &str = "rbd.provisioner.ceph.io";
const TAINT: &str = "node.kubernetes.io/out-of-service";
const FENCED: &str = "rbd.provisioner.ceph.io/fenced";
const WAIT: Duration = Duration::from_secs(30);

/// Whatever a test leaves, removed at its end, also when an assertion failed: mounts and loop
/// devices under its directory, blocklist entries, the image.
struct Cleanup {
    dir: PathBuf,
    image: Option<String>,
    addresses: Vec<String>,
    ranges: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let ceph = micro_ceph::cluster();
        let under = self.dir.to_string_lossy().to_string();
        // the loop devices on this test's rbd-fuse files, found before their mounts go
        let loops: Vec<String> = std::fs::read_dir("/sys/block")
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| {
                        std::fs::read_to_string(e.path().join("loop/backing_file"))
                            .is_ok_and(|b| b.starts_with(&under))
                    })
                    .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .filter(|m| m.starts_with(&under))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = std::process::Command::new("umount")
                .args(["-l", &m])
                .status();
        }
        for dev in loops {
            let _ = std::process::Command::new("losetup")
                .args(["-d", &dev])
                .status();
        }
        // the rbd-fuse instances this test's node plugins started (they outlive the plugins)
        if let Ok(procs) = std::fs::read_dir("/proc") {
            for p in procs.flatten() {
                let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                if cmdline.starts_with("rbd-fuse") && cmdline.contains(&under) {
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
            }
        }
        for address in &self.addresses {
            let _ = ceph
                .cli("ceph")
                .args(["osd", "blocklist", "rm", address])
                .output();
        }
        for range in &self.ranges {
            let _ = ceph
                .cli("ceph")
                .args(["osd", "blocklist", "range", "rm", range])
                .output();
        }
        if let Some(image) = &self.image {
            let _ = ceph.rbd(&["rm", "--no-progress", &format!("{}/{image}", ceph.pool)]);
        }
    }
}

/// `ceph osd blocklist ls`: the listed addresses and ranges.
fn blocklist() -> Vec<String> {
    let out = micro_ceph::cluster()
        .cli("ceph")
        .args(["osd", "blocklist", "ls"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

async fn create_node(h: &Harness, name: &str) {
    let nodes: Api<Node> = Api::all(h.client.clone());
    let node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let api: Api<CSINode> = Api::all(h.client.clone());
    let csi_node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": name}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &csi_node).await.unwrap();
}

async fn set_taints(h: &Harness, node: &str, taints: serde_json::Value) {
    let nodes: Api<Node> = Api::all(h.client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": taints}})),
        )
        .await
        .unwrap();
}

fn out_of_service() -> serde_json::Value {
    json!([{"key": TAINT, "value": "nodeshutdown", "effect": "NoExecute"}])
}

async fn fence_record(h: &Harness, node: &str) -> Option<String> {
    let nodes: Api<Node> = Api::all(h.client.clone());
    let node = nodes.get(node).await.unwrap();
    node.metadata
        .annotations
        .unwrap_or_default()
        .get(FENCED)
        .cloned()
}

async fn create_pod(h: &Harness, name: &str, node: &str, claim: &str) {
    let api: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
}

/// The VolumeAttachments of `pv`: (node, attached).
async fn attachments_of(h: &Harness, pv: &str) -> Vec<(String, bool)> {
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());
    let mut found: Vec<(String, bool)> = vas
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .map(|va| (va.spec.node_name, va.status.is_some_and(|s| s.attached)))
        .collect();
    found.sort();
    found
}

fn published_nodes(h: &Harness, image: &str) -> Vec<String> {
    let value = h
        .image_meta(image, "provisioner.ceph.com/published-nodes")
        .unwrap_or_default();
    if value.trim().is_empty() {
        return Vec::new();
    }
    let list: Vec<serde_json::Value> = serde_json::from_str(value.trim()).unwrap();
    list.iter()
        .map(|p| p["node"].as_str().unwrap().to_owned())
        .collect()
}

fn staged_by(h: &Harness, image: &str) -> serde_json::Value {
    let value = h
        .image_meta(image, "provisioner.ceph.com/staged-by")
        .expect("no staged-by record");
    serde_json::from_str(&value).unwrap()
}

/// 3 MiB of a pattern no fresh filesystem holds.
fn payload() -> Vec<u8> {
    (0..3 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// Writes `data` to `path` and syncs it, off the async runtime, with a deadline (a client cut
/// off mid-write may block rather than fail).
async fn write_synced(path: &Path, data: Vec<u8>) -> Result<(), String> {
    let path = path.to_path_buf();
    let job = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        f.write_all(&data)?;
        f.sync_all()
    });
    match tokio::time::timeout(Duration::from_secs(20), job).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the write did not finish within 20 s".into()),
    }
}

fn spawn_provisioner(h: &Harness) -> support::Process {
    h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
        &[],
    )
}

/// The acceptance path: written on node-a, node-a declared out of service, node-a's rbd-fuse
/// instance blocklisted (its next write fails) and no one else, the volume attached to and
/// staged on node-b, which reads every byte node-a synced; the taint removed, the entry gone.
// Two workers: the node plugins' connections close while a plugin's drop waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_service_node_is_fenced_before_its_volume_moves_and_unfenced_after() {
    let h = Harness::start().await;
    let provisioner = spawn_provisioner(&h);
    let mut cleanup = Cleanup {
        dir: h.dir.path().to_path_buf(),
        image: None,
        addresses: Vec::new(),
        ranges: Vec::new(),
    };
    let drivers: Api<CSIDriver> = Api::all(h.client.clone());
    let driver = serde_json::from_value(json!({
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": true, "volumeLifecycleModes": ["Persistent"]},
    }))
    .unwrap();
    drivers
        .create(&PostParams::default(), &driver)
        .await
        .unwrap();
    h.create_class("fenced", &h.params(), "Delete").await;
    h.create_claim("data", "fenced", "64Mi", false).await;
    let (_, pv) = h.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    cleanup.image = Some(image.clone());
    for node in ["node-a", "node-b"] {
        create_node(&h, node).await;
    }
    let plugin_a = NodePlugin::start_as(&h.dir.path().join("node-a"), "node-a");
    let plugin_b = NodePlugin::start_as(&h.dir.path().join("node-b"), "node-b");

    // node-a: attached, staged, written and synced
    create_pod(&h, "app-a", "node-a", "data").await;
    h.until("attached to node-a", WAIT, || async {
        (attachments_of(&h, &pv_name).await == [("node-a".to_owned(), true)]).then_some(())
    })
    .await;
    let target_a = plugin_a
        .mount(&h.client, &pv)
        .await
        .unwrap_or_else(|e| panic!("stage on node-a: {e:?}\n{}", plugin_a.log_text()));
    let data = payload();
    write_synced(&target_a.join("data.bin"), data.clone())
        .await
        .unwrap();
    let by = staged_by(&h, &image);
    assert_eq!(by["node"], "node-a", "{by}");
    let address_a = by["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no client address recorded: {by}"))
        .to_owned();
    cleanup.addresses.push(address_a.clone());
    assert!(!blocklist().contains(&address_a));

    // node-a declared lost: its client instance blocklisted, the record and events say so
    set_taints(&h, "node-a", out_of_service()).await;
    let record = h
        .until("node-a fenced", WAIT, || async {
            fence_record(&h, "node-a").await
        })
        .await;
    assert!(record.contains(&address_a), "{record}");
    assert!(
        blocklist().contains(&address_a),
        "{address_a} not blocklisted: {:?}",
        blocklist()
    );
    let event = h
        .wait_event_containing("node-a", "NodeFenced", &[&address_a])
        .await;
    assert!(event.contains(TAINT), "{event}");
    let event = h
        .wait_event_containing(&pv_name, "VolumeFenced", &[&address_a])
        .await;
    assert!(event.contains(&image), "{event}");
    assert_eq!(
        published_nodes(&h, &image),
        Vec::<String>::new(),
        "node-a's publication is cleared once it is fenced"
    );
    // node-a's next write fails
    let late = write_synced(&target_a.join("late.bin"), vec![7u8; 1024 * 1024]).await;
    assert!(late.is_err(), "node-a could still write after the fence");

    // Kubernetes' pod GC force-deletes node-a's pods; the volume moves to node-b
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.delete("app-a", &DeleteParams::default())
        .await
        .unwrap();
    create_pod(&h, "app-b", "node-b", "data").await;
    h.until("moved to node-b", WAIT, || async {
        (attachments_of(&h, &pv_name).await == [("node-b".to_owned(), true)]).then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), ["node-b"]);
    let target_b = plugin_b
        .mount(&h.client, &pv)
        .await
        .unwrap_or_else(|e| panic!("stage on node-b: {e:?}\n{}", plugin_b.log_text()));
    let mut read = Vec::new();
    std::fs::File::open(target_b.join("data.bin"))
        .unwrap()
        .read_to_end(&mut read)
        .unwrap();
    assert!(read == data, "node-b read other bytes than node-a synced");
    // node-b's client is untouched: it writes, and only node-a's instance is blocklisted
    write_synced(&target_b.join("b.bin"), vec![1u8; 4096])
        .await
        .unwrap();
    let by_b = staged_by(&h, &image);
    assert_eq!(by_b["node"], "node-b", "{by_b}");
    let address_b = by_b["address"]
        .as_str()
        .unwrap_or_else(|| {
            panic!(
                "no client address recorded for node-b: {by_b}\nnode-b's plugin:\n{}",
                plugin_b.log_text()
            )
        })
        .to_owned();
    assert_ne!(address_a, address_b);
    assert!(!blocklist().contains(&address_b));
    assert_eq!(
        address_a.split(':').next(),
        address_b.split(':').next(),
        "both nodes' clients share one IP: the fence is per instance"
    );

    // the node comes back: the taint removed, the blocklist entry gone
    set_taints(&h, "node-a", json!([])).await;
    h.until("node-a unfenced", WAIT, || async {
        fence_record(&h, "node-a").await.is_none().then_some(())
    })
    .await;
    assert!(
        !blocklist().contains(&address_a),
        "{address_a} still blocklisted"
    );
    let event = h.wait_event("node-a", "NodeUnfenced").await;
    assert!(event.contains(&address_a), "{event}");

    plugin_b.unmount(&pv).await;
    drop(provisioner);
}

/// Without the taint nothing is fenced, not even for another taint (a node that is only
/// unreachable may be slow, not dead), and a detach from it is a plain unpublish; a node
/// tainted out of service with no volumes fences nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_taint_nothing_is_fenced_and_a_node_without_volumes_fences_nothing() {
    let h = Harness::start().await;
    let _provisioner = spawn_provisioner(&h);
    let mut cleanup = Cleanup {
        dir: h.dir.path().to_path_buf(),
        image: None,
        addresses: Vec::new(),
        ranges: Vec::new(),
    };
    h.create_class("quiet", &h.params(), "Delete").await;
    h.create_claim("quiet-data", "quiet", "8Mi", false).await;
    let (_, pv) = h.wait_bound("quiet-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    cleanup.image = Some(image.clone());
    for node in ["node-x", "node-empty"] {
        create_node(&h, node).await;
    }
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());
    let va = serde_json::from_value(json!({
        "metadata": {"name": "va-x"},
        "spec": {"attacher": DRIVER, "nodeName": "node-x", "source": {"persistentVolumeName": pv_name}},
    }))
    .unwrap();
    vas.create(&PostParams::default(), &va).await.unwrap();
    h.until("va-x attached", WAIT, || async {
        let va = vas.get("va-x").await.unwrap();
        va.status.as_ref().is_some_and(|s| s.attached).then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), ["node-x"]);

    // another taint on node-x, then the out-of-service taint on node-empty: once node-empty's
    // fence is recorded, node-x's change has been seen (one watch, in order)
    set_taints(
        &h,
        "node-x",
        json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
    )
    .await;
    set_taints(&h, "node-empty", out_of_service()).await;
    let record = h
        .until("node-empty fenced", WAIT, || async {
            fence_record(&h, "node-empty").await
        })
        .await;
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["clusters"], json!([]), "{record}");
    let event = h.wait_event("node-empty", "NodeFenced").await;
    assert!(event.contains("nothing blocklisted"), "{event}");
    assert_eq!(fence_record(&h, "node-x").await, None);
    assert!(
        h.events_for(&pv_name)
            .await
            .iter()
            .all(|e| e.reason.as_deref() != Some("VolumeFenced"))
    );
    assert_eq!(published_nodes(&h, &image), ["node-x"]);

    // a detach from the unreachable (not out-of-service) node: a plain unpublish
    vas.delete("va-x", &DeleteParams::default()).await.unwrap();
    h.until("va-x gone", WAIT, || async {
        vas.get_opt("va-x").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), Vec::<String>::new());
    assert_eq!(fence_record(&h, "node-x").await, None);

    // node-empty back: unfenced with nothing to remove
    set_taints(&h, "node-empty", json!([])).await;
    h.until("node-empty unfenced", WAIT, || async {
        fence_record(&h, "node-empty").await.is_none().then_some(())
    })
    .await;
    h.claims()
        .delete("quiet-data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv_name).await;
    cleanup.image = None;
}

fn network_fences(h: &Harness) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource::erase::<provisioner::network_fence::NetworkFence>(&());
    Api::all_with(h.client.clone(), &resource)
}

async fn create_network_fence(h: &Harness, name: &str, spec: serde_json::Value) {
    let object = serde_json::from_value(json!({
        "apiVersion": "csiaddons.openshift.io/v1alpha1",
        "kind": "NetworkFence",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    network_fences(h)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// Waits for `status.result` of NetworkFence `name` to be `result` at its current generation
/// (when the status records it), and returns `status.message`.
async fn wait_result(h: &Harness, name: &str, result: &str) -> String {
    h.until(&format!("NetworkFence {name} {result}"), WAIT, || async {
        let nf = network_fences(h).get(name).await.ok()?;
        let generation = nf.metadata.generation;
        let status = nf.data.get("status")?;
        let observed = status["conditions"][0]["observedGeneration"].as_i64();
        (status["result"] == result && (observed.is_none() || observed == generation))
            .then(|| status["message"].as_str().unwrap_or_default().to_owned())
    })
    .await
}

/// csi-addons' NetworkFence for our driver: a CIDR fenced (a range blocklist entry), unfenced,
/// fenced again and deleted (the finalizer takes it back); bad input Failed naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_fences_of_our_driver_blocklist_their_cidrs_until_unfenced_or_deleted() {
    let h = Harness::start_on(
        kube_emulator::Emulator::builder()
            .csi_addons_crds(true)
            .build(),
    )
    .await;
    let _provisioner = spawn_provisioner(&h);
    const CIDR: &str = "192.0.2.0/30";
    const LISTED: &str = "cidr:192.0.2.0:0/30";
    let _cleanup = Cleanup {
        dir: h.dir.path().to_path_buf(),
        image: None,
        addresses: Vec::new(),
        ranges: vec![CIDR.to_owned()],
    };
    let spec = |state: &str| {
        json!({
            "driver": DRIVER,
            "fenceState": state,
            "cidrs": [CIDR],
            "secret": {"name": support::ADMIN_SECRET, "namespace": support::ADMIN_SECRET_NS},
            "parameters": {"monitors": h.ceph.monitors},
        })
    };
    create_network_fence(&h, "lost-rack", spec("Fenced")).await;
    let message = wait_result(&h, "lost-rack", "Succeeded").await;
    assert!(message.contains(CIDR), "{message}");
    assert!(
        blocklist().contains(&LISTED.to_owned()),
        "{:?}",
        blocklist()
    );
    let nf = network_fences(&h).get("lost-rack").await.unwrap();
    assert!(
        nf.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"csiaddons.openshift.io/network-fence".to_owned())
    );
    assert_eq!(nf.data["status"]["conditions"][0]["status"], "True");

    // Unfenced: the entry goes
    network_fences(&h)
        .patch(
            "lost-rack",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"fenceState": "Unfenced"}})),
        )
        .await
        .unwrap();
    h.until("the range unfenced", WAIT, || async {
        let nf = network_fences(&h).get("lost-rack").await.ok()?;
        (nf.data["status"]["conditions"][0]["reason"] == "UnfenceSucceeded").then_some(())
    })
    .await;
    assert!(
        !blocklist().contains(&LISTED.to_owned()),
        "{:?}",
        blocklist()
    );

    // fenced again, then deleted: the finalizer unfences first
    network_fences(&h)
        .patch(
            "lost-rack",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"fenceState": "Fenced"}})),
        )
        .await
        .unwrap();
    h.until("fenced again", WAIT, || async {
        blocklist().contains(&LISTED.to_owned()).then_some(())
    })
    .await;
    network_fences(&h)
        .delete("lost-rack", &DeleteParams::default())
        .await
        .unwrap();
    h.until("the NetworkFence gone", WAIT, || async {
        network_fences(&h)
            .get_opt("lost-rack")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        !blocklist().contains(&LISTED.to_owned()),
        "{:?}",
        blocklist()
    );

    // bad input: Failed, naming the field
    let mut unknown = spec("Fenced");
    unknown["driver"] = json!("unknown.example.com");
    create_network_fence(&h, "bad-driver", unknown).await;
    let mut bad_cidr = spec("Fenced");
    bad_cidr["cidrs"] = json!([CIDR, "10.0.0.300/24"]);
    create_network_fence(&h, "bad-cidr", bad_cidr).await;
    let mut no_secret = spec("Fenced");
    no_secret.as_object_mut().unwrap().remove("secret");
    create_network_fence(&h, "no-secret", no_secret).await;
    let message = wait_result(&h, "bad-driver", "Failed").await;
    assert!(
        message.starts_with("spec.driver:") && message.contains("unknown.example.com"),
        "{message}"
    );
    let message = wait_result(&h, "bad-cidr", "Failed").await;
    assert!(
        message.starts_with("spec.cidrs[1]:") && message.contains("10.0.0.300/24"),
        "{message}"
    );
    let message = wait_result(&h, "no-secret", "Failed").await;
    assert!(message.starts_with("spec.secret:"), "{message}");
    assert!(
        !blocklist().contains(&LISTED.to_owned()),
        "a refused NetworkFence fenced its valid CIDR: {:?}",
        blocklist()
    );
}

/// A librbd writer (python-rbd) that opens the image, writes (taking its exclusive lock) and
/// keeps it open: a node's client of a volume staged before staged-by records existed.
struct Writer(std::process::Child);

const WRITE_AND_HOLD: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2]); img = rbd.Image(io, sys.argv[3])
img.write(b'x' * 4096, 0); img.flush()
print('locked', flush=True); sys.stdin.read()";

impl Writer {
    fn start(image: &str) -> Writer {
        use std::io::BufRead;
        let ceph = micro_ceph::cluster();
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", WRITE_AND_HOLD])
            .arg(&ceph.conf_path)
            .args([&ceph.pool, image])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            // librbd reports the blocklisting on stderr
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        Writer(child)
    }
}

impl Drop for Writer {
    /// Killed: a blocklisted client's close may wait for the OSDs.
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The address of the client holding `image`'s exclusive lock (`rbd lock ls`: a map by lock
/// ID on Pacific, a list on later releases; either way one entry with an `address`).
fn lock_holder_address(h: &Harness, image: &str) -> String {
    fn addresses(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(a) = map.get("address").and_then(|a| a.as_str()) {
                    out.push(a.to_owned());
                }
                map.values().for_each(|v| addresses(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| addresses(v, out)),
            _ => {}
        }
    }
    let locks: serde_json::Value = serde_json::from_str(
        &h.ceph
            .rbd(&[
                "lock",
                "ls",
                "--format",
                "json",
                &format!("{}/{image}", h.ceph.pool),
            ])
            .unwrap(),
    )
    .unwrap();
    let mut found = Vec::new();
    addresses(&locks, &mut found);
    assert_eq!(found.len(), 1, "one lock holder of {image}: {locks}");
    found.remove(0)
}

/// The ordering guarantee, and a volume without a staged-by record (staged by an older
/// version): the node tainted and its VolumeAttachment force-deleted at once, the volume
/// attached elsewhere right away. By the time the other node has it, the lost node is fenced:
/// the writer holding the image's exclusive lock blocklisted and its lock broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_detach_waits_for_the_fence_and_an_unrecorded_volumes_lock_holder_is_fenced() {
    let h = Harness::start().await;
    let _provisioner = spawn_provisioner(&h);
    let mut cleanup = Cleanup {
        dir: h.dir.path().to_path_buf(),
        image: None,
        addresses: Vec::new(),
        ranges: Vec::new(),
    };
    h.create_class("old", &h.params(), "Delete").await;
    h.create_claim("old-data", "old", "8Mi", false).await;
    let (_, pv) = h.wait_bound("old-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    cleanup.image = Some(image.clone());
    for node in ["node-y", "node-z"] {
        create_node(&h, node).await;
    }
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());
    let va = |name: &str, node: &str| -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv_name}},
        }))
        .unwrap()
    };
    vas.create(&PostParams::default(), &va("va-y", "node-y"))
        .await
        .unwrap();
    h.until("va-y attached", WAIT, || async {
        let va = vas.get("va-y").await.unwrap();
        va.status.as_ref().is_some_and(|s| s.attached).then_some(())
    })
    .await;
    let writer = Writer::start(&image);
    // the writer's address is the lock holder's (among the watchers, the provisioner's own
    // client may be reading the image's records right now)
    let address = lock_holder_address(&h, &image);
    cleanup.addresses.push(address.clone());
    assert!(
        h.image_meta(&image, "provisioner.ceph.com/staged-by")
            .is_none()
    );

    // the taint and Kubernetes' force-detach at once; the volume wanted on node-z
    set_taints(&h, "node-y", out_of_service()).await;
    vas.delete("va-y", &DeleteParams::default()).await.unwrap();
    vas.create(&PostParams::default(), &va("va-z", "node-z"))
        .await
        .unwrap();
    h.until("va-z attached", WAIT, || async {
        let va = vas.get("va-z").await.unwrap();
        va.status.as_ref().is_some_and(|s| s.attached).then_some(())
    })
    .await;
    let record = fence_record(&h, "node-y")
        .await
        .expect("the volume moved before node-y was fenced");
    assert!(record.contains(&address), "{record}");
    assert!(blocklist().contains(&address), "{:?}", blocklist());
    let locks = h
        .ceph
        .rbd(&["lock", "ls", &format!("{}/{image}", h.ceph.pool)])
        .unwrap();
    assert!(
        !locks.contains(&address),
        "the lock was not broken: {locks}"
    );
    let event = h
        .wait_event_containing(&pv_name, "VolumeFenced", &[&address])
        .await;
    assert!(event.contains("broke the exclusive lock"), "{event}");
    assert_eq!(published_nodes(&h, &image), ["node-z"]);

    set_taints(&h, "node-y", json!([])).await;
    h.until("node-y unfenced", WAIT, || async {
        fence_record(&h, "node-y").await.is_none().then_some(())
    })
    .await;
    assert!(!blocklist().contains(&address));
    drop(writer);
}
