//! A private single-node Ceph cluster for a test binary.
//!
//! [`cluster()`] starts one cluster (1 mon + 1 OSD, memstore, cephx, 127.0.0.1 only) the first time
//! it is called in a process and returns it on every later call. The cluster is always stopped:
//!
//! * when the test binary exits normally (an `atexit` hook runs `scripts/micro-ceph-stop.sh`), which
//!   covers failed tests too, since the harness catches their panics and exits normally;
//! * when the process dies any other way (abort, SIGKILL, a panic with `panic = "abort"`): a small
//!   guardian process, started in its own session, waits for the test process to disappear and then
//!   stops the cluster.
//!
//! Each cluster gets its own mon port (and the 99 ports above it for the OSD), claimed with an
//! advisory lock on `/tmp/micro-ceph-port-<port>.lock`, so test binaries can run in parallel.
//!
//! [`MicroCeph::start`] gives an owned cluster (stopped on drop) for tests that break their cluster
//! on purpose (outage tests).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no free mon port found between {first} and {last}")]
    NoFreePort { first: u16, last: u16 },
    #[error("micro-ceph.sh failed ({status}):\n{output}")]
    StartFailed { status: String, output: String },
    #[error("reading the cluster's env file {path}: {source}")]
    Env {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the cluster's env file {path} lacks {key}")]
    MissingKey { path: PathBuf, key: &'static str },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// A running micro cluster.
#[derive(Debug)]
pub struct MicroCeph {
    /// The cluster directory (config, keyring, logs, pid files).
    pub dir: PathBuf,
    /// `host:port` list, as a StorageClass `monitors` parameter takes it.
    pub monitors: String,
    /// The mon's msgr1 address (`v1:127.0.0.1:PORT`) of a cluster started with `MSGR1=1`
    /// ([`MicroCeph::start_with`]); `None` for the default msgr2-only cluster.
    pub monitors_v1: Option<String>,
    /// The `client.admin` key (base64). Test-only secret.
    pub admin_key: String,
    /// A replicated pool initialised for RBD.
    pub pool: String,
    /// `ceph.conf` of the cluster (for the `rbd` CLI: `--conf` or `CEPH_CONF`).
    pub conf_path: PathBuf,
    /// The mon port.
    pub mon_port: u16,
    stop_on_drop: bool,
    _port_lock: File,
}

const PORT_FIRST: u16 = 40_000;
const PORT_LAST: u16 = 59_900;

/// The shared cluster of this test binary, started on first use.
///
/// # Panics
/// When the cluster cannot be started: every test that needs it would fail anyway, and the panic
/// message carries the script's output.
#[allow(clippy::panic)]
pub fn cluster() -> &'static MicroCeph {
    static CLUSTER: OnceLock<MicroCeph> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let mut cluster = match MicroCeph::start() {
            Ok(c) => c,
            Err(e) => panic!("starting micro-ceph: {e}"),
        };
        // Statics are never dropped: stop it at exit instead.
        cluster.stop_on_drop = false;
        register_atexit_stop(&cluster.dir);
        cluster
    })
}

impl MicroCeph {
    /// Starts a new cluster owned by the caller; it is stopped when the value is dropped.
    pub fn start() -> Result<MicroCeph, Error> {
        Self::start_with(&[])
    }

    /// Like [`MicroCeph::start`], with extra `micro-ceph.sh` settings (`("MSGR1", "1")` for a
    /// cluster that also speaks msgr1).
    pub fn start_with(settings: &[(&str, &str)]) -> Result<MicroCeph, Error> {
        // a test process that dies of a signal (a Ceph client thread's crash) says where
        crash_report::install("test process");
        // A port found free can be taken before the script binds it (any listener bound to port
        // 0 gets an ephemeral port, and that range overlaps ours): then the script says "already
        // in use" and another port is claimed, the busy one kept locked meanwhile so the next
        // claim passes it by.
        let mut busy_ports = Vec::new();
        let (dir, mon_port, lock) = loop {
            let (mon_port, lock) = claim_port()?;
            // The pid makes the directory this process's own: a guardian left by an earlier test
            // binary that used the same port stops only that binary's cluster, never ours.
            let dir = std::env::temp_dir()
                .join(format!("micro-ceph-test-{mon_port}-{}", std::process::id()));
            let scripts = scripts_dir();
            let out = Command::new(scripts.join("micro-ceph.sh"))
                .arg(&dir)
                .env("MON_PORT", mon_port.to_string())
                .envs(settings.iter().copied())
                .stdin(Stdio::null())
                .output()
                .map_err(|source| Error::Io {
                    what: "running micro-ceph.sh".into(),
                    source,
                })?;
            if out.status.success() {
                break (dir, mon_port, lock);
            }
            // The script kills what it started on failure; remove the directory too.
            stop(&dir, true);
            let output = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if output.contains("already in use") && busy_ports.len() < 5 {
                busy_ports.push(lock);
                continue;
            }
            return Err(Error::StartFailed {
                status: out.status.to_string(),
                output,
            });
        };
        drop(busy_ports);
        spawn_guardian(&dir)?;
        let env_path = dir.join("env");
        let env = std::fs::read_to_string(&env_path).map_err(|source| Error::Env {
            path: env_path.clone(),
            source,
        })?;
        let get = |key: &'static str| {
            env_value(&env, key).ok_or_else(|| Error::MissingKey {
                path: env_path.clone(),
                key,
            })
        };
        Ok(MicroCeph {
            monitors: get("CEPH_MON_HOST")?,
            monitors_v1: env_value(&env, "CEPH_MON_HOST_V1"),
            admin_key: get("CEPH_ADMIN_KEY")?,
            pool: get("MICRO_CEPH_POOL")?,
            conf_path: PathBuf::from(get("CEPH_CONF")?),
            dir,
            mon_port,
            stop_on_drop: true,
            _port_lock: lock,
        })
    }

    /// A `Command` for a Ceph CLI (`rbd`, `ceph`, `rados`) pointed at this cluster as client.admin.
    pub fn cli(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.arg("--conf")
            .arg(&self.conf_path)
            .env_remove("CEPH_ARGS");
        cmd
    }

    /// Runs `rbd ARGS` against this cluster and returns stdout; an error carries stderr.
    pub fn rbd(&self, args: &[&str]) -> Result<String, Error> {
        self.run_cli("rbd", args)
    }

    /// Writes `len` bytes of `byte` at `offset` of `pool/image` with python-rbd (librbd, not
    /// the code under test).
    pub fn fill_image(
        &self,
        pool: &str,
        image: &str,
        offset: u64,
        len: u64,
        byte: u8,
    ) -> Result<(), Error> {
        let out = Command::new("/usr/bin/python3")
            .args(["-c", FILL_IMAGE])
            .arg(&self.conf_path)
            .args([
                pool,
                image,
                &offset.to_string(),
                &len.to_string(),
                &byte.to_string(),
            ])
            .output()
            .map_err(|source| Error::Io {
                what: "running python3".into(),
                source,
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::Io {
                what: format!("writing {len} bytes at {offset} of {pool}/{image}"),
                source: io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
            })
        }
    }

    /// The cluster's fsid (`ceph fsid`).
    pub fn fsid(&self) -> Result<String, Error> {
        Ok(self.run_cli("ceph", &["fsid"])?.trim().to_owned())
    }

    /// Runs `ceph ARGS` against this cluster and returns stdout; an error carries stderr.
    pub fn ceph(&self, args: &[&str]) -> Result<String, Error> {
        self.run_cli("ceph", args)
    }

    /// Runs `rados ARGS` against this cluster and returns stdout; an error carries stderr.
    pub fn rados(&self, args: &[&str]) -> Result<String, Error> {
        self.run_cli("rados", args)
    }

    fn run_cli(&self, program: &str, args: &[&str]) -> Result<String, Error> {
        let out = self
            .cli(program)
            .args(args)
            .output()
            .map_err(|source| Error::Io {
                what: format!("running {program}"),
                source,
            })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Io {
                what: format!("{program} {}", args.join(" ")),
                source: io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
            })
        }
    }

    /// Pid of a daemon (`mon.a`, `osd.0`) from its pid file.
    pub fn daemon_pid(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("run").join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Starts an `rbd-mirror` daemon (Debian's `rbd-mirror` package) for this cluster, as
    /// `client.admin`: it replays the images of this cluster's mirrored pools from their peers
    /// ([`MicroCeph::peer_mirroring`]). Its pid file is `run/rbd-mirror.admin.pid`, so the
    /// cluster's stop (and its guardian, when the test process dies) stops it too; its log is
    /// `log/rbd-mirror.log`. Returns once the daemon runs.
    ///
    /// # Errors
    /// The daemon could not be started (not installed, or it exited).
    pub fn start_rbd_mirror(&self) -> Result<(), Error> {
        let pid_file = self.dir.join("run").join("rbd-mirror.admin.pid");
        let _ = std::fs::remove_file(&pid_file);
        let log_dir = self.dir.join("log");
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            what: format!("creating {}", log_dir.display()),
            source,
        })?;
        // CEPH_CONF: the daemon opens a second connection to its own cluster per pool, which
        // reads only the default configuration paths
        let out = Command::new("rbd-mirror")
            .arg("--conf")
            .arg(&self.conf_path)
            .args(["--id", "admin", "--pid-file"])
            .arg(&pid_file)
            .arg("--log-file")
            .arg(log_dir.join("rbd-mirror.log"))
            .env("CEPH_CONF", &self.conf_path)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| Error::Io {
                what: "running rbd-mirror (the rbd-mirror package)".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(Error::StartFailed {
                status: out.status.to_string(),
                output: format!(
                    "rbd-mirror: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if self
                .daemon_pid("rbd-mirror.admin")
                .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Err(Error::StartFailed {
            status: "no pid file within 20 s".into(),
            output: format!(
                "rbd-mirror: see {}",
                log_dir.join("rbd-mirror.log").display()
            ),
        })
    }

    /// Kills this cluster's `rbd-mirror` daemon with `SIGKILL` (a site lost at once) and waits
    /// until it is gone. Nothing when none runs.
    pub fn kill_rbd_mirror(&self) {
        let Some(pid) = self.daemon_pid("rbd-mirror.admin") else {
            return;
        };
        // SAFETY: kill(2) with a pid read from the cluster's own pid file; no memory is involved.
        if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
            return;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            // gone, or a zombie its parent (init) has not reaped yet
            if state.is_none_or(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(self.dir.join("run").join("rbd-mirror.admin.pid"));
    }

    /// The disaster-recovery test bed: two clusters, site-a and site-b, peers for their pool
    /// ([`MicroCeph::peer_mirroring`]), each with its `rbd-mirror` daemon
    /// ([`MicroCeph::start_rbd_mirror`]). Both stop (daemons included) when dropped.
    ///
    /// # Errors
    /// A cluster, the peering or a daemon could not be started.
    pub fn start_two_sites() -> Result<(MicroCeph, MicroCeph), Error> {
        let a = MicroCeph::start()?;
        let b = MicroCeph::start()?;
        a.peer_mirroring("site-a", &b, "site-b", &a.pool)?;
        a.start_rbd_mirror()?;
        b.start_rbd_mirror()?;
        Ok((a, b))
    }

    /// Makes this cluster (site `site`) and `peer` (site `peer_site`) mirroring peers of each
    /// other for pool `pool`, which both have: image mode on both sides, then `rbd mirror pool
    /// peer bootstrap create` here and `import` there (direction rx-tx), as an operator does.
    ///
    /// # Errors
    /// A CLI step failed.
    pub fn peer_mirroring(
        &self,
        site: &str,
        peer: &MicroCeph,
        peer_site: &str,
        pool: &str,
    ) -> Result<(), Error> {
        self.rbd(&[
            "mirror",
            "pool",
            "enable",
            "--site-name",
            site,
            pool,
            "image",
        ])?;
        peer.rbd(&[
            "mirror",
            "pool",
            "enable",
            "--site-name",
            peer_site,
            pool,
            "image",
        ])?;
        let token = self.rbd(&[
            "mirror",
            "pool",
            "peer",
            "bootstrap",
            "create",
            "--site-name",
            site,
            pool,
        ])?;
        let path = peer.dir.join(format!("bootstrap-{site}.token"));
        std::fs::write(&path, token.trim()).map_err(|source| Error::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
        let imported = peer.rbd(&[
            "mirror",
            "pool",
            "peer",
            "bootstrap",
            "import",
            "--site-name",
            peer_site,
            "--direction",
            "rx-tx",
            pool,
            &path.display().to_string(),
        ]);
        let _ = std::fs::remove_file(&path);
        imported.map(drop)
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) a daemon, to simulate an unreachable cluster.
    /// A freeze returns once every thread of the daemon is stopped (the signal reaches each
    /// thread when it next runs: until then a busy daemon can still answer a request sent
    /// right after `kill` returned), or false after two seconds.
    pub fn pause_daemon(&self, name: &str, paused: bool) -> bool {
        let Some(pid) = self.daemon_pid(name) else {
            return false;
        };
        let sig = if paused { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) with a pid read from the cluster's own pid file; no memory is involved.
        if unsafe { libc::kill(pid, sig) } != 0 {
            return false;
        }
        if !paused {
            return true;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if all_threads_stopped(pid) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc/PID/task/*/stat`).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // the state follows the command name in parentheses, which may hold spaces
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}

/// Holds an image open read-write from a separate client process (python-rbd), the way a node
/// that mapped it would: the image has a watcher until the holder is dropped.
pub struct ImageHolder(std::process::Child);

const FILL_IMAGE: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2])
with rbd.Image(io, sys.argv[3]) as img:
    img.write(bytes([int(sys.argv[6])]) * int(sys.argv[5]), int(sys.argv[4]))
io.close(); c.shutdown()
";

const HOLD_IMAGE_OPEN: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2]); img = rbd.Image(io, sys.argv[3])
print('open', flush=True); sys.stdin.read()";

impl ImageHolder {
    /// Opens `pool/image` and returns once the image is open.
    pub fn open(cluster: &MicroCeph, pool: &str, image: &str) -> Result<ImageHolder, Error> {
        use std::io::BufRead;
        let io_err = |what: &str| {
            let what = what.to_string();
            move |source| Error::Io { what, source }
        };
        let mut child = Command::new("/usr/bin/python3")
            .args(["-c", HOLD_IMAGE_OPEN])
            .arg(&cluster.conf_path)
            .args([pool, image])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(io_err("starting the image holder"))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            std::io::BufReader::new(out)
                .read_line(&mut line)
                .map_err(io_err("reading the image holder"))?;
        }
        let holder = ImageHolder(child);
        if line.trim() != "open" {
            return Err(Error::Io {
                what: format!("opening {pool}/{image} in the holder"),
                source: io::Error::other("the holder exited without opening the image"),
            });
        }
        Ok(holder)
    }
}

impl Drop for ImageHolder {
    /// Closing stdin lets the client close the image cleanly, so its watch ends at once.
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

impl Drop for MicroCeph {
    fn drop(&mut self) {
        if self.stop_on_drop {
            stop(&self.dir, false);
        }
    }
}

fn env_value(env: &str, key: &str) -> Option<String> {
    env.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("export ")?.strip_prefix(key)?;
        let value = rest.strip_prefix('=')?;
        // drop a trailing `# comment`
        let value = value.split_once(" #").map_or(value, |(v, _)| v);
        Some(value.trim().to_string())
    })
}

/// Where the cluster scripts live: `MICRO_CEPH_SCRIPTS` or the workspace's `scripts/`.
fn scripts_dir() -> PathBuf {
    std::env::var_os("MICRO_CEPH_SCRIPTS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
        PathBuf::from,
    )
}

fn stop(dir: &Path, kill: bool) {
    let mut cmd = Command::new(scripts_dir().join("micro-ceph-stop.sh"));
    cmd.arg(dir);
    if kill {
        cmd.arg("--kill");
    }
    let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// Claims a mon port: free on 127.0.0.1 and not locked by another test process.
fn claim_port() -> Result<(u16, File), Error> {
    // Start from a pid-dependent offset so parallel binaries rarely probe the same ports.
    let slots = (PORT_LAST - PORT_FIRST) / 100 + 1;
    let start = (std::process::id() % u32::from(slots)) as u16;
    for i in 0..slots {
        let port = PORT_FIRST + ((start + i) % slots) * 100;
        // in /tmp, not TMPDIR: runs with different TMPDIRs must still see each other's claims
        let path = PathBuf::from(format!("/tmp/micro-ceph-port-{port}.lock"));
        let Ok(file) = File::create(&path) else {
            continue;
        };
        // SAFETY: flock(2) on a descriptor we own; the lock lives as long as `file`.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if locked && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok((port, file));
        }
    }
    Err(Error::NoFreePort {
        first: PORT_FIRST,
        last: PORT_LAST,
    })
}

/// Starts a process in its own session that stops the cluster once this process is gone.
fn spawn_guardian(dir: &Path) -> Result<(), Error> {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; exec \"$0\" \"$1\" --kill",
        pid = std::process::id()
    );
    Command::new("setsid")
        .arg("bash")
        .arg("-c")
        .arg(script)
        .arg(scripts_dir().join("micro-ceph-stop.sh"))
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(drop)
        .map_err(|source| Error::Io {
            what: "starting the cluster guardian".into(),
            source,
        })
}

/// Test support beside the cluster: writes executable `path` with `text` through a child process
/// (`sh`), so that the test process never holds the file open for writing. A stand-in program a
/// test process wrote itself can fail to run with ETXTBSY ("Text file busy"): a child another
/// test thread forked meanwhile inherits the write descriptor and keeps it until its own exec.
///
/// # Panics
/// When `sh` cannot be run or fails to write the file (a test helper).
#[allow(clippy::missing_panics_doc, clippy::unwrap_used, clippy::expect_used)]
pub fn write_executable(path: &Path, text: &str) {
    use std::io::Write;
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg("cat > \"$0\" && chmod 755 \"$0\"")
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("running sh");
    sh.stdin
        .take()
        .expect("sh's stdin")
        .write_all(text.as_bytes())
        .expect("writing to sh");
    assert!(
        sh.wait().is_ok_and(|s| s.success()),
        "writing {}",
        path.display()
    );
}

static ATEXIT_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn stop_at_exit() {
    if let Some(dir) = ATEXIT_DIR.get() {
        stop(dir, false);
    }
}

fn register_atexit_stop(dir: &Path) {
    if ATEXIT_DIR.set(dir.to_path_buf()).is_ok() {
        // SAFETY: registers a plain `extern "C"` function with no captured state.
        unsafe {
            libc::atexit(stop_at_exit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_are_read_without_comments() {
        let env =
            "export CEPH_CONF=/x/ceph.conf\nexport CEPH_MON_HOST=127.0.0.1:40000   # monitors\n";
        assert_eq!(env_value(env, "CEPH_CONF").as_deref(), Some("/x/ceph.conf"));
        assert_eq!(
            env_value(env, "CEPH_MON_HOST").as_deref(),
            Some("127.0.0.1:40000")
        );
        assert_eq!(env_value(env, "CEPH"), None);
    }
}
