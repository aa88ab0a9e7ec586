//! An advisory RADOS lock (object class `lock`) of our own on a format-2 image's header object
//! `rbd_header.<id>`, and image metadata written only while it is held.
//!
//! The lock is not librbd's exclusive lock (`rbd_lock`): a different name, so krbd, rbd-nbd,
//! rbd-fuse and librbd clients neither see nor wait for it. It serialises a short decision made
//! by several clients (the CSI node's "may this node map the image read-write?") that each read
//! the image's state, decide and record the outcome: whoever holds the lock decides alone, and
//! the record is written in one operation with `assert_locked`, so a holder whose lock expired
//! (and was taken by another) writes nothing.
//!
//! **Guarantees**: at most one client (librados instance) and cookie holds a lock name at a
//! time; it expires by the OSD's clock after the given seconds, so a holder that dies releases
//! it by itself; [`Cluster::metadata_set_locked`] applies all of its changes or none, and none
//! unless the caller still holds the lock.
//!
//! **Caveats**: the lock lives on the header, so it needs a format-2 image (for a format-1
//! image [`Cluster::header_lock`] says [`Locked::Format1`] and the other calls are refused with
//! `InvalidArgument`).

use crate::cluster::{Cluster, check_image_name};
use crate::error::Error;
use crate::header::{encode_map, image_id};
use crate::raw::{IoCtx, WriteStep};

/// One holder's exclusive lock on an image header: the lock's name, the holder's cookie (unique
/// per holding: a second take with the same client and cookie is not a renewal), what it is
/// for, and how long it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderLock {
    pub name: String,
    pub cookie: String,
    /// Shown by `rados lock info rbd_header.<id> NAME`.
    pub description: String,
    /// Seconds until the lock expires by itself (0: never; avoid, a dead holder keeps it).
    pub secs: u32,
}

/// What [`Cluster::header_lock`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locked {
    /// This client holds the lock now.
    Taken,
    /// Another holder has it.
    Busy,
    /// A format-1 image: no header this lock can live on.
    Format1,
}

/// `rbd_header.<id>` of image `name`, or `InvalidArgument` for a format-1 image.
fn header_object(
    io: &IoCtx<'_>,
    op: &'static str,
    target: &str,
    name: &str,
) -> Result<String, Error> {
    match image_id(io, op, target, name) {
        Ok(id) => Ok(format!("rbd_header.{id}")),
        Err(e) if e.is_not_found() => {
            // a format-1 image has a `<name>.rbd` header and no ID object
            match io.read(op, target, &format!("{name}.rbd"), 1) {
                Ok(_) => Err(Error::invalid(
                    FORMAT1_OP,
                    target.to_owned(),
                    "a format-1 image has no header this lock can live on",
                )),
                Err(_) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The operation a format-1 image's refusal names (told apart by [`Cluster::header_lock`]).
const FORMAT1_OP: &str = "find the image header";

impl Cluster {
    /// Takes `lock` on the header of image `name` in `pool` (a pool spec).
    ///
    /// # Errors
    /// `NotFound` for a missing image; Ceph's errors.
    pub async fn header_lock(
        &self,
        pool: &str,
        name: &str,
        lock: &HeaderLock,
    ) -> Result<Locked, Error> {
        let op = "lock image header";
        check_image_name(op, pool, name)?;
        let (name, target) = (name.to_owned(), format!("{pool}/{name}"));
        let input =
            crate::cls_lock::lock(&lock.name, &lock.cookie, "", &lock.description, lock.secs);
        let result = self
            .with_pool(op, pool, target.clone(), move |io| {
                let header = header_object(io, op, &target, &name)?;
                io.write_op(
                    op,
                    &target,
                    &header,
                    &[WriteStep::AssertExists, WriteStep::lock("lock", &input)],
                )
            })
            .await;
        match result {
            Ok(()) => Ok(Locked::Taken),
            // this client and cookie already hold it
            Err(e) if e.is_already_exists() => Ok(Locked::Taken),
            Err(Error::Busy { .. }) => Ok(Locked::Busy),
            Err(Error::InvalidArgument { op: FORMAT1_OP, .. }) => Ok(Locked::Format1),
            Err(e) => Err(e),
        }
    }

    /// Releases this client's `lock` on the header of image `name`; one not held (expired,
    /// broken, the image gone) is fine.
    ///
    /// # Errors
    /// Ceph's errors.
    pub async fn header_unlock(
        &self,
        pool: &str,
        name: &str,
        lock: &HeaderLock,
    ) -> Result<(), Error> {
        let op = "unlock image header";
        check_image_name(op, pool, name)?;
        let (name, target) = (name.to_owned(), format!("{pool}/{name}"));
        let input = crate::cls_lock::unlock(&lock.name, &lock.cookie);
        let result = self
            .with_pool(op, pool, target.clone(), move |io| {
                let header = header_object(io, op, &target, &name)?;
                io.write_op(op, &target, &header, &[WriteStep::lock("unlock", &input)])
            })
            .await;
        match result {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Sets the metadata keys `set` of image `name` in one operation on its header that fails
    /// (`Busy`) unless this client holds `lock`: all keys or none. Nothing that has the image
    /// open is notified (as [`Cluster::metadata_set_unopened`]); use it for keys librbd does
    /// not read.
    ///
    /// # Errors
    /// `Busy` when the lock is not held (expired, taken by another); `NotFound` for a missing
    /// image; Ceph's errors.
    pub async fn metadata_set_locked(
        &self,
        pool: &str,
        name: &str,
        lock: &HeaderLock,
        set: Vec<(String, String)>,
    ) -> Result<(), Error> {
        let op = "set image metadata under lock";
        check_image_name(op, pool, name)?;
        let (name, target) = (name.to_owned(), format!("{pool}/{name}"));
        let assert = crate::cls_lock::assert_locked(&lock.name, &lock.cookie, "");
        let input = encode_map(&set);
        self.with_pool(op, pool, target.clone(), move |io| {
            let header = header_object(io, op, &target, &name)?;
            io.write_op(
                op,
                &target,
                &header,
                &[
                    WriteStep::lock("assert_locked", &assert),
                    WriteStep::rbd("metadata_set", &input),
                ],
            )
        })
        .await
    }
}
