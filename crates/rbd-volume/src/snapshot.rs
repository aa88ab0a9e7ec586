//! Snapshots and clones on RBD clone v2, after ceph-csi's proven layout: no journal, every name
//! deterministic, every object recognisable by its name and metadata.
//!
//! ```text
//! volume V ──(temporary snapshot csi-tmp-N, removed)──> snapshot image N = csi-snap-<hash>
//!                                                           └─ snapshot N@N ──> restored volumes
//! volume V ──(temporary snapshot)──> clone intermediate C = csi-clone-<hash> ── C@C ──> cloned volume
//! ```
//!
//! - [`create_snapshot`]: a temporary snapshot of the source, a v2 clone of it (the snapshot
//!   image, `csi-snap-` + 32 hex digits of the SHA-256 of the request name), the temporary
//!   snapshot removed (clone v2 keeps it in the source's snapshot trash while the clone needs
//!   it), the owner record written, then the snapshot `N@N` that restores clone. The source
//!   keeps no user snapshot. A new snapshot takes all of it in one Ceph call that opens the
//!   source and the snapshot image once each ([`ceph_rbd::Cluster::clone_recorded`]); a retry
//!   of a cut-short one finds and completes it step by step. The temporary snapshot cannot be
//!   removed for good while the snapshot image depends on it (clone v2 keeps it in the
//!   source's snapshot trash until the snapshot is deleted or flattened).
//! - [`clone_volume`]: a restore is a v2 clone of `N@N`, grown when larger (a new one in one Ceph
//!   call after one read of the snapshot image); a volume clone goes
//!   through a per-volume intermediate `csi-clone-<hash of the new image>` made exactly like a
//!   snapshot image (one implementation), so a volume's only children are our internal images.
//! - [`delete_snapshot`]: removes `N@N` and `N`; when restores still need `N`, `N` is flattened
//!   (so nothing in the trash holds a parent) and moved to the RBD trash. [`purge_trash`] removes
//!   those trash entries once their last child is gone; there is no mgr doing it on the test bed,
//!   so every delete purges.
//! - [`delete_volume`]: the volume core's delete; a source that still has snapshot images or
//!   clone intermediates gets them flattened first (they no longer depend on it), then it goes.
//!   The user sees the delete succeed and no snapshot or clone breaks.
//! - Chains stay short: every internal image and every clone records its depth
//!   ([`META_DEPTH`], parents above it); an image that would be deeper than
//!   [`MAX_CHAIN_DEPTH`] is flattened right away (depth 0), so a read walks at most
//!   [`MAX_CHAIN_DEPTH`] parents. ceph-csi flattens in the background past a soft limit of 4 and
//!   inline past 8; without a mgr there is no background, so one limit, ceph-csi's soft one.
//!
//! Clone v1: where the Ceph client's `rbd_default_clone_format` asks for it (`1`; `auto` is
//! v2, as ceph-csi makes clones), librbd makes every clone v1, its parent
//! snapshot protected, and each is flattened as soon as its record is written (`bound_depth`),
//! so the layout above holds (no snapshot kept on a source; a snapshot deletable while its
//! restores live on) at the cost of a full copy per snapshot, restore and clone.
//!
//! Inherited metadata: librbd copies a parent's metadata into each clone. A snapshot image or
//! clone intermediate gets the source's volume record overwritten with a provisioner `-` and an
//! empty PV (`ceph-rbd` has no metadata removal), so nothing reads it as the source's volume; a
//! clone cut before its own record compares its keys with its parent's and ignores the equal
//! (inherited) ones, so it is adopted rather than refused as another volume's.
//!
//! Crash consistency: each step is found again by the next attempt (the names are
//! deterministic, the record is written right after the clone, before the flatten and the
//! snapshot `N@N`, the request name key last): an image found again is first checked as a
//! clone (`check_clone`: one cut before its parent was recorded holds nothing of its source and
//! is removed and cloned again, a missing child entry or parent metadata is completed, a
//! parent other than the expected one refused), then an image without record is adopted and
//! completed, a leftover temporary snapshot is reused or, when the source is deleted, removed.
//! A flattened image is told from a half-made one by [`FLAT`], recorded before every flatten.
//! A flatten (the one step that can outlast an attempt: librbd goes on after our deadline)
//! thus always finds the record on the image; the next attempt checks the depth again and
//! finishes it, and the owner can delete the image meanwhile. Inherited keys are told apart by
//! comparing with the parent's, also when the parent is in the trash (a snapshot deleted
//! between a crashed restore and its retry: the retry then flattens the restore).

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use ceph_rbd::{CloneJob, CloneRecord, Cluster, CreateOptions, Features, ImageFacts};
use sha2::{Digest, Sha256};

use crate::id::ClusterRef;
use crate::lifecycle::{
    self, Action, Claimant, Deleted, Ensured, Error, Fit, Hooks, NewImage, Outcome,
};
use crate::naming::hex;
use crate::owner::{Owner, Ownership, ownership};

/// Name prefix of snapshot images.
pub const SNAPSHOT_PREFIX: &str = "csi-snap-";
/// Name prefix of the intermediate images of volume clones.
pub const CLONE_PREFIX: &str = "csi-clone-";
/// Name prefix of the temporary snapshot taken on a source.
pub const TEMP_SNAP_PREFIX: &str = "csi-tmp-";
/// Deepest clone chain kept: an image with more parents above it is flattened at creation.
pub const MAX_CHAIN_DEPTH: u32 = 4;

/// Snapshot image metadata: the snapshot (request) name it was made for. Written last.
pub const META_SNAPSHOT: &str = "provisioner.ceph.com/snapshot";
/// Snapshot image metadata: the ID of the volume it was taken of.
pub const META_SNAPSHOT_SOURCE: &str = "provisioner.ceph.com/snapshot-source";
/// Snapshot image metadata: the driver that made it. Not `provisioner.ceph.com/provisioner`:
/// a snapshot image is no PV's image, and must not read as a cut-short volume record.
pub const META_SNAPSHOT_DRIVER: &str = "provisioner.ceph.com/snapshot-driver";
/// Image metadata: how many parents the image has above it (as created; flattening an
/// ancestor makes it an over-estimate, which only flattens earlier). [`FLAT`] is written before
/// a flatten starts: a clone without a parent and without it is one cut short before its
/// parent was recorded (it holds none of its source's data), never a flattened one.
pub const META_DEPTH: &str = "provisioner.ceph.com/chain-depth";
/// [`META_DEPTH`] of an image that is flattened, or being flattened.
pub const FLAT: &str = "0";
/// Volume metadata: the snapshot or volume ID it was created from.
pub const META_CONTENT_SOURCE: &str = "provisioner.ceph.com/content-source";
/// Internal image metadata: set when the volume core moves the image to the RBD trash until its
/// clones are gone; [`purge_trash`] removes only entries that carry it (or, while
/// `rbd_move_to_trash_on_remove` is off, unmarked ones older versions left).
pub const META_TRASHED_UNTIL_UNUSED: &str = "provisioner.ceph.com/trashed-until-unused";
/// Volume metadata: `<pool>/<image>` of the clone intermediate a volume clone was made through.
pub const META_CLONE_INTERMEDIATE: &str = "provisioner.ceph.com/clone-intermediate";

/// Features of internal images: librbd's defaults; deep-flatten so that flattening detaches
/// their snapshots from the parent too.
pub(crate) fn internal_features() -> Features {
    Features::LAYERING
        | Features::EXCLUSIVE_LOCK
        | Features::OBJECT_MAP
        | Features::FAST_DIFF
        | Features::DEEP_FLATTEN
}

fn hashed(prefix: &str, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    format!("{prefix}{}", hex(&digest[..16]))
}

/// The snapshot image for a snapshot request name: `csi-snap-` + 32 hex digits of its SHA-256.
#[must_use]
pub fn snapshot_image_name(request_name: &str) -> String {
    hashed(SNAPSHOT_PREFIX, request_name)
}

/// The clone intermediate of the volume clone `pool/image`.
#[must_use]
pub fn clone_intermediate_name(pool: &str, image: &str) -> String {
    hashed(CLONE_PREFIX, &format!("{pool}/{image}"))
}

/// The temporary snapshot a snapshot image is cloned from.
fn temp_snap_name(snapshot_image: &str) -> String {
    format!("{TEMP_SNAP_PREFIX}{snapshot_image}")
}

fn is_hashed(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix).is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// Whether `name` is a snapshot image's name.
#[must_use]
pub fn is_snapshot_image(name: &str) -> bool {
    is_hashed(name, SNAPSHOT_PREFIX)
}

/// Whether `name` is one of our internal images (snapshot image or clone intermediate).
#[must_use]
pub fn is_internal_image(name: &str) -> bool {
    is_snapshot_image(name) || is_hashed(name, CLONE_PREFIX)
}

/// Whether `name` can be a snapshot image of ours by its name: one we made, or one ceph-csi
/// made (`csi-snap-<uuid>`) and `rbd-provisioner migrate` took over. Only the image's record
/// ([`SnapshotOwner`]) says that a ceph-csi one was taken over: nothing here touches one
/// without it.
#[must_use]
pub fn may_be_snapshot_image(name: &str) -> bool {
    is_snapshot_image(name) || crate::ceph_csi::is_snapshot_image(name)
}

/// Longest snapshot ID Kubernetes accepts as a snapshot handle.
pub const MAX_SNAPSHOT_ID_LEN: usize = crate::id::MAX_VOLUME_ID_LEN;
const SNAPSHOT_ID_PREFIXES: (&str, &str) = ("s1", "s2");

/// Snapshot IDs, shaped like volume IDs ([`crate::id`]): `s1/<monitors>/<pool>[/<namespace>]/<snapshot image>`
/// or, for a cluster named in the cluster config, `s2/<clusterID>/<pool>[/<namespace>]/<snapshot image>`;
/// with the call's credentials they locate the snapshot `pool[/namespace]/image@image` without a
/// journal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SnapshotId {
    pub cluster: ClusterRef,
    pub pool: String,
    /// RADOS namespace; empty for the default one.
    pub namespace: String,
    pub image: String,
}

impl SnapshotId {
    /// A snapshot in the default namespace of the cluster at `monitors` (an `s1` ID).
    #[must_use]
    pub fn new(monitors: &str, pool: &str, image: &str) -> Self {
        Self::located(ClusterRef::Monitors(monitors.to_owned()), pool, "", image)
    }

    /// A snapshot in `pool`'s namespace `namespace` (empty: the default one) of `cluster`.
    #[must_use]
    pub fn located(cluster: ClusterRef, pool: &str, namespace: &str, image: &str) -> Self {
        Self {
            cluster,
            pool: pool.to_owned(),
            namespace: namespace.to_owned(),
            image: image.to_owned(),
        }
    }

    /// Parses `s1/<monitors>/<pool>[/<namespace>]/<csi-snap-...>` or `s2/<clusterID>/...`.
    ///
    /// # Errors
    /// A message saying what is malformed.
    pub fn parse(id: &str) -> Result<Self, String> {
        crate::id::split(SNAPSHOT_ID_PREFIXES.0, SNAPSHOT_ID_PREFIXES.1, id)
            .filter(|(_, _, _, image)| may_be_snapshot_image(image))
            .map(|(cluster, pool, namespace, image)| Self::located(cluster, pool, namespace, image))
            .ok_or_else(|| {
                format!(
                    "malformed snapshot id {id:?} (expected s1/<monitors>/<pool>[/<namespace>]/<image> \
                     or s2/<clusterID>/<pool>[/<namespace>]/<image>, the image csi-snap-<32 hex digits>, \
                     or csi-snap-<uuid> for a snapshot taken over from ceph-csi)"
                )
            })
    }

    /// The pool spec the `ceph_rbd` calls take: `pool` or `pool/namespace`.
    #[must_use]
    pub fn pool_spec(&self) -> String {
        ceph_rbd::pool_spec(&self.pool, &self.namespace)
    }

    /// The ID, checked against the length limit.
    ///
    /// # Errors
    /// When the ID would exceed [`MAX_SNAPSHOT_ID_LEN`].
    pub fn encode(&self) -> Result<String, String> {
        crate::id::within_limit("snapshot", self.to_string())
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::id::join(
            f,
            SNAPSHOT_ID_PREFIXES,
            &self.cluster,
            &self.pool,
            &self.namespace,
            &self.image,
        )
    }
}

/// Who a snapshot image (or clone intermediate) belongs to, kept in its metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotOwner {
    /// The snapshot request name (for a clone intermediate: `clone of <pool>/<image>`).
    pub name: String,
    /// The source volume's ID.
    pub source: String,
    /// The driver (or provisioner identity) that made it.
    pub driver: String,
    /// The Kubernetes cluster it belongs to ([`crate::owner::META_KUBE_CLUSTER`], the same key
    /// as a volume's); empty when unknown, and then not recorded.
    pub kube_cluster: String,
}

impl SnapshotOwner {
    /// The metadata entries, in write order: the name key last (a record cut short reads as
    /// none and is completed by the next attempt). An empty Kubernetes cluster is left out.
    #[must_use]
    pub fn entries(&self) -> Vec<(&'static str, &str)> {
        let mut entries = vec![(META_SNAPSHOT_DRIVER, self.driver.as_str())];
        if !self.kube_cluster.is_empty() {
            entries.push((crate::owner::META_KUBE_CLUSTER, self.kube_cluster.as_str()));
        }
        entries.push((META_SNAPSHOT_SOURCE, self.source.as_str()));
        entries.push((META_SNAPSHOT, self.name.as_str()));
        entries
    }

    /// The record in `meta`, `None` when there is none (or it was cut before its name key).
    #[must_use]
    pub fn from_metadata(meta: &BTreeMap<String, String>) -> Option<SnapshotOwner> {
        Some(SnapshotOwner {
            name: meta.get(META_SNAPSHOT)?.clone(),
            source: meta.get(META_SNAPSHOT_SOURCE).cloned().unwrap_or_default(),
            driver: meta.get(META_SNAPSHOT_DRIVER).cloned().unwrap_or_default(),
            kube_cluster: meta
                .get(crate::owner::META_KUBE_CLUSTER)
                .cloned()
                .unwrap_or_default(),
        })
    }
}

/// A snapshot as found in Ceph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub pool: String,
    /// The snapshot image (its snapshot has the same name).
    pub image: String,
    pub owner: SnapshotOwner,
    /// Bytes: the source's size when taken (what a restore needs at least).
    pub size: u64,
    pub created: SystemTime,
}

/// Why a snapshot or clone operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The volume core's errors (Ceph errors among them).
    #[error(transparent)]
    Volume(#[from] Error),
    /// The snapshot image of this name was made for another snapshot or source.
    #[error(
        "snapshot image {pool}/{image} belongs to snapshot {:?} of volume {:?}, not {:?} of {:?}; refusing to reuse it",
        existing.name, existing.source, wanted.name, wanted.source
    )]
    OtherSnapshot {
        pool: String,
        image: String,
        existing: Box<SnapshotOwner>,
        wanted: Box<SnapshotOwner>,
    },
    /// The snapshot or source volume does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The volume exists with other content than asked for.
    #[error(
        "image {pool}/{image} exists with content from {existing:?}, not {wanted:?}; refusing to reuse it"
    )]
    OtherContent {
        pool: String,
        image: String,
        existing: String,
        wanted: String,
    },
    /// The new volume would be smaller than its source.
    #[error("a volume of at most {limit} bytes cannot hold its source of {source_size} bytes")]
    TooSmall { limit: u64, source_size: u64 },
    /// The source has more snapshots than `max-snapshots-on-image` allows (krbd maps at most
    /// 510): the snapshot images depending on them were flattened so that they can go; a retry
    /// finds fewer ([`crate::snapshot_limit`]).
    #[error(
        "source volume {pool}/{image} has {count} snapshots, more than max-snapshots-on-image ({max}; krbd maps at most 510): the snapshot images depending on them were flattened so that they can go; retry"
    )]
    TooManySnapshots {
        pool: String,
        image: String,
        count: u32,
        max: u32,
    },
}

impl From<ceph_rbd::Error> for SnapshotError {
    fn from(e: ceph_rbd::Error) -> Self {
        SnapshotError::Volume(Error::Ceph(e))
    }
}

/// A snapshot to take (or find).
#[derive(Clone, Copy, Debug)]
pub struct NewSnapshot<'a> {
    /// Pool of the source and of the snapshot image.
    pub pool: &'a str,
    pub source_image: &'a str,
    /// The snapshot image ([`snapshot_image_name`]).
    pub image: &'a str,
    pub owner: &'a SnapshotOwner,
}

/// Takes the snapshot, or finds it after a retry or a crash and completes it. Idempotent.
///
/// # Errors
/// [`SnapshotError::OtherSnapshot`] when the image belongs to another snapshot or source,
/// [`SnapshotError::NotFound`] when the source is missing, Ceph errors.
pub async fn create_snapshot(
    cluster: &Cluster,
    new: &NewSnapshot<'_>,
) -> Result<Snapshot, SnapshotError> {
    if let Some(snapshot) = create_fresh_snapshot(cluster, new).await? {
        return Ok(snapshot);
    }
    let (pool, image) = (new.pool, new.image);
    let recorded = match own_metadata(cluster, pool, image).await {
        Ok(meta) => {
            let existing = SnapshotOwner::from_metadata(&meta.own);
            if let Some(existing) = &existing
                && (existing.name != new.owner.name || existing.source != new.owner.source)
            {
                return Err(SnapshotError::OtherSnapshot {
                    pool: pool.to_owned(),
                    image: image.to_owned(),
                    existing: Box::new(existing.clone()),
                    wanted: Box::new(new.owner.clone()),
                });
            }
            let parent = (pool, new.source_image);
            match check_clone(cluster, pool, image, parent, &meta, existing.is_some()).await? {
                Health::Sound => meta.own,
                Health::HalfMade(why) => {
                    // cloned again from the source, which must still be there
                    match cluster.image_info(pool, new.source_image).await {
                        Ok(_) => {}
                        Err(e) if e.is_not_found() => {
                            return Err(SnapshotError::NotFound(format!(
                                "source volume {pool}/{}",
                                new.source_image
                            )));
                        }
                        Err(e) => return Err(e.into()),
                    }
                    remove_half_made(cluster, pool, image, why).await?;
                    clone_from_source(cluster, new).await?;
                    BTreeMap::new()
                }
            }
        }
        Err(e) if e.is_not_found() => {
            clone_from_source(cluster, new).await?;
            BTreeMap::new()
        }
        Err(e) => return Err(e.into()),
    };
    // The record goes on before the flatten, which can outlast this attempt: the retry then
    // finds its own record, whatever the flatten left (see `bound_depth`).
    let mut entries = NOT_A_VOLUME.to_vec();
    entries.extend(new.owner.entries());
    let missing = missing_entries(&recorded, &entries);
    if !missing.is_empty() {
        cluster
            .metadata_set_many(pool, image, missing, None)
            .await?;
    }
    bound_depth(cluster, pool, image, recorded.get(META_DEPTH)).await?;
    // The clone holds what it needs; the temporary snapshot goes (to the source's snapshot
    // trash while the clone depends on it). The source may be gone already after a crash.
    match cluster
        .snap_remove(pool, new.source_image, &temp_snap_name(image))
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    match cluster.snap_create(pool, image, image).await {
        Ok(()) => tracing::info!(pool, image, source = new.source_image, "snapshot taken"),
        Err(e) if e.is_already_exists() => {}
        Err(e) => return Err(e.into()),
    }
    find_snapshot(cluster, pool, image)
        .await?
        .ok_or_else(|| SnapshotError::NotFound(format!("snapshot {pool}/{image}@{image}")))
}

/// Whether `pool/image` does not exist, read without opening it (no librbd image context). An
/// image that cannot be read so (e.g. one cut short before its header) counts as existing:
/// the step-by-step path completes or replaces it.
async fn is_absent(cluster: &Cluster, pool: &str, image: &str) -> bool {
    cluster
        .metadata_list_unopened(pool, image)
        .await
        .is_err_and(|e| e.is_not_found())
}

/// Parents above an image, from its facts: 0 without a parent, else its recorded depth (1
/// when none is recorded: a clone made elsewhere). As [`depth`], without another open.
fn depth_of(facts: &ImageFacts) -> u32 {
    if facts.parent.is_none() {
        return 0;
    }
    facts
        .metadata
        .get(META_DEPTH)
        .and_then(|d| d.parse().ok())
        .unwrap_or(1)
}

fn owned(entries: &[(&str, &str)]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The common case in one Ceph call, each image opened once ([`Cluster::clone_recorded`]):
/// no snapshot image of that name yet. The steps and their order are those of the
/// step-by-step path below (record before the snapshot `N@N`, the name key last), so a crash
/// midway leaves what it completes. `None` when the image exists (a retry, a crash, a request
/// of the same name in flight): the step-by-step path then finds and completes it.
async fn create_fresh_snapshot(
    cluster: &Cluster,
    new: &NewSnapshot<'_>,
) -> Result<Option<Snapshot>, SnapshotError> {
    let (pool, image, source) = (new.pool, new.image, new.source_image);
    // Clone v1: the step-by-step path, which flattens the snapshot image before its
    // temporary snapshot (protected while the clone depends on it) goes.
    if clones_v1(cluster).await? || !is_absent(cluster, pool, image).await {
        return Ok(None);
    }
    let _counted = crate::snapshot_limit::bound_snapshots(cluster, pool, source).await?;
    let mut entries = owned(&NOT_A_VOLUME);
    entries.extend(owned(&new.owner.entries()));
    let job = CloneJob {
        parent_pool: pool.to_owned(),
        parent: source.to_owned(),
        snap: temp_snap_name(image),
        temporary: true,
        pool: pool.to_owned(),
        image: image.to_owned(),
        options: CreateOptions {
            features: Some(internal_features()),
            ..CreateOptions::default()
        },
        snapshot: Some(image.to_owned()),
    };
    let cloned = match cluster
        .clone_recorded(job, move |source| {
            let depth = source.map_or(1, depth_of) + 1;
            // deeper than allowed: no depth recorded, `bound_depth` flattens it below
            if depth <= MAX_CHAIN_DEPTH {
                entries.push((META_DEPTH.to_owned(), depth.to_string()));
            }
            CloneRecord {
                metadata: entries,
                size: None,
            }
        })
        .await
    {
        Ok(cloned) => cloned,
        Err(e) if e.is_already_exists() => return Ok(None),
        Err(e) if e.is_not_found() && !is_absent(cluster, pool, image).await => return Ok(None),
        Err(e) if e.is_not_found() => {
            return Err(SnapshotError::NotFound(format!(
                "source volume {pool}/{source}"
            )));
        }
        Err(e) => return Err(e.into()),
    };
    let deep = cloned
        .parent
        .as_ref()
        .is_some_and(|p| depth_of(p) + 1 > MAX_CHAIN_DEPTH);
    if deep {
        bound_depth(cluster, pool, image, None).await?;
    }
    tracing::info!(pool, image, source, "snapshot taken");
    match cloned.snapshot {
        Some(snap) if !deep => Ok(Some(Snapshot {
            pool: pool.to_owned(),
            image: image.to_owned(),
            owner: new.owner.clone(),
            size: snap.size,
            created: snap.created,
        })),
        _ => Ok(find_snapshot(cluster, pool, image).await?),
    }
}

/// Whether this connection's clones are v1 ([`ceph_rbd::CloneFormat`]: the client's
/// `rbd_default_clone_format` is `1`). A clone v1 keeps its parent snapshot protected, which this layout (no snapshot
/// kept on a source, a snapshot deleted while its restores live on) cannot allow: every clone
/// v1 is flattened as soon as its record is written ([`bound_depth`]), and its parent snapshot
/// unprotected when it is removed.
async fn clones_v1(cluster: &Cluster) -> Result<bool, ceph_rbd::Error> {
    Ok(cluster.clone_format().await? == ceph_rbd::CloneFormat::V1)
}

/// Temporary snapshot of the source, clone of it as `new.image`.
async fn clone_from_source(cluster: &Cluster, new: &NewSnapshot<'_>) -> Result<(), SnapshotError> {
    let (pool, image, source) = (new.pool, new.image, new.source_image);
    let temp = temp_snap_name(image);
    let _counted = crate::snapshot_limit::bound_snapshots(cluster, pool, source).await?;
    match cluster.snap_create(pool, source, &temp).await {
        Ok(()) => {}
        Err(e) if e.is_already_exists() => {}
        Err(e) if e.is_not_found() => {
            return Err(SnapshotError::NotFound(format!(
                "source volume {pool}/{source}"
            )));
        }
        Err(e) => return Err(e.into()),
    }
    let options = CreateOptions {
        features: Some(internal_features()),
        ..CreateOptions::default()
    };
    clone_replacing_partial(cluster, (pool, source, &temp), pool, image, &options).await
}

/// Clones `parent` (pool, image, snapshot) to `pool/image`; a partial image of that name (a
/// clone killed midway: no header) is removed first.
async fn clone_replacing_partial(
    cluster: &Cluster,
    parent: (&str, &str, &str),
    pool: &str,
    image: &str,
    options: &CreateOptions,
) -> Result<(), SnapshotError> {
    let (parent_pool, parent_image, snap) = parent;
    for attempt in 0..2 {
        match cluster
            .clone_image(parent_pool, parent_image, snap, pool, image, options)
            .await
        {
            Ok(()) => {
                tracing::info!(
                    pool,
                    image,
                    parent = %format!("{parent_pool}/{parent_image}@{snap}"),
                    "clone created"
                );
                return Ok(());
            }
            Err(e) if e.is_already_exists() && attempt == 0 => {
                tracing::warn!(pool, image, "removing a partially created clone");
                match cluster.remove_image(pool, image).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if e.is_not_found() => {
                return Err(SnapshotError::NotFound(format!(
                    "{parent_pool}/{parent_image}@{snap}"
                )));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(SnapshotError::Volume(Error::Ceph(
        ceph_rbd::Error::AlreadyExists {
            op: "clone image",
            target: format!("{pool}/{image}"),
        },
    )))
}

/// Written on internal images over the volume record a clone inherits from its parent (librbd
/// copies a parent's metadata into a clone): a provisioner `-` that no provisioner or driver
/// has, so `gc` and the volume checks never take a snapshot image for the source's volume.
pub(crate) const NOT_A_VOLUME: [(&str, &str); 3] = [
    (crate::owner::META_PROVISIONER, "-"),
    (crate::owner::META_CLAIM, ""),
    (crate::owner::META_PV, ""),
];

/// An image's metadata without what it inherited ([`own_metadata`]).
struct Split {
    /// Its own keys: those that differ from its parent's, and all of them without a parent.
    own: BTreeMap<String, String>,
    /// The parent's keys the image does not have at all: librbd copies a parent's metadata as
    /// the last step of a clone, so a clone cut before it lacks them (an encrypted volume's
    /// key among them).
    uncopied: Vec<(String, String)>,
}

/// The metadata of `pool/image` without what it inherited: librbd copies a parent's metadata
/// into a clone, so a clone cut before its own record carries its parent's (which must read as
/// no record, not as another volume's). Keys equal to the parent's count as inherited.
async fn own_metadata(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Split, ceph_rbd::Error> {
    let mut meta = cluster.metadata_list(pool, image).await?;
    let mut uncopied = Vec::new();
    if let Some(parent) = cluster.parent(pool, image).await? {
        // A parent in the trash (a snapshot deleted between a crashed restore and its retry)
        // is read by its ID.
        let inherited = if parent.in_trash {
            cluster
                .metadata_by_id(&parent.pool_spec(), &parent.image_id)
                .await
        } else {
            cluster
                .metadata_list(&parent.pool_spec(), &parent.image)
                .await
        };
        let inherited = match inherited {
            Ok(m) => m,
            Err(e) if e.is_not_found() => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        uncopied = inherited
            .iter()
            .filter(|(key, _)| !meta.contains_key(*key))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        meta.retain(|key, value| inherited.get(key) != Some(value));
    }
    Ok(Split {
        own: meta,
        uncopied,
    })
}

/// What [`check_clone`] found.
#[derive(Debug)]
enum Health {
    /// A clone of the expected parent, counted as its child (repaired where it was not), or a
    /// flattened one.
    Sound,
    /// Cut short before its parent was recorded: it holds none of the source's data.
    HalfMade(&'static str),
}

/// Checks the image `pool/image` found on a retry, which should be a clone of `parent`
/// (`pool spec`, `image`) or a flattened one, before it is reused or adopted: librbd's clone
/// (and ours) writes the new image's header before it records the parent on it, counts it as
/// the parent snapshot's child, and copies the parent's metadata, so a clone cut short can
/// miss each. Without its parent it is empty (unless [`FLAT`] says a flatten began: then it
/// holds the data); a missing child entry is added again (`child_attach`) and, on an image
/// without its record (`recorded` false: cut before it), missing parent metadata copied, as
/// librbd's clone would have finished. A parent other than the expected one is refused.
async fn check_clone(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    parent: (&str, &str),
    meta: &Split,
    recorded: bool,
) -> Result<Health, SnapshotError> {
    let Some(found) = cluster.parent(pool, image).await? else {
        return Ok(
            if meta.own.get(META_DEPTH).map(String::as_str) == Some(FLAT) {
                Health::Sound
            } else {
                Health::HalfMade("it has no parent and was never flattened")
            },
        );
    };
    if found.pool_spec() != parent.0 || found.image != parent.1 {
        return Err(SnapshotError::OtherContent {
            pool: pool.to_owned(),
            image: image.to_owned(),
            existing: format!("{}/{}@{}", found.pool_spec(), found.image, found.snap),
            wanted: format!("{}/{}", parent.0, parent.1),
        });
    }
    // a clone v1 is listed in its pool's `rbd_children`, not by its parent snapshot; it is
    // flattened next (`bound_depth`)
    if !clones_v1(cluster).await?
        && cluster.ensure_child_listed(pool, image).await? == ceph_rbd::ChildLink::Unlisted
    {
        // its parent snapshot is deleted and does not count it: it could be purged under it
        tracing::warn!(
            pool,
            image,
            "a clone not counted by its deleted parent snapshot; flattening it to keep its data"
        );
        flatten_marked(cluster, pool, image, false).await?;
    }
    if !recorded && !meta.uncopied.is_empty() {
        tracing::warn!(
            pool,
            image,
            keys = meta.uncopied.len(),
            "copying the parent's metadata that a clone cut short did not copy"
        );
        cluster
            .metadata_set_many(pool, image, meta.uncopied.clone(), None)
            .await?;
    }
    Ok(Health::Sound)
}

/// Removes the half-made clone `pool/image` ([`Health::HalfMade`]) so that it is made again.
async fn remove_half_made(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    why: &str,
) -> Result<(), SnapshotError> {
    tracing::warn!(
        pool,
        image,
        why,
        "found a clone cut short by an interrupted attempt; removing it and cloning it again"
    );
    match cluster.remove_image(pool, image).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The parent (`pool spec`, `image`) the volume `new` is a clone of: the snapshot image, or
/// its own clone intermediate in the source's pool.
fn expected_parent<'a>(new: &NewClone<'a>) -> (&'a str, String) {
    match new.source {
        Source::Snapshot { pool, image } => (pool, image.to_owned()),
        Source::Volume { pool, .. } => (pool, clone_intermediate_name(new.pool, new.image)),
    }
}

/// Whether `new`'s source is still there to clone again: [`SnapshotError::NotFound`] if not.
async fn source_present(cluster: &Cluster, new: &NewClone<'_>) -> Result<(), SnapshotError> {
    match new.source {
        Source::Snapshot { pool, image } => find_snapshot(cluster, pool, image)
            .await?
            .map(drop)
            .ok_or_else(|| SnapshotError::NotFound(format!("snapshot {pool}/{image}"))),
        Source::Volume { pool, image } => match cluster.image_info(pool, image).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Err(SnapshotError::NotFound(format!(
                "source volume {pool}/{image}"
            ))),
            Err(e) => Err(e.into()),
        },
    }
}

pub(crate) fn missing_entries(
    recorded: &BTreeMap<String, String>,
    entries: &[(&str, &str)],
) -> Vec<(String, String)> {
    entries
        .iter()
        .filter(|(key, value)| recorded.get(*key).map(String::as_str) != Some(*value))
        .map(|(key, value)| ((*key).to_string(), (*value).to_string()))
        .collect()
}

/// Parents above `pool/image`: 0 without a parent, else the recorded depth (1 when none is
/// recorded: a clone made elsewhere).
pub async fn depth(cluster: &Cluster, pool: &str, image: &str) -> Result<u32, Error> {
    if cluster.parent(pool, image).await?.is_none() {
        return Ok(0);
    }
    Ok(cluster
        .metadata_get(pool, image, META_DEPTH)
        .await?
        .and_then(|d| d.parse().ok())
        .unwrap_or(1))
}

/// Records the depth of the clone `pool/image` (its parent's + 1, 0 once flattened) and
/// flattens it when that exceeds [`MAX_CHAIN_DEPTH`] or its parent is in the trash. Returns the
/// depth it has now. `recorded` is the depth it records itself (not inherited): the record is
/// written only when it differs.
///
/// Called on every attempt, after the owner record: a flatten may outlast the attempt (librbd
/// goes on with it; this process answers `InProgress` meanwhile) or be cut by a crash, and the
/// next attempt finds the parent gone (depth 0) or flattens again (librbd skips what is copied).
/// A clone that records its own depth within the limit and still has its parent is done.
async fn bound_depth(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    recorded: Option<&String>,
) -> Result<u32, Error> {
    let parent = cluster.parent(pool, image).await?;
    // a flatten that began earlier (FLAT is written before it) and has not finished
    let flattening = recorded.map(String::as_str) == Some(FLAT);
    // a clone v1 is flattened at once (see `clones_v1`)
    let v1 = parent.is_some() && clones_v1(cluster).await?;
    let recorded_depth = recorded
        .and_then(|d| d.parse::<u32>().ok())
        .filter(|d| (1..=MAX_CHAIN_DEPTH).contains(d));
    if let (Some(_), Some(bounded), false) = (&parent, recorded_depth, v1) {
        // bounded when it was made (its own depth is written only then): a retry of a finished
        // restore whose snapshot went to the trash since does not flatten it
        return Ok(bounded);
    }
    let depth = match &parent {
        None => 0,
        Some(_) if flattening || v1 => MAX_CHAIN_DEPTH + 1,
        Some(parent) if parent.in_trash => MAX_CHAIN_DEPTH + 1,
        Some(parent) => depth(cluster, &parent.pool_spec(), &parent.image).await? + 1,
    };
    let depth = if depth > MAX_CHAIN_DEPTH {
        if v1 {
            tracing::info!(pool, image, "flattening a clone v1 (clone format 1)");
        } else {
            tracing::info!(
                pool,
                image,
                depth,
                max = MAX_CHAIN_DEPTH,
                "flattening a deep clone"
            );
        }
        flatten_marked(cluster, pool, image, flattening).await?;
        if let Some(parent) = parent.filter(|p| p.in_trash) {
            // it may have been the trashed image's last clone
            purge_trash(cluster, &parent.pool_spec()).await?;
        }
        return Ok(0);
    } else {
        depth
    };
    let depth_text = depth.to_string();
    if recorded != Some(&depth_text) {
        cluster
            .metadata_set(pool, image, META_DEPTH, &depth_text)
            .await?;
    }
    Ok(depth)
}

/// Flattens `pool/image`, with [`FLAT`] recorded first (unless `marked` says it is already):
/// a retry that finds the image without its parent then knows it holds its data, and one that
/// finds the flatten unfinished resumes it.
pub(crate) async fn flatten_marked(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    marked: bool,
) -> Result<(), Error> {
    if !marked {
        cluster.metadata_set(pool, image, META_DEPTH, FLAT).await?;
    }
    cluster.flatten(pool, image).await?;
    Ok(())
}

/// The snapshot `pool/image@image` with its record; `None` when the image, its record or its
/// snapshot is missing (a snapshot not (yet) complete, or deleted).
///
/// # Errors
/// Ceph errors other than not found.
pub async fn find_snapshot(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Option<Snapshot>, Error> {
    let meta = match cluster.metadata_list(pool, image).await {
        Ok(meta) => meta,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let Some(owner) = SnapshotOwner::from_metadata(&meta) else {
        return Ok(None);
    };
    let snaps = match cluster.snap_list(pool, image).await {
        Ok(snaps) => snaps,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(snaps
        .into_iter()
        .find(|s| s.name == image)
        .map(|s| Snapshot {
            pool: pool.to_owned(),
            image: image.to_owned(),
            owner,
            size: s.size,
            created: s.created,
        }))
}

/// Every complete snapshot in `pool`, by image name. A missing pool has none.
///
/// # Errors
/// Ceph errors.
pub async fn list_snapshots(cluster: &Cluster, pool: &str) -> Result<Vec<Snapshot>, Error> {
    let images = match cluster.list_images(pool).await {
        Ok(images) => images,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut names: Vec<String> = images
        .into_iter()
        .filter(|i| may_be_snapshot_image(i))
        .collect();
    names.sort();
    let mut found = Vec::new();
    for image in names {
        if let Some(snapshot) = find_snapshot(cluster, pool, &image).await? {
            found.push(snapshot);
        }
    }
    Ok(found)
}

/// What [`delete_snapshot`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotDeleted {
    Removed,
    /// Volumes restored from it still need it: flattened and moved to the RBD trash, removed
    /// by [`purge_trash`] once the last one is gone.
    Trashed,
    AlreadyGone,
}

/// Deletes the snapshot image `pool/image` (see the module docs), then purges the pool's
/// trash. Idempotent.
///
/// # Errors
/// Ceph errors.
pub async fn delete_snapshot(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<SnapshotDeleted, Error> {
    let result = remove_internal(cluster, pool, image).await?;
    purge_trash(cluster, pool).await?;
    Ok(result)
}

async fn remove_internal(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<SnapshotDeleted, Error> {
    match cluster.snap_remove(pool, image, image).await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    match cluster.remove_image(pool, image).await {
        Ok(()) => {
            tracing::info!(pool, image, "snapshot image removed");
            Ok(SnapshotDeleted::Removed)
        }
        Err(e) if e.is_not_found() => Ok(SnapshotDeleted::AlreadyGone),
        Err(ceph_rbd::Error::HasDependents { .. }) => {
            // Restored volumes hang off its (now trashed) snapshot. Nothing in the trash may
            // hold a parent (its parent could then never be deleted): flatten it first.
            // Not marked FLAT: it leaves the directory for the trash, where no retry finds
            // it by name, and its restores compare their inherited depth with its own.
            if cluster.parent(pool, image).await?.is_some() {
                cluster.flatten(pool, image).await?;
            }
            // marked as ours to purge: entries the operator's `rbd_move_to_trash_on_remove`
            // put in the trash are left to the operator
            cluster
                .metadata_set_many(
                    pool,
                    image,
                    vec![(META_TRASHED_UNTIL_UNUSED.to_owned(), "true".to_owned())],
                    None,
                )
                .await?;
            cluster.trash_move(pool, image, Duration::ZERO).await?;
            tracing::info!(
                pool,
                image,
                "snapshot image still has clones; moved to the trash until they are gone"
            );
            Ok(SnapshotDeleted::Trashed)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes the pool's trash entries that are internal images we moved there ourselves (marked
/// [`META_TRASHED_UNTIL_UNUSED`]) and have no clone left; returns how many went. Entries of
/// other names are never touched, nor are internal images librbd's remove put there because
/// `rbd_move_to_trash_on_remove` is set (the operator's recovery window, with its expiry).
/// Unmarked internal entries, which versions before the mark left, are purged only while that
/// option is off for the pool.
///
/// # Errors
/// Ceph errors listing the trash or reading the option.
pub async fn purge_trash(cluster: &Cluster, pool: &str) -> Result<usize, Error> {
    let mut removed = 0;
    let mut trash_on_remove = None;
    for entry in cluster.trash_list(pool).await? {
        // a ceph-csi name only with our mark: ceph-csi's own entries are its mgr tasks'
        let taken_over = crate::ceph_csi::is_snapshot_image(&entry.name);
        if !is_internal_image(&entry.name) && !taken_over {
            continue;
        }
        let marked = match cluster.metadata_by_id(pool, &entry.id).await {
            Ok(meta) => meta.contains_key(META_TRASHED_UNTIL_UNUSED),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        if !marked && taken_over {
            continue;
        }
        if !marked {
            let on = match trash_on_remove {
                Some(on) => on,
                None => *trash_on_remove.insert(cluster.trash_on_remove(pool).await?),
            };
            if on {
                continue;
            }
        }
        match cluster.trash_remove(pool, &entry.id, false).await {
            Ok(()) => {
                tracing::info!(pool, image = entry.name, "trashed snapshot image purged");
                removed += 1;
            }
            // still has clones, or gone meanwhile
            Err(ceph_rbd::Error::HasDependents { .. } | ceph_rbd::Error::Busy { .. }) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(pool, image = entry.name, error = %e, "could not purge a trash entry");
            }
        }
    }
    Ok(removed)
}

/// Where a new volume's content comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source<'a> {
    /// The snapshot image `pool/image` (its snapshot `image@image`).
    Snapshot { pool: &'a str, image: &'a str },
    /// The volume `pool/image` (a clone goes through an intermediate in its pool).
    Volume { pool: &'a str, image: &'a str },
}

/// A volume to create from a snapshot or another volume (or find).
#[derive(Clone, Copy, Debug)]
pub struct NewClone<'a> {
    pub pool: &'a str,
    pub image: &'a str,
    /// Bytes wanted; a smaller source is grown to it, a larger one needs `fit` to allow it.
    pub size: u64,
    pub options: &'a CreateOptions,
    pub owner: &'a Owner,
    pub fit: Fit,
    pub source: Source<'a>,
    /// The source's ID, recorded as [`META_CONTENT_SOURCE`] and compared on a retry.
    pub source_id: &'a str,
    /// The driver, recorded on a clone intermediate.
    pub driver: &'a str,
}

impl<'a> NewClone<'a> {
    /// The volume `new` (pool, image, size, options, owner, fit) made from `source`.
    #[must_use]
    pub fn of(
        new: &NewImage<'a>,
        source: Source<'a>,
        source_id: &'a str,
        driver: &'a str,
    ) -> NewClone<'a> {
        NewClone {
            pool: new.pool,
            image: new.image,
            size: new.size,
            options: new.options,
            owner: new.owner,
            fit: new.fit,
            source,
            source_id,
            driver,
        }
    }
}

/// Creates the volume from its source with its owner record, or finds it after a retry or a
/// crash and completes it. Idempotent.
///
/// # Errors
/// [`SnapshotError::NotFound`] for a missing source, [`SnapshotError::TooSmall`],
/// [`SnapshotError::OtherContent`], [`Error::Foreign`] for another volume's image, Ceph errors.
pub async fn clone_volume(cluster: &Cluster, new: &NewClone<'_>) -> Result<Ensured, SnapshotError> {
    if let Some(ensured) = restore_fresh(cluster, new).await? {
        return Ok(ensured);
    }
    let (pool, image) = (new.pool, new.image);
    let (recorded, outcome) = match own_metadata(cluster, pool, image).await {
        Ok(split) => {
            let meta = &split.own;
            let outcome = match ownership(meta, &new.owner.pv, &new.owner.kube_cluster) {
                Ownership::Foreign(owner) => {
                    return Err(Error::Foreign {
                        pool: pool.to_owned(),
                        image: image.to_owned(),
                        owner,
                        wanted: new.owner.pv.clone(),
                        action: Action::Reuse,
                    }
                    .into());
                }
                Ownership::Ours => Outcome::Reused,
                Ownership::Unrecorded => Outcome::Adopted,
            };
            let existing = meta.get(META_CONTENT_SOURCE).cloned().unwrap_or_default();
            if (outcome == Outcome::Reused || !existing.is_empty()) && existing != new.source_id {
                return Err(SnapshotError::OtherContent {
                    pool: pool.to_owned(),
                    image: image.to_owned(),
                    existing,
                    wanted: new.source_id.to_owned(),
                });
            }
            let recorded = outcome == Outcome::Reused;
            let (parent_pool, parent_image) = expected_parent(new);
            let parent = (parent_pool, parent_image.as_str());
            match check_clone(cluster, pool, image, parent, &split, recorded).await? {
                Health::Sound => (split.own, outcome),
                Health::HalfMade(why) => {
                    source_present(cluster, new).await?;
                    remove_half_made(cluster, pool, image, why).await?;
                    make_clone(cluster, new).await?;
                    (BTreeMap::new(), Outcome::Recreated)
                }
            }
        }
        Err(e) if e.is_not_found() => {
            make_clone(cluster, new).await?;
            (BTreeMap::new(), Outcome::Created)
        }
        Err(e) => return Err(e.into()),
    };
    let intermediate = match new.source {
        Source::Volume {
            pool: source_pool, ..
        } => format!("{source_pool}/{}", clone_intermediate_name(pool, image)),
        Source::Snapshot { .. } => String::new(),
    };
    // Inherited keys are overwritten (librbd has no call here to remove them): an empty
    // intermediate and claim mean none.
    let mut entries = vec![
        (META_CONTENT_SOURCE, new.source_id),
        (META_CLONE_INTERMEDIATE, intermediate.as_str()),
    ];
    if new.owner.claim.is_empty() {
        entries.push((crate::owner::META_CLAIM, ""));
    }
    entries.extend(new.owner.entries());
    let missing = missing_entries(&recorded, &entries);
    if !missing.is_empty() {
        cluster
            .metadata_set_many(pool, image, missing, None)
            .await?;
    }
    // Only now the steps that can outlast an attempt (a flatten of a large image): a retry
    // finds the record and finishes them, and the owner can delete the image meanwhile.
    let size = fit_clone(cluster, new).await?;
    bound_depth(cluster, pool, image, recorded.get(META_DEPTH)).await?;
    Ok(Ensured { outcome, size })
}

/// A restore from a snapshot in one Ceph call when no image of that name exists yet: the
/// snapshot image read with one open, then [`Cluster::clone_recorded`] (the record, then the
/// size, as the step-by-step path writes them). `None` for a volume clone, or when the image
/// exists (a retry, a crash): the step-by-step path finds and completes it.
async fn restore_fresh(
    cluster: &Cluster,
    new: &NewClone<'_>,
) -> Result<Option<Ensured>, SnapshotError> {
    let Source::Snapshot {
        pool: snapshot_pool,
        image: snapshot_image,
    } = new.source
    else {
        return Ok(None);
    };
    let (pool, image) = (new.pool, new.image);
    if !is_absent(cluster, pool, image).await {
        return Ok(None);
    }
    let missing = || SnapshotError::NotFound(format!("snapshot {snapshot_pool}/{snapshot_image}"));
    let facts = match cluster.image_facts(snapshot_pool, snapshot_image).await {
        Ok(facts) => facts,
        Err(e) if e.is_not_found() => return Err(missing()),
        Err(e) => return Err(e.into()),
    };
    let snap = facts
        .snaps
        .iter()
        .find(|s| s.name == snapshot_image)
        .filter(|_| SnapshotOwner::from_metadata(&facts.metadata).is_some())
        .ok_or_else(missing)?;
    let size = target_size(new, snap.size)?;
    let depth = depth_of(&facts) + 1;
    let v1 = clones_v1(cluster).await?;
    let mut entries = vec![
        (META_CONTENT_SOURCE, new.source_id),
        (META_CLONE_INTERMEDIATE, ""),
    ];
    if new.owner.claim.is_empty() {
        entries.push((crate::owner::META_CLAIM, ""));
    }
    entries.extend(new.owner.entries());
    let mut entries = owned(&entries);
    if depth <= MAX_CHAIN_DEPTH {
        entries.push((META_DEPTH.to_owned(), depth.to_string()));
    }
    let job = CloneJob {
        parent_pool: snapshot_pool.to_owned(),
        parent: snapshot_image.to_owned(),
        snap: snapshot_image.to_owned(),
        temporary: false,
        pool: pool.to_owned(),
        image: image.to_owned(),
        options: new.options.clone(),
        snapshot: None,
    };
    let cloned = match cluster
        .clone_recorded(job, move |_| CloneRecord {
            metadata: entries,
            size: Some(size),
        })
        .await
    {
        Ok(cloned) => cloned,
        Err(e) if e.is_already_exists() => return Ok(None),
        Err(e) if e.is_not_found() && !is_absent(cluster, pool, image).await => return Ok(None),
        Err(e) if e.is_not_found() => return Err(missing()),
        Err(e) => return Err(e.into()),
    };
    tracing::info!(
        pool,
        image,
        parent = %format!("{snapshot_pool}/{snapshot_image}@{snapshot_image}"),
        "clone created"
    );
    if let Fit::Within { required, limit } = new.fit
        && !crate::size::fits(cloned.size, required, limit)
    {
        return Err(Error::SizeMismatch {
            pool: pool.to_owned(),
            image: image.to_owned(),
            size: cloned.size,
            required,
            limit,
        }
        .into());
    }
    if depth > MAX_CHAIN_DEPTH || v1 {
        bound_depth(cluster, pool, image, None).await?;
    }
    Ok(Some(Ensured {
        outcome: Outcome::Created,
        size: cloned.size,
    }))
}

/// The size the restore must have, given its source's: [`SnapshotError::TooSmall`] when the
/// limit cannot hold the source.
#[allow(clippy::result_large_err)] // the error type of every call here; errors are rare
fn target_size(new: &NewClone<'_>, source_size: u64) -> Result<u64, SnapshotError> {
    match new.fit {
        Fit::Within { limit, .. } if limit != 0 && source_size > limit => {
            Err(SnapshotError::TooSmall { limit, source_size })
        }
        _ => Ok(new.size.max(source_size)),
    }
}

async fn make_clone(cluster: &Cluster, new: &NewClone<'_>) -> Result<(), SnapshotError> {
    let (parent_pool, parent_image) = match new.source {
        Source::Snapshot { pool, image } => {
            let snapshot = find_snapshot(cluster, pool, image)
                .await?
                .ok_or_else(|| SnapshotError::NotFound(format!("snapshot {pool}/{image}")))?;
            target_size(new, snapshot.size)?;
            (pool.to_owned(), image.to_owned())
        }
        Source::Volume { pool, image } => {
            let info = match cluster.image_info(pool, image).await {
                Ok(info) => info,
                Err(e) if e.is_not_found() => {
                    return Err(SnapshotError::NotFound(format!(
                        "source volume {pool}/{image}"
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            target_size(new, info.size)?;
            let intermediate = clone_intermediate_name(new.pool, new.image);
            let owner = SnapshotOwner {
                name: format!("clone of {}", new.source_id),
                source: new.source_id.to_owned(),
                driver: new.driver.to_owned(),
                kube_cluster: new.owner.kube_cluster.clone(),
            };
            create_snapshot(
                cluster,
                &NewSnapshot {
                    pool,
                    source_image: image,
                    image: &intermediate,
                    owner: &owner,
                },
            )
            .await?;
            (pool.to_owned(), intermediate)
        }
    };
    clone_replacing_partial(
        cluster,
        (&parent_pool, &parent_image, &parent_image),
        new.pool,
        new.image,
        new.options,
    )
    .await
}

/// Grows the new volume to its size and checks it per `fit`.
async fn fit_clone(cluster: &Cluster, new: &NewClone<'_>) -> Result<u64, SnapshotError> {
    let current = cluster.image_info(new.pool, new.image).await?.size;
    let size = target_size(new, current)?;
    if current < size {
        cluster
            .resize_image(new.pool, new.image, size, false)
            .await?;
        tracing::info!(
            pool = new.pool,
            image = new.image,
            from = current,
            to = size,
            "clone grown"
        );
    }
    if let Fit::Within { required, limit } = new.fit
        && !crate::size::fits(size, required, limit)
    {
        return Err(Error::SizeMismatch {
            pool: new.pool.to_owned(),
            image: new.image.to_owned(),
            size,
            required,
            limit,
        }
        .into());
    }
    Ok(size)
}

/// The clone intermediate (`pool spec/name`) of the removed volume `pool/image`, in whichever
/// pool it is (the source's, which may be another than the volume's): its name derives from
/// the volume's, so an image of that name in any pool, in the volume's RADOS namespace, can only
/// be its own. The volume's own pool is looked at first; pools this user may not read, or
/// without that namespace, are skipped. `None` when there is none.
async fn find_intermediate(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Option<String>, Error> {
    let name = clone_intermediate_name(pool, image);
    let namespace = ceph_rbd::split_pool_spec(pool).map_or("", |(_, ns)| ns);
    let mut specs = vec![pool.to_owned()];
    for other in cluster.list_pools().await? {
        let spec = ceph_rbd::pool_spec(&other, namespace);
        if spec != pool {
            specs.push(spec);
        }
    }
    for spec in specs {
        match cluster.metadata_list_unopened(&spec, &name).await {
            Ok(_) => return Ok(Some(format!("{spec}/{name}"))),
            Err(e) if e.is_not_found() => {}
            Err(ceph_rbd::Error::PermissionDenied { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// Deletes a volume ([`lifecycle::delete`]): when it still has snapshot images or clone
/// intermediates, they are flattened first (and leftover temporary snapshots removed); its own
/// clone intermediate goes after it; the trash is purged. Idempotent.
///
/// # Errors
/// As [`lifecycle::delete`]; `HasDependents` when the volume has snapshots or clones that are
/// not ours.
pub async fn delete_volume(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    claimant: &Claimant,
    hooks: &Hooks,
) -> Result<Deleted, Error> {
    // Read without opening the image (no librbd ImageCtx): most volumes are plain ones, and
    // for them this read and the removal are all the Ceph work a deletion does.
    let (intermediate, mut purge) = match cluster.metadata_list_unopened(pool, image).await {
        Ok(meta) => {
            // a mirrored image is demoted first so that the peer site keeps its copy (an image
            // another volume owns is refused below, untouched)
            if claimant.check(&meta, image).is_ok() {
                crate::mirror::release_before_delete(cluster, pool, image).await?;
            }
            (
                meta.get(META_CLONE_INTERMEDIATE).cloned(),
                // A restore or clone (it records its source) may be the last child of a trashed
                // snapshot image, which can go once the child is gone.
                meta.get(META_CONTENT_SOURCE)
                    .is_some_and(|source| !source.is_empty()),
            )
        }
        // The volume is gone already: a retry after its removal, whose intermediate removal
        // failed (e.g. a watcher). Its record is gone with it: the intermediate is looked for.
        Err(e) if e.is_not_found() => (find_intermediate(cluster, pool, image).await?, true),
        Err(e) => return Err(e.into()),
    };
    let deleted = match lifecycle::delete(cluster, pool, image, claimant, hooks).await {
        Err(Error::Ceph(ceph_rbd::Error::HasDependents { .. })) => {
            release_dependents(cluster, pool, image).await?;
            purge = true;
            lifecycle::delete(cluster, pool, image, claimant, hooks).await?
        }
        other => other?,
    };
    if let Some((ipool, iimage)) = intermediate.as_deref().and_then(|i| i.rsplit_once('/'))
        && is_internal_image(iimage)
    {
        remove_internal(cluster, ipool, iimage).await?;
        purge_trash(cluster, ipool).await?;
    }
    if purge {
        purge_trash(cluster, pool).await?;
    }
    Ok(deleted)
}

/// Makes `pool/image` removable: leftover temporary snapshots of ours removed, our internal
/// images cloned from it flattened (their trashed parent snapshots then go by themselves).
async fn release_dependents(cluster: &Cluster, pool: &str, image: &str) -> Result<(), Error> {
    for snap in cluster.snap_list(pool, image).await? {
        if snap.name.starts_with(TEMP_SNAP_PREFIX) {
            match cluster.snap_remove(pool, image, &snap.name).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for child in cluster.list_images(pool).await? {
        if !is_internal_image(&child) && !taken_over_snapshot(cluster, pool, &child).await? {
            continue;
        }
        let parent = match cluster.parent(pool, &child).await {
            Ok(p) => p,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        if parent.is_some_and(|p| p.pool_spec() == pool && p.image == image && !p.in_trash) {
            tracing::info!(
                pool,
                image = child,
                parent = image,
                "flattening a snapshot image so its source can be deleted"
            );
            flatten_marked(cluster, pool, &child, false).await?;
        }
    }
    Ok(())
}

/// Whether `pool/image` is a ceph-csi snapshot image that `rbd-provisioner migrate` took over
/// (its name and our record); ceph-csi's own are not ours to flatten.
async fn taken_over_snapshot(cluster: &Cluster, pool: &str, image: &str) -> Result<bool, Error> {
    if !crate::ceph_csi::is_snapshot_image(image) {
        return Ok(false);
    }
    match cluster.metadata_list_unopened(pool, image).await {
        Ok(meta) => Ok(SnapshotOwner::from_metadata(&meta).is_some()),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_ids_round_trip_and_stay_within_128_bytes() {
        let image = snapshot_image_name(&"x".repeat(128));
        assert!(is_snapshot_image(&image) && image.len() == 41);
        let id = SnapshotId::new("10.0.0.1:6789,10.0.0.2:6789", "kube", &image);
        let text = id.encode().unwrap();
        assert_eq!(SnapshotId::parse(&text).unwrap(), id);
        assert!(text.starts_with("s1/10.0.0.1:6789,10.0.0.2:6789/kube/csi-snap-"));
        let monitors = ["192.168.100.100:6789"; 5].join(",");
        assert!(SnapshotId::new(&monitors, "rbd", &image).encode().is_err());
        let named = SnapshotId::located(ClusterRef::Named("site-a".into()), "kube", "t1", &image);
        let text = named.encode().unwrap();
        assert_eq!(text, format!("s2/site-a/kube/t1/{image}"));
        assert_eq!(SnapshotId::parse(&text).unwrap(), named);
        assert_eq!(named.pool_spec(), "kube/t1");
        // a snapshot taken over from ceph-csi keeps its image's name
        let ceph_csi = "s2/rook-ceph/rbd/csi-snap-50d53503-9da1-11ed-847e-bacf8f2f1297";
        assert_eq!(SnapshotId::parse(ceph_csi).unwrap().to_string(), ceph_csi);
        for bad in [
            "s2/rook-ceph/rbd/csi-vol-50d53503-9da1-11ed-847e-bacf8f2f1297",
            "",
            "reallyfakesnapshotid",
            "s1/m/p/pvc-1",
            "v1/m/p/csi-snap-00000000000000000000000000000000",
            "s1//p/csi-snap-00000000000000000000000000000000",
            "s1/m/p/csi-snap-0000000000000000000000000000000g",
        ] {
            assert!(SnapshotId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_deterministic_and_recognisable() {
        assert_eq!(snapshot_image_name("a"), snapshot_image_name("a"));
        assert_ne!(snapshot_image_name("a"), snapshot_image_name("b"));
        let c = clone_intermediate_name("rbd", "pvc-1");
        assert!(is_internal_image(&c) && !is_snapshot_image(&c));
        assert_ne!(c, clone_intermediate_name("other", "pvc-1"));
        assert!(
            !is_internal_image("csi-snap-2f1c0d2e-8a4b-4c3d-9e2f-0a1b2c3d4e5f"),
            "ceph-csi's"
        );
        assert!(!is_internal_image("pvc-1"));
    }

    #[test]
    fn the_snapshot_record_goes_name_last_and_is_not_a_volume_record() {
        let owner = SnapshotOwner {
            name: "snapshot-1".into(),
            source: "v1/m/rbd/pvc-1".into(),
            driver: "rbd.provisioner.ceph.io".into(),
            kube_cluster: String::new(),
        };
        let keys: Vec<&str> = owner.entries().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys.last(), Some(&META_SNAPSHOT));
        let mut meta: BTreeMap<String, String> = owner
            .entries()
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        assert_eq!(SnapshotOwner::from_metadata(&meta), Some(owner));
        assert!(Owner::from_metadata(&meta).is_none());
        assert!(!meta.contains_key(crate::owner::META_PROVISIONER));
        meta.remove(META_SNAPSHOT);
        assert_eq!(SnapshotOwner::from_metadata(&meta), None);
    }

    #[test]
    fn a_restore_is_at_least_its_source_and_within_the_limit() {
        let owner = Owner {
            pv: "pvc-1".into(),
            claim: String::new(),
            provisioner: "d".into(),
            kube_cluster: String::new(),
        };
        let options = CreateOptions::default();
        let mut new = NewClone {
            pool: "rbd",
            image: "pvc-1",
            size: 10,
            options: &options,
            owner: &owner,
            fit: Fit::Within {
                required: 10,
                limit: 0,
            },
            source: Source::Snapshot {
                pool: "rbd",
                image: "csi-snap-x",
            },
            source_id: "s1/m/rbd/csi-snap-x",
            driver: "d",
        };
        assert_eq!(target_size(&new, 4).unwrap(), 10);
        assert_eq!(target_size(&new, 20).unwrap(), 20);
        new.fit = Fit::Within {
            required: 10,
            limit: 15,
        };
        assert!(matches!(
            target_size(&new, 20),
            Err(SnapshotError::TooSmall {
                limit: 15,
                source_size: 20
            })
        ));
    }
}
