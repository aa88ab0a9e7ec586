//! The production data path on a real kernel: krbd (`rbd map`) and rbd-nbd volumes staged,
//! published, expanded, measured and torn down by this binary's CSI node service, inside a
//! virtual machine running Debian's kernel (this host's kernel may have no rbd, nbd or dm-crypt).
//!
//! `vm_suite` (run on the host by `cargo test`) boots one guest with `scripts/vm-run.sh` and runs
//! this same test binary in it with `--ignored`: the `guest_*` tests below, one micro-ceph
//! cluster on the guest's own 127.0.0.1, the node plugin (`rbd-provisioner csi
//! --services=node`) driven over its CSI socket by our gRPC client. The guest has no network
//! device, so nothing here reaches any address outside it. `vm_suite` checks that every
//! `guest_*` test ran and passed and prints the guest's output. Without qemu or the kernel
//! (`scripts/install-deps.sh` installs both) it fails in CI (`CI` set) and is skipped with a
//! message elsewhere. On the host the `guest_*` tests are ignored; run by hand outside a guest
//! (`--ignored`) they skip.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use rbd_csi::proto::csi::node_client::NodeClient;
use rbd_csi::proto::csi::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use rbd_csi::proto::csi::{
    CapacityRange, NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
    volume_usage,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// Set in the guest: the `guest_*` tests run only there.
const GUEST_ENV: &str = "RBD_VM_GUEST";

/// Every test the guest must run and pass.
const GUEST_TESTS: &[&str] = &[
    "guest_krbd_maps_on_a_msgr2_only_cluster_without_map_options",
    "guest_krbd_maps_on_a_msgr1_and_msgr2_cluster",
    "guest_map_options_reach_rbd_map_and_unmap",
    "guest_krbd_ext4_filesystem_round_trip_with_idempotent_repeats",
    "guest_krbd_xfs_filesystem_online_expansion",
    "guest_krbd_ext4_online_expansion",
    "guest_krbd_block_volume_round_trip",
    "guest_krbd_unstage_leaves_no_device_mount_or_watcher",
    "guest_krbd_a_volume_mapped_on_one_node_is_not_staged_read_write_on_another",
    "guest_a_krbd_writer_that_maps_a_source_under_its_snapshot_lock_writes_after_the_snapshot",
    "guest_nbd_filesystem_round_trip",
    "guest_nbd_block_volume_round_trip",
    "guest_rox_publish_is_read_only",
    "guest_rox_staging_mount_is_read_only",
    "guest_nbd_volume_keeps_working_across_a_node_plugin_restart",
    "guest_encrypted_krbd_filesystem_keeps_no_plaintext_on_the_image_and_grows",
    "guest_encrypted_nbd_block_volume_and_a_wrong_key_leaves_the_header_alone",
    "guest_encrypted_restore_and_clone_read_with_their_own_keys",
    "guest_secret_kms_volumes_stage_through_luks_and_a_changed_kek_leaves_the_header_alone",
];

/// Guest tests of behaviour the node does not have yet, with why: they run and their result is
/// reported loudly, but a failure does not fail `vm_suite` (a pass says to move them out).
const PENDING: &[(&str, &str)] = &[];

fn in_guest() -> bool {
    std::env::var_os(GUEST_ENV).is_some()
}

/// CI runs must not skip: `CI` (set by CI systems and `.ci/run`'s caller) or `RBD_VM_REQUIRED`.
fn required() -> bool {
    ["CI", "RBD_VM_REQUIRED"]
        .iter()
        .any(|k| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false"))
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A process group killed when dropped (the VM: vng and its qemu).
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            // SAFETY: kill(2) on the process group this test created.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.0.wait();
    }
}

#[test]
fn vm_suite() {
    if in_guest() {
        return;
    }
    let script = workspace().join("scripts/vm-run.sh");
    let check = Command::new(&script)
        .arg("--check")
        .output()
        .expect("running vm-run.sh --check");
    let why = String::from_utf8_lossy(&check.stderr).trim().to_owned();
    if check.status.code() == Some(77) {
        assert!(
            !required(),
            "the VM test bed is required in CI but cannot run: {why}"
        );
        eprintln!("SKIPPED vm_suite (not in CI): {why}");
        return;
    }
    assert!(check.status.success(), "vm-run.sh --check failed: {why}");
    let exe = std::env::current_exe().expect("test binary path");
    // RBD_VM_FILTER: only the guest tests whose names contain it (a developer's shortcut).
    let filter = std::env::var("RBD_VM_FILTER").unwrap_or_else(|_| "guest_".to_owned());
    let dir = tempfile::tempdir().expect("temp dir");
    let log_path = dir.path().join("guest.log");
    let log = std::fs::File::create(&log_path).expect("guest log");
    let started = Instant::now();
    // setsid: the VM gets its own process group, killed as a whole on timeout or panic.
    let child = Command::new("setsid")
        .arg(&script)
        .arg("--")
        // The kernel modules a node loads before its plugin starts (the DaemonSet's job).
        .args([
            "sh",
            "-c",
            "modprobe -a rbd nbd dm_crypt && exec \"$@\"",
            "sh",
        ])
        // TMO: micro-ceph.sh's start timeout; under emulation on a busy machine 60 s is short.
        .args([
            "env",
            &format!("{GUEST_ENV}=1"),
            "RUST_BACKTRACE=0",
            "TMO=300",
        ])
        .arg(&exe)
        .args(["--ignored", "--test-threads=1", &filter])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log fd"))
        .stderr(log)
        .spawn()
        .expect("starting the VM");
    let mut vm = Group(child);
    let limit = Duration::from_secs(
        std::env::var("RBD_VM_TIMEOUT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            // 17 guest tests took up to 20 minutes beside the release suites on a 2-core machine
            .unwrap_or(2100),
    );
    // When each guest test finished, from the moment its result line appeared.
    let mut timings: Vec<String> = Vec::new();
    let mut last = Duration::ZERO;
    let mut note = |output: &str, timings: &mut Vec<String>| {
        if timings.is_empty() && output.contains("\nrunning ") {
            let now = started.elapsed();
            timings.push(format!(
                "{:>6.1}s booted, test binary started",
                now.as_secs_f64()
            ));
            last = now;
        }
        let done = output
            .lines()
            .filter(|l| l.starts_with("test ") && l.contains(" ... ") && !l.ends_with("... "))
            .count();
        while !timings.is_empty() && timings.len() - 1 < done {
            let now = started.elapsed();
            let line = output
                .lines()
                .filter(|l| l.starts_with("test ") && l.contains(" ... "))
                .nth(timings.len() - 1)
                .unwrap_or_default();
            timings.push(format!(
                "{:>6.1}s (+{:>5.1}s) {line}",
                now.as_secs_f64(),
                (now - last).as_secs_f64()
            ));
            last = now;
        }
    };
    let status = loop {
        if let Some(status) = vm.0.try_wait().expect("waiting for the VM") {
            break Some(status);
        }
        if started.elapsed() > limit {
            break None;
        }
        note(
            &std::fs::read_to_string(&log_path).unwrap_or_default(),
            &mut timings,
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("{output}");
    println!("vm_suite: guest tests as they finished (time since the VM started):");
    for t in &timings {
        println!("  {t}");
    }
    println!("vm_suite: the VM ran {:.0?}", started.elapsed());
    let Some(status) = status else {
        panic!("the VM did not finish within {limit:?} (output above)");
    };
    let results: HashMap<&str, &str> = output
        .lines()
        .filter_map(|l| l.strip_prefix("test "))
        .filter_map(|l| l.split_once(" ... "))
        .map(|(name, result)| (name.trim(), result.trim()))
        .collect();
    let result = |t: &str| results.get(t).copied().unwrap_or("did not run");
    for (test, why) in PENDING.iter().filter(|(t, _)| t.contains(&filter)) {
        match result(test) {
            "ok" => println!("vm_suite: PENDING test {test} now passes: move it out of PENDING"),
            other => println!("vm_suite: PENDING test {test}: {other} ({why})"),
        }
    }
    let failed: Vec<String> = GUEST_TESTS
        .iter()
        .filter(|t| t.contains(&filter) && !PENDING.iter().any(|(p, _)| p == *t))
        .filter(|t| result(t) != "ok")
        .map(|t| format!("{t}: {}", result(t)))
        .collect();
    assert!(failed.is_empty(), "guest tests failed: {failed:#?}");
    // The guest's test binary exits non-zero when a pending test fails; anything else (no
    // result line at all, a crash) is caught above by the missing results.
    let pending_failed = PENDING
        .iter()
        .any(|(t, _)| t.contains(&filter) && result(t) != "ok");
    assert!(
        status.success() || pending_failed,
        "the guest exited with {status}"
    );
}

// ---------------------------------------------------------------------------------------------
// In the guest.

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Skips (with a message) outside the guest; runs `f` inside.
fn guest<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) {
    if !in_guest() {
        eprintln!("skipped: runs inside the VM (cargo test --test vm_kernel vm_suite)");
        return;
    }
    runtime().block_on(f());
}

/// A connection to the guest's micro-ceph as `client.admin`.
async fn admin_connection(cluster: &micro_ceph::MicroCeph) -> std::sync::Arc<ceph_rbd::Cluster> {
    ceph_rbd::ConnectionPool::default()
        .get(&ceph_rbd::ClusterConfig::new(
            &cluster.monitors,
            "admin",
            ceph_rbd::Secret::new(cluster.admin_key.clone()),
        ))
        .await
        .expect("connecting to micro-ceph")
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .expect("running sh");
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The node plugin of this binary, with its own socket and runtime directory, in a cgroup of
/// its own as in a container: everything it starts is in that cgroup too, unless moved out.
struct Plugin {
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<String>,
    cgroup: PathBuf,
}

impl Plugin {
    fn start(dir: &Path, args: &[&str]) -> Plugin {
        if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            sh("mount -t cgroup2 cgroup2 /sys/fs/cgroup");
        }
        let name = dir.file_name().expect("dir name").to_string_lossy();
        let cgroup = Path::new("/sys/fs/cgroup").join(format!("vm-test-{name}"));
        std::fs::create_dir_all(&cgroup).expect("plugin cgroup");
        let mut plugin = Plugin {
            child: None,
            dir: dir.to_path_buf(),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            cgroup,
        };
        plugin.spawn();
        plugin
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("csi.sock")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("node.log"))
            .expect("node log");
        // node ID vm-node unless the test names another
        let node_id = if self.args.iter().any(|a| a.starts_with("--node-id=")) {
            None
        } else {
            Some("--node-id=vm-node")
        };
        let child = Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .args(["csi", "--services=node"])
            .args(node_id)
            .arg(format!("--endpoint=unix://{}", self.socket().display()))
            .arg(format!("--runtime-dir={}", self.dir.join("run").display()))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting the node plugin");
        // Before any request: whatever it starts later is born in the cgroup.
        std::fs::write(self.cgroup.join("cgroup.procs"), child.id().to_string())
            .expect("moving the plugin into its cgroup");
        self.child = Some(child);
    }

    /// Stops the plugin as a container runtime stops the plugin's container when the pod is
    /// restarted: SIGTERM, and once it has exited, SIGKILL for everything left in its cgroup
    /// (`cgroup.kill`); then starts it again in the same cgroup.
    fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = i32::try_from(child.id()).expect("pid");
            // SAFETY: a signal to the child this test started.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().expect("wait").is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::fs::write(self.cgroup.join("cgroup.kill"), "1").expect("cgroup.kill");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(self.cgroup.join("cgroup.procs"))
            .unwrap_or_default()
            .trim()
            .is_empty()
        {
            assert!(
                Instant::now() < deadline,
                "the plugin's cgroup did not empty"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(self.socket());
        self.spawn();
    }

    async fn client(&self) -> NodeClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::UnixStream::connect(self.socket())
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the node plugin never listened: {}",
                std::fs::read_to_string(self.dir.join("node.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let path = self.socket();
        let channel = Endpoint::try_from("http://[::]:50051")
            .expect("endpoint")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .expect("connecting to the node plugin");
        NodeClient::new(channel)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Daemons it started stay until their volume's guard unmaps them; the empty cgroup goes.
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// One volume of a test: an image, its staging and target paths. Dropping it removes whatever
/// a failed test left (mounts, mappings, the image), so later tests start clean.
struct Volume<'a> {
    cluster: &'a micro_ceph::MicroCeph,
    /// In-process librados/librbd: creating and growing images without starting the `rbd` CLI,
    /// which costs seconds per start under emulation.
    rados: std::sync::Arc<ceph_rbd::Cluster>,
    image: String,
    dir: PathBuf,
    context: HashMap<String, String>,
    secrets: HashMap<String, String>,
    block: bool,
    fs_type: String,
    mode: Mode,
}

impl<'a> Volume<'a> {
    async fn new(name: &str, mounter: &str, size_mib: u64) -> Volume<'static> {
        let cluster = micro_ceph::cluster();
        Volume::on(cluster, &cluster.monitors, name, mounter, size_mib).await
    }

    async fn on(
        cluster: &'a micro_ceph::MicroCeph,
        monitors: &str,
        name: &str,
        mounter: &str,
        size_mib: u64,
    ) -> Volume<'a> {
        let dir = std::env::temp_dir().join(format!("vm-{name}"));
        std::fs::create_dir_all(&dir).expect("volume dir");
        let rados = admin_connection(cluster).await;
        rados
            .create_image(
                &cluster.pool,
                name,
                size_mib << 20,
                &ceph_rbd::CreateOptions::default(),
            )
            .await
            .expect("creating the image");
        let context = HashMap::from([
            ("monitors".to_owned(), monitors.to_owned()),
            ("pool".to_owned(), cluster.pool.clone()),
            ("imageName".to_owned(), name.to_owned()),
            ("mounter".to_owned(), mounter.to_owned()),
        ]);
        let secrets = HashMap::from([
            ("userID".to_owned(), "admin".to_owned()),
            ("userKey".to_owned(), cluster.admin_key.clone()),
        ]);
        Volume {
            cluster,
            rados,
            image: name.to_owned(),
            dir,
            context,
            secrets,
            block: false,
            fs_type: "ext4".to_owned(),
            mode: Mode::SingleNodeWriter,
        }
    }

    /// A volume of an image that exists already (a restore or a clone), staged like `of`.
    fn existing(of: &Volume<'a>, image: &str) -> Volume<'a> {
        let dir = std::env::temp_dir().join(format!("vm-{image}"));
        std::fs::create_dir_all(&dir).expect("volume dir");
        let mut context = of.context.clone();
        context.insert("imageName".to_owned(), image.to_owned());
        Volume {
            cluster: of.cluster,
            rados: of.rados.clone(),
            image: image.to_owned(),
            dir,
            context,
            secrets: of.secrets.clone(),
            block: of.block,
            fs_type: of.fs_type.clone(),
            mode: Mode::SingleNodeWriter,
        }
    }

    /// The same volume as another node stages it: staging and target paths of its own.
    fn elsewhere(&self, name: &str) -> Volume<'a> {
        let dir = std::env::temp_dir().join(format!("vm-{name}"));
        std::fs::create_dir_all(&dir).expect("volume dir");
        Volume {
            cluster: self.cluster,
            rados: self.rados.clone(),
            image: self.image.clone(),
            dir,
            context: self.context.clone(),
            secrets: self.secrets.clone(),
            block: self.block,
            fs_type: self.fs_type.clone(),
            mode: self.mode,
        }
    }

    fn id(&self) -> String {
        format!("vm-test-{}", self.image)
    }
    fn staging(&self) -> PathBuf {
        self.dir.join("staging")
    }
    fn target(&self) -> PathBuf {
        self.dir.join("pod/volume")
    }
    fn spec(&self) -> String {
        format!("{}/{}", self.cluster.pool, self.image)
    }

    fn capability(&self) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(if self.block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: self.fs_type.clone(),
                    ..Default::default()
                })
            }),
            access_mode: Some(AccessMode {
                mode: self.mode as i32,
            }),
        }
    }

    async fn stage(&self, node: &mut NodeClient<Channel>) -> Result<(), tonic::Status> {
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: self.id(),
            staging_target_path: self.staging().display().to_string(),
            volume_capability: Some(self.capability()),
            secrets: self.secrets.clone(),
            volume_context: self.context.clone(),
            ..Default::default()
        })
        .await
        .map(drop)
    }

    async fn publish(&self, node: &mut NodeClient<Channel>, readonly: bool) {
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: self.id(),
            staging_target_path: self.staging().display().to_string(),
            target_path: self.target().display().to_string(),
            volume_capability: Some(self.capability()),
            volume_context: self.context.clone(),
            readonly,
            ..Default::default()
        })
        .await
        .expect("NodePublishVolume");
    }

    async fn unpublish(&self, node: &mut NodeClient<Channel>) {
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: self.id(),
            target_path: self.target().display().to_string(),
        })
        .await
        .expect("NodeUnpublishVolume");
    }

    async fn unstage(&self, node: &mut NodeClient<Channel>) {
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: self.id(),
            staging_target_path: self.staging().display().to_string(),
        })
        .await
        .expect("NodeUnstageVolume");
    }

    /// Stage + publish (read-write unless `readonly`).
    async fn attach(&self, node: &mut NodeClient<Channel>, readonly: bool) {
        self.stage(node).await.expect("NodeStageVolume");
        self.publish(node, readonly).await;
    }

    async fn detach(&self, node: &mut NodeClient<Channel>) {
        self.unpublish(node).await;
        self.unstage(node).await;
    }

    /// The block device behind the staged volume (from /proc/mounts or the block target).
    fn device(&self) -> PathBuf {
        if self.block {
            let meta = std::fs::metadata(self.target()).expect("block target");
            assert!(meta.file_type().is_block_device());
            // the device whose rdev the target has
            let rdev = std::os::unix::fs::MetadataExt::rdev(&meta);
            for entry in std::fs::read_dir("/dev").expect("/dev").flatten() {
                let p = entry.path();
                if let Ok(m) = std::fs::metadata(&p)
                    && m.file_type().is_block_device()
                    && std::os::unix::fs::MetadataExt::rdev(&m) == rdev
                    && !p.starts_with("/dev/block")
                {
                    return p;
                }
            }
            panic!("no /dev node for the block target");
        }
        let staging = self.staging().display().to_string();
        let mounts = std::fs::read_to_string("/proc/mounts").expect("/proc/mounts");
        let source = mounts
            .lines()
            .filter_map(|l| {
                let mut f = l.split(' ');
                Some((f.next()?, f.next()?))
            })
            .find(|(_, target)| *target == staging)
            .map(|(source, _)| source.to_owned())
            .unwrap_or_else(|| panic!("{staging} is not mounted"));
        PathBuf::from(source)
    }

    fn watchers(&self) -> String {
        self.cluster
            .rbd(&["status", &self.spec()])
            .expect("rbd status")
    }
}

impl Drop for Volume<'_> {
    fn drop(&mut self) {
        let dir = self.dir.display().to_string();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let mut ours: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| m.starts_with(&dir))
            .collect();
        ours.sort_unstable_by(|a, b| b.cmp(a));
        for m in ours {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
        // Only what is still mapped is unmapped (each CLI start costs seconds under emulation).
        let spec = self.spec();
        for id in krbd_devices() {
            let name = std::fs::read_to_string(format!("/sys/bus/rbd/devices/{id}/name"));
            if name.is_ok_and(|n| n.trim() == self.image) {
                let _ = Command::new("rbd")
                    .args(["unmap", "-o", "force", &format!("/dev/rbd{id}")])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let nbd_in_use = std::fs::read_dir("/sys/block").is_ok_and(|d| {
            d.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("nbd") && e.path().join("pid").exists()
            })
        });
        if nbd_in_use {
            let _ = Command::new("rbd-nbd")
                .args(["unmap", &spec])
                .stderr(Stdio::null())
                .status();
        }
        // The image stays: the guest's cluster, like everything else in the guest, is gone
        // when the VM stops.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn mounted(path: &Path) -> bool {
    let p = path.display().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(p.as_str()))
}

fn krbd_devices() -> Vec<String> {
    std::fs::read_dir("/sys/bus/rbd/devices")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Writes `data` at the start of a block device (O_DIRECT-free, then fsync).
fn write_block(path: &Path, data: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open block target");
    f.write_all(data).expect("write block");
    f.sync_all().expect("fsync block");
}

fn read_block(path: &Path, len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0; len];
    std::fs::File::open(path)
        .expect("open block target")
        .read_exact(&mut buf)
        .expect("read block");
    buf
}

fn plugin_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vm-plugin-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("plugin dir");
    dir
}

async fn stats(node: &mut NodeClient<Channel>, vol: &Volume<'_>) -> (i64, i64) {
    let resp = node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: vol.id(),
            volume_path: vol.target().display().to_string(),
            staging_target_path: vol.staging().display().to_string(),
        })
        .await
        .expect("NodeGetVolumeStats")
        .into_inner();
    let bytes = resp
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes usage");
    (bytes.total, bytes.used)
}

async fn expand(node: &mut NodeClient<Channel>, vol: &Volume<'_>, mib: u64) {
    vol.rados
        .resize_image(&vol.cluster.pool, &vol.image, mib << 20, false)
        .await
        .expect("growing the image");
    node.node_expand_volume(NodeExpandVolumeRequest {
        volume_id: vol.id(),
        volume_path: vol.target().display().to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: i64::try_from(mib << 20).expect("size"),
            limit_bytes: 0,
        }),
        staging_target_path: vol.staging().display().to_string(),
        volume_capability: Some(vol.capability()),
        ..Default::default()
    })
    .await
    .expect("NodeExpandVolume");
}

/// A filesystem volume round trip: write, detach, attach again, read back; with every call
/// repeated (idempotence) and stats on the real mount.
async fn filesystem_round_trip(
    vol: &Volume<'_>,
    node: &mut NodeClient<Channel>,
    device_prefix: &str,
) {
    vol.attach(node, false).await;
    let device = vol.device();
    assert!(
        device.display().to_string().starts_with(device_prefix),
        "staged on {} (expected {device_prefix}*)",
        device.display()
    );
    // repeats of stage and publish succeed and change nothing
    vol.stage(node).await.expect("repeated NodeStageVolume");
    vol.publish(node, false).await;
    assert_eq!(vol.device(), device, "a repeated stage mapped again");
    write_file(&vol.target().join("data"), b"written through the kernel").expect("write");
    let (total, used) = stats(node, vol).await;
    assert!(
        total > 40 << 20 && total <= 64 << 20 && used > 0,
        "stats of a 64 MiB volume: total {total}, used {used}"
    );
    vol.unpublish(node).await;
    vol.unpublish(node).await; // repeat
    vol.unstage(node).await;
    vol.unstage(node).await; // repeat
    assert!(!mounted(&vol.staging()) && !mounted(&vol.target()));
    vol.attach(node, false).await;
    assert_eq!(
        std::fs::read(vol.target().join("data")).expect("read back"),
        b"written through the kernel"
    );
    vol.detach(node).await;
}

async fn block_round_trip(vol: &Volume<'_>, node: &mut NodeClient<Channel>, device_prefix: &str) {
    vol.attach(node, false).await;
    assert!(
        vol.device()
            .display()
            .to_string()
            .starts_with(device_prefix)
    );
    vol.stage(node).await.expect("repeated NodeStageVolume");
    vol.publish(node, false).await;
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    write_block(&vol.target(), &pattern);
    vol.detach(node).await;
    vol.unpublish(node).await;
    vol.unstage(node).await;
    vol.attach(node, false).await;
    assert_eq!(read_block(&vol.target(), pattern.len()), pattern);
    vol.detach(node).await;
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_maps_on_a_msgr2_only_cluster_without_map_options() {
    guest(|| async {
        // micro-ceph speaks msgr2 only; its monitors are a bare 127.0.0.1:PORT, which `rbd map`
        // reads as msgr2: without ms_mode it fails with "possible ms_mode mismatch".
        let plugin = Plugin::start(&plugin_dir("msgr2"), &["--default-mounter=rbd"]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("msgr2-only", "krbd", 64).await;
        vol.block = true;
        vol.stage(&mut node)
            .await
            .unwrap_or_else(|e| panic!("krbd stage on a msgr2-only cluster: {}", e.message()));
        assert_eq!(krbd_devices().len(), 1, "one /dev/rbd device");
        vol.unstage(&mut node).await;
        assert!(krbd_devices().is_empty());
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_maps_on_a_msgr1_and_msgr2_cluster() {
    guest(|| async {
        let cluster =
            micro_ceph::MicroCeph::start_with(&[("MSGR1", "1")]).expect("msgr1+msgr2 cluster");
        let v1 = cluster.monitors_v1.clone().expect("the msgr1 address");
        let plugin = Plugin::start(&plugin_dir("dual"), &[]);
        let mut node = plugin.client().await;
        // Through its msgr2 address (ms_mode=prefer-crc chosen) and its msgr1 address (no
        // ms_mode: the kernel's legacy msgr1), each a filesystem written and read back.
        for (name, monitors) in [
            ("dual-v2", cluster.monitors.as_str()),
            ("dual-v1", v1.as_str()),
        ] {
            let vol = Volume::on(&cluster, monitors, name, "krbd", 64).await;
            vol.attach(&mut node, false).await;
            write_file(&vol.target().join("f"), name.as_bytes()).expect("write");
            vol.detach(&mut node).await;
            vol.attach(&mut node, false).await;
            assert_eq!(
                std::fs::read(vol.target().join("f")).expect("read"),
                name.as_bytes()
            );
            vol.detach(&mut node).await;
        }
        assert!(krbd_devices().is_empty());
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_map_options_reach_rbd_map_and_unmap() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("options"), &["--krbd-map-options=noudev"]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("options", "krbd", 64).await;
        vol.block = true;
        // The class's ms_mode wins over the default: legacy cannot reach msgr2-only monitors.
        vol.context.insert(
            "mapOptions".into(),
            "krbd:ms_mode=legacy;nbd:try-netlink".into(),
        );
        let err = vol
            .stage(&mut node)
            .await
            .expect_err("legacy on msgr2-only");
        assert!(
            err.message().contains("ms_mode"),
            "the map error names ms_mode: {}",
            err.message()
        );
        assert!(krbd_devices().is_empty());
        // secure (msgr2 with encryption) maps; unmapOptions force is passed to rbd unmap
        vol.context.insert(
            "mapOptions".into(),
            "krbd:ms_mode=secure,queue_depth=32".into(),
        );
        vol.context
            .insert("unmapOptions".into(), "krbd:force".into());
        vol.stage(&mut node)
            .await
            .expect("stage with ms_mode=secure");
        let devs = krbd_devices();
        assert_eq!(devs.len(), 1);
        let nr = std::fs::read_to_string(format!("/sys/block/rbd{}/queue/nr_requests", devs[0]))
            .expect("nr_requests");
        assert_eq!(nr.trim(), "32", "queue_depth=32 reached the kernel");
        vol.unstage(&mut node).await;
        assert!(krbd_devices().is_empty());
        // a malformed option is refused by the node too, naming it
        vol.context
            .insert("mapOptions".into(), "krbd:secret=x".into());
        let err = vol.stage(&mut node).await.expect_err("secret option");
        assert!(
            err.message().contains("volume_context.mapOptions"),
            "{}",
            err.message()
        );
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_ext4_filesystem_round_trip_with_idempotent_repeats() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("krbd-ext4"), &[]);
        let mut node = plugin.client().await;
        let vol = Volume::new("krbd-ext4", "krbd", 64).await;
        filesystem_round_trip(&vol, &mut node, "/dev/rbd").await;
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_xfs_filesystem_online_expansion() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("krbd-xfs"), &[]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("krbd-xfs", "krbd", 320).await;
        vol.fs_type = "xfs".into();
        vol.attach(&mut node, false).await;
        write_file(&vol.target().join("before"), b"x").expect("write");
        let (before, _) = stats(&mut node, &vol).await;
        expand(&mut node, &vol, 640).await;
        let (after, _) = stats(&mut node, &vol).await;
        assert!(
            after > before + (250 << 20),
            "xfs grew online: {before} -> {after}"
        );
        write_file(&vol.target().join("after"), b"y").expect("write after growing");
        vol.detach(&mut node).await;
        assert!(krbd_devices().is_empty());
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_ext4_online_expansion() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("krbd-ext4-grow"), &[]);
        let mut node = plugin.client().await;
        let vol = Volume::new("krbd-ext4-grow", "krbd", 64).await;
        vol.attach(&mut node, false).await;
        let (before, _) = stats(&mut node, &vol).await;
        expand(&mut node, &vol, 128).await;
        let (after, _) = stats(&mut node, &vol).await;
        assert!(
            after > before + (50 << 20),
            "ext4 grew online: {before} -> {after}"
        );
        vol.detach(&mut node).await;
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_block_volume_round_trip() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("krbd-block"), &[]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("krbd-block", "krbd", 64).await;
        vol.block = true;
        block_round_trip(&vol, &mut node, "/dev/rbd").await;
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_unstage_leaves_no_device_mount_or_watcher() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("krbd-clean"), &[]);
        let mut node = plugin.client().await;
        let vol = Volume::new("krbd-clean", "krbd", 64).await;
        vol.attach(&mut node, false).await;
        let device = vol.device();
        let name = device
            .file_name()
            .expect("device name")
            .to_string_lossy()
            .into_owned();
        assert!(vol.watchers().contains("watcher="), "mapped: a watcher");
        vol.detach(&mut node).await;
        assert!(
            !mounted(&vol.staging()) && !mounted(&vol.target()),
            "still mounted"
        );
        assert!(
            krbd_devices().is_empty(),
            "rbd devices left: {:?}",
            krbd_devices()
        );
        assert!(!device.exists(), "{} still exists", device.display());
        assert!(
            !Path::new(&format!("/sys/block/{name}")).exists(),
            "/sys/block/{name} (and its holders) still there"
        );
        let dm = sh("ls /sys/block | grep -c '^dm-' || true");
        assert_eq!(dm.trim(), "0", "a device-mapper holder was left");
        assert!(
            vol.watchers().contains("none"),
            "a watcher is left on the image: {}",
            vol.watchers()
        );
    });
}

/// One writer per volume on the kernel data path: a volume staged read-write with krbd on node
/// vm-node (no attachment recorded: `attachRequired: false`) is recorded with the kernel client
/// of its mapping (sysfs `client_id`), and a second node plugin (vm-node-b, same host, so
/// behind the same address) is refused while that mapping exists and stages it once it is gone;
/// a read-only stage on the first node does not reuse its read-write device.
#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_krbd_a_volume_mapped_on_one_node_is_not_staged_read_write_on_another() {
    guest(|| async {
        let a = Plugin::start(&plugin_dir("krbd-writer-a"), &[]);
        let b = Plugin::start(&plugin_dir("krbd-writer-b"), &["--node-id=vm-node-b"]);
        let (mut on_a, mut on_b) = (a.client().await, b.client().await);
        let vol = Volume::new("krbd-one-writer", "krbd", 64).await;
        vol.stage(&mut on_a)
            .await
            .expect("NodeStageVolume on vm-node");
        let device = std::fs::read_to_string("/proc/mounts")
            .expect("mounts")
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(vol.staging().to_str().expect("path")))
            .and_then(|l| l.split(' ').next().map(str::to_owned))
            .expect("the staging mount");
        let id = device.trim_start_matches("/dev/rbd");
        let kernel_client = std::fs::read_to_string(format!("/sys/bus/rbd/devices/{id}/client_id"))
            .expect("sysfs client_id");
        let record = vol
            .rados
            .metadata_get(
                &vol.cluster.pool,
                &vol.image,
                "provisioner.ceph.com/staged-by",
            )
            .await
            .expect("image metadata")
            .expect("a staged-by record");
        let record: serde_json::Value = serde_json::from_str(&record).expect("JSON");
        assert_eq!(record["node"], "vm-node", "{record}");
        assert_eq!(
            format!("client{}", record["client"]),
            kernel_client.trim(),
            "{record}"
        );
        assert!(
            record["address"].as_str().is_some_and(|a| a.contains('/')),
            "{record}"
        );

        let other = vol.elsewhere("krbd-one-writer-b");
        let err = other
            .stage(&mut on_b)
            .await
            .expect_err("staged on vm-node-b too");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert!(
            err.message().contains("staged read-write on node vm-node ")
                && err.message().contains("mapping is still there"),
            "{}",
            err.message()
        );
        assert!(!mounted(&other.staging()), "mounted on vm-node-b");
        assert_eq!(
            krbd_devices().len(),
            1,
            "a second mapping: {:?}",
            krbd_devices()
        );

        vol.unstage(&mut on_a).await;
        other
            .stage(&mut on_b)
            .await
            .expect("NodeStageVolume on vm-node-b once vm-node let go");
        other.unstage(&mut on_b).await;
        assert!(krbd_devices().is_empty(), "{:?}", krbd_devices());
    });
}

/// A snapshot's point in time against a kernel writer: the temporary snapshot of a source that
/// nobody had open is taken without librbd, under the source's exclusive lock. A krbd client
/// that maps the source after the watcher probe, while the lock is held (the steps hook pauses
/// there), and writes as soon as it can, must write after the snapshot, with the new snapshot
/// context: its marker is then in the source's head and not in the clone made from the
/// snapshot.
#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_a_krbd_writer_that_maps_a_source_under_its_snapshot_lock_writes_after_the_snapshot() {
    if !in_guest() {
        eprintln!("skipped: runs inside the VM (cargo test --test vm_kernel vm_suite)");
        return;
    }
    // several threads: the clone runs while this test waits on the writer
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        use std::sync::{Arc, Mutex, mpsc};
        const MARKER: &[u8] = b"written-by-krbd-after-the-snapshot";
        let cluster = micro_ceph::cluster();
        let rados = admin_connection(cluster).await;
        let (pool, source, clone) = (cluster.pool.clone(), "pit-krbd-src", "pit-krbd-clone");
        rados
            .create_image(&pool, source, 16 << 20, &ceph_rbd::CreateOptions::default())
            .await
            .expect("creating the source");
        let spec = format!("{pool}/{source}");

        let (at_tx, at_rx) = mpsc::channel::<&'static str>();
        let (resume_tx, resume_rx) = mpsc::channel::<()>();
        let resume_rx = Mutex::new(resume_rx);
        let paused = spec.clone();
        let _hook = ceph_rbd::steps::install(Arc::new(move |step, target| {
            if target.starts_with(&paused)
                && (step == ceph_rbd::steps::SNAPSHOT_LOCKED
                    || step == ceph_rbd::steps::SNAPSHOT_UNLOCKED)
            {
                at_tx.send(step).expect("the test listens");
                resume_rx
                    .lock()
                    .expect("one hook at a time")
                    .recv_timeout(Duration::from_secs(300))
                    .expect("the test resumes the snapshot");
            }
        }));
        let job = ceph_rbd::CloneJob {
            parent_pool: pool.clone(),
            parent: source.to_owned(),
            snap: "pit-temporary".to_owned(),
            temporary: true,
            pool: pool.clone(),
            image: clone.to_owned(),
            options: ceph_rbd::CreateOptions::default(),
            snapshot: None,
        };
        let cloning = {
            let rados = rados.clone();
            tokio::spawn(async move {
                rados
                    .clone_recorded(job, |_| ceph_rbd::CloneRecord::default())
                    .await
            })
        };
        let writer_spec = spec.clone();
        let device = tokio::task::spawn_blocking(move || {
            let wait = Duration::from_secs(300);
            assert_eq!(
                at_rx
                    .recv_timeout(wait)
                    .expect("the snapshot locks the source"),
                ceph_rbd::steps::SNAPSHOT_LOCKED
            );
            // A krbd client maps the source now, after the fast path's watcher probe, while its
            // lock is held, and writes as soon as it has the device. (krbd's map itself waits
            // while the lock is held: seen here, a map started under the paused lock finished
            // only once it was released.)
            let conf = cluster.conf_path.display().to_string();
            let (mapped_tx, mapped) = mpsc::channel();
            let (written_tx, written) = mpsc::channel();
            {
                let (conf, spec) = (conf.clone(), writer_spec.clone());
                std::thread::spawn(move || {
                    let device = sh(&format!(
                        "timeout 600 rbd -c {conf} map -o ms_mode=prefer-crc {spec}"
                    ))
                    .trim()
                    .to_owned();
                    let _ = mapped_tx.send(device.clone());
                    let mut block = vec![0u8; 4096];
                    block[..MARKER.len()].copy_from_slice(MARKER);
                    write_block(Path::new(&device), &block);
                    let _ = written_tx.send(());
                });
            }
            resume_tx.send(()).expect("resume after the lock");
            assert_eq!(
                at_rx.recv_timeout(wait).expect("the snapshot unlocks"),
                ceph_rbd::steps::SNAPSHOT_UNLOCKED
            );
            resume_tx.send(()).expect("resume after the unlock");
            let device = mapped.recv_timeout(wait).expect("rbd map finishes");
            assert!(device.starts_with("/dev/rbd"), "rbd map: {device:?}");
            if written.recv_timeout(wait).is_err() {
                panic!(
                    "the krbd write did not finish: {} {} {}",
                    sh(&format!("rbd -c {conf} status {writer_spec} 2>&1")),
                    sh(&format!("rbd -c {conf} lock ls {writer_spec} 2>&1")),
                    sh("dmesg | tail -n 30")
                );
            }
            device
        })
        .await
        .expect("the writer side");
        tokio::time::timeout(Duration::from_secs(300), cloning)
            .await
            .expect("the clone finishes")
            .expect("the clone task")
            .expect("the clone from the temporary snapshot");
        cluster.rbd(&["unmap", &device]).expect("rbd unmap");

        let read = |image: &str| {
            let file = std::env::temp_dir().join(format!("{image}.export"));
            let _ = std::fs::remove_file(&file);
            cluster
                .rbd(&[
                    "export",
                    "--no-progress",
                    &format!("{pool}/{image}"),
                    file.to_str().expect("path"),
                ])
                .expect("rbd export");
            let bytes = std::fs::read(&file).expect("the export");
            let _ = std::fs::remove_file(&file);
            bytes[..MARKER.len()].to_vec()
        };
        assert_eq!(read(source), MARKER, "the head has the krbd write");
        assert_ne!(
            read(clone),
            MARKER,
            "the krbd write made after the snapshot is in it"
        );
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn vm_slow_krbd_maps_a_source_after_more_snapshots_of_it_than_krbd_maps() {
    guest(|| async {
        use rbd_volume::snapshot_limit::{
            HIGHEST_MAX_SNAPSHOTS_ON_IMAGE, KRBD_MAX_SNAPSHOTS, SnapshotLimits, set_snapshot_limits,
        };
        // The highest limits an operator may set (the defaults are lower), so that only the
        // last requests cost a flatten (seconds each under emulation). Not min = max: then the
        // first request past it flattens every snapshot image and is refused (ceph-csi's rule).
        let limits = SnapshotLimits::new(
            HIGHEST_MAX_SNAPSHOTS_ON_IMAGE,
            HIGHEST_MAX_SNAPSHOTS_ON_IMAGE - 1,
        )
        .expect("limits");
        set_snapshot_limits(limits);
        let cluster = micro_ceph::cluster();
        let rados = admin_connection(cluster).await;
        let (pool, source) = (cluster.pool.clone(), "many-snaps-src");
        rados
            .create_image(&pool, source, 4 << 20, &ceph_rbd::CreateOptions::default())
            .await
            .expect("creating the source");
        let spec = format!("{pool}/{source}");
        let conf = cluster.conf_path.display().to_string();
        // more snapshot requests than krbd maps snapshots, each through the volume core, four
        // at a time (the count and the temporary snapshot are taken one request at a time)
        let requests = KRBD_MAX_SNAPSHOTS as usize + 10;
        let started = Instant::now();
        let mut images = Vec::with_capacity(requests);
        let mut next = 0;
        let mut running = tokio::task::JoinSet::new();
        while next < requests || !running.is_empty() {
            while next < requests && running.len() < 4 {
                let (rados, pool, spec) = (rados.clone(), pool.clone(), spec.clone());
                let name = format!("many-snaps-{next}");
                running.spawn(async move {
                    let image = rbd_volume::snapshot::snapshot_image_name(&name);
                    rbd_volume::create_snapshot(
                        &rados,
                        &rbd_volume::NewSnapshot {
                            pool: &pool,
                            source_image: source,
                            image: &image,
                            owner: &rbd_volume::SnapshotOwner {
                                name,
                                source: format!("vm-test {spec}"),
                                driver: "vm-test".to_owned(),
                                kube_cluster: String::new(),
                            },
                        },
                    )
                    .await
                    .map(|_| image)
                });
                next += 1;
            }
            match running.join_next().await {
                Some(Ok(Ok(image))) => {
                    images.push(image);
                    if images.len() % 50 == 0 {
                        // straight to stderr (not captured): the guest log shows the pace
                        let _ = writeln!(
                            std::io::stderr(),
                            "{} of {requests} snapshots after {:?}",
                            images.len(),
                            started.elapsed()
                        );
                    }
                }
                Some(Ok(Err(e))) => panic!("a snapshot of {spec}: {e}"),
                Some(Err(e)) => panic!("a snapshot task: {e}"),
                None => {}
            }
        }
        let on_source: Vec<serde_json::Value> = serde_json::from_str(
            &cluster
                .rbd(&["snap", "ls", "--all", "--format", "json", &spec])
                .expect("rbd snap ls"),
        )
        .expect("rbd snap ls json");
        eprintln!(
            "{requests} snapshots in {:?}: {} snapshots on the source",
            started.elapsed(),
            on_source.len()
        );
        assert!(
            on_source.len() <= limits.min as usize + 1,
            "{} snapshots on the source after {requests} snapshots (limits {limits:?})",
            on_source.len()
        );
        // krbd maps it and writes through it
        let device = sh(&format!("rbd -c {conf} map -o ms_mode=prefer-crc {spec}"))
            .trim()
            .to_owned();
        assert!(device.starts_with("/dev/rbd"), "rbd map: {device:?}");
        let mut block = vec![0u8; 4096];
        block[..8].copy_from_slice(b"mapped!!");
        write_block(Path::new(&device), &block);
        cluster.rbd(&["unmap", &device]).expect("rbd unmap");
        for image in &images {
            rbd_volume::delete_snapshot(&rados, &pool, image)
                .await
                .unwrap_or_else(|e| panic!("deleting {image}: {e}"));
        }
        rados
            .remove_image(&pool, source)
            .await
            .expect("removing the source");
    });
}

/// The node's reclaim of a staged filesystem (what a ReclaimSpaceJob asks the node plugin for:
/// FITRIM where the volume is staged, by the node service's own code on the plugin's staging
/// record): 64 MiB written and deleted leave RADOS through krbd and through rbd-nbd (the
/// image's used size, as `rbd du --exact` counts it, drops by at least 56 MiB), and the file
/// kept reads back unchanged.
#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_trim_gives_deleted_space_back_through_krbd_and_rbd_nbd() {
    guest(|| async {
        for (name, mounter) in [("trim-krbd", "krbd"), ("trim-nbd", "rbd-nbd")] {
            let plugin = Plugin::start(&plugin_dir(name), &[]);
            let mut node = plugin.client().await;
            let vol = Volume::new(name, mounter, 256).await;
            vol.attach(&mut node, false).await;
            let kept: Vec<u8> = (0..1u32 << 20)
                .map(|i| u8::try_from(i % 251).expect("byte"))
                .collect();
            write_file(&vol.target().join("kept"), &kept).expect("write kept");
            write_file(&vol.target().join("big"), &vec![0x5a; 64 << 20]).expect("write big");
            std::fs::remove_file(vol.target().join("big")).expect("delete big");
            sh(&format!("sync -f {}", vol.target().display()));
            // as `rbd du --exact` counts: krbd truncates or zeroes the parts of objects a freed
            // range covers rather than removing them, which a whole-object count would not show
            let used = || async {
                vol.rados
                    .used_bytes_exact(&vol.cluster.pool, &vol.image)
                    .await
                    .expect("used size")
            };
            let before = used().await;
            assert!(before >= 64 << 20, "{mounter}: 64 MiB written: {before}");

            let runtime = tempfile::tempdir().expect("runtime dir");
            let service = rbd_csi::node::NodeService::new(
                rbd_csi::CsiConfig {
                    runtime_dir: runtime.path().to_path_buf(),
                    ..Default::default()
                }
                .node_config(),
            );
            let done = service
                .reclaim_space(&vol.id(), &vol.staging())
                .await
                .expect("reclaim on the node");

            let rbd_csi::node::reclaim::NodeReclaimed::Trimmed {
                bytes,
                reaches_rados,
            } = done
            else {
                panic!("{mounter}: expected a trim, got {done:?}");
            };
            assert!(reaches_rados, "{mounter} passes discards on");
            assert!(
                bytes >= 64 << 20,
                "{mounter}: the filesystem discarded {bytes}"
            );
            let after = used().await;
            assert!(
                before.saturating_sub(after) >= 56 << 20,
                "{mounter}: used size {before} -> {after} (the filesystem trimmed {bytes})"
            );
            assert_eq!(
                std::fs::read(vol.target().join("kept")).expect("read kept"),
                kept,
                "{mounter}: the file kept reads back unchanged"
            );
            vol.detach(&mut node).await;
        }
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_nbd_filesystem_round_trip() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("nbd-ext4"), &[]);
        let mut node = plugin.client().await;
        let vol = Volume::new("nbd-ext4", "rbd-nbd", 64).await;
        filesystem_round_trip(&vol, &mut node, "/dev/nbd").await;
        assert!(vol.watchers().contains("none"), "{}", vol.watchers());
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_nbd_block_volume_round_trip() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("nbd-block"), &[]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("nbd-block", "rbd-nbd", 64).await;
        vol.block = true;
        block_round_trip(&vol, &mut node, "/dev/nbd").await;
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_rox_publish_is_read_only() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("rox"), &[]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("rox", "krbd", 64).await;
        // a filesystem with a file, made by a writer
        vol.attach(&mut node, false).await;
        write_file(&vol.target().join("seed"), b"seed").expect("write");
        vol.detach(&mut node).await;
        // then staged and published for readers only
        vol.mode = Mode::MultiNodeReaderOnly;
        vol.attach(&mut node, true).await;
        assert_eq!(
            std::fs::read(vol.target().join("seed")).expect("read"),
            b"seed"
        );
        let err = write_file(&vol.target().join("new"), b"no").expect_err("write on ROX");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        vol.detach(&mut node).await;
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_rox_staging_mount_is_read_only() {
    guest(|| async {
        let plugin = Plugin::start(&plugin_dir("rox-staging"), &[]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("rox-staging", "krbd", 64).await;
        vol.attach(&mut node, false).await;
        vol.detach(&mut node).await;
        // Staged for readers only: nothing on the node may write the shared filesystem, the
        // staging mount included (a read-write mount replays and writes the journal).
        vol.mode = Mode::MultiNodeReaderOnly;
        vol.stage(&mut node).await.expect("NodeStageVolume (ROX)");
        let result = write_file(&vol.staging().join("new"), b"no");
        vol.unstage(&mut node).await;
        let err = result.expect_err("a write on the ROX staging mount succeeded");
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EROFS),
            "staging mount: {err}"
        );
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_nbd_volume_keeps_working_across_a_node_plugin_restart() {
    guest(|| async {
        // as deploy/csi/node.yaml runs it: the rbd-nbd daemons in a cgroup of their own
        let mut plugin = Plugin::start(
            &plugin_dir("nbd-restart"),
            &["--daemon-cgroup=/sys/fs/cgroup/vm-test-daemons"],
        );
        let mut node = plugin.client().await;
        let vol = Volume::new("nbd-restart", "rbd-nbd", 64).await;
        vol.attach(&mut node, false).await;
        write_file(&vol.target().join("before"), b"before").expect("write");
        plugin.restart();
        let mut node = plugin.client().await;
        // the published volume still takes writes that reach the image
        write_file(&vol.target().join("after"), b"after restart")
            .expect("write after the plugin restarted");
        sh("sync");
        vol.detach(&mut node).await;
        vol.attach(&mut node, false).await;
        assert_eq!(
            std::fs::read(vol.target().join("after")).expect("read back"),
            b"after restart"
        );
        vol.detach(&mut node).await;
    });
}

// ---------------------------------------------------------------------------------------------
// Encrypted volumes (LUKS2 on the mapped device, the key from a KMS entry).

/// A KMS configuration in ceph-csi's format with one `metadata` entry, `plain`.
fn kms_config(dir: &Path) -> PathBuf {
    let path = dir.join("kms.json");
    std::fs::write(&path, r#"{"plain": {"encryptionKMSType": "metadata"}}"#).expect("kms config");
    path
}

/// Makes `vol` an encrypted volume of KMS entry `plain`, as a create through either front door
/// does (the volume core's create-time step: a fresh key stored through the KMS).
async fn encrypt(vol: &mut Volume<'_>, config: &Path) {
    encrypt_with(vol, config, "plain", None).await;
}

/// Makes `vol` an encrypted volume of KMS entry `kms_id` (the Secrets of `secrets` for the
/// entries that keep keys with Kubernetes Secrets).
async fn encrypt_with(
    vol: &mut Volume<'_>,
    config: &Path,
    kms_id: &str,
    secrets: Option<std::sync::Arc<dyn rbd_volume::encryption::secrets::SecretStore>>,
) {
    for (k, v) in [
        ("encrypted", "true"),
        ("encryptionType", "block"),
        ("encryptionKMSID", kms_id),
    ] {
        vol.context.insert(k.to_owned(), v.to_owned());
    }
    let kms = rbd_volume::encryption::load_kms(config, secrets, kms_id)
        .await
        .expect("KMS entry");
    let volume_id = vol.id();
    let target = rbd_volume::encryption::Target {
        cluster: &vol.rados,
        pool: &vol.cluster.pool,
        image: &vol.image,
        volume_id: &volume_id,
        tenant: None,
    };
    rbd_volume::encryption::prepare(&target, kms.as_ref(), None)
        .await
        .expect("preparing the encrypted volume");
}

/// The raw image read with python-rbd (librbd, not the node): whether `marker` occurs anywhere
/// in it, whether it starts with the LUKS magic, and the SHA-256 of its first MiB.
fn raw_image(vol: &Volume<'_>, marker: &str) -> (bool, bool, String) {
    const SCRIPT: &str = r#"
import hashlib, sys, rados, rbd
conf, pool, name, marker = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].encode()
with rados.Rados(conffile=conf, rados_id="admin") as c:
    with c.open_ioctx(pool) as io:
        with rbd.Image(io, name, read_only=True) as img:
            size, off, found, tail, chunk = img.size(), 0, False, b"", 4 << 20
            first = img.read(0, 1 << 20)
            while off < size:
                data = img.read(off, min(chunk, size - off))
                found = found or marker in tail + data
                tail, off = data[-len(marker):], off + len(data)
print("found" if found else "absent", first[:6] == b"LUKS\xba\xbe", hashlib.sha256(first).hexdigest())
"#;
    let out = Command::new("/usr/bin/python3")
        .args(["-c", SCRIPT])
        .arg(&vol.cluster.conf_path)
        .args([&vol.cluster.pool, &vol.image, marker])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "reading the raw image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut f = text.split_whitespace();
    let found = f.next() == Some("found");
    let luks = f.next() == Some("True");
    (found, luks, f.next().unwrap_or_default().to_owned())
}

/// The device-mapper name of a block device ("" when it is not a device-mapper device).
fn dm_name(device: &Path) -> String {
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(device).expect("device"));
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/dm/name"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn dm_devices() -> usize {
    std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("dm-"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_encrypted_krbd_filesystem_keeps_no_plaintext_on_the_image_and_grows() {
    guest(|| async {
        let dir = plugin_dir("crypt-krbd");
        let config = kms_config(&dir);
        let plugin = Plugin::start(&dir, &[&format!("--kms-config={}", config.display())]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("crypt-krbd", "krbd", 64).await;
        encrypt(&mut vol, &config).await;
        vol.attach(&mut node, false).await;
        let device = vol.device();
        assert!(
            device
                .display()
                .to_string()
                .starts_with("/dev/mapper/rbd-csi-"),
            "staged on {} (expected the LUKS device)",
            device.display()
        );
        vol.stage(&mut node)
            .await
            .expect("repeated NodeStageVolume");
        assert_eq!(vol.device(), device, "a repeated stage opened it again");
        let marker = "plaintext-marker-4c55b2c1e8";
        let data = marker.repeat(4096);
        write_file(&vol.target().join("data"), data.as_bytes()).expect("write");
        vol.detach(&mut node).await;
        assert_eq!(dm_devices(), 0, "unstage left the LUKS device open");
        assert!(krbd_devices().is_empty(), "unstage left the image mapped");
        let (found, luks, _) = raw_image(&vol, marker);
        assert!(luks, "the image does not start with a LUKS header");
        assert!(!found, "the plaintext marker is on the raw image");
        // stage again: opened, not formatted; the data reads back
        vol.attach(&mut node, false).await;
        assert_eq!(
            std::fs::read(vol.target().join("data")).expect("read back"),
            data.as_bytes()
        );
        let (before, _) = stats(&mut node, &vol).await;
        expand(&mut node, &vol, 128).await;
        let (after, _) = stats(&mut node, &vol).await;
        assert!(
            after > before + (50 << 20),
            "the LUKS device and ext4 grew: {before} -> {after}"
        );
        vol.detach(&mut node).await;
        assert_eq!(dm_devices(), 0);
    });
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_encrypted_nbd_block_volume_and_a_wrong_key_leaves_the_header_alone() {
    guest(|| async {
        let dir = plugin_dir("crypt-nbd");
        let config = kms_config(&dir);
        let plugin = Plugin::start(&dir, &[&format!("--kms-config={}", config.display())]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("crypt-nbd", "rbd-nbd", 64).await;
        vol.block = true;
        encrypt(&mut vol, &config).await;
        block_round_trip(&vol, &mut node, "/dev/").await;
        vol.attach(&mut node, false).await;
        let name = dm_name(&vol.device());
        assert!(
            name.starts_with("rbd-csi-"),
            "published {} (device-mapper name {name:?}), not the LUKS device",
            vol.device().display()
        );
        vol.detach(&mut node).await;
        assert_eq!(dm_devices(), 0, "unstage left the LUKS device open");
        let (_, luks, header) = raw_image(&vol, "unused-marker");
        assert!(luks, "the image does not start with a LUKS header");
        // another key in the KMS: stage fails naming the KMS entry; nothing is formatted
        vol.rados
            .metadata_set(
                &vol.cluster.pool,
                &vol.image,
                rbd_volume::encryption::kms::META_DEK,
                &"0".repeat(64),
            )
            .await
            .expect("replacing the key");
        let err = vol
            .stage(&mut node)
            .await
            .expect_err("stage with a wrong key");
        assert!(
            err.message().contains("\"plain\"") && err.message().contains("does not open"),
            "{}",
            err.message()
        );
        assert_eq!(dm_devices(), 0, "a failed stage left a LUKS device");
        assert!(
            !mounted(&vol.staging().join("device")),
            "a failed stage left the device bound"
        );
        let (_, luks, after) = raw_image(&vol, "unused-marker");
        assert!(luks && after == header, "the LUKS header changed");
        // an unknown KMS entry is named too
        vol.context
            .insert("encryptionKMSID".to_owned(), "nope".to_owned());
        let err = vol.stage(&mut node).await.expect_err("unknown KMS entry");
        assert!(
            err.message().contains("encryptionKMSID") && err.message().contains("\"nope\""),
            "{}",
            err.message()
        );
    });
}

/// Makes `image` from `source` through the volume core, as a restore or a clone through either
/// front door does, and stores its key (its own copy of the source's) through KMS entry `plain`.
async fn restore_encrypted(
    source_vol: &Volume<'_>,
    source: rbd_volume::Source<'_>,
    image: &str,
    config: &Path,
) {
    let pool = source_vol.cluster.pool.as_str();
    let owner = rbd_volume::Owner {
        pv: image.to_owned(),
        claim: String::new(),
        provisioner: "vm-test".to_owned(),
        kube_cluster: String::new(),
    };
    let options = ceph_rbd::CreateOptions::default();
    let new = rbd_volume::NewImage {
        pool,
        image,
        size: 64 << 20,
        options: &options,
        owner: &owner,
        fit: rbd_volume::Fit::Grow,
    };
    let source_id = format!("vm-test-source-of-{image}");
    let (source_pool, source_image) = match source {
        rbd_volume::Source::Snapshot { pool, image }
        | rbd_volume::Source::Volume { pool, image } => (pool, image),
    };
    rbd_volume::clone_volume(
        &source_vol.rados,
        &rbd_volume::NewClone::of(&new, source, &source_id, "vm-test"),
    )
    .await
    .expect("restoring / cloning");
    let kms = rbd_volume::encryption::KmsConfig::load(config)
        .and_then(|c| c.kms("plain"))
        .expect("KMS entry");
    let target = rbd_volume::encryption::Target {
        cluster: &source_vol.rados,
        pool,
        image,
        volume_id: image,
        tenant: None,
    };
    let from = rbd_volume::encryption::Target {
        pool: source_pool,
        image: source_image,
        volume_id: &source_id,
        ..target
    };
    rbd_volume::encryption::prepare(&target, kms.as_ref(), Some(&from))
        .await
        .expect("storing the copy's key");
}

#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_encrypted_restore_and_clone_read_with_their_own_keys() {
    guest(|| async {
        let dir = plugin_dir("crypt-clone");
        let config = kms_config(&dir);
        let plugin = Plugin::start(&dir, &[&format!("--kms-config={}", config.display())]);
        let mut node = plugin.client().await;
        let mut vol = Volume::new("crypt-src", "krbd", 64).await;
        encrypt(&mut vol, &config).await;
        vol.attach(&mut node, false).await;
        let data = "restored-marker-7d1e".repeat(2048);
        write_file(&vol.target().join("data"), data.as_bytes()).expect("write");
        vol.detach(&mut node).await;
        let pool = vol.cluster.pool.clone();
        let owner = rbd_volume::snapshot::SnapshotOwner {
            name: "crypt-snap".to_owned(),
            source: vol.id(),
            driver: "vm-test".to_owned(),
            kube_cluster: String::new(),
        };
        let snap_image = rbd_volume::snapshot::snapshot_image_name("crypt-snap");
        rbd_volume::snapshot::create_snapshot(
            &vol.rados,
            &rbd_volume::snapshot::NewSnapshot {
                pool: &pool,
                source_image: &vol.image,
                image: &snap_image,
                owner: &owner,
            },
        )
        .await
        .expect("snapshot");
        let snapshot = rbd_volume::Source::Snapshot {
            pool: &pool,
            image: &snap_image,
        };
        restore_encrypted(&vol, snapshot, "crypt-restore", &config).await;
        let volume = rbd_volume::Source::Volume {
            pool: &pool,
            image: &vol.image,
        };
        restore_encrypted(&vol, volume, "crypt-clone", &config).await;
        for image in ["crypt-restore", "crypt-clone"] {
            let copy = Volume::existing(&vol, image);
            let key = copy
                .rados
                .metadata_get(&pool, image, rbd_volume::encryption::kms::META_DEK)
                .await
                .expect("reading the copy's key");
            assert!(
                key.is_some_and(|k| k.len() == 64),
                "{image} has its own key"
            );
            copy.attach(&mut node, false).await;
            assert!(
                dm_name(&copy.device()).starts_with("rbd-csi-"),
                "{image} is staged on its LUKS device"
            );
            assert_eq!(
                std::fs::read(copy.target().join("data")).expect("read back"),
                data.as_bytes(),
                "{image} reads the source's data through its own key"
            );
            copy.detach(&mut node).await;
        }
        assert_eq!(dm_devices(), 0);
    });
}

/// Secret `kms/kek` holding `passphrase` as its `encryptionPassphrase`.
fn kek_secret(passphrase: &str) -> k8s_openapi::api::core::v1::Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "kek", "namespace": "kms"},
        "stringData": {"encryptionPassphrase": passphrase},
    }))
    .expect("secret")
}

/// A node plugin whose KMSs read Secrets from an emulated Kubernetes API.
struct KmsBed {
    _emulator: kube_emulator::Emulator,
    _server: kube_emulator::ServerHandle,
    client: kube::Client,
    /// The plugin's directory.
    dir: PathBuf,
    /// The KMS configuration the plugin reads.
    config: PathBuf,
    plugin: Plugin,
}

/// A [`KmsBed`] in `plugin_dir(name)`: namespace `kms` with [`kek_secret`] of `passphrase`,
/// the KMS configuration `config` (ceph-csi's `config.json`), the plugin reading both.
async fn kms_bed(name: &str, passphrase: &str, config: &str) -> KmsBed {
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    use kube::api::{Api, PostParams};
    let emulator = kube_emulator::Emulator::new();
    let server = emulator
        .serve("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("serving the emulator");
    let dir = plugin_dir(name);
    let kubeconfig = dir.join("kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .expect("writing the kubeconfig");
    let client = emulator.client();
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": "kms"}}))
        .expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("creating namespace kms");
    Api::<Secret>::namespaced(client.clone(), "kms")
        .create(&PostParams::default(), &kek_secret(passphrase))
        .await
        .expect("creating the key-encryption Secret");
    let config_path = dir.join("kms.json");
    std::fs::write(&config_path, config).expect("kms config");
    let plugin = Plugin::start(
        &dir,
        &[
            &format!("--kms-config={}", config_path.display()),
            &format!("--kubeconfig={}", kubeconfig.display()),
        ],
    );
    KmsBed {
        _emulator: emulator,
        _server: server,
        client,
        dir,
        config: config_path,
        plugin,
    }
}

/// The KMS entries that keep keys with Kubernetes Secrets, through the node plugin's own
/// Kubernetes client (`--kubeconfig`) to an emulator in the guest: ceph-csi's `metadata` entry
/// with a key-encryption Secret (`wrapped`, on krbd) and a Secret per volume (`per-volume`, on
/// rbd-nbd). Each formats, writes, unstages, opens again and reads back; then the key-encryption
/// Secret changes: the stage fails naming the entry and the Secret, and the LUKS header stays.
#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_secret_kms_volumes_stage_through_luks_and_a_changed_kek_leaves_the_header_alone() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    guest(|| async {
        let bed = kms_bed(
            "crypt-secrets",
            "the first passphrase",
            r#"{"wrapped": {"encryptionKMSType": "metadata", "secretName": "kek", "secretNamespace": "kms"},
                "per-volume": {"encryptionKMSType": "kubernetes-secret", "secretNamespace": "kms"}}"#,
        )
        .await;
        let (client, config, plugin) = (&bed.client, &bed.config, &bed.plugin);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), "kms");
        let mut node = plugin.client().await;
        let store: std::sync::Arc<dyn rbd_volume::encryption::secrets::SecretStore> =
            std::sync::Arc::new(rbd_csi::kube_secrets::KubeSecrets::new(client.clone()));
        let mut wrapped = Volume::new("crypt-wrapped", "krbd", 64).await;
        encrypt_with(&mut wrapped, config, "wrapped", Some(store.clone())).await;
        let mut per_volume = Volume::new("crypt-per-volume", "rbd-nbd", 64).await;
        encrypt_with(&mut per_volume, config, "per-volume", Some(store)).await;
        for vol in [&wrapped, &per_volume] {
            vol.attach(&mut node, false).await;
            let device = vol.device().display().to_string();
            assert!(
                device.starts_with("/dev/mapper/rbd-csi-"),
                "{}: staged on {device} (expected the LUKS device)",
                vol.image
            );
            let marker = format!("secret-kms-marker-{}", vol.image);
            write_file(&vol.target().join("data"), marker.repeat(512).as_bytes()).expect("write");
            vol.detach(&mut node).await;
            let (found, luks, _) = raw_image(vol, &marker);
            assert!(
                luks && !found,
                "{}: LUKS header {luks}, plaintext found {found}",
                vol.image
            );
            vol.attach(&mut node, false).await;
            assert_eq!(
                std::fs::read(vol.target().join("data")).expect("read back"),
                marker.repeat(512).as_bytes()
            );
            vol.detach(&mut node).await;
        }
        assert_eq!(dm_devices(), 0, "unstage left a LUKS device open");
        // another passphrase in the key-encryption Secret: the wrapped key no longer opens
        let (_, _, header) = raw_image(&wrapped, "unused-marker");
        let mut changed = kek_secret("another passphrase");
        changed.metadata.resource_version = secrets
            .get("kek")
            .await
            .expect("reading the Secret")
            .metadata
            .resource_version;
        secrets
            .replace("kek", &PostParams::default(), &changed)
            .await
            .expect("changing the key-encryption Secret");
        let err = wrapped
            .stage(&mut node)
            .await
            .expect_err("stage with another key-encryption passphrase");
        assert!(
            err.message().contains("\"wrapped\"") && err.message().contains("kek"),
            "{}",
            err.message()
        );
        assert_eq!(dm_devices(), 0, "a failed stage left a LUKS device");
        assert!(
            krbd_devices().is_empty(),
            "a failed stage left the image mapped"
        );
        let (_, luks, after) = raw_image(&wrapped, "unused-marker");
        assert!(luks && after == header, "the LUKS header changed");
    });
}

/// A volume ceph-csi encrypted (its `metadata` KMS with a `secretName`), taken over: ceph-csi's
/// node plugin's first stage as it runs it (krbd map, `cryptsetup luksFormat --type luks2
/// --hash sha256`, open, mkfs, a file written), its key wrapped with ceph-csi's volume ID as the
/// salt (ceph-csi's `EncryptDEK`, in Python). Our node plugin cannot open it by our volume ID
/// until `migrate`'s step records ceph-csi's ID as the key's salt
/// (`rbd_volume::encryption::record_salt`); then it stages it through LUKS and the file reads
/// back with the same md5.
#[test]
#[ignore = "runs inside the VM: vm_suite"]
fn guest_a_ceph_csi_encrypted_volume_taken_over_stages_and_reads_the_same_bytes() {
    const KEK: &str = "the passphrase of ceph-csi's secret";
    const CEPH_CSI_ID: &str =
        "0001-0009-rook-ceph-0000000000000001-6a1c55b2-2f4e-4c8e-9a77-0d3e1f0b7c21";
    guest(|| async {
        let bed = kms_bed(
            "crypt-ceph-csi",
            KEK,
            r#"{"ceph-csi": {"encryptionKMSType": "metadata", "secretName": "kek", "secretNamespace": "kms"}}"#,
        )
        .await;
        let dir = &bed.dir;
        let mut vol = Volume::new("ceph-csi-crypt", "krbd", 64).await;
        let conf = vol.cluster.conf_path.display().to_string();
        // ceph-csi's passphrase (generateNewEncryptionPassphrase: URL-safe base64) and its first
        // stage of the volume
        let passphrase = "q0dXq8N3cZ6tH1vJmWf2Lr9yYkA=";
        let mnt = dir.join("ceph-csi-mount");
        let md5 = sh(&format!(
            "set -e
dev=$(rbd -c {conf} map -o ms_mode=prefer-crc {spec})
printf %s '{passphrase}' | cryptsetup -q luksFormat --type luks2 --hash sha256 --pbkdf-memory 32768 \"$dev\" -d -
printf %s '{passphrase}' | cryptsetup luksOpen \"$dev\" luks-rbd-ceph-csi -d -
mkfs.ext4 -q /dev/mapper/luks-rbd-ceph-csi
mkdir -p {mnt}
mount /dev/mapper/luks-rbd-ceph-csi {mnt}
head -c 3000000 /dev/urandom > {mnt}/data
md5sum < {mnt}/data
umount {mnt}
cryptsetup luksClose luks-rbd-ceph-csi
rbd -c {conf} unmap \"$dev\"",
            spec = vol.spec(),
            mnt = mnt.display(),
        ));
        // ceph-csi's metadata: encrypted, the key wrapped with its volume ID as the salt
        let wrapped = Command::new("/usr/bin/python3")
            .args([
                "-c",
                "import sys, os, json, base64, hashlib
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
dek, kek, salt = sys.argv[1:4]
key = hashlib.scrypt(kek.encode(), salt=salt.encode(), n=32768, r=8, p=1, maxmem=64 << 20, dklen=32)
nonce = os.urandom(12)
sealed = AESGCM(key).encrypt(nonce, dek.encode(), None)
print(json.dumps({'dek': base64.b64encode(sealed).decode(), 'nonce': base64.b64encode(nonce).decode()}))
",
                passphrase,
                KEK,
                CEPH_CSI_ID,
            ])
            .output()
            .expect("python3");
        assert!(
            wrapped.status.success(),
            "wrapping the key as ceph-csi does"
        );
        let wrapped = String::from_utf8_lossy(&wrapped.stdout).trim().to_owned();
        for (key, value) in [
            ("rbd.csi.ceph.com/encrypted", "encrypted"),
            ("rbd.csi.ceph.com/dek", wrapped.as_str()),
        ] {
            vol.rados
                .metadata_set(&vol.cluster.pool, &vol.image, key, value)
                .await
                .expect("ceph-csi's image metadata");
        }
        for (k, v) in [
            ("encrypted", "true"),
            ("encryptionType", "block"),
            ("encryptionKMSID", "ceph-csi"),
        ] {
            vol.context.insert(k.to_owned(), v.to_owned());
        }
        let mut node = bed.plugin.client().await;
        // by our volume ID, ceph-csi's salt does not open the key
        let err = vol
            .stage(&mut node)
            .await
            .expect_err("stage before the salt is recorded");
        assert!(
            err.message().contains("does not unwrap"),
            "{}",
            err.message()
        );
        assert!(krbd_devices().is_empty(), "a failed stage left a mapping");
        // migrate's step
        assert!(
            rbd_volume::encryption::record_salt(
                &vol.rados,
                &vol.cluster.pool,
                &vol.image,
                CEPH_CSI_ID
            )
            .await
            .expect("recording the salt")
        );
        vol.attach(&mut node, false).await;
        let device = vol.device().display().to_string();
        assert!(
            device.starts_with("/dev/mapper/rbd-csi-"),
            "staged on {device} (expected the LUKS device)"
        );
        let read = sh(&format!("md5sum < {}", vol.target().join("data").display()));
        assert_eq!(read, md5, "the file reads back with the same md5");
        vol.detach(&mut node).await;
        assert_eq!(dm_devices(), 0, "unstage left a LUKS device open");
    });
}
