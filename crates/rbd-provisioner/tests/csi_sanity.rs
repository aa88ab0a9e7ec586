//! The upstream CSI conformance suite, `csi-sanity` (kubernetes-csi/csi-test), against
//! `rbd-provisioner csi --services=all` on this test binary's micro-ceph with the fuse mapper:
//! every spec must pass and none may be skipped (ControllerPublish/Unpublish and the node attach
//! limit included: the plugin runs with `--max-volumes-per-node`). The counts and any skip
//! reasons are printed.
//!
//! It runs twice: as is, and with a topology-enabled node (`--topology-labels`, the node's
//! labels read from its Node object in the Kubernetes emulator, VOLUME_ACCESSIBILITY_CONSTRAINTS
//! advertised) and a class whose `topologyConstrainedPools` sends the node's zone to a pool of
//! its own, so the suite's volumes made with the node's topology land there.
//!
//! The suite is a third-party binary the project does not ship: it is taken from `$CSI_SANITY`,
//! else `../shared/tools/csi-sanity` beside the repository. Without it the test says so and
//! passes (skips), so the project also tests green where that tool does not exist.
//!
//! `cargo test -p rbd-provisioner --test csi_sanity -- --nocapture` shows the report.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The two runs one at a time: each checks that nothing of `sanity*` is left in the pool.
static SERIAL: Mutex<()> = Mutex::new(());

/// How long the whole suite may take (under a minute here, alone; a few under CI's load).
const SUITE_DEADLINE: Duration = Duration::from_mins(5);
/// `--max-volumes-per-node` of the plugin: the suite publishes this many volumes to the node and
/// expects the next publish to fail.
const MAX_VOLUMES_PER_NODE: u32 = 3;
/// Volume sizes the suite creates and expands to: small, the cluster is memstore.
const VOLUME_SIZE: u64 = 64 << 20;
const EXPAND_SIZE: u64 = 128 << 20;

/// The csi-sanity binary, if this machine has it: `$CSI_SANITY` (which must then exist), else
/// `../shared/tools/csi-sanity` beside the repository.
fn csi_sanity() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CSI_SANITY").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "CSI_SANITY={} is not a file",
            path.display()
        );
        return Some(path);
    }
    // crates/rbd-provisioner -> the repository -> ../shared/tools beside it
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/csi-sanity");
    beside
        .is_file()
        .then(|| beside.canonicalize().unwrap_or(beside))
}

/// A running `rbd-provisioner csi`; SIGTERM and wait on drop, its log printed if the test fails.
struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    fn start(args: &[String], log: PathBuf) -> Plugin {
        let child = Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"))
            .arg("csi")
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("creating the plugin log"))
            .spawn()
            .expect("starting rbd-provisioner csi");
        Plugin { child, log }
    }

    fn wait_listening(&mut self, socket: &Path) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("rbd-provisioner csi exited ({status}) before listening");
            }
            assert!(Instant::now() < deadline, "the plugin never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // A graceful stop first (the plugin removes its socket); SIGKILL if it hangs.
        let terminated = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while terminated && Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- rbd-provisioner csi log ----\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// The last `n` lines of a file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What a hung run was doing: the end of csi-sanity's report and of the plugin's log, and the
/// state and kernel stack of every process whose command line names the run's directory
/// (rbd-fuse instances, mkfs, mount), with the loop devices attached to it.
fn hang_report(report: &Path, log: &Path, dir: &Path) -> String {
    let mut out = format!(
        "---- csi-sanity report (end) ----\n{}\n---- plugin log (end) ----\n{}\n",
        tail(report, 40),
        tail(log, 40)
    );
    let needle = dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(&needle) || cmdline.contains("csi-sanity ") {
            continue;
        }
        let state = std::fs::read_to_string(path.join("status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or_default()
            .to_string();
        out += &format!(
            "---- pid {}: {cmdline}\n{state}\n",
            entry.file_name().to_string_lossy()
        );
        // the kernel stack of each thread blocked in the kernel (a read of a dead fuse mount)
        for task in std::fs::read_dir(path.join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            if status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains("(disk sleep)"))
            {
                let stack = std::fs::read_to_string(task.path().join("stack")).unwrap_or_default();
                out += &format!(
                    "thread {} in D state:\n{stack}",
                    task.file_name().to_string_lossy()
                );
            }
        }
    }
    if let Ok(loops) = Command::new("losetup").args(["-l", "-n"]).output() {
        out += &format!(
            "---- loop devices ----\n{}",
            String::from_utf8_lossy(&loops.stdout)
        );
    }
    out
}

/// Writes `text` to a new `0600` file (the test cluster's admin key goes into two files).
fn write_private(path: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .expect("writing a private file");
}

/// Ginkgo's summary: `SUCCESS! -- 45 Passed | 0 Failed | 1 Pending | 46 Skipped` (or `FAIL! --`).
fn summary(output: &str) -> Option<BTreeMap<String, u32>> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.contains(" Passed | ") && l.contains(" Failed | "))?;
    let counts = line.split_once("-- ")?.1;
    counts
        .split(" | ")
        .map(|part| {
            let (n, what) = part.trim().split_once(' ')?;
            Some((what.to_owned(), n.parse().ok()?))
        })
        .collect()
}

/// Why specs were skipped, with how many: Ginkgo's verbose report indents `[SKIPPED] <reason>`
/// under each skipped spec (the `[SKIPPED] in [BeforeEach] - file:line` lines say where, not why).
fn skip_reasons(output: &str) -> BTreeMap<String, u32> {
    let mut reasons = BTreeMap::new();
    for line in output.lines() {
        let Some(reason) = line.trim_start().strip_prefix("[SKIPPED] ") else {
            continue;
        };
        if line.starts_with(' ') && !reason.starts_with("in [") && !reason.starts_with('[') {
            *reasons.entry(reason.trim().to_owned()).or_default() += 1;
        }
    }
    reasons
}

/// Mounts whose mount point lies under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&*dir))
        .map(str::to_owned)
        .collect()
}

/// What differs between the two runs.
struct Run<'a> {
    /// Extra `rbd-provisioner csi` arguments.
    plugin_args: Vec<String>,
    /// Extra lines of the suite's volume parameters (YAML).
    params: String,
    /// Pools the suite's images may land in (checked empty afterwards).
    pools: Vec<&'a str>,
}

/// Runs the suite against a plugin started with `run`'s arguments and checks the report and what
/// is left behind; returns the plugin's log.
fn run_suite(sanity: &Path, run: &Run<'_>) -> String {
    let ceph = micro_ceph::cluster();
    // tmpfs when there is one: the runtime directory (keys, rbd-fuse instances) belongs there.
    let dir = tempfile::Builder::new()
        .prefix("csi-sanity-")
        .tempdir_in(if Path::new("/dev/shm").is_dir() {
            Path::new("/dev/shm")
        } else {
            Path::new("/tmp")
        })
        .expect("creating the test directory");
    let d = dir.path();
    let socket = d.join("csi.sock");
    write_private(&d.join("probe.key"), &ceph.admin_key);
    std::fs::write(
        d.join("params.yaml"),
        format!("pool: {}\nmounter: fuse\n{}", ceph.pool, run.params),
    )
    .expect("writing params.yaml");
    // ControllerModifyVolume's mutable parameters: a librbd QoS limit
    std::fs::write(
        d.join("mutable.yaml"),
        "rbd_qos_iops_limit: \"1000\"\nrbd_qos_bps_limit: 100Mi\n",
    )
    .expect("writing mutable.yaml");
    let secret = format!("  userID: admin\n  userKey: {}\n", ceph.admin_key);
    let secrets: String = [
        "CreateVolumeSecret",
        "DeleteVolumeSecret",
        "ControllerPublishVolumeSecret",
        "ControllerUnpublishVolumeSecret",
        "ControllerValidateVolumeCapabilitiesSecret",
        "ControllerExpandVolumeSecret",
        "NodeStageVolumeSecret",
        "NodeExpandVolumeSecret",
        "CreateSnapshotSecret",
        "DeleteSnapshotSecret",
        "ListSnapshotsSecret",
        "ControllerModifyVolumeSecret",
    ]
    .iter()
    .map(|kind| format!("{kind}:\n{secret}"))
    .collect();
    write_private(&d.join("secrets.yaml"), &secrets);

    let runtime_dir = d.join("run");
    let mut args = vec![
        "--services=all".into(),
        "--default-mounter=fuse".into(),
        "--node-id=csi-sanity-node".into(),
        format!("--endpoint=unix://{}", socket.display()),
        format!("--runtime-dir={}", runtime_dir.display()),
        format!("--monitors={}", ceph.monitors),
        format!("--probe-key-file={}", d.join("probe.key").display()),
        format!("--max-volumes-per-node={MAX_VOLUMES_PER_NODE}"),
    ];
    args.extend(run.plugin_args.iter().cloned());
    let log = d.join("plugin.log");
    let mut plugin = Plugin::start(&args, log.clone());
    plugin.wait_listening(&socket);

    let report = d.join("csi-sanity.out");
    let (mut status, mut output) = run_sanity(sanity, &socket, d, &report, &log);
    if !status.success() && hit_connect_race(&output) {
        // csi-sanity's own race, not the driver's: see `hit_connect_race`
        eprintln!(
            "csi-sanity timed out connecting while its connection was already ready (its \
             utils.Connect race); running the suite once more:\n{}",
            failure_details(&output)
        );
        (status, output) = run_sanity(sanity, &socket, d, &report, &log);
    }
    let failed_specs = failed_specs(&output);
    let counts = summary(&output).unwrap_or_else(|| {
        panic!(
            "no Ginkgo summary in csi-sanity's output ({status}):\n{}",
            output
                .lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    let reasons = skip_reasons(&output);
    let count = |what: &str| counts.get(what).copied().unwrap_or(0);
    eprintln!(
        "csi-sanity ({}): {} passed, {} failed, {} pending, {} skipped",
        sanity.display(),
        count("Passed"),
        count("Failed"),
        count("Pending"),
        count("Skipped")
    );
    for (reason, n) in &reasons {
        eprintln!("  skipped {n:>2}: {reason}");
    }
    assert!(
        status.success() && count("Failed") == 0,
        "csi-sanity failed ({status}):\n{}\n{}\n(full report: {})",
        failed_specs.join("\n"),
        failure_details(&output),
        report.display()
    );
    assert!(count("Passed") > 0, "csi-sanity ran no spec");
    assert_eq!(
        reasons.values().sum::<u32>(),
        count("Skipped"),
        "every skipped spec has a reason"
    );
    // Every capability the suite tests is served: no spec may be skipped, whatever its reason.
    assert_eq!(
        count("Skipped"),
        0,
        "specs skipped: {:?}",
        reasons.keys().collect::<Vec<_>>()
    );

    drop(plugin);
    // The suite unstaged and deleted what it made: no mount, rbd-fuse or image is left.
    assert_eq!(mounts_under(d), Vec::<String>::new(), "mounts left behind");
    // snapshot images and clone intermediates of the snapshot and cloning specs included
    let made_here = |i: &str| {
        i.starts_with("sanity") || i.starts_with("csi-snap-") || i.starts_with("csi-clone-")
    };
    for pool in &run.pools {
        let images = ceph.rbd(&["ls", pool]).expect("rbd ls");
        let left: Vec<&str> = images.lines().filter(|i| made_here(i)).collect();
        assert!(left.is_empty(), "images left behind in {pool}: {left:?}");
        let trash = ceph.rbd(&["trash", "ls", pool]).expect("rbd trash ls");
        let left: Vec<&str> = trash
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter(|i| made_here(i))
            .collect();
        assert!(
            left.is_empty(),
            "trash entries left behind in {pool}: {left:?}"
        );
        let groups = ceph.rbd(&["group", "ls", pool]).expect("rbd group ls");
        assert_eq!(groups.trim(), "", "RBD groups left behind in {pool}");
    }
    std::fs::read_to_string(&log).unwrap_or_default()
}

/// Runs csi-sanity against the plugin at `socket` (`d`: the run's folder), its report in
/// `report`; returns its exit status and the report.
fn run_sanity(
    sanity: &Path,
    socket: &Path,
    d: &Path,
    report: &Path,
    log: &Path,
) -> (std::process::ExitStatus, String) {
    let mut suite = Command::new(sanity)
        .arg(format!("--csi.endpoint=unix://{}", socket.display()))
        .arg(format!("--csi.stagingdir={}", d.join("staging").display()))
        .arg(format!("--csi.mountdir={}", d.join("mount").display()))
        .arg(format!(
            "--csi.testvolumeparameters={}",
            d.join("params.yaml").display()
        ))
        .arg(format!(
            "--csi.testvolumemutableparameters={}",
            d.join("mutable.yaml").display()
        ))
        .arg(format!(
            "--csi.secrets={}",
            d.join("secrets.yaml").display()
        ))
        .arg(format!("--csi.testvolumesize={VOLUME_SIZE}"))
        .arg(format!("--csi.testvolumeexpandsize={EXPAND_SIZE}"))
        .arg("--csi.testnodevolumeattachlimit")
        .args(["-ginkgo.v", "-ginkgo.no-color"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(report).expect("creating the report"))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting csi-sanity");
    let deadline = Instant::now() + SUITE_DEADLINE;
    let status = loop {
        if let Some(status) = suite.try_wait().expect("waiting for csi-sanity") {
            break status;
        }
        if Instant::now() > deadline {
            // What hung, before anything is stopped: the spec csi-sanity was in, the plugin's
            // last words, and where each rbd-fuse of this run waits.
            let stuck = hang_report(report, log, d);
            let _ = suite.kill();
            let _ = suite.wait();
            panic!("csi-sanity did not finish within {SUITE_DEADLINE:?}\n{stuck}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(report).expect("reading the report");
    (status, output)
}

/// The `[FAIL]` lines of Ginkgo's summary: one per failed spec.
fn failed_specs(report: &str) -> Vec<&str> {
    report
        .lines()
        .filter(|l| l.starts_with("  [FAIL] ") || l.starts_with("[FAIL] "))
        .collect()
}

/// Whether every failure of a csi-sanity run is the connect race of csi-test's
/// `utils.Connect` (v5.4.0): it dials, then loops on `WaitForStateChange(ctx, GetState())`
/// until the state is READY, so a connection that became READY before the first `GetState()`
/// (a fast server, a descheduled test process) waits a minute for a change that never comes
/// and fails the first spec's `BeforeEach` with "Connection timed out"; the later specs reuse
/// that same connection and pass. Seen in CI under load, with the plugin serving all along.
fn hit_connect_race(report: &str) -> bool {
    let failed = failed_specs(report);
    failed.len() == 1
        && failed[0].contains("[BeforeEach]")
        && report.contains("Connection timed out")
}

/// What Ginkgo's verbose report says around each `[FAILED]` line (the step, the error and where),
/// for the failure message: the report itself is removed with the run's folder.
fn failure_details(report: &str) -> String {
    let lines: Vec<&str> = report.lines().collect();
    let mut shown = Vec::new();
    let mut last = 0;
    for (i, line) in lines.iter().enumerate() {
        if line.contains("[FAILED]") && i >= last {
            let from = i.saturating_sub(12).max(last);
            last = (i + 6).min(lines.len());
            shown.push("  ...".to_string());
            shown.extend(lines[from..last].iter().map(|l| format!("  {l}")));
        }
    }
    shown.join("\n")
}

#[test]
fn upstream_csi_sanity_passes_on_micro_ceph_with_the_fuse_mapper() {
    let Some(sanity) = csi_sanity() else {
        eprintln!(
            "SKIPPED: csi-sanity not found (set CSI_SANITY, or put it at ../shared/tools/csi-sanity \
             beside the repository); the upstream CSI conformance suite did not run"
        );
        return;
    };
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ceph = micro_ceph::cluster();
    run_suite(
        &sanity,
        &Run {
            plugin_args: Vec::new(),
            params: String::new(),
            pools: vec![ceph.pool.as_str()],
        },
    );
}

/// The zone label of the emulated node and the pool the class sends that zone to.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const ZONE_POOL: &str = "sanity-zone-a";

#[test]
fn upstream_csi_sanity_passes_with_a_topology_enabled_node() {
    use k8s_openapi::api::core::v1::Node;
    let Some(sanity) = csi_sanity() else {
        eprintln!("SKIPPED: csi-sanity not found; the topology-enabled run did not happen");
        return;
    };
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ceph = micro_ceph::cluster();
    if !ceph
        .rbd(&["pool", "ls"])
        .is_ok_and(|pools| pools.lines().any(|p| p == ZONE_POOL))
    {
        let out = ceph
            .cli("ceph")
            .args(["osd", "pool", "create", ZONE_POOL, "8"])
            .output()
            .expect("ceph osd pool create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ceph.rbd(&["pool", "init", ZONE_POOL])
            .expect("rbd pool init");
    }
    // The node plugin reads its Node's labels from the Kubernetes API: the emulator's.
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let node: Node = serde_json::from_value(serde_json::json!({"metadata": {
        "name": "csi-sanity-node",
        "labels": {ZONE_LABEL: "a", "kubernetes.io/hostname": "csi-sanity-node"}}}))
    .expect("a Node");
    // the emulator and its server live on the runtime's threads while this one waits on the suite
    let (_emulator, server) = runtime.block_on(async {
        let emulator = kube_emulator::Emulator::new();
        let server = emulator
            .serve("127.0.0.1:0".parse().expect("an address"))
            .await
            .expect("serving the emulator");
        kube::Api::<Node>::all(emulator.client())
            .create(&kube::api::PostParams::default(), &node)
            .await
            .expect("creating the Node");
        (emulator, server)
    });
    let kubeconfig = tempfile::NamedTempFile::new().expect("a kubeconfig file");
    server
        .write_kubeconfig(kubeconfig.path())
        .expect("writing the kubeconfig");
    let pools = serde_json::json!([
        {"poolName": ZONE_POOL, "domainSegments": [{"domainLabel": "zone", "value": "a"}]}
    ]);
    let log = run_suite(
        &sanity,
        &Run {
            plugin_args: vec![
                format!("--kubeconfig={}", kubeconfig.path().display()),
                format!("--topology-labels={ZONE_LABEL}"),
            ],
            params: format!("topologyConstrainedPools: '{pools}'\n"),
            pools: vec![ceph.pool.as_str(), ZONE_POOL],
        },
    );
    // The node reported its zone, and volumes made with it went to the zone's pool.
    assert!(
        log.contains("node topology") && log.contains("topology.rbd.provisioner.ceph.io/zone"),
        "no node topology in the plugin log:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("image created") && l.contains(ZONE_POOL)),
        "no image was created in {ZONE_POOL}:\n{log}"
    );
    drop(server);
}

#[test]
fn the_report_parsers_read_ginkgo_output() {
    let output = "\
S [SKIPPED] [0.003 seconds]
DeleteSnapshot [Controller Server] [BeforeEach] should fail when no snapshot id is provided
  [SKIPPED] DeleteSnapshot not supported
  In [BeforeEach] at: github.com/kubernetes-csi/csi-test/v5/pkg/sanity/controller.go:1200
  [SKIPPED] in [BeforeEach] - github.com/kubernetes-csi/csi-test/v5/pkg/sanity/controller.go:1200
  [SKIPPED] ListVolumes not supported
  [SKIPPED] DeleteSnapshot not supported

Ran 45 of 92 Specs in 3.242 seconds
SUCCESS! -- 45 Passed | 0 Failed | 1 Pending | 46 Skipped
";
    let counts = summary(output).expect("summary");
    assert_eq!(counts.get("Passed"), Some(&45));
    assert_eq!(counts.get("Failed"), Some(&0));
    assert_eq!(counts.get("Skipped"), Some(&46));
    let reasons = skip_reasons(output);
    assert_eq!(reasons.get("DeleteSnapshot not supported"), Some(&2));
    assert_eq!(reasons.get("ListVolumes not supported"), Some(&1));
    assert_eq!(reasons.len(), 2);
    assert!(
        summary("FAIL! -- 40 Passed | 5 Failed | 1 Pending | 46 Skipped")
            .is_some_and(|c| c.get("Failed") == Some(&5))
    );
}

#[test]
fn only_csi_sanitys_connect_race_earns_a_second_run() {
    let race = "\
  [FAILED] Unexpected error:
      <*errors.errorString | 0xc000123>:
      Connection timed out
      {s: \"Connection timed out\"}
  occurred
  In [BeforeEach] at: github.com/kubernetes-csi/csi-test/v5/pkg/sanity/sanity.go:272
Summarizing 1 Failure:
  [FAIL] ExpandVolume [Controller Server] [BeforeEach] should fail if no volume id is given
FAIL! -- 90 Passed | 1 Failed | 1 Pending | 0 Skipped
";
    assert!(hit_connect_race(race));
    assert!(failure_details(race).contains("Connection timed out"));
    // the driver's own failures are never retried: another failure beside it, a failure in a
    // spec's body, or a BeforeEach failing for another reason
    let two = race.replace(
        "Summarizing 1 Failure:\n",
        "Summarizing 2 Failures:\n  [FAIL] Node Service should work\n",
    );
    assert!(!hit_connect_race(&two));
    assert!(!hit_connect_race(
        &race.replace(" [BeforeEach] should", " should")
    ));
    assert!(!hit_connect_race(
        &race.replace("Connection timed out", "rpc error: code = Internal")
    ));
}
