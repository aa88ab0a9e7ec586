//! Reflectors for claims, volumes and classes, and the rules for what to queue.
//!
//! The reflector stores keep only what decisions read: every watched object loses its
//! `metadata.managedFields` (field ownership, often the largest part of an object on a real API
//! server, several entries per object) and the `kubectl.kubernetes.io/last-applied-configuration`
//! annotation (a full JSON copy of the object as applied) before it is stored. No decision,
//! backend or write of ours reads either: writes are patches, never a PUT of a cached object.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::runtime::reflector::{ObjectRef, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};

use super::cached::{CachedClaim, CachedVolume};
use super::{Shared, Work, lock};
use crate::ownership;
use crate::pv::{self, VolumeFacts};

/// The annotation `kubectl apply` keeps: the whole object as last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no decision reads before an object is cached (see the module doc).
fn strip<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

pub(super) async fn watch_claims(shared: Arc<Shared>, writer: Writer<CachedClaim>) {
    let api: Api<CachedClaim> = Api::all(shared.client.clone());
    let observed = Arc::clone(&shared);
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(move |cached| {
            if let Some(claim) = cached.whole_mut() {
                for observe in &observed.claim_observers {
                    observe(claim);
                }
                strip(claim);
            }
            cached.trim();
        })
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => {
                claim_changed(&shared, &claim.view());
            }
            Ok(watcher::Event::Delete(claim)) => claim_deleted(&shared, &claim),
            // A (re)list's objects arrive before the store is swapped at its end: work queued
            // on the way may have read the old store (a claim missing, or without the annotation
            // that makes it ours) and been dropped. Now the store holds the list: look again.
            Ok(watcher::Event::InitDone) => {
                for claim in shared.claims.state() {
                    claim_changed(&shared, &claim.view());
                }
            }
            Ok(watcher::Event::Init) => {}
            Err(error) => tracing::warn!(%error, "claim watch failed, retrying"),
        }
    }
}

pub(super) async fn watch_volumes(shared: Arc<Shared>, writer: Writer<CachedVolume>) {
    let api: Api<CachedVolume> = Api::all(shared.client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(CachedVolume::trim)
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(volume) | watcher::Event::InitApply(volume)) => {
                volume_changed(&shared, &volume);
            }
            // as for claims: the store holds the list only now
            Ok(watcher::Event::InitDone) => {
                for volume in shared.volumes.state() {
                    volume_changed(&shared, &volume);
                }
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
        .modify(strip)
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        if let Err(error) = event {
            tracing::warn!(%error, "storage class watch failed, retrying");
        }
    }
}

/// VolumeAttachments, for deletions that wait for a detach: a PV of ours whose VolumeAttachment
/// is gone is looked at again at once (rather than at its next backoff retry).
pub(super) async fn watch_attachments(shared: Arc<Shared>, writer: Writer<VolumeAttachment>) {
    let api: Api<VolumeAttachment> = Api::all(shared.client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(strip)
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Delete(attachment)) => {
                if let Some(name) = &attachment.spec.source.persistent_volume_name
                    && let Some(volume) = shared.volumes.get(&ObjectRef::new(name))
                {
                    volume_changed(&shared, &volume);
                }
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "VolumeAttachment watch failed, retrying"),
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
            claim_changed(&shared, &claim.view());
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
    // name and namespace only: lookups ignore the uid and resourceVersion `from_obj` would copy
    let reference =
        ObjectRef::new(&claim.name_any()).within(&claim.namespace().unwrap_or_default());
    lock(&shared.claim_index).insert(uid.clone(), reference);
    let bound = claim
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .is_some_and(|name| !name.is_empty());
    if bound && shared.modifier.is_some() && crate::modify::names_a_class(claim) {
        shared.queue.add(Work::Modify(uid.clone()));
    }
    if !bound && ownership::claims_our_provisioner(claim, &shared.names) {
        shared.queue.add(Work::Claim(uid));
    } else if bound && shared.expander.is_some() {
        shared.queue.add(Work::Resize(uid));
    }
}

fn claim_deleted(shared: &Shared, claim: &CachedClaim) {
    let Some(uid) = claim.meta().uid.clone() else {
        return;
    };
    lock(&shared.claim_index).remove(&uid);
    if lock(&shared.in_background).contains_key(&uid) {
        shared.queue.add(Work::Claim(uid));
    }
}

fn volume_changed(shared: &Shared, volume: &CachedVolume) {
    if !pv::is_ours(volume, &shared.names) {
        return;
    }
    if let Some(name) = VolumeFacts::meta(volume).name.clone() {
        shared.queue.add(Work::Volume(name));
    }
    if (shared.expander.is_some() || shared.modifier.is_some())
        && let Some(uid) = volume.claim_uid().map(str::to_owned)
        && lock(&shared.claim_index).contains_key(&uid)
    {
        // a claim seen before its volume was cached is looked at again now
        if shared.modifier.is_some() {
            shared.queue.add(Work::Modify(uid.clone()));
        }
        if shared.expander.is_some() {
            shared.queue.add(Work::Resize(uid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stored_objects_lose_managed_fields_and_the_last_applied_copy_only() {
        let mut claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {
                "name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "db"},
                "annotations": {
                    LAST_APPLIED: "{\"apiVersion\":\"v1\"}",
                    "volume.kubernetes.io/storage-provisioner": "ceph.com/rbd",
                    "volume.kubernetes.io/selected-node": "node1"
                },
                "finalizers": ["kubernetes.io/pvc-protection"],
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        let mut expected = serde_json::to_value(&claim).unwrap();
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        expected["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(LAST_APPLIED);
        strip(&mut claim);
        assert_eq!(serde_json::to_value(&claim).unwrap(), expected);

        // an object whose only annotation was the applied copy keeps no empty map
        let mut class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "fast", "annotations": {LAST_APPLIED: "{}"}},
            "provisioner": "ceph.com/rbd", "parameters": {"pool": "rbd"}
        }))
        .unwrap();
        strip(&mut class);
        assert_eq!(class.metadata.annotations, None);
        assert_eq!(class.provisioner, "ceph.com/rbd");
    }
}
