//! The slice of kube-controller-manager that provisioning depends on: the PV binder
//! (external-provisioning annotations and events, binding of pre-bound volumes, Released
//! volumes), the pvc/pv-protection controllers and the expand controller's CSI event.
//!
//! Flow: the controller subscribes to store changes. A client write to a claim or volume syncs
//! that object; deletions and pod changes sync the objects that depend on them; every
//! `resync` period everything is synced again (which is what bumps the aggregated
//! `ExternalProvisioning` event, as in the recordings). Notifications of the controller's own
//! writes do not re-sync the same object (kube-controller-manager keeps its own writes in its
//! cache, so they do not count as updates).

mod claims;
mod matching;
mod recorder;
mod volumes;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::store::{Action, Change, EventType, Origin, Store, Written};
use crate::util::{self, str_at};

pub(crate) const PVCS: &str = "persistentvolumeclaims";
pub(crate) const PVS: &str = "persistentvolumes";

pub(crate) struct Controller {
    store: Arc<Store>,
    recorder: recorder::Recorder,
    /// (claim uid, requested size) already reported as `ExternalExpanding`.
    expanding_reported: HashSet<(String, String)>,
}

impl Controller {
    /// Applies `f` to a copy of the current object and stores it if it changed.
    fn modify(
        &self,
        storage: &'static str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Arc<Value>> {
        let key = (ns.to_string(), name.to_string());
        let result = self
            .store
            .write(storage, &key, Origin::Controller, |_, existing| {
                let Some(old) = existing else {
                    return Ok(Action::Abort);
                };
                let mut next = (**old).clone();
                f(&mut next);
                Ok(Action::Put(next))
            });
        match result {
            Ok(Written::Aborted) => None,
            Ok(w) => w.object().cloned(),
            Err(e) => {
                tracing::warn!(resource = storage, namespace = ns, name, error = %e, "controller write failed");
                None
            }
        }
    }

    fn on_change(&mut self, ch: &Change) {
        let obj = &ch.object;
        let ns = util::ns_of(obj).to_string();
        let name = util::name_of(obj).to_string();
        let by_client = ch.origin == Origin::Client;
        match ch.storage {
            PVCS => {
                if ch.kind == EventType::Deleted {
                    self.sync_volumes_of_claim(&ns, &name);
                } else if by_client {
                    self.sync_claim(&ns, &name);
                }
            }
            PVS => {
                if ch.kind == EventType::Deleted {
                    if let (Some(cns), Some(cname)) = (
                        str_at(obj, "/spec/claimRef/namespace"),
                        str_at(obj, "/spec/claimRef/name"),
                    ) {
                        self.sync_claim(cns, cname);
                    }
                } else if by_client {
                    self.sync_volume(&name);
                }
            }
            "pods" => {
                for claim in claims::pod_claims(obj) {
                    self.sync_claim(&ns, &claim);
                }
            }
            "storageclasses" if by_client => {
                let (claims, _) = self.store.list(PVCS, None);
                for c in claims
                    .iter()
                    .filter(|c| str_at(c, "/status/phase") != Some("Bound"))
                {
                    self.sync_claim(util::ns_of(c), util::name_of(c));
                }
            }
            _ => {}
        }
    }

    fn resync_all(&mut self) {
        let (claims, _) = self.store.list(PVCS, None);
        for c in &claims {
            self.sync_claim(util::ns_of(c), util::name_of(c));
        }
        let (volumes, _) = self.store.list(PVS, None);
        for v in &volumes {
            self.sync_volume(util::name_of(v));
        }
    }
}

/// Runs the controller until the store's subscription ends (or the task is aborted).
pub(crate) async fn run(
    store: Arc<Store>,
    mut rx: mpsc::UnboundedReceiver<Arc<Change>>,
    resync: Duration,
) {
    let mut ctl = Controller {
        store,
        recorder: recorder::Recorder::default(),
        expanding_reported: HashSet::new(),
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
    loop {
        tokio::select! {
            ch = rx.recv() => match ch {
                Some(ch) => ctl.on_change(&ch),
                None => return,
            },
            _ = tick.tick() => ctl.resync_all(),
        }
    }
}
