//! The operator commands: `rbd-provisioner gc` and `rbd-provisioner migrate`.

pub mod gc;
pub mod migrate;
