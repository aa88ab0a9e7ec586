//! The PV controller slice under load: kube-controller-manager's client rate limit
//! (`EmulatorBuilder::controller_client_limit`, off by default) and its indexes (a burst of claims
//! must cost O(N), not O(N^2)).

mod common;

use std::time::Duration;

use common::{pvc, storage_class};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube_emulator::{Emulator, EmulatorBuilder};

const KCM_CLIENT_QPS: f64 = EmulatorBuilder::KCM_CLIENT_QPS;
const KCM_CLIENT_BURST: u32 = EmulatorBuilder::KCM_CLIENT_BURST;
use serde_json::json;
use tokio::time::Instant;

const CLASS: &str = "rbd-immediate";

/// One write of the controller as a client sees it (watch event and when it arrived).
#[derive(Debug)]
enum Seen {
    Claim(Box<PersistentVolumeClaim>),
    Volume,
    Event,
}

struct Run {
    /// Arrival time of each controller write, in order.
    writes: Vec<Instant>,
    /// When the emulator (and so its token buckets) was built.
    built: Instant,
}

/// Creates `n` claims, waits until the controller annotated them all, creates their pre-bound PVs
/// (as a provisioner does) and collects every controller write until all claims are Bound: per
/// claim the annotation, the `ExternalProvisioning` event, PV status, claim, claim status.
async fn provision_and_bind(emu: Emulator, built: Instant, n: usize) -> Run {
    let client = emu.client();
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let events: Api<Event> = Api::default_namespaced(client.clone());
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &storage_class(CLASS, false, false))
        .await
        .unwrap();
    let rv = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default();
    let claim_watch = claims
        .watch(&wp, &rv)
        .await
        .unwrap()
        .map_ok(|e| match e {
            WatchEvent::Modified(c) => Some(Seen::Claim(Box::new(c))),
            _ => None,
        })
        .boxed();
    let pv_watch = pvs
        .watch(&wp, &rv)
        .await
        .unwrap()
        .map_ok(|e| matches!(e, WatchEvent::Modified(_)).then_some(Seen::Volume))
        .boxed();
    let event_watch = events
        .watch(&wp, &rv)
        .await
        .unwrap()
        .map_ok(|e| {
            matches!(e, WatchEvent::Added(_) | WatchEvent::Modified(_)).then_some(Seen::Event)
        })
        .boxed();
    let mut seen = futures::stream::select_all([claim_watch, pv_watch, event_watch]);

    let mut created = Vec::new();
    for i in 0..n {
        created.push(
            claims
                .create(
                    &PostParams::default(),
                    &pvc(&format!("claim-{i:03}"), Some(CLASS), "1Gi"),
                )
                .await
                .unwrap(),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut writes = Vec::new();
    let mut annotated = 0;
    let mut bound = 0;
    let mut pvs_created = false;
    while bound < n || writes.len() < 5 * n {
        let next = tokio::time::timeout_at(deadline, seen.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "deadline: {} writes, {annotated} annotated, {bound} bound",
                    writes.len()
                )
            })
            .expect("watch ended")
            .unwrap();
        let Some(write) = next else { continue };
        writes.push(Instant::now());
        if let Seen::Claim(c) = write {
            let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Bound") {
                bound += 1;
            } else if c.spec.as_ref().unwrap().volume_name.is_none() {
                annotated += 1;
            }
        }
        if annotated == n && !pvs_created {
            pvs_created = true;
            for c in &created {
                pvs.create(
                    &PostParams::default(),
                    &common::prebound_pv(c, CLASS, "1Gi"),
                )
                .await
                .unwrap();
            }
        }
    }
    assert_eq!(bound, n);
    assert_eq!(
        writes.len(),
        5 * n,
        "five controller writes per claim, as the recordings"
    );
    Run { writes, built }
}

fn limited() -> (Emulator, Instant) {
    let built = Instant::now();
    let emu = Emulator::builder()
        .resync_period(Duration::from_secs(3600))
        .controller_client_limit(KCM_CLIENT_QPS, KCM_CLIENT_BURST)
        .build();
    (emu, built)
}

#[tokio::test]
async fn the_client_limit_bounds_the_binders_write_rate() {
    let (emu, built) = limited();
    let n = 20;
    let run = provision_and_bind(emu, built, n).await;
    // A token bucket lets at most burst + qps * t requests through in the first t seconds; a
    // client sees each write after it happened, so the bound holds for arrival times too.
    for (i, at) in run.writes.iter().enumerate() {
        let t = at.duration_since(run.built).as_secs_f64();
        let allowed = f64::from(KCM_CLIENT_BURST) + KCM_CLIENT_QPS * t;
        assert!(
            (i + 1) as f64 <= allowed + 1e-6,
            "write {} at {t:.3} s exceeds the bucket ({allowed:.1})",
            i + 1
        );
    }
    // 100 writes through a 20/s bucket that starts with 30: at least 3.5 s
    let last = run.writes.last().unwrap().duration_since(run.built);
    assert!(
        last >= Duration::from_millis(3450),
        "all {} writes within {last:?}",
        run.writes.len()
    );
}

#[tokio::test]
async fn without_a_limit_the_writes_are_not_paced() {
    let built = Instant::now();
    let emu = Emulator::builder()
        .resync_period(Duration::from_secs(3600))
        .build();
    let run = provision_and_bind(emu, built, 20).await;
    let last = run.writes.last().unwrap().duration_since(run.built);
    // the same 100 writes as above, far faster than a 20/s bucket would let them through
    assert!(last < Duration::from_millis(3450), "{last:?}");
}

/// Lists until `done` holds for the listed objects (polling: a watch of 5000 objects outruns a
/// debug-build reader and is ended by the emulator's queue limit).
async fn wait_listed<K>(api: &Api<K>, deadline: Instant, what: &str, done: impl Fn(&[K]) -> bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    loop {
        let items = api.list(&ListParams::default()).await.unwrap().items;
        let now = Instant::now();
        assert!(
            now <= deadline,
            "{what}: deadline passed {:?} ago",
            now - deadline
        );
        if done(&items) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 5000 volumes pre-bound by claim name (no uid, so not named after it), then their 5000 claims,
/// then all claims deleted. Each claim sync looks for a volume pre-bound to it and each claim
/// deletion for the volumes that name it: by the controller's index, not by a scan of all PVs
/// (which made this 2 x 25 million PV checks).
///
/// Deadline, per phase (creates or deletes sent + controller done): 40 s. Measured on the shared
/// 2-core test machine in a debug build, other builds running: with the index 6.7 s to bind and
/// 4.7 s to release (mostly the test's own requests through the in-process client); without it
/// (this test against the tree before the index) 92 s and 191 s. 40 s leaves 6x for a slower
/// machine and fails the quadratic version by 2-5x.
#[tokio::test]
async fn five_thousand_claims_bind_and_release_without_scanning_all_volumes() {
    let n = 5000;
    let emu = Emulator::builder()
        .resync_period(Duration::from_secs(3600))
        .build();
    let client = emu.client();
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &storage_class(CLASS, false, false))
        .await
        .unwrap();
    futures::stream::iter(0..n)
        .map(|i| {
            let pvs = pvs.clone();
            async move {
                let pv: PersistentVolume = serde_json::from_value(json!({
                    "metadata": {"name": format!("vol-{i:05}")},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": CLASS,
                        "claimRef": {"namespace": "default", "name": format!("claim-{i:05}")},
                        "csi": {"driver": "rbd.example.com", "volumeHandle": format!("rbd/img{i}")}
                    }
                }))
                .unwrap();
                pvs.create(&PostParams::default(), &pv).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<()>()
        .await;

    let t0 = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let claims = claims.clone();
            async move {
                claims
                    .create(
                        &PostParams::default(),
                        &pvc(&format!("claim-{i:05}"), Some(CLASS), "1Gi"),
                    )
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<()>()
        .await;
    wait_listed(
        &claims,
        t0 + Duration::from_secs(40),
        "all claims Bound",
        |items| {
            items.len() == n
                && items.iter().all(|c| {
                    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                        && c.spec.as_ref().and_then(|s| s.volume_name.as_deref())
                            == Some(&format!(
                                "vol-{}",
                                &c.metadata.name.as_deref().unwrap()[6..]
                            ))
                })
        },
    )
    .await;
    let bind = t0.elapsed();

    let t1 = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let claims = claims.clone();
            async move {
                claims
                    .delete(&format!("claim-{i:05}"), &DeleteParams::default())
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<()>()
        .await;
    wait_listed(
        &pvs,
        t1 + Duration::from_secs(40),
        "all volumes Released",
        |items| {
            items.len() == n
                && items
                    .iter()
                    .all(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released"))
        },
    )
    .await;
    eprintln!(
        "{n} claims: bound in {bind:?}, released in {:?}",
        t1.elapsed()
    );
}
