//! What the two CLI mappers (`rbd map` for krbd, `rbd-nbd map`) share: the key goes to the
//! helper in a private file removed right after the call (never on its command line), the helper
//! prints the device it mapped, and unmapping a device that is already gone is a success.

use std::path::Path;

use super::secret_file::SecretFile;
use super::{Key, MapError, MappedDevice, MounterKind, parse_device_output, redact_exec};
use crate::exec;

/// Runs `program` with the arguments `args(keyfile)` builds and returns the device it printed.
pub(crate) async fn map(
    program: &str,
    display_name: &'static str,
    kind: MounterKind,
    key_dir: &Path,
    key: &Key,
    args: impl FnOnce(&Path) -> Vec<String>,
) -> Result<MappedDevice, MapError> {
    let tag = match kind {
        MounterKind::Nbd => "nbd",
        MounterKind::Krbd | MounterKind::FuseLoop => "krbd",
    };
    let keyfile = SecretFile::create(key_dir, tag, key.expose())
        .map_err(|e| MapError::io("writing key file in", key_dir.display(), e))?;
    let args = args(keyfile.path());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = exec::run(program, &argv)
        .await
        .map_err(|e| redact_exec(e, key))?;
    drop(keyfile);
    Ok(MappedDevice {
        mounter: kind,
        device: parse_device_output(display_name, &out.stdout)?,
        fuse: None,
    })
}

/// `program unmap DEVICE`, unless the device is gone already.
pub(crate) async fn unmap(program: &str, mapped: &MappedDevice) -> Result<(), MapError> {
    if !mapped.device.exists() {
        return Ok(());
    }
    exec::run(program, &["unmap", &mapped.device.to_string_lossy()]).await?;
    Ok(())
}
