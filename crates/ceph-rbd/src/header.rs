//! Image metadata and size read and written on the image's header object through the `rbd`
//! object class (`get_id`, `get_size`, `metadata_list`, `metadata_set`: the calls librbd itself
//! makes), without opening the image. Opening an image builds a librbd `ImageCtx`, whose
//! construction copies the whole Ceph configuration (about 2000 options, the bulk of this
//! client's CPU per volume), even when the open then fails; a class call is one OSD round trip.
//! Format-1 images (no `rbd_id.<name>` object, no metadata) fall back to opening.

use std::collections::BTreeMap;

use crate::SnapInfo;
use crate::cluster::{Cluster, check_image_name};
use crate::denc::{Reader, malformed, put_bytes, put_map};
use crate::error::Error;
use crate::raw::{IoCtx, WriteStep};

/// Most keys one `metadata_list` call returns (librbd pages by 64).
const PAGE: u64 = 1024;

/// `map<string, bufferlist>` as `metadata_set` takes it.
pub(crate) fn encode_map(entries: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    put_map(&mut out, entries);
    out
}

/// `metadata_list`'s input: the name to list after and the most to return.
fn encode_list_request(start_after: &str, max: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(&mut out, start_after.as_bytes());
    out.extend_from_slice(&max.to_le_bytes());
    out
}

/// The image ID of format-2 image `name` (`rbd_id.<name>` names it). Not found: no such image,
/// or a format-1 image.
pub(crate) fn image_id(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
) -> Result<String, Error> {
    let out = io.exec(op, target, &format!("rbd_id.{name}"), "rbd", "get_id", &[])?;
    Reader(&out)
        .string()
        .ok_or_else(|| malformed(op, target, "get_id"))
}

/// Ceph's `CEPH_NOSNAP`: the image itself rather than one of its snapshots.
pub(crate) const NOSNAP: u64 = u64::MAX - 1;

/// The object map of the image whose ID is `id` at snapshot `snap_id` ([`NOSNAP`]: its head),
/// named as librbd names it.
pub(crate) fn object_map_name(id: &str, snap_id: u64) -> String {
    if snap_id == NOSNAP {
        format!("rbd_object_map.{id}")
    } else {
        format!("rbd_object_map.{id}.{snap_id:016x}")
    }
}

/// The size in bytes of the image whose ID is `id`, at snapshot `snap_id` ([`NOSNAP`]: its
/// head): `get_size`, which answers the object order (`u8`) and the size (`u64`).
pub(crate) fn size(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    snap_id: u64,
) -> Result<u64, Error> {
    let out = io.exec(
        op,
        target,
        &format!("rbd_header.{id}"),
        "rbd",
        "get_size",
        &snap_id.to_le_bytes(),
    )?;
    let mut answer = Reader(&out);
    answer
        .u8()
        .and_then(|_order| answer.u64())
        .ok_or_else(|| malformed(op, target, "get_size"))
}

/// The parent recorded on a clone's header (`parent_get`'s `ParentImageSpec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderParent {
    pub(crate) pool_id: i64,
    pub(crate) namespace: String,
    pub(crate) image_id: String,
    pub(crate) snap_id: u64,
}

/// The parent of the image whose ID is `id` (`parent_get`: pool ID, namespace, image ID,
/// snapshot ID), `None` for an image without one (or a class too old to say).
pub(crate) fn parent(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
) -> Result<Option<HeaderParent>, Error> {
    let out = match io.exec(
        op,
        target,
        &format!("rbd_header.{id}"),
        "rbd",
        "parent_get",
        &[],
    ) {
        Ok(out) => out,
        Err(Error::Other { errno, .. }) if errno == libc::EOPNOTSUPP => return Ok(None),
        Err(e) => return Err(e),
    };
    decode_parent(&out).ok_or_else(|| malformed(op, target, "parent_get"))
}

/// `parent_get`'s answer: ENCODE_START(1, 1) (version, compatible version, length), then
/// pool ID, namespace, image ID, snapshot ID; pool -1 when there is no parent.
fn decode_parent(out: &[u8]) -> Option<Option<HeaderParent>> {
    let mut r = Reader(out);
    r.u8()?;
    r.u8()?;
    r.u32()?;
    let parent = HeaderParent {
        pool_id: r.i64()?,
        namespace: r.string()?,
        image_id: r.string()?,
        snap_id: r.u64()?,
    };
    Some((parent.pool_id >= 0).then_some(parent))
}

/// The name of the image whose ID is `id`, from the directory of `io`'s namespace; not found
/// for an image in the RBD trash or gone.
pub(crate) fn image_name(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
) -> Result<String, Error> {
    let mut input = Vec::new();
    crate::denc::put_bytes(&mut input, id.as_bytes());
    let out = io.exec(op, target, "rbd_directory", "rbd", "dir_get_name", &input)?;
    Reader(&out)
        .string()
        .ok_or_else(|| malformed(op, target, "dir_get_name"))
}

/// The feature bits of the image whose ID is `id` (`get_features` of its head).
pub(crate) fn features(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
) -> Result<crate::features::Features, Error> {
    let out = io.exec(
        op,
        target,
        &format!("rbd_header.{id}"),
        "rbd",
        "get_features",
        &NOSNAP.to_le_bytes(),
    )?;
    Reader(&out)
        .u64()
        .map(crate::features::Features::from_bits)
        .ok_or_else(|| malformed(op, target, "get_features"))
}

/// The IDs of every snapshot (of every namespace: user, group, trash, mirror) of the image
/// whose ID is `id`, newest first: its snapshot context (`get_snapcontext`), what krbd counts
/// against its limit.
pub(crate) fn snapshot_ids(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
) -> Result<Vec<u64>, Error> {
    let context = io.exec(
        op,
        target,
        &format!("rbd_header.{id}"),
        "rbd",
        "get_snapcontext",
        &[],
    )?;
    let mut context = Reader(&context);
    context
        .u64()
        .and_then(|_seq| context.u32())
        .and_then(|count| {
            (0..count)
                .map(|_| context.u64())
                .collect::<Option<Vec<u64>>>()
        })
        .ok_or_else(|| malformed(op, target, "get_snapcontext"))
}

/// User snapshot `snap` of the image whose ID is `id`, read from its header (`get_snapcontext`,
/// then per snapshot `get_snapshot_name`; for the one named, `get_size`,
/// `get_protection_status` and `get_snapshot_timestamp`); `None` when it has none of that name.
/// What [`crate::raw::Image::snap_list`] reports for it, without the refresh an open image
/// makes after its own snapshot was taken.
pub(crate) fn snapshot(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    snap: &str,
) -> Result<Option<SnapInfo>, Error> {
    let header = format!("rbd_header.{id}");
    let call =
        |method: &'static str, input: &[u8]| io.exec(op, target, &header, "rbd", method, input);
    for snap_id in snapshot_ids(io, op, target, id)? {
        let input = snap_id.to_le_bytes();
        let name = Reader(&call("get_snapshot_name", &input)?)
            .string()
            .ok_or_else(|| malformed(op, target, "get_snapshot_name"))?;
        if name != snap {
            continue;
        }
        let size = size(io, op, target, id, snap_id)?;
        let protection = Reader(&call("get_protection_status", &input)?)
            .u8()
            .ok_or_else(|| malformed(op, target, "get_protection_status"))?;
        let stamp = call("get_snapshot_timestamp", &input)?;
        let mut stamp = Reader(&stamp);
        let (secs, nanos) = stamp
            .u32()
            .zip(stamp.u32())
            .ok_or_else(|| malformed(op, target, "get_snapshot_timestamp"))?;
        return Ok(Some(SnapInfo {
            id: snap_id,
            name,
            size,
            // RBD_PROTECTION_STATUS_PROTECTED
            protected: protection == 2,
            created: std::time::UNIX_EPOCH + std::time::Duration::new(secs.into(), nanos),
        }));
    }
    Ok(None)
}

/// All metadata of the image whose ID is `id`.
pub(crate) fn metadata(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
) -> Result<BTreeMap<String, String>, Error> {
    let header = format!("rbd_header.{id}");
    let mut all = BTreeMap::new();
    let mut after = String::new();
    loop {
        let out = io.exec(
            op,
            target,
            &header,
            "rbd",
            "metadata_list",
            &encode_list_request(&after, PAGE),
        )?;
        let page = Reader(&out)
            .map()
            .ok_or_else(|| malformed(op, target, "metadata_list"))?;
        let full = page.len() as u64 >= PAGE;
        let last = page.keys().next_back().cloned();
        all.extend(page);
        match last {
            Some(last) if full => after = last,
            _ => return Ok(all),
        }
    }
}

/// All metadata of image `name`: from its header without opening it, or, for a format-1 image
/// (no `rbd_id.<name>` object), by opening it. Not found: no such image (or a partial one
/// without a header).
pub(crate) fn metadata_of(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
) -> Result<BTreeMap<String, String>, Error> {
    match image_id(io, op, target, name) {
        Ok(id) => metadata(io, op, target, &id),
        Err(e) if e.is_not_found() => {
            format1(io, op, target, name, e)?;
            io.open(name, true)?.metadata_list()
        }
        Err(e) => Err(e),
    }
}

/// After `get_id` found no `rbd_id.<name>`: `Ok` when `name` is a format-1 image (its header
/// object `<name>.rbd` exists), else `not_found`. Telling the two apart this way costs a read;
/// an open that fails would cost librbd an image context.
fn format1(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
    not_found: Error,
) -> Result<(), Error> {
    match io.read(op, target, &format!("{name}.rbd"), 1) {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Err(not_found),
        Err(e) => Err(e),
    }
}

/// Sets `entries` on the image whose ID is `id`, in one call: all of them or none.
pub(crate) fn set_metadata(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    entries: &[(String, String)],
) -> Result<(), Error> {
    io.exec(
        op,
        target,
        &format!("rbd_header.{id}"),
        "rbd",
        "metadata_set",
        &encode_map(entries),
    )
    .map(drop)
}

/// librbd's omap key on an image header for metadata key `key`.
fn metadata_omap_key(key: &str) -> String {
    format!("metadata_{key}")
}

/// Sets metadata `key` of the image whose ID is `id` to `new` if it holds `expected` now
/// (`None`: not set), in one RADOS operation on the header: an omap comparison guarding the
/// `rbd` class's `metadata_set`. `Ok(false)`: the value was another (`ECANCELED`), nothing
/// written.
pub(crate) fn compare_and_set_metadata(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    id: &str,
    key: &str,
    expected: Option<&str>,
    new: &str,
) -> Result<bool, Error> {
    let omap_key = metadata_omap_key(key);
    let input = encode_map(&[(key.to_owned(), new.to_owned())]);
    let steps = [
        // a missing key compares as empty: "not set" and "set to nothing" are one state here,
        // as they are to every reader of the value
        WriteStep::OmapEquals {
            key: &omap_key,
            value: expected.unwrap_or_default().as_bytes(),
        },
        WriteStep::rbd("metadata_set", &input),
    ];
    match io.write_op(op, target, &format!("rbd_header.{id}"), &steps) {
        Ok(()) => Ok(true),
        Err(Error::Other { errno, .. }) if errno == libc::ECANCELED => Ok(false),
        Err(e) => Err(e),
    }
}

impl Cluster {
    /// Compare-and-swap of one metadata value of a format-2 image, on its header without
    /// opening it: sets `key` to `new` only if it holds `expected` now (`None`: not set; a key
    /// set to the empty string counts as not set). `Ok(true)`: written; `Ok(false)`: the value
    /// is another now (read it again and decide again). Atomic in the OSD, so writers in
    /// several processes (or connections) never lose each other's updates. Takes no in-process
    /// image turn: the OSD orders the writers. Nothing that has the image open is notified (as
    /// [`Cluster::metadata_set_unopened`]); `rbd image-meta get` shows the value.
    ///
    /// Format-1 images (no metadata on the header) by opening: compared and set without
    /// atomicity across processes.
    pub async fn metadata_compare_and_set(
        &self,
        pool: &str,
        name: &str,
        key: &str,
        expected: Option<&str>,
        new: &str,
    ) -> Result<bool, Error> {
        let op = "set image metadata";
        check_image_name(op, pool, name)?;
        let (name, key, new) = (name.to_string(), key.to_string(), new.to_string());
        let expected = expected.map(str::to_string);
        let target = format!("{pool}/{name}");
        self.with_pool(op, pool, target.clone(), move |io| {
            match image_id(io, op, &target, &name) {
                Ok(id) => {
                    compare_and_set_metadata(io, op, &target, &id, &key, expected.as_deref(), &new)
                }
                Err(e) if e.is_not_found() => {
                    format1(io, op, &target, &name, e)?;
                    let img = io.open(&name, false)?;
                    let now = img.metadata_get(&key)?.filter(|v| !v.is_empty());
                    if now.as_deref() != expected.as_deref().filter(|v| !v.is_empty()) {
                        return Ok(false);
                    }
                    img.metadata_set(&key, &new).map(|()| true)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Sets several metadata keys of a format-2 image in one object-class call on its header,
    /// without opening the image: all keys or none. Much cheaper than
    /// [`Cluster::metadata_set_many`] (no librbd `ImageCtx`); nothing that has the image open
    /// is notified, so use it on images nobody maps yet (a fresh create). Format-1 images: by
    /// opening, key by key, as librbd allows.
    pub async fn metadata_set_unopened(
        &self,
        pool: &str,
        name: &str,
        entries: Vec<(String, String)>,
    ) -> Result<(), Error> {
        let op = "set image metadata";
        check_image_name(op, pool, name)?;
        let guard = self.claim_image(op, pool, name).await?;
        let name = name.to_string();
        let target = format!("{pool}/{name}");
        self.with_pool(op, pool, target.clone(), move |io| {
            let _guard = guard;
            match image_id(io, op, &target, &name) {
                Ok(id) => set_metadata(io, op, &target, &id, &entries),
                Err(e) if e.is_not_found() => {
                    format1(io, op, &target, &name, e)?;
                    let img = io.open(&name, false)?;
                    entries
                        .iter()
                        .try_for_each(|(key, value)| img.metadata_set(key, value))
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// One metadata value of an image, `None` when the key is not set: read from its header
    /// without opening it (format-1 images: by opening).
    pub async fn metadata_get(
        &self,
        pool: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<String>, Error> {
        let op = "get image metadata";
        check_image_name(op, pool, name)?;
        let (name, key) = (name.to_string(), key.to_string());
        let target = format!("{pool}/{name}");
        self.with_pool(op, pool, target.clone(), move |io| {
            match image_id(io, op, &target, &name) {
                // the whole list (one call, a few keys): unlike `metadata_get`, it tells a
                // missing key from a header that is gone
                Ok(id) => Ok(metadata(io, op, &target, &id)?.remove(&key)),
                Err(e) if e.is_not_found() => {
                    format1(io, op, &target, &name, e)?;
                    io.open(&name, true)?.metadata_get(&key)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// All metadata of an image, read from its header without opening it (format-1 images:
    /// by opening, as [`Cluster::metadata_list`]).
    pub async fn metadata_list_unopened(
        &self,
        pool: &str,
        name: &str,
    ) -> Result<BTreeMap<String, String>, Error> {
        let op = "list image metadata";
        check_image_name(op, pool, name)?;
        let name = name.to_string();
        let target = format!("{pool}/{name}");
        self.with_pool(op, pool, target.clone(), move |io| {
            metadata_of(io, op, &target, &name)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_maps_are_named_as_librbd_names_them() {
        assert_eq!(object_map_name("abc", NOSNAP), "rbd_object_map.abc");
        assert_eq!(
            object_map_name("abc", 0x1f),
            "rbd_object_map.abc.000000000000001f"
        );
    }

    #[test]
    fn metadata_lives_under_librbds_omap_key() {
        assert_eq!(
            metadata_omap_key("provisioner.ceph.com/published-nodes"),
            "metadata_provisioner.ceph.com/published-nodes"
        );
    }

    #[test]
    fn list_requests_carry_the_start_and_the_page_size() {
        let bytes = encode_list_request("ab", 7);
        assert_eq!(bytes, [2, 0, 0, 0, b'a', b'b', 7, 0, 0, 0, 0, 0, 0, 0]);
    }
}
