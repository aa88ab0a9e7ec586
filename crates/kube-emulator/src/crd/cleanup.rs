//! The CRD finalizer (`customresourcecleanup.apiextensions.k8s.io`), as kube-apiserver's
//! `CRDFinalizer` runs it: once a CRD is terminating, every object of it is deleted (objects
//! with finalizers get a `deletionTimestamp` and are waited for), then the finalizer is
//! removed and the CRD goes.
//!
//! The task is started by the first CRD create of an emulator and holds only a weak reference
//! to the store: it ends when the store (the emulator) is gone.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use serde_json::json;
use tokio::sync::mpsc;

use super::{CLEANUP_FINALIZER, CRDS, crd_status};
use crate::store::{Action, Change, EventType, Origin, Store};
use crate::util::{self, now_time};

/// Starts the cleanup task of `store` unless it runs already.
pub(crate) fn ensure_cleanup(store: &Arc<Store>) {
    if store.crds.cleanup_started.swap(true, Ordering::SeqCst) {
        return;
    }
    let rx = store.subscribe();
    tokio::spawn(run(Arc::downgrade(store), rx));
}

async fn run(store: Weak<Store>, mut rx: mpsc::UnboundedReceiver<Arc<Change>>) {
    while let Some(ch) = rx.recv().await {
        let Some(store) = store.upgrade() else {
            return;
        };
        if ch.storage == CRDS {
            if ch.kind != EventType::Deleted && util::is_terminating(&ch.object) {
                finalize(&store, util::name_of(&ch.object));
            }
        } else if ch.kind == EventType::Deleted
            && let Some(crd) = store.crds.crd_of_storage(ch.storage)
        {
            finalize(&store, &crd);
        }
    }
}

fn finalize(store: &Store, crd_name: &str) {
    let crd_key = (String::new(), crd_name.to_string());
    let Some(crd) = store.get(CRDS, "", crd_name) else {
        return;
    };
    if !util::is_terminating(&crd)
        || !util::finalizers(&crd)
            .iter()
            .any(|f| f == CLEANUP_FINALIZER)
    {
        return;
    }
    // The Terminating condition, as the finalizer controller sets it first.
    let _ = store.write(CRDS, &crd_key, Origin::Controller, |_, existing| {
        let Some(old) = existing else {
            return Ok(Action::Abort);
        };
        let mut next = (**old).clone();
        let status = crd_status(&next, Some(old));
        if let Some(m) = next.as_object_mut() {
            m.insert("status".into(), status);
        }
        Ok(Action::Put(next))
    });
    if let Some(storage) = store.crds.storage_of(crd_name) {
        let (objects, _) = store.list(storage, None);
        for o in &objects {
            let key = (util::ns_of(o).to_string(), util::name_of(o).to_string());
            let _ = store.write(storage, &key, Origin::Controller, |_, existing| {
                let Some(old) = existing else {
                    return Ok(Action::Abort);
                };
                if util::finalizers(old).is_empty() {
                    return Ok(Action::Remove);
                }
                if util::is_terminating(old) {
                    return Ok(Action::Keep);
                }
                let mut next = (**old).clone();
                if let Some(meta) = util::obj_mut(&mut next, "metadata") {
                    meta.insert("deletionTimestamp".into(), json!(now_time()));
                    meta.insert("deletionGracePeriodSeconds".into(), json!(0));
                }
                Ok(Action::Put(next))
            });
        }
        if !store.list(storage, None).0.is_empty() {
            return;
        }
    }
    let _ = store.write(CRDS, &crd_key, Origin::Controller, |_, existing| {
        let Some(old) = existing else {
            return Ok(Action::Abort);
        };
        let mut next = (**old).clone();
        let rest: Vec<String> = util::finalizers(old)
            .into_iter()
            .filter(|f| f != CLEANUP_FINALIZER)
            .collect();
        util::set_finalizers(&mut next, rest);
        Ok(Action::Put(next))
    });
}
