//! Filesystem work on a mapped device: detect an existing filesystem, create one (fast options),
//! grow one, and measure usage.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::exec::{self, ExecError};

/// Filesystems the node service creates and grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    /// Parses a CSI `fs_type` (`""` means the default, ext4, as in ceph-csi).
    ///
    /// # Errors
    /// The unsupported name, for an `INVALID_ARGUMENT`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "" | "ext4" => Ok(Self::Ext4),
            "xfs" => Ok(Self::Xfs),
            other => Err(format!(
                "unsupported fsType {other:?} (supported: ext4, xfs)"
            )),
        }
    }

    /// The name `mount(2)` and `mkfs.<name>` use.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ext4 => "ext4",
            Self::Xfs => "xfs",
        }
    }

    /// `mkfs` arguments before the device: quiet, and fast on a thin-provisioned RBD image
    /// (no discard of the whole image, lazy inode tables, no reserved blocks), like ceph-csi.
    #[must_use]
    pub fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            Self::Ext4 => &[
                "-q",
                "-F",
                "-m0",
                "-Enodiscard,lazy_itable_init=1,lazy_journal_init=1",
            ],
            Self::Xfs => &["-q", "-K"],
        }
    }
}

/// Errors of filesystem operations.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    /// ext4 refused to grow while mounted (this sandbox refuses online ext4 resize).
    #[error(
        "online ext4 grow of {device} was refused ({detail}); unstage and stage the volume again \
         (offline e2fsck + resize2fs happens at stage time) or use xfs"
    )]
    OnlineGrowRefused { device: String, detail: String },
}

/// The filesystem type found on `device` by a low-level probe (`blkid -p`), `None` when blank.
///
/// # Errors
/// When `blkid` fails other than with "nothing found" (exit code 2).
pub async fn probe(device: &Path) -> Result<Option<String>, FsError> {
    let dev = device.to_string_lossy();
    match exec::run("blkid", &["-p", "-s", "TYPE", "-o", "value", &dev]).await {
        Ok(out) => {
            let fs = out.stdout.trim();
            Ok((!fs.is_empty()).then(|| fs.to_owned()))
        }
        Err(e) if e.exit_code() == Some(2) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Creates a filesystem on `device`.
///
/// # Errors
/// When mkfs fails.
pub async fn mkfs(device: &Path, fs: FsType) -> Result<(), FsError> {
    let dev = device.to_string_lossy();
    let program = format!("mkfs.{}", fs.name());
    let mut args: Vec<&str> = fs.mkfs_args().to_vec();
    args.push(&dev);
    exec::run(&program, &args).await?;
    Ok(())
}

/// Repairs/grows an unmounted ext4 filesystem to its device (offline: always allowed).
///
/// # Errors
/// When e2fsck finds uncorrectable errors or resize2fs fails.
pub async fn grow_ext4_offline(device: &Path) -> Result<(), FsError> {
    let dev = device.to_string_lossy();
    // e2fsck exit codes 0 (clean) and 1 (errors corrected) are fine.
    match exec::run("e2fsck", &["-f", "-p", &dev]).await {
        Ok(_) => {}
        Err(e) if e.exit_code() == Some(1) => {}
        Err(e) => return Err(e.into()),
    }
    exec::run("resize2fs", &[&dev]).await?;
    Ok(())
}

/// Grows the filesystem mounted at `mount_point` (on `device`) to the device size.
///
/// # Errors
/// [`FsError::OnlineGrowRefused`] when the kernel refuses an online ext4 resize; the tool's error
/// otherwise.
pub async fn grow_online(fs: FsType, device: &Path, mount_point: &Path) -> Result<(), FsError> {
    match fs {
        FsType::Xfs => {
            exec::run("xfs_growfs", &[&mount_point.to_string_lossy()]).await?;
            Ok(())
        }
        FsType::Ext4 => {
            let dev = device.to_string_lossy();
            match exec::run("resize2fs", &[&dev]).await {
                Ok(_) => Ok(()),
                Err(ExecError::Failed { stderr, .. }) => Err(FsError::OnlineGrowRefused {
                    device: dev.into_owned(),
                    detail: last_line(&stderr),
                }),
                Err(e) => Err(e.into()),
            }
        }
    }
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// Usage of a mounted filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub total_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

/// `statvfs(2)` of the filesystem holding `path`.
///
/// # Errors
/// The system call's error.
pub fn usage(path: &Path) -> io::Result<Usage> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs is plain old data; zeroed is a valid value that the call overwrites.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &raw mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize;
    let total_bytes = st.f_blocks * frsize;
    let available_bytes = st.f_bavail * frsize;
    let used_bytes = (st.f_blocks - st.f_bfree) * frsize;
    Ok(Usage {
        total_bytes,
        available_bytes,
        used_bytes,
        total_inodes: st.f_files,
        free_inodes: st.f_ffree,
        used_inodes: st.f_files - st.f_ffree,
    })
}

/// Whether `path` is (or is a bind mount of) a block device node.
#[must_use]
pub fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// Size in bytes of the block device at `path` (`BLKGETSIZE64`).
///
/// # Errors
/// When the device cannot be opened or queried.
pub fn block_device_size(path: &Path) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // BLKGETSIZE64 = _IOR(0x12, 114, size_t)
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let file = std::fs::File::open(path)?;
    let mut size: u64 = 0;
    // SAFETY: the fd is open for the call's duration and `size` is a valid u64 out pointer.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &raw mut size) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_type_defaults_to_ext4_and_rejects_unknown() {
        assert_eq!(FsType::parse(""), Ok(FsType::Ext4));
        assert_eq!(FsType::parse("xfs"), Ok(FsType::Xfs));
        assert!(FsType::parse("btrfs").unwrap_err().contains("btrfs"));
    }

    #[test]
    fn mkfs_options_are_the_fast_ones() {
        assert!(FsType::Ext4.mkfs_args().contains(&"-m0"));
        assert!(
            FsType::Ext4
                .mkfs_args()
                .contains(&"-Enodiscard,lazy_itable_init=1,lazy_journal_init=1")
        );
        assert!(FsType::Xfs.mkfs_args().contains(&"-K"));
    }

    #[test]
    fn statvfs_reports_nonzero_totals_for_root() {
        let u = usage(Path::new("/")).unwrap();
        assert!(u.total_bytes > 0 && u.total_bytes >= u.used_bytes);
    }
}
