//! The object store: one map per resource, one global resourceVersion counter (like etcd),
//! a bounded per-resource event history for watch resumption, and the watch fan-out.
//!
//! Every write happens under one mutex and is short; watch events are pushed into bounded
//! per-watcher queues with `try_send` while the lock is held, so writers never wait for a
//! watcher and every watcher sees events in resourceVersion order. A watcher whose queue is
//! full is dropped (its stream ends, the client re-lists), like kube-apiserver's watch cache.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::status::ApiError;

mod watch;

use watch::Watcher;
pub(crate) use watch::{Registration, WatchFilter, WatchItem, WatchStart};

/// `(namespace, name)`; namespace is "" for cluster-scoped objects.
pub(crate) type Key = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// Who made a write: the controller ignores notifications of its own writes to the same object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Client,
    Controller,
}

/// A change notification for internal subscribers (the PV controller).
#[derive(Debug)]
pub(crate) struct Change {
    pub storage: &'static str,
    pub kind: EventType,
    pub object: Arc<Value>,
    pub origin: Origin,
}

struct HistoryEntry {
    rv: u64,
    kind: EventType,
    object: Arc<Value>,
    prev: Option<Arc<Value>>,
}

#[derive(Default)]
struct History {
    events: VecDeque<HistoryEntry>,
    /// The highest resourceVersion dropped from the window (0 if none).
    evicted_rv: u64,
}

struct State {
    rv: u64,
    objects: HashMap<&'static str, BTreeMap<Key, Arc<Value>>>,
    history: HashMap<&'static str, History>,
    watchers: Vec<Watcher>,
    next_watcher: u64,
    subscribers: Vec<mpsc::UnboundedSender<Arc<Change>>>,
}

/// Read access to other objects while a write closure runs.
pub(crate) struct StoreView<'a> {
    state: &'a State,
}

impl StoreView<'_> {
    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.state
            .objects
            .get(storage)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
    }

    pub fn list(&self, storage: &str) -> Vec<Arc<Value>> {
        self.state
            .objects
            .get(storage)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// What a write closure decided.
pub(crate) enum Action {
    /// Store this object (create or update). Its resourceVersion is assigned by the store.
    Put(Value),
    /// Delete the object now.
    Remove,
    /// Leave the object as is.
    Keep,
    /// Store nothing (dry run); the write answers `Written::Aborted`.
    Abort,
}

/// The outcome of a write.
#[derive(Debug)]
pub(crate) enum Written {
    Created(Arc<Value>),
    Updated(Arc<Value>),
    Unchanged(Arc<Value>),
    /// The last finalizer was removed from a terminating object, which is now gone.
    /// Carries the updated object with its *previous* resourceVersion (what the API answers).
    Finalized(Arc<Value>),
    /// Deleted immediately; the object carries the deletion's resourceVersion.
    Removed(Arc<Value>),
    /// Nothing was stored (dry run).
    Aborted,
}

impl Written {
    pub fn object(&self) -> Option<&Arc<Value>> {
        match self {
            Written::Created(o)
            | Written::Updated(o)
            | Written::Unchanged(o)
            | Written::Finalized(o)
            | Written::Removed(o) => Some(o),
            Written::Aborted => None,
        }
    }
}

pub(crate) struct Store {
    state: Mutex<State>,
    /// The resources the stored CRDs define (kept in step with CRD writes, under the lock).
    pub crds: crate::crd::Registry,
    history_limit: usize,
    queue_len: usize,
    rv_tx: tokio::sync::watch::Sender<u64>,
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

fn key_of(obj: &Value) -> Key {
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    (ns.to_string(), name.to_string())
}

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

impl Store {
    pub fn new(history_limit: usize, queue_len: usize) -> Store {
        let (rv_tx, _) = tokio::sync::watch::channel(0);
        Store {
            state: Mutex::new(State {
                rv: 0,
                objects: HashMap::new(),
                history: HashMap::new(),
                watchers: Vec::new(),
                next_watcher: 1,
                subscribers: Vec::new(),
            }),
            crds: crate::crd::Registry::default(),
            history_limit: history_limit.max(1),
            queue_len,
            rv_tx,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-written (every write is a
        // single insert/remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Resolves when the store's resourceVersion reaches `rv`.
    pub async fn wait_for_rv(&self, rv: u64) {
        let mut rx = self.rv_tx.subscribe();
        // The sender lives as long as the store, so `wait_for` only fails if it is dropped.
        let _ = rx.wait_for(|cur| *cur >= rv).await;
    }

    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Arc<Change>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().subscribers.push(tx);
        rx
    }

    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(storage)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
    }

    /// All objects of a resource (optionally in one namespace), sorted by key, plus the
    /// current resourceVersion.
    pub fn list(&self, storage: &str, ns: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let st = self.lock();
        let items = st
            .objects
            .get(storage)
            .map(|m| {
                m.iter()
                    .filter(|((o_ns, _), _)| ns.is_none_or(|n| n == o_ns))
                    .map(|(_, v)| v.clone())
                    .collect()
            })
            .unwrap_or_default();
        (items, st.rv)
    }

    /// The objects of `storage` as they were at resourceVersion `rv`, rebuilt from the history
    /// window (410 Expired when `rv` is older than the window).
    pub fn snapshot_at(&self, storage: &str, rv: u64) -> Result<Vec<Arc<Value>>, ApiError> {
        let st = self.lock();
        let hist = st.history.get(storage);
        if hist.is_some_and(|h| rv < h.evicted_rv) {
            return Err(ApiError::expired(
                "The resourceVersion for the provided list is too old.",
            ));
        }
        let mut objects: BTreeMap<Key, Arc<Value>> =
            st.objects.get(storage).cloned().unwrap_or_default();
        if let Some(h) = hist {
            for e in h.events.iter().rev().take_while(|e| e.rv > rv) {
                let key = key_of(&e.object);
                match &e.prev {
                    Some(p) => {
                        objects.insert(key, p.clone());
                    }
                    None => {
                        objects.remove(&key);
                    }
                }
            }
        }
        Ok(objects.into_values().collect())
    }

    /// Runs `f` on the current object (if any) under the store lock and applies its decision.
    pub fn write<F>(
        &self,
        storage: &'static str,
        key: &Key,
        origin: Origin,
        f: F,
    ) -> Result<Written, ApiError>
    where
        F: FnOnce(&StoreView<'_>, Option<&Arc<Value>>) -> Result<Action, ApiError>,
    {
        let mut st = self.lock();
        let existing = st.objects.get(storage).and_then(|m| m.get(key)).cloned();
        let action = f(&StoreView { state: &st }, existing.as_ref())?;
        let written = match (action, existing) {
            (Action::Abort, _) => Written::Aborted,
            (Action::Keep, Some(old)) => Written::Unchanged(old),
            (Action::Keep, None) | (Action::Remove, None) => {
                return Err(ApiError::internal("write of a missing object"));
            }
            (Action::Put(mut obj), None) => {
                st.rv += 1;
                let rv = st.rv;
                set_rv(&mut obj, rv);
                let obj = Arc::new(obj);
                st.objects
                    .entry(storage)
                    .or_default()
                    .insert(key_of(&obj), obj.clone());
                self.emit(
                    &mut st,
                    storage,
                    rv,
                    EventType::Added,
                    obj.clone(),
                    None,
                    origin,
                );
                Written::Created(obj)
            }
            (Action::Put(mut obj), Some(old)) => {
                let old_rv = old
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.insert("resourceVersion".into(), old_rv);
                }
                if obj == *old {
                    Written::Unchanged(old)
                } else if is_terminating(&obj) && !has_finalizers(&obj) {
                    // Last finalizer gone: the object is deleted. The DELETED event carries the
                    // pre-removal object with a new resourceVersion; the API answers the updated
                    // object with the old one.
                    st.rv += 1;
                    let rv = st.rv;
                    if let Some(m) = st.objects.get_mut(storage) {
                        m.remove(key);
                    }
                    let mut gone = (*old).clone();
                    set_rv(&mut gone, rv);
                    self.emit(
                        &mut st,
                        storage,
                        rv,
                        EventType::Deleted,
                        Arc::new(gone),
                        Some(old),
                        origin,
                    );
                    Written::Finalized(Arc::new(obj))
                } else {
                    st.rv += 1;
                    let rv = st.rv;
                    set_rv(&mut obj, rv);
                    let obj = Arc::new(obj);
                    st.objects
                        .entry(storage)
                        .or_default()
                        .insert(key.clone(), obj.clone());
                    self.emit(
                        &mut st,
                        storage,
                        rv,
                        EventType::Modified,
                        obj.clone(),
                        Some(old),
                        origin,
                    );
                    Written::Updated(obj)
                }
            }
            (Action::Remove, Some(old)) => {
                st.rv += 1;
                let rv = st.rv;
                if let Some(m) = st.objects.get_mut(storage) {
                    m.remove(key);
                }
                let mut gone = (*old).clone();
                set_rv(&mut gone, rv);
                let gone = Arc::new(gone);
                self.emit(
                    &mut st,
                    storage,
                    rv,
                    EventType::Deleted,
                    gone.clone(),
                    Some(old),
                    origin,
                );
                Written::Removed(gone)
            }
        };
        if storage == crate::crd::CRDS {
            match &written {
                Written::Created(o) | Written::Updated(o) => self.crds.sync(&key.1, Some(o)),
                Written::Finalized(_) | Written::Removed(_) => {
                    // The resource is no longer served: its watches end, as upstream.
                    if let Some(gone) = self.crds.storage_of(&key.1) {
                        st.watchers.retain(|w| w.storage != gone);
                    }
                    self.crds.sync(&key.1, None)
                }
                Written::Unchanged(_) | Written::Aborted => {}
            }
        }
        Ok(written)
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(
        &self,
        st: &mut State,
        storage: &'static str,
        rv: u64,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
        origin: Origin,
    ) {
        let limit = self.history_limit;
        let hist = st.history.entry(storage).or_default();
        hist.events.push_back(HistoryEntry {
            rv,
            kind,
            object: object.clone(),
            prev: prev.clone(),
        });
        while hist.events.len() > limit {
            if let Some(e) = hist.events.pop_front() {
                hist.evicted_rv = e.rv;
            }
        }
        let mut dead = Vec::new();
        for w in st.watchers.iter().filter(|w| w.storage == storage) {
            let Some(t) = w.filter.translate(kind, &object, prev.as_deref()) else {
                continue;
            };
            let item = WatchItem {
                kind: t,
                object: object.clone(),
            };
            match w.tx.try_send(item) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        watcher = w.id,
                        resource = storage,
                        "watch queue overflowed; ending the stream"
                    );
                    dead.push(w.id);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => dead.push(w.id),
            }
        }
        if !dead.is_empty() {
            st.watchers.retain(|w| !dead.contains(&w.id));
        }
        let change = Arc::new(Change {
            storage,
            kind,
            object,
            origin,
        });
        st.subscribers.retain(|s| s.send(change.clone()).is_ok());
        self.rv_tx.send_replace(rv);
    }
}
