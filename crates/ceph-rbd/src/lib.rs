//! ceph-rbd
