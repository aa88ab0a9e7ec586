//! A pool of cluster connections shared by all callers.
//!
//! Connections are keyed by (monitors, user, key fingerprint): every claim of a StorageClass
//! shares one connection, a rotated key gets a new one. Concurrent `get`s for the same key wait
//! for a single connect. A connection that failed with a connection-level error is replaced on
//! the next `get`; one unused for `idle_timeout` is closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Cluster, ClusterConfig, Error};

/// Pool settings.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Close connections unused for this long (default 10 min, as ceph-csi).
    pub idle_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            idle_timeout: Duration::from_secs(600),
        }
    }
}

type Key = (String, String, String);

#[derive(Default)]
struct Slot {
    cluster: Option<Arc<Cluster>>,
    last_used: Option<Instant>,
}

/// Shared connections. Clone it freely: clones share the connections.
#[derive(Clone)]
pub struct ConnectionPool {
    inner: Arc<Inner>,
}

#[derive(Default)]
pub(crate) struct Inner {
    options: PoolOptions,
    slots: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Slot>>>>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("idle_timeout", &self.inner.options.idle_timeout)
            .field("connections", &self.len())
            .finish()
    }
}

impl ConnectionPool {
    pub fn new(options: PoolOptions) -> ConnectionPool {
        let inner = Arc::new(Inner {
            options,
            slots: Mutex::default(),
        });
        crate::lifecycle::register_pool(Arc::downgrade(&inner));
        ConnectionPool { inner }
    }

    /// A healthy connection for `cfg`, connecting if needed.
    pub async fn get(&self, cfg: &ClusterConfig) -> Result<Arc<Cluster>, Error> {
        let slot = {
            let mut slots = self
                .inner
                .slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.expire_idle(&mut slots);
            Arc::clone(slots.entry(cfg.pool_key()).or_default())
        };
        let mut slot = slot.lock().await;
        slot.last_used = Some(Instant::now());
        if let Some(cluster) = &slot.cluster {
            if cluster.is_healthy() {
                return Ok(Arc::clone(cluster));
            }
            tracing::info!(monitors = %cfg.monitors, user = %cfg.user, "reconnecting after a connection failure");
        }
        // drop a broken connection before making a new one
        slot.cluster = None;
        let cluster = Arc::new(Cluster::connect(cfg).await?);
        slot.cluster = Some(Arc::clone(&cluster));
        Ok(cluster)
    }

    /// The global IDs of this pool's open connections' client instances (waiting for a
    /// connection being opened): the clients of this process, which fencing never blocklists.
    pub async fn instance_ids(&self) -> Vec<u64> {
        let slots: Vec<_> = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut ids = Vec::new();
        for slot in slots {
            let cluster = slot.lock().await.cluster.clone();
            if let Some(cluster) = cluster
                && let Ok(id) = cluster.instance_id().await
            {
                ids.push(id);
            }
        }
        ids
    }

    /// Number of pooled connections (open or being opened).
    pub fn len(&self) -> usize {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether the pool holds no connection.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every connection no caller holds anymore.
    pub fn clear(&self) {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.retain(|_, slot| Arc::strong_count(slot) > 1);
    }

    /// Drops every connection (at process end: [`crate::shutdown`]). A connection a caller still
    /// holds is shut down when that caller drops it.
    pub fn close_all(&self) {
        self.inner.close_all();
    }

    fn expire_idle(&self, slots: &mut HashMap<Key, Arc<tokio::sync::Mutex<Slot>>>) {
        let idle = self.inner.options.idle_timeout;
        slots.retain(|_, slot| {
            // a slot someone is using (locked, or referenced by a waiter) stays
            let Ok(guard) = slot.try_lock() else {
                return true;
            };
            guard.last_used.is_none_or(|t| t.elapsed() < idle)
        });
    }
}

impl Default for ConnectionPool {
    fn default() -> Self {
        ConnectionPool::new(PoolOptions::default())
    }
}

impl Inner {
    pub(crate) fn close_all(&self) {
        let slots: Vec<_> = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            // a slot being connected right now keeps its connection until that `get` returns
            if let Ok(mut slot) = slot.try_lock() {
                slot.cluster = None;
            }
        }
    }
}
