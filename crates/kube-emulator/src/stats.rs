//! What the emulator measures about its own service, for benchmarks: requests by client (its
//! `User-Agent`), verb and resource, and stalls: how long a request (watches excepted) took to
//! answer, and how late the runtime ran a 50 ms timer. Served as JSON at `GET /emulator/stats`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// An answer slower than this counts as a stall.
pub const STALL: Duration = Duration::from_secs(1);
/// Period of the runtime probe.
const PROBE_PERIOD: Duration = Duration::from_millis(50);

/// Counters shared by the HTTP layer and the probe.
#[derive(Default)]
pub(crate) struct Stats {
    requests: Mutex<HashMap<(String, String, String), u64>>,
    max_answer_us: AtomicU64,
    slow_answers: AtomicU64,
    max_probe_lag_us: AtomicU64,
    late_probes: AtomicU64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Stats {
    pub(crate) fn count(&self, user_agent: &str, verb: &str, resource: &str) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests
            .entry((user_agent.to_owned(), verb.to_owned(), resource.to_owned()))
            .or_insert(0) += 1;
    }

    /// Requests for `verb` and `resource` (`"*"` matches anything), from every client.
    pub(crate) fn total(&self, verb: &str, resource: &str) -> u64 {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        requests
            .iter()
            .filter(|((_, v, r), _)| {
                (verb == "*" || v == verb) && (resource == "*" || r == resource)
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// How long one answer took (never called for watches, which stay open).
    pub(crate) fn answered(&self, took: Duration) {
        self.max_answer_us
            .fetch_max(micros(took), Ordering::Relaxed);
        if took > STALL {
            self.slow_answers.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn probed(&self, lag: Duration) {
        self.max_probe_lag_us
            .fetch_max(micros(lag), Ordering::Relaxed);
        if lag > STALL {
            self.late_probes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The runtime probe: sleeps [`PROBE_PERIOD`] in a loop and records how much later than
    /// asked it woke. Runs until aborted.
    pub(crate) async fn probe(stats: std::sync::Arc<Stats>) {
        loop {
            let asked = Instant::now();
            tokio::time::sleep(PROBE_PERIOD).await;
            stats.probed(asked.elapsed().saturating_sub(PROBE_PERIOD));
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<_> = requests.iter().collect();
        rows.sort();
        let rows: Vec<Value> = rows
            .into_iter()
            .map(|((agent, verb, resource), count)| {
                json!({"userAgent": agent, "verb": verb, "resource": resource, "count": count})
            })
            .collect();
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1000.0;
        json!({
            "requests": rows,
            "stalls": {
                "thresholdMs": micros(STALL) / 1000,
                "maxAnswerMs": ms(&self.max_answer_us),
                "slowAnswers": self.slow_answers.load(Ordering::Relaxed),
                "maxRuntimeLagMs": ms(&self.max_probe_lag_us),
                "lateRuntimeProbes": self.late_probes.load(Ordering::Relaxed),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_per_client_verb_and_resource() {
        let stats = Stats::default();
        stats.count("rbd-provisioner/0.1", "create", "persistentvolumes");
        stats.count("rbd-provisioner/0.1", "create", "persistentvolumes");
        stats.count("kubectl", "create", "persistentvolumes");
        stats.count("kubectl", "list", "persistentvolumeclaims");
        assert_eq!(stats.total("create", "persistentvolumes"), 3);
        assert_eq!(stats.total("*", "*"), 4);
        let json = stats.to_json();
        assert_eq!(json["requests"].as_array().map(Vec::len), Some(3));
        assert_eq!(json["requests"][2]["count"], 2);
        assert_eq!(json["requests"][2]["userAgent"], "rbd-provisioner/0.1");
    }

    #[test]
    fn answers_slower_than_a_second_count_as_stalls() {
        let stats = Stats::default();
        stats.answered(Duration::from_millis(20));
        stats.answered(Duration::from_millis(1500));
        stats.probed(Duration::from_millis(3));
        let json = stats.to_json();
        assert_eq!(json["stalls"]["slowAnswers"], 1);
        assert_eq!(json["stalls"]["maxAnswerMs"], 1500.0);
        assert_eq!(json["stalls"]["lateRuntimeProbes"], 0);
        assert_eq!(json["stalls"]["maxRuntimeLagMs"], 3.0);
    }
}
