//! The processes the benchmark starts (kube-emulator, rbd-provisioner), always stopped, and their
//! resource figures read from `/proc`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Where the workspace lives (for `cargo build` and the default output path).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding `rbd-provisioner` and `kube-emulator`: next to this executable
/// (`target/release` under `cargo run --release`). Builds them there first unless `no_build`
/// (cargo does nothing when they are up to date).
pub fn binaries(no_build: bool) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the rbd-bench executable")?;
    let dir = exe
        .parent()
        .context("the rbd-bench executable has no parent directory")?
        .to_path_buf();
    if !no_build {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(workspace_root()).args([
            "build",
            "-p",
            "rbd-provisioner",
            "-p",
            "kube-emulator",
        ]);
        if release {
            cmd.arg("--release");
        }
        eprintln!(
            "building rbd-provisioner and kube-emulator ({})",
            dir.display()
        );
        let status = cmd.status().context("running cargo build")?;
        if !status.success() {
            bail!("cargo build of rbd-provisioner and kube-emulator failed: {status}");
        }
    }
    for bin in ["rbd-provisioner", "kube-emulator"] {
        if !dir.join(bin).is_file() {
            bail!(
                "{} not found; run `cargo build --release -p rbd-provisioner -p kube-emulator`",
                dir.join(bin).display()
            );
        }
    }
    Ok(dir)
}

/// A child process stopped on drop: SIGTERM, then SIGKILL after 5 s. It also gets SIGKILL from
/// the kernel if the benchmark dies without running destructors (`PR_SET_PDEATHSIG`).
pub struct Proc {
    name: &'static str,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `program ARGS` with stdout and stderr to `log`. Call it from the main thread: the
    /// death signal follows the spawning thread.
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: PathBuf,
    ) -> anyhow::Result<Proc> {
        let file = std::fs::File::create(&log)
            .with_context(|| format!("creating log file {}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_remove("RUST_LOG")
            .env_remove("PROVISIONER_NAME")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        // SAFETY: prctl(2) is async-signal-safe and the closure touches no shared state.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        Ok(Proc { name, child, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has already exited (with the tail of its log).
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited early ({status}); log {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log, 5)
            );
        }
        Ok(())
    }

    /// Graceful stop (SIGTERM), SIGKILL when it does not exit within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid; no memory is involved.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let end = Instant::now() + grace;
        while Instant::now() < end {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The last `lines` lines of a log file.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = strip_ansi(&std::fs::read_to_string(path).unwrap_or_default());
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Drops terminal colour sequences (`ESC [ ... m`) from a log.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Resource figures of a process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// utime + stime, seconds.
    pub cpu_secs: f64,
    /// VmRSS, bytes.
    pub rss: u64,
    /// VmHWM (peak RSS since start), bytes.
    pub peak_rss: u64,
    /// RssAnon (private anonymous memory: heap, stacks), bytes. VmRSS also counts the pages of
    /// the shared libraries (librbd, librados, libceph-common) the process touched.
    pub rss_anon: u64,
    /// Number of threads.
    pub threads: u64,
}

/// The CPU times of a process in seconds, from `/proc/PID/stat`: utime, stime, cutime and
/// cstime (its own user and system time, then its waited-for children's), in clock ticks.
pub fn cpu_times(pid: u32) -> anyhow::Result<[f64; 4]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // fields after the command name (which may contain spaces) start at field 3 (state)
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as f64 } else { 100.0 };
    // utime, stime, cutime, cstime are fields 14-17 (1-based): indices 11-14 after the state
    let mut times = [0.0; 4];
    for (k, time) in times.iter_mut().enumerate() {
        let ticks = fields
            .get(11 + k)
            .context("short /proc/PID/stat")?
            .parse::<u64>()
            .context("parsing /proc/PID/stat")?;
        *time = ticks as f64 / hz;
    }
    Ok(times)
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`.
pub fn sample(pid: u32) -> anyhow::Result<Sample> {
    let [utime, stime, _, _] = cpu_times(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok(Sample {
        cpu_secs: utime + stime,
        rss: kib("VmRSS:"),
        peak_rss: kib("VmHWM:"),
        rss_anon: kib("RssAnon:"),
        threads: kib("Threads:") / 1024,
    })
}

/// Samples a process every 100 ms and keeps the highest RssAnon seen; stops on drop.
pub struct AnonPeak {
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl AnonPeak {
    pub fn start(pid: u32) -> AnonPeak {
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let Ok(s) = sample(pid) else { return };
                p.fetch_max(s.rss_anon, std::sync::atomic::Ordering::Relaxed);
            }
        });
        AnonPeak { peak, task }
    }

    /// The highest RssAnon so far, bytes.
    pub fn get(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for AnonPeak {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss > 0 && s.peak_rss >= s.rss && s.rss_anon > 0);
        assert!(s.threads >= 1);
    }

    #[test]
    fn colour_codes_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2mts\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x"),
            "ts  INFO x"
        );
    }
}
