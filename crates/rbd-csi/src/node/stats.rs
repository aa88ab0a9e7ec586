//! `NodeGetVolumeStats` and `NodeExpandVolume`. Stats runs wholly on the blocking pool (`statvfs`
//! on a hung mount blocks); expand runs its system calls there and its helpers through
//! `tokio::process`.

use std::path::{Path, PathBuf};

use tonic::Status;

use super::record;
use super::{NodeService, blocking, crypt};
use crate::fs::{self, FsType};
use crate::mapper::fuse_loop::FuseAttachment;
use crate::mapper::loop_device::backing_file;
use crate::mapper::{MappedDevice, MounterKind};
use crate::mount;
use crate::proto::csi::{self, volume_usage::Unit};
use crate::status::{internal, require};
use crate::volume::MIB;

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn usage(unit: Unit, total: u64, available: u64, used: u64) -> csi::VolumeUsage {
    csi::VolumeUsage {
        available: to_i64(available),
        total: to_i64(total),
        used: to_i64(used),
        unit: unit as i32,
    }
}

fn condition(abnormal: bool, message: impl Into<String>) -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal,
        message: message.into(),
    }
}

/// Usage and condition of a published (or staged) volume path.
pub(super) fn volume_stats(
    req: &csi::NodeGetVolumeStatsRequest,
) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    let path = Path::new(require(&req.volume_path, "volume_path")?);
    if !path.exists() {
        return Err(Status::not_found(format!(
            "volume_path {} does not exist",
            path.display()
        )));
    }
    let mounted = mount::mount_at(path).map_err(|e| internal("reading mount table", &e))?;
    if mounted.is_none() {
        return Ok(csi::NodeGetVolumeStatsResponse {
            usage: Vec::new(),
            volume_condition: Some(condition(
                true,
                format!("{} is not a mount point", path.display()),
            )),
        });
    }
    // The mapping behind the volume, when the staging record tells: a mount can outlive it.
    let broken = (!req.staging_target_path.is_empty())
        .then(|| {
            record::read(Path::new(&req.staging_target_path))
                .ok()
                .flatten()
        })
        .flatten()
        .and_then(|rec| mapping_problem(&rec.mapped));
    let healthy = |what: &str| match &broken {
        Some(problem) => condition(true, problem.clone()),
        None => condition(false, what),
    };
    if fs::is_block_device(path) {
        let size = fs::block_device_size(path).map_err(|e| internal("reading device size", &e))?;
        return Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![usage(Unit::Bytes, size, 0, 0)],
            volume_condition: Some(healthy("block device is mapped")),
        });
    }
    match fs::usage(path) {
        Ok(u) => Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                usage(Unit::Bytes, u.total_bytes, u.available_bytes, u.used_bytes),
                usage(Unit::Inodes, u.total_inodes, u.free_inodes, u.used_inodes),
            ],
            volume_condition: Some(healthy("volume is mounted")),
        }),
        Err(e) => Ok(csi::NodeGetVolumeStatsResponse {
            usage: Vec::new(),
            volume_condition: Some(condition(
                true,
                format!("statfs {} failed: {e}", path.display()),
            )),
        }),
    }
}

/// Whether `entry` is the only mount of its filesystem (no bind mounts of it elsewhere).
fn only_mount_of_its_filesystem(entry: &mount::MountEntry) -> Result<bool, Status> {
    let table = mount::mount_table().map_err(|e| internal("reading mount table", &e))?;
    Ok(table.iter().filter(|m| m.device == entry.device).count() == 1)
}

/// Unmount, `e2fsck -f` + `resize2fs`, mount again with the same per-mount flags.
async fn grow_offline_in_place(
    entry: &mount::MountEntry,
    device: &Path,
    mount_point: &Path,
) -> Result<(), Status> {
    tracing::info!(device = %device.display(), mount_point = %mount_point.display(),
        "online ext4 grow refused; growing offline (not published anywhere)");
    let target = mount_point.to_path_buf();
    blocking(move || {
        mount::unmount(&target).map_err(|e| internal("unmounting for offline grow", &e))
    })
    .await?;
    let grown = fs::grow_ext4_offline(device).await;
    // Per-mount options are VFS flags; keep those `mount(2)` takes as flags, never pass the
    // rest as filesystem data (ext4 would refuse the mount).
    let flags: Vec<String> = entry
        .options
        .split(',')
        .filter(|o| {
            matches!(
                *o,
                "ro" | "noexec" | "nosuid" | "nodev" | "noatime" | "nodiratime" | "relatime"
            )
        })
        .map(str::to_owned)
        .collect();
    let (device, target) = (device.to_path_buf(), mount_point.to_path_buf());
    blocking(move || {
        mount::mount_filesystem(&device, &target, "ext4", &flags)
            .map_err(|e| internal("remounting after offline grow", &e))
    })
    .await?;
    grown.map_err(Status::from)
}

/// Why a mapping no longer works, if it does not: the device node is gone, or (fuse-loop) the
/// rbd-fuse process serving the image died.
fn mapping_problem(mapped: &MappedDevice) -> Option<String> {
    if !mapped.device.exists() {
        return Some(format!("device {} is gone", mapped.device.display()));
    }
    let fuse = mapped.fuse.as_ref()?;
    match std::fs::metadata(&fuse.image_file) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "rbd-fuse serving {} is gone ({e}); unstage and stage the volume again",
            fuse.image_file.display()
        )),
    }
}

/// The mapped device behind `volume_path`: from the staging record when the staging path is
/// known, else from the mount table (and, for a loop device, its backing rbd-fuse file).
/// Whether the kernel marks the block device read-only (`/sys/block/<name>/ro`).
fn read_only_device(device: &Path) -> bool {
    device.file_name().is_some_and(|name| {
        std::fs::read_to_string(Path::new("/sys/block").join(name).join("ro"))
            .is_ok_and(|ro| ro.trim() == "1")
    })
}

/// The mapped device behind a volume, and the device-mapper name of its opened LUKS device when
/// it is encrypted (known from the staging record only).
fn mapped_device(
    staging: Option<&Path>,
    volume_path: &Path,
) -> Result<(MappedDevice, Option<String>), Status> {
    if let Some(staging) = staging
        && let Some(rec) =
            record::read(staging).map_err(|e| internal("reading staging record", &e))?
    {
        return Ok((rec.mapped, rec.crypt));
    }
    let device = if fs::is_block_device(volume_path) {
        let entry = mount::mount_at(volume_path)
            .map_err(|e| internal("reading mount table", &e))?
            .ok_or_else(|| {
                Status::not_found(format!("{} is not published", volume_path.display()))
            })?;
        PathBuf::from("/dev").join(entry.root.trim_start_matches('/'))
    } else {
        let entry = mount::mount_at(volume_path)
            .map_err(|e| internal("reading mount table", &e))?
            .ok_or_else(|| {
                Status::not_found(format!("{} is not mounted", volume_path.display()))
            })?;
        PathBuf::from(entry.source)
    };
    let fuse = backing_file(&device).and_then(|file| {
        let mount_point = file.parent()?.to_path_buf();
        Some(FuseAttachment {
            instance_dir: mount_point.parent()?.to_path_buf(),
            mount_point,
            image_file: file,
        })
    });
    Ok((
        MappedDevice {
            mounter: if fuse.is_some() {
                MounterKind::FuseLoop
            } else {
                MounterKind::Krbd
            },
            device,
            fuse,
        },
        None,
    ))
}

/// Grows what the node sees after the controller grew the image: the device (fuse-loop needs a
/// nudge), then the filesystem (xfs online; ext4 online when the kernel allows, else a
/// `FAILED_PRECONDITION` telling to re-stage, which grows it offline).
pub(super) async fn expand(
    node: &NodeService,
    req: csi::NodeExpandVolumeRequest,
) -> Result<csi::NodeExpandVolumeResponse, Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let volume_path = PathBuf::from(require(&req.volume_path, "volume_path")?);
    let path = volume_path.clone();
    blocking(move || {
        if path.exists() {
            Ok(())
        } else {
            Err(Status::not_found(format!(
                "volume_path {} does not exist",
                path.display()
            )))
        }
    })
    .await?;
    let _guard = node.locks.lock_or_abort(volume_id)?;
    let staging =
        (!req.staging_target_path.is_empty()).then(|| PathBuf::from(&req.staging_target_path));
    let path = volume_path.clone();
    let (mapped, crypt_name) = blocking(move || mapped_device(staging.as_deref(), &path)).await?;
    if read_only_device(&mapped.device) {
        return Err(Status::failed_precondition(format!(
            "{} is mapped read-only (a reader-only volume): it is not grown; a writable stage \
             grows it",
            mapped.device.display()
        )));
    }
    let required = req
        .capacity_range
        .as_ref()
        .map_or(0, |r| u64::try_from(r.required_bytes).unwrap_or(0));
    if required > 0 {
        let new_size = required.div_ceil(MIB) * MIB;
        node.mapper(mapped.mounter)?
            .refresh_size(&mapped, new_size)
            .await?;
    }
    // An encrypted volume: the LUKS device grows to the grown image, then its filesystem.
    let grown = match &crypt_name {
        Some(name) => {
            crypt::resize(name).await?;
            crypt::mapper_device(name)
        }
        None => mapped.device.clone(),
    };
    let (device, path) = (grown.clone(), volume_path.clone());
    // The device size, and the filesystem mount when the volume is not a raw block volume.
    let (device_size, mounted) = blocking(move || {
        let size =
            fs::block_device_size(&device).map_err(|e| internal("reading device size", &e))?;
        if fs::is_block_device(&path) {
            return Ok((size, None));
        }
        let entry = mount::mount_at(&path)
            .map_err(|e| internal("reading mount table", &e))?
            .ok_or_else(|| Status::not_found(format!("{} is not mounted", path.display())))?;
        let only = only_mount_of_its_filesystem(&entry)?;
        Ok((size, Some((entry, only))))
    })
    .await?;
    if let Some((entry, only_mount)) = mounted {
        let fs = FsType::parse(&entry.fs_type).map_err(Status::failed_precondition)?;
        match fs::grow_online(fs, &grown, &volume_path).await {
            Err(fs::FsError::OnlineGrowRefused { .. }) if only_mount => {
                // Mounted nowhere else (kubelet expands right after staging, before any
                // publish): grow it offline in place.
                grow_offline_in_place(&entry, &grown, &volume_path).await?;
            }
            result => result?,
        }
        tracing::info!(
            volume_id,
            fs = fs.name(),
            size = device_size,
            "filesystem grown"
        );
    }
    Ok(csi::NodeExpandVolumeResponse {
        capacity_bytes: to_i64(device_size),
    })
}
