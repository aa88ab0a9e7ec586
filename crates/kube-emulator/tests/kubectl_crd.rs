//! The real kubectl against the `kube-emulator` binary with the snapshot CRDs: `kubectl apply`
//! of the CRDs, `kubectl wait --for condition=established`, `api-resources`, custom resources
//! created and re-applied (kubectl sends them as JSON and patches them with JSON merge
//! patches), printer columns, the 415 for a strategic merge patch, schema and CEL errors as
//! kubectl prints them, and `kubectl delete crd`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const KUBECTL: &str = "/usr/bin/kubectl";

/// The emulator process; killed on drop.
struct Server {
    child: Child,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        let child = Command::new(env!("CARGO_BIN_EXE_kube-emulator"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !kubeconfig.exists() {
            assert!(
                Instant::now() < deadline,
                "emulator did not write its kubeconfig"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child,
            kubeconfig,
            dir,
        }
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut cmd = Command::new(KUBECTL);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        cmd.env("KUBECTL_CACHE_DIR", self.dir.path().join("cache"));
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.kubectl(args, stdin);
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.kubectl(args, stdin);
        assert!(!ok, "kubectl {args:?} should fail:\n{out}\n{err}");
        err
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args, None)).unwrap()
    }
}

fn crd_dir() -> String {
    format!("{}/../../deploy/snapshot-crds", env!("CARGO_MANIFEST_DIR"))
}

const OBJECTS: &str = "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: csi-rbd
driver: rbd.example.com
deletionPolicy: Delete
parameters:
  pool: rbd
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: snap1
spec:
  volumeSnapshotClassName: csi-rbd
  source:
    persistentVolumeClaimName: data
";

#[test]
fn kubectl_applies_the_snapshot_crds_and_their_objects() {
    if !Path::new(KUBECTL).exists() {
        println!("SKIPPED: {KUBECTL} is not installed");
        return;
    }
    let srv = Server::start();
    let out = srv.ok(&["apply", "-k", &crd_dir()], None);
    for crd in [
        "volumesnapshotclasses",
        "volumesnapshotcontents",
        "volumesnapshots",
    ] {
        assert!(
            out.contains(&format!(
                "customresourcedefinition.apiextensions.k8s.io/{crd}.snapshot.storage.k8s.io created"
            )),
            "{out}"
        );
    }
    srv.ok(
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=10s",
            "crd/volumesnapshots.snapshot.storage.k8s.io",
        ],
        None,
    );
    let resources = srv.ok(
        &["api-resources", "--api-group=snapshot.storage.k8s.io"],
        None,
    );
    let vs_line = resources
        .lines()
        .find(|l| l.starts_with("volumesnapshots "))
        .unwrap_or_else(|| panic!("{resources}"));
    let cols: Vec<&str> = vs_line.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "volumesnapshots",
            "vs",
            "snapshot.storage.k8s.io/v1",
            "true",
            "VolumeSnapshot"
        ]
    );
    assert!(resources.contains("vsc,vscs"), "{resources}");

    // Objects: created, then unchanged on a second apply (JSON merge patch computed by kubectl).
    let out = srv.ok(&["apply", "-f", "-"], Some(OBJECTS));
    assert!(
        out.contains("volumesnapshotclass.snapshot.storage.k8s.io/csi-rbd created"),
        "{out}"
    );
    assert!(
        out.contains("volumesnapshot.snapshot.storage.k8s.io/snap1 created"),
        "{out}"
    );
    let out = srv.ok(&["apply", "-f", "-"], Some(OBJECTS));
    assert!(out.contains("snap1 unchanged"), "{out}");
    let changed = OBJECTS.replace("pool: rbd", "pool: fast");
    let out = srv.ok(&["apply", "-f", "-"], Some(&changed));
    assert!(out.contains("csi-rbd configured"), "{out}");
    let class = srv.json(&["get", "vsclass", "csi-rbd", "-o", "json"]);
    assert_eq!(class["parameters"]["pool"], "fast");
    assert_eq!(class["metadata"]["generation"], 2);

    // Printer columns from the CRD.
    let table = srv.ok(&["get", "vs"], None);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READYTOUSE",
            "SOURCEPVC",
            "SOURCESNAPSHOTCONTENT",
            "RESTORESIZE",
            "SNAPSHOTCLASS",
            "SNAPSHOTCONTENT",
            "CREATIONTIME",
            "AGE"
        ]
    );
    let row = table.lines().nth(1).unwrap();
    assert!(row.starts_with("snap1 "), "{table}");
    assert!(row.contains(" data "), "{table}");
    assert!(row.contains(" csi-rbd "), "{table}");
    let classes = srv.ok(&["get", "vsclass"], None);
    assert!(
        classes
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()[..3]
            == ["csi-rbd", "rbd.example.com", "Delete"],
        "{classes}"
    );

    // kubectl patch defaults to strategic merge, which custom resources do not take.
    let err = srv.fails(
        &[
            "patch",
            "vs",
            "snap1",
            "-p",
            r#"{"metadata":{"labels":{"a":"b"}}}"#,
        ],
        None,
    );
    assert!(
        err.contains("application/strategic-merge-patch+json is not supported by snapshot.storage.k8s.io/v1, Kind=VolumeSnapshot"),
        "{err}"
    );
    let out = srv.ok(
        &[
            "patch",
            "vs",
            "snap1",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"a":"b"}}}"#,
        ],
        None,
    );
    assert!(out.contains("snap1 patched"), "{out}");
    assert!(
        srv.ok(&["label", "vsclass", "csi-rbd", "tier=gold"], None)
            .contains("labeled")
    );
    let labels = srv.json(&["get", "vs", "snap1", "-o", "json"])["metadata"]["labels"].clone();
    assert_eq!(labels["a"], "b");

    // Validation errors as kubectl prints them.
    let err = srv.fails(
        &[
            "patch",
            "vs",
            "snap1",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"source":{"persistentVolumeClaimName":"other"}}}"#,
        ],
        None,
    );
    assert!(
        err.contains("The VolumeSnapshot \"snap1\" is invalid: spec.source.persistentVolumeClaimName: Invalid value: \"string\": persistentVolumeClaimName is immutable"),
        "{err}"
    );
    let err = srv.fails(
        &["create", "-f", "-"],
        Some(
            "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshotClass\nmetadata:\n  name: bad\ndeletionPolicy: Keep\n",
        ),
    );
    assert!(err.contains("driver: Required value"), "{err}");
    assert!(
        err.contains(
            "deletionPolicy: Unsupported value: \"Keep\": supported values: \"Delete\", \"Retain\""
        ),
        "{err}"
    );

    // The snapshot-controller slice runs in the binary: the claim does not exist.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let vs = srv.json(&["get", "vs", "snap1", "-o", "json"]);
        if vs["status"]["error"]["message"].is_string() {
            assert_eq!(
                vs["status"]["error"]["message"],
                "Failed to create snapshot content with error snapshot controller failed to update snap1 on API server: cannot get claim from snapshot"
            );
            assert_eq!(vs["status"]["readyToUse"], false);
            break;
        }
        assert!(Instant::now() < deadline, "no error status: {vs}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Deleting the CRD deletes its objects and stops serving it.
    let out = srv.ok(
        &["delete", "crd", "volumesnapshots.snapshot.storage.k8s.io"],
        None,
    );
    assert!(out.contains("deleted"), "{out}");
    let crds = srv.ok(&["get", "crd"], None);
    let header: Vec<&str> = crds.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "CREATED", "AT"], "{crds}");
    assert!(
        crds.contains("volumesnapshotclasses.snapshot.storage.k8s.io"),
        "{crds}"
    );
    assert!(!crds.contains("volumesnapshots."), "{crds}");
    let (ok, _, _) = srv.kubectl(
        &[
            "get",
            "--raw",
            "/apis/snapshot.storage.k8s.io/v1/volumesnapshots",
        ],
        None,
    );
    assert!(!ok);
    let resources = srv.ok(
        &[
            "api-resources",
            "--api-group=snapshot.storage.k8s.io",
            "--cached=false",
        ],
        None,
    );
    assert!(!resources.contains("volumesnapshots "), "{resources}");
    assert!(resources.contains("volumesnapshotclasses "), "{resources}");
}
