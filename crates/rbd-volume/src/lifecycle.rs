//! The image lifecycle on a `ceph_rbd::Cluster`: [`ensure`] (create, or find and repair after a
//! retry or a crash), [`grow`] and [`delete`] (with the owner and watcher checks).
//!
//! Crash consistency: the image name is deterministic and the owner record is written after
//! the image, the PV key last, so every state a crash can leave is recognised by the next
//! attempt:
//!
//! | found | meaning | `ensure` does |
//! |---|---|---|
//! | nothing | | creates it, then records the owner |
//! | id object without header (`AlreadyExists` on create, `NotFound` on open) | a create killed midway | removes it, creates it again |
//! | the same, its name held by another client (`ceph_rbd`'s creator lock, unexpired) | another creator's create in flight (a Lease handover) | refuses ([`Error::BeingCreated`]), the retry finds the image or the lock expired |
//! | image without owner record, or with a record cut before its PV key | a crash between create and record | adopts it, completes the record |
//! | image recorded for this volume | a retry | reuses it (size per [`Fit`]) |
//! | image recorded for another volume | a name collision | refuses ([`Error::Foreign`]) |
//! | image with object-map whose map is missing or flagged invalid | a create killed between its header and its object map (librbd flags the map it then finds missing) | rebuilds the map from the objects that exist, then as above |
//!
//! [`Hooks`] are called at each [`Step`], so crash-consistency tests can abort the process there.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ceph_rbd::{Cluster, CreateOptions};

use crate::naming::is_image_of;
use crate::owner::{Owner, Ownership, ownership, same_kube_cluster};
use crate::size::fits;

/// Points of the lifecycle where [`Hooks::step`] is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The image exists, its owner record does not.
    ImageCreated,
    /// Image and owner record exist (also when found existing).
    OwnerRecorded,
    /// The image is gone.
    ImageRemoved,
    /// The image is larger.
    ImageResized,
}

impl Step {
    /// The step's name: the crash point of the binary (`RBD_PROVISIONER_CRASH_AT`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Step::ImageCreated => "after-image-create",
            Step::OwnerRecorded => "after-image-metadata",
            Step::ImageRemoved => "after-image-remove",
            Step::ImageResized => "after-image-resize",
        }
    }
}

/// Called during the lifecycle (fault injection). Plain function pointers.
#[derive(Clone, Copy, Debug)]
pub struct Hooks {
    /// At each [`Step`].
    pub step: fn(Step),
    /// For each key of the owner record, in order (PV key last), once the record is written
    /// (the whole record goes in one call: a crash here leaves it complete).
    pub owner_key_written: fn(&str),
}

impl Default for Hooks {
    /// No hooks.
    fn default() -> Self {
        Hooks {
            step: |_| {},
            owner_key_written: |_| {},
        }
    }
}

/// What was refused on another volume's image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Creating this volume on it.
    Reuse,
    Delete,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Action::Reuse => "reuse",
            Action::Delete => "delete",
        })
    }
}

/// Why a lifecycle operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Ceph call failed (`Timeout`: it may still have happened).
    #[error(transparent)]
    Ceph(#[from] ceph_rbd::Error),
    /// The image's owner record names another volume: not reused, not deleted.
    #[error("image {pool}/{image} belongs to {owner}, not {wanted}; refusing to {action} it")]
    Foreign {
        pool: String,
        image: String,
        owner: Owner,
        /// The volume asked for (PV or request name; the image name where only it is known).
        wanted: String,
        action: Action,
    },
    /// The image is half created by another client whose create may still be running (it holds
    /// the name): not repaired. Retry later.
    #[error(
        "image {pool}/{image} is being created by another client (it holds the name, e.g. the \
         previous leader's create still in flight); it is repaired only once that create ends \
         or its claim on the name expires; retry later"
    )]
    BeingCreated { pool: String, image: String },
    /// The RADOS namespace of the pool spec does not exist (checked by [`check_namespace`]).
    #[error(
        "radosNamespace {namespace:?} does not exist in pool {pool:?}; namespaces are not created \
         implicitly: create it first (rbd namespace create {pool}/{namespace})"
    )]
    MissingNamespace { pool: String, namespace: String },
    /// The image is mirrored and demoted, and waits for the peer site to have the demotion
    /// before it is removed (so that the peer's copy survives). Retry later.
    #[error(transparent)]
    MirrorPeer(crate::mirror::MirrorError),
    /// The existing image of this volume has a size outside the range asked for.
    #[error(
        "image {pool}/{image} exists with {size} bytes, incompatible with required_bytes={required} limit_bytes={limit}"
    )]
    SizeMismatch {
        pool: String,
        image: String,
        size: u64,
        required: u64,
        limit: u64,
    },
}

/// Refuses a pool spec whose RADOS namespace does not exist ([`Error::MissingNamespace`]):
/// namespaces are an operator's step (`rbd namespace create`), never created implicitly.
///
/// # Errors
/// [`Error::MissingNamespace`], Ceph errors.
pub async fn check_namespace(cluster: &Cluster, pool_spec: &str) -> Result<(), Error> {
    let Ok((pool, namespace)) = ceph_rbd::split_pool_spec(pool_spec) else {
        // a malformed spec: the Ceph call that takes it says why
        return Ok(());
    };
    if cluster.namespace_exists(pool, namespace).await? {
        Ok(())
    } else {
        Err(Error::MissingNamespace {
            pool: pool.to_owned(),
            namespace: namespace.to_owned(),
        })
    }
}

impl Error {
    /// Whether Ceph did not answer in time: the operation may have happened (or still happen).
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Ceph(ceph_rbd::Error::Timeout { .. }))
    }
}

/// What to do with an existing image of this volume whose size differs from the one asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// Grow it when smaller (the built-in provisioner: the PV will say that size); never shrink.
    Grow,
    /// It must already be at least `required` and at most `limit` bytes (0 = no limit), else
    /// [`Error::SizeMismatch`] (CSI: a create with another capacity is `ALREADY_EXISTS`).
    Within { required: u64, limit: u64 },
}

/// An image to create (or find).
#[derive(Clone, Copy, Debug)]
pub struct NewImage<'a> {
    pub pool: &'a str,
    pub image: &'a str,
    /// Bytes, for a new image.
    pub size: u64,
    pub options: &'a CreateOptions,
    pub owner: &'a Owner,
    pub fit: Fit,
}

/// How [`ensure`] found the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Created,
    /// A half-created image (an id object without header; a clone cut before its parent was
    /// recorded) was removed and the image made again.
    Recreated,
    /// Already there with this volume's owner record.
    Reused,
    /// Already there without an owner record (or one cut before its PV key): now ours.
    Adopted,
}

/// The image as [`ensure`] leaves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ensured {
    pub outcome: Outcome,
    /// Its size in bytes.
    pub size: u64,
}

/// Creates the image with its owner record, or finds it after a retry or a crash and completes
/// it (see the module table). Idempotent.
///
/// # Errors
/// [`Error::Foreign`] for another volume's image, [`Error::SizeMismatch`] (with
/// [`Fit::Within`]), Ceph errors.
pub async fn ensure(
    cluster: &Cluster,
    new: &NewImage<'_>,
    hooks: &Hooks,
) -> Result<Ensured, Error> {
    let (pool, image) = (new.pool, new.image);
    let mut recorded = BTreeMap::new();
    let mut replaced_partial = false;
    let ensured = loop {
        match cluster
            .create_image(pool, image, new.size, new.options)
            .await
        {
            Ok(()) => {
                (hooks.step)(Step::ImageCreated);
                tracing::info!(pool, image, size = new.size, "image created");
                let outcome = if replaced_partial {
                    Outcome::Recreated
                } else {
                    Outcome::Created
                };
                break Ensured {
                    outcome,
                    size: new.size,
                };
            }
            Err(e) if e.is_already_exists() => {
                recorded = match cluster.metadata_list_unopened(pool, image).await {
                    Ok(meta) => meta,
                    // A create killed midway leaves the id object but no header: no data, and
                    // it can never be opened. Clean it up and create it properly.
                    Err(e) if e.is_not_found() && !replaced_partial => {
                        // Unless another client's create is still making it (a Lease
                        // handover: the previous leader's create in flight): it holds the name.
                        if !cluster.claim_partial_image(pool, image).await? {
                            return Err(Error::BeingCreated {
                                pool: pool.to_owned(),
                                image: image.to_owned(),
                            });
                        }
                        tracing::warn!(
                            pool,
                            image,
                            "found a partially created image (an earlier create was interrupted); removing it and creating it again"
                        );
                        match cluster.remove_image(pool, image).await {
                            Ok(()) => {}
                            Err(e) if e.is_not_found() => {}
                            Err(e) => return Err(e.into()),
                        }
                        replaced_partial = true;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                let outcome = match ownership(&recorded, &new.owner.pv, &new.owner.kube_cluster) {
                    Ownership::Ours => {
                        tracing::info!(
                            pool,
                            image,
                            "image already exists for this volume; reusing it"
                        );
                        Outcome::Reused
                    }
                    Ownership::Unrecorded => {
                        tracing::warn!(
                            pool,
                            image,
                            "image exists without an owner record; adopting it for this volume"
                        );
                        Outcome::Adopted
                    }
                    Ownership::Foreign(owner) => {
                        return Err(Error::Foreign {
                            pool: pool.to_owned(),
                            image: image.to_owned(),
                            owner,
                            wanted: new.owner.pv.clone(),
                            action: Action::Reuse,
                        });
                    }
                };
                // A create cut between the header and the object map (ours and librbd's
                // write them in that order) left an image whose object map krbd would find
                // invalid and refuse writes with: rebuilt from the objects that exist.
                cluster.repair_missing_object_map(pool, image).await?;
                let size = fit_existing(cluster, new).await?;
                break Ensured { outcome, size };
            }
            Err(e) if e.is_not_found() => {
                check_namespace(cluster, pool).await?;
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        }
    };
    // Write what is missing of the owner record (all of it after a fresh create; the rest of it
    // when an older version crashed between two keys) in one object-class call on the image
    // header: the whole record or nothing, and no librbd ImageCtx (whose construction copies
    // the whole Ceph configuration, the bulk of the CPU a volume costs). The PV key still goes
    // last, for records completed key by key by older versions.
    let missing: Vec<(String, String)> = new
        .owner
        .entries()
        .iter()
        .filter(|(key, value)| recorded.get(*key).map(String::as_str) != Some(*value))
        .map(|(key, value)| ((*key).to_string(), (*value).to_string()))
        .collect();
    if !missing.is_empty() {
        cluster
            .metadata_set_unopened(pool, image, missing.clone())
            .await?;
        for (key, _) in &missing {
            (hooks.owner_key_written)(key);
        }
    }
    (hooks.step)(Step::OwnerRecorded);
    Ok(ensured)
}

/// The size of an existing image of this volume, grown or checked per [`NewImage::fit`].
async fn fit_existing(cluster: &Cluster, new: &NewImage<'_>) -> Result<u64, Error> {
    let (pool, image) = (new.pool, new.image);
    let size = cluster.image_info(pool, image).await?.size;
    match new.fit {
        Fit::Grow if size < new.size => {
            cluster.resize_image(pool, image, new.size, false).await?;
            tracing::info!(
                pool,
                image,
                from = size,
                to = new.size,
                "existing image grown"
            );
            Ok(new.size)
        }
        Fit::Grow => Ok(size),
        Fit::Within { required, limit } if fits(size, required, limit) => Ok(size),
        Fit::Within { required, limit } => Err(Error::SizeMismatch {
            pool: pool.to_owned(),
            image: image.to_owned(),
            size,
            required,
            limit,
        }),
    }
}

/// The result of [`grow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grown {
    /// The size before, in bytes.
    pub from: u64,
    /// The size now: at least the size asked for (never shrunk).
    pub size: u64,
}

/// Grows the image to `size` bytes; a larger image is left as it is. Idempotent.
///
/// # Errors
/// Ceph errors (`NotFound` for a missing image).
pub async fn grow(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    size: u64,
    hooks: &Hooks,
) -> Result<Grown, Error> {
    let current = cluster.image_info(pool, image).await?.size;
    if current < size {
        cluster.resize_image(pool, image, size, false).await?;
        (hooks.step)(Step::ImageResized);
        tracing::info!(pool, image, from = current, to = size, "image resized");
    }
    Ok(Grown {
        from: current,
        size: current.max(size),
    })
}

/// Which volume a delete is for: whose owner record the image may carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimant {
    /// `None` when only the image is known.
    volume: Option<String>,
    /// Empty: unknown, not compared.
    kube_cluster: String,
}

impl Claimant {
    /// The PV (or request) name is known: a record naming another one refuses the delete.
    #[must_use]
    pub fn volume(name: impl Into<String>) -> Claimant {
        Claimant {
            volume: Some(name.into()),
            kube_cluster: String::new(),
        }
    }

    /// Only the image is known (a CSI volume ID): a record naming a volume this image is not
    /// the image of ([`crate::naming::is_image_of`]) refuses the delete.
    #[must_use]
    pub fn image() -> Claimant {
        Claimant {
            volume: None,
            kube_cluster: String::new(),
        }
    }

    /// The same, for the Kubernetes cluster `id` (empty: unknown): a record naming another
    /// Kubernetes cluster refuses the delete too. A record made before the cluster was recorded
    /// names none and is judged by its volume alone.
    #[must_use]
    pub fn in_kube_cluster(mut self, id: &str) -> Claimant {
        id.clone_into(&mut self.kube_cluster);
        self
    }

    /// `Err(owner)` when the record in `meta` names another volume than this one for `image`,
    /// or another Kubernetes cluster.
    pub(crate) fn check(&self, meta: &BTreeMap<String, String>, image: &str) -> Result<(), Owner> {
        match &self.volume {
            Some(name) => match ownership(meta, name, &self.kube_cluster) {
                Ownership::Foreign(owner) => Err(owner),
                Ownership::Ours | Ownership::Unrecorded => Ok(()),
            },
            None => match Owner::from_metadata(meta) {
                Some(owner)
                    if !is_image_of(image, &owner.pv)
                        || !same_kube_cluster(&owner.kube_cluster, &self.kube_cluster) =>
                {
                    Err(owner)
                }
                _ => Ok(()),
            },
        }
    }

    fn wanted(&self, image: &str) -> String {
        self.volume.clone().unwrap_or_else(|| image.to_owned())
    }
}

/// What [`delete`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Removed,
    /// There was no image (deleted before): success.
    AlreadyGone,
}

/// How long [`delete`] retries an EBUSY without watchers.
const BUSY_RETRY_FOR: Duration = Duration::from_secs(3);

/// Removes the image, unless its owner record names another volume ([`Error::Foreign`]) or it
/// is still mapped or open somewhere (`ceph_rbd::Error::InUse`, naming the watchers). The owner
/// record is read from the image header without opening the image, and a plain, unwatched
/// image is removed without librbd (`ceph_rbd::Cluster::remove_image_checked`). A missing image is
/// success ([`Deleted::AlreadyGone`]); a half-created one is removed. Idempotent.
///
/// EBUSY with no watcher left is the tail of a client that just closed the image (its watch is
/// still being torn down): retried for up to 3 s with doubling delays.
///
/// # Errors
/// [`Error::Foreign`], Ceph errors.
pub async fn delete(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    claimant: &Claimant,
    hooks: &Hooks,
) -> Result<Deleted, Error> {
    let mut delay = Duration::from_millis(100);
    let deadline = Instant::now() + BUSY_RETRY_FOR;
    loop {
        let (for_check, image_name) = (claimant.clone(), image.to_owned());
        let foreign = std::sync::Arc::new(std::sync::Mutex::new(None));
        let found = std::sync::Arc::clone(&foreign);
        let check = move |meta: &BTreeMap<String, String>| {
            for_check.check(meta, &image_name).map_err(|owner| {
                let reason = owner.to_string();
                *found
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(owner);
                reason
            })
        };
        match cluster.remove_image_checked(pool, image, check).await {
            Ok(Ok(())) => {
                (hooks.step)(Step::ImageRemoved);
                tracing::info!(pool, image, "image removed");
                return Ok(Deleted::Removed);
            }
            Ok(Err(reason)) => {
                // `check` stores the owner it refuses; its description is the fallback
                let owner = foreign
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take()
                    .unwrap_or_else(|| Owner {
                        pv: reason,
                        ..Owner::default()
                    });
                return Err(Error::Foreign {
                    pool: pool.to_owned(),
                    image: image.to_owned(),
                    owner,
                    wanted: claimant.wanted(image),
                    action: Action::Delete,
                });
            }
            Err(e) if e.is_not_found() => {
                tracing::info!(pool, image, "image already gone");
                return Ok(Deleted::AlreadyGone);
            }
            Err(ceph_rbd::Error::Busy { .. }) if Instant::now() + delay < deadline => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owner::{META_CLAIM, META_PV};

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn a_delete_by_volume_name_refuses_only_another_volumes_record() {
        let by_name = Claimant::volume("pvc-a");
        assert!(by_name.check(&meta(&[(META_PV, "pvc-a")]), "img").is_ok());
        assert!(by_name.check(&meta(&[]), "img").is_ok(), "unrecorded");
        assert!(
            by_name.check(&meta(&[(META_CLAIM, "ns/c")]), "img").is_ok(),
            "a record cut before its PV key"
        );
        let owner = by_name
            .check(&meta(&[(META_PV, "pvc-b"), (META_CLAIM, "ns/b")]), "img")
            .unwrap_err();
        assert_eq!(owner.to_string(), "PV pvc-b (claim ns/b)");
    }

    #[test]
    fn a_delete_refuses_a_record_of_another_kubernetes_cluster() {
        use crate::owner::META_KUBE_CLUSTER;
        let uid = "6c1f0d2e-8a4b-4c3d-9e2f-0a1b2c3d4e5f";
        let pv = format!("pvc-{uid}");
        let theirs = meta(&[(META_PV, &pv), (META_KUBE_CLUSTER, "uid-b")]);
        let ours = meta(&[(META_PV, &pv), (META_KUBE_CLUSTER, "uid-a")]);
        let before = meta(&[(META_PV, &pv)]);
        for claimant in [Claimant::volume(pv.clone()), Claimant::image()] {
            let claimant = claimant.in_kube_cluster("uid-a");
            assert!(claimant.check(&ours, &pv).is_ok());
            assert!(
                claimant.check(&before, &pv).is_ok(),
                "made before the change"
            );
            let owner = claimant.check(&theirs, &pv).unwrap_err();
            assert_eq!(owner.kube_cluster, "uid-b");
        }
        // without an identity (a CSI controller given none) nothing is compared
        assert!(Claimant::image().check(&theirs, &pv).is_ok());
    }

    #[test]
    fn a_delete_by_image_refuses_a_record_of_a_volume_with_another_image() {
        let uid = "6c1f0d2e-8a4b-4c3d-9e2f-0a1b2c3d4e5f";
        let pv = format!("pvc-{uid}");
        let record = meta(&[(META_PV, &pv)]);
        assert!(Claimant::image().check(&record, &pv).is_ok(), "CSI-made");
        let provisioner_made = format!("kubernetes-dynamic-pvc-{uid}");
        assert!(Claimant::image().check(&record, &provisioner_made).is_ok());
        assert!(
            Claimant::image().check(&meta(&[]), "img").is_ok(),
            "unrecorded"
        );
        let owner = Claimant::image()
            .check(&meta(&[(META_PV, "someone-else")]), "pvc-victim")
            .unwrap_err();
        assert_eq!(owner.pv, "someone-else");
    }

    #[test]
    fn refusals_name_both_volumes() {
        let e = Error::Foreign {
            pool: "rbd".into(),
            image: "img".into(),
            owner: Owner {
                pv: "pvc-b".into(),
                claim: "ns/b".into(),
                provisioner: "ceph.com/rbd".into(),
                kube_cluster: String::new(),
            },
            wanted: "pvc-a".into(),
            action: Action::Delete,
        };
        assert_eq!(
            e.to_string(),
            "image rbd/img belongs to PV pvc-b (claim ns/b), not pvc-a; refusing to delete it"
        );
        assert!(!e.is_timeout());
    }

    #[test]
    fn step_names_are_the_crash_points() {
        let names: Vec<&str> = [
            Step::ImageCreated,
            Step::OwnerRecorded,
            Step::ImageRemoved,
            Step::ImageResized,
        ]
        .into_iter()
        .map(Step::name)
        .collect();
        assert_eq!(
            names,
            [
                "after-image-create",
                "after-image-metadata",
                "after-image-remove",
                "after-image-resize"
            ]
        );
    }
}
