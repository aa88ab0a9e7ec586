//! The protection finalizers' release, as external-provisioner's clone controller does for
//! `provisioner.storage.kubernetes.io/cloning-protection` (and its restore path for
//! `.../volumesnapshot-as-source-protection`): whenever a claim with a data source changes or
//! goes (Bound, deleted while Pending), its source is looked at again, and the finalizer comes
//! off once no Pending claim uses it. A source that carries one of the finalizers is looked at
//! whenever it changes, and at start, so a finalizer left by a crash (claim deleted while the
//! provisioner was down) comes off too. Run by the leader next to the provisioning controller;
//! claims come from that controller's own claim watch (a claim observer), so the process
//! watches claims once. [`protect`] puts a finalizer on before a clone or restore.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use super::{CLONE_SOURCE_FINALIZER, DataSource, SNAPSHOT_SOURCE_FINALIZER, data_source};
use crate::finalizers;
use crate::queue::{Backoff, WorkQueue};
use crate::snapshot::VolumeSnapshot;

type Key = (String, DataSource);

/// The controller: the observer to give [`crate::Controller::with_claim_observer`] (it
/// queues the sources of every claim the provisioning controller's watch sees, so claims are
/// watched once per process) and the task for [`crate::Controller::with_companion`].
#[must_use]
pub fn controller(client: Client, backoff: Backoff) -> (crate::ClaimObserver, crate::Companion) {
    let queue: WorkQueue<Key> = WorkQueue::new(backoff);
    let queued = queue.clone();
    let observer: crate::ClaimObserver =
        Arc::new(move |claim: &PersistentVolumeClaim| claim_seen(&queued, claim));
    (observer, Box::pin(run(client, queue)))
}

/// A claim changed, was listed or went: its source, and itself if it is a protected source, are
/// looked at again.
fn claim_seen(queue: &WorkQueue<Key>, claim: &PersistentVolumeClaim) {
    let ns = claim.namespace().unwrap_or_else(|| "default".into());
    if claim
        .finalizers()
        .iter()
        .any(|f| f == CLONE_SOURCE_FINALIZER)
    {
        queue.add((ns.clone(), DataSource::Claim(claim.name_any())));
    }
    if let Ok(Some(source)) = data_source(claim) {
        queue.add((ns, source));
    }
}

async fn run(client: Client, queue: WorkQueue<Key>) {
    // Held by this future: when the leader's tasks are dropped (lease lost), these go too.
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (client, queue) = (client.clone(), queue.clone());
        tasks.spawn(async move {
            while let Some(key) = queue.get().await {
                let (ns, source) = &key;
                match release_source(&client, ns, source, None).await {
                    Ok(()) => queue.forget(&key),
                    Err(e) => {
                        tracing::warn!(namespace = %ns, source = source.name(), error = %e, "releasing a protection finalizer failed; retrying");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        });
    }
    tasks.spawn(watch_snapshots(client, queue.clone()));
    // Both run until the controller stops this task; either ending ends it.
    let _ = tasks.join_next().await;
    queue.shut_down();
    tasks.abort_all();
}

/// VolumeSnapshots carrying our finalizer, once the snapshot API exists.
async fn watch_snapshots(client: Client, queue: WorkQueue<Key>) {
    let api: Api<VolumeSnapshot> = Api::all(client);
    while api.list(&ListParams::default().limit(1)).await.is_err() {
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(vs) | watcher::Event::InitApply(vs)) => {
                if vs
                    .finalizers()
                    .iter()
                    .any(|f| f == SNAPSHOT_SOURCE_FINALIZER)
                {
                    let ns = vs.namespace().unwrap_or_else(|| "default".into());
                    queue.add((ns, DataSource::Snapshot(vs.name_any())));
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "VolumeSnapshot watch failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Puts the protection finalizer on the source in `ns` before it is used (external-provisioner
/// does so before the clone or restore starts).
///
/// # Errors
/// API errors, as a message naming the source.
pub async fn protect(client: &Client, ns: &str, source: &DataSource) -> Result<(), String> {
    match source {
        DataSource::Snapshot(vs) => finalizers::add(
            &Api::<VolumeSnapshot>::namespaced(client.clone(), ns),
            vs,
            SNAPSHOT_SOURCE_FINALIZER,
        )
        .await
        .map_err(|e| {
            format!("adding finalizer {SNAPSHOT_SOURCE_FINALIZER} to VolumeSnapshot {ns}/{vs}: {e}")
        }),
        DataSource::Claim(claim) => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            finalizers::add(&api, claim, CLONE_SOURCE_FINALIZER)
                .await
                .map_err(|e| format!("adding finalizer {CLONE_SOURCE_FINALIZER} to PersistentVolumeClaim {ns}/{claim}: {e}"))
        }
    }
}

/// Whether a claim other than `except` (uid) that is not Bound yet uses `source`.
async fn still_used(
    client: &Client,
    ns: &str,
    source: &DataSource,
    except: &str,
) -> Result<bool, kube::Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claims = api.list(&ListParams::default()).await?;
    Ok(claims.items.iter().any(|c| {
        c.metadata.uid.as_deref() != Some(except)
            && c.metadata.deletion_timestamp.is_none()
            && c.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending")
                == "Pending"
            && data_source(c).ok().flatten().as_ref() == Some(source)
    }))
}

/// Drops the protection finalizer from `source` in `ns` when no Pending claim (other than the
/// one with uid `except`) uses it.
///
/// # Errors
/// API errors.
pub async fn release_source(
    client: &Client,
    ns: &str,
    source: &DataSource,
    except: Option<&str>,
) -> Result<(), kube::Error> {
    if still_used(client, ns, source, except.unwrap_or_default()).await? {
        return Ok(());
    }
    match source {
        DataSource::Snapshot(vs) => {
            finalizers::remove(
                &Api::<VolumeSnapshot>::namespaced(client.clone(), ns),
                vs,
                SNAPSHOT_SOURCE_FINALIZER,
            )
            .await
        }
        DataSource::Claim(name) => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            finalizers::remove(&api, name, CLONE_SOURCE_FINALIZER).await
        }
    }
}
