//! Watches PVCs and PVs and records, per claim, when it was created, bound, deleted and when its
//! PV disappeared (the provisioner deletes the PV only after the image is removed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::cluster::NAMESPACE;

/// What the watches saw, with the instant each event arrived.
#[derive(Default)]
pub struct Seen {
    /// claim -> when its create request was sent
    pub created: HashMap<String, Instant>,
    /// claim -> when it was first seen Bound
    pub bound: HashMap<String, Instant>,
    /// claim -> its PV
    pub volume_of: HashMap<String, String>,
    /// claim -> when the PV naming it (the provisioner's work done) was first seen
    pub pv_seen: HashMap<String, Instant>,
    /// PV -> its image
    pub image_of: HashMap<String, String>,
    /// claim -> when its delete request was sent
    pub delete_sent: HashMap<String, Instant>,
    /// PV -> when it was seen deleted
    pub pv_gone: HashMap<String, Instant>,
    /// PVs listed since the current (re)list began.
    relisted: Option<std::collections::HashSet<String>>,
    pvc_synced: bool,
    pv_synced: bool,
}

/// The two watches; aborted on drop.
pub struct Tracker {
    seen: Arc<Mutex<Seen>>,
    changed: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Tracker {
    pub fn start(client: &Client) -> Tracker {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let changed = Arc::new(Notify::new());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let tasks = vec![
            tokio::spawn(watch(pvcs, seen.clone(), changed.clone(), on_claim)),
            tokio::spawn(watch(pvs, seen.clone(), changed.clone(), on_volume)),
        ];
        Tracker {
            seen,
            changed,
            tasks,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Both watches have listed the current state.
    pub fn synced(&self) -> bool {
        let s = self.lock();
        s.pvc_synced && s.pv_synced
    }

    /// Resolves after the next recorded change (or at once if one happened since the last call).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

type Handler<K> = fn(&mut Seen, Event<K>, Instant);

async fn watch<K>(api: Api<K>, seen: Arc<Mutex<Seen>>, changed: Arc<Notify>, handle: Handler<K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    loop {
        match stream.try_next().await {
            Ok(Some(event)) => {
                let now = Instant::now();
                {
                    let mut s = seen
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    handle(&mut s, event, now);
                }
                changed.notify_one();
            }
            Ok(None) => return,
            // the watcher retries by itself on the next poll; the emulator is local
            Err(e) => {
                eprintln!("watch error (retrying): {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

fn on_claim(s: &mut Seen, event: Event<PersistentVolumeClaim>, now: Instant) {
    match event {
        Event::Apply(c) | Event::InitApply(c) => {
            let bound = c.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Bound");
            if !bound {
                return;
            }
            let name = c.name_any();
            if let Some(vol) = c.spec.as_ref().and_then(|sp| sp.volume_name.clone()) {
                s.volume_of.entry(name.clone()).or_insert(vol);
            }
            s.bound.entry(name).or_insert(now);
        }
        Event::InitDone => s.pvc_synced = true,
        Event::Init | Event::Delete(_) => {}
    }
}

fn on_volume(s: &mut Seen, event: Event<PersistentVolume>, now: Instant) {
    match event {
        Event::Apply(pv) => {
            if let Some(claim) = pv.spec.as_ref().and_then(|sp| sp.claim_ref.as_ref())
                && let Some(name) = &claim.name
            {
                s.pv_seen.entry(name.clone()).or_insert(now);
            }
            if let Some(image) = image_name(&pv) {
                s.image_of.entry(pv.name_any()).or_insert(image);
            }
        }
        Event::InitApply(pv) => {
            if let Some(listed) = s.relisted.as_mut() {
                listed.insert(pv.name_any());
            }
            if let Some(image) = image_name(&pv) {
                s.image_of.entry(pv.name_any()).or_insert(image);
            }
        }
        Event::Delete(pv) => {
            s.pv_gone.entry(pv.name_any()).or_insert(now);
        }
        Event::Init => s.relisted = Some(std::collections::HashSet::new()),
        // A relist after a dropped watch (the server ends watches that fall behind) carries no
        // Delete events for what went away in between: known PVs missing from it are gone.
        Event::InitDone => {
            if let Some(listed) = s.relisted.take() {
                let gone: Vec<String> = s
                    .image_of
                    .keys()
                    .filter(|pv| !listed.contains(*pv) && !s.pv_gone.contains_key(*pv))
                    .cloned()
                    .collect();
                for pv in gone {
                    s.pv_gone.insert(pv, now);
                }
            }
            s.pv_synced = true;
        }
    }
}

/// The RBD image behind a PV: in-tree `rbd` source or CSI `imageName` attribute.
fn image_name(pv: &PersistentVolume) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    if let Some(rbd) = &spec.rbd {
        return Some(rbd.image.clone());
    }
    spec.csi
        .as_ref()?
        .volume_attributes
        .as_ref()?
        .get("imageName")
        .cloned()
}
