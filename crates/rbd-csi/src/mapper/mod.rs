//! Making an RBD image available as a local block device on a node.
//!
//! One trait, [`Mapper`], with three implementations chosen per volume by the `mounter` volume
//! attribute (or the node's default, see [`MounterKind::parse`]):
//!
//! | `mounter` | implementation | needs |
//! |---|---|---|
//! | `rbd`, `krbd` | [`krbd::KrbdMapper`]: `rbd map` | the `rbd` kernel module + `rbd` CLI |
//! | `rbd-nbd`, `nbd` | [`nbd::NbdMapper`]: `rbd-nbd map` | the `nbd` kernel module + `rbd-nbd` |
//! | `fuse`, `fuse-loop`, `rbd-fuse` | [`fuse_loop::FuseLoopMapper`]: `rbd-fuse` + `losetup` | FUSE and loop devices |
//!
//! The daemons of rbd-nbd and rbd-fuse are started so that they outlive the plugin (own
//! session, optionally host cgroups), and a restarted plugin adopts them ([`daemon`]).
//!
//! Keys never appear on a command line: they reach the helper through a file in the node's
//! private runtime directory (tmpfs in a real deployment), created `0600`, removed when no longer
//! needed ([`secret_file`]).

pub mod cgroup;
mod cli;
pub mod daemon;
pub mod fuse_loop;
pub mod krbd;
pub mod loop_device;
pub mod nbd;
pub mod options;
pub mod secret_file;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exec::ExecError;

/// Which mapper stages a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MounterKind {
    /// Kernel RBD (`rbd map`).
    #[serde(rename = "krbd")]
    Krbd,
    /// `rbd-nbd`.
    #[serde(rename = "rbd-nbd")]
    Nbd,
    /// `rbd-fuse` + a loop device.
    #[serde(rename = "fuse")]
    FuseLoop,
}

impl MounterKind {
    /// Parses a `mounter` value: `rbd`/`krbd`, `rbd-nbd`/`nbd`, `fuse`/`fuse-loop`/`rbd-fuse`.
    ///
    /// # Errors
    /// A message naming the unknown value.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "rbd" | "krbd" => Ok(Self::Krbd),
            "rbd-nbd" | "nbd" => Ok(Self::Nbd),
            "fuse" | "fuse-loop" | "rbd-fuse" => Ok(Self::FuseLoop),
            other => Err(format!(
                "unknown mounter {other:?} (expected rbd, krbd, rbd-nbd or fuse)"
            )),
        }
    }

    /// The canonical `mounter` value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Krbd => "krbd",
            Self::Nbd => "rbd-nbd",
            Self::FuseLoop => "fuse",
        }
    }
}

impl fmt::Display for MounterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The image to map and who maps it. Holds no secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpec {
    /// Comma-separated `host:port` monitor list.
    pub monitors: String,
    pub pool: String,
    /// RADOS namespace; empty for the pool's default namespace (records written before
    /// namespaces existed have none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub image: String,
    /// Ceph user id without the `client.` prefix.
    pub user: String,
    /// This volume's map options for its mapper (the volume context's `mapOptions`, checked;
    /// [`options`]); the node's own (`--krbd-map-options`) come first, these win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map_options: Option<String>,
    /// This volume's unmap options for its mapper (`unmapOptions`), kept in the staging record
    /// so the unstage that runs later uses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmap_options: Option<String>,
}

impl ImageSpec {
    /// `pool/image`, or `pool/namespace/image` in a namespace: the image spec `rbd map` and
    /// `rbd-nbd map` take.
    #[must_use]
    pub fn spec(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.pool, self.image)
        } else {
            format!("{}/{}/{}", self.pool, self.namespace, self.image)
        }
    }
}

impl fmt::Display for ImageSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec())
    }
}

/// A cephx key. `Debug`/`Display` never print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(String);

impl Key {
    #[must_use]
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key itself, for writing it into a private file.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// Where an image was mapped; persisted next to the staging path so unmapping works after a
/// restart of the node plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedDevice {
    pub mounter: MounterKind,
    /// The block device (`/dev/rbd0`, `/dev/nbd0`, `/dev/loop3`).
    pub device: PathBuf,
    /// For the fuse-loop mapper: the rbd-fuse instance and the image file behind the loop device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<fuse_loop::FuseAttachment>,
}

/// Why mapping or unmapping failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A daemon cgroup cannot be used ([`daemon::DaemonPlacement`]).
    #[error("daemon cgroup {0}")]
    Cgroup(#[from] cgroup::CgroupError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The image does not exist in the pool.
    #[error("image {image} not found in pool {pool}")]
    ImageNotFound { pool: String, image: String },
    /// A helper did not reach the expected state in time.
    #[error("{0}")]
    Timeout(String),
    /// The helper printed something we cannot interpret.
    #[error("unexpected output from {program}: {output:?}")]
    UnexpectedOutput {
        program: &'static str,
        output: String,
    },
    /// The mapper cannot map read-only.
    #[error("the {0} mapper cannot map an image read-only")]
    ReadOnlyUnsupported(MounterKind),
    /// An existing mapping of the image has the other mode: a read-only stage never reuses a
    /// read-write mapping (nor a read-write stage a read-only one).
    #[error(
        "image {image} is mapped {} on this node already ({device}, another staging of it); a {} \
         stage does not reuse it: unstage that one first",
        if *mapped_read_only { "read-only" } else { "read-write" },
        if *mapped_read_only { "read-write" } else { "read-only" }
    )]
    ModeMismatch {
        image: String,
        device: String,
        mapped_read_only: bool,
    },
    /// A mapping asked for read-only that the kernel reports writable (unmapped again).
    #[error("{device} was mapped read-only but the kernel reports it writable (sysfs ro is 0)")]
    NotReadOnly { device: String },
    /// The mapping record belongs to another mapper.
    #[error("device {device} was mapped by {recorded}, not {expected}")]
    WrongMapper {
        device: String,
        recorded: MounterKind,
        expected: MounterKind,
    },
}

impl MapError {
    pub(crate) fn io(what: &'static str, path: impl fmt::Display, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.to_string(),
            source,
        }
    }
}

/// How [`Mapper::map_with`] maps an image (and [`Mapper::unmap_with`] finds it again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapOptions {
    /// A read-only mapping (krbd and rbd-nbd `--read-only`, a read-only loop device): nothing on
    /// this node can write to the image through it.
    pub read_only: bool,
    /// The fsid of the cluster holding the image (as the node read it with the caller's key). An
    /// existing mapping is reused, or unmapped, only if it belongs to that cluster where the
    /// mapper can tell (krbd: sysfs `cluster_fsid`).
    pub cluster_fsid: Option<String>,
}

/// Maps images to local block devices.
#[async_trait::async_trait]
pub trait Mapper: Send + Sync {
    /// The kind this mapper implements.
    fn kind(&self) -> MounterKind;

    /// Maps `image` with `key` and returns the block device. Mapping an image that this mapper
    /// has already mapped returns the existing device.
    async fn map(&self, image: &ImageSpec, key: &Key) -> Result<MappedDevice, MapError>;

    /// Unmaps a device [`Mapper::map`] returned for `image`. Unmapping an already unmapped device
    /// is `Ok`; a device that now maps another image (the same path after a reboot) is left alone.
    async fn unmap(&self, mapped: &MappedDevice, image: &ImageSpec) -> Result<(), MapError>;

    /// [`Mapper::map`] with options. The default supports no read-only mapping.
    async fn map_with(
        &self,
        image: &ImageSpec,
        key: &Key,
        options: &MapOptions,
    ) -> Result<MappedDevice, MapError> {
        if options.read_only {
            return Err(MapError::ReadOnlyUnsupported(self.kind()));
        }
        self.map(image, key).await
    }

    /// [`Mapper::unmap`] of a device [`Mapper::map_with`] returned with `options`.
    async fn unmap_with(
        &self,
        mapped: &MappedDevice,
        image: &ImageSpec,
        options: &MapOptions,
    ) -> Result<(), MapError> {
        let _ = options;
        self.unmap(mapped, image).await
    }

    /// The global ID of the Ceph client instance that serves `mapped`, where the mapper can tell
    /// without asking the cluster (krbd: sysfs `client_id`). The default: unknown.
    async fn client_of(&self, mapped: &MappedDevice) -> Option<u64> {
        let _ = mapped;
        None
    }

    /// Makes the block device show the image's new size after a resize to `new_size` bytes.
    /// Kernel mappers see resizes by themselves; the default does nothing.
    async fn refresh_size(&self, mapped: &MappedDevice, new_size: u64) -> Result<(), MapError> {
        let _ = (mapped, new_size);
        Ok(())
    }
}

/// One mapping as the kernel (krbd: sysfs) or `rbd-nbd list-mapped` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub device: PathBuf,
    pub pool: String,
    /// RADOS namespace; empty for the pool's default namespace.
    pub namespace: String,
    pub image: String,
    /// Snapshot; empty or `-` for the image itself.
    pub snap: String,
    /// The fsid of the cluster the image is in, where the mapper can tell (krbd).
    pub cluster_fsid: Option<String>,
}

impl Mapping {
    /// Whether this is a mapping of `image` itself (same pool and namespace, no snapshot):
    /// volumes of this driver are never snapshots, and the same image name in another namespace
    /// is another image.
    #[must_use]
    pub fn maps(&self, image: &ImageSpec) -> bool {
        self.pool == image.pool
            && self.image == image.image
            && self.namespace == image.namespace
            && matches!(self.snap.as_str(), "" | "-")
    }
}

impl Mapping {
    /// Whether this mapping may belong to the cluster with `fsid`: no fsid asked for, or the
    /// mapping's is that one. A mapping whose cluster is unknown does not match a known fsid.
    #[must_use]
    pub fn in_cluster(&self, fsid: Option<&str>) -> bool {
        fsid.is_none_or(|fsid| self.cluster_fsid.as_deref() == Some(fsid))
    }
}

/// Whether the kernel reports block device `device` read-only: `<root>/sys/block/<name>/ro`,
/// `<name>` being the device's (symlinks such as `/dev/mapper/<name>` resolved) under `/`, or
/// `device`'s own name elsewhere (a fake tree in tests).
///
/// # Errors
/// When the attribute cannot be read (no such device) or holds something else than 0 or 1.
pub fn device_read_only(root: &Path, device: &Path) -> std::io::Result<bool> {
    let resolved = if root == Path::new("/") {
        std::fs::canonicalize(device)?
    } else {
        device.to_path_buf()
    };
    let name = resolved.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "device path without a name",
        )
    })?;
    let attribute = root.join("sys/block").join(name).join("ro");
    match std::fs::read_to_string(&attribute)?.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {other:?}", attribute.display()),
        )),
    }
}

/// `Ok` when the existing mapping `device` of `image` has the mode `read_only` asks for,
/// [`MapError::ModeMismatch`] otherwise.
pub(crate) async fn check_reused_mode(
    root: &Path,
    device: &Path,
    image: &ImageSpec,
    read_only: bool,
) -> Result<(), MapError> {
    let (root, dev) = (root.to_path_buf(), device.to_path_buf());
    let mapped_read_only = blocking("reading the mode of", move || {
        device_read_only(&root, &dev)
            .map_err(|e| MapError::io("reading the mode of", dev.display(), e))
    })
    .await?;
    if mapped_read_only == read_only {
        return Ok(());
    }
    Err(MapError::ModeMismatch {
        image: image.spec(),
        device: device.display().to_string(),
        mapped_read_only,
    })
}

/// `Ok` unless a mapping made `read_only` is writable ([`MapError::NotReadOnly`]).
pub(crate) async fn check_fresh_mode(
    root: &Path,
    device: &Path,
    read_only: bool,
) -> Result<(), MapError> {
    if !read_only {
        return Ok(());
    }
    let (root, dev) = (root.to_path_buf(), device.to_path_buf());
    let is_read_only = blocking("reading the mode of", move || {
        device_read_only(&root, &dev)
            .map_err(|e| MapError::io("reading the mode of", dev.display(), e))
    })
    .await?;
    if is_read_only {
        Ok(())
    } else {
        Err(MapError::NotReadOnly {
            device: device.display().to_string(),
        })
    }
}

/// The device mapping `image` among `mappings`, if any.
#[must_use]
pub fn find_mapping<'a>(mappings: &'a [Mapping], image: &ImageSpec) -> Option<&'a Mapping> {
    mappings.iter().find(|m| m.maps(image))
}

/// What to unmap for `image` whose stage recorded `recorded`: the recorded device if it still
/// maps the image, else another device mapping it; `None` when nothing maps it. A recorded device
/// that now maps another image is never chosen.
#[must_use]
pub fn device_to_unmap<'a>(
    mappings: &'a [Mapping],
    recorded: &Path,
    image: &ImageSpec,
) -> Option<&'a Path> {
    mappings
        .iter()
        .find(|m| m.device == recorded && m.maps(image))
        .or_else(|| find_mapping(mappings, image))
        .map(|m| m.device.as_path())
}

/// Runs a blocking filesystem or system-call step on the blocking thread pool, off the async
/// worker threads.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, MapError> + Send + 'static,
) -> Result<T, MapError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MapError::io(what, "(blocking task)", std::io::Error::other(e)))?
}

/// `text` with the key (and any `val=...` Ceph prints when it cannot parse a keyring entry)
/// replaced: Ceph's error messages may quote the keyring.
pub(crate) fn redact(text: &str, key: &Key) -> String {
    let text = if key.expose().is_empty() {
        text.to_owned()
    } else {
        text.replace(key.expose(), "<redacted>")
    };
    text.split(' ')
        .map(|word| {
            if word.starts_with("val=") {
                "val=<redacted>"
            } else {
                word
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An [`ExecError`] with the key scrubbed from the helper's output.
pub(crate) fn redact_exec(error: ExecError, key: &Key) -> MapError {
    match error {
        ExecError::Failed {
            command,
            status,
            code,
            stderr,
        } => MapError::Exec(ExecError::Failed {
            command,
            status,
            code,
            stderr: redact(&stderr, key),
        }),
        other => MapError::Exec(other),
    }
}

/// Parses the device path a `map` command printed.
pub(crate) fn parse_device_output(
    program: &'static str,
    stdout: &str,
) -> Result<PathBuf, MapError> {
    let line = stdout.lines().map(str::trim).rfind(|l| !l.is_empty());
    match line {
        Some(dev) if dev.starts_with("/dev/") => Ok(PathBuf::from(dev)),
        _ => Err(MapError::UnexpectedOutput {
            program,
            output: stdout.trim().to_owned(),
        }),
    }
}

/// Stand-in helper programs for the mapper tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::path::Path;

    pub(crate) use micro_ceph::write_executable;

    /// An executable `<dir>/<name>` that runs `body` (sh), after logging `$1 $2` to `<dir>/calls`
    /// unless `$1` is in `unlogged`.
    pub(crate) fn program(dir: &Path, name: &str, unlogged: &str, body: &str) -> String {
        let script = dir.join(name);
        write_executable(
            &script,
            &format!(
                "#!/bin/sh\nd={}\ncase \" {unlogged} \" in *\" $1 \"*) ;; *) echo \"$1 $2\" >> \"$d/calls\";; esac\n{body}\n",
                dir.display()
            ),
        );
        script.display().to_string()
    }

    /// What [`program`] logged.
    pub(crate) fn calls(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("calls")).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounter_names_parse_to_kinds() {
        assert_eq!(MounterKind::parse("rbd"), Ok(MounterKind::Krbd));
        assert_eq!(MounterKind::parse("krbd"), Ok(MounterKind::Krbd));
        assert_eq!(MounterKind::parse("rbd-nbd"), Ok(MounterKind::Nbd));
        assert_eq!(MounterKind::parse("FUSE"), Ok(MounterKind::FuseLoop));
        assert!(MounterKind::parse("iscsi").unwrap_err().contains("iscsi"));
    }

    #[test]
    fn errors_never_quote_the_key() {
        let key = Key::new("AQBsecret==");
        let text =
            "error parsing keyring: type=key val=AQBsecretX==: Malformed | key AQBsecret== bad";
        let clean = redact(text, &key);
        assert!(!clean.contains("AQBsecret"), "{clean}");
        assert!(clean.contains("Malformed"));
    }

    #[test]
    fn a_mapping_of_an_unknown_or_other_cluster_is_not_of_a_known_one() {
        let mapping = |fsid: Option<&str>| Mapping {
            device: "/dev/rbd0".into(),
            pool: "p".into(),
            namespace: String::new(),
            image: "i".into(),
            snap: "-".into(),
            cluster_fsid: fsid.map(str::to_owned),
        };
        assert!(mapping(Some("a")).in_cluster(Some("a")));
        assert!(!mapping(Some("b")).in_cluster(Some("a")));
        assert!(!mapping(None).in_cluster(Some("a")));
        assert!(mapping(None).in_cluster(None));
        assert!(mapping(Some("b")).in_cluster(None));
    }

    #[test]
    fn key_debug_is_redacted() {
        let key = Key::new("AQBsecret==");
        assert!(!format!("{key:?}").contains("AQB"));
    }

    #[test]
    fn device_output_is_the_last_dev_line() {
        assert_eq!(
            parse_device_output("rbd", "\n/dev/rbd3\n").unwrap(),
            PathBuf::from("/dev/rbd3")
        );
        assert!(parse_device_output("rbd", "rbd: sysfs write failed").is_err());
    }
}
