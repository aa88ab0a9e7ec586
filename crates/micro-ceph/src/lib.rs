//! micro-ceph
