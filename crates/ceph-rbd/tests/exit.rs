//! A program that used librbd and then simply ends (returns from `main`, as every test binary
//! does) must exit with its status, not die of SIGABRT: the connection it dropped last is shut
//! down on the reaper thread, and `exit` runs libceph-common's static destructors. Each child
//! below is this test binary run again: it opens four connections to the parent's micro cluster,
//! works on an image through each, drops them and returns at once. Without the `atexit` wait
//! (`ceph_rbd::AT_EXIT_BOUND`), 3 of 12 children died (SIGABRT or SIGSEGV). A second kind of
//! child opens and drops connections without pause until it returns: with the wait registered
//! before OpenSSL's own exit cleanup (so run after it), every such child died (SIGSEGV in the
//! messenger's `EVP_CipherInit_ex`).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};

const CHILD: &str = "CEPH_RBD_EXIT_CHILD";
const CHURN_CHILD: &str = "CEPH_RBD_EXIT_CHURN_CHILD";
const CHURN_RUNS: usize = 3;
const RUNS: usize = 12;
const CONNECTIONS: usize = 4;

/// Not a test of its own: the work of one child (does nothing unless the parent started it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_works_on_an_image_and_returns() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = spec.splitn(3, ' ');
    let (Some(monitors), Some(pool), Some(image)) = (parts.next(), parts.next(), parts.next())
    else {
        panic!("{CHILD}: {spec}");
    };
    let key = std::io::read_to_string(std::io::stdin()).expect("the key on stdin");
    let mut clusters = Vec::new();
    for n in 0..CONNECTIONS {
        // a pool of its own each: as many connections, all dropped as the test returns
        let cluster = ConnectionPool::new(PoolOptions::default())
            .get(&ClusterConfig::new(
                monitors,
                "admin",
                Secret::new(key.trim().to_string()),
            ))
            .await
            .unwrap();
        let image = format!("{image}-{n}");
        cluster
            .create_image(pool, &image, 64 << 20, &CreateOptions::default())
            .await
            .unwrap();
        cluster
            .resize_image(pool, &image, 128 << 20, false)
            .await
            .unwrap();
        cluster.remove_image(pool, &image).await.unwrap();
        clusters.push(cluster);
    }
    // the connection is dropped here; the process returns right after
}

/// Not a test of its own: the work of one churning child (does nothing unless the parent
/// started it): six tasks open a connection, list the pool's images and drop it, over and
/// over, for four seconds; the process returns while the last ones are being shut down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_churns_connections_and_returns() {
    let Ok(spec) = std::env::var(CHURN_CHILD) else {
        return;
    };
    let Some((monitors, pool)) = spec.split_once(' ') else {
        panic!("{CHURN_CHILD}: {spec}");
    };
    let key = std::io::read_to_string(std::io::stdin()).expect("the key on stdin");
    let config = ClusterConfig::new(monitors, "admin", Secret::new(key.trim().to_string()));
    let end = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (config, pool) = (config.clone(), pool.to_owned());
        tasks.push(tokio::spawn(async move {
            while std::time::Instant::now() < end {
                let cluster = ConnectionPool::new(PoolOptions::default())
                    .get(&config)
                    .await
                    .unwrap();
                cluster.list_images(&pool).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Runs this binary's test `test` alone as a child, with `var` set to `value` and the admin key
/// on its stdin: `None` when it exited cleanly (its one test passed, no fatal signal), else
/// what it printed.
fn run_child(test: &str, var: &str, value: String) -> Option<String> {
    let ceph = micro_ceph::cluster();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1"])
        .env(var, value)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the key through a pipe: never in argv, the environment or a file
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(ceph.admin_key.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let clean =
        out.status.success() && !stderr.contains("fatal signal") && stdout.contains("1 passed");
    (!clean).then(|| format!("{}\n{stdout}\n{stderr}", out.status))
}

#[test]
fn a_program_that_used_librbd_and_returns_exits_with_its_status() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CHURN_CHILD).is_some() {
        return;
    }
    let ceph = micro_ceph::cluster();
    let failures: Vec<String> = (0..RUNS)
        .filter_map(|run| {
            let image = common::unique("exit");
            run_child(
                "child_works_on_an_image_and_returns",
                CHILD,
                format!("{} {} {image}", ceph.monitors, ceph.pool),
            )
            .map(|failure| format!("run {run}: {failure}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {RUNS} children did not exit cleanly:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_program_that_drops_connections_as_it_returns_exits_with_its_status() {
    if std::env::var_os(CHILD).is_some() || std::env::var_os(CHURN_CHILD).is_some() {
        return;
    }
    let ceph = micro_ceph::cluster();
    let failures: Vec<String> = (0..CHURN_RUNS)
        .filter_map(|run| {
            run_child(
                "child_churns_connections_and_returns",
                CHURN_CHILD,
                format!("{} {}", ceph.monitors, ceph.pool),
            )
            .map(|failure| format!("run {run}: {failure}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {CHURN_RUNS} churning children did not exit cleanly:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
