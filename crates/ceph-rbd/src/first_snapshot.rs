//! The first snapshot of an image this client has just made and nobody has open, taken with
//! RADOS calls.
//!
//! librbd takes a snapshot on an open image: the open (an `ImageCtx` with its own copy of the
//! whole configuration, a watch on the header), the exclusive lock and the object map's lock
//! acquired and released, a refresh: about a third of the client CPU of a CSI snapshot, for an
//! image (a snapshot image, cloned a moment earlier) that no one else has ever opened. On such
//! an image, the snapshot is the writes librbd's `SnapshotCreateRequest` makes, in its order:
//!
//! 1. a snapshot ID from the pool (a self-managed snapshot, as librbd allocates);
//! 2. the `rbd` class's `snapshot_add` on the header: name, ID, user namespace (the class
//!    records the size, parent overlap and flags; `ESTALE`: the header has seen a newer ID,
//!    another is taken; `EEXIST`: the name is taken, the ID is released);
//! 3. with object-map: the head's object map copied to the snapshot's
//!    (`rbd_object_map.<id>.<snap id, 16 hex digits>`), read before step 2 as it is unchanged
//!    while nobody writes, then with fast-diff `object_map_snap_add` on the head's map;
//! 4. a header-update notification.
//!
//! A crash between 2 and 3 leaves a snapshot without its object map, as one of librbd would:
//! librbd then reads that snapshot without the map. An image somebody watches (open or mapped
//! somewhere) or with a feature whose snapshot librbd does more for (journaling, a separate data
//! pool, migration, a mirroring non-primary image) is left to librbd: [`Taken::LeftToLibrbd`].

use crate::error::Error;
use crate::features::Features;
use crate::header::{NOSNAP, object_map_name};
use crate::raw::{IoCtx, WriteStep};

/// What [`take`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// The snapshot exists now, with this ID.
    Snapshot(u64),
    /// Nothing: the image is watched or has a feature only librbd handles; take it with librbd.
    LeftToLibrbd,
}

/// Features whose snapshot is the steps above; anything else goes to librbd.
pub(crate) const HANDLED: Features = Features::from_bits(
    Features::LAYERING.bits()
        | Features::STRIPINGV2.bits()
        | Features::EXCLUSIVE_LOCK.bits()
        | Features::OBJECT_MAP.bits()
        | Features::FAST_DIFF.bits()
        | Features::DEEP_FLATTEN.bits()
        // set with the operation features a clone v2 child carries
        | Features::OPERATIONS.bits(),
);

/// How long the header-update notifications wait for a watcher's answer (librbd's default
/// notification timeout).
pub(crate) const NOTIFY_TIMEOUT_MS: u64 = 5000;

/// `snapshot_add`'s input: name, ID, and the user snapshot namespace (a versioned
/// `SnapshotNamespace`: version 1, compatible 1, length 4, namespace type 0 = user).
fn snapshot_add_input(name: &str, snap_id: u64) -> Vec<u8> {
    let mut input = Vec::new();
    crate::denc::put_bytes(&mut input, name.as_bytes());
    input.extend_from_slice(&snap_id.to_le_bytes());
    input.extend_from_slice(&[1, 1]);
    input.extend_from_slice(&4u32.to_le_bytes());
    input.extend_from_slice(&0u32.to_le_bytes());
    input
}

/// Takes snapshot `snap` of the format-2 image whose ID is `id` (`target` names it in errors)
/// with RADOS calls, when nobody watches it; see the module's text.
///
/// # Errors
/// `AlreadyExists` when a snapshot of that name exists, Ceph errors.
pub(crate) fn take(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    snap: &str,
) -> Result<Taken, Error> {
    let header = format!("rbd_header.{id}");
    let features = crate::header::features(io, op, target, id)?;
    if features.bits() & !HANDLED.bits() != 0 {
        return Ok(Taken::LeftToLibrbd);
    }
    // an empty notification is the header update librbd and the kernel client acknowledge:
    // whoever answers has the image open, and librbd's snapshot quiesces and locks for them
    if io.notify_watchers(op, target, &header, NOTIFY_TIMEOUT_MS)? > 0 {
        return Ok(Taken::LeftToLibrbd);
    }
    let head_map = if features.contains(Features::OBJECT_MAP) {
        let name = object_map_name(id, NOSNAP);
        match io.exec(op, target, &name, "rbd", "object_map_load", &[]) {
            Ok(map) => Some(map),
            // a missing or unreadable map is librbd's to rebuild or flag
            Err(e) if e.is_not_found() || matches!(e, Error::InvalidArgument { .. }) => {
                return Ok(Taken::LeftToLibrbd);
            }
            Err(e) => return Err(e),
        }
    } else {
        None
    };
    let snap_id = add_to_header(io, op, target, &header, snap)?;
    if let Some(map) = head_map {
        io.write_op(
            op,
            target,
            &object_map_name(id, snap_id),
            &[WriteStep::rbd("object_map_save", &map)],
        )?;
        if features.contains(Features::FAST_DIFF) {
            io.write_op(
                op,
                target,
                &object_map_name(id, NOSNAP),
                &[WriteStep::rbd("object_map_snap_add", &[])],
            )?;
        }
    }
    // for anyone who opened the image since the check above
    io.notify_watchers(op, target, &header, NOTIFY_TIMEOUT_MS)?;
    Ok(Taken::Snapshot(snap_id))
}

/// Steps 1 and 2: a snapshot ID, recorded on the header under `snap`; the ID is released
/// when the header refuses it.
fn add_to_header(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    header: &str,
    snap: &str,
) -> Result<u64, Error> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let snap_id = io.selfmanaged_snap_create(op, target)?;
        let added = io.write_op(
            op,
            target,
            header,
            &[WriteStep::rbd(
                "snapshot_add",
                &snapshot_add_input(snap, snap_id),
            )],
        );
        match added {
            Ok(()) => return Ok(snap_id),
            Err(e) => {
                if let Err(release) = io.selfmanaged_snap_remove(op, target, snap_id) {
                    tracing::warn!(target, snap_id, error = %release, "releasing an unused snapshot ID failed");
                }
                // ESTALE: the header has a newer snapshot sequence than this ID
                let stale = matches!(e, Error::Other { errno, .. } if errno == libc::ESTALE);
                if !stale || attempts == 3 {
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_add_input_is_name_id_and_user_namespace() {
        assert_eq!(
            snapshot_add_input("s", 0x0102),
            [
                1, 0, 0, 0, b's', // name
                2, 1, 0, 0, 0, 0, 0, 0, // ID
                1, 1, 4, 0, 0, 0, 0, 0, 0, 0, // namespace: v1, compat 1, 4 bytes, user
            ]
        );
    }

    /// Against the test binary's micro-ceph, with data written (so the head's object map has
    /// objects that exist): an image somebody has open is left to librbd; one nobody has open
    /// gets a snapshot whose object map `rbd object-map check` finds valid, fast-diff sees no
    /// change since it, librbd lists it; a second of that name is refused, its ID released.
    #[tokio::test]
    async fn a_watched_image_is_left_to_librbd_and_an_unwatched_one_gets_a_snapshot_librbd_reads() {
        use crate::CreateOptions;
        let c = micro_ceph::cluster();
        let cluster = crate::cluster::test_cluster().await;
        let (pool, image) = (c.pool.clone(), format!("first-snap-{}", std::process::id()));
        let spec = format!("{pool}/{image}");
        let features = Features::LAYERING
            | Features::EXCLUSIVE_LOCK
            | Features::OBJECT_MAP
            | Features::FAST_DIFF
            | Features::DEEP_FLATTEN;
        let options = CreateOptions {
            features: Some(features),
            ..CreateOptions::default()
        };
        cluster
            .create_image(&pool, &image, 16 << 20, &options)
            .await
            .unwrap();
        c.rbd(&[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "64K",
            "--io-total",
            "8M",
            &spec,
        ])
        .unwrap();
        let take_now = |snap: &'static str| {
            let (cluster, pool, image, target) =
                (cluster.clone(), pool.clone(), image.clone(), spec.clone());
            async move {
                cluster
                    .with_pool("snap test", &pool, target.clone(), move |io| {
                        let id = crate::header::image_id(io, "snap test", &target, &image)?;
                        take(io, "snap test", &target, &id, snap)
                    })
                    .await
            }
        };

        let holder = micro_ceph::ImageHolder::open(c, &pool, &image).unwrap();
        assert_eq!(take_now("s1").await.unwrap(), Taken::LeftToLibrbd);
        drop(holder);
        let Taken::Snapshot(snap_id) = take_now("s1").await.unwrap() else {
            panic!("an image nobody watches is left to librbd");
        };
        let listed = cluster.snap_list(&pool, &image).await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|s| (s.id, s.name.as_str(), s.size))
                .collect::<Vec<_>>(),
            [(snap_id, "s1", 16 << 20)]
        );
        // valid maps (check flags an invalid one, so the flags are read after it)
        for at in [format!("{spec}@s1"), spec.clone()] {
            c.rbd(&["object-map", "check", &at]).unwrap();
            let info = c.rbd(&["info", "--format", "json", &at]).unwrap();
            assert!(info.contains("\"flags\":[]"), "{at}: {info}");
        }
        // fast-diff: the head's objects were marked clean at the snapshot
        let diff = c
            .rbd(&[
                "diff",
                "--whole-object",
                "--format",
                "json",
                "--from-snap",
                "s1",
                &spec,
            ])
            .unwrap();
        assert_eq!(diff.trim(), "[]");
        let since_creation = c
            .rbd(&["diff", "--format", "json", &format!("{spec}@s1")])
            .unwrap();
        assert_ne!(
            since_creation.trim(),
            "[]",
            "the data written is in the snapshot"
        );

        let again = take_now("s1").await.unwrap_err();
        assert!(again.is_already_exists(), "{again}");
        assert_eq!(cluster.snap_list(&pool, &image).await.unwrap().len(), 1);
        cluster.snap_remove(&pool, &image, "s1").await.unwrap();
        cluster.remove_image(&pool, &image).await.unwrap();
    }
}
