//! `NodePublishVolume` (bind mount of the staging path, or of the device node for block volumes,
//! read-only when asked) and `NodeUnpublishVolume`.

use std::path::{Path, PathBuf};

use tonic::Status;

use super::NodeService;
use super::record;
use super::request;
use super::stage;
use crate::mount;
use crate::proto::csi;
use crate::status::{internal, require};

pub(super) fn publish(
    node: &NodeService,
    req: &csi::NodePublishVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let staging = PathBuf::from(require(&req.staging_target_path, "staging_target_path")?);
    let target = PathBuf::from(require(&req.target_path, "target_path")?);
    let access = request::access(req.volume_capability.as_ref(), "volume_capability")?;
    let _guard = node.locks.lock_or_abort(volume_id)?;

    let staged = record::read(&staging)
        .map_err(|e| internal("reading staging record", &e))?
        .filter(|r| r.volume_id == volume_id)
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "volume {volume_id} is not staged at {}",
                staging.display()
            ))
        })?;
    if staged.block != access.is_block() {
        return Err(Status::invalid_argument(format!(
            "volume {volume_id} was staged as {} but is published as {}",
            kind(staged.block),
            kind(access.is_block())
        )));
    }
    if !stage::staged_target_mounted(&staging, staged.block)? {
        return Err(Status::failed_precondition(format!(
            "volume {volume_id} has a staging record at {} but is not mounted there; stage it again",
            staging.display()
        )));
    }
    if let Some(existing) =
        mount::mount_at(&target).map_err(|e| internal("reading mount table", &e))?
    {
        if existing.read_only() != req.readonly {
            return Err(Status::already_exists(format!(
                "{} is already published with readonly={}",
                target.display(),
                existing.read_only()
            )));
        }
        return Ok(());
    }
    let source = if staged.block {
        create_file(&target)?;
        staged.exposed_device()
    } else {
        std::fs::create_dir_all(&target).map_err(|e| internal("creating target_path", &e))?;
        staging.clone()
    };
    mount::bind_mount(&source, &target, req.readonly).map_err(|e| {
        internal(
            &format!("bind-mounting {} at {}", source.display(), target.display()),
            &e,
        )
    })?;
    tracing::info!(volume_id, target = %target.display(), readonly = req.readonly, "volume published");
    Ok(())
}

fn kind(block: bool) -> &'static str {
    if block {
        "a block volume"
    } else {
        "a filesystem volume"
    }
}

fn create_file(path: &Path) -> Result<(), Status> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| internal("creating target_path's parent", &e))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| internal("creating target_path", &e))
}

pub(super) fn unpublish(
    node: &NodeService,
    req: &csi::NodeUnpublishVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let target = PathBuf::from(require(&req.target_path, "target_path")?);
    let _guard = node.locks.lock_or_abort(volume_id)?;
    // EBUSY is retried briefly: a reference the kernel drops a moment later (a process that has
    // just closed its last file there) should not fail the call.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match mount::unmount_all(&target) {
            Ok(()) => break,
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(internal("unmounting target_path", &e)),
        }
    }
    let removed = match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir(&target),
        Ok(_) => std::fs::remove_file(&target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(|e| internal("removing target_path", &e))?;
    tracing::info!(volume_id, target = %target.display(), "volume unpublished");
    Ok(())
}
