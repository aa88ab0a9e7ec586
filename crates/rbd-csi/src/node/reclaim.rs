//! Reclaiming space on the node (what csi-addons calls `NodeReclaimSpace`): the filesystem of a
//! volume staged here is trimmed (`FITRIM` on its staging mount, what `fstrim` does), so the
//! blocks it has freed are discarded on the device and the mapping passes the discards on to
//! the OSDs, which deallocate them.
//!
//! - **Filesystem volume**: `FITRIM` over the whole filesystem; the filesystem answers with the
//!   bytes it asked the device to discard (freed blocks it had not discarded before, or, for
//!   ext4 after a remount, every free block).
//! - **Block volume**: nothing is discarded here (the device's contents belong to the user:
//!   only they know which blocks are free); [`NodeReclaimed::BlockVolume`].
//! - **Read-only staging**: nothing is discarded ([`NodeReclaimed::ReadOnly`]).
//!
//! **Which mappings pass discards on**: krbd and rbd-nbd turn a discard into librbd/OSD
//! discards (whole objects removed, parts zeroed or truncated). The fuse-loop mapper does not:
//! the loop device takes the discard and punches a hole in its backing file, but Ceph's
//! `rbd-fuse` (16.2) implements no `fallocate`, so nothing reaches RADOS and the image's used
//! size stays as it was ([`NodeReclaimed::Trimmed::reaches_rados`] is `false`).
//!
//! The call takes the volume's lock like the other node calls (`ABORTED` while one runs).
//!
//! **Finding the staging path** from a volume ID alone ([`find_staging`], for a request that
//! comes from the controller rather than the kubelet): where the kubelet stages CSI volumes,
//! `<kubelet dir>/plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`
//! (Kubernetes 1.24 and later), else any staging record of that volume under the driver's
//! directory or the older `.../csi/pv/<PV name>/globalmount` layout.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use tonic::Status;

use super::record::{self, StagingRecord};
use super::{NodeService, blocking};
use crate::mapper::MounterKind;
use crate::status::{internal, require};

/// `FITRIM` (`_IOWR('X', 121, struct fstrim_range)` in `<linux/fs.h>`).
const FITRIM: libc::c_ulong = 0xc018_5879;

/// `struct fstrim_range`.
#[repr(C)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// What a node-side reclaim did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeReclaimed {
    /// The filesystem was trimmed.
    Trimmed {
        /// Bytes the filesystem asked the device to discard (its answer to `FITRIM`).
        bytes: u64,
        /// Whether the mapping passes discards on to RADOS (not through rbd-fuse).
        reaches_rados: bool,
    },
    /// A raw block volume: nothing discarded.
    BlockVolume,
    /// Staged read-only: nothing discarded.
    ReadOnly,
}

impl NodeReclaimed {
    /// One sentence for a status message.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            NodeReclaimed::Trimmed {
                bytes,
                reaches_rados: true,
            } => format!("the filesystem discarded {bytes} bytes of free space on the node"),
            NodeReclaimed::Trimmed {
                bytes,
                reaches_rados: false,
            } => format!(
                "the filesystem discarded {bytes} bytes of free space on the node, but the \
                 rbd-fuse mapping does not pass discards on to Ceph"
            ),
            NodeReclaimed::BlockVolume => {
                "nothing discarded on the node: a block volume's free space is known only to \
                 its user"
                    .to_owned()
            }
            NodeReclaimed::ReadOnly => {
                "nothing discarded on the node: the volume is staged read-only".to_owned()
            }
        }
    }
}

/// `FITRIM` on the filesystem mounted at `mount_point`: the bytes it discarded.
///
/// # Errors
/// The `ioctl`'s error (`EOPNOTSUPP` when the device takes no discards).
pub fn trim(mount_point: &Path) -> std::io::Result<u64> {
    let dir = std::fs::File::open(mount_point)?;
    let mut range = FstrimRange {
        start: 0,
        len: u64::MAX,
        minlen: 0,
    };
    // SAFETY: FITRIM reads and writes one `struct fstrim_range`, which `range` is (repr(C)),
    // alive for the call; the fd is open.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FITRIM, &raw mut range) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // the kernel writes back the number of bytes trimmed in `len`
    Ok(range.len)
}

impl NodeService {
    /// Reclaims the space of `volume_id` staged at `staging_path` (see the module doc).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for an empty argument, `NOT_FOUND` when nothing is staged there,
    /// `FAILED_PRECONDITION` when another volume is, `ABORTED` while another call on the volume
    /// runs, `INTERNAL` when the trim fails.
    pub async fn reclaim_space(
        &self,
        volume_id: &str,
        staging_path: &Path,
    ) -> Result<NodeReclaimed, Status> {
        require(volume_id, "volume_id")?;
        require(&staging_path.to_string_lossy(), "staging_target_path")?;
        let _guard = self.locks.lock_or_abort(volume_id)?;
        let (id, path) = (volume_id.to_owned(), staging_path.to_path_buf());
        let reclaimed = blocking(move || reclaim_staged(&id, &path)).await?;
        tracing::info!(volume_id, outcome = %reclaimed.describe(), "reclaimed space on the node");
        Ok(reclaimed)
    }
}

/// Where a kubelet of Kubernetes 1.24 or later stages the CSI volume `volume_id` of `driver`.
#[must_use]
pub fn kubelet_staging_path(kubelet_dir: &Path, driver: &str, volume_id: &str) -> PathBuf {
    let digest = Sha256::digest(volume_id.as_bytes());
    let hex: String = digest.iter().fold(String::new(), |mut hex, b| {
        use std::fmt::Write;
        let _ = write!(hex, "{b:02x}");
        hex
    });
    kubelet_dir
        .join("plugins/kubernetes.io/csi")
        .join(driver)
        .join(hex)
        .join("globalmount")
}

/// The path `volume_id` is staged at on this node: the kubelet's path for it when its record
/// names the volume, else the first staging record of that volume under the driver's directory
/// or the older per-PV layout (see the module doc); `None` when it is staged nowhere here.
///
/// # Errors
/// A record that cannot be read.
pub fn find_staging(
    kubelet_dir: &Path,
    driver: &str,
    volume_id: &str,
) -> std::io::Result<Option<PathBuf>> {
    let holds = |path: &Path| -> std::io::Result<bool> {
        Ok(record::read(path)?.is_some_and(|r| r.volume_id == volume_id))
    };
    let expected = kubelet_staging_path(kubelet_dir, driver, volume_id);
    if holds(&expected)? {
        return Ok(Some(expected));
    }
    let csi = kubelet_dir.join("plugins/kubernetes.io/csi");
    for parent in [csi.join(driver), csi.join("pv")] {
        let entries = match std::fs::read_dir(&parent) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let staging = entry?.path().join("globalmount");
            // a record another process is replacing is skipped, not an error
            if holds(&staging).unwrap_or(false) {
                return Ok(Some(staging));
            }
        }
    }
    Ok(None)
}

impl NodeService {
    /// Reclaims the space of `volume_id` wherever the kubelet staged it on this node
    /// ([`find_staging`], [`NodeService::reclaim_space`]).
    ///
    /// # Errors
    /// `NOT_FOUND` when it is staged nowhere here; as [`NodeService::reclaim_space`].
    pub async fn reclaim_staged_volume(
        &self,
        kubelet_dir: &Path,
        driver: &str,
        volume_id: &str,
    ) -> Result<NodeReclaimed, Status> {
        require(volume_id, "volume_id")?;
        let (dir, drv, id) = (
            kubelet_dir.to_path_buf(),
            driver.to_owned(),
            volume_id.to_owned(),
        );
        let staging = blocking(move || {
            find_staging(&dir, &drv, &id)
                .map_err(|e| internal("looking for the volume's staging path", &e))
        })
        .await?
        .ok_or_else(|| {
            Status::not_found(format!(
                "volume {volume_id} is not staged on this node (no staging record under {})",
                kubelet_dir.join("plugins/kubernetes.io/csi").display()
            ))
        })?;
        self.reclaim_space(volume_id, &staging).await
    }
}

fn reclaim_staged(volume_id: &str, staging: &Path) -> Result<NodeReclaimed, Status> {
    let staged: StagingRecord = record::read(staging)
        .map_err(|e| internal("reading staging record", &e))?
        .ok_or_else(|| {
            Status::not_found(format!(
                "volume {volume_id} is not staged at {}",
                staging.display()
            ))
        })?;
    if staged.volume_id != volume_id {
        return Err(Status::failed_precondition(format!(
            "staging path {} holds volume {}, not {volume_id}",
            staging.display(),
            staged.volume_id
        )));
    }
    if staged.block {
        return Ok(NodeReclaimed::BlockVolume);
    }
    if staged.read_only {
        return Ok(NodeReclaimed::ReadOnly);
    }
    let bytes =
        trim(staging).map_err(|e| internal(&format!("trimming {}", staging.display()), &e))?;
    Ok(NodeReclaimed::Trimmed {
        bytes,
        reaches_rados: staged.mapped.mounter != MounterKind::FuseLoop,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_s_staging_path_is_the_sha256_of_the_handle() {
        // sha256("abc")
        assert_eq!(
            kubelet_staging_path(Path::new("/var/lib/kubelet"), "rbd.csi.ceph.com", "abc"),
            Path::new(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/rbd.csi.ceph.com/\
                 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad/globalmount"
            )
        );
    }
}
