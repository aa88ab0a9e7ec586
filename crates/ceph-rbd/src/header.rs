//! Image metadata read and written on the image's header object through the `rbd` object class
//! (`get_id`, `metadata_list`, `metadata_set`: the calls librbd itself makes), without opening
//! the image. Opening an image builds a librbd `ImageCtx`, whose construction copies the whole
//! Ceph configuration (about 2000 options, the bulk of this client's CPU per volume); a class
//! call is one OSD round trip. Format-1 images (no `rbd_id.<name>` object, no metadata) fall
//! back to opening.
//!
//! Encodings (Ceph's `denc`, little-endian): a string or bufferlist is a `u32` length and its
//! bytes; a map is a `u32` count and its keys and values in order.

use std::collections::BTreeMap;

use crate::cluster::{Cluster, check_image_name};
use crate::error::Error;
use crate::raw::IoCtx;

/// Most keys one `metadata_list` call returns (librbd pages by 64).
const PAGE: u64 = 1024;

fn encode_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// `map<string, bufferlist>` as `metadata_set` takes it.
fn encode_map(entries: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    let count = u32::try_from(entries.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for (key, value) in entries {
        encode_bytes(&mut out, key.as_bytes());
        encode_bytes(&mut out, value.as_bytes());
    }
    out
}

/// `metadata_list`'s input: the name to list after and the most to return.
fn encode_list_request(start_after: &str, max: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_bytes(&mut out, start_after.as_bytes());
    out.extend_from_slice(&max.to_le_bytes());
    out
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_le_bytes(*head))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u32()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(head)
    }
}

fn decode_string(buf: &[u8]) -> Option<String> {
    let mut r = Reader(buf);
    r.bytes().map(|b| String::from_utf8_lossy(b).into_owned())
}

fn decode_map(buf: &[u8]) -> Option<BTreeMap<String, String>> {
    let mut r = Reader(buf);
    let count = r.u32()?;
    let mut out = BTreeMap::new();
    for _ in 0..count {
        let key = String::from_utf8_lossy(r.bytes()?).into_owned();
        let value = String::from_utf8_lossy(r.bytes()?).into_owned();
        out.insert(key, value);
    }
    Some(out)
}

fn malformed(op: &'static str, target: &str, what: &str) -> Error {
    Error::invalid(
        op,
        target,
        format!("malformed {what} answer from the rbd object class"),
    )
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
    decode_string(&out).ok_or_else(|| malformed(op, target, "get_id"))
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
        let page = decode_map(&out).ok_or_else(|| malformed(op, target, "metadata_list"))?;
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
        let guard = self.claim_image(op, pool, name)?;
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
    fn maps_round_trip_in_cephs_encoding() {
        let entries = vec![
            ("provisioner.ceph.com/pv".to_string(), "pvc-1".to_string()),
            ("empty".to_string(), String::new()),
        ];
        let bytes = encode_map(&entries);
        assert_eq!(&bytes[..4], &2u32.to_le_bytes());
        assert_eq!(&bytes[4..8], &23u32.to_le_bytes());
        let back = decode_map(&bytes).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back["provisioner.ceph.com/pv"], "pvc-1");
        assert_eq!(back["empty"], "");
    }

    #[test]
    fn truncated_answers_are_refused_not_misread() {
        let bytes = encode_map(&[("k".to_string(), "value".to_string())]);
        for cut in 0..bytes.len() {
            assert!(decode_map(&bytes[..cut]).is_none(), "cut at {cut}");
        }
        assert_eq!(
            decode_string(&[3, 0, 0, 0, b'a', b'b', b'c']).as_deref(),
            Some("abc")
        );
        assert!(decode_string(&[4, 0, 0, 0, b'a']).is_none());
    }

    #[test]
    fn list_requests_carry_the_start_and_the_page_size() {
        let bytes = encode_list_request("ab", 7);
        assert_eq!(bytes, [2, 0, 0, 0, b'a', b'b', 7, 0, 0, 0, 0, 0, 0, 0]);
    }
}
