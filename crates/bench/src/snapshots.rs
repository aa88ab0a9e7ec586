//! `--snapshots N`: the cost of snapshots through the CSI controller.
//!
//! One driver process (`rbd-provisioner csi --services controller`, and ceph-csi's `cephcsi`
//! when `--ceph-csi PATH` is given) on a private micro-ceph. Per driver, over its socket: one
//! source volume; N CreateSnapshot of it, one at a time; then 10 more of it interleaved with the
//! first 10 of a fresh source (the flatness pairs, below); N restores (CreateVolume from each
//! snapshot); the N restores deleted, then the N snapshots; then N CreateSnapshot of one source
//! again, 8 at a time, as a Kubernetes client would send them (an ABORTED answer is retried
//! after 100 ms and counted), and their deletion. Per operation it records the CPU time the
//! driver process used and the Ceph daemons used (the micro-ceph's mon, OSD and mgr, from their
//! pid files): CPU time, not wall time, because the machine it runs on is shared. Each process's
//! time is the sum of its threads' run time in nanoseconds (`/proc/PID/task/TID/schedstat`);
//! when a thread ended or a child was waited for during the operation, utime + stime of it and
//! its waited-for children (`/proc/PID/stat`, in 10 ms steps).
//!
//! Flat in the number of snapshots is judged on the pairs, not on the first and last 10 of the
//! sequence: a run's cost drifts with time (the Ceph stores grow with every OSD map epoch, the
//! machine is shared), and the mon's share, whose work does not depend on how many snapshots a
//! source has, drifts with the rest. A pair is one snapshot of the source that has N and one of a
//! source that has none or a few, taken back to back, alternating which goes first; whatever the
//! time does to one, it does to the other.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hyper_util::rt::TokioIo;
use rbd_csi::proto::csi;
use rbd_csi::proto::csi::controller_client::ControllerClient;
use serde_json::json;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::procs::Proc;

/// Snapshots of one source sent at once in the concurrent phase.
pub const CONCURRENCY: usize = 8;
/// How many operations make the "first" and "last" groups.
const GROUP: usize = 10;

/// Targets, driver CPU per operation (ms), at N = 100 of one source.
const TARGET_SNAPSHOT_MS: f64 = 30.0;
const TARGET_RESTORE_MS: f64 = 30.0;
/// Flat: the source with N snapshots within this fraction of the fresh one.
const FLAT_WITHIN: f64 = 0.20;
/// Ceph CPU per CreateSnapshot before this work (the upper end of 87-94 ms measured side by side
/// with ceph-csi at 100 snapshots of one source, same machine class).
const CEPH_MS_BEFORE: f64 = 94.0;

/// One driver under test.
pub struct Driver {
    pub label: String,
    proc: Proc,
    socket: PathBuf,
    params: HashMap<String, String>,
    /// The VolumeSnapshotClass's parameters.
    snapshot_params: HashMap<String, String>,
    secrets: HashMap<String, String>,
}

impl Driver {
    /// Our binary's CSI controller service.
    pub fn ours(bins: &Path, work: &Path, ceph: &micro_ceph::MicroCeph) -> anyhow::Result<Driver> {
        let dir = work.join("ours");
        std::fs::create_dir_all(dir.join("run"))?;
        let socket = dir.join("csi.sock");
        let args = vec![
            "csi".to_string(),
            "--services=controller".to_string(),
            format!("--endpoint=unix://{}", socket.display()),
            format!("--runtime-dir={}", dir.join("run").display()),
        ];
        let proc = Proc::spawn(
            "rbd-provisioner csi",
            &bins.join("rbd-provisioner"),
            &args,
            &[("RUST_LOG".to_string(), "warn".to_string())],
            dir.join("driver.log"),
        )?;
        Ok(Driver {
            label: "ours".into(),
            proc,
            socket,
            params: strings(&[
                ("monitors", &ceph.monitors),
                ("pool", &ceph.pool),
                ("csi.storage.k8s.io/fstype", "ext4"),
            ]),
            snapshot_params: HashMap::new(),
            secrets: strings(&[("userID", "admin"), ("userKey", &ceph.admin_key)]),
        })
    }

    /// ceph-csi's `cephcsi` binary as its RBD controller plugin, with a cluster config naming
    /// the micro-ceph.
    pub fn ceph_csi(
        binary: &Path,
        work: &Path,
        ceph: &micro_ceph::MicroCeph,
    ) -> anyhow::Result<Driver> {
        let dir = work.join("ceph-csi");
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("csi.sock");
        let config = dir.join("config.json");
        let monitors: Vec<&str> = ceph.monitors.split(',').collect();
        std::fs::write(
            &config,
            serde_json::to_string(&json!([{ "clusterID": "bench", "monitors": monitors }]))?,
        )?;
        let args = vec![
            "--type=rbd".to_string(),
            "--controllerserver=true".to_string(),
            format!("--endpoint=unix://{}", socket.display()),
            "--nodeid=bench".to_string(),
            "--drivername=rbd.csi.ceph.com".to_string(),
            "--instanceid=bench".to_string(),
            format!("--clusterconfigpath={}", config.display()),
            "--v=1".to_string(),
        ];
        let proc = Proc::spawn(
            "cephcsi",
            binary,
            &args,
            &[(
                "CEPH_CONF".to_string(),
                ceph.conf_path.display().to_string(),
            )],
            dir.join("driver.log"),
        )?;
        Ok(Driver {
            label: "ceph-csi".into(),
            proc,
            socket,
            params: strings(&[
                ("clusterID", "bench"),
                ("pool", &ceph.pool),
                ("imageFeatures", "layering"),
                ("csi.storage.k8s.io/fstype", "ext4"),
            ]),
            snapshot_params: strings(&[("clusterID", "bench"), ("pool", &ceph.pool)]),
            secrets: strings(&[("userID", "admin"), ("userKey", &ceph.admin_key)]),
        })
    }

    async fn client(&mut self) -> anyhow::Result<ControllerClient<Channel>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&self.socket).await.is_err() {
            self.proc.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "{}: socket {} never came up",
                    self.label,
                    self.socket.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let path = self.socket.clone();
        let channel =
            Endpoint::try_from("http://[::]:50051")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await?;
        Ok(ControllerClient::new(channel))
    }

    fn volume_request(&self, name: &str, snapshot: Option<&str>) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: SIZE,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(
                    csi::volume_capability::MountVolume {
                        fs_type: "ext4".into(),
                        ..Default::default()
                    },
                )),
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
                }),
            }],
            parameters: self.params.clone(),
            secrets: self.secrets.clone(),
            volume_content_source: snapshot.map(|id| csi::VolumeContentSource {
                r#type: Some(csi::volume_content_source::Type::Snapshot(
                    csi::volume_content_source::SnapshotSource {
                        snapshot_id: id.into(),
                    },
                )),
            }),
            ..Default::default()
        }
    }

    fn snapshot_request(&self, name: &str, source: &str) -> csi::CreateSnapshotRequest {
        csi::CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: source.into(),
            secrets: self.secrets.clone(),
            parameters: self.snapshot_params.clone(),
        }
    }
}

/// Size of the source and of each restore.
const SIZE: i64 = 64 << 20;

fn strings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// A process's CPU use at one instant: clock ticks of it and of its waited-for children
/// (`/proc/PID/stat`, in steps of 10 ms), and each live thread's run time in nanoseconds
/// (`/proc/PID/task/TID/schedstat`, first field).
#[derive(Debug, Clone, Default)]
struct CpuSample {
    own_s: f64,
    children_s: f64,
    threads: HashMap<u32, u64>,
}

impl CpuSample {
    fn of(pid: u32) -> anyhow::Result<CpuSample> {
        let [utime, stime, cutime, cstime] = crate::procs::cpu_times(pid)?;
        let mut threads = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                let ran = std::fs::read_to_string(task.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
                if let Some(ns) = ran {
                    threads.insert(tid, ns);
                }
            }
        }
        Ok(CpuSample {
            own_s: utime + stime,
            children_s: cutime + cstime,
            threads,
        })
    }

    /// CPU seconds used from `self` to `later`: the threads' run time (nanoseconds) when every
    /// thread of `self` still runs and no child was waited for in between, else the ticks.
    fn until(&self, later: &CpuSample) -> f64 {
        let children = later.children_s - self.children_s;
        let kept = !self.threads.is_empty()
            && self
                .threads
                .keys()
                .all(|tid| later.threads.contains_key(tid));
        if kept && children == 0.0 {
            let ns: u64 = later
                .threads
                .iter()
                .map(|(tid, ns)| ns.saturating_sub(self.threads.get(tid).copied().unwrap_or(0)))
                .sum();
            ns as f64 / 1e9
        } else {
            later.own_s - self.own_s + children
        }
    }
}

/// The micro-ceph daemons (every pid file in its `run` directory).
fn ceph_pids(ceph: &micro_ceph::MicroCeph) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(ceph.dir.join("run")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|p| p.trim().parse::<u32>().ok())
        .collect()
}

/// The driver's and the Ceph daemons' CPU samples at one instant.
struct Samples {
    driver: CpuSample,
    ceph: Vec<(u32, CpuSample)>,
}

impl Samples {
    fn take(driver: &Driver, ceph: &micro_ceph::MicroCeph) -> anyhow::Result<Samples> {
        Ok(Samples {
            driver: CpuSample::of(driver.proc.pid())?,
            ceph: ceph_pids(ceph)
                .into_iter()
                .filter_map(|pid| Some((pid, CpuSample::of(pid).ok()?)))
                .collect(),
        })
    }

    /// Driver and Ceph CPU seconds from `self` to `later`.
    fn until(&self, later: &Samples) -> (f64, f64) {
        let ceph = self
            .ceph
            .iter()
            .filter_map(|(pid, a)| {
                let (_, b) = later.ceph.iter().find(|(p, _)| p == pid)?;
                Some(a.until(b))
            })
            .sum();
        (self.driver.until(&later.driver), ceph)
    }
}

/// Driver and Ceph CPU of each operation of one kind, in order, milliseconds.
#[derive(Debug, Default, Clone)]
pub struct Costs {
    pub driver_ms: Vec<f64>,
    pub ceph_ms: Vec<f64>,
}

impl Costs {
    fn mean(v: &[f64]) -> f64 {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    }
    fn first(v: &[f64]) -> f64 {
        Self::mean(&v[..v.len().min(GROUP)])
    }
    fn last(v: &[f64]) -> f64 {
        Self::mean(&v[v.len().saturating_sub(GROUP)..])
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "driver_ms": { "mean": Self::mean(&self.driver_ms), "first10": Self::first(&self.driver_ms), "last10": Self::last(&self.driver_ms), "each": self.driver_ms },
            "ceph_ms": { "mean": Self::mean(&self.ceph_ms), "first10": Self::first(&self.ceph_ms), "last10": Self::last(&self.ceph_ms), "each": self.ceph_ms },
        })
    }
}

/// What one driver's run measured.
#[derive(Debug, Default, Clone)]
pub struct DriverResult {
    pub label: String,
    pub create_snapshot: Costs,
    pub restore: Costs,
    pub delete_restore: Costs,
    pub delete_snapshot: Costs,
    /// The flatness pairs: CreateSnapshot of a source with no (or a few) snapshots, and of
    /// the source with N (or a few more), interleaved.
    pub fresh_source: Costs,
    pub aged_source: Costs,
    /// Wall time of the N sequential CreateSnapshot calls.
    pub sequential_s: f64,
    /// Wall time of the N concurrent CreateSnapshot calls, and ABORTED answers retried.
    pub concurrent_s: f64,
    pub concurrent_aborted: usize,
    pub concurrent_driver_ms: f64,
    pub concurrent_ceph_ms: f64,
}

/// Runs one operation and records its CPU.
async fn measured<T, F>(
    driver: &Driver,
    ceph: &micro_ceph::MicroCeph,
    costs: &mut Costs,
    op: F,
) -> anyhow::Result<T>
where
    F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let before = Samples::take(driver, ceph)?;
    let answer = op.await;
    let (driver_s, ceph_s) = before.until(&Samples::take(driver, ceph)?);
    costs.driver_ms.push(driver_s * 1000.0);
    costs.ceph_ms.push(ceph_s * 1000.0);
    Ok(answer
        .map_err(|s| anyhow::anyhow!("{}: {:?}: {}", driver.label, s.code(), s.message()))?
        .into_inner())
}

/// The scenario against one driver.
pub async fn run_driver(
    driver: &mut Driver,
    ceph: &micro_ceph::MicroCeph,
    n: usize,
) -> anyhow::Result<DriverResult> {
    let mut ctl = driver.client().await?;
    let mut result = DriverResult {
        label: driver.label.clone(),
        ..DriverResult::default()
    };
    let source = new_volume(driver, &mut ctl, "bench-snap-source").await?;

    eprintln!(
        "{}: {n} CreateSnapshot of one source, one at a time",
        driver.label
    );
    let started = Instant::now();
    let mut snapshots = Vec::with_capacity(n);
    for i in 0..n {
        let req = driver.snapshot_request(&format!("bench-snap-{i}"), &source);
        let answer = measured(
            driver,
            ceph,
            &mut result.create_snapshot,
            ctl.create_snapshot(req),
        )
        .await?;
        snapshots.push(
            answer
                .snapshot
                .context("no snapshot in the answer")?
                .snapshot_id,
        );
    }
    result.sequential_s = started.elapsed().as_secs_f64();
    flatness_pairs(driver, ceph, &mut ctl, &source, n, &mut result).await?;

    eprintln!("{}: {n} restores", driver.label);
    let mut restores = Vec::with_capacity(n);
    for (i, snapshot) in snapshots.iter().enumerate() {
        let req = driver.volume_request(&format!("bench-restore-{i}"), Some(snapshot));
        let answer = measured(driver, ceph, &mut result.restore, ctl.create_volume(req)).await?;
        restores.push(answer.volume.context("no volume in the answer")?.volume_id);
    }
    eprintln!(
        "{}: deleting the restores, then the snapshots",
        driver.label
    );
    for volume_id in restores {
        let req = csi::DeleteVolumeRequest {
            volume_id,
            secrets: driver.secrets.clone(),
        };
        measured(
            driver,
            ceph,
            &mut result.delete_restore,
            ctl.delete_volume(req),
        )
        .await?;
    }
    for snapshot_id in snapshots {
        let req = csi::DeleteSnapshotRequest {
            snapshot_id,
            secrets: driver.secrets.clone(),
        };
        measured(
            driver,
            ceph,
            &mut result.delete_snapshot,
            ctl.delete_snapshot(req),
        )
        .await?;
    }

    eprintln!(
        "{}: {n} CreateSnapshot of one source, {CONCURRENCY} at a time",
        driver.label
    );
    let before = Samples::take(driver, ceph)?;
    let started = Instant::now();
    let (ids, aborted) = concurrent_snapshots(driver, &ctl, &source, n).await?;
    result.concurrent_s = started.elapsed().as_secs_f64();
    result.concurrent_aborted = aborted;
    let (driver_s, ceph_s) = before.until(&Samples::take(driver, ceph)?);
    result.concurrent_driver_ms = driver_s * 1000.0 / n as f64;
    result.concurrent_ceph_ms = ceph_s * 1000.0 / n as f64;
    delete_all(driver, &mut ctl, ids, source).await?;
    Ok(result)
}

/// A new volume named `name` (not measured); its ID.
async fn new_volume(
    driver: &Driver,
    ctl: &mut ControllerClient<Channel>,
    name: &str,
) -> anyhow::Result<String> {
    Ok(ctl
        .create_volume(driver.volume_request(name, None))
        .await
        .map_err(|s| anyhow::anyhow!("{}: creating volume {name}: {s:?}", driver.label))?
        .into_inner()
        .volume
        .context("no volume in the answer")?
        .volume_id)
}

/// Deletes `snapshots`, then `volume` (not measured).
async fn delete_all(
    driver: &Driver,
    ctl: &mut ControllerClient<Channel>,
    snapshots: Vec<String>,
    volume: String,
) -> anyhow::Result<()> {
    for snapshot_id in snapshots {
        ctl.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id,
            secrets: driver.secrets.clone(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: DeleteSnapshot: {s:?}", driver.label))?;
    }
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: volume,
        secrets: driver.secrets.clone(),
    })
    .await
    .map_err(|s| anyhow::anyhow!("{}: deleting a source: {s:?}", driver.label))?;
    Ok(())
}

/// The flatness pairs: a fresh source, then [`GROUP`] pairs of CreateSnapshot, one of the fresh
/// source and one of `source` (which has `n` snapshots), alternating which goes first; their
/// snapshots and the fresh source are deleted afterwards (not measured).
async fn flatness_pairs(
    driver: &Driver,
    ceph: &micro_ceph::MicroCeph,
    ctl: &mut ControllerClient<Channel>,
    source: &str,
    n: usize,
    result: &mut DriverResult,
) -> anyhow::Result<()> {
    eprintln!(
        "{}: {GROUP} CreateSnapshot of a fresh source interleaved with {GROUP} of the source with {n}",
        driver.label
    );
    let fresh = new_volume(driver, ctl, "bench-snap-fresh").await?;
    let mut made = Vec::with_capacity(2 * GROUP);
    for i in 0..GROUP {
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for is_fresh in order {
            let (of, costs, name) = if is_fresh {
                (
                    fresh.as_str(),
                    &mut result.fresh_source,
                    format!("bench-fresh-{i}"),
                )
            } else {
                (source, &mut result.aged_source, format!("bench-aged-{i}"))
            };
            let req = driver.snapshot_request(&name, of);
            let answer = measured(driver, ceph, costs, ctl.create_snapshot(req)).await?;
            made.push(
                answer
                    .snapshot
                    .context("no snapshot in the answer")?
                    .snapshot_id,
            );
        }
    }
    delete_all(driver, ctl, made, fresh).await
}

/// N CreateSnapshot calls, [`CONCURRENCY`] in flight; ABORTED answers are retried after 100 ms
/// (what a client backing off would do, without the growing back-off) and counted.
async fn concurrent_snapshots(
    driver: &Driver,
    ctl: &ControllerClient<Channel>,
    source: &str,
    n: usize,
) -> anyhow::Result<(Vec<String>, usize)> {
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let req = driver.snapshot_request(&format!("bench-concurrent-{i}"), source);
        let mut ctl = ctl.clone();
        let permits = Arc::clone(&permits);
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await?;
            let mut aborted = 0;
            loop {
                match ctl.create_snapshot(req.clone()).await {
                    Ok(answer) => {
                        let id = answer
                            .into_inner()
                            .snapshot
                            .context("no snapshot in the answer")?
                            .snapshot_id;
                        return anyhow::Ok((id, aborted));
                    }
                    Err(s) if s.code() == tonic::Code::Aborted => {
                        aborted += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(s) => bail!("CreateSnapshot {}: {s:?}", req.name),
                }
            }
        }));
    }
    let mut ids = Vec::with_capacity(n);
    let mut aborted = 0;
    for task in tasks {
        let (id, a) = task.await??;
        ids.push(id);
        aborted += a;
    }
    Ok((ids, aborted))
}

/// The report: tables per driver, and the targets' verdicts on ours.
pub fn report(results: &[DriverResult], n: usize, ceph_csi_given: bool) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "CPU per operation in ms (driver = the plugin process, Ceph = the micro-ceph daemons), \
         mean over N={n} / first {GROUP} / last {GROUP}:\n"
    );
    let mut header = String::from("| operation |");
    let mut rule = String::from("|---|");
    for r in results {
        let _ = write!(header, " {} driver | {} Ceph |", r.label, r.label);
        rule.push_str("---|---|");
    }
    if !ceph_csi_given {
        header.push_str(" ceph-csi |");
        rule.push_str("---|");
    }
    let _ = writeln!(text, "{header}\n{rule}");
    let rows = [
        "CreateSnapshot",
        "restore (CreateVolume from snapshot)",
        "DeleteVolume of a restore",
        "DeleteSnapshot",
    ];
    for (row, name) in rows.into_iter().enumerate() {
        let mut line = format!("| {name} |");
        for r in results {
            let c = [
                &r.create_snapshot,
                &r.restore,
                &r.delete_restore,
                &r.delete_snapshot,
            ][row];
            let _ = write!(line, " {} | {} |", triple(&c.driver_ms), triple(&c.ceph_ms));
        }
        if !ceph_csi_given {
            line.push_str(" not run (no `--ceph-csi` binary given) |");
        }
        let _ = writeln!(text, "{line}");
    }
    let _ = writeln!(
        text,
        "\nCreateSnapshot in {GROUP} pairs taken back to back, alternating which goes first: one of a \
         fresh source (its snapshots 1 to {GROUP}) and one of the source with {n} (its snapshots {} \
         to {}); mean CPU per operation in ms:\n",
        n + 1,
        n + GROUP
    );
    let _ = writeln!(
        text,
        "| driver | fresh source: driver | fresh source: Ceph | source with {n}: driver | source with {n}: Ceph |\n|---|---|---|---|---|"
    );
    for r in results {
        let _ = writeln!(
            text,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.label,
            Costs::mean(&r.fresh_source.driver_ms),
            Costs::mean(&r.fresh_source.ceph_ms),
            Costs::mean(&r.aged_source.driver_ms),
            Costs::mean(&r.aged_source.ceph_ms),
        );
    }
    let _ = writeln!(
        text,
        "\n{n} CreateSnapshot of one source, {CONCURRENCY} at a time (ABORTED retried after 100 ms):\n"
    );
    let _ = writeln!(
        text,
        "| driver | wall | sequential wall | ABORTED answers | driver CPU / snapshot | Ceph CPU / snapshot |\n|---|---|---|---|---|---|"
    );
    for r in results {
        let _ = writeln!(
            text,
            "| {} | {:.1} s | {:.1} s | {} | {:.1} ms | {:.1} ms |",
            r.label,
            r.concurrent_s,
            r.sequential_s,
            r.concurrent_aborted,
            r.concurrent_driver_ms,
            r.concurrent_ceph_ms
        );
    }
    if let Some(ours) = results.iter().find(|r| r.label == "ours") {
        let _ = writeln!(text, "\ntargets (ours):");
        for line in verdicts(ours, n) {
            let _ = writeln!(text, "- {line}");
        }
    }
    text
}

fn triple(v: &[f64]) -> String {
    format!(
        "{:.1} / {:.1} / {:.1}",
        Costs::mean(v),
        Costs::first(v),
        Costs::last(v)
    )
}

fn verdict(measured: f64, limit: f64) -> String {
    // the limit itself is met: a product like 30 x 1.2 may land a rounding step below 36
    if measured <= limit + 1e-9 * limit.abs().max(1.0) {
        "met".to_string()
    } else {
        format!(
            "MISSED by {:.1} ({:.0}% over)",
            measured - limit,
            (measured / limit - 1.0) * 100.0
        )
    }
}

/// The targets' verdicts on our driver's figures.
pub fn verdicts(r: &DriverResult, n: usize) -> Vec<String> {
    let c = &r.create_snapshot;
    let snap_last = Costs::last(&c.driver_ms);
    let restore_last = Costs::last(&r.restore.driver_ms);
    let flat = |fresh: &[f64], aged: &[f64]| {
        let (fresh, aged) = (Costs::mean(fresh), Costs::mean(aged));
        (fresh, aged, verdict(aged, fresh * (1.0 + FLAT_WITHIN)))
    };
    let (df, dl, dv) = flat(&r.fresh_source.driver_ms, &r.aged_source.driver_ms);
    let (cf, cl, cv) = flat(&r.fresh_source.ceph_ms, &r.aged_source.ceph_ms);
    let ceph_mean = Costs::mean(&c.ceph_ms);
    vec![
        format!(
            "CreateSnapshot driver CPU <= {TARGET_SNAPSHOT_MS} ms at N={n} (last {GROUP}): {snap_last:.1} ms -> {}",
            verdict(snap_last, TARGET_SNAPSHOT_MS)
        ),
        format!(
            "restore driver CPU <= {TARGET_RESTORE_MS} ms at N={n} (last {GROUP}): {restore_last:.1} ms -> {}",
            verdict(restore_last, TARGET_RESTORE_MS)
        ),
        format!(
            "CreateSnapshot driver CPU flat (source with {n} snapshots within {:.0}% of a fresh one, pairs): {df:.1} -> {dl:.1} ms -> {dv}",
            FLAT_WITHIN * 100.0
        ),
        format!(
            "CreateSnapshot Ceph CPU flat (source with {n} snapshots within {:.0}% of a fresh one, pairs): {cf:.1} -> {cl:.1} ms -> {cv}",
            FLAT_WITHIN * 100.0
        ),
        format!(
            "CreateSnapshot Ceph CPU not above before ({CEPH_MS_BEFORE} ms): {ceph_mean:.1} ms -> {}",
            verdict(ceph_mean, CEPH_MS_BEFORE)
        ),
        format!(
            "{CONCURRENCY} at a time: no ABORTED: {} -> {}",
            r.concurrent_aborted,
            if r.concurrent_aborted == 0 {
                "met".to_string()
            } else {
                "MISSED".to_string()
            }
        ),
        format!(
            "{CONCURRENCY} at a time within the sequential time: {:.1} s vs {:.1} s -> {}",
            r.concurrent_s,
            r.sequential_s,
            verdict(r.concurrent_s, r.sequential_s)
        ),
    ]
}

/// The JSON form of the results.
pub fn to_json(results: &[DriverResult], n: usize) -> serde_json::Value {
    json!({
        "snapshots": n,
        "drivers": results.iter().map(|r| json!({
            "driver": r.label,
            "create_snapshot": r.create_snapshot.json(),
            "restore": r.restore.json(),
            "delete_restore": r.delete_restore.json(),
            "delete_snapshot": r.delete_snapshot.json(),
            "flatness_pairs": {
                "fresh_source": r.fresh_source.json(),
                "aged_source": r.aged_source.json(),
            },
            "sequential_s": r.sequential_s,
            "concurrent": {
                "in_flight": CONCURRENCY,
                "wall_s": r.concurrent_s,
                "aborted": r.concurrent_aborted,
                "driver_ms_per_snapshot": r.concurrent_driver_ms,
                "ceph_ms_per_snapshot": r.concurrent_ceph_ms,
            },
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_the_threads_run_time_unless_a_thread_ended() {
        let at = |own_s, threads: &[(u32, u64)]| CpuSample {
            own_s,
            children_s: 0.0,
            threads: threads.iter().copied().collect(),
        };
        // same threads, one new: nanoseconds, the new thread's whole run time included
        let a = at(1.0, &[(1, 1_000_000), (2, 5_000_000)]);
        let b = at(1.0, &[(1, 4_000_000), (2, 5_500_000), (3, 250_000)]);
        assert!((a.until(&b) - 0.00375).abs() < 1e-12, "{}", a.until(&b));
        // thread 2 ended: its time since `a` is unknown, the ticks say it
        let c = at(1.02, &[(1, 9_000_000)]);
        assert!((a.until(&c) - 0.02).abs() < 1e-12, "{}", a.until(&c));
        // a child was waited for: the ticks, with the child's
        let mut d = b.clone();
        d.children_s = 0.01;
        assert!((a.until(&d) - 0.01).abs() < 1e-12, "{}", a.until(&d));

        // this process, busy for a while: at least most of it is counted, to the nanosecond
        let before = CpuSample::of(std::process::id()).unwrap();
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = before.until(&CpuSample::of(std::process::id()).unwrap());
        assert!(used > 0.005 && used < 5.0, "{used}");
    }

    #[test]
    fn first_and_last_groups_and_the_flat_verdict_from_the_pairs() {
        let v: Vec<f64> = (0..100).map(|i| if i < 90 { 10.0 } else { 13.0 }).collect();
        assert_eq!(Costs::first(&v), 10.0);
        assert_eq!(Costs::last(&v), 13.0);
        let r = DriverResult {
            label: "ours".into(),
            // the sequence drifts (Ceph 50 -> 70 ms over the run): not what flat judges
            create_snapshot: Costs {
                driver_ms: v.clone(),
                ceph_ms: (0..100).map(|i| 50.0 + f64::from(i) * 0.2).collect(),
            },
            // the pairs judge flatness: 30 % more driver CPU on the aged source, Ceph's equal
            fresh_source: Costs {
                driver_ms: vec![10.0; GROUP],
                ceph_ms: vec![50.0; GROUP],
            },
            aged_source: Costs {
                driver_ms: vec![13.0; GROUP],
                ceph_ms: vec![50.0; GROUP],
            },
            restore: Costs {
                driver_ms: vec![20.0; 100],
                ceph_ms: vec![50.0; 100],
            },
            ..DriverResult::default()
        };
        let lines = verdicts(&r, 100);
        assert!(lines[0].ends_with("-> met"), "{}", lines[0]);
        assert!(
            lines[2].contains("MISSED"),
            "30 % growth is not flat: {}",
            lines[2]
        );
        assert!(lines[3].ends_with("-> met"), "{}", lines[3]);
        // exactly 20 % more is within 20 % (30 x 1.2 is a rounding step below 36 in f64)
        assert_eq!(verdict(36.0, 30.0 * (1.0 + FLAT_WITHIN)), "met");
        assert!(verdict(36.1, 30.0 * (1.0 + FLAT_WITHIN)).starts_with("MISSED"));
    }
}
