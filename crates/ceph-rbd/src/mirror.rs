//! RBD mirroring of images, through librbd's mirroring API: a pool's mirroring mode, and per
//! image snapshot-based mirroring (enable, disable, promote, demote, resync, mirror
//! snapshots) and its status as the `rbd-mirror` daemons report it.
//!
//! Snapshot-based mirroring copies an image to the peer cluster as of its mirror snapshots: the
//! primary image takes them (here on request, [`Cluster::mirror_image_snapshot`]), and the
//! peer's `rbd-mirror` daemon replays each new one onto its non-primary copy.

use crate::cluster::{Cluster, check_image_name};
use crate::error::Error;

/// A pool's mirroring mode (`rbd mirror pool enable <pool> <mode>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorMode {
    /// No image of the pool is mirrored.
    Disabled,
    /// Images are mirrored when mirroring is enabled on each of them.
    Image,
    /// Every journaling image of the pool is mirrored.
    Pool,
}

impl MirrorMode {
    /// Its name in `rbd mirror pool info`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            MirrorMode::Disabled => "disabled",
            MirrorMode::Image => "image",
            MirrorMode::Pool => "pool",
        }
    }
}

/// An image's mirroring state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorImageState {
    Disabling,
    Enabled,
    Disabled,
}

/// An image's mirroring: whether and how it is mirrored, and whether this copy is primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorImageInfo {
    /// The image's ID across the peers (empty when mirroring is disabled).
    pub global_id: String,
    pub state: MirrorImageState,
    /// Whether this copy is the primary one (takes writes and mirror snapshots).
    pub primary: bool,
    /// Snapshot-based mirroring (`false`: journal-based); `None` while mirroring is disabled.
    pub snapshot_mode: Option<bool>,
}

/// The replication state an `rbd-mirror` daemon reports for an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorStatusState {
    Unknown,
    Error,
    Syncing,
    StartingReplay,
    Replaying,
    StoppingReplay,
    Stopped,
}

impl MirrorStatusState {
    /// Its name in `rbd mirror image status` (`up+replaying`, ...).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            MirrorStatusState::Unknown => "unknown",
            MirrorStatusState::Error => "error",
            MirrorStatusState::Syncing => "syncing",
            MirrorStatusState::StartingReplay => "starting_replay",
            MirrorStatusState::Replaying => "replaying",
            MirrorStatusState::StoppingReplay => "stopping_replay",
            MirrorStatusState::Stopped => "stopped",
        }
    }
}

/// One site's status of a mirrored image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorSiteStatus {
    /// The peer site's mirror UUID; empty for the local site.
    pub mirror_uuid: String,
    pub state: MirrorStatusState,
    /// The daemon's description: for snapshot-based mirroring a text such as `replaying, {...}`
    /// whose JSON carries the last synced snapshot's time, bytes and duration.
    pub description: String,
    /// When the daemon last reported (seconds since the epoch).
    pub last_update: i64,
    /// Whether a daemon reporting for the site is up.
    pub up: bool,
}

/// An image's mirroring and each site's replication status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorGlobalStatus {
    pub info: MirrorImageInfo,
    pub sites: Vec<MirrorSiteStatus>,
}

/// A mirror snapshot of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorSnapshot {
    pub id: u64,
    /// When it was taken (seconds since the epoch).
    pub created: i64,
    /// Taken on the primary copy (`false`: replayed onto a non-primary one).
    pub primary: bool,
    /// The snapshot a demotion takes.
    pub demoted: bool,
    /// On a non-primary copy: the replay of the primary's snapshot is complete.
    pub complete: bool,
}

/// A new mirror snapshot of the open image; librbd's EINVAL with its reasons.
fn mirror_snapshot_of(img: &crate::raw::Image<'_>) -> Result<u64, Error> {
    match img.mirror_snapshot() {
        // librbd says no more than EINVAL; these are its reasons
        Err(Error::InvalidArgument { op, target, .. }) => Err(Error::InvalidArgument {
            op,
            target,
            reason: "refused by librbd: the image must be mirrored by snapshots and primary, and \
                     its pool must have a peer cluster (rbd mirror pool peer)"
                .into(),
        }),
        other => other,
    }
}

impl Cluster {
    /// The mirroring mode of pool `pool` (a `pool/namespace` spec: the namespace's).
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_mode(&self, pool: &str) -> Result<MirrorMode, Error> {
        self.with_pool("read mirroring mode", pool, pool.to_string(), |io| {
            io.mirror_mode()
        })
        .await
    }

    /// Sets the mirroring mode of `pool` (`rbd mirror pool enable`).
    ///
    /// # Errors
    /// Ceph errors, e.g. `InvalidArgument` for `Disabled` while images are mirrored.
    pub async fn set_mirror_mode(&self, pool: &str, mode: MirrorMode) -> Result<(), Error> {
        self.with_pool("set mirroring mode", pool, pool.to_string(), move |io| {
            io.set_mirror_mode(mode)
        })
        .await
    }

    /// Enables snapshot-based mirroring of `pool/image` (which becomes primary). Idempotent.
    ///
    /// # Errors
    /// `InvalidArgument` when the pool's mirroring mode is not `image`, Ceph errors.
    pub async fn mirror_image_enable(&self, pool: &str, image: &str) -> Result<(), Error> {
        self.with_image("enable image mirroring", pool, image, false, |img| {
            img.mirror_enable()
        })
        .await
    }

    /// Disables mirroring of `pool/image` (`force`: also a non-primary copy).
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_image_disable(
        &self,
        pool: &str,
        image: &str,
        force: bool,
    ) -> Result<(), Error> {
        self.with_image("disable image mirroring", pool, image, false, move |img| {
            img.mirror_disable(force)
        })
        .await
    }

    /// Makes this copy of `pool/image` primary; `force` when the peer could not be demoted
    /// (it is unreachable): both may then be primary until one is demoted and resynced.
    ///
    /// # Errors
    /// Ceph errors, e.g. `Busy` when the peer is still primary and `force` is not set.
    pub async fn mirror_image_promote(
        &self,
        pool: &str,
        image: &str,
        force: bool,
    ) -> Result<(), Error> {
        self.with_image("promote image", pool, image, false, move |img| {
            img.mirror_promote(force)
        })
        .await
    }

    /// Makes this copy of `pool/image` non-primary (read-only, replayed from the peer).
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_image_demote(&self, pool: &str, image: &str) -> Result<(), Error> {
        self.with_image("demote image", pool, image, false, |img| {
            img.mirror_demote()
        })
        .await
    }

    /// Flags the non-primary copy `pool/image` for a full resync from the primary.
    ///
    /// # Errors
    /// Ceph errors, e.g. `InvalidArgument` on a primary copy.
    pub async fn mirror_image_resync(&self, pool: &str, image: &str) -> Result<(), Error> {
        self.with_image("resync image", pool, image, false, |img| {
            img.mirror_resync()
        })
        .await
    }

    /// Takes a mirror snapshot of the primary `pool/image`; its snapshot ID.
    ///
    /// # Errors
    /// Ceph errors, e.g. `InvalidArgument` when the image is not mirrored by snapshots or not
    /// primary.
    pub async fn mirror_image_snapshot(&self, pool: &str, image: &str) -> Result<u64, Error> {
        self.with_image("create mirror snapshot", pool, image, false, |img| {
            mirror_snapshot_of(img)
        })
        .await
    }

    /// The mirroring of `pool/image` with each site's status (none for an image not mirrored),
    /// then, for a primary copy mirrored by snapshots whose mirror snapshots `due` finds due, a
    /// new mirror snapshot: one open of the image for a replication's periodic look. The new
    /// snapshot's ID, if one was taken.
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_tick(
        &self,
        pool: &str,
        image: &str,
        due: impl FnOnce(&[MirrorSnapshot]) -> bool + Send + 'static,
    ) -> Result<(MirrorGlobalStatus, Option<u64>), Error> {
        self.with_image("read image mirroring", pool, image, false, move |img| {
            let info = img.mirror_info()?;
            if info.state != MirrorImageState::Enabled {
                return Ok((
                    MirrorGlobalStatus {
                        info,
                        sites: Vec::new(),
                    },
                    None,
                ));
            }
            let sites = img.mirror_global_status()?.sites;
            let snapshot = if info.primary
                && info.snapshot_mode == Some(true)
                && due(&img.mirror_snapshots()?)
            {
                Some(mirror_snapshot_of(img)?)
            } else {
                None
            };
            Ok((MirrorGlobalStatus { info, sites }, snapshot))
        })
        .await
    }

    /// The mirror snapshots of `pool/image`, oldest first.
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_snapshots(
        &self,
        pool: &str,
        image: &str,
    ) -> Result<Vec<MirrorSnapshot>, Error> {
        self.with_image("list mirror snapshots", pool, image, true, |img| {
            img.mirror_snapshots()
        })
        .await
    }

    /// The mirroring of `pool/image`.
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_image_info(
        &self,
        pool: &str,
        image: &str,
    ) -> Result<MirrorImageInfo, Error> {
        check_image_name("read image mirroring", pool, image)?;
        self.with_image("read image mirroring", pool, image, true, |img| {
            img.mirror_info()
        })
        .await
    }

    /// The mirroring of `pool/image` and each site's status.
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn mirror_image_status(
        &self,
        pool: &str,
        image: &str,
    ) -> Result<MirrorGlobalStatus, Error> {
        self.with_image("read image mirroring status", pool, image, true, |img| {
            img.mirror_global_status()
        })
        .await
    }
}
