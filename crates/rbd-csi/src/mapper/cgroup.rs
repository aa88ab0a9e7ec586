//! The host cgroups data-path daemons start in ([`super::daemon`]): what a configured directory
//! resolves to on the host's cgroup layout, and preparing each resolved directory.
//!
//! # Resolving
//!
//! A configured directory (`--daemon-cgroup`) is judged by the file system types (`statfs`) of
//! the directory and of the nearest existing directory above it, its *anchor*:
//!
//! 1. The directory exists on a cgroup file system, or its anchor is on one (cgroup v2, or one
//!    cgroup v1 hierarchy): the directory as given.
//! 2. The anchor is a **cgroup v1 root**: not a cgroup itself (the tmpfs a cgroup v1 or hybrid
//!    host mounts at `/sys/fs/cgroup`) but holding cgroup v1 hierarchy mounts. The directory
//!    stands for one cgroup per hierarchy mounted there, `<anchor>/<hierarchy>/<rest>`: every
//!    controller hierarchy (`cpuset`, `cpu,cpuacct`, `memory`, `devices`, `freezer`, `pids`,
//!    ...), the named `systemd` hierarchy and the `unified` cgroup v2 mount of a hybrid host.
//!    A hierarchy reached through several names (the symlinks `cpu` and `cpuacct` to
//!    `cpu,cpuacct`) or mounted twice is counted once, under its canonical path.
//! 3. Anything else is refused, naming the directory and its anchor.
//!
//! So with the host's `/sys/fs/cgroup` mounted at `/host-cgroup` (a hostPath mount brings the
//! hierarchy mounts below it along), `/host-cgroup/rbd-csi-daemons` is that one cgroup on a
//! cgroup v2 host and `/host-cgroup/blkio/rbd-csi-daemons`, `/host-cgroup/cpu,cpuacct/
//! rbd-csi-daemons`, `/host-cgroup/cpuset/rbd-csi-daemons`, ... on a cgroup v1 host.
//!
//! The file system type is what the kernel reports for the path as this process sees it, so it
//! holds inside a container, through bind mounts, where `/proc/self/mountinfo` would name mount
//! points the container cannot reach.
//!
//! # Preparing
//!
//! A resolved directory is created when missing, with its missing parents. In a cgroup v1
//! `cpuset` hierarchy a new cgroup starts with empty `cpuset.cpus` and `cpuset.mems`, and the
//! kernel refuses a process into it (`ENOSPC`) until both are set: empty ones are copied from
//! the parent cgroup, top-down. (cgroup v2 has no such rule, and its empty `cpuset.cpus` means
//! "the parent's": it is left alone.) Then the directory must have a `cgroup.procs` this process
//! can open for writing.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Why a configured or resolved daemon cgroup cannot be used. Every message starts with the
/// directory.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The directory is not an absolute path without `..`.
    #[error("{path:?}: must be an absolute path without \"..\" components")]
    NotAbsolute { path: PathBuf },
    /// Neither the directory nor its anchor is on a cgroup file system, and the anchor holds no
    /// cgroup v1 hierarchy mounts.
    #[error(
        "{path}: not a cgroup: {anchor} is neither on a cgroup file system (cgroup v2 or a \
         cgroup v1 hierarchy) nor a cgroup v1 root holding hierarchy mounts (is the host's \
         /sys/fs/cgroup mounted there?)"
    )]
    NotACgroup { path: PathBuf, anchor: PathBuf },
    /// The directory exists (or was created) but has no `cgroup.procs`.
    #[error("{path}: no cgroup.procs: not a cgroup directory")]
    NoProcs { path: PathBuf },
    /// A file system operation failed; `problem` says which, in words.
    #[error("{path}: {problem}: {source}")]
    Io {
        path: PathBuf,
        problem: String,
        #[source]
        source: io::Error,
    },
}

impl CgroupError {
    fn io(path: &Path, doing: &str, source: io::Error) -> Self {
        let problem = if is_permission(&source) {
            format!("no write permission ({doing})")
        } else {
            doing.to_owned()
        };
        Self::Io {
            path: path.to_path_buf(),
            problem,
            source,
        }
    }
}

fn is_permission(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

/// The file system a path is on, as far as cgroups go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FsType {
    /// A cgroup v1 hierarchy (`CGROUP_SUPER_MAGIC`).
    CgroupV1,
    /// The cgroup v2 hierarchy (`CGROUP2_SUPER_MAGIC`).
    CgroupV2,
    /// Anything else (tmpfs, sysfs, a disk).
    Other,
}

impl FsType {
    fn is_cgroup(self) -> bool {
        self != Self::Other
    }
}

/// `statfs(path)`: the type of the file system `path` (symlinks followed) is on.
fn fs_type(path: &Path) -> io::Result<FsType> {
    Ok(match crate::fs::fs_magic(path)? {
        libc::CGROUP_SUPER_MAGIC => FsType::CgroupV1,
        libc::CGROUP2_SUPER_MAGIC => FsType::CgroupV2,
        _ => FsType::Other,
    })
}

/// The cgroup directories `configured` stands for on this host; see the
/// [module documentation](self). Reads the file system, changes nothing.
///
/// # Errors
/// [`CgroupError::NotAbsolute`], [`CgroupError::NotACgroup`], or [`CgroupError::Io`] when a
/// directory cannot be examined.
pub fn resolve(configured: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let normal = configured.is_absolute()
        && configured
            .components()
            .all(|c| !matches!(c, Component::ParentDir));
    if !normal {
        return Err(CgroupError::NotAbsolute {
            path: configured.to_path_buf(),
        });
    }
    if fs_type(configured).is_ok_and(FsType::is_cgroup) {
        return Ok(vec![configured.to_path_buf()]);
    }
    let anchor = configured
        .ancestors()
        .skip(1)
        .find(|dir| std::fs::metadata(dir).is_ok())
        .unwrap_or(Path::new("/"));
    let anchor_type =
        fs_type(anchor).map_err(|e| CgroupError::io(anchor, "cannot examine it", e))?;
    if anchor_type.is_cgroup() {
        return Ok(vec![configured.to_path_buf()]);
    }
    let hierarchies = v1_hierarchies(anchor)?;
    if hierarchies.is_empty() {
        return Err(CgroupError::NotACgroup {
            path: configured.to_path_buf(),
            anchor: anchor.to_path_buf(),
        });
    }
    let rest = configured.strip_prefix(anchor).unwrap_or(configured);
    Ok(hierarchies.iter().map(|h| h.join(rest)).collect())
}

/// The cgroup hierarchies mounted directly in `root`, by canonical path, sorted, each once
/// (under two mounts: the first path); empty unless at least one of them is a cgroup v1
/// hierarchy (a directory holding only a cgroup v2 mount, like `/sys/fs` of a v2 host, is no
/// cgroup v1 root).
fn v1_hierarchies(root: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let entries =
        std::fs::read_dir(root).map_err(|e| CgroupError::io(root, "cannot list it", e))?;
    let mut candidates: Vec<(PathBuf, u64, FsType)> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| CgroupError::io(root, "cannot list it", e))?;
        let path = entry.path();
        // A broken symlink or an entry that vanished is no hierarchy.
        let Ok(kind) = fs_type(&path) else { continue };
        if !kind.is_cgroup() {
            continue;
        }
        if let (Ok(canonical), Ok(meta)) = (std::fs::canonicalize(&path), std::fs::metadata(&path))
        {
            candidates.push((canonical, meta.dev(), kind));
        }
    }
    if !candidates
        .iter()
        .any(|(_, _, kind)| *kind == FsType::CgroupV1)
    {
        return Ok(Vec::new());
    }
    candidates.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hierarchies: Vec<(PathBuf, u64)> = Vec::new();
    for (path, dev, _) in candidates {
        // One device per hierarchy: the same hierarchy under two mounts counts once.
        if !hierarchies.iter().any(|(p, d)| *p == path || *d == dev) {
            hierarchies.push((path, dev));
        }
    }
    Ok(hierarchies.into_iter().map(|(path, _)| path).collect())
}

/// Makes `dir` a cgroup a daemon can join: created when missing, a cgroup v1 cpuset's
/// `cpuset.cpus` and `cpuset.mems` filled from its parent, `cgroup.procs` writable.
///
/// # Errors
/// [`CgroupError::Io`] when the directory cannot be created or filled, or `cgroup.procs` not
/// opened for writing; [`CgroupError::NoProcs`] when it is not a cgroup.
pub fn prepare(dir: &Path) -> Result<(), CgroupError> {
    std::fs::create_dir_all(dir).map_err(|e| CgroupError::io(dir, "cannot create it", e))?;
    let kind = fs_type(dir).map_err(|e| CgroupError::io(dir, "cannot examine it", e))?;
    if kind == FsType::CgroupV1 {
        for file in ["cpuset.cpus", "cpuset.mems"] {
            fill_from_parent(dir, file)?;
        }
    }
    let procs = dir.join("cgroup.procs");
    if !procs.exists() {
        return Err(CgroupError::NoProcs {
            path: dir.to_path_buf(),
        });
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&procs)
        .map_err(|e| CgroupError::io(&procs, "cannot open it for writing", e))?;
    Ok(())
}

/// Copies the parent cgroup's `file` into `dir`'s when `dir`'s is empty, filling the parent
/// first the same way (a cgroup created with its parents has empty ancestors too). A cgroup
/// without `file` (not in a cpuset hierarchy) is left alone.
fn fill_from_parent(dir: &Path, file: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    let value = match std::fs::read_to_string(&path) {
        Ok(value) => value,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CgroupError::io(&path, "cannot read it", e)),
    };
    if !value.trim().is_empty() {
        return Ok(());
    }
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    fill_from_parent(parent, file)?;
    let parent_file = parent.join(file);
    let inherited = std::fs::read_to_string(&parent_file)
        .map_err(|e| CgroupError::io(&parent_file, "cannot read it", e))?;
    std::fs::write(&path, inherited.trim())
        .map_err(|e| CgroupError::io(&path, "cannot copy the parent's value into it", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_or_dotted_directory_is_refused() {
        for bad in ["rbd-csi-daemons", "/sys/fs/cgroup/../rbd-csi-daemons", ""] {
            let err = resolve(Path::new(bad)).unwrap_err();
            assert!(
                matches!(err, CgroupError::NotAbsolute { .. }),
                "{bad:?}: {err}"
            );
            assert!(err.to_string().contains("absolute path"), "{err}");
        }
    }

    #[test]
    fn a_directory_outside_any_cgroup_file_system_is_refused_naming_it_and_its_anchor() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("host-cgroup/rbd-csi-daemons");
        let err = resolve(&dir).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CgroupError::NotACgroup { .. }), "{text}");
        assert!(text.starts_with(&dir.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("{} is neither", tmp.path().display())),
            "{text}"
        );
        assert!(!dir.exists(), "resolving creates nothing");
    }

    #[test]
    fn a_directory_without_cgroup_procs_is_refused_as_not_a_cgroup() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("plain");
        let err = prepare(&dir).unwrap_err();
        assert!(matches!(err, CgroupError::NoProcs { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!("{}: no cgroup.procs: not a cgroup directory", dir.display())
        );
    }

    #[test]
    fn a_place_refusing_new_directories_is_reported_as_no_write_permission() {
        // sysfs refuses new directories (EPERM), to root too.
        let dir = Path::new("/sys/rbd-csi-daemons");
        let err = prepare(dir).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("/sys/rbd-csi-daemons: no write permission (cannot create it): "),
            "{text}"
        );
    }
}
