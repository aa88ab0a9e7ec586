//! One measured run: N claims created at once, waited to Bound, an idle window, then all deleted
//! and waited until their PVs and images are gone.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::apistats::{self, ApiStats};
use crate::cluster::{CLASS, Env, NAMESPACE};
use crate::procs::{AnonPeak, Sample, sample};
use crate::report::{Percentiles, RunResult};
use crate::tracker::Tracker;

/// Knobs of a run.
pub struct Plan {
    pub profile: &'static str,
    /// `report::UNTHROTTLED` or `report::DEFAULT_CONTROL_PLANE`.
    pub control_plane: &'static str,
    pub claims: usize,
    pub size: String,
    pub concurrency: usize,
    /// Per phase (bind, delete).
    pub time_limit: Duration,
    pub idle: Duration,
}

pub async fn measure(
    env: &mut Env,
    ceph: &micro_ceph::MicroCeph,
    plan: &Plan,
) -> anyhow::Result<RunResult> {
    let tracker = Tracker::start(&env.client);
    let sync_end = Instant::now() + Duration::from_secs(30);
    while !tracker.synced() {
        anyhow::ensure!(
            Instant::now() < sync_end,
            "the watches did not sync within 30 s"
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), tracker.changed()).await;
    }
    let leases_before = leases(&env.client).await?;
    let pid = env.provisioner.pid();
    let emu_pid = env.emulator.pid();
    let before = sample(pid)?;
    let anon_peak = AnonPeak::start(pid);
    let emu_before = sample(emu_pid)?;
    let api_before = ApiStats::fetch(&env.client).await?;
    let names: Vec<String> = (0..plan.claims).map(|i| format!("bench-{i:05}")).collect();

    // ---- create all claims at once and wait for Bound
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), NAMESPACE);
    let t0 = Instant::now();
    let create_all = futures::stream::iter(names.iter().map(|name| {
        let claims = claims.clone();
        let tracker = &tracker;
        let size = plan.size.clone();
        async move {
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {
                    "storageClassName": CLASS,
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": size}},
                }
            }))?;
            tracker.lock().created.insert(name.clone(), Instant::now());
            claims
                .create(&PostParams::default(), &claim)
                .await
                .with_context(|| format!("creating claim {name}"))?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(plan.concurrency)
    .try_collect::<()>();
    let created = async {
        create_all.await?;
        anyhow::Ok(t0.elapsed())
    };
    let all_bound = wait_until(&tracker, env, t0 + plan.time_limit, |s| {
        s.bound.len() >= plan.claims
    });
    let (create_time, bind_complete) = tokio::try_join!(created, all_bound)?;
    let bind_elapsed = t0.elapsed();
    let after_bind = sample(pid)?;
    let anon_peak_bound = anon_peak.get().max(after_bind.rss_anon);
    let api_bound = ApiStats::fetch(&env.client).await?;

    let (bound, bind_lat, last_bound, provision_lat, binding_lat) = {
        let s = tracker.lock();
        let lat: Vec<Duration> = s
            .bound
            .iter()
            .filter_map(|(n, b)| Some(b.saturating_duration_since(*s.created.get(n)?)))
            .collect();
        let mut provision_lat = Vec::new();
        let mut binding_lat = Vec::new();
        for (name, bound_at) in &s.bound {
            if let (Some(created), Some(pv)) = (s.created.get(name), s.pv_seen.get(name)) {
                provision_lat.push(pv.saturating_duration_since(*created));
                binding_lat.push(bound_at.saturating_duration_since(*pv));
            }
        }
        let last = s
            .bound
            .values()
            .max()
            .map(|b| b.saturating_duration_since(t0));
        (s.bound.len(), lat, last, provision_lat, binding_lat)
    };
    let bind_time = if bind_complete {
        last_bound.unwrap_or(bind_elapsed)
    } else {
        bind_elapsed
    };

    // ---- idle window with everything cached
    tokio::time::sleep(plan.idle).await;
    let after_idle = sample(pid)?;

    // ---- delete all claims at once; wait until their PVs are gone, then check the images
    let bound_claims: Vec<String> = tracker.lock().bound.keys().cloned().collect();
    let t1 = Instant::now();
    futures::stream::iter(names.iter().map(|name| {
        let claims = claims.clone();
        let tracker = &tracker;
        async move {
            tracker
                .lock()
                .delete_sent
                .insert(name.clone(), Instant::now());
            match claims.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e).with_context(|| format!("deleting claim {name}")),
            }
        }
    }))
    .buffer_unordered(plan.concurrency)
    .try_collect::<()>()
    .await?;
    let volumes: Vec<String> = {
        let s = tracker.lock();
        bound_claims
            .iter()
            .filter_map(|c| s.volume_of.get(c).cloned())
            .collect()
    };
    let deadline = t1 + plan.time_limit;
    let all_gone = wait_until(&tracker, env, deadline, |s| {
        volumes.iter().all(|v| s.pv_gone.contains_key(v))
    })
    .await?;
    let (deleted, del_lat, last_gone, images) = {
        let s = tracker.lock();
        let mut lat = Vec::new();
        let mut last = None::<Duration>;
        for c in &bound_claims {
            let (Some(v), Some(sent)) = (s.volume_of.get(c), s.delete_sent.get(c)) else {
                continue;
            };
            if let Some(gone) = s.pv_gone.get(v) {
                lat.push(gone.saturating_duration_since(*sent));
                let at = gone.saturating_duration_since(t1);
                last = Some(last.map_or(at, |l| l.max(at)));
            }
        }
        let images: HashSet<String> = volumes
            .iter()
            .filter_map(|v| s.image_of.get(v).cloned())
            .collect();
        (lat.len(), lat, last, images)
    };
    let delete_time = if all_gone {
        last_gone.unwrap_or_else(|| t1.elapsed())
    } else {
        t1.elapsed()
    };
    let after_delete = sample(pid)?;
    let emu_after = sample(emu_pid)?;
    let api_after = ApiStats::fetch(&env.client).await?;
    let lease_kept =
        env.provisioner.check_alive().is_ok() && leases(&env.client).await? == leases_before;
    let requests_create = api_bound.provisioner_since(&api_before);
    let requests_delete = api_after.provisioner_since(&api_bound);
    // confirm in Ceph
    let (none_left, images_left) = images_left_now(ceph, &images, deadline).await?;
    let complete = bind_complete && all_gone && none_left;

    Ok(RunResult {
        profile: plan.profile.to_string(),
        control_plane: plan.control_plane.to_string(),
        claims: plan.claims,
        time_limit_s: plan.time_limit.as_secs_f64(),
        complete,
        startup_s: env.startup.as_secs_f64(),
        create_requests_s: create_time.as_secs_f64(),
        bound,
        bind_time_s: bind_time.as_secs_f64(),
        bind_throughput: bound as f64 / bind_time.as_secs_f64().max(1e-9),
        bind_latency: Percentiles::of(bind_lat),
        deleted,
        delete_time_s: delete_time.as_secs_f64(),
        delete_throughput: deleted as f64 / delete_time.as_secs_f64().max(1e-9),
        delete_latency: Percentiles::of(del_lat),
        images_created: images.len(),
        images_left,
        rss_start_mib: mib(before.rss),
        peak_rss_bound_mib: mib(after_bind.peak_rss),
        peak_anon_bound_mib: mib(anon_peak_bound),
        peak_anon_mib: mib(anon_peak.get().max(after_delete.rss_anon)),
        threads_bound: after_bind.threads,
        rss_idle_mib: mib(after_idle.rss),
        peak_rss_mib: mib(after_delete.peak_rss),
        cpu_bind_s: cpu(before, after_bind),
        idle_cpu_fraction: cpu(after_bind, after_idle) / plan.idle.as_secs_f64().max(1e-9),
        cpu_delete_s: cpu(after_idle, after_delete),
        cpu_total_s: after_delete.cpu_secs,
        emulator_cpu_s: cpu(emu_before, emu_after),
        emulator_peak_rss_mib: mib(emu_after.peak_rss),
        provision_latency: Percentiles::of(provision_lat),
        binding_latency: Percentiles::of(binding_lat),
        cpu_per_claim_ms: if complete {
            (cpu(before, after_bind) + cpu(after_idle, after_delete)) * 1000.0
                / plan.claims.max(1) as f64
        } else {
            f64::NAN
        },
        writes_per_claim_create: apistats::writes(&requests_create) as f64
            / plan.claims.max(1) as f64,
        writes_per_claim_delete: apistats::writes(&requests_delete) as f64
            / plan.claims.max(1) as f64,
        requests_per_claim_create: apistats::per_claim(&requests_create, plan.claims),
        requests_per_claim_delete: apistats::per_claim(&requests_delete, plan.claims),
        emulator_max_answer_ms: api_after.stalls.max_answer_ms,
        emulator_slow_answers: api_after.stalls.slow_answers,
        emulator_max_runtime_lag_ms: api_after.stalls.max_runtime_lag_ms,
        lease_kept,
    })
}

/// Holder and transition count of each Lease in the benchmark's namespace (the provisioner's
/// leader election); unchanged over a run means the lease was never lost.
async fn leases(client: &kube::Client) -> anyhow::Result<Vec<(String, String, i32)>> {
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), NAMESPACE);
    let mut out: Vec<(String, String, i32)> = api
        .list(&kube::api::ListParams::default())
        .await
        .context("listing Leases")?
        .items
        .into_iter()
        .map(|lease| {
            let spec = lease.spec.unwrap_or_default();
            (
                lease.metadata.name.unwrap_or_default(),
                spec.holder_identity.unwrap_or_default(),
                spec.lease_transitions.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn cpu(a: Sample, b: Sample) -> f64 {
    (b.cpu_secs - a.cpu_secs).max(0.0)
}

/// Waits until `done` holds (true) or `deadline` passes (false); fails if a process died.
async fn wait_until(
    tracker: &Tracker,
    env: &mut Env,
    deadline: Instant,
    done: impl Fn(&crate::tracker::Seen) -> bool,
) -> anyhow::Result<bool> {
    loop {
        if done(&tracker.lock()) {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        env.provisioner.check_alive()?;
        env.emulator.check_alive()?;
        let wait = (deadline - now).min(Duration::from_millis(500));
        let _ = tokio::time::timeout(wait, tracker.changed()).await;
    }
}

/// Whether no image of the run is left in Ceph, and how many are: one `rbd ls`, repeated each
/// second only while images remain, until `deadline`.
async fn images_left_now(
    ceph: &micro_ceph::MicroCeph,
    images: &HashSet<String>,
    deadline: Instant,
) -> anyhow::Result<(bool, usize)> {
    let mut left = count_left(ceph, images)?;
    while left > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        left = count_left(ceph, images)?;
    }
    Ok((left == 0, left))
}

fn count_left(ceph: &micro_ceph::MicroCeph, ours: &HashSet<String>) -> anyhow::Result<usize> {
    let pool = ceph.pool.clone();
    let out = tokio::task::block_in_place(|| ceph.rbd(&["ls", &pool]))
        .context("listing images with rbd ls")?;
    Ok(out.lines().filter(|l| ours.contains(l.trim())).count())
}
