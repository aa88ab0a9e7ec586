//! The container images `scripts/image.sh` builds, started as a cluster starts them: each names
//! this version and the Ceph client it ships, the controller runs as non-root, the node image has
//! every program the node plugin calls, and the controller image binds and deletes a claim
//! against the emulated API and the test binary's micro-ceph (host network, as the manifests'
//! controller reaches an API server and the monitors).
//!
//! The images must exist (`scripts/image.sh`, as `scripts/test.sh` runs before this test). Where
//! they do not, the tests fail in CI (`CI` or `RBD_IMAGES_REQUIRED` set) and are skipped with a
//! message elsewhere. Containers start through `scripts/image.sh run` (podman, with this
//! machine's runtime settings).

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::api::DeleteParams;
use support::Harness;

const CONTROLLER: &str = "localhost/rbd-provisioner:latest";
const NODE: &str = "localhost/rbd-provisioner-node:latest";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Both images are there; otherwise `false` (skip) outside CI, a failure in CI.
fn images_present(test: &str) -> bool {
    let missing: Vec<&str> = [CONTROLLER, NODE]
        .into_iter()
        .filter(|image| {
            !Command::new("podman")
                .args(["image", "exists", image])
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{} not built (scripts/image.sh builds them; podman from scripts/install-deps.sh)",
        missing.join(" and ")
    );
    let required = ["CI", "RBD_IMAGES_REQUIRED"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    assert!(!required, "the container images are required here: {why}");
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// `scripts/image.sh run ARGS...`: a container on the host's network, removed at exit.
fn run(args: &[&str]) -> Output {
    let out = Command::new(repo().join("scripts/image.sh"))
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image.sh run {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The upstream Ceph release of the image's librados2 package (`16.2.11+ds-2` -> `16.2.11`).
fn packaged_ceph(image: &str) -> String {
    let out = run(&[
        "--entrypoint",
        "dpkg-query",
        image,
        "-W",
        "-f",
        "${Version}",
        "librados2",
    ]);
    let version = stdout(&out);
    let upstream = version.rsplit_once(':').map_or(version.as_str(), |v| v.1);
    upstream
        .split(['-', '+', '~'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn container_images_name_this_version_and_the_ceph_client_they_ship() {
    if !images_present("container_images_name_this_version_and_the_ceph_client_they_ship") {
        return;
    }
    for image in [CONTROLLER, NODE] {
        let ceph = packaged_ceph(image);
        assert!(
            ceph.split('.').count() == 3,
            "{image}: librados2 version {ceph:?}"
        );
        let version = stdout(&run(&[
            "--entrypoint",
            "/usr/bin/rbd-provisioner",
            image,
            "--version",
        ]));
        assert_eq!(
            version,
            format!(
                "rbd-provisioner {} (Ceph client {ceph})",
                env!("CARGO_PKG_VERSION")
            ),
            "{image}"
        );
    }
    // the controller's default user is not root; the node plugin's is (it maps and mounts)
    assert_eq!(
        stdout(&run(&[
            "--entrypoint",
            "sh",
            CONTROLLER,
            "-c",
            "id -u; id -g"
        ])),
        "65532\n65532"
    );
    assert_eq!(
        stdout(&run(&["--entrypoint", "id", NODE, "-u"])),
        "0",
        "node image user"
    );
    // the node image's entrypoint is the CSI plugin: its help names the node flags
    let help = stdout(&run(&[NODE, "--help"]));
    assert!(help.contains("--services"), "{help}");
    assert!(help.contains("--kubelet-endpoint"), "{help}");
}

#[test]
fn container_node_image_has_every_program_the_node_plugin_calls() {
    if !images_present("container_node_image_has_every_program_the_node_plugin_calls") {
        return;
    }
    // krbd (`rbd map`), rbd-nbd, rbd-fuse over a loop device, LUKS2, and the filesystems' tools
    let programs = [
        "rbd",
        "rbd-nbd",
        "rbd-fuse",
        "fusermount3",
        "losetup",
        "blkid",
        "cryptsetup",
        "mkfs.ext4",
        "mkfs.xfs",
        "e2fsck",
        "resize2fs",
        "xfs_growfs",
        "modprobe",
    ];
    let script = programs
        .iter()
        .map(|p| format!("command -v {p} >/dev/null || echo missing: {p}"))
        .collect::<Vec<_>>()
        .join("; ");
    let out = run(&["--entrypoint", "sh", NODE, "-c", &script]);
    assert_eq!(stdout(&out), "", "node image lacks programs");
    // the controller image carries none of the mappers
    let out = run(&[
        "--entrypoint",
        "sh",
        CONTROLLER,
        "-c",
        "command -v rbd rbd-nbd rbd-fuse cryptsetup || true",
    ]);
    assert_eq!(stdout(&out), "", "controller image has node tools");
}

/// A container started by `image.sh run --name NAME`; stopped (and so removed) on drop, its log
/// printed if the test panics.
struct Container {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Container {
    /// The container's main process id on this host, once it runs.
    fn host_pid(&self) -> Option<u32> {
        let out = Command::new("podman")
            .args(["inspect", "--format", "{{.State.Pid}}", &self.name])
            .output()
            .ok()?;
        stdout(&out).parse().ok().filter(|p| *p != 0)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["stop", "--time", "5", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- container {} log ----\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_controller_image_binds_and_deletes_a_claim() {
    if !images_present("container_controller_image_binds_and_deletes_a_claim") {
        return;
    }
    let h = Harness::start().await;
    let name = format!("rbd-provisioner-test-{:08x}", rand::random::<u32>());
    let log = h.dir.path().join("container.log");
    let file = std::fs::File::create(&log).unwrap();
    let mount = format!(
        "{}:/etc/rbd-provisioner/kubeconfig:ro",
        h.kubeconfig.display()
    );
    let child = Command::new(repo().join("scripts/image.sh"))
        .args([
            "run",
            "--name",
            &name,
            "-v",
            &mount,
            CONTROLLER,
            "--kubeconfig=/etc/rbd-provisioner/kubeconfig",
            "--leader-elect=false",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ])
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let container = Container { name, child, log };

    h.create_class("rbd", &h.params(), "Delete").await;
    h.create_claim("in-image", "rbd", "1Gi", false).await;
    let (claim, pv) = h.wait_bound("in-image").await;
    let image = Harness::image_name(&pv);
    let uid = claim.metadata.uid.clone().unwrap();
    assert_eq!(image, format!("kubernetes-dynamic-pvc-{uid}"));
    assert!(h.images().contains(&image), "{image} not in the pool");
    assert_eq!(h.image_size(&image), 1 << 30);
    assert_eq!(
        h.image_meta(&image, "provisioner.ceph.com/claim")
            .as_deref(),
        Some("default/in-image")
    );

    // the provisioner in the container runs as the image's non-root user
    let pid = container.host_pid().expect("container has no process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uid_line.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["65532"; 4],
        "{uid_line}"
    );

    h.claims()
        .delete("in-image", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    let end = Instant::now() + Duration::from_secs(30);
    while h.images().contains(&image) {
        assert!(Instant::now() < end, "{image} still in the pool");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(container);
}
