//! A clone and the steps that complete it, each image opened once.
//!
//! Every open of an image costs librbd a copy of its whole configuration (an `ImageCtx` takes
//! its own config proxy of about 2000 options) and a read of the header with the whole snapshot
//! table, so a source with many snapshots costs more per open. A snapshot or restore done as
//! separate calls opened the parent and the new image about ten times; [`Cluster::clone_recorded`]
//! does the same work with one open of each (plus the one librbd's clone itself makes of the
//! parent), in one call on the blocking pool.

use std::collections::BTreeMap;

use crate::cluster::check_image_name;
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
    /// Metadata, written in this order.
    pub metadata: Vec<(String, String)>,
    /// Grow the new image to this size when it is smaller.
    pub size: Option<u64>,
}

/// What [`Cluster::clone_recorded`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cloned {
    /// The parent's facts, read on its open handle: only for a temporary snapshot (the
    /// parent is opened to take it), else `None`.
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
    /// same call, each image opened once: the temporary snapshot taken (see
    /// [`CloneJob::temporary`]), the clone made, `record`'s metadata written (in order) and its
    /// size applied, the snapshot [`CloneJob::snapshot`] taken, the temporary snapshot removed.
    /// `record` gets the parent's facts when the parent was opened (temporary snapshot).
    ///
    /// Stops at the first error, leaving what was done (each step is one a retry can find and
    /// complete); `AlreadyExists` when the new image exists already, which the caller completes
    /// with the single-step calls.
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
        self.run(op, target, move |rados| {
            let _turns = (parent_turn, image_turn);
            let parent_io = rados.ioctx(&job.parent_pool)?;
            let io = rados.ioctx(&job.pool)?;
            let parent = if job.temporary {
                Some(parent_io.open(&job.parent, false)?)
            } else {
                None
            };
            let facts = match &parent {
                Some(img) => {
                    match img.snap_create(&job.snap) {
                        Ok(()) => {}
                        Err(e) if e.is_already_exists() => {}
                        Err(e) => return Err(e),
                    }
                    Some(ImageFacts {
                        size: img.info()?.size,
                        parent: img.parent()?,
                        metadata: img.metadata_list()?,
                        snaps: Vec::new(),
                    })
                }
                None => None,
            };
            parent_io.clone_image(&job.parent, &job.snap, &io, &job.image, &job.options)?;
            let plan = record(facts.as_ref());
            let img = io.open(&job.image, false)?;
            for (key, value) in &plan.metadata {
                img.metadata_set(key, value)?;
            }
            let mut size = img.info()?.size;
            if let Some(wanted) = plan.size.filter(|wanted| *wanted > size) {
                img.resize(wanted, false)?;
                size = wanted;
            }
            let snapshot = match &job.snapshot {
                Some(snap) => {
                    img.snap_create(snap)?;
                    img.snap_list()?.into_iter().find(|s| &s.name == snap)
                }
                None => None,
            };
            drop(img);
            if let Some(parent) = &parent {
                match parent.snap_remove(&job.snap) {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(Cloned {
                parent: facts,
                size,
                snapshot,
            })
        })
        .await
    }
}
