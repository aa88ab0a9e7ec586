//! `rbd-nbd` mapping: `rbd-nbd map POOL/IMAGE --id USER -m MONITORS --keyfile FILE`. The key file
//! is private and removed once the daemon has connected (it keeps its session in memory).
//!
//! What is mapped comes from `rbd-nbd list-mapped --format json`, a JSON array of
//! `{"id": PID, "pool", "namespace", "image", "snap", "device"[, "cookie"]}` (Ceph's
//! `do_list_mapped_devices`; `snap` is empty for the image itself): a map of an image that is
//! mapped already returns its device, and an unmap checks that the recorded device still maps the
//! image.
//!
//! **Whose mapping.** The listing names no cluster and no user, and two clusters may well have
//! the same pool and image names. The daemon's own command line (`/proc/PID/cmdline`, which is
//! what `list-mapped` itself parses: `rbd-nbd map SPEC --id USER -m MONITORS ...`) says both: a
//! mapping counts as the image's only when its daemon connects to the volume's cluster (a
//! monitor address in common) as the volume's Ceph user ([`DaemonClient::serves`]); a daemon
//! whose command line cannot be read or names neither counts as another's. Mappings of other
//! clients are neither reused nor unmapped. A reused mapping must also have the stage's mode
//! (`/sys/block/nbdN/ro`).
//!
//! Needs the `nbd` kernel module, absent on this test bed: the program, `/proc` and the sysfs
//! root are replaceable ([`NbdMapper::with_program`], [`NbdMapper::with_roots`]) and the parsing,
//! matching, command construction and key handling are unit-tested against recorded outputs and
//! a stand-in program.

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
    /// `/proc` (a fake tree in tests): the daemons' command lines.
    proc_root: PathBuf,
    /// `/` (a fake tree in tests): `sys/block/nbdN/ro`.
    sys_root: PathBuf,
}

impl NbdMapper {
    /// A mapper keeping its transient key files in `key_dir` (private, ideally tmpfs).
    #[must_use]
    pub fn new(key_dir: PathBuf) -> Self {
        Self {
            key_dir,
            program: "rbd-nbd".to_owned(),
            placement: DaemonPlacement::default(),
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/"),
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

    /// Reads the daemons' command lines under `proc_root` and `sys/block` under `sys_root`
    /// instead of `/proc` and `/` (tests).
    #[must_use]
    pub fn with_roots(
        mut self,
        proc_root: impl Into<PathBuf>,
        sys_root: impl Into<PathBuf>,
    ) -> Self {
        self.proc_root = proc_root.into();
        self.sys_root = sys_root.into();
        self
    }

    /// The mappings whose daemon serves `image`'s cluster and user ([`mappings_for`]).
    async fn current_mappings(&self, image: &ImageSpec) -> Result<Vec<Mapping>, MapError> {
        let out = exec::run(&self.program, &["list-mapped", "--format", "json"]).await?;
        let proc_root = self.proc_root.clone();
        let (stdout, image) = (out.stdout, image.clone());
        super::blocking("reading rbd-nbd daemons in", move || {
            mappings_for(&stdout, &image, |pid| {
                std::fs::read(proc_root.join(pid.to_string()).join("cmdline")).ok()
            })
        })
        .await
    }
}

/// Who an rbd-nbd daemon connects as, from its command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonClient {
    /// `-m` / `--mon_host` / `--mon-host`.
    pub monitors: Option<String>,
    /// `--id` / `-i`, or `--name` / `-n` without its `client.`.
    pub user: Option<String>,
}

impl DaemonClient {
    /// Parses a `/proc/PID/cmdline` (NUL-separated arguments).
    #[must_use]
    pub fn from_cmdline(cmdline: &[u8]) -> DaemonClient {
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let mut client = DaemonClient::default();
        let mut i = 0;
        while i < args.len() {
            let arg = args[i].as_str();
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with('-') => (n, Some(v.to_owned())),
                _ => (arg, None),
            };
            let takes = matches!(
                name,
                "-m" | "--mon_host" | "--mon-host" | "--id" | "-i" | "--name" | "-n"
            );
            if !takes {
                i += 1;
                continue;
            }
            let value = if let Some(v) = inline {
                v
            } else {
                i += 1;
                args.get(i).cloned().unwrap_or_default()
            };
            match name {
                "-m" | "--mon_host" | "--mon-host" => client.monitors = Some(value),
                "--id" | "-i" => client.user = Some(value),
                _ => client.user = Some(value.strip_prefix("client.").unwrap_or(&value).to_owned()),
            }
            i += 1;
        }
        client
    }

    /// Whether this daemon maps from `image`'s cluster (a monitor address in common) as
    /// `image`'s user.
    #[must_use]
    pub fn serves(&self, image: &ImageSpec) -> bool {
        let same_user = self.user.as_deref() == Some(image.user.as_str());
        let ours = monitor_addresses(&image.monitors);
        let same_cluster = self
            .monitors
            .as_deref()
            .is_some_and(|m| monitor_addresses(m).iter().any(|a| ours.contains(a)));
        same_user && same_cluster
    }
}

/// A monitor list's addresses as `host:port` (lower case), without `v1:`/`v2:`, address-vector
/// brackets and nonces; an address without a port stands for both default ports (6789, 3300).
fn monitor_addresses(monitors: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in monitors.split([',', ' ', ';']) {
        let mut e = entry.trim();
        // `[v2:a:3300,v1:a:6789]`: the vector's brackets, split at its comma
        if e.starts_with("[v") {
            e = &e[1..];
        }
        if e.ends_with(']') && e.matches('[').count() < e.matches(']').count() {
            e = &e[..e.len() - 1];
        }
        let e = e
            .strip_prefix("v1:")
            .or_else(|| e.strip_prefix("v2:"))
            .unwrap_or(e);
        let e = e.split('/').next().unwrap_or(e).to_ascii_lowercase();
        if e.is_empty() {
            continue;
        }
        let has_port = if e.starts_with('[') {
            e.contains("]:")
        } else {
            e.matches(':').count() == 1
        };
        if has_port {
            out.push(e);
        } else {
            out.push(format!("{e}:6789"));
            out.push(format!("{e}:3300"));
        }
    }
    out
}

/// The mappings of `rbd-nbd list-mapped --format json` output (`stdout`) whose daemon (its
/// command line from `cmdline_of(pid)`) serves `image`'s cluster and user
/// ([`DaemonClient::serves`]); those of other clusters or users, or of daemons that cannot be
/// told, are left out.
///
/// # Errors
/// [`MapError::UnexpectedOutput`] when the output is not that JSON.
pub fn mappings_for(
    stdout: &str,
    image: &ImageSpec,
    cmdline_of: impl Fn(u32) -> Option<Vec<u8>>,
) -> Result<Vec<Mapping>, MapError> {
    let mut out = Vec::new();
    for (mapping, pid) in parse_listed(stdout)? {
        let client = pid
            .and_then(&cmdline_of)
            .map(|c| DaemonClient::from_cmdline(&c));
        if client.as_ref().is_some_and(|c| c.serves(image)) {
            out.push(mapping);
        } else if mapping.maps(image) {
            tracing::info!(device = %mapping.device.display(), image = %image, pid = ?pid,
                daemon = ?client, "an rbd-nbd mapping of the same pool and image name from another cluster or user; not ours");
        }
    }
    Ok(out)
}

/// One entry of `rbd-nbd list-mapped --format json`.
#[derive(Debug, Deserialize)]
struct ListedDevice {
    /// The daemon's process ID.
    #[serde(default)]
    id: Option<u32>,
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
    Ok(parse_listed(stdout)?.into_iter().map(|(m, _)| m).collect())
}

/// [`parse_list_mapped`] with each daemon's process ID.
fn parse_listed(stdout: &str) -> Result<Vec<(Mapping, Option<u32>)>, MapError> {
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
        .map(|d| {
            let pid = d.id;
            (
                Mapping {
                    device: d.device,
                    pool: d.pool,
                    namespace: d.namespace,
                    image: d.image,
                    snap: d.snap,
                    cluster_fsid: None,
                },
                pid,
            )
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

    /// Reuses only a mapping of the volume's cluster and user (see the module doc) and mode;
    /// `--read-only` when asked, and verified.
    async fn map_with(
        &self,
        image: &ImageSpec,
        key: &Key,
        options: &MapOptions,
    ) -> Result<MappedDevice, MapError> {
        let existing = self.current_mappings(image).await?;
        super::cli::map_placed(
            &self.program,
            "rbd-nbd",
            MounterKind::Nbd,
            &self.key_dir,
            key,
            image,
            &existing,
            super::cli::Mode {
                read_only: options.read_only,
                root: &self.sys_root,
            },
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
        let current = self.current_mappings(image).await?;
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

    /// The command line of an rbd-nbd daemon as `/proc/PID/cmdline` holds it.
    fn cmdline(spec: &str, user: &str, monitors: &str) -> Vec<u8> {
        format!("rbd-nbd\0map\0{spec}\0--id\0{user}\0-m\0{monitors}\0--keyfile\0/run/rbd-csi/keys/nbd-1-0\0")
            .into_bytes()
    }

    /// Fake `/proc/PID/cmdline`s of the daemons of [`LISTED`] (those of `image()`'s cluster
    /// and user) and `sys/block/nbdN/ro` (read-write) under `dir`.
    fn fake_roots(dir: &Path) {
        for (pid, spec) in [
            (4242, "kube/pvc-1"),
            (4243, "kube/tenant/pvc-1"),
            (4244, "kube/pvc-1@s1"),
        ] {
            let proc = dir.join(format!("proc/{pid}"));
            std::fs::create_dir_all(&proc).unwrap();
            std::fs::write(
                proc.join("cmdline"),
                cmdline(spec, "admin", "127.0.0.1:6789"),
            )
            .unwrap();
        }
        for n in 0..3 {
            let block = dir.join(format!("sys/block/nbd{n}"));
            std::fs::create_dir_all(&block).unwrap();
            std::fs::write(block.join("ro"), "0\n").unwrap();
        }
    }

    #[test]
    fn a_mapping_counts_only_for_the_cluster_and_user_its_daemon_connects_as() {
        // Recorded: the same pool/image name mapped from two clusters, and by another user.
        const TWO_CLUSTERS: &str = r#"[{"id":100,"pool":"kube","namespace":"","image":"pvc-1","snap":"","device":"/dev/nbd0"},{"id":200,"pool":"kube","namespace":"","image":"pvc-1","snap":"","device":"/dev/nbd1"},{"id":300,"pool":"kube","namespace":"","image":"pvc-1","snap":"","device":"/dev/nbd2"},{"id":400,"pool":"kube","namespace":"","image":"pvc-1","snap":"","device":"/dev/nbd3"}]"#;
        let cmdlines = |pid: u32| match pid {
            100 => Some(cmdline(
                "kube/pvc-1",
                "admin",
                "10.0.0.1:6789,10.0.0.2:6789",
            )),
            200 => Some(cmdline("kube/pvc-1", "admin", "10.9.0.1:6789")),
            300 => Some(cmdline("kube/pvc-1", "tenant", "10.9.0.1:6789")),
            _ => None, // gone, or not readable
        };
        let mut cluster_b = image("pvc-1");
        cluster_b.monitors = "v2:10.9.0.1:3300,[v1:10.9.0.1:6789]".into();
        let found = mappings_for(TWO_CLUSTERS, &cluster_b, cmdlines).unwrap();
        assert_eq!(
            found.iter().map(|m| m.device.clone()).collect::<Vec<_>>(),
            [PathBuf::from("/dev/nbd1")],
            "only cluster B's admin daemon"
        );
        let mut cluster_a = image("pvc-1");
        cluster_a.monitors = "10.0.0.2".into(); // no port: the default ones
        let found = mappings_for(TWO_CLUSTERS, &cluster_a, cmdlines).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].device, PathBuf::from("/dev/nbd0"));
        cluster_b.user = "tenant".into();
        let found = mappings_for(TWO_CLUSTERS, &cluster_b, cmdlines).unwrap();
        assert_eq!(found[0].device, PathBuf::from("/dev/nbd2"));
        let mut elsewhere = image("pvc-1");
        elsewhere.monitors = "10.7.0.1:6789".into();
        assert!(
            mappings_for(TWO_CLUSTERS, &elsewhere, cmdlines)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn daemon_command_lines_in_other_spellings_parse() {
        let client = DaemonClient::from_cmdline(
            b"rbd-nbd\0map\0p/i\0--name\0client.kube\0--mon_host=10.0.0.1:3300\0",
        );
        assert_eq!(client.user.as_deref(), Some("kube"));
        assert_eq!(client.monitors.as_deref(), Some("10.0.0.1:3300"));
        let client = DaemonClient::from_cmdline(
            b"rbd-nbd\0map\0p/i\0--id=kube\0-m\0[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]\0",
        );
        assert_eq!(client.user.as_deref(), Some("kube"));
        let mut spec = image("i");
        spec.user = "kube".into();
        spec.monitors = "10.0.0.1:6789".into();
        assert!(client.serves(&spec));
        assert!(!DaemonClient::default().serves(&spec));
    }

    #[tokio::test]
    async fn another_clusters_mapping_of_the_same_names_is_neither_reused_nor_unmapped() {
        let tmp = tempfile::tempdir().unwrap();
        fake_roots(tmp.path());
        let mapper = NbdMapper::new(tmp.path().join("keys"))
            .with_program(fake_nbd(tmp.path(), LISTED))
            .with_roots(tmp.path().join("proc"), tmp.path());
        let mut other_cluster = image("pvc-1");
        other_cluster.monitors = "127.0.0.1:7789".into();
        let mapped = mapper
            .map(&other_cluster, &Key::new("AQB=="))
            .await
            .unwrap();
        assert_eq!(mapped.device, PathBuf::from("/dev/nbd9"));
        assert_eq!(fake::calls(tmp.path()), "map kube/pvc-1\n");
        // its unstage does not unmap the first cluster's /dev/nbd0 either
        let recorded = MappedDevice {
            mounter: MounterKind::Nbd,
            device: PathBuf::from("/dev/nbd0"),
            fuse: None,
        };
        mapper.unmap(&recorded, &other_cluster).await.unwrap();
        assert_eq!(fake::calls(tmp.path()), "map kube/pvc-1\n");
    }

    #[tokio::test]
    async fn a_read_write_nbd_mapping_is_not_reused_read_only() {
        let tmp = tempfile::tempdir().unwrap();
        fake_roots(tmp.path());
        let mapper = NbdMapper::new(tmp.path().join("keys"))
            .with_program(fake_nbd(tmp.path(), LISTED))
            .with_roots(tmp.path().join("proc"), tmp.path());
        let read_only = MapOptions {
            read_only: true,
            cluster_fsid: None,
        };
        let err = mapper
            .map_with(&image("pvc-1"), &Key::new("AQB=="), &read_only)
            .await
            .unwrap_err();
        assert!(matches!(err, MapError::ModeMismatch { .. }), "{err}");
        assert_eq!(fake::calls(tmp.path()), "");
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
        fake_roots(tmp.path());
        let mapper = NbdMapper::new(tmp.path().join("keys"))
            .with_program(fake_nbd(tmp.path(), LISTED))
            .with_roots(tmp.path().join("proc"), tmp.path());
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
            r#"[{{"id":4242,"pool":"kube","namespace":"","image":"someone-else","snap":"","device":"{}"}}]"#,
            device.display()
        );
        fake_roots(tmp.path());
        let mapper = NbdMapper::new(tmp.path().join("keys"))
            .with_program(fake_nbd(tmp.path(), &listed))
            .with_roots(tmp.path().join("proc"), tmp.path());
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
