//! Starting the data-path daemons (`rbd-fuse`, `rbd-nbd`) so that they outlive the node plugin.
//!
//! A mounted fuse volume is served by its `rbd-fuse` process, an nbd device by its `rbd-nbd`
//! process: if that process dies, every I/O on the volume fails (`EIO`) until the volume is
//! staged again. A container runtime that restarts the plugin's container (an upgrade, a crash,
//! a liveness failure) kills every process in the container's cgroup, and a terminal or a
//! supervisor may kill the plugin's whole process group. So every daemon is started:
//!
//! - **in a session of its own** (`setsid` before `exec`): not in the plugin's process group,
//!   no controlling terminal; when the plugin dies the daemon is re-parented and keeps running;
//! - **in the cgroups of [`DaemonPlacement::cgroups`]**, when configured: the process moves
//!   itself there (writes `0` to each directory's `cgroup.procs`) between `fork` and `exec`, so
//!   neither the daemon nor anything it forks (`rbd-nbd map` daemonizes) is ever in the
//!   container's cgroup. Before that it enters the cgroup namespace of PID 1 (the host's, with
//!   `hostPID`), since a private cgroup namespace forbids moves outside it. The directories are
//!   host cgroups (a hostPath mount of the host's `/sys/fs/cgroup`): with cgroup v2 one
//!   directory, with cgroup v1 one in every hierarchy, since a runtime may kill, freeze or
//!   limit by any of them. [`DaemonPlacement::resolve`] turns the one configured directory into
//!   what the host needs and prepares each ([`super::cgroup`]); [`DaemonPlacement::command`]
//!   prepares them again (a directory removed since is created anew).
//!
//! A restarted plugin adopts what it finds: the fuse mapper reuses a live `rbd-fuse` mount and
//! counts its users from the kernel's loop devices, and waits for the old process through
//! `/proc` when it unmounts it; the nbd mapper finds its mappings through
//! `rbd-nbd list-mapped`. Nothing is re-attached because nothing was detached.
//!
//! Not covered: a node reboot (the kubelet stages volumes again), a daemon that crashes by
//! itself (the next stage of a volume on a dead fuse mount restarts `rbd-fuse`), and a runtime
//! whose containers cannot reach the host's cgroups (then only the session protects the
//! daemons: they survive a process-group kill and the plugin's exit, not a container restart).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::MapError;
use super::cgroup::{self, CgroupError};

/// Where data-path daemons are started; see the [module documentation](self).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonPlacement {
    /// Cgroup directories each daemon joins before it runs (empty: the plugin's own cgroups).
    pub cgroups: Vec<PathBuf>,
}

impl DaemonPlacement {
    /// A placement in `cgroups`, taken as they are (see [`DaemonPlacement::resolve`]).
    #[must_use]
    pub fn in_cgroups(cgroups: Vec<PathBuf>) -> Self {
        Self { cgroups }
    }

    /// A placement in the cgroups the `configured` directories stand for on this host
    /// ([`cgroup::resolve`]: the directory itself on cgroup v2 or inside a hierarchy, one per
    /// mounted hierarchy below a cgroup v1 root), each listed once and prepared
    /// ([`cgroup::prepare`]: created, a cgroup v1 cpuset filled, `cgroup.procs` writable). What
    /// the node plugin does once at start, so a misconfiguration fails the start.
    ///
    /// # Errors
    /// The first directory that cannot be resolved or prepared, naming it and the problem.
    pub fn resolve(configured: &[PathBuf]) -> Result<Self, CgroupError> {
        let mut cgroups: Vec<PathBuf> = Vec::new();
        for dir in configured {
            for resolved in cgroup::resolve(dir)? {
                if !cgroups.contains(&resolved) {
                    cgroups.push(resolved);
                }
            }
        }
        for dir in &cgroups {
            cgroup::prepare(dir)?;
        }
        Ok(Self { cgroups })
    }

    /// A command for `program` that starts in a session of its own and in the configured
    /// cgroups (prepared here again: created when missing).
    ///
    /// # Errors
    /// [`MapError::Cgroup`] when a cgroup cannot be prepared ([`cgroup::prepare`]).
    pub fn command(&self, program: &str) -> Result<tokio::process::Command, MapError> {
        let mut procs = Vec::with_capacity(self.cgroups.len());
        for dir in &self.cgroups {
            cgroup::prepare(dir)?;
            let file = dir.join("cgroup.procs");
            procs.push(CString::new(file.as_os_str().as_bytes()).map_err(|e| {
                MapError::io(
                    "using daemon cgroup",
                    dir.display(),
                    std::io::Error::other(e),
                )
            })?);
        }
        // Enter the cgroup namespace of PID 1 (the host's init when the plugin runs with the
        // host's PID namespace) first: with a private cgroup namespace (containerd's default on
        // cgroup v2) the kernel refuses to move a process to a cgroup outside it.
        let host_cgroup_ns = (!procs.is_empty())
            .then(|| CString::new("/proc/1/ns/cgroup"))
            .transpose()
            .map_err(|e| MapError::io("using", "/proc/1/ns/cgroup", std::io::Error::other(e)))?;
        let mut command = tokio::process::Command::new(program);
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (setsid, open, write, close; errno), allocating nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(ns) = &host_cgroup_ns {
                    // Best effort: without CAP_SYS_ADMIN this fails, and a cgroup outside the
                    // namespace then fails below with the kernel's error.
                    let fd = libc::open(ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                    if fd >= 0 {
                        libc::setns(fd, libc::CLONE_NEWCGROUP);
                        libc::close(fd);
                    }
                }
                for file in &procs {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let error = std::io::Error::last_os_error();
                    libc::close(fd);
                    if written != 1 {
                        return Err(error);
                    }
                }
                Ok(())
            });
        }
        Ok(command)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_daemon_runs_in_a_session_of_its_own() {
        let out = DaemonPlacement::default()
            .command("sh")
            .unwrap()
            .args(["-c", "ps -o sid= -p $$; echo $$"])
            .output()
            .await
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.split_whitespace();
        let (sid, pid) = (lines.next().unwrap(), lines.next().unwrap());
        assert_eq!(sid, pid, "session leader of its own session");
    }

    #[tokio::test]
    async fn a_directory_that_is_not_a_cgroup_is_refused_with_its_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("not-a-cgroup");
        let err = DaemonPlacement::in_cgroups(vec![dir.clone()])
            .command("true")
            .unwrap_err();
        assert!(
            err.to_string().contains(&dir.display().to_string()),
            "{err}"
        );
        assert!(err.to_string().contains("cgroup.procs"), "{err}");
    }
}
