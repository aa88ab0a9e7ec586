//! Events as kube-controller-manager records them: core/v1 Events named `<object>.<hex>`,
//! aggregated (the same Event gets `count+1` and a new `lastTimestamp` on repeats),
//! `eventTime: null`, `reportingInstance: ""`.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::limiter::TokenBucket;
use crate::store::{Action, Origin, Store};
use crate::util::{self, now_nanos, now_time};

#[derive(Default)]
pub(crate) struct Recorder {
    /// aggregation key -> (namespace, event name)
    cache: HashMap<String, (String, String)>,
}

fn involved(obj: &Value) -> Value {
    let mut r = serde_json::Map::new();
    for (k, v) in [
        ("kind", obj.get("kind").cloned()),
        (
            "namespace",
            crate::util::at(obj, "/metadata/namespace").cloned(),
        ),
        ("name", crate::util::at(obj, "/metadata/name").cloned()),
        ("uid", crate::util::at(obj, "/metadata/uid").cloned()),
        ("apiVersion", obj.get("apiVersion").cloned()),
        (
            "resourceVersion",
            crate::util::at(obj, "/metadata/resourceVersion").cloned(),
        ),
    ] {
        if let Some(v) = v {
            r.insert(k.into(), v);
        }
    }
    Value::Object(r)
}

impl Recorder {
    /// Records an event about `obj` (type `Normal`/`Warning`) from `component`; with a
    /// `limit`, the create or the count update first waits for a token of it.
    #[allow(clippy::too_many_arguments)]
    pub async fn emit(
        &mut self,
        store: &Store,
        limit: Option<&TokenBucket>,
        obj: &Value,
        event_type: &str,
        reason: &str,
        message: &str,
        component: &str,
    ) {
        let uid = util::meta_str(obj, "uid").unwrap_or_default();
        let key = format!("{uid}\u{0}{event_type}\u{0}{reason}\u{0}{message}\u{0}{component}");
        if let Some(bucket) = limit {
            bucket.wait().await;
        }
        let now = now_time();
        if let Some((ns, name)) = self.cache.get(&key) {
            let k = (ns.clone(), name.clone());
            let updated = store.write("events", &k, Origin::Controller, |_, existing| {
                let Some(old) = existing else {
                    return Ok(Action::Abort);
                };
                let mut next = (**old).clone();
                let count = next.get("count").and_then(Value::as_u64).unwrap_or(1) + 1;
                next["count"] = json!(count);
                next["lastTimestamp"] = json!(now);
                Ok(Action::Put(next))
            });
            if matches!(updated, Ok(ref w) if w.object().is_some()) {
                return;
            }
        }
        let ns = match util::ns_of(obj) {
            "" => "default".to_string(),
            ns => ns.to_string(),
        };
        let name = format!("{}.{:x}", util::name_of(obj), now_nanos());
        let event = json!({
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": now,
            },
            "involvedObject": involved(obj),
            "reason": reason,
            "message": message,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": event_type,
            "eventTime": null,
            "reportingComponent": component,
            "reportingInstance": "",
        });
        let k = (ns.clone(), name.clone());
        match store.write("events", &k, Origin::Controller, |_, _| {
            Ok(Action::Put(event))
        }) {
            Ok(_) => {
                self.cache.insert(key, (ns, name));
            }
            Err(e) => tracing::warn!(reason, error = %e, "recording event failed"),
        }
    }
}
