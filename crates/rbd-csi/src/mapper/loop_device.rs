//! Loop devices as the kernel reports them (`/sys/block/loop*/loop/backing_file`): which file
//! backs which device, and waiting for a detach to complete.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::MapError;

const DETACH_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// The backing file of a loop device (`/dev/loopN`), if attached.
#[must_use]
pub fn backing_file(device: &Path) -> Option<PathBuf> {
    let name = device.file_name()?.to_str()?;
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

/// All attached loop devices with their backing files.
#[must_use]
pub fn loop_devices() -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let device = PathBuf::from("/dev").join(&name);
            Some((device.clone(), backing_file(&device)?))
        })
        .collect()
}

pub(crate) fn loop_device_for(file: &Path) -> Option<PathBuf> {
    loop_devices()
        .into_iter()
        .find(|(_, backing)| backing == file)
        .map(|(dev, _)| dev)
}

pub(crate) fn loop_devices_under(mnt: &Path) -> Vec<PathBuf> {
    loop_devices()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(mnt))
        .map(|(dev, _)| dev)
        .collect()
}

pub(crate) async fn wait_detached(device: &Path, file: &Path) -> Result<(), MapError> {
    let deadline = Instant::now() + DETACH_TIMEOUT;
    while backing_file(device).as_deref() == Some(file) {
        if Instant::now() > deadline {
            return Err(MapError::Timeout(format!(
                "loop device {} still attached to {} after losetup -d",
                device.display(),
                file.display()
            )));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}
