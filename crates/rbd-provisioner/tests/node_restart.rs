//! A published fuse volume survives the node plugin being killed the way a container runtime
//! restarts a container: every process in the plugin's cgroups (one in every hierarchy on a
//! cgroup v1 host, as runc places a container) and process group gets SIGKILL. The plugin runs
//! `rbd-provisioner csi --services=node` in cgroups and a process group of its own, with
//! `--daemon-cgroup=/sys/fs/cgroup/NAME`, the form the DaemonSet passes (resolved to one cgroup
//! per hierarchy on cgroup v1); its rbd-fuse daemon lives on there, the restarted plugin serves
//! the same volume, writes and reads go through the published path, and unpublish/unstage clean
//! up.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rbd_csi::proto::csi::node_client::NodeClient;
use rbd_csi::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use rbd_csi::proto::csi::{
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, VolumeCapability,
};
use tonic::transport::Channel;

#[path = "../../rbd-csi/tests/common/cgroups.rs"]
mod cgroups;
#[path = "support/node.rs"]
mod node;

/// SIGKILL to the process group `pgid` and to every process in `container` (its cgroups) until
/// they are empty (what runc does on a container stop or restart).
fn kill_container(container: &[PathBuf], pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
    cgroups::kill_all(container);
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
    plugin_cgroups: Vec<PathBuf>,
    daemon_cgroups: Vec<PathBuf>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Plugins first, so that nothing stages again; rbd-fuse after its mounts are released.
        cgroups::kill_until_empty(&self.plugin_cgroups);
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
        let all = self.plugin_cgroups.iter().chain(&self.daemon_cgroups);
        drop(cgroups::Made(all.cloned().collect()));
    }
}

/// `rbd-provisioner csi --services=node` in the cgroups `container` and a process group of its
/// own.
struct Plugin {
    child: Child,
    socket: PathBuf,
}

impl Plugin {
    fn start(dir: &Path, container: &[PathBuf], daemon_cgroup: &Path, round: u32) -> Plugin {
        for cgroup in container {
            cgroups::create_joinable(cgroup);
        }
        let socket = dir.join("csi.sock");
        // The shell moves itself into every cgroup before "--", then becomes the plugin.
        let child = Command::new("sh")
            .arg("-c")
            .arg(
                r#"while [ "$1" != -- ]; do echo 0 > "$1/cgroup.procs" || exit 1; shift; done
                shift; exec "$@""#,
            )
            .arg("sh")
            .args(container)
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .args([
                "csi",
                "--services=node",
                "--default-mounter=fuse",
                "--node-id=node-1",
            ])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--runtime-dir={}", dir.join("run").display()))
            .arg(format!("--daemon-cgroup={}", daemon_cgroup.display()))
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

    let tag = format!("rbd-csi-test-{}", std::process::id());
    let plugin_cgroups = [
        cgroups::in_every_hierarchy(&format!("{tag}-plugin-1")),
        cgroups::in_every_hierarchy(&format!("{tag}-plugin-2")),
    ];
    // The DaemonSet's form: one directory below the host's cgroup mount point.
    let daemon_cgroup = Path::new(cgroups::ROOT).join(format!("{tag}-daemons"));
    let daemon_cgroups = cgroups::in_every_hierarchy(&format!("{tag}-daemons"));
    let guard = Guard {
        dir: tempfile::tempdir().unwrap(),
        plugin_cgroups: plugin_cgroups.concat(),
        daemon_cgroups: daemon_cgroups.clone(),
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
    let mut first = Plugin::start(dir, &plugin_cgroups[0], &daemon_cgroup, 1);
    let mut node = first.client().await;
    for cgroup in &plugin_cgroups[0] {
        assert_eq!(
            cgroups::procs(cgroup),
            [first.child.id()],
            "the plugin runs in {}",
            cgroup.display()
        );
    }
    node.node_stage_volume(stage.clone()).await.unwrap();
    node.node_publish_volume(publish.clone()).await.unwrap();
    drop(node);
    write_synced(&target.join("before.txt"), b"written by the first plugin").unwrap();
    let daemon_pids = fuse_pids(dir);
    assert_eq!(daemon_pids.len(), 1, "one rbd-fuse serves the volume");
    for cgroup in &daemon_cgroups {
        assert_eq!(
            cgroups::procs(cgroup),
            daemon_pids,
            "rbd-fuse runs in {} (--daemon-cgroup resolved for this host)",
            cgroup.display()
        );
    }

    // The container restart: SIGKILL to the process group and to all of its cgroups.
    kill_container(&plugin_cgroups[0], first.child.id());
    first.child.wait().unwrap();
    assert_eq!(fuse_pids(dir), daemon_pids, "rbd-fuse outlived the plugin");
    // I/O works while no plugin runs.
    write_synced(
        &target.join("between.txt"),
        b"written with no plugin running",
    )
    .unwrap();

    // Second plugin: the volume is served as before, and unpublish/unstage work.
    let second = Plugin::start(dir, &plugin_cgroups[1], &daemon_cgroup, 2);
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
    for cgroup in &daemon_cgroups {
        assert!(cgroups::procs(cgroup).is_empty(), "{}", cgroup.display());
    }

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
