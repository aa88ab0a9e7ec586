//! Removing a plain format-2 image with RADOS calls, without librbd.
//!
//! `rbd_remove` opens the image first: it builds an `ImageCtx`, whose construction copies the
//! whole Ceph configuration, and with it costs 13-35 ms of CPU per image on this project's
//! test machine (BENCHMARKS.md), most of a volume's whole cost. For an image with nothing
//! attached to it (no snapshots, no parent, no group, no mirroring, no journal, no separate
//! data pool, no striping, nobody watching) removal is a fixed sequence of object operations,
//! the one librbd's `image::RemoveRequest` performs after its checks:
//!
//! 0. with exclusive-lock, take librbd's exclusive lock on the header (as librbd's remove
//!    does), then check that nobody else watches it;
//! 1. remove the data objects (those the object map marks, or every object of the image);
//!    with the lock, check again that nobody watches (a client that opened the image
//!    meanwhile waits for the lock: the removal is then left to librbd, which refuses it);
//! 2. remove the header `rbd_header.<id>`, then the object map `rbd_object_map.<id>`;
//! 3. remove the ID object `rbd_id.<name>` and the `rbd_directory` entry.
//!
//! Anything else, or anything unexpected in the header, is left to librbd ([`Plain::No`]); so is
//! every removal while `rbd_move_to_trash_on_remove` is set (librbd then moves the image to the
//! RBD trash instead of removing it).
//! The checks read the header through the `rbd` object class, as librbd does. A watcher is
//! found with an empty notification on the header, which librbd and the kernel client both
//! acknowledge (a header update): the C API of librados has no watcher listing.
//!
//! Interrupted at any step, a retry finishes the job: before step 2 the image is whole (with
//! fewer data objects); after it, the header is gone and librbd's remove cleans up what is left
//! (as for a create killed midway).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::denc::{Reader, malformed, put_bytes};
use crate::error::Error;
use crate::first_snapshot::ExclusiveLock;
use crate::header::{NOSNAP, object_map_name};
use crate::raw::IoCtx;

static REMOVED_PLAIN: AtomicU64 = AtomicU64::new(0);

/// How many images this process removed without librbd (see the `remove` module): the rest of
/// its removals went through librbd's `rbd_remove`.
pub fn removed_without_librbd() -> u64 {
    REMOVED_PLAIN.load(Ordering::Relaxed)
}

/// Feature bits this module removes images with: layering (without a parent), exclusive-lock,
/// object-map, fast-diff, deep-flatten. Every other bit (striping v2, journaling, data pool,
/// operations such as clone or group membership, migrating, non-primary, dirty cache, and
/// any bit a later Ceph adds) leaves the image to librbd.
const PLAIN_FEATURES: u64 = 1 | 4 | 8 | 16 | 32;
const EXCLUSIVE_LOCK: u64 = 4;
const OBJECT_MAP: u64 = 8;
/// `RBD_FLAG_OBJECT_MAP_INVALID`: the object map can't be trusted; every object may exist.
const FLAG_OBJECT_MAP_INVALID: u64 = 1;
/// Removals in flight at once: librbd's `rbd_concurrent_management_ops` default.
const WINDOW: usize = 10;
/// How long a watcher has to answer the probe. Only a client that died with the image open
/// (its watch not yet expired) takes this long; the image is then left to librbd, which
/// names it.
const PROBE_TIMEOUT_MS: u64 = 2000;

/// What [`remove_plain`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plain {
    /// Removed, with this many data objects.
    Removed { objects: u64 },
    /// Not a plain image, or watched: nothing was changed; librbd has to remove it.
    No(&'static str),
}

/// Which of an image's `count` objects its object map (`object_map_load`'s answer, a
/// `BitVector<2>`: a versioned header holding the element count, then 2 bits per object, the
/// first object in the high bits of the first byte) says may exist. `None` when the answer is
/// malformed or its size is not `count`.
fn objects_in_map(answer: &[u8], count: u64) -> Option<Vec<u64>> {
    let mut r = Reader(answer);
    let header_len = usize::try_from(r.u32()?).ok()?;
    let mut header = Reader(r.raw(header_len)?);
    let (_version, _compat) = (header.u8()?, header.u8()?);
    let _struct_len = header.u32()?;
    let size = header.u64()?;
    if size != count {
        return None;
    }
    let data = r.raw(usize::try_from(size.div_ceil(4)).ok()?)?;
    let mut may_exist = Vec::new();
    for (byte_index, byte) in data.iter().enumerate() {
        if *byte == 0 {
            continue;
        }
        for slot in 0..4u64 {
            let object = byte_index as u64 * 4 + slot;
            let state = (byte >> (6 - 2 * slot)) & 0b11;
            if state != 0 && object < count {
                may_exist.push(object);
            }
        }
    }
    Some(may_exist)
}

/// The option that makes librbd's remove move an image to the RBD trash instead.
const TRASH_ON_REMOVE: &str = "rbd_move_to_trash_on_remove";

/// A Ceph boolean option's value as Ceph reads it.
fn ceph_bool(value: &str) -> bool {
    let value = value.trim();
    ["true", "yes", "on"]
        .iter()
        .any(|t| value.eq_ignore_ascii_case(t))
        || value.parse::<i64>().is_ok_and(|n| n != 0)
}

/// Whether librbd's remove moves images of this pool to the RBD trash
/// (`rbd_move_to_trash_on_remove`): the pool's override (`rbd config pool set`, kept in the
/// default namespace's `rbd_info` as librbd reads it) when there is one, else the client's
/// configuration (which includes the monitors' `ceph config set client ...`).
pub(crate) fn trash_on_remove(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
) -> Result<bool, Error> {
    let pool = io.default_namespace()?;
    let key = format!("conf_{TRASH_ON_REMOVE}");
    let mut request = Vec::new();
    put_bytes(&mut request, key.as_bytes());
    match pool.exec(op, target, "rbd_info", "rbd", "metadata_get", &request) {
        Ok(value) => {
            let value = Reader(&value)
                .string()
                .ok_or_else(|| malformed(op, target, "metadata_get"))?;
            return Ok(ceph_bool(&value));
        }
        // no override (or no rbd_info at all)
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    Ok(ceph_bool(&io.conf_get(op, TRASH_ON_REMOVE)?))
}

/// Removes format-2 image `name` (ID `id`) without librbd if it is plain and nobody watches
/// it; otherwise changes nothing and says why. Errors are those of the RADOS calls.
///
/// With `rbd_move_to_trash_on_remove` set for the pool or the client, nothing is removed here:
/// librbd's remove moves the image to the RBD trash with the configured expiry, for plain
/// images as for any other.
pub(crate) fn remove_plain(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
    id: &str,
) -> Result<Plain, Error> {
    if crate::librbd_only::librbd_only() {
        return Ok(Plain::No(crate::librbd_only::WHY));
    }
    if let Some(why) = io.compat().refuses(crate::compat::FastPath::Remove) {
        return Ok(Plain::No(why));
    }
    if trash_on_remove(io, op, target)? {
        return Ok(Plain::No("rbd_move_to_trash_on_remove is set"));
    }
    let header = format!("rbd_header.{id}");
    let call =
        |oid: &str, method: &str, input: &[u8]| io.exec(op, target, oid, "rbd", method, input);

    let features = match call(&header, "get_features", &NOSNAP.to_le_bytes()) {
        Ok(out) => Reader(&out)
            .u64()
            .ok_or_else(|| malformed(op, target, "get_features"))?,
        // a partial image: librbd's remove cleans it up
        Err(e) if e.is_not_found() => return Ok(Plain::No("it has no header")),
        Err(e) => return Err(e),
    };
    if features & !PLAIN_FEATURES != 0 {
        return Ok(Plain::No("it has features beyond the plain ones"));
    }
    let snapc = call(&header, "get_snapcontext", &[])?;
    let mut r = Reader(&snapc);
    let snaps = r
        .u64()
        .and_then(|_seq| r.u32())
        .ok_or_else(|| malformed(op, target, "get_snapcontext"))?;
    if snaps != 0 {
        return Ok(Plain::No("it has snapshots"));
    }
    // (a parent this older call cannot describe, e.g. in a RADOS namespace, is an error here:
    // librbd then removes the clone)
    let parent_pool = match call(&header, "get_parent", &NOSNAP.to_le_bytes()) {
        Ok(parent) => Reader(&parent)
            .i64()
            .ok_or_else(|| malformed(op, target, "get_parent"))?,
        Err(Error::Other { .. } | Error::InvalidArgument { .. }) => {
            return Ok(Plain::No("its parent could not be read"));
        }
        Err(e) => return Err(e),
    };
    if parent_pool != -1 {
        return Ok(Plain::No("it is a clone"));
    }
    let mut id_arg = Vec::new();
    put_bytes(&mut id_arg, id.as_bytes());
    match call("rbd_mirroring", "mirror_image_get", &id_arg) {
        Ok(_) => return Ok(Plain::No("it is mirrored")),
        Err(e) if e.is_not_found() => {}
        Err(Error::Other { errno, .. }) if errno == libc::EOPNOTSUPP => {}
        Err(e) => return Err(e),
    }
    let prefix = call(&header, "get_object_prefix", &[])?;
    let prefix = Reader(&prefix)
        .string()
        .ok_or_else(|| malformed(op, target, "get_object_prefix"))?;
    if prefix != format!("rbd_data.{id}") {
        return Ok(Plain::No("its data objects have an unexpected name"));
    }
    let size = call(&header, "get_size", &NOSNAP.to_le_bytes())?;
    let mut r = Reader(&size);
    let (order, size) = r
        .u8()
        .zip(r.u64())
        .ok_or_else(|| malformed(op, target, "get_size"))?;
    if !(12..=25).contains(&order) {
        return Ok(Plain::No("its object size is out of range"));
    }
    // With exclusive-lock, the removal holds librbd's exclusive lock from the probe on, as
    // librbd's RemoveRequest does: a client that opens the image after the probe finds the
    // lock owned and waits, instead of writing objects the removal would never see (a leak
    // nothing lists); it is found by a second probe before the header goes. Without the
    // feature, librbd's remove has nothing to hold either: the probe alone.
    let mut lock = if features & EXCLUSIVE_LOCK != 0 {
        let Some(lock) = ExclusiveLock::take(io, op, target, &header)? else {
            return Ok(Plain::No("its exclusive lock is held"));
        };
        if lock.others_watch()? {
            lock.release()?;
            return Ok(Plain::No("it is watched"));
        }
        Some(lock)
    } else {
        if io.notify_watchers(op, target, &header, PROBE_TIMEOUT_MS)? != 0 {
            return Ok(Plain::No("it is watched"));
        }
        None
    };
    crate::steps::hit(crate::steps::REMOVE_PROBED, target);

    let count = size.div_ceil(1u64 << order);
    let mapped = if features & OBJECT_MAP != 0 {
        let flags = call(&header, "get_flags", &NOSNAP.to_le_bytes())?;
        let flags = Reader(&flags)
            .u64()
            .ok_or_else(|| malformed(op, target, "get_flags"))?;
        if flags & FLAG_OBJECT_MAP_INVALID != 0 {
            None
        } else {
            match call(&object_map_name(id, NOSNAP), "object_map_load", &[]) {
                Ok(map) => objects_in_map(&map, count),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            }
        }
    } else {
        None
    };
    let data = |n: u64| format!("{prefix}.{n:016x}");
    let objects = match mapped {
        Some(list) => io.remove_objects(op, target, list.into_iter().map(data), WINDOW)?,
        None => io.remove_objects(op, target, (0..count).map(data), WINDOW)?,
    };

    crate::steps::hit(crate::steps::REMOVE_AFTER_DATA, target);
    // A client that opened the image meanwhile waits for the lock: the header stays (its lock
    // request would create a bare one again), the removal goes to librbd, which refuses it
    // while the client watches (naming it); the image is whole, with fewer data objects.
    if let Some(held) = &lock
        && held.others_watch()?
    {
        if let Some(held) = lock.take() {
            held.release()?;
        }
        return Ok(Plain::No("a client opened it while it was being removed"));
    }
    io.remove_object(op, target, &header)?;
    // the lock was on the header: gone with it
    if let Some(lock) = lock {
        lock.forget();
    }
    crate::steps::hit(crate::steps::REMOVE_AFTER_HEADER, target);
    io.remove_object(op, target, &object_map_name(id, NOSNAP))?;
    io.remove_object(op, target, &format!("rbd_id.{name}"))?;
    let mut entry = Vec::new();
    put_bytes(&mut entry, name.as_bytes());
    put_bytes(&mut entry, id.as_bytes());
    match call("rbd_directory", "dir_remove_image", &entry) {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    REMOVED_PLAIN.fetch_add(1, Ordering::Relaxed);
    Ok(Plain::Removed { objects })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_values_read_as_ceph_reads_booleans() {
        for on in ["true", "TRUE", "yes", "on", "1", " true\n"] {
            assert!(ceph_bool(on), "{on:?}");
        }
        for off in ["false", "no", "off", "0", ""] {
            assert!(!ceph_bool(off), "{off:?}");
        }
    }

    /// `object_map_load`'s answer for a 16-object image with objects 0, 5 and 15 written, as
    /// Ceph 16.2 returned it (bytes captured from micro-ceph).
    const MAP_0_5_15: &str = "0e00000001010800000010000000000000004010000100000000";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn the_object_map_names_the_objects_that_may_exist() {
        assert_eq!(objects_in_map(&hex(MAP_0_5_15), 16), Some(vec![0, 5, 15]));
    }

    #[test]
    fn an_object_map_of_another_size_or_cut_short_is_not_trusted() {
        let map = hex(MAP_0_5_15);
        assert_eq!(objects_in_map(&map, 17), None);
        for cut in 0..22 {
            assert_eq!(objects_in_map(&map[..cut], 16), None, "cut at {cut}");
        }
    }

    #[test]
    fn every_state_but_nonexistent_may_exist() {
        // 4 objects: nonexistent, exists, pending, exists-clean
        let mut map = 14u32.to_le_bytes().to_vec();
        map.extend_from_slice(&[1, 1]);
        map.extend_from_slice(&8u32.to_le_bytes());
        map.extend_from_slice(&4u64.to_le_bytes());
        map.push(0b00_01_10_11);
        assert_eq!(objects_in_map(&map, 4), Some(vec![1, 2, 3]));
    }
}
