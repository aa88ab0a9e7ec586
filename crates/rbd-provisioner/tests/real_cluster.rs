//! The shipped manifests and images on a real Kubernetes 1.36 (kube-apiserver,
//! kube-controller-manager, a kubelet on containerd and the upstream snapshot-controller, all
//! started by `scripts/real-cluster.sh`), against this test binary's micro-ceph: `deploy/` and
//! `deploy/csi/` as `kubectl kustomize` renders them, the images `scripts/image.sh` built, the
//! controller as a Deployment and the node plugin as the DaemonSet registering itself with the
//! kubelet. One claim goes through its whole life (provisioned, attached by the built-in attacher,
//! staged, published into pods, written, read by a second pod on the node, expanded, snapshotted
//! through the snapshot-controller, restored into a third pod that reads the snapshot's bytes,
//! deleted with nothing left); the node plugin's container is killed as a crash while a pod
//! writes, and the kubelet's restart of it must not break that pod nor a new mount.
//!
//! What this one-machine cluster needs that a real one does not, and so the only changes made to
//! the rendered manifests (each named where it is made): the controller uses the host network
//! (this cluster's pod network reaches neither the API server nor Ceph: no kube-proxy, no routes)
//! and so runs one replica (two on one host network would both bind the metrics port).
//!
//! Opt-in: it needs root, the cluster's ports, the binaries `scripts/real-cluster.sh build` makes
//! (minutes, cached) and the images. `scripts/test.sh` runs it with `RBD_REAL_CLUSTER=1` once
//! those exist; without it the test says why it is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

const DRIVER: &str = "rbd.provisioner.ceph.io";
const NODE: &str = "node-1";
const BUSYBOX: &str = "docker.io/local/busybox:1";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cluster of `scripts/real-cluster.sh`, in a folder of this test's; stopped on drop (its
/// pods deleted first, so the kubelet tears their volumes down), even when the test panics.
struct RealCluster {
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl RealCluster {
    fn script(dir: &Path, args: &[&str]) -> std::process::Output {
        Command::new(repo().join("scripts/real-cluster.sh"))
            .args(args)
            .env("REAL_CLUSTER_DIR", dir)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn start(dir: PathBuf) -> RealCluster {
        let out = Self::script(&dir, &["start"]);
        let cluster = RealCluster {
            kubeconfig: dir.join("kubeconfig"),
            dir,
        };
        assert!(
            out.status.success(),
            "real-cluster.sh start: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        cluster
    }

    fn load(&self, images: &[&str]) {
        let mut args = vec!["load"];
        args.extend_from_slice(images);
        let out = Self::script(&self.dir, &args);
        assert!(
            out.status.success(),
            "real-cluster.sh load: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join("run").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    async fn client(&self) -> kube::Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// The cluster's own kubectl (`real-cluster.sh kubectl`: its version, its kubeconfig).
    fn kubectl_command(&self) -> Command {
        let mut command = Command::new(repo().join("scripts/real-cluster.sh"));
        command.arg("kubectl").env("REAL_CLUSTER_DIR", &self.dir);
        command
    }

    /// `kubectl ARGS` against this cluster, STDIN fed in; stdout, or a panic with stderr.
    fn kubectl(&self, args: &[&str], stdin: &str) -> String {
        use std::io::Write;
        let mut child = self
            .kubectl_command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // what the cluster says about its objects, and what the project's containers logged
            for args in [
                &["get", "pods", "-A", "-o", "wide"][..],
                &["get", "events", "-A", "--sort-by=.lastTimestamp"],
                &[
                    "get",
                    "pvc,pv,volumeattachments,volumesnapshots,volumesnapshotcontents",
                    "-A",
                ],
                &[
                    "-n",
                    "rbd-provisioner",
                    "logs",
                    "-l",
                    "app.kubernetes.io/name=rbd-provisioner",
                    "--tail=60",
                ],
                &[
                    "-n",
                    "rbd-provisioner",
                    "logs",
                    "-l",
                    "app.kubernetes.io/name=rbd-csi-node",
                    "--tail=60",
                ],
                &[
                    "-n",
                    "storage",
                    "logs",
                    "-l",
                    "app.kubernetes.io/name=rbd-provisioner",
                    "--tail=60",
                ],
            ] {
                let out = self.kubectl_command().args(args).output();
                if let Ok(out) = out {
                    eprintln!(
                        "---- kubectl {} ----\n{}{}",
                        args.join(" "),
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
            for name in ["kubelet", "snapshot-controller"] {
                let log = self.log(name);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("---- {name}.log (last lines) ----");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        let out = Self::script(&self.dir, &["stop"]);
        if !out.status.success() {
            eprintln!(
                "real-cluster.sh stop: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Polls `check` every 500 ms until it gives a value; panics after `secs` naming `what` and the
/// last thing `check` said.
async fn wait_for<T, F, Fut>(what: &str, secs: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) => {
                assert!(
                    Instant::now() < end,
                    "{what}: not after {secs} s; last: {last}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// YAML documents from `kubectl kustomize DIR` (the cluster's kubectl).
fn render(cluster: &RealCluster, dir: &str) -> Vec<serde_json::Value> {
    let out = cluster
        .kubectl_command()
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml::Deserializer::from_str(&String::from_utf8(out.stdout).unwrap())
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// A busybox pod on the node with `command` as its shell script, using the claims given as
/// (claim, mount path, read-only).
fn pod(name: &str, script: &str, claims: &[(&str, &str)], restart: &str) -> serde_json::Value {
    let mounts: Vec<_> = claims
        .iter()
        .enumerate()
        .map(|(i, (_, path))| json!({"name": format!("v{i}"), "mountPath": path}))
        .collect();
    let volumes: Vec<_> = claims
        .iter()
        .enumerate()
        .map(|(i, (claim, _))| json!({"name": format!("v{i}"), "persistentVolumeClaim": {"claimName": claim}}))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    })
}

fn claim(name: &str, size: &str, data_source: Option<serde_json::Value>) -> serde_json::Value {
    let mut claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "storageClassName": "rbd",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        }
    });
    if let Some(source) = data_source {
        claim["spec"]["dataSource"] = source;
    }
    claim
}

struct Kube {
    client: kube::Client,
}

impl Kube {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }
    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn pod_phase(&self, name: &str) -> Result<String, String> {
        let pod = self.pods().get(name).await.map_err(|e| e.to_string())?;
        Ok(pod.status.and_then(|s| s.phase).unwrap_or_default())
    }

    /// Waits for the pod to be in `phase` (Running, Succeeded); a pod that fails instead panics
    /// with its events.
    async fn wait_phase(&self, name: &str, phase: &str, secs: u64) {
        wait_for(&format!("pod {name} {phase}"), secs, || async {
            let now = self.pod_phase(name).await?;
            if now == phase {
                return Ok(());
            }
            if now == "Failed" {
                panic!(
                    "pod {name} failed: {}\n{}",
                    self.logs(name).await,
                    self.events(name).await
                );
            }
            Err(format!("{now}; events: {}", self.events(name).await))
        })
        .await;
    }

    async fn logs(&self, name: &str) -> String {
        self.pods()
            .logs(name, &LogParams::default())
            .await
            .unwrap_or_else(|e| format!("(no logs: {e})"))
    }

    /// The events about an object, one line each.
    async fn events(&self, name: &str) -> String {
        let events: Api<Event> = Api::all(self.client.clone());
        let list = events
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        list.iter()
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.type_.as_deref().unwrap_or(""),
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }

    async fn delete_pod(&self, name: &str) {
        let _ = self.pods().delete(name, &DeleteParams::default()).await;
        wait_for(&format!("pod {name} gone"), 120, || async {
            match self.pods().get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    /// Waits until the kubelet has registered our node plugin (the CSINode lists the driver).
    async fn registered(&self, what: &str) {
        let csinodes: Api<CSINode> = Api::all(self.client.clone());
        wait_for(what, 120, || async {
            let node = csinodes.get(NODE).await.map_err(|e| e.to_string())?;
            if node.spec.drivers.iter().any(|d| d.name == DRIVER) {
                Ok(())
            } else {
                Err(format!("{:?}", node.spec.drivers))
            }
        })
        .await;
    }

    /// Waits until the PersistentVolume `name` is gone.
    async fn pv_deleted(&self, name: &str) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        wait_for(&format!("PV {name} deleted"), 180, || async {
            match pvs.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(p)) => Err(format!("{:?}", p.status)),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    /// The claim's volume, once bound.
    async fn bound(&self, name: &str) -> String {
        wait_for(&format!("claim {name} bound"), 120, || async {
            let claim = self.claims().get(name).await.map_err(|e| e.to_string())?;
            match claim.spec.and_then(|s| s.volume_name) {
                Some(pv) if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") => {
                    Ok(pv)
                }
                _ => Err(self.events(name).await),
            }
        })
        .await
    }
}

/// Mounts, loop devices and rbd-fuse processes that name `needle` (a PV or image name).
fn leftovers(needle: &str) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(needle))
        .map(|l| format!("mount: {l}"))
        .collect();
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    left.extend(
        String::from_utf8_lossy(&ps.stdout)
            .lines()
            .filter(|l| l.contains("rbd-fuse") && l.contains(needle))
            .map(|l| format!("process: {l}")),
    );
    let loops = Command::new("losetup")
        .args(["-l", "-n", "-O", "NAME,BACK-FILE"])
        .output()
        .unwrap();
    left.extend(
        String::from_utf8_lossy(&loops.stdout)
            .lines()
            .filter(|l| l.contains(needle))
            .map(|l| format!("loop device: {l}")),
    );
    left
}

fn skip_unless_enabled() -> bool {
    if std::env::var("RBD_REAL_CLUSTER").is_ok_and(|v| v == "1") {
        return false;
    }
    eprintln!(
        "SKIPPED real_cluster: set RBD_REAL_CLUSTER=1 (needs root, the binaries of \
         scripts/real-cluster.sh build and the images of scripts/image.sh; scripts/test.sh does)"
    );
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cluster_manifests_images_and_a_claims_whole_life() {
    if skip_unless_enabled() {
        return;
    }
    let ceph = micro_ceph::cluster();
    let dir = tempfile::tempdir().unwrap();
    let cluster = RealCluster::start(dir.path().join("cluster"));
    cluster.load(&[
        "localhost/rbd-provisioner:latest",
        "localhost/rbd-provisioner-node:latest",
    ]);
    let kube = Kube {
        client: cluster.client().await,
    };
    let client = kube.client.clone();

    // ---- the manifests as shipped, with this cluster's changes
    let mut objects = render(&cluster, "deploy");
    objects.extend(render(&cluster, "deploy/csi"));
    for object in &mut objects {
        if object["kind"] == "Deployment" && object["metadata"]["name"] == "rbd-provisioner" {
            let spec = &mut object["spec"];
            // change 1: one replica (both would bind the metrics port on the host network)
            spec["replicas"] = json!(1);
            // change 2: the host network (this cluster's pod network reaches neither the API
            // server nor Ceph), and the API server at its address there (no kube-proxy serves
            // the kubernetes Service's IP)
            spec["template"]["spec"]["hostNetwork"] = json!(true);
            let env = spec["template"]["spec"]["containers"][0]["env"]
                .as_array_mut()
                .unwrap();
            env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}));
            env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}));
        }
    }
    let manifests: String = objects
        .iter()
        .map(|o| format!("---\n{}", serde_yaml::to_string(o).unwrap()))
        .collect();
    cluster.kubectl(&["apply", "--server-side", "-f", "-"], &manifests);

    // the admin secret and the example classes, the monitors this cluster's
    cluster.kubectl(
        &[
            "-n",
            "kube-system",
            "create",
            "secret",
            "generic",
            "ceph-admin-secret",
            "--type=kubernetes.io/rbd",
            "--from-file=key=/dev/stdin",
        ],
        &ceph.admin_key,
    );
    let class = std::fs::read_to_string(repo().join("deploy/examples/storageclass.yaml"))
        .unwrap()
        .replace("MONITORS", &ceph.monitors)
        .replace("pool: rbd", &format!("pool: {}", ceph.pool))
        // online grow of ext4 needs CAP_SYS_RESOURCE, which root lacks on some CI machines
        // (and so the privileged node plugin too); xfs_growfs does not. The fuse mapper: this
        // kernel has no rbd or nbd module (the VM suite tests those)
        .replace("fsType: ext4", "fsType: xfs\n  mounter: fuse");
    cluster.kubectl(&["apply", "-f", "-"], &class);
    cluster.kubectl(
        &["apply", "-f", "-"],
        &std::fs::read_to_string(repo().join("deploy/examples/snapshots/volumesnapshotclass.yaml"))
            .unwrap(),
    );

    // ---- the controller ready, the node plugin registered with the kubelet
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "rbd-provisioner");
    wait_for("the controller Deployment available", 180, || async {
        let d = deployments
            .get("rbd-provisioner")
            .await
            .map_err(|e| e.to_string())?;
        match d.status.as_ref().and_then(|s| s.available_replicas) {
            Some(1) => Ok(()),
            _ => Err(format!("{:?}", d.status)),
        }
    })
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "rbd-provisioner");
    wait_for("the node DaemonSet ready", 180, || async {
        let d = daemonsets
            .get("rbd-csi-node")
            .await
            .map_err(|e| e.to_string())?;
        match d.status.as_ref().map(|s| s.number_ready) {
            Some(1) => Ok(()),
            _ => Err(format!("{:?}", d.status)),
        }
    })
    .await;
    kube.registered("the kubelet registers the node plugin (CSINode)")
        .await;

    // ---- a claim, written by one pod, read by a second pod on the same node at the same time
    cluster.kubectl(
        &["apply", "-f", "-"],
        &claim("data", "1Gi", None).to_string(),
    );
    let pv = kube.bound("data").await;
    let image = image_of(&client, &pv).await;
    let writer = pod(
        "writer",
        "set -e; dd if=/dev/urandom of=/data/payload bs=1M count=8 2>/dev/null; \
         md5sum /data/payload > /data/payload.md5; sync; echo written; i=0; \
         while :; do dd if=/dev/urandom of=/data/tick bs=4k count=1 conv=fsync 2>/dev/null \
           || { echo WRITE FAILED; exit 1; }; echo tick $i; i=$((i+1)); sleep 1; done",
        &[("data", "/data")],
        "Never",
    );
    cluster.kubectl(&["apply", "-f", "-"], &writer.to_string());
    kube.wait_phase("writer", "Running", 180).await;
    wait_for("the writer wrote its payload", 60, || async {
        let logs = kube.logs("writer").await;
        if logs.contains("written") {
            Ok(())
        } else {
            Err(logs)
        }
    })
    .await;
    // attached by the built-in attacher, through a VolumeAttachment the kcm made
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let attached: Vec<_> = attachments
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|a| a.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str()))
        .collect();
    assert_eq!(attached.len(), 1, "{attached:?}");
    assert_eq!(attached[0].spec.attacher, DRIVER);
    assert_eq!(attached[0].spec.node_name, NODE);
    assert_eq!(attached[0].status.as_ref().map(|s| s.attached), Some(true));

    let reader = |name: &str, claim: &str| {
        pod(
            name,
            "cd /data && md5sum -c payload.md5 && df -k /data | tail -1",
            &[(claim, "/data")],
            "Never",
        )
    };
    cluster.kubectl(&["apply", "-f", "-"], &reader("reader", "data").to_string());
    kube.wait_phase("reader", "Succeeded", 180).await;
    let logs = kube.logs("reader").await;
    assert!(logs.contains("payload: OK"), "{logs}");
    kube.delete_pod("reader").await;

    // ---- expanded while the writer runs: the claim, the PV and the filesystem
    kube.claims()
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await
        .unwrap();
    wait_for("the claim's capacity 2Gi", 180, || async {
        let claim = kube.claims().get("data").await.map_err(|e| e.to_string())?;
        let capacity = claim
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").map(|q| q.0.clone()));
        if capacity.as_deref() == Some("2Gi") {
            Ok(())
        } else {
            Err(format!("{capacity:?}; {}", kube.events("data").await))
        }
    })
    .await;
    assert_eq!(
        ceph.rbd(&[
            "info",
            "--format",
            "json",
            &format!("{}/{image}", ceph.pool)
        ])
        .map(|s| serde_json::from_str::<serde_json::Value>(&s).unwrap()["size"].clone())
        .unwrap(),
        json!(2u64 << 30)
    );
    cluster.kubectl(&["apply", "-f", "-"], &reader("grown", "data").to_string());
    kube.wait_phase("grown", "Succeeded", 180).await;
    let logs = kube.logs("grown").await;
    let kb: u64 = logs
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("df: {logs}"));
    assert!(kb > 1_600_000, "the filesystem did not grow: {logs}");
    kube.delete_pod("grown").await;

    // ---- a snapshot through the upstream snapshot-controller, restored into a third pod
    cluster.kubectl(
        &["apply", "-f", "-"],
        &json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": "data-snap", "namespace": "default"},
            "spec": {"volumeSnapshotClassName": "rbd-snapshots",
                     "source": {"persistentVolumeClaimName": "data"}}
        })
        .to_string(),
    );
    wait_for("the VolumeSnapshot ready", 180, || async {
        let out = cluster
            .kubectl_command()
            .args([
                "get",
                "volumesnapshot",
                "data-snap",
                "-o",
                "jsonpath={.status.readyToUse}",
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if out.stdout == b"true" {
            Ok(())
        } else {
            Err(format!(
                "{}; {}",
                String::from_utf8_lossy(&out.stdout),
                kube.events("data-snap").await
            ))
        }
    })
    .await;
    cluster.kubectl(
        &["apply", "-f", "-"],
        &claim(
            "restored",
            "2Gi",
            Some(json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "data-snap"})),
        )
        .to_string(),
    );
    let restored_pv = kube.bound("restored").await;
    let restored_image = image_of(&client, &restored_pv).await;
    cluster.kubectl(
        &["apply", "-f", "-"],
        &reader("from-snapshot", "restored").to_string(),
    );
    kube.wait_phase("from-snapshot", "Succeeded", 180).await;
    let logs = kube.logs("from-snapshot").await;
    assert!(logs.contains("payload: OK"), "{logs}");
    kube.delete_pod("from-snapshot").await;

    // ---- the node plugin's container killed as a crash while the writer writes
    let node_pod = kube_node_plugin_pod(&client).await;
    let before = restarts(&client, &node_pod).await;
    let container = container_id(&client, &node_pod).await;
    let out = Command::new("ctr")
        .args([
            "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", &container,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctr kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the kubelet restarts the node plugin", 180, || async {
        let pod: Api<Pod> = Api::namespaced(client.clone(), "rbd-provisioner");
        let p = pod.get(&node_pod).await.map_err(|e| e.to_string())?;
        let status = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let c = status.first().ok_or("no container status")?;
        if c.restart_count > before && c.ready {
            Ok(())
        } else {
            Err(format!("restarts {} ready {}", c.restart_count, c.ready))
        }
    })
    .await;
    // the writer keeps writing through the restart: ticks after it, no failed write
    let ticks_at = |logs: &str| logs.lines().filter(|l| l.starts_with("tick ")).count();
    let seen = ticks_at(&kube.logs("writer").await);
    wait_for(
        "the writer writes after the plugin's restart",
        60,
        || async {
            let logs = kube.logs("writer").await;
            assert!(!logs.contains("WRITE FAILED"), "{logs}");
            if ticks_at(&logs) >= seen + 5 {
                Ok(())
            } else {
                Err(logs)
            }
        },
    )
    .await;
    assert_eq!(kube.pod_phase("writer").await.unwrap(), "Running");
    // and a new pod mounts the staged volume through the new plugin
    cluster.kubectl(
        &["apply", "-f", "-"],
        &reader("after-restart", "data").to_string(),
    );
    kube.wait_phase("after-restart", "Succeeded", 180).await;
    let logs = kube.logs("after-restart").await;
    assert!(logs.contains("payload: OK"), "{logs}");
    kube.delete_pod("after-restart").await;

    // ---- a second node gets the Multi-Attach refusal of a ReadWriteOnce volume
    // (a Node object without a kubelet: the attach/detach controller decides before any kubelet)
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-2", "annotations":
                    {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut elsewhere = reader("elsewhere", "data");
    elsewhere["spec"]["nodeName"] = json!("node-2");
    cluster.kubectl(&["apply", "-f", "-"], &elsewhere.to_string());
    wait_for("Multi-Attach refused on node-2", 120, || async {
        let events = kube.events("elsewhere").await;
        if events.contains("Multi-Attach error") {
            Ok(())
        } else {
            Err(events)
        }
    })
    .await;
    let _ = kube
        .pods()
        .delete("elsewhere", &DeleteParams::default().grace_period(0))
        .await;
    let _ = nodes.delete("node-2", &DeleteParams::default()).await;

    // ---- everything deleted: nothing left (attachments, mounts, rbd-fuse, images)
    kube.delete_pod("writer").await;
    let _ = kube
        .pods()
        .delete("elsewhere", &DeleteParams::default().grace_period(0))
        .await;
    cluster.kubectl(
        &["delete", "volumesnapshot", "data-snap", "--wait=true"],
        "",
    );
    for name in ["restored", "data"] {
        kube.claims()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for volume in [&pv, &restored_pv] {
        kube.pv_deleted(volume).await;
    }
    wait_for("no VolumeAttachment left", 120, || async {
        let left = attachments
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        if left.items.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{:?}",
                left.items
                    .iter()
                    .map(|a| &a.metadata.name)
                    .collect::<Vec<_>>()
            ))
        }
    })
    .await;
    pool_emptied(ceph).await;
    for volume in [&pv, &restored_pv, &image, &restored_image] {
        let left = leftovers(volume);
        assert!(left.is_empty(), "left behind for {volume}: {left:#?}");
    }

    // ---- the Helm chart, installed in place of the kustomize objects, with the same two changes
    cluster.kubectl(&["delete", "--wait=true", "-f", "-"], &manifests);
    helm_install_serves_a_claim(&cluster, &kube, ceph).await;
    drop(cluster);
}

/// `helm install` of charts/rbd-provisioner into namespace `storage` (its example class and
/// snapshot class on), then a claim bound, written and read by a pod, and deleted with its image;
/// `helm uninstall` at the end.
async fn helm_install_serves_a_claim(
    cluster: &RealCluster,
    kube: &Kube,
    ceph: &micro_ceph::MicroCeph,
) {
    let out = Command::new(repo().join("scripts/go-tool.sh"))
        .arg("helm")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "go-tool.sh helm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let helm = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let values = json!({
        // the two changes of this cluster (see the kustomize objects above)
        "controller": {
            "replicas": 1,
            "hostNetwork": true,
            "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                         {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}],
        },
        "storageClass": {"create": true, "name": "rbd-helm",
                         "parameters": {"monitors": ceph.monitors, "pool": ceph.pool, "fsType": "xfs",
                                        "mounter": "fuse"}},
    });
    let file = cluster.dir.join("values.json");
    std::fs::write(&file, values.to_string()).unwrap();
    let helm_cmd = |args: &[&str]| {
        let out = Command::new(&helm)
            .args(args)
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("HELM_CACHE_HOME", cluster.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", cluster.dir.join("helm/config"))
            .env("HELM_DATA_HOME", cluster.dir.join("helm/data"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let chart = repo().join("charts/rbd-provisioner");
    helm_cmd(&[
        "install",
        "rbd",
        chart.to_str().unwrap(),
        "--namespace",
        "storage",
        "--create-namespace",
        "--values",
        file.to_str().unwrap(),
        "--wait",
        "--timeout",
        "5m",
    ]);
    kube.registered("the chart's node plugin registered (CSINode)")
        .await;
    let mut helm_claim = claim("helm-data", "1Gi", None);
    helm_claim["spec"]["storageClassName"] = json!("rbd-helm");
    cluster.kubectl(&["apply", "-f", "-"], &helm_claim.to_string());
    let pv = kube.bound("helm-data").await;
    cluster.kubectl(
        &["apply", "-f", "-"],
        &pod(
            "helm-pod",
            "echo through-the-chart > /data/f && sync && cat /data/f",
            &[("helm-data", "/data")],
            "Never",
        )
        .to_string(),
    );
    kube.wait_phase("helm-pod", "Succeeded", 180).await;
    let logs = kube.logs("helm-pod").await;
    assert!(logs.contains("through-the-chart"), "{logs}");
    kube.delete_pod("helm-pod").await;
    kube.claims()
        .delete("helm-data", &DeleteParams::default())
        .await
        .unwrap();
    kube.pv_deleted(&pv).await;
    pool_emptied(ceph).await;
    helm_cmd(&["uninstall", "rbd", "--namespace", "storage", "--wait"]);
}

/// Waits until the test cluster's pool holds no image.
async fn pool_emptied(ceph: &micro_ceph::MicroCeph) {
    wait_for("no image left in the pool", 120, || async {
        let images = ceph.rbd(&["ls", &ceph.pool]).map_err(|e| e.to_string())?;
        if images.trim().is_empty() {
            Ok(())
        } else {
            Err(images)
        }
    })
    .await;
}

/// The image of a CSI PV of our driver.
async fn image_of(client: &kube::Client, pv: &str) -> String {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(pv).await.unwrap();
    let csi = pv
        .spec
        .unwrap()
        .csi
        .expect("a CSI PV (the CSIDriver is installed)");
    assert_eq!(csi.driver, DRIVER);
    csi.volume_attributes.unwrap()["imageName"].clone()
}

async fn kube_node_plugin_pod(client: &kube::Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rbd-provisioner");
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=rbd-csi-node"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    list.items[0].metadata.name.clone().unwrap()
}

async fn container_status(
    client: &kube::Client,
    pod: &str,
) -> k8s_openapi::api::core::v1::ContainerStatus {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rbd-provisioner");
    pods.get(pod)
        .await
        .unwrap()
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .expect("the node plugin's container status")
}

async fn restarts(client: &kube::Client, pod: &str) -> i32 {
    container_status(client, pod).await.restart_count
}

/// The containerd id of the pod's container (`containerd://ID`).
async fn container_id(client: &kube::Client, pod: &str) -> String {
    let id = container_status(client, pod).await.container_id.unwrap();
    id.trim_start_matches("containerd://").to_owned()
}
