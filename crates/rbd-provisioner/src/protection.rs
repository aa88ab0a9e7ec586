//! The protection finalizers' release, as external-provisioner's clone controller does for
//! `provisioner.storage.kubernetes.io/cloning-protection` (and its restore path for
//! `.../volumesnapshot-as-source-protection`): whenever a claim with a data source changes or
//! goes (Bound, deleted while Pending), its source is looked at again, and the finalizer comes
//! off once no Pending claim uses it. A source that carries one of the finalizers is looked at
//! whenever it changes, and at start, so a finalizer left by a crash (claim deleted while the
//! provisioner was down) comes off too. Run by the leader next to the provisioning controller.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DynamicObject, ListParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use provisioner::data_source::{
    CLONE_SOURCE_FINALIZER, DataSource, SNAPSHOT_SOURCE_FINALIZER, data_source,
};
use provisioner::queue::{Backoff, WorkQueue};

type Key = (String, DataSource);

/// The controller as a task for [`provisioner::Controller::with_companion`].
pub fn task(client: Client, backoff: Backoff) -> provisioner::Companion {
    Box::pin(run(client, backoff))
}

async fn run(client: Client, backoff: Backoff) {
    let queue: WorkQueue<Key> = WorkQueue::new(backoff);
    // Held by this future: when the leader's tasks are dropped (lease lost), these go too.
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (client, queue) = (client.clone(), queue.clone());
        tasks.spawn(async move {
            while let Some(key) = queue.get().await {
                let (ns, source) = &key;
                match crate::sources::release_source(&client, ns, source, None).await {
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
    tasks.spawn(watch_snapshots(client.clone(), queue.clone()));
    let api: Api<PersistentVolumeClaim> = Api::all(client);
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
    while let Some(event) = stream.next().await {
        match event {
            Ok(
                watcher::Event::Apply(c) | watcher::Event::InitApply(c) | watcher::Event::Delete(c),
            ) => {
                let ns = c.namespace().unwrap_or_else(|| "default".into());
                if c.finalizers().iter().any(|f| f == CLONE_SOURCE_FINALIZER) {
                    queue.add((ns.clone(), DataSource::Claim(c.name_any())));
                }
                if let Ok(Some(source)) = data_source(&c) {
                    queue.add((ns, source));
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "claim watch for protection finalizers failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    queue.shut_down();
    tasks.abort_all();
}

/// VolumeSnapshots carrying our finalizer, once the snapshot API exists.
async fn watch_snapshots(client: Client, queue: WorkQueue<Key>) {
    let api: Api<DynamicObject> = Api::all_with(
        client,
        &crate::sources::snapshot_resource("VolumeSnapshot", "volumesnapshots"),
    );
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
