//! Image names and ownership records, as the volume core makes them.
//!
//! Re-exported from [`rbd_volume::naming`] and [`rbd_volume::owner`], the one implementation
//! the CSI controller uses too.

pub use rbd_volume::naming::{DEFAULT_PREFIX, Naming};
pub use rbd_volume::owner::{META_CLAIM, META_PROVISIONER, META_PV, Owner, Ownership, ownership};
