//! Checks that find what an operation cut short between two of its RADOS writes left (a crash,
//! a timeout, an undo that failed), for the callers that find such an image again on a retry:
//! a clone that its parent snapshot does not count as a child, and an image with the
//! object-map feature but no object map. librbd's own operations write in the same orders
//! (`image::CloneRequest`, `image::CreateRequest`), so images it made are checked the same way.

use crate::cluster::check_image_name;
use crate::denc::Reader;
use crate::features::Features;
use crate::header::{self, NOSNAP, object_map_name};
use crate::raw::WriteStep;
use crate::{Cluster, Error};

/// How a clone stands with its parent snapshot, after [`Cluster::ensure_child_listed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildLink {
    /// The image has no parent: not a clone, a flattened one, or a clone cut before its
    /// parent was recorded on its header.
    NoParent,
    /// The parent snapshot counts it as a child.
    Listed,
    /// The parent snapshot did not count it (a clone cut between `parent_attach` and
    /// `child_attach`); now it does.
    Relisted,
    /// The parent snapshot does not count it and cannot be made to: it is deleted (in the
    /// snapshot trash), and the class refuses new children of a deleted snapshot. Whoever
    /// removes its last counted child purges it: the clone must be flattened to keep its data.
    Unlisted,
}

/// Whether `children_list`'s answer (a set of versioned `ChildImageSpec`s: pool ID, image ID,
/// namespace) names the image `id` in pool `pool_id`, namespace `namespace`.
fn lists_child(answer: &[u8], pool_id: i64, namespace: &str, id: &str) -> Option<bool> {
    let mut r = Reader(answer);
    let count = r.u32()?;
    for _ in 0..count {
        r.u8()?;
        r.u8()?;
        let len = usize::try_from(r.u32()?).ok()?;
        let mut spec = Reader(r.raw(len)?);
        let (child_pool, child_id) = (spec.i64()?, spec.string()?);
        // version 1 has no namespace: the default one
        let child_namespace = spec.string().unwrap_or_default();
        if child_pool == pool_id && child_id == id && child_namespace == namespace {
            return Some(true);
        }
    }
    Some(false)
}

/// librbd's `RBD_FLAG_OBJECT_MAP_INVALID`.
const OBJECT_MAP_INVALID: u64 = 1;

impl Cluster {
    /// Makes sure the parent snapshot recorded on the clone `pool/name`'s header counts it as a
    /// child, as the last step of librbd's clone v2 does: `child_attach` on the parent's
    /// header, which answers "exists" when it does already. Without that entry the parent's
    /// snapshot could be removed for good while the clone still reads through it.
    ///
    /// # Errors
    /// Not found (no such format-2 image), Ceph errors.
    pub async fn ensure_child_listed(&self, pool: &str, name: &str) -> Result<ChildLink, Error> {
        let op = "check clone";
        check_image_name(op, pool, name)?;
        let (pool, name) = (pool.to_string(), name.to_string());
        let target = format!("{pool}/{name}");
        self.run(op, target.clone(), move |rados| {
            let io = rados.ioctx(&pool)?;
            let id = header::image_id(&io, op, &target, &name)?;
            let Some(parent) = header::parent(&io, op, &target, &id)? else {
                return Ok(ChildLink::NoParent);
            };
            let parent_pool = crate::namespace::pool_spec(
                &rados.pool_name(parent.pool_id)?,
                &parent.namespace,
            );
            let parent_io = rados.ioctx(&parent_pool)?;
            let child = crate::plain_clone::child_attach_input(
                parent.snap_id,
                io.pool_id(),
                io.namespace(),
                &id,
            );
            match parent_io.write_op(
                op,
                &target,
                &format!("rbd_header.{}", parent.image_id),
                &[WriteStep::rbd("child_attach", &child)],
            ) {
                Ok(()) => {
                    tracing::warn!(
                        image = %target,
                        parent = %format!("{parent_pool}/{}", parent.image_id),
                        snap_id = parent.snap_id,
                        "the clone was not counted as a child of its parent snapshot (a clone cut short); it is now"
                    );
                    Ok(ChildLink::Relisted)
                }
                Err(e) if e.is_already_exists() => Ok(ChildLink::Listed),
                // a deleted (trashed) snapshot takes no new child: is this one counted?
                Err(e) if e.is_not_found() => {
                    let answer = parent_io.exec(
                        op,
                        &target,
                        &format!("rbd_header.{}", parent.image_id),
                        "rbd",
                        "children_list",
                        &parent.snap_id.to_le_bytes(),
                    )?;
                    match lists_child(&answer, io.pool_id(), io.namespace(), &id) {
                        Some(true) => Ok(ChildLink::Listed),
                        Some(false) => Ok(ChildLink::Unlisted),
                        None => Err(crate::denc::malformed(op, &target, "children_list")),
                    }
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Rebuilds the object map of `pool/name` from the objects that exist when the image has
    /// the object-map feature and its head's object map object is missing (a create cut
    /// between the header and the object map) or flagged invalid (librbd opened it so since:
    /// it makes an empty map and flags it). Left so, librbd and krbd read and write it without
    /// the map, and fast-diff, `rbd du` and snapshot diffs are wrong. `Ok(true)` when it was
    /// rebuilt. A format-1 image has none to check.
    ///
    /// # Errors
    /// Ceph errors.
    pub async fn repair_missing_object_map(&self, pool: &str, name: &str) -> Result<bool, Error> {
        let op = "check object map";
        check_image_name(op, pool, name)?;
        let guard = self.claim_image(op, pool, name).await?;
        let name = name.to_string();
        let target = format!("{pool}/{name}");
        self.with_pool(op, pool, target.clone(), move |io| {
            let _guard = guard;
            let id = match header::image_id(io, op, &target, &name) {
                Ok(id) => id,
                Err(e) if e.is_not_found() => return Ok(false),
                Err(e) => return Err(e),
            };
            if !header::features(io, op, &target, &id)?.contains(Features::OBJECT_MAP) {
                return Ok(false);
            }
            let why = match io.read(op, &target, &object_map_name(&id, NOSNAP), 1) {
                Ok(_) => {
                    let flags = io.exec(
                        op,
                        &target,
                        &format!("rbd_header.{id}"),
                        "rbd",
                        "get_flags",
                        &NOSNAP.to_le_bytes(),
                    )?;
                    let flags = Reader(&flags)
                        .u64()
                        .ok_or_else(|| crate::denc::malformed(op, &target, "get_flags"))?;
                    if flags & OBJECT_MAP_INVALID == 0 {
                        return Ok(false);
                    }
                    // librbd opened it without its map (and flagged the one it made invalid)
                    "its object map is flagged invalid"
                }
                Err(e) if e.is_not_found() => "it has no object map",
                Err(e) => return Err(e),
            };
            tracing::warn!(
                image = %target,
                why,
                "an image found after a create was cut short between its header and its object map; rebuilding the map from its objects"
            );
            io.open(&name, false)?.rebuild_object_map()?;
            Ok(true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::lists_child;

    fn spec(version: u8, pool: i64, id: &str, namespace: Option<&str>) -> Vec<u8> {
        let mut body = pool.to_le_bytes().to_vec();
        crate::denc::put_bytes(&mut body, id.as_bytes());
        if let Some(namespace) = namespace {
            crate::denc::put_bytes(&mut body, namespace.as_bytes());
        }
        let mut out = vec![version, 1];
        out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn children_lists_are_read_as_the_class_encodes_them() {
        let mut answer = 2u32.to_le_bytes().to_vec();
        answer.extend(spec(2, 3, "abc", Some("ns")));
        answer.extend(spec(1, 4, "def", None));
        assert_eq!(lists_child(&answer, 3, "ns", "abc"), Some(true));
        assert_eq!(lists_child(&answer, 4, "", "def"), Some(true));
        assert_eq!(lists_child(&answer, 3, "", "abc"), Some(false));
        assert_eq!(lists_child(&answer, 4, "", "abc"), Some(false));
        assert_eq!(lists_child(&answer[..answer.len() - 1], 9, "", "x"), None);
        assert_eq!(lists_child(&0u32.to_le_bytes(), 3, "", "abc"), Some(false));
    }
}
