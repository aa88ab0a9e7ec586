//! The volume core: RBD volumes as this product understands them, shared by both front doors
//! (the built-in provisioner's backend in `rbd-provisioner` and the CSI controller in `rbd-csi`).
//!
//! ```text
//! rbd-provisioner (Kubernetes: claims, PVs)      rbd-csi (CSI: CreateVolume, DeleteVolume, ...)
//!                 '---------------.   .-----------------'
//!                            rbd-volume (this crate)
//!                                    |
//!                            ceph-rbd (librados/librbd)
//! ```
//!
//! - [`naming`]: deterministic image names (the provisioner's `<prefix><claim uid>`, CSI request
//!   names), so a retried create finds the image it made;
//! - [`id`]: volume IDs (`v1/<monitors>/<pool>[/<namespace>]/<image>`, `v2/<clusterID>/...`) that
//!   locate an image without a journal;
//!
//! **Pools and namespaces**: every `pool` argument here is a `ceph_rbd` pool spec, `pool` or
//! `pool/namespace` ([`ceph_rbd::namespace`]), so each operation works inside a RADOS namespace
//! and never sees another's images; IDs carry the namespace ([`VolumeId::pool_spec`]).
//! - [`owner`]: the owner record kept in image metadata (`provisioner.ceph.com/{pv,claim,provisioner}`);
//! - [`lifecycle`]: create (and repair a half-created image), grow, delete with the owner and
//!   watcher checks, with crash-point [`Hooks`] the binary passes in;
//! - [`size`]: size limits in bytes;
//! - [`clusters`]: the cluster config (ceph-csi's `config.json`): cluster names to monitors, re-read
//!   when the file changes;
//! - [`topology`]: `topologyConstrainedPools` and node topology: the pool for where a pod runs;
//! - [`qos`]: per-volume librbd QoS limits (`rbd_qos_*`) parsed, validated and set as image
//!   configuration (enforced by librbd-based mappers, not by krbd);
//! - [`publish`]: the nodes a volume is published to (CSI `ControllerPublishVolume`), recorded
//!   on the image; a single-node volume is refused on a second node;
//! - [`reclaim`]: giving freed space back to the pool (sparsify of a volume staged nowhere,
//!   used size before and after);
//! - [`encryption`]: encrypted volumes (ceph-csi's class parameters, the KMS keeping each
//!   volume's key);
//! - [`snapshot`]: snapshots (clone-v2 snapshot images `csi-snap-...`), restores and volume
//!   clones, deletes that keep dependents working, chain depth bounded by flattening.
//!
//! Pure decisions are plain functions with unit tests; the I/O is the `ceph_rbd::Cluster` calls
//! in [`lifecycle`]. Nothing here knows Kubernetes or gRPC: each front door maps [`Error`] to its
//! own error kinds.

pub mod ceph_csi;
pub mod clusters;
pub mod encryption;
pub mod fence;
pub mod id;
pub mod lifecycle;
pub mod mirror;
pub mod naming;
pub mod owner;
pub mod publish;
pub mod qos;
pub mod reclaim;
pub mod size;
pub mod snapshot;
pub mod snapshot_limit;
pub mod staged;
pub mod topology;

pub use clusters::{ClusterConfigFile, ClusterRef};
pub use id::{MAX_VOLUME_ID_LEN, VolumeId};
pub use lifecycle::{
    Action, Claimant, Deleted, Ensured, Error, Fit, Grown, Hooks, NewImage, Outcome, Step,
    check_namespace, delete, ensure, grow,
};
pub use naming::{DEFAULT_PREFIX, Naming, hex, is_safe_image_name, request_image_name};
pub use owner::{
    META_CLAIM, META_KUBE_CLUSTER, META_PROVISIONER, META_PV, Owner, Ownership, ownership,
    same_kube_cluster,
};
pub use qos::{Qos, QosError};
pub use reclaim::{ReclaimError, Reclaimed, reclaim_space};
pub use snapshot::{
    MAX_CHAIN_DEPTH, NewClone, NewSnapshot, Snapshot, SnapshotDeleted, SnapshotError, SnapshotId,
    SnapshotOwner, Source, clone_volume, create_snapshot, delete_snapshot, delete_volume,
    find_snapshot, list_snapshots, purge_trash, snapshot_image_name,
};
pub mod group;
pub mod list;
