//! `--replication N`: the controller CPU a claim replicated to a second site costs.
//!
//! Two micro-ceph sites peered for their pool in image mode, an `rbd-mirror` daemon each
//! (`MicroCeph::start_two_sites`), the emulator (with the csi-addons CRDs) and the provisioner
//! on site-a; N claims, bound. Then:
//!
//! 1. **Baseline**: the provisioner's CPU time over [`WINDOW_INTERVALS`] scheduling intervals
//!    with the claims alone (watches, lease renewals).
//! 2. **Enable**: N VolumeReplications (`primary`, a class with a one-minute
//!    `schedulingInterval`) made at once, waited for until every one is `Primary`; the CPU time
//!    per claim (enabling mirroring, the first mirror snapshot, the status).
//! 3. **Steady**: once every one reports a `lastSyncTime`, the CPU time over the same window:
//!    per claim per interval, the steady cost minus the baseline (a mirror snapshot per interval,
//!    the replication status read and written when it changed).
//!
//! CPU time, not wall time: the machine is shared with Ceph and the daemons.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::json;

use crate::cluster::{CLASS, Env, NAMESPACE};
use crate::procs::sample;

/// The class's scheduling interval.
const INTERVAL: Duration = Duration::from_mins(1);
/// Intervals per measured window.
pub const WINDOW_INTERVALS: u32 = 3;
/// Target: controller CPU per replicated claim per interval (ms).
pub const TARGET_MS_PER_INTERVAL: f64 = 5.0;

/// What one run measured.
pub struct Measured {
    pub claims: usize,
    pub baseline_cpu: f64,
    pub enable_cpu: f64,
    pub enable_time: Duration,
    pub steady_cpu: f64,
    pub window: Duration,
}

impl Measured {
    /// Controller CPU per claim per interval above the baseline, ms.
    #[must_use]
    pub fn per_claim_interval_ms(&self) -> f64 {
        let intervals = self.window.as_secs_f64() / INTERVAL.as_secs_f64();
        (self.steady_cpu - self.baseline_cpu).max(0.0) * 1000.0 / (self.claims as f64 * intervals)
    }
}

fn replications(env: &Env) -> Api<DynamicObject> {
    Api::namespaced_with(
        env.client.clone(),
        NAMESPACE,
        &ApiResource::erase::<provisioner::replication::VolumeReplication>(&()),
    )
}

/// Polls `replications` until `done` holds for all N, at most `limit`.
async fn wait_all(
    env: &Env,
    n: usize,
    limit: Duration,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    loop {
        let list = replications(env).list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|vr| vr.data.get("status").is_some_and(&done))
            .count();
        if ready >= n {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < end,
            "{what}: {ready} of {n} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn cpu_over(env: &Env, window: Duration) -> anyhow::Result<f64> {
    let pid = env.provisioner.pid();
    let before = sample(pid)?.cpu_secs;
    tokio::time::sleep(window).await;
    Ok(sample(pid)?.cpu_secs - before)
}

/// Runs the scenario with `n` claims.
pub async fn run(bins: &Path, dir: &Path, n: usize) -> anyhow::Result<Measured> {
    eprintln!("starting the two sites");
    let (a, _b) = tokio::task::block_in_place(micro_ceph::MicroCeph::start_two_sites)
        .context("starting the two sites")?;
    let env = Env::start(
        bins,
        dir,
        "replication",
        &a,
        &["--log-level".into(), "warn".into()],
        &[],
        &["--csi-addons-crds".into()],
    )
    .await?;
    let classes: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &ApiResource::erase::<provisioner::replication::VolumeReplicationClass>(&()),
    );
    let class = serde_json::from_value(json!({
        "apiVersion": "replication.storage.openshift.io/v1alpha1",
        "kind": "VolumeReplicationClass",
        "metadata": {"name": "every-minute"},
        "spec": {"provisioner": rbd_csi::DEFAULT_DRIVER_NAME,
                 "parameters": {"schedulingInterval": "1m"}},
    }))?;
    classes.create(&PostParams::default(), &class).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), NAMESPACE);
    let names: Vec<String> = (0..n).map(|i| format!("replicated-{i:04}")).collect();
    for name in &names {
        let claim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "16Mi"}}},
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
    }
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let bound = claims
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound >= n {
            break;
        }
        anyhow::ensure!(Instant::now() < end, "{bound} of {n} claims bound in 300 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let window = INTERVAL * WINDOW_INTERVALS;
    eprintln!("baseline: {window:?}");
    let baseline_cpu = cpu_over(&env, window).await?;

    eprintln!("enabling {n} replications");
    let pid = env.provisioner.pid();
    let before = sample(pid)?.cpu_secs;
    let t0 = Instant::now();
    for name in &names {
        let vr = serde_json::from_value(json!({
            "apiVersion": "replication.storage.openshift.io/v1alpha1",
            "kind": "VolumeReplication",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"volumeReplicationClass": "every-minute", "replicationState": "primary",
                     "dataSource": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": name},
                     "autoResync": false},
        }))?;
        replications(&env)
            .create(&PostParams::default(), &vr)
            .await?;
    }
    wait_all(&env, n, Duration::from_secs(600), "Primary", |s| {
        s["state"] == "Primary"
    })
    .await?;
    let enable_time = t0.elapsed();
    let enable_cpu = sample(pid)?.cpu_secs - before;
    wait_all(&env, n, INTERVAL * 4, "lastSyncTime", |s| {
        s["lastSyncTime"].is_string()
    })
    .await?;
    eprintln!("steady: {window:?}");
    let steady_cpu = cpu_over(&env, window).await?;
    Ok(Measured {
        claims: n,
        baseline_cpu,
        enable_cpu,
        enable_time,
        steady_cpu,
        window,
    })
}

/// The markdown report.
#[must_use]
pub fn report(m: &Measured) -> String {
    let per = m.per_claim_interval_ms();
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| N claims | enable: controller CPU per claim | enable: wall time | baseline CPU over {} intervals | with replication | per claim per interval | target | verdict |",
        WINDOW_INTERVALS
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|---|");
    let _ = writeln!(
        text,
        "| {} | {:.1} ms | {:.1} s | {:.2} s | {:.2} s | {:.2} ms | at most {:.0} ms | {} |",
        m.claims,
        m.enable_cpu * 1000.0 / m.claims as f64,
        m.enable_time.as_secs_f64(),
        m.baseline_cpu,
        m.steady_cpu,
        per,
        TARGET_MS_PER_INTERVAL,
        if per <= TARGET_MS_PER_INTERVAL {
            "met"
        } else {
            "missed"
        },
    );
    text
}
