//! `NodeStageVolume` and `NodeUnstageVolume`.
//!
//! Stage: validate -> lock the volume -> already staged? done -> map the image -> write the
//! staging record -> filesystem: mkfs when `blkid -p` finds nothing (an existing ext4 is checked
//! and grown offline, which completes an ext4 expansion the kernel refused online), mount at the
//! staging path; block: bind the device onto `<staging>/device`. A failure after mapping unmaps
//! again, so a failed stage leaves nothing behind.
//!
//! Unstage: unmount whatever is at the staging path, unmap what the record says was mapped,
//! remove the record. Every step tolerates "already done".

use std::path::{Path, PathBuf};

use tonic::Status;

use super::NodeService;
use super::record::{self, BLOCK_DEVICE_FILE, StagingRecord};
use super::request::{self, Access};
use crate::fs::{self, FsType};
use crate::mapper::MappedDevice;
use crate::mount;
use crate::proto::csi;
use crate::status::{internal, require};

pub(super) async fn stage(
    node: &NodeService,
    req: csi::NodeStageVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let staging = PathBuf::from(require(&req.staging_target_path, "staging_target_path")?);
    let access = request::access(req.volume_capability.as_ref(), "volume_capability")?;
    let params = request::stage_params(
        volume_id,
        &req.volume_context,
        &req.secrets,
        node.config.default_mounter,
    )?;
    let _guard = node.locks.lock_or_abort(volume_id)?;

    if let Some(existing) =
        record::read(&staging).map_err(|e| internal("reading staging record", &e))?
    {
        if existing.volume_id != volume_id {
            return Err(Status::already_exists(format!(
                "staging path {} holds volume {}, not {volume_id}",
                staging.display(),
                existing.volume_id
            )));
        }
        if existing.block != access.is_block() {
            return Err(Status::already_exists(format!(
                "volume {volume_id} is already staged at {} with another access type",
                staging.display()
            )));
        }
        if staged_target_mounted(&staging, existing.block)? {
            tracing::debug!(volume_id, staging = %staging.display(), "already staged");
            return Ok(());
        }
    }
    std::fs::create_dir_all(&staging).map_err(|e| internal("creating staging path", &e))?;

    let mapper = node.mapper(params.mounter)?;
    tracing::info!(volume_id, image = %params.image, mounter = %params.mounter, "mapping image");
    let mapped = mapper.map(&params.image, &params.key).await?;
    let record = StagingRecord {
        volume_id: volume_id.to_owned(),
        image: params.image.clone(),
        mapped: mapped.clone(),
        block: access.is_block(),
    };
    let result = match record::write(&staging, &record) {
        Ok(()) => expose(&access, &mapped, &staging).await,
        Err(e) => Err(internal("writing staging record", &e)),
    };
    if let Err(status) = result {
        tracing::warn!(volume_id, error = %status.message(), "stage failed; unmapping");
        if let Err(e) = mapper.unmap(&mapped).await {
            tracing::warn!(volume_id, error = %e, "unmap after failed stage failed");
        } else {
            let _ = record::remove(&staging);
        }
        return Err(status);
    }
    tracing::info!(volume_id, device = %mapped.device.display(), staging = %staging.display(), "volume staged");
    Ok(())
}

pub(super) fn staged_target_mounted(staging: &Path, block: bool) -> Result<bool, Status> {
    let target = if block {
        staging.join(BLOCK_DEVICE_FILE)
    } else {
        staging.to_path_buf()
    };
    mount::is_mount_point(&target).map_err(|e| internal("reading mount table", &e))
}

/// Makes the mapped device available at the staging path.
async fn expose(access: &Access, mapped: &MappedDevice, staging: &Path) -> Result<(), Status> {
    match access {
        Access::Block => {
            let file = staging.join(BLOCK_DEVICE_FILE);
            touch(&file)?;
            mount::bind_mount(&mapped.device, &file, false)
                .map_err(|e| internal("binding the block device", &e))
        }
        Access::Mount { fs, flags } => {
            let fs = prepare_filesystem(&mapped.device, *fs).await?;
            mount::mount_filesystem(&mapped.device, staging, fs.name(), flags).map_err(|e| {
                internal(
                    &format!(
                        "mounting {} ({}) at {}",
                        mapped.device.display(),
                        fs.name(),
                        staging.display()
                    ),
                    &e,
                )
            })
        }
    }
}

/// Creates the filesystem on a blank device; returns the filesystem to mount.
async fn prepare_filesystem(device: &Path, wanted: FsType) -> Result<FsType, Status> {
    match fs::probe(device).await? {
        None => {
            tracing::info!(device = %device.display(), fs = wanted.name(), "blank device: creating filesystem");
            fs::mkfs(device, wanted).await?;
            Ok(wanted)
        }
        Some(found) => {
            let existing = FsType::parse(&found).map_err(|_| {
                Status::failed_precondition(format!(
                    "{} holds a {found} filesystem or other data, which this driver does not mount",
                    device.display()
                ))
            })?;
            if existing != wanted {
                tracing::warn!(device = %device.display(), found = %found, wanted = wanted.name(),
                    "existing filesystem differs from the requested fsType; mounting the existing one");
            }
            if existing == FsType::Ext4 {
                // Completes an expansion that could not grow ext4 online.
                fs::grow_ext4_offline(device).await?;
            }
            Ok(existing)
        }
    }
}

fn touch(file: &Path) -> Result<(), Status> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(file)
        .map(drop)
        .map_err(|e| internal(&format!("creating {}", file.display()), &e))
}

pub(super) async fn unstage(
    node: &NodeService,
    req: csi::NodeUnstageVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let staging = PathBuf::from(require(&req.staging_target_path, "staging_target_path")?);
    let _guard = node.locks.lock_or_abort(volume_id)?;

    let existing = record::read(&staging).map_err(|e| internal("reading staging record", &e))?;
    if let Some(existing) = &existing
        && existing.volume_id != volume_id
    {
        return Err(Status::failed_precondition(format!(
            "staging path {} holds volume {}, not {volume_id}",
            staging.display(),
            existing.volume_id
        )));
    }
    let block_file = staging.join(BLOCK_DEVICE_FILE);
    mount::unmount_all(&block_file).map_err(|e| internal("unmounting the block device", &e))?;
    if block_file.exists() {
        std::fs::remove_file(&block_file)
            .map_err(|e| internal("removing the block device file", &e))?;
    }
    mount::unmount_all(&staging).map_err(|e| internal("unmounting the staging path", &e))?;
    if let Some(existing) = existing {
        let mapper = node.mapper(existing.mapped.mounter)?;
        mapper.unmap(&existing.mapped).await?;
        record::remove(&staging).map_err(|e| internal("removing staging record", &e))?;
        tracing::info!(volume_id, device = %existing.mapped.device.display(), "volume unstaged");
    }
    Ok(())
}
