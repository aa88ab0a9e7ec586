//! Volume group snapshots: several volumes snapshotted at one point in time (crash-consistent
//! across them), each member then an ordinary snapshot image ([`crate::snapshot`]) that restores
//! and `DeleteSnapshot` treat like any other.
//!
//! Ceph 16 (the test bed) can take an atomic snapshot of an RBD group (`rbd_group_snap_create`)
//! but can only roll an image back to it: cloning an image's group snapshot needs `rbd_clone4`
//! (Ceph 19). So each member is a **full copy**:
//!
//! 1. the RBD group `G` = `csi-group-<32 hex of the SHA-256 of the request name>` is created in
//!    the sources' pool and the source images are added to it;
//! 2. the group snapshot `G@G` is taken: librbd quiesces and snapshots every image of the group
//!    together;
//! 3. each source is deep-copied, as it was at `G@G`, flattened, into its member snapshot image
//!    `csi-snap-<hash of "G/<source volume ID>">` ([`member_image_name`]); the record is written
//!    ([`META_GROUP_SNAPSHOT`], [`META_GROUP_SIZE`], the snapshot record, name last), then the
//!    snapshot `N@N` that restores clone, exactly as for a single snapshot;
//! 4. the group snapshot and the group are removed: the sources are in no group afterwards (an
//!    image can be in one group only) and keep no extra snapshot.
//!
//! **Guarantees**: every member's data is the sources' state at the one instant of `G@G`. Every
//! name is deterministic: a retried or crashed create finds what it made (complete members are
//! kept, incomplete copies are removed and copied again from the same `G@G`, which stays until
//! every member is complete). The group snapshot ID `g1/<monitors>/<pool>/G` locates the members
//! without a journal: they are the pool's snapshot images recorded for `G` whose name is the
//! member name of their recorded source.
//!
//! **Caveats**: the copy reads and writes every allocated byte of every source (time and space
//! grow with the data, unlike a single snapshot's copy-on-write clone); all sources must live in
//! one pool; finding a group's members reads the metadata of every snapshot image in the pool;
//! members have no object map (`member_features`: a librbd 16 bug); while a create is between its group
//! snapshot and its last copy the sources are in the group (a source can be in one group only:
//! another group snapshot of it is refused until this one completes or is deleted). A create that
//! fails before its group snapshot removes the group again.

use std::collections::BTreeMap;

use ceph_rbd::{Cluster, CreateOptions};

mod names;

pub use names::{GROUP_PREFIX, GroupSnapshotId, group_name, is_group_name, member_image_name};

use crate::lifecycle::Error;
use crate::snapshot::{
    self, META_DEPTH, META_SNAPSHOT, META_SNAPSHOT_SOURCE, NOT_A_VOLUME, Snapshot, SnapshotOwner,
    internal_features, is_snapshot_image, missing_entries,
};

/// Member snapshot image metadata: the group (`csi-group-...`) whose snapshot it was copied from.
pub const META_GROUP_SNAPSHOT: &str = "provisioner.ceph.com/group-snapshot";
/// Member snapshot image metadata: how many members the group snapshot has.
pub const META_GROUP_SIZE: &str = "provisioner.ceph.com/group-size";
/// Volume metadata librbd copies into a deep copy that a snapshot image must not carry.
const NOT_A_CLONE: [(&str, &str); 2] = [
    (snapshot::META_CONTENT_SOURCE, ""),
    (snapshot::META_CLONE_INTERMEDIATE, ""),
];

/// Features of member snapshot images: those of other snapshot images but the object map (and
/// fast-diff, which needs it). librbd 16's deep copy from a snapshot of the group namespace
/// (which it does not copy along) rolls the destination's object map back to "no snapshot" and
/// aborts the process (`ceph_assert(snap_id != CEPH_NOSNAP)` in
/// `object_map::SnapshotRollbackRequest`); without an object map it has none to roll back.
fn member_features() -> ceph_rbd::Features {
    let without = ceph_rbd::Features::OBJECT_MAP | ceph_rbd::Features::FAST_DIFF;
    ceph_rbd::Features::from_bits(internal_features().bits() & !without.bits())
}

/// Why a group snapshot operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The volume core's errors (Ceph errors among them).
    #[error(transparent)]
    Volume(#[from] Error),
    /// The group snapshot of this name exists for other source volumes.
    #[error(
        "group snapshot {group} exists for the volumes {existing:?}, not {wanted:?}; refusing to reuse it"
    )]
    OtherSources {
        group: String,
        existing: Vec<String>,
        wanted: Vec<String>,
    },
    /// A source image already belongs to another RBD group (an image can be in one only).
    #[error(
        "image {pool}/{image} is in the RBD group {other:?}; it cannot be snapshotted with a group"
    )]
    InOtherGroup {
        pool: String,
        image: String,
        other: String,
    },
    /// A member of the complete group snapshot was deleted on its own: it cannot be made again
    /// at the group's instant.
    #[error(
        "group snapshot {group} lost a member snapshot since it was taken; delete the group snapshot and take a new one"
    )]
    MemberDeleted { group: String },
    /// A source volume does not exist.
    #[error("source volume {0} not found")]
    SourceNotFound(String),
}

impl From<ceph_rbd::Error> for GroupError {
    fn from(e: ceph_rbd::Error) -> Self {
        GroupError::Volume(Error::Ceph(e))
    }
}

/// A source volume of a group snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    /// The source's image, in the group's pool.
    pub image: &'a str,
    /// The source's volume ID (recorded, and what the member's name derives from).
    pub source_id: &'a str,
}

/// A group snapshot to take (or find).
#[derive(Clone, Copy, Debug)]
pub struct NewGroupSnapshot<'a> {
    /// Pool of the sources, the group and the member snapshot images.
    pub pool: &'a str,
    /// [`group_name`] of the request name.
    pub group: &'a str,
    /// The request name (recorded as each member's snapshot name).
    pub name: &'a str,
    pub members: &'a [Member<'a>],
    /// The driver, recorded on the members.
    pub driver: &'a str,
    /// The Kubernetes cluster, recorded on the members (empty: unknown, not recorded).
    pub kube_cluster: &'a str,
}

/// A group snapshot as found in Ceph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSnapshot {
    pub pool: String,
    pub group: String,
    /// The complete members, by image name.
    pub members: Vec<Snapshot>,
    /// How many members it was made with (more than `members.len()` while incomplete, or after
    /// some member was deleted on its own).
    pub size: usize,
}

impl GroupSnapshot {
    /// Whether every member is there and complete.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        !self.members.is_empty() && self.members.len() == self.size
    }
}

/// A member snapshot image found in the pool, complete or not.
#[derive(Clone, Debug)]
struct Found {
    image: String,
    source: String,
    size: usize,
    snapshot: Option<Snapshot>,
}

/// The pool's snapshot images that are members of `group` (by record and name).
async fn find_members(cluster: &Cluster, pool: &str, group: &str) -> Result<Vec<Found>, Error> {
    let images = match cluster.list_images(pool).await {
        Ok(images) => images,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut found = Vec::new();
    let mut names: Vec<String> = images
        .into_iter()
        .filter(|i| is_snapshot_image(i))
        .collect();
    names.sort();
    for image in names {
        let meta = match cluster.metadata_list(pool, &image).await {
            Ok(meta) => meta,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        let Some(source) = member_of(&meta, group, &image) else {
            continue;
        };
        let size = meta
            .get(META_GROUP_SIZE)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let snapshot = if meta.contains_key(META_SNAPSHOT) {
            snapshot::find_snapshot(cluster, pool, &image).await?
        } else {
            None
        };
        found.push(Found {
            image,
            source,
            size,
            snapshot,
        });
    }
    Ok(found)
}

/// The source volume ID when `image` with metadata `meta` is a member of `group`: recorded for
/// the group, and named after the group and its recorded source (an image that inherited the
/// keys from a member, as a clone does, has another name).
fn member_of(meta: &BTreeMap<String, String>, group: &str, image: &str) -> Option<String> {
    let source = meta.get(META_SNAPSHOT_SOURCE)?;
    (meta.get(META_GROUP_SNAPSHOT).map(String::as_str) == Some(group)
        && member_image_name(group, source) == image)
        .then(|| source.clone())
}

/// The group snapshot `pool/group`: its complete members; `None` when it has no member at all.
///
/// # Errors
/// Ceph errors.
pub async fn find_group_snapshot(
    cluster: &Cluster,
    pool: &str,
    group: &str,
) -> Result<Option<GroupSnapshot>, Error> {
    let found = find_members(cluster, pool, group).await?;
    if found.is_empty() {
        return Ok(None);
    }
    let size = found.iter().map(|f| f.size).max().unwrap_or(0);
    Ok(Some(GroupSnapshot {
        pool: pool.to_owned(),
        group: group.to_owned(),
        members: found.into_iter().filter_map(|f| f.snapshot).collect(),
        size,
    }))
}

/// Takes the group snapshot, or finds it after a retry or a crash and completes it (see the
/// module docs). Idempotent.
///
/// # Errors
/// [`GroupError::OtherSources`] when the group snapshot exists for other volumes,
/// [`GroupError::SourceNotFound`], [`GroupError::InOtherGroup`], Ceph errors.
pub async fn create_group_snapshot(
    cluster: &Cluster,
    new: &NewGroupSnapshot<'_>,
) -> Result<GroupSnapshot, GroupError> {
    let (pool, group) = (new.pool, new.group);
    let existing = find_members(cluster, pool, group).await?;
    let mut wanted: Vec<String> = new.members.iter().map(|m| m.source_id.to_owned()).collect();
    wanted.sort();
    if existing
        .iter()
        .any(|f| f.size != new.members.len() || !wanted.contains(&f.source))
    {
        let mut sources: Vec<String> = existing.iter().map(|f| f.source.clone()).collect();
        sources.sort();
        return Err(GroupError::OtherSources {
            group: group.to_owned(),
            existing: sources,
            wanted,
        });
    }
    let complete: Vec<&str> = existing
        .iter()
        .filter(|f| f.snapshot.is_some())
        .map(|f| f.source.as_str())
        .collect();
    let todo: Vec<&Member<'_>> = new
        .members
        .iter()
        .filter(|m| !complete.contains(&m.source_id))
        .collect();
    if !todo.is_empty() {
        let resuming = !complete.is_empty();
        if let Err(e) = snapshot_group(cluster, pool, group, new.members, resuming).await {
            // Nothing was copied from this group snapshot yet: leave no group behind (it would
            // hold the sources, and an image can be in one group only).
            if !resuming {
                let _ = remove_group(cluster, pool, group).await;
            }
            return Err(e);
        }
        for member in todo {
            copy_member(cluster, new, member).await?;
        }
    }
    remove_group(cluster, pool, group).await?;
    find_group_snapshot(cluster, pool, group)
        .await?
        .filter(GroupSnapshot::is_complete)
        .ok_or_else(|| {
            GroupError::Volume(Error::Ceph(ceph_rbd::Error::NotFound {
                op: "find group snapshot",
                target: format!("{pool}/{group}"),
            }))
        })
}

/// Puts the sources in the RBD group `pool/group` and takes (or finds complete) its snapshot
/// `group@group`. `resuming` (some members are complete): only the snapshot they were copied
/// from will do.
async fn snapshot_group(
    cluster: &Cluster,
    pool: &str,
    group: &str,
    members: &[Member<'_>],
    resuming: bool,
) -> Result<(), GroupError> {
    if let Some(snap) = cluster
        .group_snap_list(pool, group)
        .await
        .or_else(|e| {
            if e.is_not_found() {
                Ok(Vec::new())
            } else {
                Err(e)
            }
        })?
        .into_iter()
        .find(|s| s.name == group)
    {
        if snap.complete {
            return Ok(());
        }
        tracing::warn!(pool, group, "removing an incomplete group snapshot");
        cluster.group_snap(pool, group, group, false).await?;
    } else if resuming {
        // the group snapshot goes only once every member is complete: a member was deleted
        // on its own since, and a new copy would not be of the same instant
        return Err(GroupError::MemberDeleted {
            group: group.to_owned(),
        });
    }
    let mut joined = Vec::with_capacity(members.len());
    for member in members {
        let in_group = match cluster.image_group(pool, member.image).await {
            Ok(g) => g,
            Err(e) if e.is_not_found() => {
                return Err(GroupError::SourceNotFound(member.source_id.to_owned()));
            }
            Err(e) => return Err(e.into()),
        };
        match in_group {
            Some((_, other)) if other != group => {
                return Err(GroupError::InOtherGroup {
                    pool: pool.to_owned(),
                    image: member.image.to_owned(),
                    other,
                });
            }
            Some(_) => joined.push(true),
            None => joined.push(false),
        }
    }
    match cluster.group_create(pool, group).await {
        Ok(()) => {}
        Err(e) if e.is_already_exists() => {}
        Err(e) => return Err(e.into()),
    }
    for (member, joined) in members.iter().zip(joined) {
        if !joined {
            cluster
                .group_image(pool, group, pool, member.image, true)
                .await?;
        }
    }
    cluster.group_snap(pool, group, group, true).await?;
    tracing::info!(pool, group, members = members.len(), "group snapshot taken");
    Ok(())
}

/// Copies `member`'s source at `group@group` into its snapshot image and completes it; an
/// incomplete image of that name (a copy or record cut short) is removed first.
async fn copy_member(
    cluster: &Cluster,
    new: &NewGroupSnapshot<'_>,
    member: &Member<'_>,
) -> Result<(), GroupError> {
    let pool = new.pool;
    let image = member_image_name(new.group, member.source_id);
    let owner = SnapshotOwner {
        name: new.name.to_owned(),
        source: member.source_id.to_owned(),
        driver: new.driver.to_owned(),
        kube_cluster: new.kube_cluster.to_owned(),
    };
    let recorded = match cluster.metadata_list(pool, &image).await {
        Ok(meta) => Some(meta),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e.into()),
    };
    // Complete record: the name key (written last) is ours, so the copy finished.
    let recorded = match recorded {
        Some(meta) if SnapshotOwner::from_metadata(&meta).as_ref() == Some(&owner) => meta,
        other => {
            if other.is_some() {
                tracing::warn!(pool, image, "removing an incomplete group snapshot member");
                match cluster.remove_image(pool, &image).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            let options = CreateOptions {
                features: Some(member_features()),
                ..CreateOptions::default()
            };
            match cluster
                .copy_group_snapshot(
                    pool,
                    member.image,
                    new.group,
                    new.group,
                    pool,
                    &image,
                    &options,
                )
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {
                    return Err(GroupError::SourceNotFound(member.source_id.to_owned()));
                }
                Err(e) => return Err(e.into()),
            }
            tracing::info!(
                pool,
                image,
                source = member.image,
                group = new.group,
                "group snapshot member copied"
            );
            BTreeMap::new()
        }
    };
    let size = new.members.len().to_string();
    // librbd copies the source's metadata along: overwrite what must not read as a volume's.
    let mut entries: Vec<(&str, &str)> = NOT_A_VOLUME.to_vec();
    entries.extend(NOT_A_CLONE);
    entries.extend([
        (META_DEPTH, "0"),
        (META_GROUP_SNAPSHOT, new.group),
        (META_GROUP_SIZE, size.as_str()),
    ]);
    entries.extend(owner.entries());
    let missing = missing_entries(&recorded, &entries);
    if !missing.is_empty() {
        cluster
            .metadata_set_many(pool, &image, missing, None)
            .await?;
    }
    match cluster.snap_create(pool, &image, &image).await {
        Ok(()) => {}
        Err(e) if e.is_already_exists() => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Removes the group snapshot `group@group` and the group (its images leave it). Idempotent.
async fn remove_group(cluster: &Cluster, pool: &str, group: &str) -> Result<(), Error> {
    match cluster.group_snap(pool, group, group, false).await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    match cluster.group_remove(pool, group).await {
        Ok(()) => {
            tracing::info!(pool, group, "RBD group removed");
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the group snapshot: every member snapshot image (as [`snapshot::delete_snapshot`]
/// does: restores keep working) and what an interrupted create left (the RBD group, incomplete
/// members). Returns the member images found. Idempotent.
///
/// # Errors
/// Ceph errors.
pub async fn delete_group_snapshot(
    cluster: &Cluster,
    pool: &str,
    group: &str,
) -> Result<Vec<String>, Error> {
    remove_group(cluster, pool, group).await?;
    let found = find_members(cluster, pool, group).await?;
    for member in &found {
        snapshot::delete_snapshot(cluster, pool, &member.image).await?;
    }
    Ok(found.into_iter().map(|f| f.image).collect())
}

/// The member images of `group` in `pool` (complete or not): what [`delete_group_snapshot`]
/// would delete.
///
/// # Errors
/// Ceph errors.
pub async fn member_images(
    cluster: &Cluster,
    pool: &str,
    group: &str,
) -> Result<Vec<String>, Error> {
    Ok(find_members(cluster, pool, group)
        .await?
        .into_iter()
        .map(|f| f.image)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::snapshot_image_name;

    #[test]
    fn a_member_is_recognised_by_record_and_name_not_by_inherited_keys() {
        let group = group_name("g");
        let source = "v1/m/rbd/pvc-1";
        let image = member_image_name(&group, source);
        assert!(is_snapshot_image(&image));
        let meta: BTreeMap<String, String> = [
            (META_GROUP_SNAPSHOT.to_owned(), group.clone()),
            (META_SNAPSHOT_SOURCE.to_owned(), source.to_owned()),
        ]
        .into();
        assert_eq!(member_of(&meta, &group, &image).as_deref(), Some(source));
        // a clone (restore, snapshot of a restore) inherits the keys under another name
        assert_eq!(
            member_of(&meta, &group, &snapshot_image_name("other")),
            None
        );
        assert_eq!(member_of(&meta, &group_name("h"), &image), None);
        assert_ne!(member_image_name(&group, "v1/m/rbd/pvc-2"), image);
    }
}
