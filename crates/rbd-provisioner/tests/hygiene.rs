//! Secret hygiene: the provisioner and `gc` run under `strace` with a known admin key through
//! provisioning, expansion, failures (a missing secret, API faults), deletion and a gc run, at
//! trace log level. The key must appear in no log line, Event, error text, PV, PVC, process
//! argv or environment, nor in any file the processes wrote (every path they opened for
//! writing, created or renamed into, as strace saw it); /dev/shm and the like are tmpfs and
//! excluded with /proc, /sys and /dev.
//!
//! The other suites also assert the key is absent from their logs, events and objects
//! (`Harness::assert_nowhere`): failover, API faults, outages, bad input, gc.
//!
//! `cargo test -p rbd-provisioner --test hygiene`

mod support;

use std::time::Duration;

use support::{Harness, claim_names, unique_prefix, written_files};

const TRACE: &str = "trace=open,openat,creat,rename,renameat,renameat2,link,linkat,symlink,mkdir";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_never_logged_published_passed_or_written() {
    let h = Harness::start().await;
    let key = h.ceph.admin_key.clone();
    let prefix = unique_prefix("hy");
    let trace_file = h.dir.path().join("provisioner.strace");
    let trace_arg = trace_file.to_string_lossy().into_owned();
    let mut p = h.spawn_wrapped(
        &[
            "strace",
            "-f",
            "-qq",
            "--seccomp-bpf",
            "-e",
            TRACE,
            "-o",
            &trace_arg,
        ],
        &[
            "--leader-elect=false",
            "--log-level",
            "trace",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
            "--image-name-prefix",
            &prefix,
        ],
        &[],
    );
    h.create_class("rbd", &h.params(), "Delete").await;
    // a failure path: the class names a secret that is not there (yet)
    let mut missing = h.params();
    missing.retain(|(k, _)| k != "adminSecretName");
    missing.push(("adminSecretName".into(), "late-secret".into()));
    h.create_class("late", &missing, "Delete").await;
    h.create_claim("late", "late", "8Mi", false).await;
    h.wait_event("late", "ProvisioningFailed").await;
    h.create_secret(support::ADMIN_SECRET_NS, "late-secret", &[("key", &key)])
        .await;

    // API faults on the way
    h.emu
        .faults()
        .fail_next("create", "persistentvolumes", 2, 500);
    h.emu.faults().fail_next("get", "secrets", 2, 500);
    let names = claim_names("hy", 6);
    h.create_claims("rbd", &names, "8Mi").await;
    let mut all = names.clone();
    all.push("late".into());
    h.wait_all_bound(&all, Duration::from_secs(60)).await;
    h.resize_claims(&names[..2], "16Mi").await;
    let volumes = h.volumes();
    h.until("two PVs at 16Mi", Duration::from_secs(30), || {
        let volumes = volumes.clone();
        async move {
            let list = volumes.list(&Default::default()).await.ok()?;
            let grown = list
                .items
                .iter()
                .filter(|pv| provisioner::quantity::volume_capacity_bytes(pv) == Some(16 << 20))
                .count();
            (grown == 2).then_some(())
        }
    })
    .await;
    let real = p.child_pid().expect("the provisioner under strace");
    let argv = std::fs::read(format!("/proc/{real}/cmdline")).unwrap();
    let environ = std::fs::read(format!("/proc/{real}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&argv).contains(&key),
        "the key is on argv"
    );
    assert!(
        !String::from_utf8_lossy(&environ).contains(&key),
        "the key is in the environment"
    );
    // objects while they exist
    h.assert_nowhere(&key, &[]).await;

    // a gc run, traced too
    let gc_trace = h.dir.path().join("gc.strace");
    let gc = std::process::Command::new("strace")
        .args(["-f", "-qq", "--seccomp-bpf", "-e", TRACE, "-o"])
        .arg(&gc_trace)
        .arg(env!("CARGO_BIN_EXE_rbd-provisioner"))
        .args(["gc", "--log-level", "trace", "--kubeconfig"])
        .arg(&h.kubeconfig)
        .output()
        .unwrap();
    let gc_text = format!(
        "{}{}",
        String::from_utf8_lossy(&gc.stdout),
        String::from_utf8_lossy(&gc.stderr)
    );
    assert!(gc.status.success(), "{gc_text}");

    h.delete_claims(&all).await;
    h.wait_no_volumes(Duration::from_secs(60)).await;
    h.assert_all_gone(&prefix).await;
    // stop the real process (strace then exits), so the trace and the log are complete
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &real.to_string()])
        .status();
    assert!(p.wait_exit(Duration::from_secs(15)).is_some());

    let log = p.log_text();
    assert!(log.contains("image created"), "trace log is empty?");
    h.assert_nowhere(&key, &[log, gc_text]).await;
    let traces = [
        std::fs::read_to_string(&trace_file).unwrap(),
        std::fs::read_to_string(&gc_trace).unwrap(),
    ];
    for t in &traces {
        // strace saw the processes (they open their shared libraries at least)
        assert!(t.contains("openat("), "empty trace");
    }
    let mut written = written_files(&traces[0]);
    written.extend(written_files(&traces[1]));
    for file in &written {
        let content = std::fs::read(file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&content).contains(&key),
            "{} holds the key",
            file.display()
        );
    }
    eprintln!(
        "RELIABILITY hygiene: files written by the provisioner and gc (outside /proc,/sys,/dev): \
         {written:?}; key found in none, nor in logs, events, PVs, PVCs, argv, environment"
    );
}
