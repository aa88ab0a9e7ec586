//! Private files for keys: created `0600` (never readable by anyone else, not even briefly) inside
//! a `0700` directory owned by the node plugin, and removed when dropped.
//!
//! Put the runtime directory on tmpfs (`/run`, an `emptyDir` with `medium: Memory`) so keys never
//! reach a disk.

use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Creates `dir` (and parents) with mode `0700`, and tightens an existing one to `0700`.
///
/// # Errors
/// The filesystem error.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes `contents` to `path`, replacing it, with mode `0600` from the moment it exists.
///
/// # Errors
/// The filesystem error.
pub fn write_private(path: &Path, contents: &str) -> io::Result<()> {
    // Remove first: an existing file could have wider permissions that `mode` would not change.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// A private file removed on drop (for a key a helper reads once, e.g. `rbd map --keyfile`).
#[derive(Debug)]
pub struct SecretFile {
    path: PathBuf,
}

impl SecretFile {
    /// Writes `contents` to a fresh file in `dir` (created `0700` if missing).
    ///
    /// # Errors
    /// The filesystem error.
    pub fn create(dir: &Path, prefix: &str, contents: &str) -> io::Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        private_dir(dir)?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{prefix}-{}-{n}", std::process::id()));
        write_private(&path, contents)?;
        Ok(Self { path })
    }

    /// Where the file is.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove key file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_file_is_0600_in_0700_dir_and_removed_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let file = SecretFile::create(&dir, "key", "AQBsecret==").unwrap();
        let path = file.path().to_path_buf();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "AQBsecret==");
        drop(file);
        assert!(!path.exists());
    }

    #[test]
    fn write_private_replaces_a_world_readable_file_with_a_private_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("keyring");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, "new").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
    }
}
