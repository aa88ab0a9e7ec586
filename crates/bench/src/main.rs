//! `rbd-bench`: end-to-end provisioning benchmark.
//!
//! Starts a private micro-ceph cluster, then per run a fresh `kube-emulator` process and the real
//! `rbd-provisioner` binary (leader election on), creates N PVCs at once, measures until all are
//! Bound and until all are deleted again (PV gone, image gone), and samples the provisioner's
//! peak RSS and CPU from `/proc`. Runs two profiles of the same binary: `ours` (its default
//! settings) and `old-settings` (the old `ceph.com/rbd` provisioner's client settings: 4
//! workers, API qps 5 / burst 10, retries 15 s .. 1000 s). `old-settings` is our binary
//! throttled like the old provisioner, not the old provisioner itself.
//!
//! `cargo run --release -p rbd-bench -- --claims 100,1000,5000 [--profile both] [--out FILE]
//! [--markdown BENCHMARKS.md]` (the last rewrites BENCHMARKS.md's generated section: tables,
//! per-claim costs, requests per claim and the targets' verdicts, with command, commit and machine)

mod apistats;
mod cluster;
mod markdown;
mod procs;
mod replication;
mod report;
mod run;
mod snapshots;
mod tracker;

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::fmt::Write as _;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use serde_json::json;

use crate::cluster::Env;
use crate::report::RunResult;
use crate::run::Plan;

/// Label of the profile running our binary with the old provisioner's client settings.
pub const OLD_SETTINGS: &str = "old-settings";
/// Label of the profile running our binary with its default settings.
pub const OURS: &str = "ours";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Profile {
    /// Our binary with the old provisioner's client settings (`incumbent` is a deprecated
    /// alias).
    #[value(name = "old-settings", alias = "incumbent")]
    OldSettings,
    /// Our binary with its default settings.
    Ours,
    /// Both.
    Both,
}

/// Which emulated control plane(s) our profile runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ControlPlane {
    /// The PV controller limited like kube-controller-manager by default (20 qps, burst 30).
    Default,
    /// No client limit in the emulator's PV controller.
    Unthrottled,
    /// Both, side by side.
    Both,
}

#[derive(Debug, Parser)]
#[command(
    name = "rbd-bench",
    about = "End-to-end provisioning benchmark (micro-ceph + kube-emulator + rbd-provisioner)"
)]
struct Args {
    /// Claim counts, one run each.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
    claims: Vec<usize>,
    /// Which settings to run the provisioner with.
    #[arg(long, value_enum, default_value = "both")]
    profile: Profile,
    /// JSON output (default: target/bench/provisioning.json next to the build).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Requested size of each claim (images are thin).
    #[arg(long, default_value = "1Mi")]
    size: String,
    /// Concurrent create/delete requests from the benchmark's client.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Time limit per phase (bind, delete) for our settings, seconds.
    #[arg(long, default_value_t = 300)]
    time_limit: u64,
    /// Time limit per phase for the old-settings profile, seconds (its runs are capped).
    /// `--incumbent-time-limit` is a deprecated alias.
    #[arg(long, alias = "incumbent-time-limit", default_value_t = 120)]
    old_settings_time_limit: u64,
    /// Largest N run with the old-settings profile (larger N are skipped).
    /// `--incumbent-max-claims` is a deprecated alias.
    #[arg(long, alias = "incumbent-max-claims", default_value_t = 1000)]
    old_settings_max_claims: usize,
    /// Idle window after the burst for the idle-CPU figure, seconds.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// Do not run `cargo build` for rbd-provisioner and kube-emulator first.
    #[arg(long)]
    no_build: bool,
    /// Extra environment for the provisioner (experiments, e.g. MALLOC_ARENA_MAX=2); repeatable.
    #[arg(long = "provisioner-env", value_name = "KEY=VALUE", value_parser = parse_env)]
    provisioner_env: Vec<(String, String)>,
    /// Extra provisioner flag for every run (experiments; the figures then say so); repeatable,
    /// e.g. `--provisioner-arg=--leader-election-renew-deadline=45s`.
    #[arg(
        long = "provisioner-arg",
        value_name = "FLAG",
        allow_hyphen_values = true
    )]
    provisioner_args: Vec<String>,
    /// Run `cargo bench -p ceph-rbd --bench ops` first (else its last JSON is read).
    #[arg(long)]
    ceph_bench: bool,
    /// Control plane(s) for our profile: `default` (the emulator's PV controller with
    /// kube-controller-manager's client limit, 20 qps / burst 30, as a real cluster has),
    /// `unthrottled`, or both. The old-settings profile always runs unthrottled.
    #[arg(long, value_enum, default_value = "both")]
    control_plane: ControlPlane,
    /// Time limit per phase on the default control plane, seconds, at least twice the binding
    /// time its client limit allows (about 5 writes per claim at 20 per second: 1000 claims take
    /// ~250 s to bind, 5000 ~1250 s).
    #[arg(long, default_value_t = 600)]
    default_control_plane_time_limit: u64,
    /// Largest N run on the default control plane (larger N are skipped). Each N runs there once,
    /// however often it is listed in --claims (the repeats are for the unthrottled checks).
    #[arg(long, default_value_t = 5000)]
    default_control_plane_max_claims: usize,
    /// Also write the report (tables and the targets' verdicts, with the command, commit and
    /// machine) into this markdown file, between rbd-bench's marker lines (appended when the
    /// file has none), e.g. `--markdown BENCHMARKS.md`.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// Run the snapshot scenario instead of the provisioning runs: N CreateSnapshot of one
    /// source through the CSI controller, N restores, their deletion, then N snapshots
    /// 8 at a time; CPU per operation of the driver and of Ceph (JSON default:
    /// target/bench/snapshots.json; `--markdown` writes its own section).
    #[arg(long, value_name = "N")]
    snapshots: Option<usize>,
    /// ceph-csi's `cephcsi` binary, run side by side in the snapshot scenario (not shipped or
    /// built here); without it the ceph-csi column says it was not run.
    #[arg(long, value_name = "PATH")]
    ceph_csi: Option<PathBuf>,
    /// Run the replication scenario instead: N claims mirrored to a second micro-ceph site by
    /// VolumeReplications with a one-minute interval; the provisioner's CPU per claim to enable
    /// and per claim per interval (about 10 minutes; `--markdown` writes its own section).
    #[arg(long, value_name = "N")]
    replication: Option<usize>,
}

/// kube-emulator flag for the default control plane.
const DEFAULT_CONTROL_PLANE_ARGS: &[&str] = &["--default-control-plane"];

/// The old `ceph.com/rbd` external provisioner's client settings (its client-go defaults),
/// given to our binary for the old-settings profile.
const OLD_SETTINGS_ARGS: &[&str] = &[
    "--workers",
    "4",
    "--kube-api-qps",
    "5",
    "--kube-api-burst",
    "10",
    "--retry-interval-start",
    "15s",
    "--retry-interval-max",
    "1000s",
];

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    for note in deprecation_notes(&argv) {
        eprintln!("rbd-bench: {note}");
    }
    let args = Args::parse_from(&argv);
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rbd-bench: installing the SIGTERM handler: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // Dropping the benchmark future on a signal stops everything it started (Drop guards).
    let result = tokio::select! {
        r = bench(args) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rbd-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let bins = procs::binaries(args.no_build)?;
    let bench_dir = bins
        .parent()
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
        .join("bench");
    std::fs::create_dir_all(&bench_dir)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| bench_dir.join("provisioning.json"));
    if let Some(n) = args.snapshots {
        return snapshot_bench(&args, &bins, &bench_dir, n).await;
    }
    if let Some(n) = args.replication {
        return replication_bench(&args, &bins, n).await;
    }
    if args.ceph_bench {
        run_ceph_bench()?;
    }
    let work = WorkDir::create()?;
    eprintln!("logs in {}", work.0.display());

    eprintln!("starting micro-ceph");
    let ceph =
        tokio::task::block_in_place(micro_ceph::MicroCeph::start).context("starting micro-ceph")?;

    let mut plans = Vec::new();
    if args.profile != Profile::OldSettings {
        // Unthrottled runs first, in --claims order (repeats stay in a row), then the default
        // control plane's, once per N.
        if args.control_plane != ControlPlane::Default {
            for &n in &args.claims {
                plans.push((OURS, report::UNTHROTTLED, n, args.time_limit));
            }
        }
        let mut on_default_control_plane = std::collections::BTreeSet::new();
        for &n in &args.claims {
            if args.control_plane == ControlPlane::Unthrottled {
                continue;
            }
            if n <= args.default_control_plane_max_claims {
                if on_default_control_plane.insert(n) {
                    plans.push((
                        OURS,
                        report::DEFAULT_CONTROL_PLANE,
                        n,
                        default_control_plane_limit(args.default_control_plane_time_limit, n),
                    ));
                }
            } else {
                eprintln!(
                    "skipping the default control plane at N={n} (> --default-control-plane-max-claims {})",
                    args.default_control_plane_max_claims
                );
            }
        }
    }
    if args.profile != Profile::Ours {
        for &n in &args.claims {
            if n <= args.old_settings_max_claims {
                plans.push((
                    OLD_SETTINGS,
                    report::UNTHROTTLED,
                    n,
                    args.old_settings_time_limit,
                ));
            } else {
                eprintln!(
                    "skipping the {OLD_SETTINGS} profile at N={n} (> --old-settings-max-claims {})",
                    args.old_settings_max_claims
                );
            }
        }
    }

    let mut runs: Vec<RunResult> = Vec::new();
    let mut failures: Vec<serde_json::Value> = Vec::new();
    for (i, (profile, control_plane, n, limit)) in plans.into_iter().enumerate() {
        let extra: Vec<String> = if profile == OLD_SETTINGS {
            OLD_SETTINGS_ARGS.iter().map(|s| (*s).to_string()).collect()
        } else {
            Vec::new()
        };
        let extra: Vec<String> = extra
            .into_iter()
            .chain(args.provisioner_args.iter().cloned())
            .collect();
        let emulator_args: Vec<String> = if control_plane == report::DEFAULT_CONTROL_PLANE {
            DEFAULT_CONTROL_PLANE_ARGS
                .iter()
                .map(|s| (*s).to_string())
                .collect()
        } else {
            Vec::new()
        };
        let plane_tag = if control_plane == report::UNTHROTTLED {
            ""
        } else {
            "-default-control-plane"
        };
        let tag = format!("{i}-{profile}-{n}{plane_tag}");
        eprintln!("run {tag}: starting emulator and provisioner");
        let mut env = Env::start(
            &bins,
            &work.0,
            &tag,
            &ceph,
            &extra,
            &args.provisioner_env,
            &emulator_args,
        )
        .await?;
        let plan = Plan {
            profile,
            control_plane,
            claims: n,
            size: args.size.clone(),
            concurrency: args.concurrency,
            time_limit: Duration::from_secs(limit),
            idle: Duration::from_secs(args.idle_secs),
        };
        eprintln!("run {tag}: {n} claims");
        let result = run::measure(&mut env, &ceph, &plan).await;
        drop(env);
        let result = match result {
            Ok(r) => r,
            // e.g. the provisioner exited (lost its lease under load): record it, go on
            Err(e) => {
                let error = format!("{e:#}");
                eprintln!("run {tag} FAILED: {error}");
                failures.push(json!({"profile": profile, "control_plane": control_plane, "claims": n, "error": error}));
                continue;
            }
        };
        eprintln!(
            "run {tag}: {}/{n} bound in {:.2} s, {} deleted in {:.2} s, peak RSS {:.1} MiB",
            result.bound,
            result.bind_time_s,
            result.deleted,
            result.delete_time_s,
            result.peak_rss_mib
        );
        runs.push(result);
    }
    drop(ceph);

    let ratios = report::ratios(&runs);
    let checks = report::checks(&runs, &ratios);
    let ceph_ratio = report::read_ceph_ratio(&bench_dir.join("ceph-rbd-ops.json"));

    let mut text = String::new();
    let _ = writeln!(text, "\n{}", report::table(&runs));
    if runs
        .iter()
        .any(|r| r.control_plane == report::DEFAULT_CONTROL_PLANE)
    {
        let _ = writeln!(
            text,
            "our binary per control plane:\n\n{}",
            report::control_plane_table(&runs)
        );
    }
    let _ = writeln!(
        text,
        "per claim:\n\n{}\nthe provisioner's API requests per claim (verb resource):\n\n{}",
        report::per_claim_table(&runs),
        report::requests_breakdown(&runs)
    );
    for (n, r) in &ratios {
        let _ = writeln!(
            text,
            "bind throughput {OURS} / {OLD_SETTINGS} at N={n}: {r:.1}x"
        );
    }
    for r in runs.iter().filter(|r| !r.complete) {
        let _ = writeln!(
            text,
            "note: {} N={} was capped at {:.0} s per phase: {} of {} bound, {} deleted, {} images left; its throughput is the rate within the cap",
            r.profile, r.claims, r.time_limit_s, r.bound, r.claims, r.deleted, r.images_left
        );
    }
    match &ceph_ratio {
        Some(c) => {
            let ops: Vec<String> = c
                .ops
                .iter()
                .map(|(op, r)| format!("{op} {r:.1}x"))
                .collect();
            let _ = writeln!(
                text,
                "ceph-rbd librbd vs CLI (p50, {}): {}",
                c.source,
                ops.join(", ")
            );
        }
        None => drop(writeln!(
            text,
            "ceph-rbd librbd vs CLI: no {} (run `cargo bench -p ceph-rbd --bench ops` or pass --ceph-bench)",
            bench_dir.join("ceph-rbd-ops.json").display()
        )),
    }
    for f in &failures {
        let _ = writeln!(text, "FAILED run: {f}");
    }
    let _ = writeln!(text, "\ntargets:\n{}", report::checks_text(&checks));
    print!("{text}");

    let doc = json!({
        "machine": machine(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "size": args.size,
        "concurrency": args.concurrency,
        "old_settings_args": OLD_SETTINGS_ARGS,
        "default_control_plane_emulator_args": DEFAULT_CONTROL_PLANE_ARGS,
        "provisioner_extra_args": args.provisioner_args,
        "provisioner_env": args.provisioner_env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "runs": runs,
        "failed_runs": failures,
        "bind_throughput_ratio": ratios.iter().map(|(n, r)| json!({"claims": n, "ratio": r})).collect::<Vec<_>>(),
        "targets": checks,
        "ceph_rbd_librbd_vs_cli": ceph_ratio,
    });
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    if let Some(path) = &args.markdown {
        let section = format!(
            "### Generated by rbd-bench\n\nCommand: `{}`; commit {}; machine: {}.\n\n{text}",
            std::env::args().collect::<Vec<_>>().join(" "),
            commit(),
            machine_line(),
        );
        markdown::write(path, &section)?;
        println!("wrote {}", path.display());
    }
    // Logs are kept when a run failed or was capped (a stuck claim is worth a look).
    if failures.is_empty() && runs.iter().all(|r| r.complete) {
        work.remove();
    } else {
        println!(
            "logs of the failed or capped runs kept in {}",
            work.0.display()
        );
    }
    Ok(())
}

/// `--snapshots N`: the snapshot scenario ([`snapshots`]) for our driver and, when given,
/// ceph-csi's.
async fn snapshot_bench(
    args: &Args,
    bins: &Path,
    bench_dir: &Path,
    n: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!(n > 0, "--snapshots: expected at least 1 snapshot, got 0");
    if let Some(path) = &args.ceph_csi {
        anyhow::ensure!(
            path.is_file(),
            "--ceph-csi: {} is not a file (the cephcsi binary, built elsewhere)",
            path.display()
        );
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| bench_dir.join("snapshots.json"));
    let work = WorkDir::create()?;
    eprintln!("logs in {}", work.0.display());
    eprintln!("starting micro-ceph");
    let ceph =
        tokio::task::block_in_place(micro_ceph::MicroCeph::start).context("starting micro-ceph")?;
    let mut results = Vec::new();
    let mut driver = snapshots::Driver::ours(bins, &work.0, &ceph)?;
    results.push(snapshots::run_driver(&mut driver, &ceph, n).await?);
    drop(driver);
    if let Some(path) = &args.ceph_csi {
        let mut driver = snapshots::Driver::ceph_csi(path, &work.0, &ceph)?;
        results.push(snapshots::run_driver(&mut driver, &ceph, n).await?);
    }
    let text = snapshots::report(&results, n, args.ceph_csi.is_some());
    println!("{text}");
    let doc = json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "commit": commit(),
        "machine": machine(),
        "results": snapshots::to_json(&results, n),
    });
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    if let Some(path) = &args.markdown {
        write_section(
            path,
            "snapshots",
            (markdown::SNAPSHOTS_BEGIN, markdown::SNAPSHOTS_END),
            bins,
            &text,
        )?;
    }
    work.remove();
    Ok(())
}

/// `--replication N`: the replication scenario ([`replication`]).
async fn replication_bench(args: &Args, bins: &Path, n: usize) -> anyhow::Result<()> {
    anyhow::ensure!(n > 0, "--replication: expected at least 1 claim, got 0");
    let work = WorkDir::create()?;
    eprintln!("logs in {}", work.0.display());
    let measured = replication::run(bins, &work.0, n).await?;
    let text = replication::report(&measured);
    println!("{text}");
    if let Some(path) = &args.markdown {
        write_section(
            path,
            "replication",
            (markdown::REPLICATION_BEGIN, markdown::REPLICATION_END),
            bins,
            &text,
        )?;
    }
    work.remove();
    Ok(())
}

/// Writes a scenario's report into `path` between `markers`, headed by the command, commit,
/// build and machine.
fn write_section(
    path: &Path,
    flag: &str,
    markers: (&str, &str),
    bins: &Path,
    text: &str,
) -> anyhow::Result<()> {
    let section = format!(
        "### Generated by rbd-bench --{flag}\n\nCommand: `{}`; commit {}; build: {}; machine: {}.\n\n{text}",
        std::env::args().collect::<Vec<_>>().join(" "),
        commit(),
        if bins.ends_with("release") {
            "release"
        } else {
            "debug (unoptimised Rust; librbd and librados are the distribution's)"
        },
        machine_line(),
    );
    markdown::write_between(path, markers, &section)?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Logs and kubeconfigs of the runs; removed after a benchmark whose runs all completed, kept
/// when one failed or was capped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> anyhow::Result<WorkDir> {
        let dir = std::env::temp_dir().join(format!("rbd-bench.{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(WorkDir(dir))
    }

    fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Warnings for deprecated spellings on the command line (they still work).
fn deprecation_notes(argv: &[String]) -> Vec<String> {
    let mut notes = Vec::new();
    for (i, arg) in argv.iter().enumerate().skip(1) {
        for (old, new) in [
            ("--incumbent-time-limit", "--old-settings-time-limit"),
            ("--incumbent-max-claims", "--old-settings-max-claims"),
        ] {
            if arg == old || arg.starts_with(&format!("{old}=")) {
                notes.push(format!("{old} is deprecated, use {new}"));
            }
        }
        let profile = arg.strip_prefix("--profile=").or_else(|| {
            (arg == "--profile")
                .then(|| argv.get(i + 1).map(String::as_str))
                .flatten()
        });
        if profile == Some("incumbent") {
            notes.push(format!(
                "--profile incumbent is deprecated, use --profile {OLD_SETTINGS} (our binary with the old provisioner's client settings)"
            ));
        }
    }
    notes
}

/// The time limit per phase on the default control plane for `n` claims: `flag`, raised to twice
/// what binding takes there (5 writes per claim at 20 per second).
fn default_control_plane_limit(flag: u64, n: usize) -> u64 {
    let binding = u64::try_from(n).unwrap_or(u64::MAX).saturating_mul(5) / 20;
    flag.max(binding.saturating_mul(2))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn run_ceph_bench() -> anyhow::Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = std::process::Command::new(cargo)
        .current_dir(procs::workspace_root())
        .args(["bench", "-p", "ceph-rbd", "--bench", "ops"])
        .status()
        .context("running cargo bench -p ceph-rbd")?;
    anyhow::ensure!(status.success(), "cargo bench -p ceph-rbd failed: {status}");
    Ok(())
}

fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string());
    let mem_kib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string());
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": model,
        "mem_gib": mem_kib.map(|k| k as f64 / 1024.0 / 1024.0),
        "os": os,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
    })
}

/// The machine in one line, for the markdown report.
fn machine_line() -> String {
    let m = machine();
    format!(
        "{} CPUs ({}), {:.0} GiB, {}, kernel {}",
        m["cpus"],
        m["cpu_model"].as_str().unwrap_or("unknown model"),
        m["mem_gib"].as_f64().unwrap_or(0.0),
        m["os"].as_str().unwrap_or("unknown OS"),
        m["kernel"].as_str().unwrap_or("?"),
    )
}

/// The checked-out commit (`git rev-parse --short HEAD`, `+dirty` with uncommitted changes), or
/// `unknown`.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}+dirty") } else { head }
        }
        None => "unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        std::iter::once("rbd-bench")
            .chain(args.iter().copied())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_default_control_plane_limit_allows_twice_its_binding_time() {
        assert_eq!(default_control_plane_limit(600, 100), 600);
        assert_eq!(default_control_plane_limit(600, 1000), 600);
        assert_eq!(default_control_plane_limit(600, 5000), 2500);
        assert_eq!(default_control_plane_limit(3000, 5000), 3000);
    }

    #[test]
    fn old_flag_and_profile_names_still_parse_with_a_deprecation_note() {
        let old = argv(&[
            "--profile",
            "incumbent",
            "--incumbent-time-limit=60",
            "--incumbent-max-claims",
            "500",
        ]);
        let args = Args::try_parse_from(&old).expect("deprecated spellings parse");
        assert_eq!(args.profile, Profile::OldSettings);
        assert_eq!(args.old_settings_time_limit, 60);
        assert_eq!(args.old_settings_max_claims, 500);
        let notes = deprecation_notes(&old);
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes.iter().all(|n| n.contains("deprecated")));

        let new = argv(&[
            "--profile=old-settings",
            "--old-settings-time-limit",
            "60",
            "--old-settings-max-claims=500",
        ]);
        let args = Args::try_parse_from(&new).expect("new spellings parse");
        assert_eq!(args.profile, Profile::OldSettings);
        assert_eq!(args.old_settings_time_limit, 60);
        assert_eq!(args.old_settings_max_claims, 500);
        assert!(deprecation_notes(&new).is_empty());
    }
}
