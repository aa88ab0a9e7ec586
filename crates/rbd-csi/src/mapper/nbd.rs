//! `rbd-nbd` mapping: `rbd-nbd map POOL/IMAGE --id USER -m MONITORS --keyfile FILE`. The key file
//! is private and removed once the daemon has connected (it keeps its session in memory).
//!
//! What is mapped comes from `rbd-nbd list-mapped --format json`, a JSON array of
//! `{"id": PID, "pool", "namespace", "image", "snap", "device"[, "cookie"]}` (Ceph's
//! `do_list_mapped_devices`; `snap` is empty for the image itself): a map of an image that is
//! mapped already returns its device, and an unmap checks that the recorded device still maps the
//! image. Needs the `nbd` kernel module, absent on this test bed: the program is replaceable
//! ([`NbdMapper::with_program`]) and the parsing, lookup, command construction and key handling
//! are unit-tested against recorded outputs and a stand-in program.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::daemon::DaemonPlacement;
use super::{ImageSpec, Key, MapError, MapOptions, MappedDevice, Mapper, Mapping, MounterKind};
use crate::exec;

/// `rbd-nbd map` / `rbd-nbd unmap`.
#[derive(Debug, Clone)]
pub struct NbdMapper {
    key_dir: PathBuf,
    /// The CLI to run (`rbd-nbd`; replaceable for tests).
    program: String,
    /// Where `rbd-nbd map` (and so the daemon it forks) starts.
    placement: DaemonPlacement,
}

impl NbdMapper {
    /// A mapper keeping its transient key files in `key_dir` (private, ideally tmpfs).
    #[must_use]
    pub fn new(key_dir: PathBuf) -> Self {
        Self {
            key_dir,
            program: "rbd-nbd".to_owned(),
            placement: DaemonPlacement::default(),
        }
    }
}

/// The `rbd-nbd map` arguments (pure, no key: only the key file's path).
#[must_use]
pub fn map_args(image: &ImageSpec, keyfile: &Path) -> Vec<String> {
    let mut args = vec![
        "map".to_owned(),
        image.spec(),
        "--id".to_owned(),
        image.user.clone(),
        "-m".to_owned(),
        image.monitors.clone(),
        "--keyfile".to_owned(),
        keyfile.to_string_lossy().into_owned(),
    ];
    args.extend(super::options::nbd_flags(image.map_options.as_deref()));
    args
}

impl NbdMapper {
    /// Runs `program` instead of `rbd-nbd` (tests, or a wrapper script).
    #[must_use]
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = program.into();
        self
    }

    /// Starts `rbd-nbd map`, and so its daemon, with `placement`
    /// ([`super::daemon`]: outside the plugin's process group and cgroup).
    #[must_use]
    pub fn with_placement(mut self, placement: DaemonPlacement) -> Self {
        self.placement = placement;
        self
    }

    async fn current_mappings(&self) -> Result<Vec<Mapping>, MapError> {
        let out = exec::run(&self.program, &["list-mapped", "--format", "json"]).await?;
        parse_list_mapped(&out.stdout)
    }
}

/// One entry of `rbd-nbd list-mapped --format json`.
#[derive(Debug, Deserialize)]
struct ListedDevice {
    #[serde(default)]
    pool: String,
    #[serde(default)]
    namespace: String,
    image: String,
    #[serde(default)]
    snap: String,
    device: PathBuf,
}

/// Parses `rbd-nbd list-mapped --format json` output (blank output: nothing mapped).
///
/// # Errors
/// [`MapError::UnexpectedOutput`] when it is not that JSON.
pub fn parse_list_mapped(stdout: &str) -> Result<Vec<Mapping>, MapError> {
    if stdout.trim().is_empty() {
        return Ok(Vec::new());
    }
    let listed: Vec<ListedDevice> =
        serde_json::from_str(stdout).map_err(|_| MapError::UnexpectedOutput {
            program: "rbd-nbd list-mapped",
            output: stdout.trim().to_owned(),
        })?;
    Ok(listed
        .into_iter()
        .map(|d| Mapping {
            device: d.device,
            pool: d.pool,
            namespace: d.namespace,
            image: d.image,
            snap: d.snap,
            cluster_fsid: None,
        })
        .collect())
}

#[async_trait::async_trait]
impl Mapper for NbdMapper {
    fn kind(&self) -> MounterKind {
        MounterKind::Nbd
    }

    async fn map(&self, image: &ImageSpec, key: &Key) -> Result<MappedDevice, MapError> {
        self.map_with(image, key, &MapOptions::default()).await
    }

    /// `--read-only` when asked. `rbd-nbd list-mapped` does not say which cluster a device maps
    /// from, so the cluster is not checked here (the node authenticates the key first).
    async fn map_with(
        &self,
        image: &ImageSpec,
        key: &Key,
        options: &MapOptions,
    ) -> Result<MappedDevice, MapError> {
        let existing = self.current_mappings().await?;
        super::cli::map_placed(
            &self.program,
            "rbd-nbd",
            MounterKind::Nbd,
            &self.key_dir,
            key,
            image,
            &existing,
            |keyfile| {
                let mut args = map_args(image, keyfile);
                if options.read_only {
                    args.push("--read-only".to_owned());
                }
                args
            },
            Some(&self.placement),
        )
        .await
    }

    async fn unmap(&self, mapped: &MappedDevice, image: &ImageSpec) -> Result<(), MapError> {
        let current = self.current_mappings().await?;
        super::cli::unmap(&self.program, mapped, image, &current, &[]).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake;
    use super::*;

    /// Recorded from Ceph 16's rbd-nbd (`list-mapped --format json`): one head mapping, one in a
    /// namespace, one snapshot. Ceph 17+ adds `cookie`.
    const LISTED: &str = r#"[{"id":4242,"pool":"kube","namespace":"","image":"pvc-1","snap":"","device":"/dev/nbd0"},{"id":4243,"pool":"kube","namespace":"tenant","image":"pvc-1","snap":"","device":"/dev/nbd1"},{"id":4244,"pool":"kube","namespace":"","image":"pvc-1","snap":"s1","device":"/dev/nbd2","cookie":"c0ffee"}]"#;

    fn image(name: &str) -> ImageSpec {
        ImageSpec {
            monitors: "127.0.0.1:6789".into(),
            pool: "kube".into(),
            namespace: String::new(),
            image: name.into(),
            user: "admin".into(),
            map_options: None,
            unmap_options: None,
        }
    }

    /// A stand-in `rbd-nbd` answering `list-mapped` with `listed` (a file), logging other calls.
    fn fake_nbd(dir: &Path, listed: &str) -> String {
        std::fs::write(dir.join("listed.json"), listed).unwrap();
        fake::program(
            dir,
            "fake-rbd-nbd",
            "list-mapped",
            "[ \"$1\" = list-mapped ] && { cat \"$d/listed.json\"; exit 0; }\n\
             [ \"$1\" = map ] && echo /dev/nbd9\nexit 0",
        )
    }

    #[test]
    fn list_mapped_json_parses_and_only_the_head_in_the_default_namespace_matches() {
        let found = parse_list_mapped(LISTED).unwrap();
        assert_eq!(found.len(), 3);
        assert_eq!(found[1].namespace, "tenant");
        assert_eq!(found[2].snap, "s1");
        let ours = super::super::find_mapping(&found, &image("pvc-1")).unwrap();
        assert_eq!(ours.device, PathBuf::from("/dev/nbd0"));
        assert!(super::super::find_mapping(&found, &image("pvc-2")).is_none());
        assert!(parse_list_mapped("").unwrap().is_empty());
        assert!(parse_list_mapped("[]\n").unwrap().is_empty());
        assert!(matches!(
            parse_list_mapped("id pool namespace image snap device"),
            Err(MapError::UnexpectedOutput { .. })
        ));
    }

    #[tokio::test]
    async fn map_of_a_mapped_image_returns_its_device_without_mapping_again() {
        let tmp = tempfile::tempdir().unwrap();
        let mapper =
            NbdMapper::new(tmp.path().join("keys")).with_program(fake_nbd(tmp.path(), LISTED));
        let mapped = mapper
            .map(&image("pvc-1"), &Key::new("AQB=="))
            .await
            .unwrap();
        assert_eq!(mapped.device, PathBuf::from("/dev/nbd0"));
        assert_eq!(
            fake::calls(tmp.path()),
            "",
            "rbd-nbd map must not run again"
        );
        let mapped = mapper
            .map(&image("pvc-2"), &Key::new("AQB=="))
            .await
            .unwrap();
        assert_eq!(mapped.device, PathBuf::from("/dev/nbd9"));
        assert_eq!(fake::calls(tmp.path()), "map kube/pvc-2\n");
    }

    #[tokio::test]
    async fn unmap_touches_only_a_device_that_still_maps_the_image() {
        let tmp = tempfile::tempdir().unwrap();
        // The recorded device exists (as after a reboot) but serves another image.
        let device = tmp.path().join("nbd0");
        std::fs::write(&device, "").unwrap();
        let listed = format!(
            r#"[{{"id":1,"pool":"kube","namespace":"","image":"someone-else","snap":"","device":"{}"}}]"#,
            device.display()
        );
        let mapper =
            NbdMapper::new(tmp.path().join("keys")).with_program(fake_nbd(tmp.path(), &listed));
        let recorded = MappedDevice {
            mounter: MounterKind::Nbd,
            device: device.clone(),
            fuse: None,
        };
        mapper.unmap(&recorded, &image("pvc-1")).await.unwrap();
        assert_eq!(
            fake::calls(tmp.path()),
            "",
            "another volume's device was unmapped"
        );

        let listed = listed.replace("someone-else", "pvc-1");
        let mapper = mapper.with_program(fake_nbd(tmp.path(), &listed));
        mapper.unmap(&recorded, &image("pvc-1")).await.unwrap();
        assert_eq!(
            fake::calls(tmp.path()),
            format!("unmap {}\n", device.display())
        );
    }

    #[test]
    fn map_args_carry_the_keyfile_path_not_the_key() {
        let spec = ImageSpec {
            monitors: "m1:6789".into(),
            pool: "rbd".into(),
            namespace: String::new(),
            image: "img".into(),
            user: "admin".into(),
            map_options: None,
            unmap_options: None,
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
        // Nothing mapped yet, and `map` fails: the key file must not remain.
        let script = fake::program(
            tmp.path(),
            "failing-rbd-nbd",
            "list-mapped",
            "[ \"$1\" = list-mapped ] && { echo '[]'; exit 0; }\nexit 1",
        );
        let mapper = NbdMapper::new(keys.clone()).with_program(script);
        let spec = ImageSpec {
            monitors: "127.0.0.1:1".into(),
            pool: "rbd".into(),
            namespace: String::new(),
            image: "img".into(),
            user: "admin".into(),
            map_options: None,
            unmap_options: None,
        };
        let err = mapper
            .map(&spec, &Key::new("AQBsecret=="))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("map rbd/img"),
            "map itself failed: {err}"
        );
        assert_eq!(std::fs::read_dir(&keys).unwrap().count(), 0);
    }
}
