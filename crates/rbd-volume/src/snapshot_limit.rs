//! krbd's snapshot limit: a kernel client refuses to map an image with more than 510 snapshots,
//! and every snapshot image ([`crate::snapshot`]) leaves its temporary snapshot in the source's
//! snapshot trash for as long as it depends on it. A volume in use through krbd would stop
//! mapping after about 500 live snapshots.
//!
//! As ceph-csi does (`maxsnapshotsonimage`, `minsnapshotsonimage`, its
//! `flattenTemporaryClonedImages`), before a snapshot or a volume clone takes a temporary
//! snapshot of its source, the source's snapshots are counted (its snapshot context: user,
//! trashed and group snapshots alike, what krbd counts):
//!
//! - more than [`SnapshotLimits::max`]: the images that depend on each of its trashed temporary
//!   snapshots are flattened (their snapshots then go with their last clone) and the request is
//!   refused with [`SnapshotError::TooManySnapshots`], to be retried;
//! - more than [`SnapshotLimits::min`]: those among all its snapshots but the oldest `min - 1`
//!   (ceph-csi's "extra" ones) are flattened, and the request goes on.
//!
//! Requests for one source count and take their temporary snapshot one after the other in
//! this process (counted side by side, each would see room for one more). So a source keeps
//! at most `min + 1` snapshots when they are all ours. The flatten is a full
//! copy of the snapshot image's data, made inline (there is no mgr task here): a snapshot past
//! `min` costs one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ceph_rbd::Cluster;

use crate::snapshot::{SnapshotError, TEMP_SNAP_PREFIX, flatten_marked};

/// krbd's limit: it refuses to map an image with more snapshots.
pub const KRBD_MAX_SNAPSHOTS: u32 = 510;
/// ceph-csi's `maxsnapshotsonimage` default.
pub const DEFAULT_MAX_SNAPSHOTS_ON_IMAGE: u32 = 450;
/// ceph-csi's `minsnapshotsonimage` default.
pub const DEFAULT_MIN_SNAPSHOTS_ON_IMAGE: u32 = 250;
/// The highest `max` accepted (ceph-csi's bound): room for krbd's limit.
pub const HIGHEST_MAX_SNAPSHOTS_ON_IMAGE: u32 = 500;

static MAX: AtomicU32 = AtomicU32::new(DEFAULT_MAX_SNAPSHOTS_ON_IMAGE);
static MIN: AtomicU32 = AtomicU32::new(DEFAULT_MIN_SNAPSHOTS_ON_IMAGE);

/// How many snapshots a source may keep (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// More than this: flatten all dependants and refuse.
    pub max: u32,
    /// More than this: flatten the dependants of all but the oldest `min - 1`.
    pub min: u32,
}

/// A limit that cannot be used, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error(
        "max-snapshots-on-image {0}: must be from 1 to {HIGHEST_MAX_SNAPSHOTS_ON_IMAGE} (krbd maps at most {KRBD_MAX_SNAPSHOTS} snapshots)"
    )]
    Max(u32),
    #[error("min-snapshots-on-image {min}: must be from 1 to max-snapshots-on-image ({max})")]
    Min { min: u32, max: u32 },
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        SnapshotLimits {
            max: DEFAULT_MAX_SNAPSHOTS_ON_IMAGE,
            min: DEFAULT_MIN_SNAPSHOTS_ON_IMAGE,
        }
    }
}

impl SnapshotLimits {
    /// Checked limits.
    ///
    /// # Errors
    /// [`LimitsError`] naming the setting out of range.
    pub fn new(max: u32, min: u32) -> Result<SnapshotLimits, LimitsError> {
        if !(1..=HIGHEST_MAX_SNAPSHOTS_ON_IMAGE).contains(&max) {
            return Err(LimitsError::Max(max));
        }
        if !(1..=max).contains(&min) {
            return Err(LimitsError::Min { min, max });
        }
        Ok(SnapshotLimits { max, min })
    }
}

/// Sets the limits for this process (the binary's `--max-snapshots-on-image` and
/// `--min-snapshots-on-image`).
pub fn set_snapshot_limits(limits: SnapshotLimits) {
    MAX.store(limits.max, Ordering::Relaxed);
    MIN.store(limits.min, Ordering::Relaxed);
}

/// The limits in force.
#[must_use]
pub fn snapshot_limits() -> SnapshotLimits {
    SnapshotLimits {
        max: MAX.load(Ordering::Relaxed),
        min: MIN.load(Ordering::Relaxed),
    }
}

/// The count and the temporary snapshot of one source, one request at a time in this process:
/// requests counted side by side would each see room for one more.
fn source_lock(key: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    // forget the sources nobody holds or waits for
    locks.retain(|_, lock| Arc::strong_count(lock) > 1);
    Arc::clone(locks.entry(key.to_owned()).or_default())
}

/// Held from the count until the temporary snapshot is taken ([`bound_snapshots`]).
pub(crate) struct Counted(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

/// Keeps `pool/source` within the limits before a temporary snapshot is taken of it (see the
/// module's text); the caller holds the answer until that snapshot is taken, so that requests
/// for one source in this process count one after the other. A missing source is left to the
/// caller, which says so.
///
/// # Errors
/// [`SnapshotError::TooManySnapshots`] past `max`; Ceph errors.
pub(crate) async fn bound_snapshots(
    cluster: &Cluster,
    pool: &str,
    source: &str,
) -> Result<Counted, SnapshotError> {
    let counted = Counted(source_lock(&format!("{pool}/{source}")).lock_owned().await);
    let limits = snapshot_limits();
    let count = match cluster.snapshot_count(pool, source).await {
        Ok(count) => count,
        Err(e) if e.is_not_found() => return Ok(counted),
        Err(e) => return Err(e.into()),
    };
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    if count <= limits.min {
        return Ok(counted);
    }
    let entries = cluster.snapshot_entries(pool, source).await?;
    if count > limits.max {
        tracing::warn!(
            pool,
            source,
            count,
            max = limits.max,
            "the source has more snapshots than allowed; flattening the snapshot images that depend on them"
        );
        flatten_dependants(cluster, pool, source, &entries).await?;
        return Err(SnapshotError::TooManySnapshots {
            pool: pool.to_owned(),
            image: source.to_owned(),
            count,
            max: limits.max,
        });
    }
    let keep = usize::try_from(limits.min.saturating_sub(1)).unwrap_or(usize::MAX);
    tracing::info!(
        pool,
        source,
        count,
        min = limits.min,
        "the source has more snapshots than min-snapshots-on-image; flattening the newest snapshot images that depend on them"
    );
    flatten_dependants(
        cluster,
        pool,
        source,
        entries.get(keep..).unwrap_or_default(),
    )
    .await?;
    Ok(counted)
}

/// Flattens the image each trashed temporary snapshot among `entries` was taken for (a
/// snapshot image or clone intermediate of that name in the source's pool, whose parent is
/// that snapshot); once it no longer depends on it, librbd removes the snapshot. Snapshots that
/// are not ours are left alone.
async fn flatten_dependants(
    cluster: &Cluster,
    pool: &str,
    source: &str,
    entries: &[ceph_rbd::SnapEntry],
) -> Result<(), SnapshotError> {
    for entry in entries {
        let Some(dependant) = entry
            .trashed_as
            .as_deref()
            .and_then(|name| name.strip_prefix(TEMP_SNAP_PREFIX))
        else {
            continue;
        };
        let parent = match cluster.parent(pool, dependant).await {
            Ok(parent) => parent,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        let ours = parent
            .is_some_and(|p| p.pool_spec() == pool && p.image == source && p.snap_id == entry.id);
        if !ours {
            continue;
        }
        tracing::info!(
            pool,
            source,
            image = dependant,
            "flattening a snapshot image so that its source's snapshot can go"
        );
        if let Err(e) = flatten_marked(cluster, pool, dependant, false).await {
            // a concurrent request for the same source may have flattened it first (librbd
            // refuses to flatten an image without a parent)
            match cluster.parent(pool, dependant).await {
                Ok(None) => {}
                Err(gone) if gone.is_not_found() => {}
                _ => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked_naming_the_setting() {
        assert_eq!(SnapshotLimits::new(450, 250), Ok(SnapshotLimits::default()));
        assert!(SnapshotLimits::new(8, 4).is_ok());
        assert!(SnapshotLimits::new(8, 8).is_ok());
        let e = SnapshotLimits::new(501, 250).unwrap_err();
        assert!(e.to_string().contains("max-snapshots-on-image 501"), "{e}");
        let e = SnapshotLimits::new(8, 9).unwrap_err();
        assert!(e.to_string().contains("min-snapshots-on-image 9"), "{e}");
        assert!(SnapshotLimits::new(0, 0).is_err());
        assert!(SnapshotLimits::new(8, 0).is_err());
    }
}
