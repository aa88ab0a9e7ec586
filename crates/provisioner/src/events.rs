//! A core/v1 Event recorder that never blocks the caller.
//!
//! [`EventRecorder::record`] puts the event on a bounded channel and returns; background tasks
//! write it. Like client-go's recorder, a repeat of the same type, reason and message on the
//! same object bumps `count` and `lastTimestamp` of the existing Event instead of creating a
//! new one. When the channel is full or the API write fails, the event is dropped with a log
//! line: events are advice for humans, never a reason to stall provisioning.
//!
//! [`WRITERS`] tasks write at once, each for its share of the objects (by the object's UID, or
//! name), so a burst of provisioning (two events per claim) is written as it happens instead of
//! trailing behind it one request at a time; all events of one object go through one task, in
//! order, and are aggregated there.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;

/// Tasks writing events at once.
pub const WRITERS: usize = 4;
/// Events buffered (per writer) before new ones are dropped.
const CHANNEL_CAPACITY: usize = 4096 / WRITERS;
/// Aggregation entries remembered (per writer) before that writer's cache is cleared.
const CACHE_LIMIT: usize = 4096 / WRITERS;

/// Event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something went as expected.
    Normal,
    /// Something needs attention.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

#[derive(Debug)]
struct PendingEvent {
    object: ObjectReference,
    event_type: EventType,
    reason: String,
    message: String,
}

/// Records Events; cheap to clone.
#[derive(Clone, Debug)]
pub struct EventRecorder {
    /// One channel per writer task.
    senders: Arc<[mpsc::Sender<PendingEvent>]>,
}

impl EventRecorder {
    /// A recorder writing through `client` as `component` (event `source.component` and
    /// `reportingComponent`) on instance `instance`. Spawns the writer tasks; call inside a
    /// tokio runtime. The tasks end when every clone of the recorder is dropped.
    #[must_use]
    pub fn new(client: Client, component: &str, instance: &str) -> Self {
        let senders = std::iter::repeat_n(client, WRITERS)
            .map(|client| {
                let (sender, receiver) = mpsc::channel(CHANNEL_CAPACITY);
                let writer = Writer {
                    client,
                    component: component.to_owned(),
                    instance: instance.to_owned(),
                    seen: HashMap::new(),
                };
                tokio::spawn(writer.run(receiver));
                sender
            })
            .collect();
        Self { senders }
    }

    /// Records an event about `object`.
    pub fn publish<K>(&self, object: &K, event_type: EventType, reason: &str, message: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        self.record(object.object_ref(&()), event_type, reason, message);
    }

    /// Records an event about the object `reference` points to.
    pub fn record(
        &self,
        object: ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let mut hasher = DefaultHasher::new();
        object
            .uid
            .as_ref()
            .or(object.name.as_ref())
            .hash(&mut hasher);
        let writer = usize::try_from(hasher.finish() % WRITERS as u64).unwrap_or(0);
        let event = PendingEvent {
            object,
            event_type,
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        let Some(sender) = self.senders.get(writer) else {
            return;
        };
        if let Err(error) = sender.try_send(event) {
            tracing::warn!(reason, %error, "event dropped");
        }
    }
}

type AggregationKey = (String, EventType, String, String);

struct Writer {
    client: Client,
    component: String,
    instance: String,
    /// Aggregation key -> (event namespace, event name, count).
    seen: HashMap<AggregationKey, (String, String, i32)>,
}

impl Writer {
    async fn run(mut self, mut receiver: mpsc::Receiver<PendingEvent>) {
        while let Some(event) = receiver.recv().await {
            if let Err(error) = self.write(&event).await {
                tracing::warn!(reason = %event.reason, %error, "could not write event");
            }
        }
    }

    async fn write(&mut self, event: &PendingEvent) -> Result<(), kube::Error> {
        let object_key = event
            .object
            .uid
            .clone()
            .or_else(|| event.object.name.clone())
            .unwrap_or_default();
        let key = (
            object_key,
            event.event_type,
            event.reason.clone(),
            event.message.clone(),
        );
        let now = Time(Timestamp::now());
        if let Some((namespace, name, count)) = self.seen.get(&key).cloned() {
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let patch = serde_json::json!({ "count": count + 1, "lastTimestamp": now });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.seen.insert(key, (namespace, name, count + 1));
                    return Ok(());
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error),
            }
        }
        let namespace = event
            .object
            .namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let object_name = event.object.name.clone().unwrap_or_default();
        let nanos = Timestamp::now().as_nanosecond();
        let name = format!("{object_name}.{nanos:x}");
        let mut new_event = Event {
            involved_object: event.object.clone(),
            reason: Some(event.reason.clone()),
            message: Some(event.message.clone()),
            type_: Some(event.event_type.as_str().to_owned()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        new_event.metadata.name = Some(name.clone());
        new_event.metadata.namespace = Some(namespace.clone());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let created = api.create(&PostParams::default(), &new_event).await?;
        if self.seen.len() >= CACHE_LIMIT {
            self.seen.clear();
        }
        self.seen.insert(key, (namespace, created.name_any(), 1));
        Ok(())
    }
}
