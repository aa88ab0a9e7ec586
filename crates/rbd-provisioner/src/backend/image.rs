//! Image names and ownership records: the volume core's ([`rbd_volume::naming`],
//! [`rbd_volume::owner`]), the one implementation the CSI controller uses too.

pub use rbd_volume::naming::{DEFAULT_PREFIX, Naming};
pub use rbd_volume::owner::{META_CLAIM, META_PROVISIONER, META_PV, Owner, Ownership, ownership};
