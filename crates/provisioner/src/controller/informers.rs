//! Reflectors for claims, volumes and classes, and the rules for what to queue.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::runtime::reflector::{ObjectRef, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};

use super::{Shared, Work, lock};
use crate::{ownership, pv};

pub(super) async fn watch_claims(shared: Arc<Shared>, writer: Writer<PersistentVolumeClaim>) {
    let api: Api<PersistentVolumeClaim> = Api::all(shared.client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => {
                claim_changed(&shared, &claim);
            }
            Ok(watcher::Event::Delete(claim)) => claim_deleted(&shared, &claim),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(error) => tracing::warn!(%error, "claim watch failed, retrying"),
        }
    }
}

pub(super) async fn watch_volumes(shared: Arc<Shared>, writer: Writer<PersistentVolume>) {
    let api: Api<PersistentVolume> = Api::all(shared.client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(volume) | watcher::Event::InitApply(volume)) => {
                volume_changed(&shared, &volume);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "volume watch failed, retrying"),
        }
    }
}

pub(super) async fn watch_classes(shared: Arc<Shared>, writer: Writer<StorageClass>) {
    let api: Api<StorageClass> = Api::all(shared.client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if let Err(error) = event {
            tracing::warn!(%error, "storage class watch failed, retrying");
        }
    }
}

/// Re-examines everything every `resync_period`.
pub(super) async fn resync(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(shared.config.resync_period);
    interval.tick().await; // the first tick is immediate; the caches were just listed
    loop {
        interval.tick().await;
        for claim in shared.claims.state() {
            claim_changed(&shared, &claim);
        }
        for volume in shared.volumes.state() {
            volume_changed(&shared, &volume);
        }
    }
}

fn claim_changed(shared: &Shared, claim: &PersistentVolumeClaim) {
    let Some(uid) = claim.metadata.uid.clone() else {
        return;
    };
    let reference = ObjectRef::from_obj(claim);
    lock(&shared.claim_index).insert(uid.clone(), reference);
    let bound = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .is_some_and(|name| !name.is_empty());
    if !bound && ownership::claims_our_provisioner(claim, &shared.names) {
        shared.queue.add(Work::Claim(uid));
    } else if bound && shared.expander.is_some() {
        shared.queue.add(Work::Resize(uid));
    }
}

fn claim_deleted(shared: &Shared, claim: &PersistentVolumeClaim) {
    let Some(uid) = claim.metadata.uid.clone() else {
        return;
    };
    lock(&shared.claim_index).remove(&uid);
    if lock(&shared.in_background).contains_key(&uid) {
        shared.queue.add(Work::Claim(uid));
    }
}

fn volume_changed(shared: &Shared, volume: &PersistentVolume) {
    if !pv::is_ours(volume, &shared.names) {
        return;
    }
    if let Some(name) = volume.metadata.name.clone() {
        shared.queue.add(Work::Volume(name));
    }
    if shared.expander.is_some()
        && let Some(uid) = volume
            .spec
            .as_ref()
            .and_then(|spec| spec.claim_ref.as_ref())
            .and_then(|claim_ref| claim_ref.uid.clone())
        && lock(&shared.claim_index).contains_key(&uid)
    {
        shared.queue.add(Work::Resize(uid));
    }
}
