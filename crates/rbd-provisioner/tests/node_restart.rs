//! A published fuse volume survives the node plugin being killed the way a container runtime
//! restarts a container: every process in the plugin's cgroup and process group gets SIGKILL.
//! The plugin runs `rbd-provisioner csi --services=node` in a cgroup and process group of its
//! own, with `--daemon-cgroup` naming another cgroup (as the DaemonSet names a host cgroup);
//! its rbd-fuse daemon lives on there, the restarted plugin serves the same volume, writes and
//! reads go through the published path, and unpublish/unstage clean up.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rbd_csi::proto::csi::node_client::NodeClient;
use rbd_csi::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use rbd_csi::proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use tonic::transport::Channel;

#[path = "support/node.rs"]
mod node;

/// Where test cgroups go: the cgroup v2 root, or cgroup v1's `pids` hierarchy.
fn cgroup_base() -> PathBuf {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        root.to_path_buf()
    } else {
        root.join("pids")
    }
}

fn procs(cgroup: &Path) -> Vec<u32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// SIGKILL to every process in `cgroup` until it is empty (what runc does on a container stop
/// or restart), and to the process group `pgid`.
fn kill_all(cgroup: &Path, pgid: Option<u32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    if let Some(pgid) = pgid {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pgid}")])
            .stderr(Stdio::null())
            .status();
    }
    loop {
        let pids = procs(cgroup);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        assert!(
            Instant::now() < deadline,
            "{} not empty after 10 s of SIGKILL",
            cgroup.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mounted(path: &Path) -> bool {
    let p = path.to_string_lossy();
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*p))
}

/// Mount points under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy().into_owned();
    let mut found: Vec<String> = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .filter(|m| m.starts_with(&d))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.len()));
    found
}

/// Everything the test made; torn down on drop even when an assertion failed: plugins and
/// daemons killed, mounts and loop devices released, cgroups removed.
struct Guard {
    dir: tempfile::TempDir,
    cgroups: Vec<PathBuf>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for cgroup in &self.cgroups {
            if cgroup.exists() && !cgroup.to_string_lossy().ends_with("-daemons") {
                kill_all(cgroup, None);
            }
        }
        for mount in mounts_under(self.dir.path()) {
            if !mount.ends_with("/mnt") {
                let _ = Command::new("umount").args(["-l", &mount]).status();
            }
        }
        if let Ok(out) = Command::new("losetup").args(["-a"]).output() {
            let dir = self.dir.path().to_string_lossy().into_owned();
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains(&dir)
                    && let Some(dev) = line.split(':').next()
                {
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
        }
        for mount in mounts_under(self.dir.path()) {
            let _ = Command::new("umount").args(["-l", &mount]).status();
        }
        for cgroup in &self.cgroups {
            if cgroup.exists() {
                kill_all(cgroup, None);
                let _ = std::fs::remove_dir(cgroup);
            }
        }
    }
}

/// `rbd-provisioner csi --services=node` in the cgroup `cgroup` and a process group of its own.
struct Plugin {
    child: Child,
    socket: PathBuf,
}

impl Plugin {
    fn start(dir: &Path, cgroup: &Path, daemons: &Path, round: u32) -> Plugin {
        std::fs::create_dir_all(cgroup).unwrap();
        let socket = dir.join("csi.sock");
        // The shell moves itself into the cgroup, then becomes the plugin.
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"echo 0 > "$0/cgroup.procs" && exec "$@""#)
            .arg(cgroup)
            .arg(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .args([
                "csi",
                "--services=node",
                "--default-mounter=fuse",
                "--node-id=node-1",
            ])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--runtime-dir={}", dir.join("run").display()))
            .arg(format!("--daemon-cgroup={}", daemons.display()))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("node-{round}.log"))).unwrap())
            .spawn()
            .unwrap();
        Plugin { child, socket }
    }

    async fn client(&self) -> NodeClient<Channel> {
        NodeClient::new(node::unix_channel(&self.socket).await)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// rbd-fuse processes serving mounts under `dir`.
fn fuse_pids(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.starts_with("rbd-fuse") && cmdline.contains(&needle)
        })
        .collect()
}

fn write_synced(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    f.write_all(data)?;
    f.sync_all()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_fuse_volume_survives_the_plugin_killed_with_its_cgroup_and_process_group() {
    let ceph = micro_ceph::cluster();
    let image = "node-restart-fuse";
    let spec = format!("{}/{image}", ceph.pool);
    let _ = ceph.rbd(&["rm", "--no-progress", &spec]);
    ceph.rbd(&["create", "--size", "64M", &spec]).unwrap();

    let base = cgroup_base();
    let tag = format!("rbd-csi-test-{}", std::process::id());
    let plugin_cgroups = [
        base.join(format!("{tag}-plugin-1")),
        base.join(format!("{tag}-plugin-2")),
    ];
    let daemons = base.join(format!("{tag}-daemons"));
    let guard = Guard {
        dir: tempfile::tempdir().unwrap(),
        cgroups: vec![
            plugin_cgroups[0].clone(),
            plugin_cgroups[1].clone(),
            daemons.clone(),
        ],
    };
    let dir = guard.dir.path();
    let staging = dir.join("staging");
    let target = dir.join("pods/p1/volume");
    let volume_id = rbd_csi::volume::VolumeId::new(&ceph.monitors, &ceph.pool, image)
        .encode()
        .unwrap();
    let context: HashMap<String, String> = [
        ("monitors", ceph.monitors.as_str()),
        ("pool", ceph.pool.as_str()),
        ("imageName", image),
        ("userID", "admin"),
        ("mounter", "fuse"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let cap = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let stage = NodeStageVolumeRequest {
        volume_id: volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap.clone()),
        secrets: [
            ("userID".to_owned(), "admin".to_owned()),
            ("userKey".to_owned(), ceph.admin_key.clone()),
        ]
        .into(),
        volume_context: context.clone(),
        ..Default::default()
    };
    let publish = NodePublishVolumeRequest {
        volume_id: volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap),
        volume_context: context,
        ..Default::default()
    };
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: volume_id.clone(),
        target_path: target.display().to_string(),
    };
    let unstage = NodeUnstageVolumeRequest {
        volume_id,
        staging_target_path: staging.display().to_string(),
    };

    // First plugin: stage, publish, write.
    let mut first = Plugin::start(dir, &plugin_cgroups[0], &daemons, 1);
    let mut node = first.client().await;
    node.node_stage_volume(stage.clone()).await.unwrap();
    node.node_publish_volume(publish.clone()).await.unwrap();
    drop(node);
    write_synced(&target.join("before.txt"), b"written by the first plugin").unwrap();
    let daemon_pids = fuse_pids(dir);
    assert_eq!(daemon_pids.len(), 1, "one rbd-fuse serves the volume");
    assert_eq!(
        procs(&daemons),
        daemon_pids,
        "rbd-fuse runs in --daemon-cgroup"
    );

    // The container restart: SIGKILL to the process group and to all of the cgroup.
    kill_all(&plugin_cgroups[0], Some(first.child.id()));
    first.child.wait().unwrap();
    let _ = std::fs::remove_dir(&plugin_cgroups[0]);
    assert_eq!(fuse_pids(dir), daemon_pids, "rbd-fuse outlived the plugin");
    // I/O works while no plugin runs.
    write_synced(
        &target.join("between.txt"),
        b"written with no plugin running",
    )
    .unwrap();

    // Second plugin: the volume is served as before, and unpublish/unstage work.
    let second = Plugin::start(dir, &plugin_cgroups[1], &daemons, 2);
    let mut node = second.client().await;
    node.node_stage_volume(stage.clone()).await.unwrap();
    node.node_publish_volume(publish.clone()).await.unwrap();
    write_synced(&target.join("after.txt"), b"written after the restart").unwrap();
    assert_eq!(
        std::fs::read(target.join("before.txt")).unwrap(),
        b"written by the first plugin"
    );
    assert_eq!(
        fuse_pids(dir),
        daemon_pids,
        "the restarted plugin adopted rbd-fuse"
    );
    node.node_unpublish_volume(unpublish.clone()).await.unwrap();
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    assert!(!mounted(&target) && !mounted(&staging));
    assert!(
        fuse_pids(dir).is_empty(),
        "rbd-fuse ended with the last unstage"
    );
    assert!(procs(&daemons).is_empty());

    // The data reached Ceph: staged afresh (a new rbd-fuse), every file reads back.
    node.node_stage_volume(stage).await.unwrap();
    node.node_publish_volume(publish).await.unwrap();
    for (file, text) in [
        ("before.txt", &b"written by the first plugin"[..]),
        ("between.txt", b"written with no plugin running"),
        ("after.txt", b"written after the restart"),
    ] {
        assert_eq!(std::fs::read(target.join(file)).unwrap(), text, "{file}");
    }
    node.node_unpublish_volume(unpublish).await.unwrap();
    node.node_unstage_volume(unstage).await.unwrap();
    assert!(mounts_under(dir).is_empty(), "{:?}", mounts_under(dir));
    drop(node);
    drop(second);
    drop(guard);
    let _ = ceph.rbd(&["rm", "--no-progress", &spec]);
}
