//! Space an image takes in RADOS: how much of it is allocated (what `rbd du` reports for the
//! image's head) and giving zeroed extents back (`rbd sparsify`).
//!
//! **Sparse size.** librbd sparsifies in units of `sparse_size` bytes: a power of two, at least
//! 4096, at most the image's object size (anything else is `EINVAL`). [`SPARSE_SIZE`] (4 KiB,
//! the `rbd` CLI's default) is valid for every object size librbd allows (order 12 and up), and
//! finds every zeroed filesystem block; [`sparse_size`] checks it against an object size.
//!
//! **Used size.** [`Cluster::used_bytes`]: whole objects, as `rbd du` counts them: an object that
//! exists counts in full, also with holes in it. With fast-diff enabled and its map valid,
//! librbd answers from the object map; otherwise it asks the OSDs object by object.
//! [`Cluster::used_bytes_exact`]: the allocated extents, as `rbd du --exact` counts them (the
//! OSDs asked object by object): what a discard that truncates or zeroes part of an object
//! gives back shows there, not in the whole-object count.

use crate::{Cluster, Error};

/// The sparse size [`Cluster::sparsify`] uses: 4 KiB, the smallest librbd accepts.
pub const SPARSE_SIZE: u64 = 4096;

/// The sparse size for an image of `object_size`-byte objects: [`SPARSE_SIZE`], or `None` when
/// librbd would refuse it (an object size below 4 KiB or not a power of two, which librbd
/// never creates).
#[must_use]
pub fn sparse_size(object_size: u64) -> Option<u64> {
    (object_size >= SPARSE_SIZE && object_size.is_power_of_two()).then_some(SPARSE_SIZE)
}

impl Cluster {
    /// Deallocates `pool/name`'s zeroed extents (librbd's sparsify, at [`SPARSE_SIZE`]): every
    /// 4 KiB that reads as zeros becomes a hole, an object of zeros is removed. The data the
    /// image reads back is unchanged. librbd takes the image's exclusive lock for it, so a
    /// client writing the image meanwhile hands it over and waits.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a missing image, [`Error::InvalidArgument`] for an object size
    /// librbd cannot sparsify, timeouts (a large image can take longer than the operation
    /// timeout: librbd then finishes it in the background).
    pub async fn sparsify(&self, pool: &str, name: &str) -> Result<(), Error> {
        let target = format!("{pool}/{name}");
        self.with_image("sparsify image", pool, name, false, move |img| {
            let object_size = img.info()?.object_size;
            let size = sparse_size(object_size).ok_or_else(|| {
                Error::invalid(
                    "sparsify image",
                    target,
                    format!("object size {object_size} cannot be sparsified"),
                )
            })?;
            img.sparsify(size)
        })
        .await
    }

    /// The bytes `pool/name`'s head has allocated in RADOS, as `rbd du` reports them (snapshots
    /// not counted).
    ///
    /// # Errors
    /// [`Error::NotFound`] for a missing image; timeouts.
    pub async fn used_bytes(&self, pool: &str, name: &str) -> Result<u64, Error> {
        self.with_image("read used size", pool, name, true, |img| {
            let size = img.info()?.size;
            img.used_bytes(size, true)
        })
        .await
    }

    /// The bytes `pool/name`'s head has allocated in RADOS, as `rbd du --exact` reports them:
    /// the allocated extents of its objects, so an object a discard truncated or zeroed counts
    /// for what is left of it. Asks the OSDs object by object: slower than [`Self::used_bytes`]
    /// on a large image.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a missing image; timeouts.
    pub async fn used_bytes_exact(&self, pool: &str, name: &str) -> Result<u64, Error> {
        self.with_image("read exact used size", pool, name, true, |img| {
            let size = img.info()?.size;
            img.used_bytes(size, false)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_size_fits_every_object_size_librbd_makes() {
        assert_eq!(sparse_size(4096), Some(4096));
        assert_eq!(sparse_size(4 << 20), Some(4096));
        assert_eq!(sparse_size(32 << 20), Some(4096));
        assert_eq!(sparse_size(2048), None);
        assert_eq!(sparse_size(3 << 20), None);
        assert_eq!(sparse_size(0), None);
    }
}
