//! A program that used librbd and then simply ends (returns from `main`, as every test binary
//! does) must exit with its status, not die of SIGABRT: the connection it dropped last is shut
//! down on the reaper thread, and `exit` runs libceph-common's static destructors. Each child
//! below is this test binary run again: it opens four connections to the parent's micro cluster,
//! works on an image through each, drops them and returns at once. Without the `atexit` wait
//! (`ceph_rbd::AT_EXIT_BOUND`), 3 of 12 children died (SIGABRT or SIGSEGV).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};

const CHILD: &str = "CEPH_RBD_EXIT_CHILD";
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

#[test]
fn a_program_that_used_librbd_and_returns_exits_with_its_status() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let ceph = micro_ceph::cluster();
    let exe = std::env::current_exe().unwrap();
    let mut failures = Vec::new();
    for run in 0..RUNS {
        let image = common::unique("exit");
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "child_works_on_an_image_and_returns",
                "--test-threads=1",
            ])
            .env(CHILD, format!("{} {} {image}", ceph.monitors, ceph.pool))
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
        if !out.status.success() || stderr.contains("fatal signal") {
            failures.push(format!("run {run}: {}\n{stderr}", out.status));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {RUNS} children did not exit cleanly:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
