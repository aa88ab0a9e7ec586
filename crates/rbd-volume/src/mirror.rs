//! Disaster recovery: a volume's image mirrored to a peer Ceph cluster by RBD snapshot-based
//! mirroring, the steps both front doors (and the replication controller) share.
//!
//! The pool must be mirrored in `image` mode on both sites, and the sites peered (`rbd mirror
//! pool peer bootstrap`); an `rbd-mirror` daemon on each site replays the peer's primary images.
//! Here: [`enable`] (snapshot mode, refused with the reason in a pool without mirroring or for
//! an image mirrored by journaling), [`snapshot_if_due`] (a mirror snapshot when one is due by its
//! [`Schedule`]: what is replicated is the image as of its last mirror snapshot),
//! [`replication`] (role, the peer site's status and the last sync), and promotion, demotion,
//! resync and disabling.

use std::time::{Duration, SystemTime};

use ceph_rbd::{
    Cluster, MirrorGlobalStatus, MirrorImageState, MirrorMode, MirrorSiteStatus, MirrorSnapshot,
    MirrorStatusState,
};

/// Why a mirroring step was refused. Ceph's own errors pass through.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(
        "pool {pool} is not mirrored in image mode (its mode is {mode}): enable it on both sites \
         (rbd mirror pool enable {pool} image) and peer them (rbd mirror pool peer bootstrap)"
    )]
    PoolNotMirrored { pool: String, mode: &'static str },
    #[error(
        "image {image} is mirrored by journaling; only snapshot-based mirroring is provided \
         (mirroringMode: snapshot)"
    )]
    JournalMode { image: String },
    #[error(
        "image {image} is demoted, and is removed once the peer site has the demotion so that \
         the peer's copy survives; the peer has not got it yet ({status}). If the peer site is \
         gone for good, disable its mirroring here (rbd mirror image disable --force {image})"
    )]
    PeerNotDemoted { image: String, status: String },
    #[error(
        "image {image} is not mirrored: make it primary first (replicationState: primary), or \
         on the other site"
    )]
    NotMirrored { image: String },
    #[error(transparent)]
    Ceph(#[from] ceph_rbd::Error),
}

/// The last completed sync, from the `rbd-mirror` daemon's description of the replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncInfo {
    /// When the synced snapshot was taken (seconds since the epoch).
    pub time: i64,
    /// Bytes the sync copied.
    pub bytes: Option<u64>,
    /// How long the sync took.
    pub duration: Option<Duration>,
}

/// The sync details of a snapshot replay's description (`replaying, {"last_snapshot_bytes":
/// ..., "last_snapshot_sync_seconds": ..., "local_snapshot_timestamp": ...,
/// "remote_snapshot_timestamp": ..., ...}`): the time of the last synced snapshot is
/// `local_snapshot_timestamp` (Ceph 17 and later), else `remote_snapshot_timestamp` while the
/// replay is idle (Ceph 16 reports only that one, and an idle replay has synced it). `None`
/// without a time.
#[must_use]
pub fn parse_sync_info(description: &str) -> Option<SyncInfo> {
    let (_, json) = description.split_once(',')?;
    let v: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
    let idle = v["replay_state"].as_str() == Some("idle");
    let time = v["local_snapshot_timestamp"]
        .as_i64()
        .filter(|t| *t > 0)
        .or_else(|| {
            v["remote_snapshot_timestamp"]
                .as_i64()
                .filter(|t| *t > 0 && idle)
        })?;
    Some(SyncInfo {
        time,
        bytes: v["last_snapshot_bytes"].as_u64(),
        duration: v["last_snapshot_sync_seconds"]
            .as_u64()
            .map(Duration::from_secs),
    })
}

/// A mirrored image's replication as this site sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replication {
    pub state: MirrorImageState,
    /// This copy takes writes and mirror snapshots.
    pub primary: bool,
    /// The image's ID across the sites.
    pub global_id: String,
    /// The peer site's status of the image (for a primary: the peer daemon's replay of it).
    pub peer: Option<MirrorSiteStatus>,
    /// This site's own status (for a non-primary: its daemon's replay from the peer).
    pub local: Option<MirrorSiteStatus>,
    /// The last completed sync, as the replaying site reports it.
    pub last_sync: Option<SyncInfo>,
}

impl Replication {
    /// A non-primary copy that diverged from the peer's primary (split-brain: both were
    /// primary): it replays again only after a resync.
    #[must_use]
    pub fn diverged(&self) -> bool {
        !self.primary
            && self.local.as_ref().is_some_and(|s| {
                s.state == MirrorStatusState::Error && s.description.contains("split-brain")
            })
    }

    /// Whether a daemon replays the image now (up and replaying on the replaying side).
    #[must_use]
    pub fn replaying(&self) -> bool {
        let side = if self.primary {
            &self.peer
        } else {
            &self.local
        };
        side.as_ref()
            .is_some_and(|s| s.up && s.state == MirrorStatusState::Replaying)
    }
}

/// Enables snapshot-based mirroring of `pool/image` (a `pool[/namespace]` spec), which becomes
/// the primary copy. Idempotent.
///
/// # Errors
/// [`MirrorError::PoolNotMirrored`] (nothing changed), [`MirrorError::JournalMode`], Ceph
/// errors.
pub async fn enable(cluster: &Cluster, pool: &str, image: &str) -> Result<(), MirrorError> {
    let mode = cluster.mirror_mode(pool).await?;
    if mode != MirrorMode::Image {
        return Err(MirrorError::PoolNotMirrored {
            pool: pool.to_owned(),
            mode: mode.as_str(),
        });
    }
    let info = cluster.mirror_image_info(pool, image).await?;
    match (info.state, info.snapshot_mode) {
        (MirrorImageState::Enabled, Some(true)) => Ok(()),
        (MirrorImageState::Enabled, Some(false)) => Err(MirrorError::JournalMode {
            image: format!("{pool}/{image}"),
        }),
        _ => Ok(cluster.mirror_image_enable(pool, image).await?),
    }
}

/// When mirror snapshots are due: every `interval`, on the boundaries counted from `start`
/// (seconds since the epoch) when set, else `interval` after the newest snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub interval: Duration,
    pub start: Option<i64>,
}

impl Schedule {
    /// Every `interval` after the newest snapshot.
    #[must_use]
    pub fn every(interval: Duration) -> Schedule {
        Schedule {
            interval,
            start: None,
        }
    }

    /// Whether a snapshot is due at `now` when the newest was taken at `newest` (seconds since
    /// the epoch): the first at once; then once per boundary.
    #[must_use]
    pub fn due(&self, newest: Option<i64>, now: i64) -> bool {
        let Some(newest) = newest else {
            return true;
        };
        let interval = i64::try_from(self.interval.as_secs()).unwrap_or(i64::MAX);
        match self.start {
            _ if interval == 0 => true,
            None => now.saturating_sub(newest) >= interval,
            Some(start) if now < start => false,
            Some(start) => newest < start + (now - start) / interval * interval,
        }
    }
}

/// Takes a mirror snapshot of the primary `pool/image` when one is due at `now` by `schedule`;
/// its ID, `None` when not due or not primary.
///
/// # Errors
/// Ceph errors.
pub async fn snapshot_if_due(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    schedule: Schedule,
    now: SystemTime,
) -> Result<Option<u64>, MirrorError> {
    let (_, taken) = cluster
        .mirror_tick(pool, image, due_at(Some(schedule), now))
        .await?;
    Ok(taken)
}

/// Whether `schedule` (none: never) has a snapshot due at `now` after a primary's mirror
/// snapshots.
fn due_at(
    schedule: Option<Schedule>,
    now: SystemTime,
) -> impl FnOnce(&[MirrorSnapshot]) -> bool + Send + 'static {
    let now_s = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    move |snapshots: &[MirrorSnapshot]| {
        let newest = snapshots
            .iter()
            .filter(|s| s.primary)
            .map(|s| s.created)
            .max();
        schedule.is_some_and(|s| s.due(newest, now_s))
    }
}

/// The replication of `pool/image` as this site sees it.
///
/// # Errors
/// Ceph errors.
pub async fn replication(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Replication, MirrorError> {
    Ok(replication_of(
        cluster.mirror_image_status(pool, image).await?,
    ))
}

fn replication_of(status: MirrorGlobalStatus) -> Replication {
    let (local, peers): (Vec<_>, Vec<_>) = status
        .sites
        .into_iter()
        .partition(|s| s.mirror_uuid.is_empty());
    let local = local.into_iter().next();
    let peer = peers.into_iter().next();
    let replaying_side = if status.info.primary { &peer } else { &local };
    let last_sync = replaying_side
        .as_ref()
        .and_then(|s| parse_sync_info(&s.description));
    Replication {
        state: status.info.state,
        primary: status.info.primary,
        global_id: status.info.global_id,
        peer,
        local,
        last_sync,
    }
}

/// A primary's periodic look: mirroring enabled (snapshot mode; refused as [`enable`] refuses),
/// the copy promoted when it is not primary (`force`: while the peer's is), a mirror snapshot
/// when `schedule` has one due at `now`, and the replication as it is. In the steady state (a
/// primary already) one open of the image, plus the snapshot when due; the owner record is made
/// to name `kube_cluster` ([`record_primary_site`]).
///
/// # Errors
/// [`MirrorError::PoolNotMirrored`], [`MirrorError::JournalMode`], Ceph errors (`Busy`: the
/// peer's copy is still primary and `force` is not set).
pub async fn primary_tick(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    force: bool,
    schedule: Option<Schedule>,
    kube_cluster: &str,
    now: SystemTime,
) -> Result<Replication, MirrorError> {
    let (status, _) = cluster
        .mirror_tick(pool, image, due_at(schedule, now))
        .await?;
    let info = &status.info;
    let changed = if info.state != MirrorImageState::Enabled {
        enable(cluster, pool, image).await?;
        true
    } else if info.snapshot_mode == Some(false) {
        return Err(MirrorError::JournalMode {
            image: format!("{pool}/{image}"),
        });
    } else if !info.primary {
        promote(cluster, pool, image, force).await?;
        true
    } else {
        false
    };
    record_primary_site(cluster, pool, image, kube_cluster).await?;
    if changed {
        return replication(cluster, pool, image).await;
    }
    Ok(replication_of(status))
}

/// A secondary's periodic look: the copy demoted when it is primary, resynced with
/// `auto_resync` when it diverged from the peer's primary ([`Replication::diverged`]), and the
/// replication as it is. One open of the image in the steady state.
///
/// # Errors
/// [`MirrorError::NotMirrored`], Ceph errors.
pub async fn secondary_tick(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    auto_resync: bool,
) -> Result<Replication, MirrorError> {
    let mut r = demoted(cluster, pool, image).await?;
    if auto_resync && r.diverged() {
        resync(cluster, pool, image).await?;
        r = replication(cluster, pool, image).await?;
    }
    Ok(r)
}

/// A resync's periodic look: the copy demoted when it is primary, and, unless `triggered` (asked
/// before) or the copy replays the peer's primary, a full resync asked for; the replication as
/// it is.
///
/// # Errors
/// [`MirrorError::NotMirrored`], Ceph errors.
pub async fn resync_tick(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    triggered: bool,
) -> Result<Replication, MirrorError> {
    let r = demoted(cluster, pool, image).await?;
    if triggered || r.replaying() {
        return Ok(r);
    }
    resync(cluster, pool, image).await?;
    replication(cluster, pool, image).await
}

/// The replication once this copy is not primary (demoted if it was).
async fn demoted(cluster: &Cluster, pool: &str, image: &str) -> Result<Replication, MirrorError> {
    let r = replication(cluster, pool, image).await?;
    if r.state != MirrorImageState::Enabled {
        return Err(MirrorError::NotMirrored {
            image: format!("{pool}/{image}"),
        });
    }
    if !r.primary {
        return Ok(r);
    }
    demote(cluster, pool, image).await?;
    replication(cluster, pool, image).await
}

/// Makes this site's copy primary (`force`: while the peer is unreachable and still primary).
///
/// # Errors
/// Ceph errors (`Busy` until the peer's demotion has replayed here, without `force`).
pub async fn promote(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    force: bool,
) -> Result<(), MirrorError> {
    Ok(cluster.mirror_image_promote(pool, image, force).await?)
}

/// Records the Kubernetes cluster `kube_cluster` in the owner record of the primary
/// `pool/image` when it names another one: the record follows the primary copy (mirrored with
/// the image, it names the site that made the image until the peer site promotes its copy),
/// so that the site whose copy is primary can delete it. Nothing when the record names no
/// cluster or `kube_cluster` is empty.
///
/// # Errors
/// Ceph errors.
pub async fn record_primary_site(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    kube_cluster: &str,
) -> Result<(), MirrorError> {
    let meta = cluster.metadata_list_unopened(pool, image).await?;
    match meta.get(crate::owner::META_KUBE_CLUSTER) {
        Some(recorded) if !kube_cluster.is_empty() && recorded != kube_cluster => {
            tracing::info!(pool, image, from = %recorded, to = kube_cluster, "the owner record follows the promoted copy");
            Ok(cluster
                .metadata_set(pool, image, crate::owner::META_KUBE_CLUSTER, kube_cluster)
                .await?)
        }
        _ => Ok(()),
    }
}

/// Makes this site's copy non-primary. Idempotent.
///
/// # Errors
/// Ceph errors.
pub async fn demote(cluster: &Cluster, pool: &str, image: &str) -> Result<(), MirrorError> {
    let info = cluster.mirror_image_info(pool, image).await?;
    if info.state == MirrorImageState::Enabled && !info.primary {
        return Ok(());
    }
    Ok(cluster.mirror_image_demote(pool, image).await?)
}

/// Flags the non-primary copy for a full resync from the peer's primary.
///
/// # Errors
/// Ceph errors.
pub async fn resync(cluster: &Cluster, pool: &str, image: &str) -> Result<(), MirrorError> {
    Ok(cluster.mirror_image_resync(pool, image).await?)
}

/// Disables the mirroring of `pool/image` (forced for a non-primary copy, which stays as a
/// plain image). Nothing when it is not mirrored or does not exist. For a primary copy the
/// peer's daemon then removes the peer's copy: the replication is over.
///
/// # Errors
/// Ceph errors.
pub async fn disable(cluster: &Cluster, pool: &str, image: &str) -> Result<(), MirrorError> {
    let info = match cluster.mirror_image_info(pool, image).await {
        Ok(info) => info,
        Err(ceph_rbd::Error::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if info.state == MirrorImageState::Disabled {
        return Ok(());
    }
    match cluster
        .mirror_image_disable(pool, image, !info.primary)
        .await
    {
        Err(ceph_rbd::Error::NotFound { .. }) | Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How long [`release_for_removal`] waits for the peer to have a primary's demotion.
const PEER_DEMOTION_WAIT: Duration = Duration::from_secs(20);

/// What a peer's daemon reports once it has a primary's demotion.
const REMOTE_DEMOTED: &str = "remote image demoted";

/// As [`release_for_removal`], with the errors of a lifecycle operation.
pub(crate) async fn release_before_delete(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<(), crate::lifecycle::Error> {
    match release_for_removal(cluster, pool, image).await {
        Ok(()) => Ok(()),
        Err(MirrorError::Ceph(e)) => Err(e.into()),
        Err(e) => Err(crate::lifecycle::Error::MirrorPeer(e)),
    }
}

/// Readies a mirrored `pool/image` for its removal without taking the peer site's copy with
/// it: a primary copy is demoted first and its mirroring disabled only once the peer's daemon
/// has the demotion (waiting up to 20 s for it), which leaves the peer an orphaned copy it keeps
/// and can promote; removing a primary, or disabling its mirroring, would make the peer's daemon
/// delete the peer's copy. A non-primary copy's mirroring is disabled at once (it stays a plain
/// image here). Nothing when the pool or image is not mirrored or the image does not exist.
///
/// # Errors
/// [`MirrorError::PeerNotDemoted`] (retry later), Ceph errors.
pub async fn release_for_removal(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<(), MirrorError> {
    match cluster.mirror_mode(pool).await {
        Ok(MirrorMode::Disabled) => return Ok(()),
        Ok(_) => {}
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let info = match cluster.mirror_image_info(pool, image).await {
        Ok(info) => info,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if info.state == MirrorImageState::Disabled {
        return Ok(());
    }
    if info.primary {
        demote(cluster, pool, image).await?;
    }
    // a copy demoted here (now or by an earlier try) waits for the peer to have the demotion;
    // a peer whose copy is primary (after a failover) loses nothing
    let deadline = std::time::Instant::now() + PEER_DEMOTION_WAIT;
    loop {
        let status = cluster.mirror_image_status(pool, image).await?;
        let peers: Vec<&MirrorSiteStatus> = status
            .sites
            .iter()
            .filter(|s| !s.mirror_uuid.is_empty())
            .collect();
        // every peer has the demotion or a primary copy of its own (after a failover)
        if peers.iter().all(|p| {
            p.description.contains(REMOTE_DEMOTED)
                || p.description.contains("local image is primary")
        }) {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let status = peers
                .iter()
                .map(|p| {
                    format!(
                        "{}{}: {}",
                        if p.up { "up+" } else { "down+" },
                        p.state.as_str(),
                        p.description
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(MirrorError::PeerNotDemoted {
                image: format!("{pool}/{image}"),
                status,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    disable(cluster, pool, image).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_due_per_interval_or_on_the_start_time_s_boundaries() {
        let hourly = Schedule::every(Duration::from_secs(3600));
        assert!(hourly.due(None, 1000));
        assert!(!hourly.due(Some(1000), 4599));
        assert!(hourly.due(Some(1000), 4600));
        // every hour at :30 (a start time of 00:30)
        let at_half = Schedule {
            interval: Duration::from_secs(3600),
            start: Some(1800),
        };
        assert!(!at_half.due(Some(7200), 7200 + 1799), "before 02:30");
        assert!(at_half.due(Some(7200), 7200 + 1800), "02:30");
        assert!(
            !at_half.due(Some(9000), 9000 + 3599),
            "taken at 02:30, before 03:30"
        );
        assert!(!at_half.due(Some(2000), 1000), "before the start");
        assert!(Schedule::every(Duration::ZERO).due(Some(5), 5));
    }

    #[test]
    fn the_last_sync_is_read_from_the_daemons_description() {
        // Ceph 17 and later (ceph-csi's example)
        let quincy = r#"replaying, {"bytes_per_second":0.0,"bytes_per_snapshot":81920.0,"last_snapshot_bytes":81920,"last_snapshot_sync_seconds":3,"local_snapshot_timestamp":1684675261,"remote_snapshot_timestamp":1684675261,"replay_state":"idle"}"#;
        assert_eq!(
            parse_sync_info(quincy),
            Some(SyncInfo {
                time: 1_684_675_261,
                bytes: Some(81920),
                duration: Some(Duration::from_secs(3)),
            })
        );
        // Ceph 16: the remote timestamp, once the replay is idle
        let pacific = r#"replaying, {"bytes_per_second":0.0,"bytes_per_snapshot":0.0,"last_snapshot_bytes":0,"last_snapshot_sync_seconds":0,"remote_snapshot_timestamp":1796565456,"replay_state":"idle"}"#;
        assert_eq!(
            parse_sync_info(pacific).map(|s| s.time),
            Some(1_796_565_456)
        );
        let syncing = pacific.replace("idle", "syncing");
        assert_eq!(parse_sync_info(&syncing), None);
        for nothing in [
            "",
            "status not found",
            "local image is primary",
            "replaying, {",
        ] {
            assert_eq!(parse_sync_info(nothing), None, "{nothing}");
        }
    }
}
