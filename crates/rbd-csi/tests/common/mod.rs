//! Shared test fixtures: a CSI server on a unix socket in a temp dir, tonic clients, and guards
//! that leave no mount, loop device or rbd-fuse process behind even when a test fails.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::missing_panics_doc
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub mod cgroups;
pub mod controller;
pub mod data;
pub mod volume;

use hyper_util::rt::TokioIo;
use rbd_csi::proto::csi::{
    self, controller_client::ControllerClient, identity_client::IdentityClient,
    node_client::NodeClient,
};
use rbd_csi::{CsiConfig, MounterKind, Services};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A stand-in for the node's cluster check in tests whose monitors are fake: no fsid, no watchers.
pub struct NoCluster;

#[async_trait::async_trait]
impl rbd_csi::node::access::ClusterCheck for NoCluster {
    async fn inspect(
        &self,
        _image: &rbd_csi::mapper::ImageSpec,
        _key: &rbd_csi::mapper::Key,
    ) -> Result<rbd_csi::node::access::ClusterView, tonic::Status> {
        Ok(rbd_csi::node::access::ClusterView::default())
    }
}

/// A running CSI server; stopped (and its socket removed) on drop.
pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub config: CsiConfig,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<Result<(), rbd_csi::CsiError>>>,
}

impl TestServer {
    pub async fn start(services: Services, tweak: impl FnOnce(&mut CsiConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let mut config = CsiConfig {
            endpoint: socket.clone(),
            services,
            node_id: "test-node-1".into(),
            default_mounter: MounterKind::FuseLoop,
            runtime_dir: dir.path().join("run"),
            ..CsiConfig::default()
        };
        tweak(&mut config);
        let socket = config.endpoint.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(rbd_csi::serve(config.clone(), async move {
            let _ = stopped.await;
        }));
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&socket).await.is_err() {
            if handle.is_finished() {
                panic!("server exited: {:?}", handle.await);
            }
            assert!(
                Instant::now() < deadline,
                "socket {} never came up",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Self {
            dir,
            socket,
            config,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    pub async fn channel(&self) -> Channel {
        connect(&self.socket).await
    }

    pub async fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel().await)
    }

    pub async fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel().await)
    }

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel().await)
    }

    /// Stops the server and returns what `serve` returned.
    pub async fn stop(mut self) -> Result<(), rbd_csi::CsiError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.handle.take().unwrap().await.unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Before the TempDir (a field, dropped after this) is removed: never remove files
        // through a live rbd-fuse mount.
        NodeCleanup {
            dirs: vec![self.dir.path().to_path_buf()],
        }
        .run();
    }
}

pub async fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(path).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "socket {} never came up",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A tonic channel over the unix socket at `path`.
pub async fn connect(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap()
}

pub fn mount_cap(fs_type: &str) -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: vec![],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn block_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

pub fn strings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Mount points at or under `dir`, per `/proc/self/mountinfo`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    rbd_csi::mount::mount_table()
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Loop devices whose backing file is under `dir`.
pub fn loops_under(dir: &Path) -> Vec<PathBuf> {
    rbd_csi::mapper::loop_device::loop_devices()
        .into_iter()
        .filter(|(_, file)| file.starts_with(dir))
        .map(|(dev, _)| dev)
        .collect()
}

/// Live rbd-fuse processes whose command line mentions `dir`.
pub fn fuse_processes_under(dir: &Path) -> Vec<String> {
    fuse_processes(dir)
        .into_iter()
        .map(|(_, text)| text)
        .collect()
}

/// Pids of the live rbd-fuse processes whose command line mentions `dir`.
pub fn fuse_pids_under(dir: &Path) -> Vec<u32> {
    fuse_processes(dir)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn fuse_processes(dir: &Path) -> Vec<(u32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let zombie = stat
                .rsplit_once(") ")
                .is_some_and(|(_, r)| r.starts_with('Z'));
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (text.contains("rbd-fuse") && text.contains(&needle) && !zombie).then_some((pid, text))
        })
        .collect()
}

/// Tears down everything a node test may have left under `dirs` (deepest mounts first, loop
/// devices before the rbd-fuse mounts they use), so a failing test leaves the machine clean.
/// Never deletes files through a live rbd-fuse mount.
pub struct NodeCleanup {
    pub dirs: Vec<PathBuf>,
}

impl NodeCleanup {
    pub fn run(&self) {
        for dir in &self.dirs {
            let mut mounts = mounts_under(dir);
            mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for m in mounts.iter().filter(|m| !is_fuse(m)) {
                let _ = rbd_csi::mount::unmount_all(m);
            }
            for dev in loops_under(dir) {
                let _ = std::process::Command::new("losetup")
                    .arg("-d")
                    .arg(&dev)
                    .status();
            }
            for m in mounts.iter().filter(|m| is_fuse(m)) {
                for _ in 0..100 {
                    match rbd_csi::mount::unmount(m) {
                        Ok(_) => break,
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            }
        }
    }
}

fn is_fuse(path: &Path) -> bool {
    rbd_csi::mount::mount_at(path)
        .ok()
        .flatten()
        .is_some_and(|m| m.fs_type.starts_with("fuse"))
}

impl Drop for NodeCleanup {
    fn drop(&mut self) {
        self.run();
    }
}

/// An RBD image created with the `rbd` CLI for a test; removed on drop.
pub struct TestImage {
    pub pool: String,
    pub name: String,
}

impl TestImage {
    pub fn create(name: &str, size_mib: u64) -> Self {
        let cluster = micro_ceph::cluster();
        let spec = format!("{}/{name}", cluster.pool);
        let _ = cluster.rbd(&["rm", "--no-progress", &spec]);
        cluster
            .rbd(&["create", "--size", &format!("{size_mib}M"), &spec])
            .unwrap();
        Self {
            pool: cluster.pool.clone(),
            name: name.to_owned(),
        }
    }

    pub fn resize(&self, size_mib: u64) {
        micro_ceph::cluster()
            .rbd(&[
                "resize",
                "--no-progress",
                "--size",
                &format!("{size_mib}M"),
                &format!("{}/{}", self.pool, self.name),
            ])
            .unwrap();
    }

    pub fn volume_id(&self) -> String {
        rbd_csi::volume::VolumeId::new(&micro_ceph::cluster().monitors, &self.pool, &self.name)
            .encode()
            .unwrap()
    }

    pub fn context(&self) -> HashMap<String, String> {
        let cluster = micro_ceph::cluster();
        strings(&[
            ("monitors", &cluster.monitors),
            ("pool", &self.pool),
            ("imageName", &self.name),
            ("userID", "admin"),
            ("mounter", "fuse"),
        ])
    }

    pub fn secrets(&self) -> HashMap<String, String> {
        strings(&[
            ("userID", "admin"),
            ("userKey", &micro_ceph::cluster().admin_key),
        ])
    }
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let _ = micro_ceph::cluster().rbd(&[
            "rm",
            "--no-progress",
            &format!("{}/{}", self.pool, self.name),
        ]);
    }
}
