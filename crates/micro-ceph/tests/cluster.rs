//! The shared cluster is usable with the keys it reports, and stops when the binary exits.

#[test]
fn rbd_create_list_remove_work_with_the_reported_keys() {
    let c = micro_ceph::cluster();
    assert!(c.monitors.starts_with("127.0.0.1:"), "{}", c.monitors);
    assert!(!c.admin_key.is_empty());
    let spec = format!("{}/micro-ceph-selftest", c.pool);
    c.rbd(&["create", "--size", "16M", &spec]).unwrap();
    let ls = c.rbd(&["ls", &c.pool]).unwrap();
    assert!(ls.lines().any(|l| l == "micro-ceph-selftest"), "{ls}");
    c.rbd(&["rm", "--no-progress", &spec]).unwrap();
    let ls = c.rbd(&["ls", &c.pool]).unwrap();
    assert!(!ls.lines().any(|l| l == "micro-ceph-selftest"), "{ls}");
}

#[test]
fn rbd_cli_works_with_monitors_and_key_alone() {
    // What a StorageClass gives us: monitors + key, no ceph.conf, no keyring file.
    let c = micro_ceph::cluster();
    let out = std::process::Command::new("rbd")
        .env_remove("CEPH_CONF")
        .args([
            "-m",
            &c.monitors,
            "--id",
            "admin",
            "--key",
            &c.admin_key,
            "ls",
            &c.pool,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_owned_cluster_is_stopped_and_removed_on_drop() {
    let owned = micro_ceph::MicroCeph::start().unwrap();
    let dir = owned.dir.clone();
    let mon = owned.daemon_pid("mon.a").unwrap();
    assert_ne!(owned.mon_port, micro_ceph::cluster().mon_port);
    drop(owned);
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(
        !std::path::Path::new(&format!("/proc/{mon}")).exists()
            || std::fs::read_to_string(format!("/proc/{mon}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true),
        "mon {mon} still running"
    );
}
