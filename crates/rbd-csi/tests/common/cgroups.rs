//! The host's cgroup hierarchies as the kernel lists its mounts (`/proc/self/mountinfo`, not
//! the `statfs` the product uses), and cgroups made by tests, removed even when a test fails.
//! Also used by `crates/rbd-provisioner/tests/node_restart.rs`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the host's cgroups are mounted.
pub const ROOT: &str = "/sys/fs/cgroup";

/// The cgroup hierarchies mounted at [`ROOT`] (a cgroup v2 host: `[ROOT]`) or directly below it
/// (a cgroup v1 or hybrid host: every v1 hierarchy and the `unified` v2 mount), each once
/// (mounted twice: the first mount point), sorted.
#[must_use]
pub fn hierarchies() -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut seen = Vec::new();
    let mut found = Vec::new();
    for line in mountinfo.lines() {
        let Some((mount, fs)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = mount.split_whitespace().collect();
        let (device, point) = (fields[2], Path::new(fields[4]));
        let fstype = fs.split_whitespace().next().unwrap_or_default();
        if !matches!(fstype, "cgroup" | "cgroup2") {
            continue;
        }
        if point == Path::new(ROOT) && fstype == "cgroup2" {
            return vec![PathBuf::from(ROOT)];
        }
        if point.parent() == Some(Path::new(ROOT)) && !seen.contains(&device) {
            seen.push(device);
            found.push(point.to_path_buf());
        }
    }
    found.sort();
    found
}

/// The cgroup v2 hierarchy: [`ROOT`] on a cgroup v2 host, `ROOT/unified` on a hybrid one.
#[must_use]
pub fn v2_hierarchy() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let point = Path::new(mount.split_whitespace().nth(4)?);
        (fs.starts_with("cgroup2 ")
            && (point == Path::new(ROOT) || point.parent() == Some(Path::new(ROOT))))
        .then(|| point.to_path_buf())
    })
}

/// `name` in every hierarchy of [`hierarchies`].
#[must_use]
pub fn in_every_hierarchy(name: &str) -> Vec<PathBuf> {
    hierarchies().iter().map(|h| h.join(name)).collect()
}

/// The processes in the cgroup `dir` (none when it does not exist).
#[must_use]
pub fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Creates the cgroup `dir` so that a process can join it, a test's own way: a cgroup v1
/// cpuset gets its parent's `cpuset.cpus` and `cpuset.mems`.
pub fn create_joinable(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let is_v1_cpuset = std::fs::read_to_string(dir.join("cgroup.controllers")).is_err();
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        if is_v1_cpuset && std::fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty()) {
            let parent = std::fs::read_to_string(dir.parent().unwrap().join(file)).unwrap();
            std::fs::write(&own, parent.trim()).unwrap();
        }
    }
}

/// SIGKILL to every process in the cgroups `dirs` until they are empty (what runc does to a
/// container's cgroups on a stop or restart).
///
/// # Panics
/// When they are not empty after 10 s.
pub fn kill_all(dirs: &[PathBuf]) {
    assert!(
        kill_until_empty(dirs),
        "{dirs:?} not empty after 10 s of SIGKILL"
    );
}

/// [`kill_all`] that says whether the cgroups became empty in 10 s instead of panicking.
pub fn kill_until_empty(dirs: &[PathBuf]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<u32> = dirs.iter().flat_map(|d| procs(d)).collect();
        if pids.is_empty() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Cgroups a test made: on drop every process in them is killed and they are removed, deepest
/// first.
pub struct Made(pub Vec<PathBuf>);

impl Drop for Made {
    fn drop(&mut self) {
        let mut dirs: Vec<PathBuf> = self.0.iter().filter(|d| d.exists()).cloned().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        kill_until_empty(&dirs);
        for dir in dirs {
            // A killed process may still be leaving its cgroup (EBUSY) for a moment.
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Err(e) = std::fs::remove_dir(&dir) {
                if e.kind() == std::io::ErrorKind::NotFound {
                    break;
                }
                if Instant::now() > deadline {
                    eprintln!("cannot remove test cgroup {}: {e}", dir.display());
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
