//! `NodeStageVolume` and `NodeUnstageVolume`.
//!
//! Stage: validate -> lock the volume -> already staged? done -> ask the cluster with the
//! caller's key (authenticates it, reads the fsid) -> a read-write stage of a single-node volume
//! takes the image's stage lock in Ceph and is refused unless this node may be its one writer
//! (published to this node or to none, and no watcher that is not provably this node's:
//! [`access`]) -> map the image (read-only for a reader-only access mode; an existing mapping
//! only if of the same cluster) -> record this node as the writer and release the stage lock
//! -> write the staging record ->
//! filesystem: mkfs only on a provably blank device (an existing ext4 is checked and grown
//! offline unless read-only, which completes an ext4 expansion the kernel refused online), mount
//! at the staging path (read-only: `ro` without journal replay); block: bind the device onto
//! `<staging>/device`. A failure after mapping unmaps again, so a failed stage leaves nothing
//! behind.
//!
//! Encrypted volumes (`encrypted: "true"` in the volume context, [`crypt`]): the key is fetched
//! before mapping, and the LUKS2 device opened on the mapped one (formatted on the first stage) is
//! what gets the filesystem or the block bind; unstage closes it before unmapping.
//!
//! Unstage: unmount whatever is at the staging path, unmap what the record says was mapped (only
//! if that device still maps the recorded image), remove the record. Every step tolerates
//! "already done".
//!
//! Mapping is idempotent too: with a staging record but nothing mounted (a plugin restart
//! between map and mount, a failed mount), the mappers find the image's existing mapping instead
//! of mapping it a second time. Blocking steps run on the blocking pool.

use std::path::{Path, PathBuf};

use tonic::Status;

use super::access;
use super::record::{self, BLOCK_DEVICE_FILE, StagingRecord};
use super::request::{self, Access};
use super::{NodeService, blocking, crypt};
use crate::fs::{self, Contents, FsType};
use crate::mapper::{ImageSpec, MapOptions};
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
    let mode = request::mode(req.volume_capability.as_ref());
    let read_only = request::reader_only(mode);
    let params = request::stage_params(
        volume_id,
        &req.volume_context,
        &req.secrets,
        node.config.default_mounter,
        node.config.cluster_config.as_deref(),
    )?;
    refuse_writable_map_options(read_only, mode, &params.image)?;
    let _guard = node.locks.lock_or_abort(volume_id)?;

    let block = access.is_block();
    let (id, path) = (volume_id.to_owned(), staging.clone());
    let staged = blocking(move || already_staged(&path, &id, block, read_only)).await?;
    if staged == Staged::Done {
        tracing::debug!(volume_id, staging = %staging.display(), "already staged");
        return Ok(());
    }

    let mapper = node.mapper(params.mounter)?;
    let encryption = crypt::settings(&req.volume_context, params.mounter)?;
    // The key first: a volume whose key cannot be had is not mapped at all.
    let dek = match &encryption {
        Some(enc) => Some(crypt::fetch_dek(node, &params, enc, volume_id).await?),
        None => None,
    };
    let crypt_name = encryption.as_ref().map(|_| crypt::mapper_name(volume_id));
    // With the caller's key: authenticates it (also when the image is mapped here already), and
    // tells the cluster's fsid and who has the image open.
    let view = node.cluster.inspect(&params.image, &params.key).await?;
    let options = MapOptions {
        read_only,
        cluster_fsid: view.fsid.clone(),
    };
    // One writer per single-node volume: decided by node identity under the image's stage
    // lock, which is held until this node is recorded as the writer after the map
    // (`access` module doc), so two nodes staging at once decide one after the other.
    let claim = if request::single_node_writer(mode) && !read_only {
        Some(claim_writer(node, &params.image, &params.key, view.fsid.as_deref()).await?)
    } else {
        None
    };
    tracing::info!(volume_id, image = %params.image, mounter = %params.mounter, read_only, "mapping image");
    let mapped = map_claimed(node, mapper.as_ref(), &params, &options, claim).await?;
    let record = StagingRecord {
        volume_id: volume_id.to_owned(),
        image: params.image.clone(),
        mapped: mapped.clone(),
        block,
        read_only,
        cluster_fsid: view.fsid,
        crypt: crypt_name.clone(),
    };
    let path = staging.clone();
    let result = match blocking(move || {
        record::write(&path, &record).map_err(|e| internal("writing staging record", &e))
    })
    .await
    {
        Ok(()) => match (&encryption, &dek, &crypt_name) {
            (Some(enc), Some(dek), Some(name)) => {
                match crypt::unlock(&mapped, name, dek, &enc.kms_id, read_only).await {
                    Ok(device) => expose(&access, read_only, &device, &staging).await,
                    Err(status) => Err(status),
                }
            }
            _ => expose(&access, read_only, &mapped.device, &staging).await,
        },
        Err(status) => Err(status),
    };
    drop(dek);
    if let Err(status) = result {
        tracing::warn!(volume_id, error = %status.message(), "stage failed; unmapping");
        let closed = match &crypt_name {
            Some(name) => crypt::close(name).await,
            None => Ok(()),
        };
        if let Err(e) = closed {
            tracing::warn!(volume_id, error = %e.message(), "closing the LUKS device after failed stage failed");
        } else if let Err(e) = mapper.unmap_with(&mapped, &params.image, &options).await {
            tracing::warn!(volume_id, error = %e, "unmap after failed stage failed");
        } else {
            let path = staging.clone();
            let _ = blocking(move || {
                record::remove(&path).map_err(|e| internal("removing staging record", &e))
            })
            .await;
        }
        return Err(status);
    }
    tracing::info!(volume_id, device = %mapped.device.display(), staging = %staging.display(), "volume staged");
    Ok(())
}

/// What [`already_staged`] found at a staging path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Staged {
    /// Record and mount in place: nothing to do.
    Done,
    /// This node's staging record of the volume, but nothing mounted (a lost mount, a restart
    /// between map and mount): staged here before, to be completed.
    RecordOnly,
    /// Nothing staged here.
    No,
}

/// Whether the volume is staged at `path` already; creates the staging directory otherwise.
/// Another volume, access type or access mode there is `ALREADY_EXISTS`.
fn already_staged(path: &Path, id: &str, block: bool, read_only: bool) -> Result<Staged, Status> {
    if let Some(existing) =
        record::read(path).map_err(|e| internal("reading staging record", &e))?
    {
        if existing.volume_id != id {
            return Err(Status::already_exists(format!(
                "staging path {} holds volume {}, not {id}",
                path.display(),
                existing.volume_id
            )));
        }
        if existing.block != block {
            return Err(Status::already_exists(format!(
                "volume {id} is already staged at {} with another access type",
                path.display()
            )));
        }
        if existing.read_only != read_only {
            return Err(Status::already_exists(format!(
                "volume {id} is already staged at {} {}",
                path.display(),
                if existing.read_only {
                    "read-only"
                } else {
                    "read-write"
                }
            )));
        }
        if staged_target_mounted(path, existing.block)? {
            return Ok(Staged::Done);
        }
        std::fs::create_dir_all(path).map_err(|e| internal("creating staging path", &e))?;
        return Ok(Staged::RecordOnly);
    }
    std::fs::create_dir_all(path).map_err(|e| internal("creating staging path", &e))?;
    Ok(Staged::No)
}

pub(super) fn staged_target_mounted(staging: &Path, block: bool) -> Result<bool, Status> {
    let target = if block {
        staging.join(BLOCK_DEVICE_FILE)
    } else {
        staging.to_path_buf()
    };
    mount::is_mount_point(&target).map_err(|e| internal("reading mount table", &e))
}

/// A read-only stage whose `mapOptions` ask for a writable mapping (`rw`, `read_write`):
/// `INVALID_ARGUMENT` naming the field.
fn refuse_writable_map_options(
    read_only: bool,
    mode: csi::volume_capability::access_mode::Mode,
    image: &ImageSpec,
) -> Result<(), Status> {
    match crate::mapper::options::writable_option(image.map_options.as_deref()) {
        Some(option) if read_only => Err(Status::invalid_argument(format!(
            "volume_context.mapOptions: option {option:?} maps the image writable, and the \
             volume is staged read-only (access mode {})",
            mode.as_str_name()
        ))),
        _ => Ok(()),
    }
}

/// Maps the image. With a writer claim: releases it when the map fails, and records this node
/// as the writer once mapped (unmapping again when that fails).
async fn map_claimed(
    node: &NodeService,
    mapper: &dyn crate::mapper::Mapper,
    params: &request::StageParams,
    options: &MapOptions,
    claim: Option<Box<dyn access::WriterClaim>>,
) -> Result<crate::mapper::MappedDevice, Status> {
    let mapped = match mapper.map_with(&params.image, &params.key, options).await {
        Ok(mapped) => mapped,
        Err(e) => {
            if let Some(claim) = claim {
                claim.release().await;
            }
            return Err(e.into());
        }
    };
    let client = match &claim {
        Some(claim) => {
            let known = mapper.client_of(&mapped).await;
            learn_own_client(node, claim.as_ref(), known, options.cluster_fsid.as_deref()).await
        }
        None => None,
    };
    let pool_wide = mapper.kind() == crate::mapper::MounterKind::FuseLoop;
    if let Some(claim) = claim
        && let Err(status) = claim.commit(client, pool_wide).await
    {
        tracing::warn!(image = %params.image, error = %status.message(), "recording the writer failed; unmapping");
        if let Err(e) = mapper.unmap_with(&mapped, &params.image, options).await {
            tracing::warn!(image = %params.image, error = %e, "unmap after failed stage failed");
        }
        return Err(status);
    }
    Ok(mapped)
}

/// Records the mapping's client as this node's own ([`access::OwnClients`]) and returns it:
/// the client the mapper names (`known`: krbd's sysfs), else the one client the map added
/// (still under the stage lock). Best effort: a failure only means the client is not known
/// (not recorded as ours, nor in the writer record).
async fn learn_own_client(
    node: &NodeService,
    claim: &dyn access::WriterClaim,
    known: Option<u64>,
    fsid: Option<&str>,
) -> Option<access::Watcher> {
    let after = match claim.watchers_now().await {
        Ok(after) => after,
        Err(e) => {
            tracing::debug!(error = %e.message(), "listing watchers after the map failed");
            return None;
        }
    };
    let (own, fsid_owned) = (node.own_clients.clone(), fsid.map(str::to_owned));
    let own = blocking(move || Ok(own.of(fsid_owned.as_deref())))
        .await
        .unwrap_or_default();
    let new = match known {
        Some(id) => after.iter().find(|w| w.id == id).cloned(),
        None => access::new_watcher(&claim.state().watchers, &after, &own),
    };
    if let Some(id) = new.as_ref().map(|w| w.id) {
        let (own, fsid) = (node.own_clients.clone(), fsid.map(str::to_owned));
        let recorded = blocking(move || {
            own.record(fsid.as_deref(), id)
                .map_err(|e| internal("recording this node's Ceph client", &e))
        })
        .await;
        if let Err(e) = recorded {
            tracing::warn!(client = id, error = %e.message(), "not recorded as this node's client");
        }
    }
    new
}

/// Takes the image's stage lock for a read-write single-node stage and decides by node identity
/// whether this node may write it ([`access::judge_writer`]); refused: `FAILED_PRECONDITION`,
/// the lock released.
async fn claim_writer(
    node: &NodeService,
    image: &ImageSpec,
    key: &crate::mapper::Key,
    fsid: Option<&str>,
) -> Result<Box<dyn access::WriterClaim>, Status> {
    let claim = node
        .cluster
        .writer_claim(image, key, &node.config.node_id)
        .await?;
    let own = node.own_clients.clone();
    let fsid_owned = fsid.map(str::to_owned);
    let own = blocking(move || Ok(own.of(fsid_owned.as_deref()))).await?;
    match access::judge_writer(image, &node.config.node_id, claim.state(), &own) {
        Ok(()) => Ok(claim),
        Err(refusal) => {
            claim.release().await;
            Err(Status::failed_precondition(refusal))
        }
    }
}

/// Makes the mapped device available at the staging path (read-only: mounted read-only).
async fn expose(
    access: &Access,
    read_only: bool,
    device: &Path,
    staging: &Path,
) -> Result<(), Status> {
    let device = device.to_path_buf();
    let staging = staging.to_path_buf();
    match access {
        Access::Block => {
            blocking(move || {
                let file = staging.join(BLOCK_DEVICE_FILE);
                touch(&file)?;
                mount::bind_mount(&device, &file, false)
                    .map_err(|e| internal("binding the block device", &e))
            })
            .await
        }
        Access::Mount { fs, flags } => {
            let fs = prepare_filesystem(&device, *fs, read_only).await?;
            let mut flags = flags.clone();
            if read_only {
                flags.extend(read_only_mount_options(fs).iter().map(|o| (*o).to_owned()));
            }
            for option in filesystem_mount_options(fs) {
                if !flags.iter().any(|f| f == option) {
                    flags.push((*option).to_owned());
                }
            }
            blocking(move || {
                mount::mount_filesystem(&device, &staging, fs.name(), &flags).map_err(|e| {
                    internal(
                        &format!(
                            "mounting {} ({}) at {}",
                            device.display(),
                            fs.name(),
                            staging.display()
                        ),
                        &e,
                    )
                })
            })
            .await
        }
    }
}

/// Mount options of every stage of the filesystem: xfs `nouuid`. A volume restored from a
/// snapshot or cloned from another carries its source's filesystem UUID, and xfs refuses (EINVAL)
/// to mount a filesystem whose UUID is mounted already, so without it a restore or clone does not
/// mount on a node where its source is mounted (ceph-csi mounts xfs with `nouuid` too).
#[must_use]
fn filesystem_mount_options(fs: FsType) -> &'static [&'static str] {
    match fs {
        FsType::Ext4 => &[],
        FsType::Xfs => &["nouuid"],
    }
}

/// Mount options of a read-only stage: `ro`, and no journal replay (ext4 `noload`, xfs
/// `norecovery`): the filesystem may be live on a writer elsewhere, and a read-only device cannot
/// be replayed onto anyway.
#[must_use]
fn read_only_mount_options(fs: FsType) -> &'static [&'static str] {
    match fs {
        FsType::Ext4 => &["ro", "noload"],
        FsType::Xfs => &["ro", "norecovery"],
    }
}

/// Creates the filesystem on a provably blank device; returns the filesystem to mount. A device
/// holding anything else (a partition table, unrecognised data, a filesystem this driver does not
/// mount) is `FAILED_PRECONDITION` and left untouched. Read-only: never formatted, checked or
/// grown (a blank device is `FAILED_PRECONDITION`).
async fn prepare_filesystem(
    device: &Path,
    wanted: FsType,
    read_only: bool,
) -> Result<FsType, Status> {
    match fs::probe(device).await? {
        Contents::Blank if read_only => Err(Status::failed_precondition(format!(
            "{} is blank and the volume is staged read-only: there is no filesystem to mount \
             (a read-only stage never creates one)",
            device.display()
        ))),
        Contents::Blank => {
            tracing::info!(device = %device.display(), fs = wanted.name(), "blank device: creating filesystem");
            fs::mkfs(device, wanted).await?;
            Ok(wanted)
        }
        Contents::Other(what) => Err(Status::failed_precondition(format!(
            "{} holds {what}; it is not blank, so no filesystem is created on it (wipe it \
             with wipefs if its contents are not needed)",
            device.display()
        ))),
        Contents::Filesystem(found) => {
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
            if existing == FsType::Ext4 && !read_only {
                // Completes an expansion that could not grow ext4 online.
                fs::grow_ext4_offline(device).await?;
            }
            Ok(existing)
        }
    }
}

/// Creates the (empty) file a block volume's device is bound onto; a symlink there is refused,
/// never followed.
fn touch(file: &Path) -> Result<(), Status> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(file)
        .map(drop)
        .map_err(|e| internal(&format!("creating {}", file.display()), &e))
}

/// Unbinds the device from a block volume's `<staging>/device` and removes that file, without
/// following a symlink (`lstat`, `UMOUNT_NOFOLLOW`). Only what stage creates there, an empty
/// regular file (with the device bound on it), is removed; anything else is left in place.
fn release_block_file(file: &Path) -> Result<(), Status> {
    let meta = match std::fs::symlink_metadata(file) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(internal(&format!("examining {}", file.display()), &e)),
    };
    if meta.file_type().is_symlink() {
        tracing::warn!(file = %file.display(), "block device file is a symlink; leaving it alone");
        return Ok(());
    }
    mount::unmount_all(file).map_err(|e| internal("unmounting the block device", &e))?;
    match std::fs::symlink_metadata(file) {
        Ok(meta) if meta.file_type().is_file() && meta.len() == 0 => {
            std::fs::remove_file(file).map_err(|e| internal("removing the block device file", &e))
        }
        Ok(_) => {
            tracing::warn!(file = %file.display(), "not the empty file stage creates; leaving it alone");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal(&format!("examining {}", file.display()), &e)),
    }
}

pub(super) async fn unstage(
    node: &NodeService,
    req: csi::NodeUnstageVolumeRequest,
) -> Result<(), Status> {
    let volume_id = require(&req.volume_id, "volume_id")?;
    let staging = PathBuf::from(require(&req.staging_target_path, "staging_target_path")?);
    let _guard = node.locks.lock_or_abort(volume_id)?;

    let (id, path) = (volume_id.to_owned(), staging.clone());
    let existing = blocking(move || {
        let existing = record::read(&path).map_err(|e| internal("reading staging record", &e))?;
        if let Some(existing) = &existing
            && existing.volume_id != id
        {
            return Err(Status::failed_precondition(format!(
                "staging path {} holds volume {}, not {id}",
                path.display(),
                existing.volume_id
            )));
        }
        // Only a block volume has a file of ours at `<staging>/device`. For a filesystem volume
        // `<staging>` is the root of the tenant's filesystem, and whatever is called `device`
        // there is the tenant's (a file, a directory, a symlink to a host path): never touched.
        // Without a record nothing of ours was bound there either.
        if existing.as_ref().is_some_and(|r| r.block) {
            release_block_file(&path.join(BLOCK_DEVICE_FILE))?;
        }
        mount::unmount_all(&path).map_err(|e| internal("unmounting the staging path", &e))?;
        Ok(existing)
    })
    .await?;
    if let Some(existing) = existing {
        if let Some(name) = &existing.crypt {
            crypt::close(name).await?;
        }
        let mapper = node.mapper(existing.mapped.mounter)?;
        // Unmaps only what still maps the recorded image (the recorded device may be another
        // volume's after a reboot).
        mapper
            .unmap_with(&existing.mapped, &existing.image, &existing.map_options())
            .await?;
        let path = staging.clone();
        blocking(move || {
            record::remove(&path).map_err(|e| internal("removing staging record", &e))
        })
        .await?;
        tracing::info!(volume_id, device = %existing.mapped.device.display(), "volume unstaged");
    }
    Ok(())
}
