//! A clone v2 of a snapshot, made with RADOS calls, without librbd.
//!
//! librbd's `image::CloneRequest` opens the parent at its snapshot (an image context: a copy of
//! the whole configuration and a read of the header with every snapshot's details, so its cost
//! grows with the number of snapshots the parent has, trashed ones included) and then the new
//! image, only to read a few facts and to send the writes below. When the parent and the new
//! image are plain ([`crate::create`]'s rules for the new one; the parent without journaling, a
//! separate data pool or migration), the clone is those writes, in librbd's order:
//!
//! 1. the new image, created as [`crate::create`] does, with the parent snapshot's size and,
//!    unless the options say otherwise, the parent's object size and features;
//! 2. `parent_attach` on its header: the parent (pool, namespace, image ID, snapshot ID) and the
//!    overlap (the whole size);
//! 3. `op_features_set` on its header: the clone-child operation feature (clone v2), in one
//!    atomic operation with step 2;
//! 4. `child_attach` on the parent's header: the snapshot's child count and children list (the
//!    class sets the parent's clone-parent operation feature itself);
//! 5. the parent's metadata copied to the new image, in one `metadata_set`.
//!
//! A failure after step 1 removes the new image with librbd, which detaches it from the parent
//! where it was attached, as librbd's clone does. Anything else is left to librbd
//! ([`Cloned::LeftToLibrbd`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::CreateOptions;
use crate::create::{Plain, create_plain};
use crate::denc::{Reader, malformed, put_bytes};
use crate::error::Error;
use crate::features::Features;
use crate::header;
use crate::raw::{IoCtx, WriteStep};

static CLONED_PLAIN: AtomicU64 = AtomicU64::new(0);

/// How many clones this process made without librbd (see the `plain_clone` module).
pub fn cloned_without_librbd() -> u64 {
    CLONED_PLAIN.load(Ordering::Relaxed)
}

const OP: &str = "clone image";

/// librbd's `RBD_OPERATION_FEATURE_CLONE_CHILD`.
const OP_CLONE_CHILD: u64 = 1 << 1;

/// The parent of a clone: a snapshot of a format-2 image.
#[derive(Debug, Clone)]
pub(crate) struct ParentSnap {
    /// The image's ID.
    pub(crate) image_id: String,
    pub(crate) snap_id: u64,
    /// The image's size at the snapshot.
    pub(crate) size: u64,
    /// The image's object order.
    pub(crate) order: u8,
    pub(crate) features: Features,
}

/// Snapshot `snap` of the format-2 image whose ID is `image_id`, read from its header; `None`
/// when it has no snapshot of that name. The snapshot IDs come newest first, so finding one
/// just taken costs a few calls however many snapshots the image has.
pub(crate) fn parent_snap(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    image_id: &str,
    snap: &str,
) -> Result<Option<ParentSnap>, Error> {
    let Some(info) = header::snapshot(io, op, target, image_id, snap)? else {
        return Ok(None);
    };
    let header = format!("rbd_header.{image_id}");
    let sized = io.exec(
        op,
        target,
        &header,
        "rbd",
        "get_size",
        &info.id.to_le_bytes(),
    )?;
    let order = Reader(&sized)
        .u8()
        .ok_or_else(|| malformed(op, target, "get_size"))?;
    let features = header::features(io, op, target, image_id)?;
    Ok(Some(ParentSnap {
        image_id: image_id.to_owned(),
        snap_id: info.id,
        size: info.size,
        order,
        features,
    }))
}

/// The features librbd's clone gives the new image when it is told none: the parent's, less
/// those librbd sets by itself (`RBD_FEATURES_IMPLICIT_ENABLE`: striping, data pool, fast-diff,
/// operations, migration, non-primary); creating it gives object-map its fast-diff again.
fn inherited(parent: Features) -> Features {
    const IMPLICIT: u64 = Features::STRIPINGV2.bits()
        | Features::DATA_POOL.bits()
        | Features::FAST_DIFF.bits()
        | Features::OPERATIONS.bits()
        | Features::MIGRATING.bits()
        | Features::NON_PRIMARY.bits();
    Features::from_bits(parent.bits() & !IMPLICIT)
}

/// What [`clone`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Cloned {
    /// The clone exists now, with this ID.
    Created(String),
    /// Nothing was written: librbd has to make this clone.
    LeftToLibrbd(&'static str),
}

/// `parent_attach`'s input: the versioned `ParentImageSpec` (pool ID, namespace, image ID,
/// snapshot ID), the overlap, and `reattach` false.
fn parent_attach_input(pool_id: i64, namespace: &str, parent: &ParentSnap) -> Vec<u8> {
    let mut spec = Vec::new();
    spec.extend_from_slice(&pool_id.to_le_bytes());
    put_bytes(&mut spec, namespace.as_bytes());
    put_bytes(&mut spec, parent.image_id.as_bytes());
    spec.extend_from_slice(&parent.snap_id.to_le_bytes());
    let mut input = versioned(1, &spec);
    input.extend_from_slice(&parent.size.to_le_bytes());
    input.push(0);
    input
}

/// `child_attach`'s input: the snapshot ID and the versioned `ChildImageSpec` (version 2:
/// pool ID, image ID, namespace).
pub(crate) fn child_attach_input(
    snap_id: u64,
    pool_id: i64,
    namespace: &str,
    child_id: &str,
) -> Vec<u8> {
    let mut spec = Vec::new();
    spec.extend_from_slice(&pool_id.to_le_bytes());
    put_bytes(&mut spec, child_id.as_bytes());
    put_bytes(&mut spec, namespace.as_bytes());
    let mut input = snap_id.to_le_bytes().to_vec();
    input.extend_from_slice(&versioned(2, &spec));
    input
}

/// `ENCODE_START(version, 1)`: version, compatible version 1, length, then `body`.
fn versioned(version: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![version, 1];
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// Clones `parent` (in `parent_io`) as image `name` in `io` with RADOS calls when both are
/// plain; see the module's text.
///
/// # Errors
/// `AlreadyExists` when the name is taken, Ceph errors (the new image is removed again).
pub(crate) fn clone(
    parent_io: &IoCtx<'_>,
    parent: &ParentSnap,
    io: &IoCtx<'_>,
    target: &str,
    name: &str,
    opts: &CreateOptions,
    lock_secs: u32,
) -> Result<Cloned, Error> {
    let op = OP;
    if crate::librbd_only::librbd_only() {
        return Ok(Cloned::LeftToLibrbd(crate::librbd_only::WHY));
    }
    if let Some(why) = io.compat().refuses(crate::compat::FastPath::Clone) {
        return Ok(Cloned::LeftToLibrbd(why));
    }
    if !parent.features.contains(Features::LAYERING) {
        return Ok(Cloned::LeftToLibrbd("the parent has no layering"));
    }
    if parent.features.bits() & !crate::first_snapshot::HANDLED.bits() != 0 {
        return Ok(Cloned::LeftToLibrbd(
            "the parent has features beyond the plain ones",
        ));
    }
    // librbd's clone takes the parent's object size, and its features, unless told others
    let opts = CreateOptions {
        object_size: opts.object_size.or(Some(1u64 << parent.order)),
        features: Some(opts.features.unwrap_or_else(|| inherited(parent.features))),
        ..opts.clone()
    };
    if !opts
        .features
        .is_some_and(|features| features.contains(Features::LAYERING))
    {
        return Ok(Cloned::LeftToLibrbd("the features do not include layering"));
    }
    let id = match create_plain(io, op, target, name, parent.size, &opts, lock_secs)? {
        Plain::Created(id) => id,
        Plain::No(why) => return Ok(Cloned::LeftToLibrbd(why)),
    };
    crate::steps::hit(crate::steps::CLONE_AFTER_HEADER, target);
    match attach(parent_io, parent, io, op, target, &id) {
        Ok(()) => {
            CLONED_PLAIN.fetch_add(1, Ordering::Relaxed);
            Ok(Cloned::Created(id))
        }
        Err(e) => {
            // librbd's remove detaches the child from the parent where it was attached
            if let Err(undo) = io.remove_image(name) {
                tracing::warn!(image = %target, error = %undo, "removing a clone cut short");
            }
            Err(e)
        }
    }
}

/// Steps 2 to 5 for the new image whose ID is `id`.
fn attach(
    parent_io: &IoCtx<'_>,
    parent: &ParentSnap,
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
) -> Result<(), Error> {
    // The parent and the clone-child operation feature in one atomic operation (librbd sends
    // them one after the other). They cannot go in the operation that creates the header: the
    // class reads the image's features, which a call of the same operation does not see yet.
    let parent_spec = parent_attach_input(parent_io.pool_id(), parent_io.namespace(), parent);
    let mut op_features = OP_CLONE_CHILD.to_le_bytes().to_vec();
    op_features.extend_from_slice(&OP_CLONE_CHILD.to_le_bytes());
    io.write_op(
        op,
        target,
        &format!("rbd_header.{id}"),
        &[
            WriteStep::rbd("parent_attach", &parent_spec),
            WriteStep::rbd("op_features_set", &op_features),
        ],
    )?;
    crate::steps::hit(crate::steps::CLONE_AFTER_PARENT_ATTACH, target);
    let child = child_attach_input(parent.snap_id, io.pool_id(), io.namespace(), id);
    parent_io.write_op(
        op,
        target,
        &format!("rbd_header.{}", parent.image_id),
        &[WriteStep::rbd("child_attach", &child)],
    )?;
    crate::steps::hit(crate::steps::CLONE_AFTER_CHILD_ATTACH, target);
    let metadata: Vec<(String, String)> =
        header::metadata(parent_io, op, target, &parent.image_id)?
            .into_iter()
            .collect();
    if !metadata.is_empty() {
        header::set_metadata(io, op, target, id, &metadata)?;
    }
    Ok(())
}

/// Moves snapshot `snap_id` of the image whose ID is `image_id` to its snapshot trash, as
/// librbd's removal of a snapshot that clones still depend on does (the class renames it and
/// records its old name; it is purged when its last clone goes). The image's watchers are to
/// be told afterwards ([`notify_header`]), once this process's own handle on it is closed: a
/// handle that is closed while it answers a notification librbd does not survive.
pub(crate) fn trash_snapshot(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    image_id: &str,
    snap_id: u64,
) -> Result<(), Error> {
    io.write_op(
        op,
        target,
        &format!("rbd_header.{image_id}"),
        &[WriteStep::rbd("snapshot_trash_add", &snap_id.to_le_bytes())],
    )
}

/// Tells the watchers of the image whose ID is `image_id` (a node that has it mapped) to
/// re-read its header.
pub(crate) fn notify_header(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    image_id: &str,
) -> Result<(), Error> {
    io.notify_watchers(
        op,
        target,
        &format!("rbd_header.{image_id}"),
        crate::first_snapshot::NOTIFY_TIMEOUT_MS,
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Removing or flattening a clone waits for its parent's turn: librbd opens the parent to
    /// drop a trashed snapshot whose last clone goes, and two opens of one image in this process
    /// contend for its exclusive lock (librbd aborted, 1 in about 80 runs of 100 snapshot
    /// deletions of one source). Then many clones of one source, each the last of its trashed
    /// snapshot, removed at once: all go, and the source is left without snapshots.
    #[tokio::test]
    async fn removing_a_clone_takes_its_parents_turn() {
        use crate::{CloneJob, CloneRecord};
        use std::time::Duration;
        let c = micro_ceph::cluster();
        let cluster = crate::cluster::test_cluster().await;
        let pool = c.pool.clone();
        let source = format!("turn-src-{}", std::process::id());
        let opts = CreateOptions {
            features: Some(
                Features::parse("layering,exclusive-lock,object-map,fast-diff").unwrap(),
            ),
            ..CreateOptions::default()
        };
        cluster
            .create_image(&pool, &source, 4 << 20, &opts)
            .await
            .unwrap();
        let mut clones = Vec::new();
        for i in 0..12 {
            let image = format!("{source}-clone-{i}");
            let job = CloneJob {
                parent_pool: pool.clone(),
                parent: source.clone(),
                snap: format!("tmp-{i}"),
                temporary: true,
                pool: pool.clone(),
                image: image.clone(),
                options: opts.clone(),
                snapshot: None,
            };
            cluster
                .clone_recorded(job, |_| CloneRecord::default())
                .await
                .unwrap();
            clones.push(image);
        }

        // while the source's turn is held, neither a removal nor a flatten of a clone starts
        let held = cluster.claim_image("test", &pool, &source).await.unwrap();
        let remove = {
            let (cluster, pool, image) = (cluster.clone(), pool.clone(), clones[0].clone());
            tokio::spawn(async move { cluster.remove_image(&pool, &image).await })
        };
        let flatten = {
            let (cluster, pool, image) = (cluster.clone(), pool.clone(), clones[1].clone());
            tokio::spawn(async move { cluster.flatten(&pool, &image).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!remove.is_finished() && !flatten.is_finished());
        assert!(cluster.parent(&pool, &clones[0]).await.unwrap().is_some());
        drop(held);
        remove.await.unwrap().unwrap();
        flatten.await.unwrap().unwrap();
        assert!(cluster.parent(&pool, &clones[1]).await.unwrap().is_none());

        // the rest at once
        let removals = clones.iter().map(|image| {
            let (cluster, pool, image) = (cluster.clone(), pool.clone(), image.clone());
            tokio::spawn(async move { cluster.remove_image(&pool, &image).await })
        });
        for removal in removals.collect::<Vec<_>>() {
            match removal.await.unwrap() {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => panic!("{e}"),
            }
        }
        let left = c
            .rbd(&["snap", "ls", "--all", &format!("{pool}/{source}")])
            .unwrap();
        assert!(left.trim().is_empty(), "{left}");
        cluster.remove_image(&pool, &source).await.unwrap();
    }

    #[test]
    fn the_specs_are_encoded_as_the_rbd_class_decodes_them() {
        let parent = ParentSnap {
            image_id: "ab".into(),
            snap_id: 7,
            size: 1 << 20,
            order: 22,
            features: Features::LAYERING,
        };
        let input = parent_attach_input(3, "ns", &parent);
        let mut r = Reader(&input);
        assert_eq!(
            (r.u8(), r.u8(), r.u32()),
            (Some(1), Some(1), Some(8 + 6 + 6 + 8))
        );
        assert_eq!(r.i64(), Some(3));
        assert_eq!(r.string().as_deref(), Some("ns"));
        assert_eq!(r.string().as_deref(), Some("ab"));
        assert_eq!(
            (r.u64(), r.u64(), r.u8()),
            (Some(7), Some(1 << 20), Some(0))
        );
        assert!(r.0.is_empty());

        let input = child_attach_input(7, 3, "", "cd");
        let mut r = Reader(&input);
        assert_eq!(r.u64(), Some(7));
        assert_eq!(
            (r.u8(), r.u8(), r.u32()),
            (Some(2), Some(1), Some(8 + 6 + 4))
        );
        assert_eq!(r.i64(), Some(3));
        assert_eq!(r.string().as_deref(), Some("cd"));
        assert_eq!(r.string().as_deref(), Some(""));
        assert!(r.0.is_empty());
    }
}
