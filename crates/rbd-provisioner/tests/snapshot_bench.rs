//! Snapshot and restore throughput of the built-in controller: 100 VolumeSnapshots of one
//! CSI volume created at once until all are `readyToUse`, then 100 claims restored from them
//! (one each) created at once until all are Bound. Reports wall time, operations per second,
//! per-object latency (creation to ready/Bound, as this test's 50 ms poll sees it) and the
//! provisioner process's CPU (utime + stime from /proc) per operation.
//!
//! Ignored in normal runs (a benchmark, not a check); its figures are in BENCHMARKS.md:
//! `cargo test --release -p rbd-provisioner --test snapshot_bench -- --ignored --nocapture`
//! (`SNAPSHOT_BENCH_N` changes the count).

#[path = "support/snapshots.rs"]
mod snap;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, ListParams};
use serde_json::Value;
use support::Harness;

/// utime + stime of `pid`, seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // fields after the command name (which may contain spaces): state is the first
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / hz as f64
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

struct Phase {
    wall: Duration,
    cpu: f64,
    latencies: Vec<Duration>,
}

impl Phase {
    fn report(&self, what: &str, n: usize) {
        let mut l = self.latencies.clone();
        l.sort();
        println!(
            "SNAPSHOT_BENCH {what}: n={n} wall={:.2}s rate={:.1}/s latency p50={:.0}ms p90={:.0}ms max={:.0}ms provisioner_cpu={:.2}s cpu_per_op={:.1}ms",
            self.wall.as_secs_f64(),
            n as f64 / self.wall.as_secs_f64(),
            percentile(&l, 0.5).as_secs_f64() * 1e3,
            percentile(&l, 0.9).as_secs_f64() * 1e3,
            l[l.len() - 1].as_secs_f64() * 1e3,
            self.cpu,
            self.cpu * 1e3 / n as f64,
        );
    }
}

/// Polls `done` (names that finished at this poll) until all `names` are done.
async fn measure<F, Fut>(pid: u32, names: &[String], started: Instant, mut done: F) -> Phase
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let cpu0 = cpu_secs(pid);
    let mut finished: BTreeMap<String, Duration> = BTreeMap::new();
    let deadline = started + Duration::from_secs(600);
    while finished.len() < names.len() {
        assert!(
            Instant::now() < deadline,
            "not done after 600 s: {}",
            finished.len()
        );
        for name in done().await {
            finished.entry(name).or_insert_with(|| started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Phase {
        wall: started.elapsed(),
        cpu: cpu_secs(pid) - cpu0,
        latencies: finished.into_values().collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; see BENCHMARKS.md"]
async fn hundred_snapshots_and_hundred_restores() {
    let n: usize = std::env::var("SNAPSHOT_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (h, p) = snap::setup().await;
    let pid = p.pid();
    h.create_claim("bench-src", "csi", "64Mi", false).await;
    h.wait_bound("bench-src").await;
    let snapshots = snap::snapshots(&h);

    let names: Vec<String> = (0..n).map(|i| format!("bench-snap-{i}")).collect();
    let started = Instant::now();
    let cpu_before = cpu_secs(pid);
    for name in &names {
        snap::create_snapshot(&h, name, "bench-src").await;
    }
    let mut phase = measure(pid, &names, started, || {
        let snapshots = snapshots.clone();
        async move {
            let list = snapshots.list(&ListParams::default()).await.unwrap();
            list.items
                .into_iter()
                .filter(|vs| vs.data.pointer("/status/readyToUse") == Some(&Value::Bool(true)))
                .filter_map(|vs| vs.metadata.name)
                .collect()
        }
    })
    .await;
    phase.cpu = cpu_secs(pid) - cpu_before;
    phase.report("snapshots", n);

    let restores: Vec<String> = (0..n).map(|i| format!("bench-restore-{i}")).collect();
    let started = Instant::now();
    let cpu_before = cpu_secs(pid);
    for (restore, source) in restores.iter().zip(&names) {
        snap::create_claim_from(&h, restore, "64Mi", "VolumeSnapshot", source).await;
    }
    let claims = h.claims();
    let mut phase = measure(pid, &restores, started, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&ListParams::default()).await.unwrap();
            list.items
                .into_iter()
                .filter(|c| {
                    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                        && c.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with("bench-restore-"))
                })
                .filter_map(|c| c.metadata.name)
                .collect()
        }
    })
    .await;
    phase.cpu = cpu_secs(pid) - cpu_before;
    phase.report("restores", n);

    // clean up (not measured): restores, snapshots, the source
    for restore in &restores {
        h.claims()
            .delete(restore, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in &names {
        snapshots
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    h.claims()
        .delete("bench-src", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_no_volumes(Duration::from_secs(600)).await;
    for name in &names {
        snap::wait_gone(&h, &snapshots, name).await;
    }
    let left: Vec<String> = h
        .images()
        .into_iter()
        .filter(|i| i.starts_with("csi-snap-") || i.starts_with("csi-clone-"))
        .collect();
    println!(
        "SNAPSHOT_BENCH cleanup: internal images left in the pool: {}",
        left.len()
    );
    let _ = Harness::image_name;
}
