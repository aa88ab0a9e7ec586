//! rbd-csi
