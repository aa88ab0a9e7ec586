//! Kernel RBD mapping through the `rbd` CLI: `rbd map POOL/IMAGE --id USER -m MONITORS
//! --keyfile FILE`, where FILE is a private key file removed right after the call (the kernel
//! keeps the key in its keyring).
//!
//! What is mapped comes from sysfs, `/sys/bus/rbd/devices/<id>/{pool,pool_ns,name,current_snap}`
//! for `/dev/rbd<id>`: a map of an image that is mapped already returns its device (a repeated
//! stage must not leak a second `/dev/rbdN`), and an unmap checks that the recorded device still
//! maps the image (after a reboot the same `/dev/rbdN` may be another volume).
//!
//! `-o` gets the node's options, the volume's `mapOptions`, and, when neither sets `ms_mode`,
//! `ms_mode=prefer-crc` for monitors without a msgr1 address ([`effective_map_options`]).
//!
//! Needs the `rbd` kernel module, absent on the host test bed: the sysfs and `/dev` roots are
//! injectable ([`KrbdMapper::with_root`]) and the lookup, command construction and key handling
//! are unit-tested against fake trees and a stand-in program; the real thing runs in the VM
//! suite (`rbd-provisioner`'s `tests/vm_kernel.rs`).

use std::io;
use std::path::{Path, PathBuf};

use super::{
    ImageSpec, Key, MapError, MapOptions, MappedDevice, Mapper, Mapping, MounterKind, blocking,
    options,
};

/// `rbd map` / `rbd unmap`.
#[derive(Debug, Clone)]
pub struct KrbdMapper {
    key_dir: PathBuf,
    /// The CLI to run (`rbd`; replaceable for tests).
    program: String,
    /// Extra `rbd map` options (`-o` value), e.g. `noudev` inside containers.
    map_options: Option<String>,
    /// Where `sys/` and `dev/` are (`/`; a fake tree in tests).
    root: PathBuf,
}

impl KrbdMapper {
    /// A mapper keeping its transient key files in `key_dir` (private, ideally tmpfs).
    #[must_use]
    pub fn new(key_dir: PathBuf, map_options: Option<String>) -> Self {
        Self {
            key_dir,
            program: "rbd".to_owned(),
            map_options,
            root: PathBuf::from("/"),
        }
    }
}

/// The images krbd has mapped, read from `<root>/sys/bus/rbd/devices/<id>/` (`pool`, `pool_ns`,
/// `name`, `current_snap`, `cluster_fsid`), each as device `<root>/dev/rbd<id>`. No rbd module loaded (no
/// `devices` directory) means nothing is mapped; a device that disappears while being read is
/// skipped.
///
/// # Errors
/// When the `devices` directory exists but cannot be read.
pub fn mappings(root: &Path) -> io::Result<Vec<Mapping>> {
    let devices = root.join("sys/bus/rbd/devices");
    let entries = match std::fs::read_dir(&devices) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let attribute = |dir: &Path, name: &str| -> io::Result<Option<String>> {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(text) => Ok(Some(text.trim_end_matches('\n').to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let dir = entry.path();
        // `pool` and `name` always exist while the device does; `pool_ns` since Linux 4.19
        // (older kernels know only the default namespace).
        let (Some(pool), Some(image)) = (attribute(&dir, "pool")?, attribute(&dir, "name")?) else {
            continue;
        };
        found.push(Mapping {
            device: root.join("dev").join(format!("rbd{id}")),
            pool,
            namespace: attribute(&dir, "pool_ns")?.unwrap_or_default(),
            image,
            snap: attribute(&dir, "current_snap")?.unwrap_or_default(),
            cluster_fsid: attribute(&dir, "cluster_fsid")?,
        });
    }
    found.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(found)
}

/// The global ID of the Ceph client instance behind `/dev/rbd<id>`: sysfs
/// `<root>/sys/bus/rbd/devices/<id>/client_id` (`client4157`); `None` for another device name or
/// an unreadable attribute.
#[must_use]
pub fn client_id(root: &Path, device: &Path) -> Option<u64> {
    let id = device.file_name()?.to_str()?.strip_prefix("rbd")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let text = std::fs::read_to_string(root.join("sys/bus/rbd/devices").join(id).join("client_id"))
        .ok()?;
    text.trim().strip_prefix("client")?.parse().ok()
}

/// The `rbd map` arguments (pure, no key: only the key file's path).
#[must_use]
pub fn map_args(image: &ImageSpec, keyfile: &Path, map_options: Option<&str>) -> Vec<String> {
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
    if let Some(options) = map_options.filter(|o| !o.is_empty()) {
        args.push("-o".to_owned());
        args.push(options.to_owned());
    }
    args
}

/// The `rbd map -o` value for `image`: the node's options (`--krbd-map-options`), then the
/// volume's (`mapOptions`, winning for an option both set), and `ms_mode=prefer-crc` when neither
/// sets `ms_mode` and the monitors have no msgr1 address ([`options::default_ms_mode`]).
#[must_use]
pub fn effective_map_options(node: Option<&str>, image: &ImageSpec) -> Option<String> {
    let merged = options::merge(&[node, image.map_options.as_deref()]);
    if options::sets(merged.as_deref(), "ms_mode") {
        return merged;
    }
    match options::default_ms_mode(&image.monitors) {
        Some(mode) => options::merge(&[merged.as_deref(), Some(&format!("ms_mode={mode}"))]),
        None => merged,
    }
}

impl KrbdMapper {
    /// Runs `program` instead of `rbd` (tests, or a wrapper script).
    #[must_use]
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = program.into();
        self
    }

    /// Looks for `sys/bus/rbd/devices` and `dev/rbd<id>` under `root` instead of `/` (tests).
    #[must_use]
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    async fn current_mappings(&self) -> Result<Vec<Mapping>, MapError> {
        let root = self.root.clone();
        blocking("reading krbd mappings in", move || {
            mappings(&root).map_err(|e| MapError::io("reading krbd mappings in", root.display(), e))
        })
        .await
    }
}

#[async_trait::async_trait]
impl Mapper for KrbdMapper {
    fn kind(&self) -> MounterKind {
        MounterKind::Krbd
    }

    async fn client_of(&self, mapped: &MappedDevice) -> Option<u64> {
        client_id(&self.root, &mapped.device)
    }

    async fn map(&self, image: &ImageSpec, key: &Key) -> Result<MappedDevice, MapError> {
        self.map_with(image, key, &MapOptions::default()).await
    }

    /// Reuses only a mapping of the same cluster (`cluster_fsid`) and mode (sysfs
    /// `/sys/block/rbdN/ro`); `--read-only` when asked, and verified.
    async fn map_with(
        &self,
        image: &ImageSpec,
        key: &Key,
        options: &MapOptions,
    ) -> Result<MappedDevice, MapError> {
        let map_options = effective_map_options(self.map_options.as_deref(), image);
        let map_options = map_options.as_deref();
        let fsid = options.cluster_fsid.as_deref();
        let mut existing = self.current_mappings().await?;
        existing.retain(|m| m.in_cluster(fsid));
        super::cli::map(
            &self.program,
            "rbd",
            MounterKind::Krbd,
            &self.key_dir,
            key,
            image,
            &existing,
            super::cli::Mode {
                read_only: options.read_only,
                root: &self.root,
            },
            |keyfile| {
                let mut args = map_args(image, keyfile, map_options);
                if options.read_only {
                    args.push("--read-only".to_owned());
                }
                args
            },
        )
        .await
    }

    async fn unmap(&self, mapped: &MappedDevice, image: &ImageSpec) -> Result<(), MapError> {
        self.unmap_with(mapped, image, &MapOptions::default()).await
    }

    async fn unmap_with(
        &self,
        mapped: &MappedDevice,
        image: &ImageSpec,
        options: &MapOptions,
    ) -> Result<(), MapError> {
        let fsid = options.cluster_fsid.as_deref();
        let mut current = self.current_mappings().await?;
        current.retain(|m| m.in_cluster(fsid));
        let extra = match image.unmap_options.as_deref().filter(|o| !o.is_empty()) {
            Some(options) => vec!["-o".to_owned(), options.to_owned()],
            None => Vec::new(),
        };
        super::cli::unmap(&self.program, mapped, image, &current, &extra).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake;
    use super::*;

    /// A fake `/`: `sys/bus/rbd/devices/<id>/...` and `dev/rbd<id>` for each mapping
    /// `(id, pool, namespace, image, snap)`.
    #[test]
    fn the_client_of_a_mapping_is_read_from_sysfs_client_id() {
        let root = fake_root(&[(3, "kube", "", "pvc-1", "-")]);
        let dir = root.path().join("sys/bus/rbd/devices/3");
        std::fs::write(dir.join("client_id"), "client4157\n").unwrap();
        assert_eq!(client_id(root.path(), Path::new("/dev/rbd3")), Some(4157));
        assert_eq!(client_id(root.path(), Path::new("/dev/rbd4")), None);
        assert_eq!(client_id(root.path(), Path::new("/dev/nbd3")), None);
        std::fs::write(dir.join("client_id"), "garbage\n").unwrap();
        assert_eq!(client_id(root.path(), Path::new("/dev/rbd3")), None);
    }

    fn fake_root(mappings: &[(u32, &str, &str, &str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let devices = root.path().join("sys/bus/rbd/devices");
        std::fs::create_dir_all(&devices).unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        for (id, pool, ns, name, snap) in mappings {
            let dir = devices.join(id.to_string());
            std::fs::create_dir(&dir).unwrap();
            for (attr, value) in [
                ("pool", pool),
                ("pool_ns", ns),
                ("name", name),
                ("current_snap", snap),
            ] {
                std::fs::write(dir.join(attr), format!("{value}\n")).unwrap();
            }
            std::fs::write(dir.join("major"), "251\n").unwrap();
            std::fs::write(root.path().join(format!("dev/rbd{id}")), "").unwrap();
            let block = root.path().join(format!("sys/block/rbd{id}"));
            std::fs::create_dir_all(&block).unwrap();
            std::fs::write(block.join("ro"), "0\n").unwrap();
        }
        root
    }

    /// A stand-in `rbd` that logs `$1 $2` to `<dir>/calls` and maps to /dev/rbd9.
    fn fake_rbd(dir: &Path) -> String {
        fake::program(
            dir,
            "fake-rbd",
            "",
            "[ \"$1\" = map ] && echo /dev/rbd9\nexit 0",
        )
    }

    fn image(pool: &str, name: &str) -> ImageSpec {
        ImageSpec {
            monitors: "127.0.0.1:6789".into(),
            pool: pool.into(),
            namespace: String::new(),
            image: name.into(),
            user: "admin".into(),
            map_options: None,
            unmap_options: None,
        }
    }

    #[test]
    fn sysfs_mappings_are_read_with_namespace_and_snapshot() {
        let root = fake_root(&[
            (0, "rbd", "", "other", "-"),
            (3, "kube", "", "pvc-1", "-"),
            (5, "kube", "tenant", "pvc-1", "-"),
            (7, "kube", "", "pvc-1", "snap1"),
        ]);
        // Not a device: the kernel's `devices` holds only numbered entries.
        std::fs::create_dir(root.path().join("sys/bus/rbd/devices/uevent-junk")).unwrap();
        let found = mappings(root.path()).unwrap();
        assert_eq!(found.len(), 4);
        assert_eq!(found[1].device, root.path().join("dev/rbd3"));
        assert_eq!(
            (found[2].namespace.as_str(), found[3].snap.as_str()),
            ("tenant", "snap1")
        );
        let matching: Vec<_> = found
            .iter()
            .filter(|m| m.maps(&image("kube", "pvc-1")))
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "namespace and snapshot mappings are other images"
        );
        assert_eq!(matching[0].device, root.path().join("dev/rbd3"));
        // Old kernels have no pool_ns: the default namespace.
        std::fs::remove_file(root.path().join("sys/bus/rbd/devices/3/pool_ns")).unwrap();
        assert!(mappings(root.path()).unwrap()[1].namespace.is_empty());
        // No rbd module: nothing mapped.
        let empty = tempfile::tempdir().unwrap();
        assert!(mappings(empty.path()).unwrap().is_empty());
    }

    #[tokio::test]
    async fn map_of_a_mapped_image_returns_its_device_without_mapping_again() {
        let root = fake_root(&[(0, "rbd", "", "other", "-"), (3, "kube", "", "pvc-1", "-")]);
        let mapper = KrbdMapper::new(root.path().join("keys"), None)
            .with_program(fake_rbd(root.path()))
            .with_root(root.path());
        let mapped = mapper
            .map(&image("kube", "pvc-1"), &Key::new("AQB=="))
            .await
            .unwrap();
        assert_eq!(mapped.device, root.path().join("dev/rbd3"));
        assert_eq!(fake::calls(root.path()), "", "rbd map must not run again");
        // An image mapped nowhere is mapped.
        let mapped = mapper
            .map(&image("kube", "pvc-2"), &Key::new("AQB=="))
            .await
            .unwrap();
        assert_eq!(mapped.device, PathBuf::from("/dev/rbd9"));
        assert_eq!(fake::calls(root.path()), "map kube/pvc-2\n");
    }

    #[tokio::test]
    async fn a_mapping_of_the_other_mode_is_not_reused_and_a_writable_read_only_one_is_unmapped() {
        let root = fake_root(&[(3, "kube", "", "pvc-1", "-")]);
        let mapper = KrbdMapper::new(root.path().join("keys"), None)
            .with_program(fake_rbd(root.path()))
            .with_root(root.path());
        let read_only = MapOptions {
            read_only: true,
            cluster_fsid: None,
        };
        // /dev/rbd3 maps pvc-1 read-write: a read-only stage does not get it
        let err = mapper
            .map_with(&image("kube", "pvc-1"), &Key::new("AQB=="), &read_only)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                MapError::ModeMismatch {
                    mapped_read_only: false,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("mapped read-write"), "{err}");
        assert_eq!(fake::calls(root.path()), "", "nothing mapped or unmapped");
        // and a read-only mapping is no read-write stage's either
        std::fs::write(root.path().join("sys/block/rbd3/ro"), "1\n").unwrap();
        let err = mapper
            .map(&image("kube", "pvc-1"), &Key::new("AQB=="))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                MapError::ModeMismatch {
                    mapped_read_only: true,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            mapper
                .map_with(&image("kube", "pvc-1"), &Key::new("AQB=="), &read_only)
                .await
                .unwrap()
                .device,
            root.path().join("dev/rbd3")
        );
        // a fresh read-only map the kernel reports writable is unmapped again
        let script = fake::program(
            root.path(),
            "fake-rbd-rw",
            "",
            "[ \"$1\" = map ] && echo /dev/rbd5\nexit 0",
        );
        let block = root.path().join("sys/block/rbd5");
        std::fs::create_dir_all(&block).unwrap();
        std::fs::write(block.join("ro"), "0\n").unwrap();
        let mapper = mapper.with_program(script);
        let err = mapper
            .map_with(&image("kube", "pvc-2"), &Key::new("AQB=="), &read_only)
            .await
            .unwrap_err();
        assert!(matches!(err, MapError::NotReadOnly { .. }), "{err}");
        assert_eq!(
            fake::calls(root.path()),
            "map kube/pvc-2\nunmap /dev/rbd5\n"
        );
    }

    /// What `unmap` of the volume recorded at /dev/rbd`recorded` (image kube/pvc-1) runs, with
    /// `mapped` in sysfs; and the fake root.
    async fn unmap_calls(
        mapped: &[(u32, &str, &str, &str, &str)],
        recorded: u32,
    ) -> (String, tempfile::TempDir) {
        let root = fake_root(mapped);
        let mapper = KrbdMapper::new(root.path().join("keys"), None)
            .with_program(fake_rbd(root.path()))
            .with_root(root.path());
        let recorded = MappedDevice {
            mounter: MounterKind::Krbd,
            device: root.path().join(format!("dev/rbd{recorded}")),
            fuse: None,
        };
        mapper
            .unmap(&recorded, &image("kube", "pvc-1"))
            .await
            .unwrap();
        (fake::calls(root.path()), root)
    }

    #[tokio::test]
    async fn unmap_touches_only_a_device_that_still_maps_the_image() {
        // After a reboot /dev/rbd3 is another volume: leave it alone.
        let (calls, _) = unmap_calls(&[(3, "kube", "", "someone-else", "-")], 3).await;
        assert_eq!(calls, "", "another volume's device was unmapped");
        // Not mapped at all (the rbd module is not even loaded): nothing to do.
        let (calls, _) = unmap_calls(&[], 3).await;
        assert_eq!(calls, "");
        // Still ours: unmapped.
        let (calls, root) = unmap_calls(&[(3, "kube", "", "pvc-1", "-")], 3).await;
        let rbd3 = root.path().join("dev/rbd3");
        assert_eq!(calls, format!("unmap {}\n", rbd3.display()));
        // The recorded device is another image's, ours is mapped elsewhere: that one goes.
        let (calls, root) = unmap_calls(
            &[(3, "kube", "", "other", "-"), (4, "kube", "", "pvc-1", "-")],
            3,
        )
        .await;
        let rbd4 = root.path().join("dev/rbd4");
        assert_eq!(calls, format!("unmap {}\n", rbd4.display()));
    }

    fn spec() -> ImageSpec {
        ImageSpec {
            monitors: "10.0.0.1:6789,10.0.0.2:6789".into(),
            pool: "kube".into(),
            namespace: String::new(),
            image: "pvc-1".into(),
            user: "kube".into(),
            map_options: None,
            unmap_options: None,
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
        let mut namespaced = spec();
        namespaced.namespace = "tenant".into();
        assert_eq!(
            map_args(&namespaced, Path::new("/k"), None)[1],
            "kube/tenant/pvc-1"
        );
    }

    #[test]
    fn ms_mode_is_added_for_msgr2_only_monitors_unless_configured() {
        let mut image = spec(); // port 6789: msgr1
        assert_eq!(
            effective_map_options(Some("noudev"), &image).as_deref(),
            Some("noudev")
        );
        image.monitors = "127.0.0.1:40000".into(); // msgr2 only, as the rbd CLI reads it
        assert_eq!(
            effective_map_options(None, &image).as_deref(),
            Some("ms_mode=prefer-crc")
        );
        assert_eq!(
            effective_map_options(Some("noudev"), &image).as_deref(),
            Some("noudev,ms_mode=prefer-crc")
        );
        // configured on the node or the volume: kept as given; the volume wins
        image.map_options = Some("ms_mode=secure".into());
        assert_eq!(
            effective_map_options(Some("ms_mode=crc,noudev"), &image).as_deref(),
            Some("noudev,ms_mode=secure")
        );
        image.map_options = None;
        assert_eq!(
            effective_map_options(Some("ms_mode=legacy"), &image).as_deref(),
            Some("ms_mode=legacy")
        );
    }

    #[tokio::test]
    async fn unmap_passes_the_volume_unmap_options() {
        let root = fake_root(&[(3, "kube", "", "pvc-1", "-")]);
        let dir = root.path();
        let script = fake::program(dir, "fake-rbd-args", "", "echo \"$@\" >> \"$d/args\"");
        let mapper = KrbdMapper::new(dir.join("keys"), None)
            .with_program(script)
            .with_root(dir);
        let mut image = image("kube", "pvc-1");
        image.unmap_options = Some("force".into());
        let recorded = MappedDevice {
            mounter: MounterKind::Krbd,
            device: dir.join("dev/rbd3"),
            fuse: None,
        };
        mapper.unmap(&recorded, &image).await.unwrap();
        let args = std::fs::read_to_string(dir.join("args")).unwrap();
        assert_eq!(
            args,
            format!("unmap {} -o force\n", dir.join("dev/rbd3").display())
        );
    }

    #[tokio::test]
    async fn key_file_is_gone_after_a_failed_map() {
        let tmp = tempfile::tempdir().unwrap();
        let keys = tmp.path().join("keys");
        let mapper = KrbdMapper::new(keys.clone(), None)
            .with_program("false")
            .with_root(tmp.path());
        // `false` stands in for a failing `rbd map`; the key file must not remain.
        let result = mapper.map(&spec(), &Key::new("AQBsecret==")).await;
        assert!(result.is_err());
        assert_eq!(std::fs::read_dir(&keys).unwrap().count(), 0);
    }
    #[tokio::test]
    async fn key_reaches_rbd_only_through_a_private_file_removed_after_map() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let script = dir.join("fake-rbd");
        // Arguments: map POOL/IMAGE --id USER -m MONITORS --keyfile FILE -> FILE is $8.
        crate::mapper::fake::write_executable(
            &script,
            &format!(
                "#!/bin/sh\n[ \"$(stat -c %a \"$8\")\" = 600 ] || exit 3\n\
                 cat \"$8\" > {d}/seen-key\necho \"$@\" > {d}/seen-args\necho /dev/rbd7\n",
                d = dir.display()
            ),
        );
        let keys = dir.join("keys");
        let mapper = KrbdMapper::new(keys.clone(), None)
            .with_program(script.display().to_string())
            .with_root(dir);
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
