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

/// Holds a watch on an image through a separate client (python-rbd opening it read-write), like
/// a mapped device on a node. The watch ends when the guard is dropped.
pub struct WatchGuard(std::process::Child);

const HOLD_IMAGE_OPEN: &str = "import sys, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.connect()
io = c.open_ioctx(sys.argv[2]); img = rbd.Image(io, sys.argv[3])
print('open', flush=True); sys.stdin.read()";

impl WatchGuard {
    pub fn start(pool: &str, image: &str) -> WatchGuard {
        use std::io::BufRead;
        let c = micro_ceph::cluster();
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", HOLD_IMAGE_OPEN])
            .arg(&c.conf_path)
            .args([pool, image])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "open",
            "the watching client failed to open {pool}/{image}"
        );
        WatchGuard(child)
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}
