//! A clone and the steps that complete it, each image opened once.
//!
//! Every open of an image costs librbd a copy of its whole configuration (an `ImageCtx` takes
//! its own config proxy of about 2000 options) and a read of the header with the whole snapshot
//! table, so a source with many snapshots costs more per open. A snapshot or restore done as
//! separate calls opened the parent and the new image about ten times; [`Cluster::clone_recorded`]
//! does the same work with at most one open of the parent (to take a temporary snapshot of it
//! where somebody has it open; [`first_snapshot::take`] takes it otherwise) and none of the new
//! image, in one call on the blocking pool: the clone itself is made with RADOS calls where both
//! images are plain ([`crate::plain_clone`]; otherwise librbd's clone
//! opens both). The new image's record is written through its header's
//! object class rather than librbd's metadata calls, each of which notifies the image's
//! watchers and makes the next call on the open image refresh it, and the new image's snapshot
//! (if any) is taken without opening it ([`crate::first_snapshot`]) unless somebody watches it.

use std::collections::BTreeMap;

use crate::cluster::check_image_name;
use crate::first_snapshot::{self, Taken, Under};
use crate::header;
use crate::plain_clone;
use crate::raw::IoCtx;
use crate::{Cluster, CreateOptions, Error, ParentSpec, SnapInfo};

/// What is read from an image with one open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFacts {
    pub size: u64,
    /// The snapshot it was cloned from, `None` for no clone (or a flattened one).
    pub parent: Option<ParentSpec>,
    pub metadata: BTreeMap<String, String>,
    /// Its user snapshots.
    pub snaps: Vec<SnapInfo>,
}

/// A clone for [`Cluster::clone_recorded`].
#[derive(Clone, Debug)]
pub struct CloneJob {
    /// The parent's pool spec (`pool` or `pool/namespace`), image and snapshot.
    pub parent_pool: String,
    pub parent: String,
    pub snap: String,
    /// `snap` is a temporary snapshot of the parent: taken first (one left by an earlier attempt
    /// is reused) and removed once the clone holds it; clone v2 keeps it in the parent's
    /// snapshot trash while the clone depends on it.
    pub temporary: bool,
    pub pool: String,
    pub image: String,
    pub options: CreateOptions,
    /// A snapshot to take of the new image once its record is written.
    pub snapshot: Option<String>,
}

/// What to write on the new image, decided from the parent's facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloneRecord {
    /// Metadata, written in one object-class call on the new image's header: all or none.
    pub metadata: Vec<(String, String)>,
    /// Grow the new image to this size when it is smaller.
    pub size: Option<u64>,
}

/// What [`Cluster::clone_recorded`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cloned {
    /// The parent's facts, read on its open handle just before the temporary snapshot: only
    /// for a temporary snapshot (the parent is opened to take it), else `None`.
    pub parent: Option<ImageFacts>,
    /// The new image's size.
    pub size: u64,
    /// The snapshot taken of the new image ([`CloneJob::snapshot`]).
    pub snapshot: Option<SnapInfo>,
}

impl Cluster {
    /// One open, all of: size, parent, metadata and user snapshots of `pool/name`.
    ///
    /// # Errors
    /// Not found, Ceph errors.
    pub async fn image_facts(&self, pool: &str, name: &str) -> Result<ImageFacts, Error> {
        let op = "read image";
        check_image_name(op, pool, name)?;
        let name = name.to_string();
        self.with_pool(op, pool, format!("{pool}/{name}"), move |io| {
            let img = io.open(&name, true)?;
            Ok(ImageFacts {
                size: img.info()?.size,
                parent: img.parent()?,
                metadata: img.metadata_list()?,
                snaps: img.snap_list()?,
            })
        })
        .await
    }

    /// Clones `job`'s parent snapshot to `job.pool/job.image` and completes the new image in the
    /// same call, each image opened at most once: the temporary snapshot taken (see
    /// [`CloneJob::temporary`]), the clone made, the temporary snapshot removed (the parent's
    /// turn ends there: the next operation on it may start), `record`'s metadata written (one
    /// object-class call on the new image's header), its size applied, the snapshot
    /// [`CloneJob::snapshot`] taken (the new image is opened only to grow it, or for that
    /// snapshot when somebody watches it: otherwise it is taken with RADOS calls). `record`
    /// gets the parent's facts when the parent was opened (temporary snapshot).
    ///
    /// Stops at the first error, leaving what was done (each step is one a retry can find and
    /// complete); `AlreadyExists` when the new image exists already, which the caller completes
    /// with the single-step calls. With clone format 1 ([`Cluster::clone_format`]) a temporary
    /// snapshot is refused (`InvalidArgument`, nothing done): a clone v1 keeps its parent
    /// snapshot protected until it is flattened.
    ///
    /// # Errors
    /// Not found (parent or its snapshot), already exists (the new image), Ceph errors.
    pub async fn clone_recorded(
        &self,
        job: CloneJob,
        record: impl FnOnce(Option<&ImageFacts>) -> CloneRecord + Send + 'static,
    ) -> Result<Cloned, Error> {
        let op = "clone image";
        check_image_name(op, &job.parent_pool, &job.parent)?;
        check_image_name(op, &job.pool, &job.image)?;
        // Both images' turns, parent first (every caller takes them in this order): the
        // parent is written to only for a temporary snapshot, the new image always.
        let parent_turn = if job.temporary {
            Some(self.claim_image(op, &job.parent_pool, &job.parent).await?)
        } else {
            None
        };
        let image_turn = self.claim_image(op, &job.pool, &job.image).await?;
        let target = format!("{}/{}@{}", job.parent_pool, job.parent, job.snap);
        let lock_secs = crate::create::creator_lock_secs(self.op_timeout());
        self.run(op, target.clone(), move |rados| {
            let _image_turn = image_turn;
            if job.temporary && rados.compat().clone_format == crate::CloneFormat::V1 {
                // its protected snapshot cannot go while a clone v1 depends on it
                return Err(Error::invalid(
                    op,
                    target,
                    "a temporary snapshot cannot be removed under a clone v1 (clone format 1): \
                     clone it with clone_image, flatten the clone, then remove the snapshot",
                ));
            }
            let parent_io = rados.ioctx(&job.parent_pool)?;
            let io = rados.ioctx(&job.pool)?;
            let parent_target = format!("{}/{}", job.parent_pool, job.parent);
            let target = format!("{}/{}", job.pool, job.image);
            // The temporary snapshot without an open where nobody has the source open, else
            // through an open handle (librbd quiesces and asks the lock's owner).
            let unopened = if job.temporary {
                temporary_snapshot_unopened(&parent_io, op, &parent_target, &job.parent, &job.snap)?
            } else {
                None
            };
            let parent = if job.temporary && unopened.is_none() {
                Some(parent_io.open(&job.parent, false)?)
            } else {
                None
            };
            let (facts, parent_id) = match (&parent, unopened) {
                (_, Some((facts, id))) => (Some(facts), Some(id)),
                (Some(img), None) => {
                    // read before the snapshot: after it, the handle would refresh first
                    let info = img.info()?;
                    let facts = ImageFacts {
                        size: info.size,
                        parent: img.parent()?,
                        metadata: img.metadata_list()?,
                        snaps: Vec::new(),
                    };
                    match img.snap_create(&job.snap) {
                        Ok(()) => {}
                        Err(e) if e.is_already_exists() => {}
                        Err(e) => return Err(e),
                    }
                    (Some(facts), Some(info.id).filter(|id| !id.is_empty()))
                }
                // a format-1 image has no ID object, a missing one neither: librbd says which
                (None, None) => match header::image_id(&parent_io, op, &parent_target, &job.parent)
                {
                    Ok(id) => (None, Some(id)),
                    Err(e) if e.is_not_found() => (None, None),
                    Err(e) => return Err(e),
                },
            };
            // The parent snapshot from the header (newest first: a few calls), then the clone
            // with RADOS calls where it is plain, else librbd's (which opens both images).
            let parent_snap = match &parent_id {
                Some(id) => {
                    match plain_clone::parent_snap(&parent_io, op, &parent_target, id, &job.snap) {
                        Ok(snap) => snap,
                        Err(e) if e.is_not_found() => None,
                        Err(e) => return Err(e),
                    }
                }
                None => None,
            };
            let cloned = match &parent_snap {
                Some(snap) => plain_clone::clone(
                    &parent_io,
                    snap,
                    &io,
                    &target,
                    &job.image,
                    &job.options,
                    lock_secs,
                )?,
                None => plain_clone::Cloned::LeftToLibrbd("the parent snapshot was not read"),
            };
            let raw_snap = match (&cloned, &parent_snap) {
                (plain_clone::Cloned::Created(_), Some(snap)) => Some(snap.snap_id),
                (plain_clone::Cloned::LeftToLibrbd(why), _) => {
                    tracing::debug!(image = %target, why, "cloning through librbd");
                    parent_io.clone_image(&job.parent, &job.snap, &io, &job.image, &job.options)?;
                    None
                }
                (plain_clone::Cloned::Created(_), None) => None,
            };
            // The parent's part ends here: its temporary snapshot goes (to its snapshot trash
            // while the clone depends on it), the handle closes (its exclusive lock with it),
            // and the next operation on the parent may start while this one completes the new
            // image. After a clone without librbd, the snapshot is trashed the same way: the
            // handle would refresh first (a read of every snapshot the parent has).
            if job.temporary {
                match raw_snap.zip(parent_id.as_deref()) {
                    Some((snap_id, parent_id)) => {
                        plain_clone::trash_snapshot(
                            &parent_io,
                            op,
                            &parent_target,
                            parent_id,
                            snap_id,
                        )?;
                        // our handle closed first: it must not be answering the notification
                        drop(parent);
                        plain_clone::notify_header(&parent_io, op, &parent_target, parent_id)?;
                    }
                    None => {
                        let parent = match parent {
                            Some(parent) => parent,
                            None => parent_io.open(&job.parent, false)?,
                        };
                        match parent.snap_remove(&job.snap) {
                            Ok(()) => {}
                            Err(e) if e.is_not_found() => {}
                            Err(e) => return Err(e),
                        }
                        drop(parent);
                    }
                }
            }
            drop(parent_turn);
            let plan = record(facts.as_ref());
            // The record and the size through the header's object class, not an open: librbd
            // would notify and refresh (a new configuration copy) after every key. The new
            // image is opened only to grow it (or to take its snapshot when it is watched).
            let id = match cloned {
                plain_clone::Cloned::Created(id) => id,
                plain_clone::Cloned::LeftToLibrbd(_) => {
                    header::image_id(&io, op, &target, &job.image)?
                }
            };
            if !plan.metadata.is_empty() {
                header::set_metadata(&io, op, &target, &id, &plan.metadata)?;
            }
            let mut size = header::size(&io, op, &target, &id, header::NOSNAP)?;
            let grow = plan.size.filter(|wanted| *wanted > size);
            if let Some(wanted) = grow {
                let img = io.open(&job.image, false)?;
                img.resize(wanted, false)?;
                size = wanted;
                if let Some(snap) = &job.snapshot {
                    img.snap_create(snap)?;
                }
            } else if let Some(snap) = &job.snapshot {
                // nobody has the new image open: its snapshot without an open, unless watched
                if first_snapshot::take(&io, op, &target, &id, snap, Under::Nothing)?
                    == Taken::LeftToLibrbd
                {
                    io.open(&job.image, false)?.snap_create(snap)?;
                }
            }
            // read from the header: the open handle would refresh itself first
            let snapshot = match &job.snapshot {
                Some(snap) => header::snapshot(&io, op, &target, &id, snap)?,
                None => None,
            };
            Ok(Cloned {
                parent: facts,
                size,
                snapshot,
            })
        })
        .await
    }
}

/// The temporary snapshot `snap` of the source `name`, taken with RADOS calls under librbd's
/// exclusive lock ([`first_snapshot::take`]) when nobody has the source open, with the source's
/// facts read from its header: `Some((facts, source ID))`, also when a snapshot of
/// that name exists already (a retry). `None`: the source is left to an open (format 1,
/// missing, a clone, whose parent librbd names, watched, locked, or with a feature only librbd
/// snapshots).
fn temporary_snapshot_unopened(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
    snap: &str,
) -> Result<Option<(ImageFacts, String)>, Error> {
    let id = match header::image_id(io, op, target, name) {
        Ok(id) => id,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    if header::parent(io, op, target, &id)?.is_some() {
        return Ok(None);
    }
    let facts = ImageFacts {
        size: header::size(io, op, target, &id, header::NOSNAP)?,
        parent: None,
        metadata: header::metadata(io, op, target, &id)?,
        snaps: Vec::new(),
    };
    match first_snapshot::take(io, op, target, &id, snap, Under::ExclusiveLock) {
        Ok(Taken::Snapshot(_)) => Ok(Some((facts, id))),
        Err(e) if e.is_already_exists() => Ok(Some((facts, id))),
        Ok(Taken::LeftToLibrbd) => Ok(None),
        Err(e) => Err(e),
    }
}
