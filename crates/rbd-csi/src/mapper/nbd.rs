//! `rbd-nbd` mapping: `rbd-nbd map POOL/IMAGE --id USER -m MONITORS --keyfile FILE`. The key file
//! is private and removed once the daemon has connected (it keeps its session in memory). Needs
//! the `nbd` kernel module, absent on this test bed: the command construction and key handling
//! are unit-tested.

use std::path::{Path, PathBuf};

use super::{ImageSpec, Key, MapError, MappedDevice, Mapper, MounterKind};

/// `rbd-nbd map` / `rbd-nbd unmap`.
#[derive(Debug, Clone)]
pub struct NbdMapper {
    key_dir: PathBuf,
    /// The CLI to run (`rbd-nbd`; replaceable for tests).
    program: String,
}

impl NbdMapper {
    /// A mapper keeping its transient key files in `key_dir` (private, ideally tmpfs).
    #[must_use]
    pub fn new(key_dir: PathBuf) -> Self {
        Self {
            key_dir,
            program: "rbd-nbd".to_owned(),
        }
    }
}

/// The `rbd-nbd map` arguments (pure, no key: only the key file's path).
#[must_use]
pub fn map_args(image: &ImageSpec, keyfile: &Path) -> Vec<String> {
    vec![
        "map".to_owned(),
        format!("{}/{}", image.pool, image.image),
        "--id".to_owned(),
        image.user.clone(),
        "-m".to_owned(),
        image.monitors.clone(),
        "--keyfile".to_owned(),
        keyfile.to_string_lossy().into_owned(),
    ]
}

impl NbdMapper {
    /// Runs `program` instead of `rbd-nbd` (tests, or a wrapper script).
    #[must_use]
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = program.into();
        self
    }
}

#[async_trait::async_trait]
impl Mapper for NbdMapper {
    fn kind(&self) -> MounterKind {
        MounterKind::Nbd
    }

    async fn map(&self, image: &ImageSpec, key: &Key) -> Result<MappedDevice, MapError> {
        super::cli::map(
            &self.program,
            "rbd-nbd",
            MounterKind::Nbd,
            &self.key_dir,
            key,
            |keyfile| map_args(image, keyfile),
        )
        .await
    }

    async fn unmap(&self, mapped: &MappedDevice) -> Result<(), MapError> {
        super::cli::unmap(&self.program, mapped).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_args_carry_the_keyfile_path_not_the_key() {
        let spec = ImageSpec {
            monitors: "m1:6789".into(),
            pool: "rbd".into(),
            image: "img".into(),
            user: "admin".into(),
        };
        let args = map_args(&spec, Path::new("/dev/shm/k"));
        assert_eq!(
            args,
            [
                "map",
                "rbd/img",
                "--id",
                "admin",
                "-m",
                "m1:6789",
                "--keyfile",
                "/dev/shm/k"
            ]
        );
    }

    #[tokio::test]
    async fn key_file_is_gone_after_a_failed_map() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = tmp.path().join("keys");
        let mapper = NbdMapper::new(keys.clone()).with_program("false");
        let spec = ImageSpec {
            monitors: "127.0.0.1:1".into(),
            pool: "rbd".into(),
            image: "img".into(),
            user: "admin".into(),
        };
        assert!(mapper.map(&spec, &Key::new("AQBsecret==")).await.is_err());
        assert_eq!(std::fs::read_dir(&keys).unwrap().count(), 0);
    }
}
