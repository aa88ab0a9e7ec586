//! Encrypted volumes on the node: LUKS2 (dm-crypt) on the mapped krbd or rbd-nbd device.
//!
//! Stage: the volume's DEK is fetched through its KMS entry (before anything is mapped), then on
//! the mapped device: a LUKS2 header found is opened; a provably blank device is formatted first
//! (the first stage); anything else is refused, so user data never gets a new header. A key that
//! does not open the header is an error naming the KMS entry, and the header is left as it is.
//! The key reaches `cryptsetup` on its stdin only (never argv, environ or a file). The opened
//! device is `/dev/mapper/rbd-csi-<hash of the volume ID>`; a mapping of that name left by a
//! crashed plugin is reused when it sits on this stage's device, else closed and opened again.
//!
//! A LUKS device just formatted reads as noise; its first MiB is zeroed once, right after the
//! first open, so that the filesystem step finds it blank. (A plugin killed between the format
//! and that write leaves a volume whose stage then refuses to create a filesystem on the noise:
//! an error, never lost data; `wipefs`-style zeroing of the opened device repairs it.)
//!
//! The volume key is kept in the dm-crypt table (`--disable-keyring`), so `cryptsetup resize`
//! grows the opened device after an expansion without the passphrase. The DEK is 256 random
//! bits, so the LUKS keyslot uses PBKDF2 at its minimum iteration count: a slow PBKDF protects
//! weak passphrases, and costs seconds (and Argon2's memory) at every stage.
//!
//! The fuse mapper has no block device under the plugin's control to put dm-crypt on: an
//! encrypted volume with `mounter: fuse` is refused.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rbd_volume::encryption::{self, Dek, Encryption};
use sha2::Digest;
use tokio::io::AsyncWriteExt;
use tonic::Status;

use super::request::StageParams;
use super::{NodeService, blocking};
use crate::fs::{self, Contents};
use crate::mapper::{MappedDevice, MounterKind};

const CRYPTSETUP: &str = "cryptsetup";
const TIMEOUT: Duration = Duration::from_mins(2);
/// `cryptsetup`'s exit status for a passphrase that opens no keyslot.
const WRONG_KEY: i32 = 2;

/// The encryption of a volume from its context; an encrypted volume on the fuse mapper is
/// refused.
pub(super) fn settings(
    volume_context: &std::collections::HashMap<String, String>,
    mounter: MounterKind,
) -> Result<Option<Encryption>, Status> {
    let enc = encryption::parameters(volume_context)
        .map_err(|e| Status::invalid_argument(format!("volume_context: {e}")))?;
    if enc.is_some() && mounter == MounterKind::FuseLoop {
        return Err(Status::invalid_argument(format!(
            "volume_context.{}: encrypted volumes need a block device for LUKS2 (dm-crypt) and \
             the fuse mapper has none under the plugin's control; use mounter \"rbd\" or \
             \"rbd-nbd\"",
            encryption::PARAM_ENCRYPTED
        )));
    }
    Ok(enc)
}

/// The device-mapper name of a volume's opened LUKS device.
pub(super) fn mapper_name(volume_id: &str) -> String {
    let digest = sha2::Sha256::digest(volume_id.as_bytes());
    format!("rbd-csi-{}", rbd_volume::hex(&digest[..12]))
}

pub(super) fn mapper_device(name: &str) -> PathBuf {
    Path::new("/dev/mapper").join(name)
}

/// The volume's DEK, from its KMS entry, read with the caller's key.
pub(super) async fn fetch_dek(
    node: &NodeService,
    params: &StageParams,
    enc: &Encryption,
    volume_id: &str,
) -> Result<Dek, Status> {
    let kms = encryption::load_kms(
        &node.config.kms_config,
        node.config.secrets.clone(),
        &enc.kms_id,
    )
    .await
    .map_err(|e| match e {
        encryption::EncryptionError::Config { .. } => Status::failed_precondition(e.to_string()),
        e => Status::invalid_argument(format!("volume_context.{}: {e}", encryption::PARAM_KMS_ID)),
    })?;
    let volume = super::access::VolumeKeyRef {
        volume_id,
        tenant: enc.tenant.as_deref(),
    };
    node.cluster
        .fetch_dek(&params.image, &params.key, kms.as_ref(), &volume)
        .await?
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "KMS entry {:?} holds no key for image {}: the volume was not created encrypted \
                 (or its key was removed)",
                enc.kms_id, params.image
            ))
        })
}

/// Opens (first: formats) LUKS2 on `mapped`; returns the opened device.
pub(super) async fn unlock(
    mapped: &MappedDevice,
    name: &str,
    dek: &Dek,
    kms_id: &str,
    read_only: bool,
) -> Result<PathBuf, Status> {
    let device = mapped.device.display().to_string();
    let opened = mapper_device(name);
    let mut formatted = false;
    if opened.exists() {
        let status = run(&["status", name], None).await?;
        let backing = status
            .lines()
            .find_map(|l| l.trim().strip_prefix("device:"))
            .map(str::trim);
        if backing == Some(device.as_str()) {
            tracing::info!(name, device, "LUKS device already open; reusing it");
            return Ok(opened);
        }
        tracing::warn!(
            name,
            ?backing,
            device,
            "stale LUKS device of this volume; closing it"
        );
        close(name).await?;
    }
    if run(&["isLuks", &device], None).await.is_err() {
        let path = mapped.device.clone();
        match fs::probe(&path).await? {
            Contents::Blank if !read_only => {
                tracing::info!(device, "blank device: formatting LUKS2");
                run(
                    &[
                        "luksFormat",
                        "--type",
                        "luks2",
                        "--batch-mode",
                        "--pbkdf",
                        "pbkdf2",
                        "--pbkdf-force-iterations",
                        "1000",
                        "--key-file=-",
                        &device,
                    ],
                    Some(dek),
                )
                .await?;
                formatted = true;
            }
            Contents::Blank => {
                return Err(Status::failed_precondition(format!(
                    "{device} is blank and the encrypted volume is staged read-only: it has no \
                     LUKS header yet (a read-only stage never writes one)"
                )));
            }
            other => {
                return Err(Status::failed_precondition(format!(
                    "{device} is an encrypted volume's device but holds no LUKS header ({}); it \
                     is not blank, so no header is written over it",
                    describe(&other)
                )));
            }
        }
    }
    let mut args = vec![
        "open",
        "--type",
        "luks2",
        "--disable-keyring",
        "--key-file=-",
    ];
    if read_only {
        args.push("--readonly");
    }
    args.extend([device.as_str(), name]);
    match run_status(&args, Some(dek)).await? {
        (true, _) if formatted => {
            // A fresh LUKS device reads as noise (zeros decrypted): zero its start, so that the
            // filesystem step finds it blank and creates the filesystem.
            let path = opened.clone();
            blocking(move || {
                zero_start(&path)
                    .map_err(|e| Status::internal(format!("zeroing the new LUKS device: {e}")))
            })
            .await?;
            Ok(opened)
        }
        (true, _) => Ok(opened),
        (false, Some(WRONG_KEY)) => Err(Status::failed_precondition(format!(
            "the key of KMS entry {kms_id:?} does not open the LUKS header on {device}: the \
             volume is left as it is (never formatted again)"
        ))),
        (false, _) => Err(Status::internal(format!(
            "cryptsetup could not open the LUKS header on {device}"
        ))),
    }
}

/// Writes zeros over the first [`fs::BLANK_CHECK_BYTES`] of `device` (synchronously).
fn zero_start(device: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().write(true).open(device)?;
    file.write_all(&vec![0u8; fs::BLANK_CHECK_BYTES])?;
    file.sync_all()
}

fn describe(contents: &Contents) -> String {
    match contents {
        Contents::Blank => "blank".to_owned(),
        Contents::Filesystem(fs) => format!("a {fs} filesystem"),
        Contents::Other(what) => what.clone(),
    }
}

/// Closes the opened LUKS device `name`; a device already closed is fine.
pub(super) async fn close(name: &str) -> Result<(), Status> {
    if !mapper_device(name).exists() {
        return Ok(());
    }
    run(&["close", name], None).await.map(drop)
}

/// Grows the opened LUKS device `name` to its (grown) backing device.
pub(super) async fn resize(name: &str) -> Result<(), Status> {
    run(&["resize", name], None).await.map(drop)
}

async fn run(args: &[&str], key: Option<&Dek>) -> Result<String, Status> {
    let (ok, stdout, stderr, code) = exec(args, key).await?;
    if ok {
        Ok(stdout)
    } else {
        Err(Status::internal(format!(
            "cryptsetup {} failed ({}): {stderr}",
            args.first().copied().unwrap_or_default(),
            code.map_or_else(|| "killed".to_owned(), |c| format!("exit status {c}"))
        )))
    }
}

async fn run_status(args: &[&str], key: Option<&Dek>) -> Result<(bool, Option<i32>), Status> {
    let (ok, _, stderr, code) = exec(args, key).await?;
    if !ok {
        tracing::warn!(
            command = args.first().copied().unwrap_or_default(),
            ?code,
            stderr,
            "cryptsetup failed"
        );
    }
    Ok((ok, code))
}

/// Runs cryptsetup, the key (if any) written to its stdin and nowhere else.
async fn exec(
    args: &[&str],
    key: Option<&Dek>,
) -> Result<(bool, String, String, Option<i32>), Status> {
    let mut child = tokio::process::Command::new(CRYPTSETUP)
        .args(args)
        .stdin(if key.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Status::internal(format!("starting {CRYPTSETUP}: {e}")))?;
    if let (Some(key), Some(mut stdin)) = (key, child.stdin.take()) {
        stdin
            .write_all(key.expose().as_bytes())
            .await
            .map_err(|e| Status::internal(format!("passing the key to {CRYPTSETUP}: {e}")))?;
        drop(stdin);
    }
    let output = tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!("{CRYPTSETUP} did not finish in {TIMEOUT:?}"))
        })?
        .map_err(|e| Status::internal(format!("waiting for {CRYPTSETUP}: {e}")))?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        output.status.code(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encrypted_volumes_are_refused_on_the_fuse_mapper() {
        let ctx = std::collections::HashMap::from([
            ("encrypted".to_owned(), "true".to_owned()),
            ("encryptionKMSID".to_owned(), "m".to_owned()),
        ]);
        let err = settings(&ctx, MounterKind::FuseLoop).err();
        assert!(
            err.is_some_and(|e| e.message().contains("volume_context.encrypted")
                && e.message().contains("fuse"))
        );
        assert!(settings(&ctx, MounterKind::Krbd).is_ok_and(|e| e.is_some()));
    }

    #[test]
    fn mapper_names_are_stable_and_short() {
        assert_eq!(mapper_name("v"), mapper_name("v"));
        assert_ne!(mapper_name("v"), mapper_name("w"));
        assert!(mapper_name("v").len() < 40);
    }
}
