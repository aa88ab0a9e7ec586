//! `rbd-fuse` + loop device: the mapper for nodes without the `rbd`/`nbd` kernel modules.
//!
//! Flow of [`FuseLoopMapper::map`]:
//! 1. One `rbd-fuse` instance per (monitors, pool, user) serves every image of that pool as a
//!    file. Its directory `<runtime>/fuse/<hash>/` (mode 0700) holds a private `ceph.conf` and
//!    `keyring` (both 0600, the key never on argv), the mount point `mnt/` and `rbd-fuse.log`.
//!    The first map starts `rbd-fuse -f` as a child of the plugin, in a session of its own (and
//!    the configured host cgroups, [`super::daemon`]) so that it outlives the plugin, and waits
//!    for the mount.
//! 2. `losetup -f --show <mnt>/<image>` attaches the image file to a free loop device (an
//!    existing loop device on that file is reused, so a repeated map is idempotent).
//!
//! [`FuseLoopMapper::unmap`] detaches the loop device, and when no loop device uses a file of
//! that `rbd-fuse` mount any more, unmounts it (the process exits), waits for the process to be
//! gone and removes the key files.
//!
//! **Guarantees**: the reference count is derived from the kernel's loop devices
//! (`/sys/block/loop*/loop/backing_file`), not from memory, so it is right after a plugin restart.
//! Calls on one instance are serialised by its own lock; other instances are not blocked.
//!
//! **Caveats**: `rbd-fuse` caches an image's size when it opens it, so after a resize
//! [`Mapper::refresh_size`] truncates the image file up to the new size (rbd-fuse turns that into
//! a no-op `rbd_resize`) and re-reads the loop capacity. Never delete files under the mount: an
//! unlink there removes the RBD image.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, oneshot};

use super::daemon::DaemonPlacement;
use super::loop_device::{backing_file, loop_device_for, loop_devices_under, wait_detached};
use super::secret_file::{private_dir, write_private};
use super::{
    ImageSpec, Key, MapError, MapOptions, MappedDevice, Mapper, MounterKind, blocking,
    parse_device_output, redact,
};
use crate::{exec, mount};

/// How long to wait for an `rbd-fuse` mount to appear or a process to exit.
const FUSE_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);
/// How often [`FuseLoopMapper::map_with`] attaches an image before it gives up on an `rbd-fuse`
/// that keeps exiting. Ceph's rbd-fuse (seen with 16.2) is not thread-safe when it first opens an
/// image: a second request for the image while `rbd_open` is in flight finds the half-made entry
/// and crashes on its null handle (SIGSEGV in `rbd_stat`), leaving the mount dead
/// ("transport endpoint is not connected") and the fresh loop device answering EIO. The map
/// looks the image up alone first, reads the device's first block, and on a dead mount
/// detaches, restarts rbd-fuse and attaches again.
const ATTACH_ATTEMPTS: u32 = 3;

/// The `rbd-fuse` instance and image file behind a loop device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseAttachment {
    /// `<runtime>/fuse/<hash>`.
    pub instance_dir: PathBuf,
    /// The `rbd-fuse` mount point (`<instance_dir>/mnt`).
    pub mount_point: PathBuf,
    /// `<mount_point>/<image>`: the loop device's backing file.
    pub image_file: PathBuf,
}

/// What this process knows about one rbd-fuse instance it started.
#[derive(Debug, Default)]
struct Instance {
    /// Fires when the `rbd-fuse` child exits (after its mount goes away).
    exited: Option<oneshot::Receiver<()>>,
}

/// The fuse-loop mapper.
#[derive(Debug)]
pub struct FuseLoopMapper {
    fuse_dir: PathBuf,
    /// One lock per rbd-fuse instance (by instance directory): calls on one instance are
    /// serialised, other instances (pools, users, clusters) proceed in parallel.
    instances: std::sync::Mutex<HashMap<PathBuf, Arc<Mutex<Instance>>>>,
    /// Where `rbd-fuse` starts ([`super::daemon`]).
    placement: DaemonPlacement,
}

impl FuseLoopMapper {
    /// A mapper keeping its `rbd-fuse` instances under `<runtime_dir>/fuse`.
    #[must_use]
    pub fn new(runtime_dir: &Path) -> Self {
        Self {
            fuse_dir: runtime_dir.join("fuse"),
            instances: std::sync::Mutex::new(HashMap::new()),
            placement: DaemonPlacement::default(),
        }
    }

    /// Starts `rbd-fuse` with `placement` ([`super::daemon`]: outside the plugin's process
    /// group and cgroup).
    #[must_use]
    pub fn with_placement(mut self, placement: DaemonPlacement) -> Self {
        self.placement = placement;
        self
    }

    /// The lock of the instance in `dir`.
    fn instance(&self, dir: &Path) -> Arc<Mutex<Instance>> {
        let mut instances = self
            .instances
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(instances.entry(dir.to_path_buf()).or_default())
    }

    fn instance_dir(&self, image: &ImageSpec) -> PathBuf {
        self.fuse_dir.join(instance_id(image))
    }

    /// Starts `rbd-fuse` for the instance unless it is already mounted.
    async fn ensure_instance(
        &self,
        instance: &mut Instance,
        dir: &Path,
        image: &ImageSpec,
        key: &Key,
    ) -> Result<PathBuf, MapError> {
        let mnt = dir.join("mnt");
        if is_fuse_mount(&mnt)? {
            // A stat of a mount whose rbd-fuse hangs blocks: keep it off the async threads.
            let probe = mnt.clone();
            match blocking("checking", move || Ok(std::fs::metadata(&probe))).await? {
                Ok(_) => return Ok(mnt),
                Err(e) => {
                    // The rbd-fuse process died ("transport endpoint is not connected"): detach
                    // the dead mount and start a fresh instance in its place. Loop devices still
                    // on the dead mount then show their file as `/<image>`; unmap knows that.
                    tracing::warn!(mount_point = %mnt.display(), error = %e, "rbd-fuse mount is dead; restarting it");
                    instance.exited = None;
                    let dead = mnt.clone();
                    blocking("detaching dead mount", move || {
                        mount::unmount_detach(&dead)
                            .map_err(|e| MapError::io("detaching dead mount", dead.display(), e))
                    })
                    .await?;
                }
            }
        }
        let InstanceFiles {
            conf,
            log_path,
            log,
            log_err,
        } = write_instance_files(dir, &mnt, image, key).await?;
        let args = fuse_args(&conf, image, &mnt);
        tracing::info!(pool = %image.pool, user = %image.user, mount_point = %mnt.display(), "starting rbd-fuse");
        let started = self.spawn_fuse(&args, log, log_err);
        // the keyring goes with a start that failed (a cgroup refused, no binary)
        let mut child = match started {
            Ok(child) => child,
            Err(e) => {
                remove_instance_files(dir);
                return Err(e);
            }
        };
        let deadline = Instant::now() + FUSE_TIMEOUT;
        loop {
            if is_fuse_mount(&mnt)? {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = redact(&log_tail(&log_path), key);
                remove_instance_files(dir);
                if status.code().is_none() && args.iter().any(|a| a == "-p" || a == "-s") {
                    // killed by a signal at start: Ceph 20.2's rbd-fuse, see `fuse_args`
                    stderr = format!(
                        "{stderr}\nrbd-fuse crashed at start; the rbd-fuse of Ceph 20.2 crashes \
                         on its pool and namespace options (-p, -s), so with it the fuse mapper \
                         serves only the pool named rbd without a namespace: use the krbd or \
                         rbd-nbd mapper (mounter parameter) for pool {:?}{}",
                        image.pool,
                        if image.namespace.is_empty() {
                            String::new()
                        } else {
                            format!(" namespace {:?}", image.namespace)
                        }
                    );
                }
                return Err(MapError::Exec(exec::ExecError::Failed {
                    command: exec::describe(
                        "rbd-fuse",
                        &args.iter().map(String::as_str).collect::<Vec<_>>(),
                    ),
                    status: status.to_string(),
                    code: status.code(),
                    stderr,
                }));
            }
            if Instant::now() > deadline {
                let _ = child.start_kill();
                let _ = child.wait().await;
                let stderr = redact(&log_tail(&log_path), key);
                remove_instance_files(dir);
                return Err(MapError::Timeout(format!(
                    "rbd-fuse for pool {} did not mount within {FUSE_TIMEOUT:?}: {stderr}",
                    image.pool
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        // Reap the child when it exits (after its mount goes away), and tell unmap.
        let (tx, rx) = oneshot::channel();
        let reaped_mnt = mnt.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            tracing::info!(mount_point = %reaped_mnt.display(), status = ?status.ok(), "rbd-fuse exited");
            let _ = tx.send(());
        });
        instance.exited = Some(rx);
        Ok(mnt)
    }

    /// Starts `rbd-fuse ARGS` where [`DaemonPlacement`] says, its output into the instance's log,
    /// with no Ceph settings inherited from the plugin's environment.
    fn spawn_fuse(
        &self,
        args: &[String],
        log: std::fs::File,
        log_err: std::fs::File,
    ) -> Result<tokio::process::Child, MapError> {
        self.placement
            .command("rbd-fuse")?
            .args(args)
            .env_remove("CEPH_ARGS")
            .env_remove("CEPH_CONF")
            .env_remove("CEPH_KEYRING")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| {
                MapError::Exec(exec::ExecError::Spawn {
                    program: "rbd-fuse".into(),
                    source,
                })
            })
    }

    /// Unmounts an instance no loop device uses any more, waits for its process, removes its files.
    async fn teardown_instance(
        &self,
        instance: &mut Instance,
        fuse: &FuseAttachment,
    ) -> Result<(), MapError> {
        let mnt = &fuse.mount_point;
        let deadline = Instant::now() + FUSE_TIMEOUT;
        while is_fuse_mount(mnt)? {
            let target = mnt.clone();
            match blocking("unmounting", move || Ok(mount::unmount(&target))).await? {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    // The kernel may still be releasing the loop device's file.
                    tokio::time::sleep(POLL).await;
                }
                Err(e) => return Err(MapError::io("unmounting", mnt.display(), e)),
            }
        }
        if let Some(exited) = instance.exited.take() {
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, exited).await.is_err() {
                return Err(MapError::Timeout(format!(
                    "rbd-fuse serving {} did not exit within {FUSE_TIMEOUT:?} of its unmount",
                    mnt.display()
                )));
            }
        } else {
            // Started by an earlier incarnation of the plugin: watch /proc instead.
            while fuse_process_running(mnt) {
                if Instant::now() > deadline {
                    return Err(MapError::Timeout(format!(
                        "rbd-fuse serving {} still running {FUSE_TIMEOUT:?} after its unmount",
                        mnt.display()
                    )));
                }
                tokio::time::sleep(POLL).await;
            }
        }
        remove_instance_files(&fuse.instance_dir);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Mapper for FuseLoopMapper {
    fn kind(&self) -> MounterKind {
        MounterKind::FuseLoop
    }

    async fn map(&self, image: &ImageSpec, key: &Key) -> Result<MappedDevice, MapError> {
        self.map_with(image, key, &MapOptions::default()).await
    }

    /// A read-only mapping is a read-only loop device (`losetup -r`, verified in
    /// `/sys/block/loopN/ro`): rbd-fuse itself has no read-only mode. An existing loop device of
    /// the image is reused only in the mode asked for. The instance is per monitors, so the
    /// cluster needs no further check.
    async fn map_with(
        &self,
        image: &ImageSpec,
        key: &Key,
        options: &MapOptions,
    ) -> Result<MappedDevice, MapError> {
        let dir = self.instance_dir(image);
        let slot = self.instance(&dir);
        let mut instance = slot.lock().await;
        let mut attempt = 1;
        loop {
            let mnt = self
                .ensure_instance(&mut instance, &dir, image, key)
                .await?;
            let attachment = FuseAttachment {
                instance_dir: dir.clone(),
                mount_point: mnt.clone(),
                image_file: mnt.join(&image.image),
            };
            if let Some(device) = loop_device_for(&attachment.image_file) {
                // never a read-write loop device for a read-only stage, nor the reverse
                super::check_reused_mode(Path::new("/"), &device, image, options.read_only).await?;
                return Ok(MappedDevice {
                    mounter: MounterKind::FuseLoop,
                    device,
                    fuse: Some(attachment),
                });
            }
            // The first lookup opens the image in rbd-fuse, alone: see `ATTACH_ATTEMPTS`.
            let image_file = attachment.image_file.clone();
            if !blocking("checking", move || Ok(image_file.exists())).await? {
                if loop_devices_under(&mnt).is_empty() {
                    self.teardown_instance(&mut instance, &attachment).await?;
                }
                return Err(MapError::ImageNotFound {
                    pool: ceph_rbd::pool_spec(&image.pool, &image.namespace),
                    image: image.image.clone(),
                });
            }
            let file = attachment.image_file.to_string_lossy().into_owned();
            let args: &[&str] = if options.read_only {
                &["-r", "-f", "--show", &file]
            } else {
                &["-f", "--show", &file]
            };
            let device = match exec::run("losetup", args).await {
                Ok(out) => parse_device_output("losetup", &out.stdout)?,
                Err(e) => {
                    if loop_devices_under(&mnt).is_empty() {
                        let _ = self.teardown_instance(&mut instance, &attachment).await;
                    }
                    return Err(e.into());
                }
            };
            if let Err(e) =
                super::check_fresh_mode(Path::new("/"), &device, options.read_only).await
            {
                exec::run("losetup", &["-d", &device.to_string_lossy()]).await?;
                return Err(e);
            }
            let Err(read_error) = read_first_block(&device).await else {
                return Ok(MappedDevice {
                    mounter: MounterKind::FuseLoop,
                    device,
                    fuse: Some(attachment),
                });
            };
            // Not usable: detach it again, and start a fresh rbd-fuse if this one is gone.
            let backing = attachment.image_file.clone();
            exec::run("losetup", &["-d", &device.to_string_lossy()]).await?;
            wait_detached(&device, &backing).await?;
            let probe = mnt.clone();
            let gone = blocking("checking", move || Ok(std::fs::metadata(&probe).is_err())).await?;
            if !gone || attempt == ATTACH_ATTEMPTS {
                if loop_devices_under(&mnt).is_empty() {
                    let _ = self.teardown_instance(&mut instance, &attachment).await;
                }
                return Err(MapError::io(
                    "reading the first block of",
                    device.display(),
                    read_error,
                ));
            }
            tracing::warn!(
                mount_point = %mnt.display(),
                image = %image.image,
                attempt,
                "rbd-fuse exited while the image was attached (a known rbd-fuse race when it first \
                 opens an image); restarting it"
            );
            attempt += 1;
        }
    }

    /// The loop device's backing file identifies the image (`<mount>/<image>`), so `image` adds
    /// nothing here: a reused loop number serving another file is never detached.
    async fn unmap(&self, mapped: &MappedDevice, _image: &ImageSpec) -> Result<(), MapError> {
        let Some(fuse) = &mapped.fuse else {
            return Err(MapError::WrongMapper {
                device: mapped.device.display().to_string(),
                recorded: mapped.mounter,
                expected: MounterKind::FuseLoop,
            });
        };
        let slot = self.instance(&fuse.instance_dir);
        let mut instance = slot.lock().await;
        // Detach only if the loop device still serves our file (its number may have been reused).
        if let Some(backing) = backing_file(&mapped.device)
            && serves_image(&backing, fuse)
        {
            exec::run("losetup", &["-d", &mapped.device.to_string_lossy()]).await?;
            wait_detached(&mapped.device, &backing).await?;
        }
        if loop_devices_under(&fuse.mount_point).is_empty() {
            self.teardown_instance(&mut instance, fuse).await?;
        }
        Ok(())
    }

    async fn refresh_size(&self, mapped: &MappedDevice, new_size: u64) -> Result<(), MapError> {
        let Some(fuse) = &mapped.fuse else {
            return Ok(());
        };
        // Serialised with maps and unmaps of the instance: rbd-fuse's image table is not
        // thread-safe (`ATTACH_ATTEMPTS`).
        let slot = self.instance(&fuse.instance_dir);
        let _instance = slot.lock().await;
        let file = fuse.image_file.clone();
        blocking("refreshing size of", move || {
            let current = std::fs::metadata(&file)
                .map_err(|e| MapError::io("reading size of", file.display(), e))?
                .len();
            if new_size > current {
                // rbd-fuse caches the size it saw at open; a truncate up to the size the image
                // already has makes it re-read it (rbd_resize to the current size changes
                // nothing).
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .map_err(|e| MapError::io("opening", file.display(), e))?;
                f.set_len(new_size)
                    .map_err(|e| MapError::io("refreshing size of", file.display(), e))?;
            }
            Ok(())
        })
        .await?;
        exec::run("losetup", &["-c", &mapped.device.to_string_lossy()]).await?;
        Ok(())
    }
}

/// Reads (up to) the first 4 KiB of a freshly attached loop device: proof that its rbd-fuse
/// serves it.
async fn read_first_block(device: &Path) -> Result<(), std::io::Error> {
    use std::io::Read;
    let device = device.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 4096];
        std::fs::File::open(&device)?.read(&mut buf).map(drop)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Whether a loop device backed by `backing` serves the attachment's image: the image file, or
/// `/<image>`, which is how the kernel shows the file once the dead rbd-fuse mount it lived on
/// was detached (see `ensure_instance`).
fn serves_image(backing: &Path, fuse: &FuseAttachment) -> bool {
    backing == fuse.image_file
        || fuse
            .image_file
            .file_name()
            .is_some_and(|name| backing == Path::new("/").join(name))
}

/// The files an rbd-fuse instance is started with.
struct InstanceFiles {
    conf: PathBuf,
    log_path: PathBuf,
    log: std::fs::File,
    log_err: std::fs::File,
}

/// Creates the instance directory (`0700`) and mount point, writes the private keyring and
/// `ceph.conf` (`0600`, synced) and opens the log, on the blocking pool.
async fn write_instance_files(
    dir: &Path,
    mnt: &Path,
    image: &ImageSpec,
    key: &Key,
) -> Result<InstanceFiles, MapError> {
    let (dir, mnt) = (dir.to_path_buf(), mnt.to_path_buf());
    let keyring = dir.join("keyring");
    let keyring_text = keyring_text(&image.user, key);
    let conf_text = conf_text(&image.monitors, &keyring);
    blocking("writing instance files in", move || {
        private_dir(&dir).map_err(|e| MapError::io("creating", dir.display(), e))?;
        std::fs::create_dir_all(&mnt).map_err(|e| MapError::io("creating", mnt.display(), e))?;
        write_private(&keyring, &keyring_text)
            .map_err(|e| MapError::io("writing", keyring.display(), e))?;
        let conf = dir.join("ceph.conf");
        write_private(&conf, &conf_text).map_err(|e| MapError::io("writing", conf.display(), e))?;
        let log_path = dir.join("rbd-fuse.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| MapError::io("creating", log_path.display(), e))?;
        let log_err = log
            .try_clone()
            .map_err(|e| MapError::io("opening", log_path.display(), e))?;
        Ok(InstanceFiles {
            conf,
            log_path,
            log,
            log_err,
        })
    })
    .await
}

/// Stable id of the rbd-fuse instance for (monitors, pool, namespace, user): one instance serves
/// one namespace (`rbd-fuse -s`). The default namespace hashes as before namespaces existed, so
/// instances of older records keep their id.
#[must_use]
pub fn instance_id(image: &ImageSpec) -> String {
    let mut h = Sha256::new();
    h.update(image.monitors.as_bytes());
    h.update([0]);
    h.update(image.pool.as_bytes());
    h.update([0]);
    h.update(image.user.as_bytes());
    if !image.namespace.is_empty() {
        h.update([0]);
        h.update(image.namespace.as_bytes());
    }
    let digest = h.finalize();
    crate::volume::hex(&digest[..8])
}

/// rbd-fuse's own default pool: not named on its command line.
const FUSE_DEFAULT_POOL: &str = "rbd";

/// The `rbd-fuse` arguments: foreground (our child), private conf, user, and the pool and
/// namespace (`-s`, Ceph 16's rbd-fuse has it) only when not the default ones: Ceph 20.2's
/// rbd-fuse crashes on its `-p` and `-s` options (SIGSEGV, SIGABRT), and serves its default pool
/// `rbd` without them. No key.
#[must_use]
pub fn fuse_args(conf: &Path, image: &ImageSpec, mnt: &Path) -> Vec<String> {
    let mut args = vec![
        "-f".into(),
        "-c".into(),
        conf.to_string_lossy().into_owned(),
        "--id".into(),
        image.user.clone(),
    ];
    if image.pool != FUSE_DEFAULT_POOL {
        args.extend(["-p".into(), image.pool.clone()]);
    }
    if !image.namespace.is_empty() {
        args.extend(["-s".into(), image.namespace.clone()]);
    }
    args.push(mnt.to_string_lossy().into_owned());
    args
}

/// A keyring file's text for `client.<user>`.
#[must_use]
pub fn keyring_text(user: &str, key: &Key) -> String {
    format!("[client.{user}]\n\tkey = {}\n", key.expose())
}

/// The private `ceph.conf`: monitors, keyring, and bounded waits so a wrong key or an unreachable
/// cluster fails instead of hanging.
#[must_use]
pub fn conf_text(monitors: &str, keyring: &Path) -> String {
    format!(
        "[global]\nmon_host = {monitors}\nkeyring = {}\nclient_mount_timeout = 20\n\
         rados_mon_op_timeout = 30\nrados_osd_op_timeout = 60\nlog_to_stderr = true\n\
         err_to_stderr = true\nlog_file = \n",
        keyring.display()
    )
}

fn is_fuse_mount(mnt: &Path) -> Result<bool, MapError> {
    Ok(mount::mount_at(mnt)
        .map_err(|e| MapError::io("reading mount table for", mnt.display(), e))?
        .is_some_and(|m| m.fs_type.starts_with("fuse")))
}

fn remove_instance_files(dir: &Path) {
    for name in ["keyring", "ceph.conf", "rbd-fuse.log"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    // Never remove recursively: if `mnt` were still a live rbd-fuse mount, unlinking its files
    // would delete RBD images. remove_dir only removes empty directories.
    let _ = std::fs::remove_dir(dir.join("mnt"));
    let _ = std::fs::remove_dir(dir);
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Whether an `rbd-fuse` process serving `mnt` still exists (zombies count as gone).
#[must_use]
pub fn fuse_process_running(mnt: &Path) -> bool {
    let mnt = mnt.to_string_lossy();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        let path = e.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            return false;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_fuse = args.first().is_some_and(|a| a.ends_with(b"rbd-fuse"));
        let serves = args.iter().any(|a| *a == mnt.as_bytes());
        let zombie = std::fs::read_to_string(path.join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
            .unwrap_or(false);
        is_fuse && serves && !zombie
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(user: &str) -> ImageSpec {
        ImageSpec {
            monitors: "127.0.0.1:40000".into(),
            pool: "rbd".into(),
            namespace: String::new(),
            image: "img".into(),
            user: user.into(),
            map_options: None,
            unmap_options: None,
        }
    }

    #[tokio::test]
    async fn a_start_refused_by_its_cgroup_leaves_no_key_file() {
        let runtime = tempfile::tempdir().unwrap();
        let not_a_cgroup = runtime.path().join("not-a-cgroup");
        let mapper = FuseLoopMapper::new(runtime.path())
            .with_placement(DaemonPlacement::in_cgroups(vec![not_a_cgroup]));
        let image = spec("kube");
        let err = mapper
            .map(&image, &Key::new("AQBsecret=="))
            .await
            .expect_err("a cgroup without cgroup.procs refuses the start");
        assert!(err.to_string().contains("cgroup.procs"), "{err}");
        let dir = mapper.instance_dir(&image);
        for file in ["keyring", "ceph.conf"] {
            assert!(!dir.join(file).exists(), "{file} left in {}", dir.display());
        }
    }

    #[test]
    fn one_instance_per_monitors_pool_and_user() {
        assert_eq!(instance_id(&spec("a")), instance_id(&spec("a")));
        assert_ne!(instance_id(&spec("a")), instance_id(&spec("b")));
        let mut other_pool = spec("a");
        other_pool.pool = "kube".into();
        assert_ne!(instance_id(&spec("a")), instance_id(&other_pool));
        // one instance per namespace too; the default namespace keeps the id it always had
        let mut namespaced = spec("a");
        namespaced.namespace = "tenant".into();
        assert_ne!(instance_id(&spec("a")), instance_id(&namespaced));
        let a = spec("a");
        let before_namespaces = Sha256::digest(format!("{}\0{}\0{}", a.monitors, a.pool, a.user));
        assert_eq!(instance_id(&a), crate::volume::hex(&before_namespaces[..8]));
    }

    #[test]
    fn fuse_args_name_the_namespace_only_when_there_is_one() {
        let mnt = Path::new("/run/x/mnt");
        let conf = Path::new("/run/x/ceph.conf");
        assert!(!fuse_args(conf, &spec("kube"), mnt).contains(&"-s".to_owned()));
        let mut namespaced = spec("kube");
        namespaced.namespace = "tenant".into();
        let args = fuse_args(conf, &namespaced, mnt);
        assert!(
            args.windows(2).any(|w| w[0] == "-s" && w[1] == "tenant"),
            "{args:?}"
        );
        assert_eq!(args.last().map(String::as_str), Some("/run/x/mnt"));
    }

    #[test]
    fn fuse_args_carry_no_key_and_run_in_foreground() {
        let args = fuse_args(
            Path::new("/run/x/ceph.conf"),
            &spec("kube"),
            Path::new("/run/x/mnt"),
        );
        assert_eq!(args[0], "-f");
        assert!(args.windows(2).any(|w| w[0] == "--id" && w[1] == "kube"));
        // rbd-fuse's default pool goes unnamed (Ceph 20.2's crashes on -p), any other is named
        assert!(!args.contains(&"-p".to_owned()), "{args:?}");
        let mut other = spec("kube");
        other.pool = "kube-pool".into();
        let args_other = fuse_args(
            Path::new("/run/x/ceph.conf"),
            &other,
            Path::new("/run/x/mnt"),
        );
        assert!(
            args_other
                .windows(2)
                .any(|w| w[0] == "-p" && w[1] == "kube-pool")
        );
        let text = keyring_text("kube", &Key::new("AQBsecret=="));
        assert!(text.contains("[client.kube]") && text.contains("AQBsecret=="));
        assert!(!args.iter().any(|a| a.contains("AQB")));
        let conf = conf_text("m1:6789,m2:6789", Path::new("/run/x/keyring"));
        assert!(conf.contains("mon_host = m1:6789,m2:6789"));
        assert!(conf.contains("keyring = /run/x/keyring"));
    }
}
