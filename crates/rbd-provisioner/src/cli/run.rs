//! The provisioning controller: backend, library controller, leader election, metrics server.

use std::sync::Arc;

use anyhow::Context;
use ceph_rbd::{ConnectionPool, PoolOptions};
use prometheus_client::registry::Registry;
use provisioner::queue::Backoff;
use provisioner::{
    Config, Controller, ControllerError, LeaderElectionConfig, LeaderElector, Metrics,
};

use crate::backend::image::Naming;
use crate::backend::{BackendConfig, RbdBackend};
use crate::cli::ProvisionerArgs;

/// Runs until SIGTERM/SIGINT; an error when the lease is lost or the controller fails.
pub async fn run(args: ProvisionerArgs) -> anyhow::Result<()> {
    let client = crate::cli::kube_client::client(&args.kube).await?;
    let identity = args
        .id
        .clone()
        .unwrap_or_else(|| args.provisioner_name.clone());
    let clusters = match &args.cluster_config {
        Some(path) => Some(Arc::new(
            rbd_volume::clusters::ClusterConfigFile::open(path.clone())
                .map_err(|e| anyhow::anyhow!("--cluster-config: {e}"))?,
        )),
        None => None,
    };
    // Without it (RBAC of an older release that cannot read kube-system) the provisioner still
    // runs, as before this identity existed: its images then name no cluster, and gc leaves
    // them as of unknown owner cluster.
    let kube_cluster = match crate::cli::kube_client::kube_cluster_id(&client, &args.kube).await {
        Ok(id) => {
            tracing::info!(kube_cluster = %id, "Kubernetes cluster identity recorded on images");
            id
        }
        // only a refusal; any other failure (API server unreachable) stops the start as usual
        Err(e)
            if e.chain().any(|cause| {
                matches!(cause.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 403)
            }) =>
        {
            tracing::warn!(
                error = format!("{e:#}"),
                "no Kubernetes cluster identity: images are made without one (grant get on \
                 namespace kube-system, see deploy/rbac.yaml, or give --kube-cluster-id)"
            );
            String::new()
        }
        Err(e) => return Err(e),
    };
    let backend = RbdBackend::new(
        client.clone(),
        ConnectionPool::new(PoolOptions::default()),
        BackendConfig {
            identity: identity.clone(),
            kube_cluster,
            naming: Naming {
                prefix: args.image_name_prefix.clone(),
                use_pv_name: args.use_pv_name,
            },
            source_mode: args.pv_source,
            csi_driver: args.csi_driver_name.clone(),
            provisioner_name: args.provisioner_name.clone(),
            op_timeout: args.command_timeout,
            clusters,
            topology_labels: args.topology_labels.0.clone(),
            kms_config: args.kms_config.clone(),
        },
    );

    let mut config = Config::new(args.provisioner_name.clone());
    config.identity = identity.clone();
    config.workers = args.workers.max(1);
    config.backoff = Backoff {
        base_delay: args.retry_interval_start,
        max_delay: args.retry_interval_max,
    };
    config.failure_threshold = (args.failure_threshold > 0).then_some(args.failure_threshold);
    config.resync_period = args.resync_period;
    config.add_finalizer = args.add_finalizer;
    config.shutdown_grace_period = args.shutdown_grace_period;
    config.step_hook = Some(crate::cli::crashpoint::hit);

    let mut registry = Registry::default();
    let metrics = Metrics::new(&mut registry);
    if args.metrics_port != 0 {
        let addr = format!("{}:{}", args.metrics_address, args.metrics_port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding the metrics server to {addr}"))?;
        let readiness = Readiness {
            backend: backend.clone(),
            metrics: metrics.clone(),
            lease: args
                .leader_elect
                .then(|| provisioner::leader::lease_name_for(&args.provisioner_name)),
        };
        let app = provisioner::metrics::router(Arc::new(registry))
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .route(
                "/readyz",
                axum::routing::get(move || readyz(readiness.clone())),
            );
        tracing::info!(%addr, "serving metrics on /metrics");
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
    }

    let config_backoff = config.backoff;
    let snapshotter = provisioner::snapshot::task(
        client.clone(),
        backend.clone(),
        crate::backend::snapshots::controller_config(args.workers.max(1), &identity),
    );
    let (claims_seen, protection) =
        provisioner::data_source::protection::controller(client.clone(), config_backoff);
    anyhow::ensure!(
        args.fence_expiry >= std::time::Duration::from_secs(1),
        "--fence-expiry: must be at least 1s (blocklist entries expire after it)"
    );
    let fencer = crate::backend::fencing::RbdFencer::new(backend.clone(), args.fence_expiry);
    let fencing = args
        .fencing
        .then(|| provisioner::fencing::Fencing::new(client.clone(), fencer.clone(), &identity));
    let network_fence = args.network_fence.then(|| {
        provisioner::network_fence::task(
            client.clone(),
            fencer.clone(),
            provisioner::network_fence::NetworkFenceConfig {
                backoff: config_backoff,
            },
        )
    });
    let reclaim_space = args.reclaim_space.then(|| {
        let reclaimer = crate::backend::reclaim::RbdReclaimer::new(backend.clone());
        let config = provisioner::reclaim_space::ReclaimSpaceConfig {
            backoff: config_backoff,
            metrics: metrics.clone(),
            ..Default::default()
        };
        let schedules = provisioner::reclaim_space::schedule::controller(
            client.clone(),
            reclaimer.clone(),
            config.component.clone(),
        );
        (
            provisioner::reclaim_space::task(client.clone(), reclaimer, config),
            schedules,
        )
    });
    let replication = args.volume_replication.then(|| {
        provisioner::replication::task(
            client.clone(),
            crate::backend::replication::RbdReplicator::new(backend.clone()),
            provisioner::replication::ReplicationConfig {
                backoff: config_backoff,
                ..Default::default()
            },
        )
    });
    let node_watch = fencing.clone().map(|fencing| {
        provisioner::fencing::task(
            client.clone(),
            fencing,
            provisioner::fencing::FencingConfig {
                backoff: config_backoff,
                ..Default::default()
            },
        )
    });
    let attacher = args.attacher.then(|| {
        provisioner::attach::task(
            client.clone(),
            backend.clone(),
            provisioner::attach::AttachControllerConfig {
                backoff: config_backoff,
                fencing: fencing.clone(),
                ..Default::default()
            },
        )
    });
    let mut controller = Controller::new(client.clone(), config, backend.clone())
        .with_expander(backend.clone())
        .with_modifier(backend)
        .with_metrics(metrics)
        .with_companion(snapshotter)
        .with_claim_observer(claims_seen)
        .with_companion(protection);
    if let Some(attacher) = attacher {
        controller = controller.with_companion(attacher);
    }
    if let Some(node_watch) = node_watch {
        controller = controller.with_companion(node_watch);
    }
    if let Some(network_fence) = network_fence {
        controller = controller.with_companion(network_fence);
    }
    if let Some(replication) = replication {
        controller = controller.with_companion(replication);
    }
    if let Some((reclaim_space, (claims_seen, schedules))) = reclaim_space {
        controller = controller
            .with_companion(reclaim_space)
            .with_claim_observer(claims_seen)
            .with_companion(schedules);
    }
    tracing::info!(provisioner = %args.provisioner_name, identity = %identity, ceph_client = %ceph_rbd::key::client_version(), "starting");
    let result = if args.leader_elect {
        let mut le = LeaderElectionConfig::new(
            &args.provisioner_name,
            &args.leader_election_namespace,
            &holder_identity(),
        );
        le.lease_duration = args.leader_election_lease_duration;
        le.renew_deadline = args.leader_election_renew_deadline;
        le.retry_period = args.leader_election_retry_period;
        tracing::info!(lease = %le.lease_name, namespace = %le.namespace, holder = %le.identity, "waiting for leadership");
        controller
            .run_with_leader_election(LeaderElector::new(client, le), shutdown_signal())
            .await
    } else {
        controller.run(shutdown_signal()).await
    };
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(ControllerError::LeaseLost) => {
            anyhow::bail!("leader lease lost; exiting so that another replica takes over")
        }
        Err(e) => Err(e).context("controller failed"),
    }
}

/// What `/readyz` reports.
#[derive(Clone)]
struct Readiness {
    backend: Arc<RbdBackend>,
    metrics: Metrics,
    /// The Lease name when leader election is on.
    lease: Option<String>,
}

/// 200 unless this replica leads and Ceph is unreachable (503). A standby replica is ready: it
/// can take over. The body says which role and what Ceph last answered.
async fn readyz(r: Readiness) -> (axum::http::StatusCode, String) {
    let leading = r
        .lease
        .as_deref()
        .is_none_or(|lease| r.metrics.is_leader(lease));
    let ceph = r.backend.ceph_reachable();
    let role = if leading { "leader" } else { "standby" };
    let body = format!("{{\"role\":\"{role}\",\"cephReachable\":{ceph}}}\n");
    let status = if leading && !ceph {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    } else {
        axum::http::StatusCode::OK
    };
    (status, body)
}

/// Unique per process: two replicas must never share a holder identity.
fn holder_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "rbd-provisioner".into());
    format!("{host}_{:08x}", rand::random::<u32>())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("shutdown signal received");
}
