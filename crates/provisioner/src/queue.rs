//! A work queue with de-duplication and per-key exponential backoff.
//!
//! The same contract as client-go's rate-limited work queue:
//!
//! - a key is queued at most once; adding a queued key is a no-op;
//! - a key is handed to one worker at a time; a key added while it is being processed is
//!   queued again once that worker calls [`WorkQueue::done`] (so the latest state is always
//!   processed, exactly once more);
//! - [`WorkQueue::add_rate_limited`] re-adds a key after `base_delay * 2^(failures-1)`, capped
//!   at `max_delay`; [`WorkQueue::forget`] resets its failure count;
//! - after [`WorkQueue::shut_down`], [`WorkQueue::get`] returns `None` and adds are ignored.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

/// Backoff settings of a [`WorkQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure. Default 1 s.
    pub base_delay: Duration,
    /// Upper bound of the delay. Default 5 min.
    pub max_delay: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_mins(5),
        }
    }
}

impl Backoff {
    /// The delay before retry number `failures` (1-based): `base * 2^(failures-1)`, capped.
    #[must_use]
    pub fn delay(&self, failures: u32) -> Duration {
        let exponent = failures.saturating_sub(1).min(32);
        let factor = 1u32.checked_shl(exponent).unwrap_or(u32::MAX);
        self.base_delay
            .checked_mul(factor)
            .map_or(self.max_delay, |delay| delay.min(self.max_delay))
    }
}

struct State<K> {
    ready: VecDeque<K>,
    /// Keys waiting to be processed (in `ready`, or re-queued when their worker is done).
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
    shutting_down: bool,
}

struct Inner<K> {
    state: Mutex<State<K>>,
    notify: Notify,
    backoff: Backoff,
    depth: Option<Gauge>,
    retries: Option<Counter>,
}

/// A de-duplicating work queue with per-key backoff; cheap to clone (shared).
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue.
    #[must_use]
    pub fn new(backoff: Backoff) -> Self {
        Self::build(backoff, None, None)
    }

    /// An empty queue reporting its depth and retries to these metrics.
    #[must_use]
    pub fn with_metrics(backoff: Backoff, depth: Gauge, retries: Counter) -> Self {
        Self::build(backoff, Some(depth), Some(retries))
    }

    fn build(backoff: Backoff, depth: Option<Gauge>, retries: Option<Counter>) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    ready: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    failures: HashMap::new(),
                    shutting_down: false,
                }),
                notify: Notify::new(),
                backoff,
                depth,
                retries,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        // A panic while holding this lock cannot leave the sets inconsistent in a way that
        // matters more than stopping all work, so keep going with the data as is.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn report_depth(&self, state: &State<K>) {
        if let Some(depth) = &self.inner.depth {
            depth.set(i64::try_from(state.dirty.len()).unwrap_or(i64::MAX));
        }
    }

    /// Queues `key` now (no-op if already queued).
    pub fn add(&self, key: K) {
        let mut state = self.state();
        if state.shutting_down || state.dirty.contains(&key) {
            return;
        }
        state.dirty.insert(key.clone());
        if !state.processing.contains(&key) {
            state.ready.push_back(key);
            self.inner.notify.notify_one();
        }
        self.report_depth(&state);
    }

    /// Queues `key` after `delay`.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
    }

    /// Counts a failure of `key` and queues it again after its backoff delay; returns the
    /// number of failures so far (1 after the first).
    pub fn add_rate_limited(&self, key: K) -> u32 {
        let failures = {
            let mut state = self.state();
            let failures = state.failures.entry(key.clone()).or_insert(0);
            *failures = failures.saturating_add(1);
            *failures
        };
        if let Some(retries) = &self.inner.retries {
            retries.inc();
        }
        self.add_after(key, self.inner.backoff.delay(failures));
        failures
    }

    /// How many times `key` failed since it was last forgotten.
    #[must_use]
    pub fn failures(&self, key: &K) -> u32 {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// The delay the next failure of `key` will wait.
    #[must_use]
    pub fn next_delay(&self, key: &K) -> Duration {
        self.inner
            .backoff
            .delay(self.failures(key).saturating_add(1))
    }

    /// Resets the failure count of `key` (call after a success).
    pub fn forget(&self, key: &K) {
        self.state().failures.remove(key);
    }

    /// Waits for the next key; `None` once the queue is shut down. The caller must call
    /// [`WorkQueue::done`] with the key when finished.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.state();
                if state.shutting_down {
                    return None;
                }
                if let Some(key) = state.ready.pop_front() {
                    state.dirty.remove(&key);
                    state.processing.insert(key.clone());
                    self.report_depth(&state);
                    if !state.ready.is_empty() {
                        // Pass the wake-up on: one notify may have been consumed for two adds.
                        self.inner.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed; re-queues it if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut state = self.state();
        state.processing.remove(key);
        if state.dirty.contains(key) && !state.shutting_down {
            state.ready.push_back(key.clone());
            self.inner.notify.notify_one();
        }
    }

    /// Number of keys waiting to be processed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.state().dirty.len()
    }

    /// Whether no key is waiting.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops handing out keys: every pending and future [`WorkQueue::get`] returns `None`.
    pub fn shut_down(&self) {
        self.state().shutting_down = true;
        self.inner.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::timeout;

    fn fast() -> Backoff {
        Backoff {
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
        }
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(1), Duration::from_secs(1));
        assert_eq!(backoff.delay(2), Duration::from_secs(2));
        assert_eq!(backoff.delay(4), Duration::from_secs(8));
        assert_eq!(backoff.delay(9), Duration::from_secs(256));
        assert_eq!(backoff.delay(10), Duration::from_mins(5));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_mins(5));
    }

    #[tokio::test]
    async fn deduplicates_queued_keys() {
        let queue = WorkQueue::new(fast());
        queue.add("a");
        queue.add("a");
        queue.add("b");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.get().await, Some("a"));
        assert_eq!(queue.get().await, Some("b"));
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn key_added_while_processing_runs_once_more_after_done() {
        let queue = WorkQueue::new(fast());
        queue.add("a");
        let key = queue.get().await;
        assert_eq!(key, Some("a"));
        queue.add("a");
        queue.add("a");
        // Not handed to a second worker while the first one holds it.
        assert!(
            timeout(Duration::from_millis(30), queue.get())
                .await
                .is_err()
        );
        queue.done(&"a");
        assert_eq!(
            timeout(Duration::from_secs(1), queue.get()).await,
            Ok(Some("a"))
        );
        queue.done(&"a");
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn rate_limited_keys_come_back_after_backoff_and_forget_resets() {
        let queue = WorkQueue::new(fast());
        assert_eq!(queue.add_rate_limited("a"), 1);
        assert_eq!(queue.add_rate_limited("a"), 2);
        assert_eq!(queue.failures(&"a"), 2);
        assert_eq!(queue.next_delay(&"a"), Duration::from_millis(40));
        let started = tokio::time::Instant::now();
        assert_eq!(
            timeout(Duration::from_secs(1), queue.get()).await,
            Ok(Some("a"))
        );
        assert!(started.elapsed() >= Duration::from_millis(10));
        queue.forget(&"a");
        assert_eq!(queue.failures(&"a"), 0);
    }

    #[tokio::test]
    async fn shut_down_wakes_waiting_workers() {
        let queue: WorkQueue<&str> = WorkQueue::new(fast());
        let waiter = tokio::spawn({
            let queue = queue.clone();
            async move { queue.get().await }
        });
        tokio::task::yield_now().await;
        queue.shut_down();
        assert_eq!(
            timeout(Duration::from_secs(1), waiter)
                .await
                .ok()
                .and_then(Result::ok),
            Some(None)
        );
        queue.add("late");
        assert_eq!(queue.get().await, None);
    }

    #[tokio::test]
    async fn many_workers_each_key_once() {
        let queue = WorkQueue::new(fast());
        for i in 0..100 {
            queue.add(i);
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut workers = Vec::new();
        for _ in 0..4 {
            let queue = queue.clone();
            let seen = Arc::clone(&seen);
            workers.push(tokio::spawn(async move {
                while let Ok(Some(key)) = timeout(Duration::from_millis(50), queue.get()).await {
                    seen.lock().unwrap().push(key);
                    queue.done(&key);
                }
            }));
        }
        for worker in workers {
            worker.await.unwrap();
        }
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn metrics_follow_depth_and_retries() {
        let depth = Gauge::default();
        let retries = Counter::default();
        let queue = WorkQueue::with_metrics(fast(), depth.clone(), retries.clone());
        queue.add(1);
        queue.add(2);
        assert_eq!(depth.get(), 2);
        queue.add_rate_limited(3);
        assert_eq!(retries.get(), 1);
        let _ = queue.get().await;
        assert_eq!(depth.get(), 1);
    }
}
