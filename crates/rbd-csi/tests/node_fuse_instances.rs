//! rbd-fuse instance management through the node service, against a private Ceph cluster:
//! one instance shared per pool and user, recovery after a plugin restart or a dead rbd-fuse, and
//! private key files. Runs as root.

mod common;

use std::path::{Path, PathBuf};

use common::volume::{Volume, assert_nothing_left};
use common::{
    TestImage, TestServer, block_cap, fuse_pids_under, fuse_processes_under, loops_under, mount_cap,
};
use rbd_csi::Services;
use rbd_csi::proto::csi;

#[tokio::test]
async fn two_volumes_share_one_rbd_fuse_until_the_last_unstage() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let a = TestImage::create("csi-node-share-a", 32);
    let b = TestImage::create("csi-node-share-b", 32);
    let mut va = Volume::new(&server, &a, mount_cap("ext4")).await;
    let mut vb = Volume::new(&server, &b, mount_cap("ext4")).await;
    va.stage().await.unwrap();
    vb.stage().await.unwrap();
    assert_eq!(
        fuse_processes_under(server.dir.path()).len(),
        1,
        "one rbd-fuse per pool+user"
    );
    assert_eq!(loops_under(server.dir.path()).len(), 2);
    va.unstage().await.unwrap();
    assert_eq!(
        fuse_processes_under(server.dir.path()).len(),
        1,
        "still used by b"
    );
    assert!(rbd_csi::mount::is_mount_point(&vb.staging).unwrap());
    std::fs::write(vb.staging.join("still-works"), "yes").unwrap();
    vb.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn unstage_works_after_a_plugin_restart() {
    let first = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-restart", 32);
    let mut vol = Volume::new(&first, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();
    // A new plugin process (same runtime dir, no memory of the first) unstages from the record.
    let config = first.config.clone();
    let second = TestServer::start(Services::Node, |c| {
        c.runtime_dir = config.runtime_dir.clone();
    })
    .await;
    vol.node = second.node().await;
    vol.unstage().await.unwrap();
    assert_nothing_left(&first);
}

#[tokio::test]
async fn fuse_key_files_are_private_and_no_key_is_on_any_command_line() {
    use std::os::unix::fs::PermissionsExt;
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-key-files", 16);
    let mut vol = Volume::new(&server, &image, mount_cap("ext4")).await;
    vol.stage().await.unwrap();

    let instances: Vec<PathBuf> = std::fs::read_dir(server.config.runtime_dir.join("fuse"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(instances.len(), 1);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&instances[0]), 0o700);
    assert_eq!(mode(&instances[0].join("keyring")), 0o600);
    assert_eq!(mode(&instances[0].join("ceph.conf")), 0o600);

    let key = micro_ceph::cluster().admin_key.clone();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline);
            assert!(
                !text.contains(&key),
                "key on a command line: {}",
                entry.path().display()
            );
        }
    }
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}

#[tokio::test]
async fn a_dead_rbd_fuse_is_replaced_on_the_next_stage() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let a = TestImage::create("csi-node-dead-fuse-a", 16);
    let b = TestImage::create("csi-node-dead-fuse-b", 16);
    let mut va = Volume::new(&server, &a, mount_cap("ext4")).await;
    let mut vb = Volume::new(&server, &b, mount_cap("ext4")).await;
    va.stage().await.unwrap();
    let pids: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let dir = server.dir.path().display().to_string();
            (text.contains("rbd-fuse") && text.contains(&dir))
                .then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect();
    assert_eq!(pids.len(), 1);
    // SAFETY: plain kill(2) of the rbd-fuse child this test's server started.
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !fuse_processes_under(server.dir.path()).is_empty() {
        assert!(std::time::Instant::now() < deadline, "rbd-fuse did not die");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Stats see that A's mapping is gone although its filesystem is still mounted.
    let stats = va
        .node
        .node_get_volume_stats(rbd_csi::proto::csi::NodeGetVolumeStatsRequest {
            volume_id: a.volume_id(),
            volume_path: va.staging.display().to_string(),
            staging_target_path: va.staging.display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let condition = stats.volume_condition.unwrap();
    assert!(condition.abnormal, "{condition:?}");
    assert!(condition.message.contains("rbd-fuse"), "{condition:?}");
    // B stages through a fresh rbd-fuse; A's broken staging still unstages cleanly.
    vb.stage().await.unwrap();
    std::fs::write(vb.staging.join("ok"), "ok").unwrap();
    let loops_before = rbd_csi::mapper::loop_device::loop_devices().len();
    va.unstage().await.unwrap();
    assert_eq!(
        rbd_csi::mapper::loop_device::loop_devices().len(),
        loops_before - 1,
        "A's loop device (on the detached dead mount) is released"
    );
    vb.unstage().await.unwrap();
    assert_nothing_left(&server);
    // The killed client's watch on A lingers until Ceph times it out (~30 s), and `rbd rm`
    // would wait for that; the cluster is private to this test binary, so leave A in it.
    std::mem::forget(a);
}

async fn stage_with_key(server: &TestServer, name: &str, key: &str) -> tonic::Status {
    let image = TestImage::create(name, 8);
    let vol = Volume::new(server, &image, mount_cap("ext4")).await;
    let mut secrets = image.secrets();
    secrets.insert("userKey".into(), key.to_owned());
    let started = std::time::Instant::now();
    let err = vol
        .node
        .clone()
        .node_stage_volume(rbd_csi::proto::csi::NodeStageVolumeRequest {
            volume_id: image.volume_id(),
            staging_target_path: vol.staging.display().to_string(),
            volume_capability: Some(vol.cap.clone()),
            secrets,
            volume_context: image.context(),
            publish_context: std::collections::HashMap::new(),
        })
        .await
        .unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(40));
    // The node checks the key with the cluster before it maps anything.
    assert!(err.message().contains("client.admin"), "{}", err.message());
    assert!(
        !err.message().contains(key),
        "key quoted: {}",
        err.message()
    );
    assert_nothing_left(server);
    err
}

/// `key` with the characters in `range` changed (same length and alphabet).
fn tamper(key: &str, range: std::ops::Range<usize>) -> String {
    key.chars()
        .enumerate()
        .map(|(i, c)| match (range.contains(&i), c) {
            (false, c) => c,
            (true, 'A') => 'B',
            (true, _) => 'A',
        })
        .collect()
}

#[tokio::test]
async fn a_malformed_key_fails_the_stage_without_quoting_it() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let key = tamper(&micro_ceph::cluster().admin_key, 4..20);
    let err = stage_with_key(&server, "csi-node-malformed-key", &key).await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
}

#[tokio::test]
async fn a_wrong_key_fails_the_stage_and_leaves_nothing() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    // The secret bytes changed, the header kept: a well-formed key Ceph refuses.
    let key = micro_ceph::cluster().admin_key.clone();
    let len = key.trim_end_matches('=').len();
    let err = stage_with_key(
        &server,
        "csi-node-wrong-key",
        &tamper(&key, len - 8..len - 1),
    )
    .await;
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
}

#[tokio::test]
async fn concurrent_stages_and_unstages_of_many_volumes_share_one_instance() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let images: Vec<TestImage> = (0..4)
        .map(|i| TestImage::create(&format!("csi-node-concurrent-{i}"), 8))
        .collect();
    let mut volumes = Vec::new();
    for image in &images {
        volumes.push(Volume::new(&server, image, mount_cap("ext4")).await);
    }
    let results = futures::future::join_all(volumes.iter_mut().map(|v| v.stage())).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(fuse_processes_under(server.dir.path()).len(), 1);
    assert_eq!(loops_under(server.dir.path()).len(), 4);
    for v in &volumes {
        assert!(rbd_csi::mount::is_mount_point(&v.staging).unwrap());
    }
    let results = futures::future::join_all(volumes.iter_mut().map(|v| v.unstage())).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_nothing_left(&server);
}

/// Whether a thread of this process is blocked in a FUSE request (its kernel wait channel), or in
/// a stat-family system call (x86-64 numbers: stat, lstat, statfs, newfstatat, statx) where the
/// kernel does not name the wait channel.
fn a_thread_waits_on_fuse() -> bool {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .any(|task| {
            let wchan = std::fs::read_to_string(task.path().join("wchan")).unwrap_or_default();
            let syscall = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
            wchan.contains("fuse")
                || wchan.contains("request_wait_answer")
                || matches!(
                    syscall.split(' ').next(),
                    Some("4" | "6" | "137" | "262" | "332")
                )
        })
}

/// Sends SIGCONT to a stopped rbd-fuse when told to, or at its deadline if the test never gets
/// that far (a plugin blocking its only async thread never lets it): the machine is never left
/// with a stopped FUSE daemon. `resumed` says whether it has fired.
struct Resumer {
    tell: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    resumed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Resumer {
    fn stop(pid: u32, deadline: std::time::Duration) -> Resumer {
        let signal = move |sig: &str| {
            let ok = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill {sig} {pid}");
        };
        signal("-STOP");
        let (tell, told) = std::sync::mpsc::channel::<()>();
        let resumed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&resumed);
        let thread = std::thread::spawn(move || {
            let _ = told.recv_timeout(deadline);
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            signal("-CONT");
        });
        Resumer {
            tell: Some(tell),
            thread: Some(thread),
            resumed,
        }
    }

    fn resumed(&self) -> bool {
        self.resumed.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn resume(&mut self) {
        drop(self.tell.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Resumer {
    fn drop(&mut self) {
        self.resume();
    }
}

/// A hung mount stalls only the call that touches it: with its rbd-fuse stopped, a
/// `NodeGetVolumeStats` of that mount blocks in the kernel, and the plugin, on a runtime with a
/// single thread, still answers other calls (blocking system calls run on the blocking pool).
#[tokio::test(flavor = "current_thread")]
async fn a_hung_mount_blocks_only_the_call_that_touches_it() {
    use std::time::{Duration, Instant};
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-node-hung-fuse", 16);
    let mut vol = Volume::new(&server, &image, block_cap()).await;
    vol.stage().await.unwrap();
    let pids = fuse_pids_under(server.dir.path());
    assert_eq!(pids.len(), 1, "one rbd-fuse");
    let fuse_dir = std::fs::read_dir(server.config.runtime_dir.join("fuse"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();

    let mut resumer = Resumer::stop(pids[0], Duration::from_secs(20));
    let mut stats_client = server.node().await;
    let stats = tokio::spawn(async move {
        stats_client
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: "hung".into(),
                volume_path: fuse_dir.join("mnt").display().to_string(),
                staging_target_path: String::new(),
            })
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !a_thread_waits_on_fuse() {
        assert!(
            !resumer.resumed(),
            "the node service blocked its async thread on the hung mount: nothing ran until \
             rbd-fuse was resumed"
        );
        assert!(
            Instant::now() < deadline,
            "NodeGetVolumeStats never reached the hung mount"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let caps = tokio::time::timeout(
        Duration::from_secs(5),
        vol.node
            .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
    )
    .await;
    assert!(
        !resumer.resumed(),
        "NodeGetCapabilities waited for the hung mount"
    );
    assert!(
        matches!(caps, Ok(Ok(_))),
        "NodeGetCapabilities while a mount hangs: {caps:?}"
    );
    assert!(!stats.is_finished(), "the stats call did not hang");
    resumer.resume();
    stats.await.unwrap().unwrap();
    vol.unstage().await.unwrap();
    assert_nothing_left(&server);
}
