//! QoS limits against a private Ceph cluster: `apply` writes librbd image configuration that
//! librbd itself reports (`rbd config image get`, which resolves options through librbd), is
//! idempotent, leaves keys it was not given alone, and refuses a burst below a stored limit
//! without writing anything; a librbd client (`rbd bench`) is held to an IOPS limit set so, and
//! so is a client that had the image open before the limit was set (python-rbd).

use std::collections::BTreeMap;

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};
use rbd_volume::qos;

const MIB: u64 = 1 << 20;

async fn cluster() -> std::sync::Arc<ceph_rbd::Cluster> {
    let ceph = micro_ceph::cluster();
    let pool = ConnectionPool::new(PoolOptions::default());
    pool.get(&ClusterConfig::new(
        &ceph.monitors,
        "admin",
        Secret::new(ceph.admin_key.clone()),
    ))
    .await
    .unwrap()
}

async fn image(cluster: &ceph_rbd::Cluster, name: &str) -> String {
    let pool = &micro_ceph::cluster().pool;
    cluster
        .create_image(pool, name, 8 * MIB, &CreateOptions::default())
        .await
        .unwrap();
    format!("{pool}/{name}")
}

/// What librbd resolves for the option on this image (image config overrides pool and client).
fn librbd_value(spec: &str, option: &str) -> String {
    micro_ceph::cluster()
        .rbd(&["config", "image", "get", spec, option])
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn applied_limits_are_image_configuration_librbd_reports() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let spec = image(&cluster, "qos-apply").await;
    let wanted = qos::parse([
        ("rbd_qos_iops_limit", "500"),
        ("rbd_qos_iops_burst", "1k"),
        ("rbd_qos_write_bps_limit", "10Mi"),
    ])
    .unwrap();

    let applied = qos::apply(&cluster, pool, "qos-apply", &wanted)
        .await
        .unwrap();
    assert_eq!(applied.changed.len(), 3);
    assert_eq!(applied.now, wanted);

    let meta = cluster.metadata_list(pool, "qos-apply").await.unwrap();
    assert_eq!(
        meta.get("conf_rbd_qos_iops_limit").map(String::as_str),
        Some("500")
    );
    assert_eq!(
        meta.get("conf_rbd_qos_iops_burst").map(String::as_str),
        Some("1000")
    );
    assert_eq!(
        meta.get("conf_rbd_qos_write_bps_limit").map(String::as_str),
        Some("10485760")
    );
    assert_eq!(librbd_value(&spec, "rbd_qos_iops_limit"), "500");
    assert_eq!(librbd_value(&spec, "rbd_qos_write_bps_limit"), "10485760");
    assert_eq!(
        qos::read(&cluster, pool, "qos-apply").await.unwrap(),
        wanted
    );
}

#[tokio::test]
async fn apply_is_idempotent_and_leaves_absent_keys_alone() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let spec = image(&cluster, "qos-idem").await;
    let first = qos::parse([("rbd_qos_iops_limit", "100"), ("rbd_qos_bps_limit", "1Mi")]).unwrap();
    qos::apply(&cluster, pool, "qos-idem", &first)
        .await
        .unwrap();

    let again = qos::apply(&cluster, pool, "qos-idem", &first)
        .await
        .unwrap();
    assert!(again.changed.is_empty(), "{:?}", again.changed);

    // A second class that names only the IOPS limit: the bps limit stays; 0 lifts the limit.
    let second = qos::parse([("rbd_qos_iops_limit", "0")]).unwrap();
    let applied = qos::apply(&cluster, pool, "qos-idem", &second)
        .await
        .unwrap();
    assert_eq!(applied.changed, BTreeMap::from([("rbd_qos_iops_limit", 0)]));
    assert_eq!(librbd_value(&spec, "rbd_qos_iops_limit"), "0");
    assert_eq!(librbd_value(&spec, "rbd_qos_bps_limit"), "1048576");
}

#[tokio::test]
async fn a_limit_above_a_stored_burst_is_refused_and_nothing_is_written() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    image(&cluster, "qos-burst").await;
    let first = qos::parse([("rbd_qos_bps_limit", "1Mi"), ("rbd_qos_bps_burst", "2Mi")]).unwrap();
    qos::apply(&cluster, pool, "qos-burst", &first)
        .await
        .unwrap();

    let higher = qos::parse([("rbd_qos_bps_limit", "4Mi"), ("rbd_qos_iops_limit", "7")]).unwrap();
    let err = qos::apply(&cluster, pool, "qos-burst", &higher)
        .await
        .unwrap_err();
    assert!(err.is_invalid());
    let text = err.to_string();
    assert!(text.contains("rbd_qos_bps_burst=2097152"), "{text}");
    assert!(text.contains("rbd_qos_bps_limit=4194304"), "{text}");
    assert_eq!(qos::read(&cluster, pool, "qos-burst").await.unwrap(), first);
}

#[tokio::test]
async fn missing_image_is_a_ceph_not_found_not_an_invalid_parameter() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let wanted = qos::parse([("rbd_qos_iops_limit", "5")]).unwrap();
    let err = qos::apply(&cluster, pool, "qos-missing", &wanted)
        .await
        .unwrap_err();
    assert!(!err.is_invalid());
    assert!(
        matches!(&err, qos::QosError::Ceph(e) if e.is_not_found()),
        "{err}"
    );
}

/// `rbd bench` (a librbd client) writing `ops` 4 KiB blocks to `spec`; returns the seconds it
/// took.
fn bench_writes(spec: &str, ops: u32) -> f64 {
    let started = std::time::Instant::now();
    micro_ceph::cluster()
        .rbd(&[
            "bench",
            spec,
            "--io-type",
            "write",
            "--io-size",
            "4K",
            "--io-threads",
            "1",
            "--io-total",
            &format!("{}K", 4 * ops),
            "--rbd-cache=false",
        ])
        .unwrap();
    started.elapsed().as_secs_f64()
}

#[tokio::test]
async fn a_librbd_client_is_held_to_the_iops_limit() {
    let cluster = cluster().await;
    let pool = &micro_ceph::cluster().pool;
    let spec = image(&cluster, "qos-enforced").await;
    let unlimited = bench_writes(&spec, 60);
    // 20 writes a second (burst = limit): 60 writes take about 3 s
    let limit = qos::parse([("rbd_qos_write_iops_limit", "20")]).unwrap();
    qos::apply(&cluster, pool, "qos-enforced", &limit)
        .await
        .unwrap();
    let limited = bench_writes(&spec, 60);
    eprintln!("60 writes: {unlimited:.2} s unlimited, {limited:.2} s at 20/s");
    assert!(
        limited >= 2.0 && limited - unlimited >= 1.5,
        "60 writes took {limited:.2} s with a limit of 20/s, {unlimited:.2} s without"
    );
}

/// A python-rbd client that opens the image, writes 60 4 KiB blocks, waits for a line on
/// stdin, writes 60 more; prints the seconds each round took.
const OPEN_CLIENT: &str = "import sys, time, rados, rbd
c = rados.Rados(conffile=sys.argv[1]); c.conf_set('rbd_cache', 'false'); c.connect()
io = c.open_ioctx(sys.argv[2]); img = rbd.Image(io, sys.argv[3])
def run():
    t = time.time()
    for i in range(60): img.write(b'x' * 4096, i * 4096)
    return time.time() - t
print(run(), flush=True)
sys.stdin.readline()
print(run(), flush=True)
img.close(); io.close(); c.shutdown()";

#[tokio::test]
async fn a_limit_set_later_reaches_an_image_already_open() {
    use std::io::{BufRead, Write};
    let cluster = cluster().await;
    let ceph = micro_ceph::cluster();
    image(&cluster, "qos-open").await;
    let mut client = std::process::Command::new("/usr/bin/python3")
        .args(["-c", OPEN_CLIENT])
        .arg(&ceph.conf_path)
        .args([ceph.pool.as_str(), "qos-open"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let before: f64 = line.trim().parse().unwrap();
    let limit = qos::parse([("rbd_qos_write_iops_limit", "20")]).unwrap();
    qos::apply(&cluster, &ceph.pool, "qos-open", &limit)
        .await
        .unwrap();
    // librbd refreshes an open image when its header changes (metadata set notifies)
    client.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let after: f64 = line.trim().parse().unwrap();
    drop(client.stdin.take());
    client.wait().unwrap();
    eprintln!("60 writes on the open image: {before:.2} s before, {after:.2} s after the limit");
    assert!(
        after >= 2.0 && after - before >= 1.5,
        "60 writes took {after:.2} s after a limit of 20/s, {before:.2} s before"
    );
}
