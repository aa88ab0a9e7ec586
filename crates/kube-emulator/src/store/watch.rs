//! Watch registration and the per-watcher filters.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::{EventType, Store};
use crate::events_view;
use crate::resources::View;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::ApiError;

/// One event delivered to a watcher.
#[derive(Debug, Clone)]
pub(crate) struct WatchItem {
    pub kind: EventType,
    pub object: Arc<Value>,
}

/// What a watcher wants to see.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub view: View,
}

impl WatchFilter {
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        if !self.labels.is_empty() && !self.labels.matches(obj) {
            return false;
        }
        if self.fields.is_empty() {
            return true;
        }
        match self.view {
            View::Native => self.fields.matches(obj),
            View::EventsV1 => self.fields.matches(&events_view::core_to_v1(obj)),
        }
    }

    /// The event type this watcher sees for a change, given selector transitions.
    pub(super) fn translate(
        &self,
        kind: EventType,
        obj: &Value,
        prev: Option<&Value>,
    ) -> Option<EventType> {
        let now = self.matches(obj);
        match kind {
            EventType::Added | EventType::Deleted => now.then_some(kind),
            EventType::Modified => {
                let before = prev.is_some_and(|p| self.matches(p));
                match (before, now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
        }
    }
}

pub(super) struct Watcher {
    pub(super) id: u64,
    pub(super) storage: &'static str,
    pub(super) filter: WatchFilter,
    pub(super) tx: mpsc::Sender<WatchItem>,
}

/// A registered watch: its queue plus the events to send first.
pub(crate) struct Registration {
    pub id: u64,
    pub rx: mpsc::Receiver<WatchItem>,
    pub initial: Vec<WatchItem>,
    pub rv: u64,
}

/// Where a watch starts.
pub(crate) enum WatchStart {
    /// Replay history after this resourceVersion.
    After(u64),
    /// Synthetic ADDED events for the current objects.
    Current,
}

impl Store {
    /// Registers a watcher; the initial events and the registration happen atomically.
    pub fn register_watch(
        &self,
        storage: &'static str,
        filter: WatchFilter,
        start: WatchStart,
    ) -> Result<Registration, ApiError> {
        let mut st = self.lock();
        let mut initial = Vec::new();
        match start {
            WatchStart::After(from) => {
                if let Some(h) = st.history.get(storage) {
                    if from < h.evicted_rv {
                        return Err(ApiError::expired(format!(
                            "too old resource version: {from} ({})",
                            h.evicted_rv
                        )));
                    }
                    for e in h.events.iter().filter(|e| e.rv > from) {
                        if let Some(t) = filter.translate(e.kind, &e.object, e.prev.as_deref()) {
                            initial.push(WatchItem {
                                kind: t,
                                object: e.object.clone(),
                            });
                        }
                    }
                }
            }
            WatchStart::Current => {
                if let Some(m) = st.objects.get(storage) {
                    for obj in m.values().filter(|o| filter.matches(o)) {
                        initial.push(WatchItem {
                            kind: EventType::Added,
                            object: obj.clone(),
                        });
                    }
                }
            }
        }
        let (tx, rx) = mpsc::channel(self.queue_len);
        let id = st.next_watcher;
        st.next_watcher += 1;
        st.watchers.push(Watcher {
            id,
            storage,
            filter,
            tx,
        });
        Ok(Registration {
            id,
            rx,
            initial,
            rv: st.rv,
        })
    }

    pub fn unregister_watch(&self, id: u64) {
        self.lock().watchers.retain(|w| w.id != id);
    }

    /// Ends the watch streams on `storage` ("*" for all); returns how many were ended.
    pub fn drop_watches(&self, storage: &str) -> usize {
        let mut st = self.lock();
        let before = st.watchers.len();
        st.watchers
            .retain(|w| storage != "*" && w.storage != storage);
        before - st.watchers.len()
    }

    /// The current resourceVersion if watcher `id` is still registered: every event up to it
    /// is then in the watcher's queue. `None` once the watcher was ended (its queue overflowed,
    /// or its watches were dropped): later events never reach that queue, so a bookmark at the
    /// current resourceVersion would make its client resume past events it never received.
    pub fn rv_for_watcher(&self, id: u64) -> Option<u64> {
        let st = self.lock();
        st.watchers.iter().any(|w| w.id == id).then_some(st.rv)
    }

    pub fn watcher_count(&self) -> usize {
        self.lock().watchers.len()
    }
}
