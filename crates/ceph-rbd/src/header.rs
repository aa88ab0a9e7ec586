//! Image metadata read and written on the image's header object through the `rbd` object class
//! (`get_id`, `metadata_list`, `metadata_set`: the calls librbd itself makes), without opening
//! the image. Opening an image builds a librbd `ImageCtx`, whose construction copies the whole
//! Ceph configuration (about 2000 options, the bulk of this client's CPU per volume); a class
//! call is one OSD round trip. Format-1 images (no `rbd_id.<name>` object, no metadata) fall
//! back to opening.

use std::collections::BTreeMap;

use crate::cluster::{Cluster, check_image_name};
use crate::denc::{Reader, malformed, put_bytes, put_map};
use crate::error::Error;
use crate::raw::IoCtx;

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
        Err(e) if e.is_not_found() => io.open(name, true)?.metadata_list(),
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

impl Cluster {
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
                // gone, or format 1: librbd says which
                Err(e) if e.is_not_found() => {
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
    fn list_requests_carry_the_start_and_the_page_size() {
        let bytes = encode_list_request("ab", 7);
        assert_eq!(bytes, [2, 0, 0, 0, b'a', b'b', 7, 0, 0, 0, 0, 0, 0, 0]);
    }
}
