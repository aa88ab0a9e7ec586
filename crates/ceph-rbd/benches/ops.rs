//! librbd through this crate vs the `rbd` CLI, per operation, on a private micro-ceph cluster.
//!
//! Run: `cargo bench -p ceph-rbd --bench ops` (env `ROUNDS`, default 40). Prints a table with the
//! median and p99 of each operation both ways and the ratio, and writes
//! `target/bench/ceph-rbd-ops.json`. A measurement, not a test: nothing here asserts a speed.

use std::time::{Duration, Instant};

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, Secret};

const SIZE: u64 = 64 << 20;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Series {
    op: &'static str,
    lib: Vec<Duration>,
    cli: Vec<Duration>,
}

fn timed<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let t = Instant::now();
    let r = f();
    (t.elapsed(), r)
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let cluster = micro_ceph::MicroCeph::start().unwrap_or_else(|e| panic!("micro-ceph: {e}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let cfg = ClusterConfig::new(
        cluster.monitors.clone(),
        "admin",
        Secret::new(cluster.admin_key.clone()),
    );
    let pool = cluster.pool.clone();
    let conn = rt
        .block_on(ConnectionPool::default().get(&cfg))
        .unwrap_or_else(|e| panic!("{e}"));

    let ops = ["create", "stat", "watchers", "resize", "remove"];
    let mut series: Vec<Series> = ops
        .iter()
        .map(|op| Series {
            op,
            lib: vec![],
            cli: vec![],
        })
        .collect();
    let run_cli = |args: &[&str]| {
        let out = cluster
            .cli("rbd")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("rbd: {e}"));
        assert!(
            out.status.success(),
            "rbd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for i in 0..rounds {
        // through the crate
        let name = format!("bench-lib-{i}");
        // the provisioner's default features, named (as its classes do): a plain image, which
        // the crate creates and removes without librbd; the CLI gets the same from its defaults
        let opts = CreateOptions {
            features: Some(
                ceph_rbd::Features::parse(
                    "layering,exclusive-lock,object-map,fast-diff,deep-flatten",
                )
                .unwrap_or_else(|e| panic!("{e}")),
            ),
            ..CreateOptions::default()
        };
        let steps: [(usize, Duration); 5] = rt.block_on(async {
            let (a, r) = timed_async(conn.create_image(&pool, &name, SIZE, &opts)).await;
            r.unwrap_or_else(|e| panic!("{e}"));
            let (b, r) = timed_async(conn.image_info(&pool, &name)).await;
            r.unwrap_or_else(|e| panic!("{e}"));
            let (c, r) = timed_async(conn.watchers(&pool, &name)).await;
            r.unwrap_or_else(|e| panic!("{e}"));
            let (d, r) = timed_async(conn.resize_image(&pool, &name, 2 * SIZE, false)).await;
            r.unwrap_or_else(|e| panic!("{e}"));
            let (e, r) = timed_async(conn.remove_image(&pool, &name)).await;
            r.unwrap_or_else(|e| panic!("{e}"));
            [(0, a), (1, b), (2, c), (3, d), (4, e)]
        });
        for (k, d) in steps {
            series[k].lib.push(d);
        }
        // through the CLI, one process per call as the old provisioner did
        let spec = format!("{pool}/bench-cli-{i}");
        let size_mb = (SIZE >> 20).to_string();
        let size2_mb = ((2 * SIZE) >> 20).to_string();
        let cli_steps: [Vec<&str>; 5] = [
            vec!["create", "--size", &size_mb, &spec],
            vec!["info", &spec],
            vec!["status", &spec],
            vec!["resize", "--no-progress", "--size", &size2_mb, &spec],
            vec!["rm", "--no-progress", &spec],
        ];
        for (k, args) in cli_steps.iter().enumerate() {
            let (d, ()) = timed(|| run_cli(args));
            series[k].cli.push(d);
        }
    }

    println!(
        "ceph-rbd vs rbd CLI, {rounds} rounds, {} MiB images, memstore micro-ceph",
        SIZE >> 20
    );
    println!(
        "{:<10} {:>11} {:>11} {:>11} {:>11} {:>8}",
        "op", "crate p50", "crate p99", "cli p50", "cli p99", "p50 x"
    );
    let mut json = Vec::new();
    for s in &mut series {
        let (lp50, lp99) = (percentile(&mut s.lib, 0.5), percentile(&mut s.lib, 0.99));
        let (cp50, cp99) = (percentile(&mut s.cli, 0.5), percentile(&mut s.cli, 0.99));
        let ratio = ms(cp50) / ms(lp50).max(0.001);
        println!(
            "{:<10} {:>9.2}ms {:>9.2}ms {:>9.2}ms {:>9.2}ms {:>7.1}x",
            s.op,
            ms(lp50),
            ms(lp99),
            ms(cp50),
            ms(cp99),
            ratio
        );
        json.push(format!(
            "{{\"op\":\"{}\",\"crate_p50_ms\":{:.3},\"crate_p99_ms\":{:.3},\"cli_p50_ms\":{:.3},\"cli_p99_ms\":{:.3},\"ratio_p50\":{:.2}}}",
            s.op, ms(lp50), ms(lp99), ms(cp50), ms(cp99), ratio
        ));
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("ceph-rbd-ops.json");
    if std::fs::write(
        &path,
        format!("{{\"rounds\":{rounds},\"ops\":[{}]}}\n", json.join(",")),
    )
    .is_ok()
    {
        println!("wrote {}", path.display());
    }
}

async fn timed_async<T>(f: impl std::future::Future<Output = T>) -> (Duration, T) {
    let t = Instant::now();
    let r = f.await;
    (t.elapsed(), r)
}
