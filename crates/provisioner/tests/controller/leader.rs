//! Leader election between controllers.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube_emulator::Emulator;
use provisioner::ControllerError;
use provisioner::leader::lease_name_for;

use crate::common::backend::FakeBackend;
use crate::common::*;

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
}

async fn wait_for_holder(client: &kube::Client, identity: &str) -> Lease {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    wait_for(&leases, &lease_name_for(PROVISIONER), identity, |l| {
        holder(l) == Some(identity)
    })
    .await
}

async fn bind_all(client: &kube::Client, prefix: &str, count: usize) {
    for i in 0..count {
        create_claim(client, &claim(&format!("{prefix}-{i}"), "fast", "1Gi")).await;
    }
    for i in 0..count {
        wait_for(&claims(client), &format!("{prefix}-{i}"), "Bound", |c| {
            phase(c) == Some("Bound")
        })
        .await;
    }
}

#[tokio::test]
async fn only_the_leader_provisions_and_a_successor_takes_over_after_release() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let (backend_a, backend_b) = (FakeBackend::new(), FakeBackend::new());
    let a = start_elected(client.clone(), config(), backend_a.clone(), "a");
    let lease = wait_for_holder(&client, "a").await;
    assert_eq!(lease.spec.as_ref().unwrap().lease_duration_seconds, Some(1));
    // On the wire, MicroTime fields carry exactly six fractional digits.
    let raw = client
        .request_text(
            http::Request::get(format!(
                "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{}",
                lease_name_for(PROVISIONER)
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .unwrap();
    let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
    for field in ["renewTime", "acquireTime"] {
        let time = raw["spec"][field].as_str().unwrap();
        let fraction = time.split('.').nth(1).unwrap_or_default();
        assert_eq!(fraction.len(), 7, "{field} = {time}");
    }
    let b = start_elected(client.clone(), config(), backend_b.clone(), "b");

    bind_all(&client, "first", 10).await;
    assert_eq!(backend_a.provisions(), 10);
    assert_eq!(backend_b.provisions(), 0, "the follower does no work");

    a.stop().await.unwrap();
    let released = tokio::time::Instant::now();
    wait_for_holder(&client, "b").await;
    // Released, not expired: the successor need not wait out the 1.5 s lease.
    assert!(
        released.elapsed() < std::time::Duration::from_millis(1000),
        "{:?}",
        released.elapsed()
    );
    bind_all(&client, "second", 5).await;
    assert_eq!(backend_a.provisions(), 10);
    assert_eq!(backend_b.provisions(), 5);
    b.stop().await.unwrap();
}

#[tokio::test]
async fn successor_takes_over_after_a_crashed_leader_lease_expires() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let (backend_a, backend_b) = (FakeBackend::new(), FakeBackend::new());
    let a = start_elected(client.clone(), config(), backend_a.clone(), "a");
    wait_for_holder(&client, "a").await;
    let b = start_elected(client.clone(), config(), backend_b.clone(), "b");
    a.crash().await; // no release: b must wait for the lease to expire
    wait_for_holder(&client, "b").await;
    bind_all(&client, "after", 3).await;
    assert_eq!(backend_b.provisions(), 3);
    b.stop().await.unwrap();
}

#[tokio::test]
async fn lost_lease_stops_all_work() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let a = start_elected(client.clone(), config(), backend.clone(), "a");
    let mut lease = wait_for_holder(&client, "a").await;
    // Someone else takes the lease (e.g. after a network partition).
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    lease.spec.as_mut().unwrap().holder_identity = Some("intruder".to_owned());
    lease.spec.as_mut().unwrap().lease_duration_seconds = Some(3600);
    leases
        .replace(&lease_name_for(PROVISIONER), &PostParams::default(), &lease)
        .await
        .unwrap();

    let result = tokio::time::timeout(DEADLINE, a.handle)
        .await
        .expect("controller stops")
        .unwrap();
    assert!(
        matches!(result, Err(ControllerError::LeaseLost)),
        "{result:?}"
    );
    create_claim(&client, &claim("orphan", "fast", "1Gi")).await;
    // Nothing provisions it any more; prove it against a fresh controller that is not elected.
    let observer = start(client.clone(), config(), FakeBackend::new(), false);
    wait_for(&claims(&client), "orphan", "Bound", |c| {
        phase(c) == Some("Bound")
    })
    .await;
    assert_eq!(backend.provisions(), 0);
    observer.stop().await.unwrap();
}

#[tokio::test]
async fn two_elected_controllers_racing_over_200_claims_create_one_volume_each() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let a = start_elected(client.clone(), config(), Arc::clone(&backend), "a");
    wait_for_holder(&client, "a").await;
    let b = start_elected(client.clone(), config(), Arc::clone(&backend), "b");
    for i in 0..200 {
        create_claim(&client, &claim(&format!("c-{i}"), "fast", "1Gi")).await;
        if i == 100 {
            a.handle.abort(); // the leader dies in the middle of the burst
        }
    }
    for i in 0..200 {
        wait_for(&claims(&client), &format!("c-{i}"), "Bound", |c| {
            phase(c) == Some("Bound")
        })
        .await;
    }
    assert_eq!(backend.volume_count(), 200);
    assert!(
        backend.created_by.lock().unwrap().values().all(|&n| n == 1),
        "one backend volume per claim"
    );
    let pvs = volumes(&client).list(&Default::default()).await.unwrap();
    assert_eq!(pvs.items.len(), 200);
    b.stop().await.unwrap();
}

/// The renew deadline is one deadline from the last successful renewal: a leader whose lease
/// requests hang gives up before its lease could expire for anyone else, even when the retry
/// period plus the renew deadline exceed the lease duration.
#[tokio::test]
async fn stalled_renewals_stop_the_leader_before_its_lease_could_expire() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let lease_duration = std::time::Duration::from_millis(1500);
    let mut le = provisioner::LeaderElectionConfig::new(PROVISIONER, NS, "a");
    le.lease_duration = lease_duration;
    le.renew_deadline = std::time::Duration::from_millis(1000);
    le.retry_period = std::time::Duration::from_millis(700);
    let controller = provisioner::Controller::new(client.clone(), config(), FakeBackend::new());
    let a = tokio::spawn(controller.run_with_leader_election(
        provisioner::LeaderElector::new(client.clone(), le),
        std::future::pending::<()>(),
    ));
    let first = wait_for_holder(&client, "a").await;
    let renew_time = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
    // Catch a renewal as it lands, then hang every later lease request.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let renewed = tokio::time::timeout(DEADLINE, async {
        loop {
            let now = leases.get(&lease_name_for(PROVISIONER)).await.unwrap();
            if renew_time(&now) != renew_time(&first) {
                break tokio::time::Instant::now();
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the leader renews");
    for verb in ["get", "update", "create"] {
        emu.faults()
            .delay_next(verb, "leases", 1000, std::time::Duration::from_secs(60));
    }
    let result = tokio::time::timeout(DEADLINE, a)
        .await
        .expect("the leader gives up")
        .unwrap();
    let stopped = renewed.elapsed();
    assert!(
        matches!(result, Err(ControllerError::LeaseLost)),
        "{result:?}"
    );
    assert!(
        stopped < lease_duration,
        "the leader stopped {stopped:?} after its last renewal landed; a successor may take over after {lease_duration:?}"
    );
}

/// A lease lost while draining after a requested stop ends the drain, but the controller ends as
/// asked (Ok: the process exits 0), not as a lost leader.
#[tokio::test]
async fn a_lease_lost_while_draining_after_a_stop_is_still_a_requested_stop() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    // provisioning hangs after creating the volume: the drain waits for it
    *backend.gate.lock().unwrap() = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    let mut config = config();
    config.shutdown_grace_period = std::time::Duration::from_secs(30);
    let mut a = start_elected(client.clone(), config, backend.clone(), "a");
    wait_for_holder(&client, "a").await;
    let created = create_claim(&client, &claim("data", "fast", "1Gi")).await;
    let pv_name = format!("pvc-{}", uid(&created));
    wait_until("the volume is being provisioned", || {
        backend.has_volume(&pv_name)
    })
    .await;
    a.request_stop();
    // then the API stops answering lease requests: the lease is lost during the drain
    for verb in ["get", "update"] {
        emu.faults()
            .delay_next(verb, "leases", 1000, std::time::Duration::from_secs(60));
    }
    let result = tokio::time::timeout(DEADLINE, a.handle)
        .await
        .expect("the controller stops")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}
