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

/// What a device holds, as far as the node service may act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// Provably blank: no signature `blkid -p` knows and the first [`BLANK_CHECK_BYTES`] all
    /// zero. The only state in which a filesystem is created.
    Blank,
    /// A filesystem (or other `TYPE` blkid names: `crypto_LUKS`, `LVM2_member`, `swap`, ...).
    Filesystem(String),
    /// Something else: a partition table, or data blkid does not recognise. Never formatted.
    Other(String),
}

/// How much of the start of a device must be zero for it to count as blank.
pub const BLANK_CHECK_BYTES: usize = 1 << 20;

/// Probes `device` as Kubernetes' mount-utils does (`blkid -p`, low-level superblock and
/// partition-table probing, no cache), but with every tag rather than `TYPE` and `PTTYPE` only,
/// and treats only "nothing found" (exit code 2) with an all-zero first MiB as blank: a partition
/// table alone, an ambivalent probe or unrecognised data is [`Contents::Other`].
///
/// # Errors
/// When `blkid` fails other than with "nothing found", or the device cannot be read.
pub async fn probe(device: &Path) -> Result<Contents, FsError> {
    let dev = device.to_string_lossy();
    match exec::run("blkid", &["-p", "-o", "export", &dev]).await {
        Ok(out) => Ok(classify_blkid_export(&out.stdout)),
        Err(e) if e.exit_code() == Some(2) => {
            let path = device.to_path_buf();
            let zero = tokio::task::spawn_blocking(move || starts_with_zeros(&path))
                .await
                .map_err(|e| FsError::Io {
                    what: "reading",
                    path: dev.to_string(),
                    source: io::Error::other(e),
                })?
                .map_err(|source| FsError::Io {
                    what: "reading",
                    path: dev.to_string(),
                    source,
                })?;
            Ok(if zero {
                Contents::Blank
            } else {
                Contents::Other(format!(
                    "data blkid does not recognise (the first {} KiB are not all zero)",
                    BLANK_CHECK_BYTES >> 10
                ))
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// Classifies `blkid -p -o export` output (pure): a partition table wins over a filesystem
/// type (as in mount-utils: a whole-disk `TYPE` next to a `PTTYPE` is not mounted either).
#[must_use]
pub fn classify_blkid_export(output: &str) -> Contents {
    let tag = |name: &str| {
        output.lines().find_map(|line| {
            line.split_once('=')
                .filter(|(k, v)| k.trim() == name && !v.trim().is_empty())
                .map(|(_, v)| v.trim().to_owned())
        })
    };
    match (tag("PTTYPE"), tag("TYPE")) {
        (Some(pt), _) => Contents::Other(format!("a {pt} partition table")),
        (None, Some(fs)) => Contents::Filesystem(fs),
        (None, None) => {
            let tags: Vec<&str> = output
                .lines()
                .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim()))
                .filter(|k| *k != "DEVNAME")
                .collect();
            Contents::Other(format!(
                "a signature blkid reports without a type ({})",
                tags.join(", ")
            ))
        }
    }
}

/// Whether the first [`BLANK_CHECK_BYTES`] of `device` (or all of it, when smaller) are zero.
fn starts_with_zeros(device: &Path) -> io::Result<bool> {
    use std::io::Read;
    let mut file = std::fs::File::open(device)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut left = BLANK_CHECK_BYTES;
    while left > 0 {
        let want = left.min(buf.len());
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
        left -= n;
    }
    Ok(true)
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

/// The file system type (`statfs(2)`'s `f_type`, e.g. `libc::TMPFS_MAGIC`) of the file system
/// holding `path` (symlinks followed).
///
/// # Errors
/// The system call's error.
pub fn fs_magic(path: &Path) -> io::Result<libc::__fsword_t> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    // SAFETY: statfs is plain old data; zeroed is a valid value that the call overwrites.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type)
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
    fn a_partition_table_is_never_blank_nor_a_filesystem() {
        assert_eq!(
            classify_blkid_export("DEVNAME=/dev/loop1\nPTUUID=12345678\nPTTYPE=dos\n"),
            Contents::Other("a dos partition table".into())
        );
        assert_eq!(
            classify_blkid_export("DEVNAME=/dev/rbd0\nPTTYPE=gpt\nTYPE=vfat\n"),
            Contents::Other("a gpt partition table".into())
        );
        assert_eq!(
            classify_blkid_export("DEVNAME=/dev/rbd0\nUUID=x\nBLOCK_SIZE=4096\nTYPE=ext4\n"),
            Contents::Filesystem("ext4".into())
        );
        assert!(matches!(
            classify_blkid_export("DEVNAME=/dev/rbd0\nUSAGE=other\n"),
            Contents::Other(_)
        ));
    }

    #[test]
    fn only_zeros_count_as_blank() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("img");
        std::fs::write(&file, vec![0u8; 3 << 20]).unwrap();
        assert!(starts_with_zeros(&file).unwrap());
        let mut bytes = vec![0u8; 3 << 20];
        bytes[BLANK_CHECK_BYTES - 1] = 1;
        std::fs::write(&file, &bytes).unwrap();
        assert!(!starts_with_zeros(&file).unwrap());
        bytes[BLANK_CHECK_BYTES - 1] = 0;
        bytes[BLANK_CHECK_BYTES] = 1;
        std::fs::write(&file, &bytes).unwrap();
        assert!(starts_with_zeros(&file).unwrap());
    }

    #[test]
    fn statvfs_reports_nonzero_totals_for_root() {
        let u = usage(Path::new("/")).unwrap();
        assert!(u.total_bytes > 0 && u.total_bytes >= u.used_bytes);
    }
}
