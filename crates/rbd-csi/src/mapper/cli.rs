//! What the two CLI mappers (`rbd map` for krbd, `rbd-nbd map`) share: an image that is mapped
//! already is not mapped again (its device is returned), the key goes to the helper in a private
//! file removed right after the call (never on its command line), the helper prints the device it
//! mapped, and unmapping touches only a device that still maps the image (a device that is gone
//! is a success; one that now maps another image is left alone). A mapping has the mode asked
//! for: an existing one of the other mode is not reused ([`MapError::ModeMismatch`]), and a new
//! read-only one the kernel reports writable is unmapped again ([`MapError::NotReadOnly`]).

use std::path::Path;

use super::daemon::DaemonPlacement;
use super::secret_file::SecretFile;
use super::{
    ImageSpec, Key, MapError, MappedDevice, Mapping, MounterKind, check_fresh_mode,
    check_reused_mode, device_to_unmap, find_mapping, parse_device_output, redact_exec,
};
use crate::exec;

/// How a CLI mapping is made: read-only or not, and where sysfs is (`/`; a fake tree in tests)
/// to verify it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mode<'a> {
    pub(crate) read_only: bool,
    pub(crate) root: &'a Path,
}

/// The device of an existing mapping of `image` (from `mappings`) of the same `mode`, else runs
/// `program` with the arguments `args(keyfile)` builds and returns the device it printed.
#[allow(clippy::too_many_arguments)] // one call site per mapper; a struct would only rename them
pub(crate) async fn map(
    program: &str,
    display_name: &'static str,
    kind: MounterKind,
    key_dir: &Path,
    key: &Key,
    image: &ImageSpec,
    mappings: &[Mapping],
    mode: Mode<'_>,
    args: impl FnOnce(&Path) -> Vec<String>,
) -> Result<MappedDevice, MapError> {
    map_placed(
        program,
        display_name,
        kind,
        key_dir,
        key,
        image,
        mappings,
        mode,
        args,
        None,
    )
    .await
}

/// [`map`], the helper started with `placement` (a helper that daemonizes, like `rbd-nbd map`,
/// leaves its daemon there).
#[allow(clippy::too_many_arguments)] // as `map`
pub(crate) async fn map_placed(
    program: &str,
    display_name: &'static str,
    kind: MounterKind,
    key_dir: &Path,
    key: &Key,
    image: &ImageSpec,
    mappings: &[Mapping],
    mode: Mode<'_>,
    args: impl FnOnce(&Path) -> Vec<String>,
    placement: Option<&DaemonPlacement>,
) -> Result<MappedDevice, MapError> {
    if let Some(existing) = find_mapping(mappings, image) {
        check_reused_mode(mode.root, &existing.device, image, mode.read_only).await?;
        tracing::info!(image = %image, device = %existing.device.display(), mounter = %kind,
            "image is mapped already; reusing its device");
        return Ok(MappedDevice {
            mounter: kind,
            device: existing.device.clone(),
            fuse: None,
        });
    }
    let tag = match kind {
        MounterKind::Nbd => "nbd",
        MounterKind::Krbd | MounterKind::FuseLoop => "krbd",
    };
    let keyfile = SecretFile::create(key_dir, tag, key.expose())
        .map_err(|e| MapError::io("writing key file in", key_dir.display(), e))?;
    let args = args(keyfile.path());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = match placement {
        Some(placement) => {
            exec::run_command(
                placement.command(program)?,
                program,
                &argv,
                exec::DEFAULT_TIMEOUT,
            )
            .await
        }
        None => exec::run(program, &argv).await,
    }
    .map_err(|e| redact_exec(e, key))?;
    drop(keyfile);
    let device = parse_device_output(display_name, &out.stdout)?;
    if let Err(e) = check_fresh_mode(mode.root, &device, mode.read_only).await {
        let name = device.to_string_lossy();
        if let Err(unmap) = exec::run(program, &["unmap", &name]).await {
            tracing::warn!(device = %name, error = %unmap, "unmapping a writable read-only mapping failed");
        }
        return Err(e);
    }
    Ok(MappedDevice {
        mounter: kind,
        device,
        fuse: None,
    })
}

/// `program unmap DEVICE` for the device that maps `image` according to `mappings` (the recorded
/// one when it still does); nothing when no device maps it.
pub(crate) async fn unmap(
    program: &str,
    mapped: &MappedDevice,
    image: &ImageSpec,
    mappings: &[Mapping],
    extra: &[String],
) -> Result<(), MapError> {
    if let Some(other) = mappings
        .iter()
        .find(|m| m.device == mapped.device && !m.maps(image))
    {
        tracing::warn!(device = %mapped.device.display(), image = %image,
            now = %format!("{}/{}/{}", other.pool, other.namespace, other.image),
            "recorded device now maps another image; leaving it mapped");
    }
    let Some(device) = device_to_unmap(mappings, &mapped.device, image) else {
        tracing::info!(device = %mapped.device.display(), image = %image, "image is not mapped; nothing to unmap");
        return Ok(());
    };
    let device = device.to_string_lossy();
    let mut argv = vec!["unmap", device.as_ref()];
    argv.extend(extra.iter().map(String::as_str));
    exec::run(program, &argv).await?;
    Ok(())
}
