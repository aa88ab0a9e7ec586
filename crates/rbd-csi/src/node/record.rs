//! The staging record: what `NodeStageVolume` mapped for a staging path, kept in a small JSON file
//! beside the staging directory (`<parent>/<name>.rbd-csi.json`), so `NodeUnstageVolume` can unmap
//! after a plugin restart. Holds no secret.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::mapper::{ImageSpec, MapOptions, MappedDevice};

/// Name of the file (inside the staging directory) a block volume's device is bound onto.
pub const BLOCK_DEVICE_FILE: &str = "device";

/// What is staged at a staging path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagingRecord {
    pub volume_id: String,
    pub image: ImageSpec,
    pub mapped: MappedDevice,
    /// Raw block volume (device bound at `<staging>/device`) rather than a mounted filesystem.
    pub block: bool,
    /// Staged read-only (a reader-only access mode): mapped and mounted read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The fsid of the cluster the image was mapped from (records of older versions have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_fsid: Option<String>,
    /// An encrypted volume: the device-mapper name of its opened LUKS device, which is what is
    /// mounted or bound (closed before the image is unmapped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crypt: Option<String>,
}

impl StagingRecord {
    /// The device the volume's data is on: the opened LUKS device of an encrypted volume, else
    /// the mapped device.
    #[must_use]
    pub fn exposed_device(&self) -> PathBuf {
        match &self.crypt {
            Some(name) => Path::new("/dev/mapper").join(name),
            None => self.mapped.device.clone(),
        }
    }

    /// The options the image was mapped with, for unmapping it.
    #[must_use]
    pub fn map_options(&self) -> MapOptions {
        MapOptions {
            read_only: self.read_only,
            cluster_fsid: self.cluster_fsid.clone(),
        }
    }
}

/// Where the record of `staging_path` lives.
#[must_use]
pub fn path_for(staging_path: &Path) -> PathBuf {
    let name = staging_path
        .file_name()
        .map_or_else(|| "staging".into(), |n| n.to_string_lossy().into_owned());
    staging_path
        .parent()
        .unwrap_or_else(|| Path::new("/"))
        .join(format!("{name}.rbd-csi.json"))
}

/// Reads the record of `staging_path`, `None` when there is none.
///
/// # Errors
/// When the file exists but cannot be read or parsed.
pub fn read(staging_path: &Path) -> io::Result<Option<StagingRecord>> {
    match std::fs::read(path_for(staging_path)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the record atomically (temporary file + rename).
///
/// # Errors
/// The filesystem error.
pub fn write(staging_path: &Path, record: &StagingRecord) -> io::Result<()> {
    let path = path_for(staging_path);
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path)
}

/// Removes the record; a missing one is fine.
///
/// # Errors
/// The filesystem error.
pub fn remove(staging_path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path_for(staging_path)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapper::MounterKind;

    #[test]
    fn record_sits_beside_the_staging_dir_and_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join("globalmount");
        assert_eq!(
            path_for(&staging),
            tmp.path().join("globalmount.rbd-csi.json")
        );
        assert!(read(&staging).unwrap().is_none());
        let record = StagingRecord {
            volume_id: "v1/m/p/i".into(),
            image: ImageSpec {
                monitors: "m".into(),
                pool: "p".into(),
                namespace: String::new(),
                image: "i".into(),
                user: "u".into(),
                map_options: None,
                unmap_options: None,
            },
            mapped: MappedDevice {
                mounter: MounterKind::Krbd,
                device: "/dev/rbd0".into(),
                fuse: None,
            },
            block: false,
            read_only: true,
            cluster_fsid: Some("f00d".into()),
            crypt: Some("rbd-csi-00".into()),
        };
        write(&staging, &record).unwrap();
        assert_eq!(read(&staging).unwrap(), Some(record));
        remove(&staging).unwrap();
        remove(&staging).unwrap();
        assert!(read(&staging).unwrap().is_none());
    }
}
