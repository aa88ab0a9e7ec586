//! Kernel RBD mapping through the `rbd` CLI: `rbd map POOL/IMAGE --id USER -m MONITORS
//! --keyfile FILE`, where FILE is a private key file removed right after the call (the kernel
//! keeps the key in its keyring). Needs the `rbd` kernel module, absent on this test bed, so only
//! the command construction and key handling are unit-tested here.

use std::path::{Path, PathBuf};

use super::{ImageSpec, Key, MapError, MappedDevice, Mapper, MounterKind};

/// `rbd map` / `rbd unmap`.
#[derive(Debug, Clone)]
pub struct KrbdMapper {
    key_dir: PathBuf,
    /// The CLI to run (`rbd`; replaceable for tests).
    program: String,
    /// Extra `rbd map` options (`-o` value), e.g. `noudev` inside containers.
    map_options: Option<String>,
}

impl KrbdMapper {
    /// A mapper keeping its transient key files in `key_dir` (private, ideally tmpfs).
    #[must_use]
    pub fn new(key_dir: PathBuf, map_options: Option<String>) -> Self {
        Self {
            key_dir,
            program: "rbd".to_owned(),
            map_options,
        }
    }
}

/// The `rbd map` arguments (pure, no key: only the key file's path).
#[must_use]
pub fn map_args(image: &ImageSpec, keyfile: &Path, map_options: Option<&str>) -> Vec<String> {
    let mut args = vec![
        "map".to_owned(),
        format!("{}/{}", image.pool, image.image),
        "--id".to_owned(),
        image.user.clone(),
        "-m".to_owned(),
        image.monitors.clone(),
        "--keyfile".to_owned(),
        keyfile.to_string_lossy().into_owned(),
    ];
    if let Some(options) = map_options.filter(|o| !o.is_empty()) {
        args.push("-o".to_owned());
        args.push(options.to_owned());
    }
    args
}

impl KrbdMapper {
    /// Runs `program` instead of `rbd` (tests, or a wrapper script).
    #[must_use]
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = program.into();
        self
    }
}

#[async_trait::async_trait]
impl Mapper for KrbdMapper {
    fn kind(&self) -> MounterKind {
        MounterKind::Krbd
    }

    async fn map(&self, image: &ImageSpec, key: &Key) -> Result<MappedDevice, MapError> {
        let options = self.map_options.as_deref();
        super::cli::map(
            &self.program,
            "rbd",
            MounterKind::Krbd,
            &self.key_dir,
            key,
            |keyfile| map_args(image, keyfile, options),
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

    fn spec() -> ImageSpec {
        ImageSpec {
            monitors: "10.0.0.1:6789,10.0.0.2:6789".into(),
            pool: "kube".into(),
            image: "pvc-1".into(),
            user: "kube".into(),
        }
    }

    #[test]
    fn map_args_name_image_user_monitors_and_keyfile_never_the_key() {
        let args = map_args(&spec(), Path::new("/run/rbd-csi/keys/k1"), Some("noudev"));
        assert_eq!(
            args,
            [
                "map",
                "kube/pvc-1",
                "--id",
                "kube",
                "-m",
                "10.0.0.1:6789,10.0.0.2:6789",
                "--keyfile",
                "/run/rbd-csi/keys/k1",
                "-o",
                "noudev"
            ]
        );
        assert!(!args.iter().any(|a| a == "--key" || a.contains("AQB")));
    }

    #[tokio::test]
    async fn key_file_is_gone_after_a_failed_map() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = tmp.path().join("keys");
        let mapper = KrbdMapper::new(keys.clone(), None).with_program("false");
        // `false` stands in for a failing `rbd map`; the key file must not remain.
        let result = mapper.map(&spec(), &Key::new("AQBsecret==")).await;
        assert!(result.is_err());
        assert_eq!(std::fs::read_dir(&keys).unwrap().count(), 0);
    }
    #[tokio::test]
    async fn key_reaches_rbd_only_through_a_private_file_removed_after_map() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let script = dir.join("fake-rbd");
        // Arguments: map POOL/IMAGE --id USER -m MONITORS --keyfile FILE -> FILE is $8.
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n[ \"$(stat -c %a \"$8\")\" = 600 ] || exit 3\n\
                 cat \"$8\" > {d}/seen-key\necho \"$@\" > {d}/seen-args\necho /dev/rbd7\n",
                d = dir.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let keys = dir.join("keys");
        let mapper = KrbdMapper::new(keys.clone(), None).with_program(script.display().to_string());
        let mapped = mapper.map(&spec(), &Key::new("AQBsecret==")).await.unwrap();
        assert_eq!(mapped.device, PathBuf::from("/dev/rbd7"));
        assert_eq!(
            std::fs::read_to_string(dir.join("seen-key")).unwrap(),
            "AQBsecret=="
        );
        let args = std::fs::read_to_string(dir.join("seen-args")).unwrap();
        assert!(args.contains("--keyfile") && !args.contains("AQBsecret"));
        assert_eq!(
            std::fs::read_dir(&keys).unwrap().count(),
            0,
            "key file removed"
        );
    }
}
