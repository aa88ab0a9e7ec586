//! [`VolumeReplicator`] for the RBD backend: a claim's image mirrored to the peer Ceph cluster
//! by snapshot-based RBD mirroring (the volume core's [`rbd_volume::mirror`]).
//!
//! The class's parameters, as ceph-csi reads them:
//! - `mirroringMode`: `snapshot` (the default); `journal` is refused (journal-based mirroring
//!   is not provided).
//! - `schedulingInterval`: a number of minutes, hours or days (`5m`, `1h`, `1d`): a mirror
//!   snapshot of a primary is taken that often (by this controller: no ceph-mgr schedule is
//!   needed; where one takes them as often, none is added). Without it, none is taken here.
//! - `schedulingStartTime`: `HH:MM` or `HH:MM:SS` (UTC): the interval's boundaries are counted
//!   from that time of day instead of from the last snapshot.
//! - `replication.storage.openshift.io/*` (csi-addons' secret parameters): ignored; the
//!   volume's own credentials are used.
//!
//! Anything else is refused, naming it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use provisioner::replication::{
    ReplicationError, ReplicationInfo, ReplicationRequest, VolumeReplicator,
};
use rbd_volume::mirror::{self, MirrorError, Schedule};

use crate::backend::RbdBackend;
use crate::backend::pv_build::{ImageLocation, image_location};

const MODE: &str = "mirroringMode";
const INTERVAL: &str = "schedulingInterval";
const START: &str = "schedulingStartTime";
const SECRET_PREFIX: &str = "replication.storage.openshift.io/";

/// [`VolumeReplicator`] for the RBD backend.
pub struct RbdReplicator {
    backend: Arc<RbdBackend>,
}

impl RbdReplicator {
    /// Replicates through `backend`'s connections.
    #[must_use]
    pub fn new(backend: Arc<RbdBackend>) -> Arc<RbdReplicator> {
        Arc::new(RbdReplicator { backend })
    }

    async fn connect(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(ImageLocation, Arc<ceph_rbd::Cluster>), ReplicationError> {
        self.backend
            .connect_to_pv(volume)
            .await
            .map_err(ReplicationError::Failed)
    }
}

/// `schedulingInterval`: `<n>m`, `<n>h` or `<n>d`, n > 0.
fn parse_interval(value: &str) -> Result<Duration, String> {
    let unit = match value.chars().last() {
        Some('m') => 60,
        Some('h') => 3600,
        Some('d') => 86400,
        _ => {
            return Err(format!(
                "{value:?} is not a number of minutes, hours or days (e.g. 5m, 1h, 1d)"
            ));
        }
    };
    let count: u64 = value[..value.len() - 1]
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            format!(
                "{value:?} is not a positive number of minutes, hours or days (e.g. 5m, 1h, 1d)"
            )
        })?;
    Ok(Duration::from_secs(count.saturating_mul(unit)))
}

/// `schedulingStartTime`: `HH:MM[:SS]` (UTC), as seconds into the day.
fn parse_start(value: &str) -> Result<i64, String> {
    let parts: Vec<&str> = value.split(':').collect();
    let numbers: Option<Vec<i64>> = parts
        .iter()
        .map(|p| (p.len() == 2).then(|| p.parse().ok()).flatten())
        .collect();
    match numbers.as_deref() {
        Some([h, m]) if *h < 24 && *m < 60 => Ok(h * 3600 + m * 60),
        Some([h, m, s]) if *h < 24 && *m < 60 && *s < 60 => Ok(h * 3600 + m * 60 + s),
        _ => Err(format!(
            "{value:?} is not a time of day HH:MM or HH:MM:SS (UTC)"
        )),
    }
}

/// The schedule of a class's parameters (already checked).
fn schedule(parameters: &BTreeMap<String, String>) -> Result<Option<Schedule>, ReplicationError> {
    let Some(interval) = parameters.get(INTERVAL) else {
        return Ok(None);
    };
    let interval = parse_interval(interval)
        .map_err(|e| ReplicationError::invalid(format!("parameters.{INTERVAL}"), e))?;
    let start = parameters
        .get(START)
        .map(|s| parse_start(s))
        .transpose()
        .map_err(|e| ReplicationError::invalid(format!("parameters.{START}"), e))?;
    Ok(Some(Schedule { interval, start }))
}

fn mirror_error(volume: &PersistentVolume, error: MirrorError) -> ReplicationError {
    match error {
        e @ (MirrorError::PoolNotMirrored { .. }
        | MirrorError::JournalMode { .. }
        | MirrorError::NotMirrored { .. }) => {
            ReplicationError::invalid(format!("volume {}", volume.name_any()), e.to_string())
        }
        // retried: a resync replaces the image (the daemon removes it and copies it again)
        MirrorError::Ceph(ceph_rbd::Error::NotFound { .. }) => ReplicationError::failed(format!(
            "volume {}: its image does not exist (now: a resync replaces it)",
            volume.name_any()
        )),
        e => ReplicationError::failed(e),
    }
}

#[async_trait]
impl VolumeReplicator for RbdReplicator {
    fn provisioner_name(&self) -> &str {
        self.backend.csi_driver()
    }

    fn serves(&self, volume: &PersistentVolume) -> bool {
        image_location(volume, self.backend.csi_driver()).is_some()
    }

    fn check_parameters(
        &self,
        parameters: &BTreeMap<String, String>,
    ) -> Result<Option<Duration>, ReplicationError> {
        for (key, value) in parameters {
            match key.as_str() {
                MODE if value == "snapshot" => {}
                MODE if value == "journal" => {
                    return Err(ReplicationError::invalid(
                        format!("parameters.{MODE}"),
                        "journal-based mirroring is not provided; use snapshot",
                    ));
                }
                MODE => {
                    return Err(ReplicationError::invalid(
                        format!("parameters.{MODE}"),
                        format!("{value:?} is not snapshot"),
                    ));
                }
                INTERVAL | START => {}
                k if k.starts_with(SECRET_PREFIX) => {}
                other => {
                    return Err(ReplicationError::invalid(
                        format!("parameters.{other}"),
                        format!("unknown parameter (known: {MODE}, {INTERVAL}, {START})"),
                    ));
                }
            }
        }
        if parameters.contains_key(START) && !parameters.contains_key(INTERVAL) {
            return Err(ReplicationError::invalid(
                format!("parameters.{START}"),
                format!("needs {INTERVAL}"),
            ));
        }
        Ok(schedule(parameters)?.map(|s| s.interval))
    }

    async fn primary(
        &self,
        request: &ReplicationRequest<'_>,
        force: bool,
    ) -> Result<ReplicationInfo, ReplicationError> {
        let schedule = schedule(request.parameters)?;
        let (location, cluster) = self.connect(request.volume).await?;
        let pool = location.pool_spec();
        let replication = mirror::primary_tick(
            &cluster,
            &pool,
            &location.image,
            force,
            schedule,
            self.backend.kube_cluster(),
            SystemTime::now(),
        )
        .await
        .map_err(|e| match e {
            MirrorError::Ceph(ceph_rbd::Error::Busy { .. }) => ReplicationError::failed(format!(
                "image {pool}/{} is not promoted: the peer's copy is still primary, or its \
                 demotion has not reached this site yet. Demote it on the peer site; if that \
                 site is lost, annotate this VolumeReplication {}=true to promote anyway",
                location.image,
                provisioner::replication::FORCE_PROMOTE_ANNOTATION
            )),
            e => mirror_error(request.volume, e),
        })?;
        Ok(info_of(&replication))
    }

    async fn secondary(
        &self,
        request: &ReplicationRequest<'_>,
        auto_resync: bool,
    ) -> Result<ReplicationInfo, ReplicationError> {
        let (location, cluster) = self.connect(request.volume).await?;
        mirror::secondary_tick(
            &cluster,
            &location.pool_spec(),
            &location.image,
            auto_resync,
        )
        .await
        .map(|r| info_of(&r))
        .map_err(|e| mirror_error(request.volume, e))
    }

    async fn resync(
        &self,
        request: &ReplicationRequest<'_>,
        triggered: bool,
    ) -> Result<ReplicationInfo, ReplicationError> {
        let (location, cluster) = self.connect(request.volume).await?;
        mirror::resync_tick(&cluster, &location.pool_spec(), &location.image, triggered)
            .await
            .map(|r| info_of(&r))
            .map_err(|e| mirror_error(request.volume, e))
    }

    async fn disable(&self, request: &ReplicationRequest<'_>) -> Result<(), ReplicationError> {
        let (location, cluster) = self.connect(request.volume).await?;
        mirror::disable(&cluster, &location.pool_spec(), &location.image)
            .await
            .map_err(ReplicationError::failed)
    }
}

/// The controller's view of a replication.
fn info_of(r: &mirror::Replication) -> ReplicationInfo {
    let side = if r.primary { &r.peer } else { &r.local };
    let description = side.as_ref().map_or_else(
        || "no status reported yet (is an rbd-mirror daemon running on the peer site?)".to_owned(),
        |s| {
            format!(
                "{}{}: {}",
                if s.up { "up+" } else { "down+" },
                s.state.as_str(),
                s.description
            )
        },
    );
    ReplicationInfo {
        primary: r.primary,
        replaying: r.replaying(),
        description,
        last_sync_time: r
            .last_sync
            .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s.time).ok()),
        last_sync_bytes: r.last_sync.and_then(|s| s.bytes),
        last_sync_duration: r.last_sync.and_then(|s| s.duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_and_start_times_are_read_as_ceph_csi_writes_them() {
        assert_eq!(parse_interval("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_interval("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_interval("2d"), Ok(Duration::from_secs(2 * 86400)));
        for bad in ["", "m", "0m", "5", "5s", "-1h", "1.5h"] {
            assert!(parse_interval(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_start("00:30"), Ok(1800));
        assert_eq!(parse_start("16:18:43"), Ok(16 * 3600 + 18 * 60 + 43));
        for bad in ["", "24:00", "1:30", "12:60", "12:00:00:00", "noon"] {
            assert!(parse_start(bad).is_err(), "{bad:?}");
        }
    }
}
