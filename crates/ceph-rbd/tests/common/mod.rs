//! Shared setup: the test binary's micro cluster and a connection to it.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ceph_rbd::{Cluster, ClusterConfig, ConnectionPool, PoolOptions, Secret};

pub fn config() -> ClusterConfig {
    let c = micro_ceph::cluster();
    ClusterConfig::new(
        c.monitors.clone(),
        "admin",
        Secret::new(c.admin_key.clone()),
    )
    .with_connect_timeout(Duration::from_secs(10))
    .with_op_timeout(Duration::from_secs(10))
}

pub fn pool_name() -> String {
    micro_ceph::cluster().pool.clone()
}

pub async fn connect() -> Arc<Cluster> {
    ConnectionPool::new(PoolOptions::default())
        .get(&config())
        .await
        .unwrap()
}

/// A connection, the test pool, and a fresh image of `size` bytes named after `prefix`.
pub async fn with_image(prefix: &str, size: u64) -> (Arc<Cluster>, String, String) {
    let cluster = connect().await;
    let (pool, name) = (pool_name(), unique(prefix));
    cluster
        .create_image(&pool, &name, size, &ceph_rbd::CreateOptions::default())
        .await
        .unwrap();
    (cluster, pool, name)
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh, valid cephx key that no user has.
pub fn foreign_key() -> String {
    let out = std::process::Command::new("ceph-authtool")
        .arg("--gen-print-key")
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// `rbd snap ls --all --format json` of `spec/name` (`spec`: `pool` or `pool/namespace`): every
/// snapshot of every namespace, as the CLI reports it.
pub fn cli_snapshots(spec: &str, name: &str) -> Vec<serde_json::Value> {
    let out = micro_ceph::cluster()
        .rbd(&[
            "snap",
            "ls",
            "--all",
            "--format",
            "json",
            &format!("{spec}/{name}"),
        ])
        .unwrap();
    serde_json::from_str(&out).unwrap()
}
