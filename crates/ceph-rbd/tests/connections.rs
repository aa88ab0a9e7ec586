//! Connecting: credentials, timeouts, pooling, reconnection, concurrency, secret hygiene.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, Error, PoolOptions, Secret};
use common::*;

#[tokio::test]
async fn a_wrong_key_is_permission_denied_and_never_shown() {
    let c = micro_ceph::cluster();
    let key = foreign_key();
    let cfg = ClusterConfig::new(c.monitors.clone(), "admin", Secret::new(key.clone()))
        .with_connect_timeout(Duration::from_secs(5));
    let e = ConnectionPool::default().get(&cfg).await.unwrap_err();
    assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(!text.contains(&key), "key leaked: {text}");
    assert!(text.contains("client.admin"), "{text}");
}

#[tokio::test]
async fn an_unknown_user_is_refused() {
    let c = micro_ceph::cluster();
    let cfg = ClusterConfig::new(c.monitors.clone(), "nobody", Secret::new(foreign_key()))
        .with_connect_timeout(Duration::from_secs(5));
    let e = ConnectionPool::default().get(&cfg).await.unwrap_err();
    assert!(matches!(e, Error::PermissionDenied { .. }), "{e:?}");
}

#[tokio::test]
async fn unreachable_monitors_time_out_within_the_bound() {
    let bound = Duration::from_secs(2);
    // a port where nothing listens
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = ClusterConfig::new(
        format!("127.0.0.1:{port}"),
        "admin",
        Secret::new(foreign_key()),
    )
    .with_connect_timeout(bound);
    let started = Instant::now();
    let e = ConnectionPool::default().get(&cfg).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(took < bound + Duration::from_secs(3), "took {took:?}");
}

/// A key of Ceph 20.2's default type, `aes256k` (cipher 2, a 32-byte secret), in the text
/// form `ceph auth print-key` gives.
fn aes256k_key() -> String {
    let mut bytes = 2u16.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0x60, 0xc6, 0xa6, 0x66, 0, 0, 0, 0]);
    bytes.extend_from_slice(&32u16.to_le_bytes());
    bytes.extend((0u8..32).map(|i| i.wrapping_mul(37).wrapping_add(11)));
    base64_encode(&bytes)
}

fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn a_key_of_a_type_this_client_cannot_read_is_named_by_its_type() {
    let c = micro_ceph::cluster();
    let key = aes256k_key();
    let cfg = ClusterConfig::new(c.monitors.clone(), "admin", Secret::new(key.clone()))
        .with_connect_timeout(Duration::from_secs(5));
    let e = ConnectionPool::default().get(&cfg).await.unwrap_err();
    let text = e.to_string();
    // a client that reads aes256k keys gets past the parse and is refused by the cluster
    if ceph_rbd::key::client_version().starts_with("16.") {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert!(text.contains("of type aes256k"), "{text}");
        assert!(text.contains("--key-type aes"), "{text}");
        assert!(text.contains(&ceph_rbd::key::client_version()), "{text}");
    }
    assert!(text.contains("client.admin"), "{text}");
    assert!(!format!("{e:?} {text}").contains(&key), "key leaked: {e:?}");
}

/// The test cluster's own admin key: on a cluster whose release makes keys this client cannot
/// read (Tentacle's aes256k default, for a client before 19.2.6) the refusal names the key type;
/// otherwise it connects. Run against Tentacle with its defaults by scripts/test.sh.
#[tokio::test]
async fn the_clusters_own_admin_key_connects_or_is_refused_by_its_type() {
    let c = micro_ceph::cluster();
    let cfg = ClusterConfig::new(
        c.monitors.clone(),
        "admin",
        Secret::new(c.admin_key.clone()),
    )
    .with_connect_timeout(Duration::from_secs(10));
    let result = ConnectionPool::default().get(&cfg).await;
    match ceph_rbd::key::check_usable(&c.admin_key) {
        Ok(kind) => {
            let connected = result.map(|_| ());
            assert_eq!(connected, Ok(()), "a {kind} key");
        }
        Err(reason) => {
            let e = result.expect_err("a key this client cannot use connected");
            let text = e.to_string();
            assert!(text.contains(&reason), "{text}");
            assert!(!text.contains(&c.admin_key), "key leaked: {text}");
            eprintln!("refused as expected: {text}");
        }
    }
}

#[tokio::test]
async fn a_malformed_key_is_named_malformed() {
    let c = micro_ceph::cluster();
    let key = "AQBgxqZmAAAAABAAvb0yEnMIFSMAwOvUv2sg".to_string(); // cut short
    let cfg = ClusterConfig::new(c.monitors.clone(), "admin", Secret::new(key.clone()))
        .with_connect_timeout(Duration::from_secs(5));
    let e = ConnectionPool::default().get(&cfg).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("the key is malformed"), "{text}");
    assert!(!format!("{e:?} {text}").contains(&key), "key leaked: {e:?}");
}

#[test]
fn the_linked_client_release_is_known() {
    let version = ceph_rbd::key::client_version();
    assert!(
        version.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "{version}"
    );
}

/// A `tracing` writer into a shared buffer, to check what the crate logs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn logs_of_a_failing_connect_do_not_contain_the_key() {
    let c = micro_ceph::cluster();
    let key = foreign_key();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let cfg = ClusterConfig::new(c.monitors.clone(), "admin", Secret::new(key.clone()))
        .with_connect_timeout(Duration::from_secs(5));
    tracing::info!(config = ?cfg, "connecting");
    let e = ConnectionPool::default().get(&cfg).await.unwrap_err();
    tracing::warn!(error = %e, "connect failed");
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("connect failed"), "nothing captured: {logs}");
    assert!(logs.contains("<redacted>"), "{logs}");
    assert!(!logs.contains(&key), "key leaked into logs: {logs}");
}

#[tokio::test]
async fn the_pool_shares_one_connection_per_credentials() {
    let pool = ConnectionPool::new(PoolOptions::default());
    let a = pool.get(&config()).await.unwrap();
    let b = pool.get(&config()).await.unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(pool.len(), 1);
    // concurrent first use connects once
    let pool2 = ConnectionPool::default();
    let cfg = config();
    let got = futures::future::join_all((0..8).map(|_| pool2.get(&cfg))).await;
    let first = got[0].as_ref().unwrap();
    assert!(got.iter().all(|g| Arc::ptr_eq(g.as_ref().unwrap(), first)));
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let pool = ConnectionPool::new(PoolOptions {
        idle_timeout: Duration::from_millis(100),
    });
    let connection = pool.get(&config()).await.unwrap();
    // a weak reference keeps the allocation (so a new connection cannot reuse its address)
    // without keeping the connection open
    let first = Arc::downgrade(&connection);
    drop(connection);
    tokio::time::sleep(Duration::from_millis(150)).await; // let the idle period pass (that is the behaviour)
    let second = pool.get(&config()).await.unwrap();
    assert!(
        first.upgrade().is_none(),
        "an idle connection was kept open"
    );
    assert!(
        !std::ptr::eq(Arc::as_ptr(&second), first.as_ptr()),
        "an idle connection was reused"
    );
    assert_eq!(pool.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_creates_and_removes_leak_nothing() {
    let pool = ConnectionPool::default();
    let cluster = pool.get(&config()).await.unwrap();
    let p = pool_name();
    // warm up: sessions to the mon and the OSD exist before we count
    let warm = unique("warm");
    cluster
        .create_image(&p, &warm, 1 << 20, &CreateOptions::default())
        .await
        .unwrap();
    cluster.remove_image(&p, &warm).await.unwrap();
    let fds_before = open_fds();

    let names: Vec<String> = (0..64).map(|_| unique("many")).collect();
    let creates = names.iter().map(|n| {
        let (c, p) = (cluster.clone(), p.clone());
        async move {
            c.create_image(&p, n, 4 << 20, &CreateOptions::default())
                .await
        }
    });
    for r in futures::future::join_all(creates).await {
        r.unwrap();
    }
    let listed = cluster.list_images(&p).await.unwrap();
    assert!(names.iter().all(|n| listed.contains(n)));
    let removes = names.iter().map(|n| {
        let (c, p) = (cluster.clone(), p.clone());
        async move { c.remove_image(&p, n).await }
    });
    for r in futures::future::join_all(removes).await {
        r.unwrap();
    }
    let listed = cluster.list_images(&p).await.unwrap();
    assert!(names.iter().all(|n| !listed.contains(n)));
    let fds_after = open_fds();
    assert!(
        fds_after <= fds_before,
        "fds grew from {fds_before} to {fds_after}"
    );
    assert_eq!(pool.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_osd_outage_times_out_bounds_blocked_threads_and_keeps_the_connection() {
    // a cluster of its own: this test freezes the OSD
    let owned = tokio::task::spawn_blocking(micro_ceph::MicroCeph::start)
        .await
        .unwrap()
        .unwrap();
    let cfg = ClusterConfig::new(
        owned.monitors.clone(),
        "admin",
        Secret::new(owned.admin_key.clone()),
    )
    .with_connect_timeout(Duration::from_secs(3))
    .with_op_timeout(Duration::from_secs(2));
    let pool = ConnectionPool::default();
    let cluster = pool.get(&cfg).await.unwrap();
    let name = unique("outage");
    cluster
        .create_image(&owned.pool, &name, 1 << 20, &CreateOptions::default())
        .await
        .unwrap();

    /// Thaws the OSD on every path, also when an assertion fails (a frozen OSD would keep the
    /// stuck librbd call, and so the test runtime, from ever finishing).
    struct Thaw<'a>(&'a micro_ceph::MicroCeph);
    impl Drop for Thaw<'_> {
        fn drop(&mut self) {
            self.0.pause_daemon("osd.0", false);
        }
    }
    assert!(owned.pause_daemon("osd.0", true));
    let thaw = Thaw(&owned);
    let started = Instant::now();
    let e = cluster
        .resize_image(&owned.pool, &name, 2 << 20, false)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    // a slow OSD is not a broken connection: it is kept (librados reconnects by itself)
    assert!(cluster.is_healthy() && !cluster.is_responsive());

    // a long outage does not grow threads without limit: at most MAX_CALLS_PER_CONNECTION
    // calls wait inside librbd, the others time out without a thread
    let stuck: Vec<_> = (0..3 * ceph_rbd::MAX_CALLS_PER_CONNECTION)
        .map(|i| {
            let (cluster, pool_name) = (Arc::clone(&cluster), owned.pool.clone());
            tokio::spawn(
                async move { cluster.image_info(&pool_name, &format!("frozen-{i}")).await },
            )
        })
        .collect();
    let mut most_busy = 0;
    for task in stuck {
        most_busy = most_busy.max(cluster.calls_running());
        let e = task.await.unwrap().unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
    }
    assert!(
        most_busy <= ceph_rbd::MAX_CALLS_PER_CONNECTION,
        "{most_busy} blocking calls at once"
    );

    // the timed-out resize is still blocked in librbd: no second handle may change that image
    let e = cluster
        .metadata_set(&owned.pool, &name, "k", "v")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InProgress { .. }), "{e:?}");
    drop(thaw);

    let again = pool.get(&cfg).await.unwrap();
    assert!(
        Arc::ptr_eq(&again, &cluster),
        "a connection that only timed out was replaced"
    );
    // once the OSD answers, the stuck resize completes and the image is free again
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match again.metadata_set(&owned.pool, &name, "k", "v").await {
            Ok(()) => break,
            Err(Error::InProgress { .. }) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(
        again.image_info(&owned.pool, &name).await.unwrap().size,
        2 << 20
    );
}
