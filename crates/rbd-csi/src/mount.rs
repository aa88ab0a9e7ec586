//! Mount table queries and the mount operations the node service needs (mount a filesystem,
//! bind-mount, remount read-only, unmount), through the `mount(2)`/`umount2(2)` system calls.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted filesystem's device.
    pub device: String,
    /// Root of the mount within the filesystem (`/` unless it is a bind of a subdirectory/file).
    pub root: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type (`ext4`, `xfs`, `fuse.rbd-fuse`, `devtmpfs`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/loop3`, `rbd-fuse`, ...).
    pub source: String,
    /// Per-mount options (`rw,relatime`, ...).
    pub options: String,
}

impl MountEntry {
    /// Whether the mount is read-only.
    #[must_use]
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Parses `/proc/self/mountinfo` text (pure; see `proc(5)` for the format).
#[must_use]
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let right: Vec<&str> = right.split(' ').collect();
    if left.len() < 6 || right.len() < 2 {
        return None;
    }
    Some(MountEntry {
        device: left[2].to_owned(),
        root: unescape(left[3]),
        mount_point: PathBuf::from(unescape(left[4])),
        options: left[5].to_owned(),
        fs_type: right[0].to_owned(),
        source: unescape(right[1]),
    })
}

/// Undoes the octal escaping (`\040` for a space, ...) of mountinfo fields.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current mount table of this process's mount namespace.
///
/// # Errors
/// When `/proc/self/mountinfo` cannot be read.
pub fn mount_table() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// The topmost mount at exactly `path`, if `path` is a mount point.
///
/// # Errors
/// When the mount table cannot be read.
pub fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let path = normalize(path);
    Ok(mount_table()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

/// Whether `path` is a mount point.
///
/// # Errors
/// When the mount table cannot be read.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    Ok(mount_at(path)?.is_some())
}

/// `path` as the kernel's mount table shows mount points: symlinks in its *parent* resolved
/// (kubelet directories are often reached through a symlink), its last component never followed.
/// A symlink at `path` is therefore not "a mount point" even when it points at one: the node
/// service looks at paths inside tenant filesystems, and a tenant's symlink must not redirect it
/// to a host path. Unchanged when the parent does not exist.
fn normalize(path: &Path) -> PathBuf {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
            std::fs::canonicalize(parent)
                .map_or_else(|_| path.to_path_buf(), |parent| parent.join(name))
        }
        _ => path.to_path_buf(),
    }
}

fn cstring(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn sys_mount(
    source: &Path,
    target: &Path,
    fs_type: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = cstring(source)?;
    let target = cstring(target)?;
    let fs_type = fs_type
        .map(|t| CString::new(t).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)))
        .transpose()?;
    let data = data
        .map(|d| CString::new(d).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)))
        .transpose()?;
    // SAFETY: every pointer is a valid NUL-terminated string (or NULL) that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fs_type.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            flags,
            data.as_ref()
                .map_or(std::ptr::null(), |d| d.as_ptr().cast::<libc::c_void>()),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Mount options split into `mount(2)` flags and the filesystem-specific data string.
#[must_use]
pub fn split_options(options: &[String]) -> (libc::c_ulong, String) {
    let mut flags: libc::c_ulong = 0;
    let mut data = Vec::new();
    for option in options.iter().flat_map(|o| o.split(',')) {
        match option.trim() {
            "" | "rw" | "defaults" => {}
            "ro" => flags |= libc::MS_RDONLY,
            "noexec" => flags |= libc::MS_NOEXEC,
            "nosuid" => flags |= libc::MS_NOSUID,
            "nodev" => flags |= libc::MS_NODEV,
            "noatime" => flags |= libc::MS_NOATIME,
            "nodiratime" => flags |= libc::MS_NODIRATIME,
            "relatime" => flags |= libc::MS_RELATIME,
            "sync" => flags |= libc::MS_SYNCHRONOUS,
            other => data.push(other.to_owned()),
        }
    }
    (flags, data.join(","))
}

/// Mounts the filesystem on `device` at `target`.
///
/// # Errors
/// The `mount(2)` error.
pub fn mount_filesystem(
    device: &Path,
    target: &Path,
    fs_type: &str,
    options: &[String],
) -> io::Result<()> {
    let (flags, data) = split_options(options);
    let data = (!data.is_empty()).then_some(data);
    sys_mount(device, target, Some(fs_type), flags, data.as_deref())
}

/// Bind-mounts `source` (a directory or a file, e.g. a device node) onto `target`, read-only
/// when asked (a read-only bind needs a second, remounting call).
///
/// # Errors
/// The `mount(2)` error; a failed read-only remount undoes the bind first.
pub fn bind_mount(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    sys_mount(source, target, None, libc::MS_BIND, None)?;
    if read_only {
        let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        if let Err(e) = sys_mount(Path::new("none"), target, None, flags, None) {
            let _ = unmount(target);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts `target`; `Ok(false)` when nothing was mounted there. A symlink at `target` is never
/// followed (`UMOUNT_NOFOLLOW`): it counts as "nothing mounted".
///
/// # Errors
/// The `umount2(2)` error other than "not mounted" / "does not exist".
pub fn unmount(target: &Path) -> io::Result<bool> {
    let path = cstring(target)?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(path.as_ptr(), libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOENT) => Ok(false),
        _ => Err(err),
    }
}

/// Lazily detaches the mount at `target` (`MNT_DETACH`), for a mount whose server is gone.
///
/// # Errors
/// The `umount2(2)` error other than "not mounted".
pub fn unmount_detach(target: &Path) -> io::Result<()> {
    let path = cstring(target)?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOENT) => Ok(()),
        _ => Err(err),
    }
}

/// Unmounts everything stacked at `target` (a mount point can hold several mounts). Neither the
/// mount-table lookup nor `umount2(2)` follows a symlink at `target`.
///
/// # Errors
/// The first `umount2(2)` error other than "not mounted".
pub fn unmount_all(target: &Path) -> io::Result<()> {
    while is_mount_point(target)? {
        if !unmount(target)? {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 7:3 / /var/lib/kubelet/plugins/x/globalmount rw,relatime shared:50 - xfs /dev/loop3 rw,attr2
99 22 7:3 / /var/lib/kubelet/pods/p/volumes/with\\040space ro,relatime shared:50 - xfs /dev/loop3 rw
100 22 0:5 /loop3 /var/lib/kubelet/block/file rw,nosuid - devtmpfs udev rw,size=1k
101 22 0:60 / /run/rbd-csi/fuse/abc/mnt rw,nosuid,nodev,relatime - fuse.rbd-fuse rbd-fuse rw,user_id=0
";

    #[test]
    fn parses_mountinfo_fields_and_unescapes_paths() {
        let table = parse_mountinfo(SAMPLE);
        assert_eq!(table.len(), 5);
        assert_eq!(table[1].source, "/dev/loop3");
        assert_eq!(table[1].fs_type, "xfs");
        assert_eq!(
            table[2].mount_point,
            PathBuf::from("/var/lib/kubelet/pods/p/volumes/with space")
        );
        assert!(table[2].read_only());
        assert!(!table[1].read_only());
        assert_eq!(table[3].root, "/loop3");
        assert_eq!(table[4].fs_type, "fuse.rbd-fuse");
    }

    #[test]
    fn a_symlink_to_a_mount_point_is_not_a_mount_point() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("device");
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        assert!(is_mount_point(Path::new("/proc")).unwrap());
        assert!(!is_mount_point(&link).unwrap());
        // Not followed by umount2 either: nothing is mounted at the link itself.
        assert!(!unmount(&link).unwrap_or(true));
    }

    #[test]
    fn splits_flags_from_filesystem_options() {
        let (flags, data) =
            split_options(&["ro,noatime".into(), "discard".into(), "nouuid".into()]);
        assert_eq!(flags, libc::MS_RDONLY | libc::MS_NOATIME);
        assert_eq!(data, "discard,nouuid");
    }
}
