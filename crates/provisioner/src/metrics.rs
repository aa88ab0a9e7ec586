//! Prometheus metrics (upstream names) and a `/metrics` handler.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `controller_persistentvolumeclaim_provision_total` | counter | class, source |
//! | `controller_persistentvolumeclaim_provision_failed_total` | counter | class, source |
//! | `controller_persistentvolumeclaim_provision_duration_seconds` | histogram | class, source |
//! | `controller_persistentvolume_delete_total` | counter | class |
//! | `controller_persistentvolume_delete_failed_total` | counter | class |
//! | `controller_persistentvolume_delete_duration_seconds` | histogram | class |
//! | `controller_persistentvolumeclaim_expand_total` | counter | class |
//! | `controller_persistentvolumeclaim_expand_failed_total` | counter | class |
//! | `controller_persistentvolumeclaim_expand_duration_seconds` | histogram | class |
//! | `provisioner_workqueue_depth` | gauge | |
//! | `provisioner_workqueue_retries_total` | counter | |
//! | `leader_election_master_status` | gauge (1 = leader) | name |
//! | `reclaimspace_reclaimed_bytes_total` | counter | persistentvolume |
//! | `reclaimspace_failed_total` | counter | persistentvolume |
//!
//! `source` is the kind of the claim's data source (empty for a new, blank volume).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the provisioning metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProvisionLabels {
    /// StorageClass name.
    pub class: String,
    /// Data source kind, empty for a blank volume.
    pub source: String,
}

/// Labels of the deletion and expansion metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    /// StorageClass name.
    pub class: String,
}

/// Labels of the reclaim-space metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabels {
    /// PersistentVolume name (empty when the claim had none).
    pub persistentvolume: String,
}

/// Labels of the leader-election gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaderLabels {
    /// Lease name.
    pub name: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 10 ms .. ~80 s
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// All metrics of the controller; cheap to clone (the metrics are shared).
#[derive(Clone, Debug)]
pub struct Metrics {
    pub(crate) provision_total: Family<ProvisionLabels, Counter>,
    pub(crate) provision_failed: Family<ProvisionLabels, Counter>,
    pub(crate) provision_duration: HistogramFamily<ProvisionLabels>,
    pub(crate) delete_total: Family<ClassLabels, Counter>,
    pub(crate) delete_failed: Family<ClassLabels, Counter>,
    pub(crate) delete_duration: HistogramFamily<ClassLabels>,
    pub(crate) expand_total: Family<ClassLabels, Counter>,
    pub(crate) expand_failed: Family<ClassLabels, Counter>,
    pub(crate) expand_duration: HistogramFamily<ClassLabels>,
    pub(crate) queue_depth: Gauge,
    pub(crate) queue_retries: Counter,
    pub(crate) leader: Family<LeaderLabels, Gauge>,
    pub(crate) reclaimed_bytes: Family<VolumeLabels, Counter>,
    pub(crate) reclaim_failed: Family<VolumeLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        metrics.register(registry);
        metrics
    }

    /// Creates metrics that no registry exports (for tests and embedders that don't care).
    #[must_use]
    pub fn unregistered() -> Self {
        Self {
            provision_total: Family::default(),
            provision_failed: Family::default(),
            provision_duration: Family::new_with_constructor(duration_histogram),
            delete_total: Family::default(),
            delete_failed: Family::default(),
            delete_duration: Family::new_with_constructor(duration_histogram),
            expand_total: Family::default(),
            expand_failed: Family::default(),
            expand_duration: Family::new_with_constructor(duration_histogram),
            queue_depth: Gauge::default(),
            queue_retries: Counter::default(),
            leader: Family::default(),
            reclaimed_bytes: Family::default(),
            reclaim_failed: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        let claim = "controller_persistentvolumeclaim";
        let volume = "controller_persistentvolume";
        registry.register(
            format!("{claim}_provision"),
            "Provisioned volumes",
            self.provision_total.clone(),
        );
        registry.register(
            format!("{claim}_provision_failed"),
            "Failed provisioning attempts",
            self.provision_failed.clone(),
        );
        registry.register(
            format!("{claim}_provision_duration_seconds"),
            "Duration of successful provisioning operations",
            self.provision_duration.clone(),
        );
        registry.register(
            format!("{volume}_delete"),
            "Deleted volumes",
            self.delete_total.clone(),
        );
        registry.register(
            format!("{volume}_delete_failed"),
            "Failed deletion attempts",
            self.delete_failed.clone(),
        );
        registry.register(
            format!("{volume}_delete_duration_seconds"),
            "Duration of successful deletions",
            self.delete_duration.clone(),
        );
        registry.register(
            format!("{claim}_expand"),
            "Expanded volumes",
            self.expand_total.clone(),
        );
        registry.register(
            format!("{claim}_expand_failed"),
            "Failed expansion attempts",
            self.expand_failed.clone(),
        );
        registry.register(
            format!("{claim}_expand_duration_seconds"),
            "Duration of successful expansions",
            self.expand_duration.clone(),
        );
        registry.register(
            "provisioner_workqueue_depth",
            "Keys waiting in the work queue",
            self.queue_depth.clone(),
        );
        registry.register(
            "provisioner_workqueue_retries",
            "Keys re-queued after a failure",
            self.queue_retries.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "1 while this instance holds the lease",
            self.leader.clone(),
        );
        registry.register(
            "reclaimspace_reclaimed_bytes",
            "Bytes ReclaimSpaceJobs gave back to the storage",
            self.reclaimed_bytes.clone(),
        );
        registry.register(
            "reclaimspace_failed",
            "ReclaimSpaceJobs that failed",
            self.reclaim_failed.clone(),
        );
    }

    pub(crate) fn reclaimed(&self, volume: &str, bytes: u64) {
        self.reclaimed_bytes
            .get_or_create(&VolumeLabels {
                persistentvolume: volume.to_owned(),
            })
            .inc_by(bytes);
    }

    pub(crate) fn reclaim_failed(&self, volume: &str) {
        self.reclaim_failed
            .get_or_create(&VolumeLabels {
                persistentvolume: volume.to_owned(),
            })
            .inc();
    }

    pub(crate) fn provisioned(&self, labels: &ProvisionLabels, took: Duration) {
        self.provision_total.get_or_create(labels).inc();
        self.provision_duration
            .get_or_create(labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn provision_failed(&self, labels: &ProvisionLabels) {
        self.provision_failed.get_or_create(labels).inc();
    }

    pub(crate) fn deleted(&self, class: &str, took: Duration) {
        let labels = ClassLabels {
            class: class.to_owned(),
        };
        self.delete_total.get_or_create(&labels).inc();
        self.delete_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn delete_failed(&self, class: &str) {
        self.delete_failed
            .get_or_create(&ClassLabels {
                class: class.to_owned(),
            })
            .inc();
    }

    pub(crate) fn expanded(&self, class: &str, took: Duration) {
        let labels = ClassLabels {
            class: class.to_owned(),
        };
        self.expand_total.get_or_create(&labels).inc();
        self.expand_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn expand_failed(&self, class: &str) {
        self.expand_failed
            .get_or_create(&ClassLabels {
                class: class.to_owned(),
            })
            .inc();
    }

    pub(crate) fn set_leader(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&LeaderLabels {
                name: lease.to_owned(),
            })
            .set(i64::from(leading));
    }

    /// Whether this process currently leads `lease` (as the `leader_election_master_status`
    /// gauge says), for health endpoints.
    #[must_use]
    pub fn is_leader(&self, lease: &str) -> bool {
        self.leader
            .get_or_create(&LeaderLabels {
                name: lease.to_owned(),
            })
            .get()
            == 1
    }
}

/// Encodes `registry` in the Prometheus/OpenMetrics text format.
///
/// # Errors
/// Only if a metric fails to encode (a formatting error).
pub fn encode_text(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut body = String::new();
    encode(&mut body, registry)?;
    Ok(body)
}

/// An axum router serving `registry` on `GET /metrics`.
pub fn router(registry: Arc<Registry>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let registry = Arc::clone(&registry);
            async move {
                match encode_text(&registry) {
                    Ok(body) => (
                        StatusCode::OK,
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                        .into_response(),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_upstream_names_with_labels() {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        let labels = ProvisionLabels {
            class: "fast".to_owned(),
            source: String::new(),
        };
        metrics.provisioned(&labels, Duration::from_millis(20));
        metrics.provision_failed(&labels);
        metrics.deleted("fast", Duration::from_millis(5));
        metrics.delete_failed("fast");
        let text = encode_text(&registry).unwrap();
        for expected in [
            "controller_persistentvolumeclaim_provision_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"fast\"} 1",
            "controller_persistentvolume_delete_duration_seconds_count{class=\"fast\"} 1",
            "provisioner_workqueue_depth 0",
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
    }

    #[tokio::test]
    async fn router_serves_metrics() {
        use tower::ServiceExt;
        let mut registry = Registry::default();
        let _metrics = Metrics::new(&mut registry);
        let response = router(Arc::new(registry))
            .oneshot(
                axum::http::Request::get("/metrics")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}
