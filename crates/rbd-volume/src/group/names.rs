//! Names and IDs of group snapshots: deterministic, so a retry finds what a crashed create
//! made, and the ID alone locates the members.

use std::fmt;

use crate::id::ClusterRef;
use crate::naming::hex;
use crate::snapshot::snapshot_image_name;

/// Name prefix of the RBD groups (and of their one snapshot) group snapshots are taken through.
pub const GROUP_PREFIX: &str = "csi-group-";

/// The RBD group (and group snapshot) name for a group snapshot request name.
#[must_use]
pub fn group_name(request_name: &str) -> String {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(request_name.as_bytes());
    format!("{GROUP_PREFIX}{}", hex(&digest[..16]))
}

/// Whether `name` is a group name [`group_name`] makes.
#[must_use]
pub fn is_group_name(name: &str) -> bool {
    name.strip_prefix(GROUP_PREFIX).is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The snapshot image of the member of `group` taken of the volume `source_id`.
#[must_use]
pub fn member_image_name(group: &str, source_id: &str) -> String {
    snapshot_image_name(&format!("{group}/{source_id}"))
}

const GROUP_ID_PREFIXES: (&str, &str) = ("g1", "g2");

/// Group snapshot IDs, shaped like volume IDs ([`crate::id`]):
/// `g1/<monitors>/<pool>[/<namespace>]/<csi-group-...>`, or `g2/<clusterID>/...` for a cluster
/// named in the cluster config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshotId {
    pub cluster: ClusterRef,
    pub pool: String,
    /// RADOS namespace; empty for the default one.
    pub namespace: String,
    pub group: String,
}

impl GroupSnapshotId {
    /// A group snapshot in the default namespace of the cluster at `monitors` (a `g1` ID).
    #[must_use]
    pub fn new(monitors: &str, pool: &str, group: &str) -> Self {
        Self::located(ClusterRef::Monitors(monitors.to_owned()), pool, "", group)
    }

    /// A group snapshot in `pool`'s namespace `namespace` (empty: the default one) of `cluster`.
    #[must_use]
    pub fn located(cluster: ClusterRef, pool: &str, namespace: &str, group: &str) -> Self {
        Self {
            cluster,
            pool: pool.to_owned(),
            namespace: namespace.to_owned(),
            group: group.to_owned(),
        }
    }

    /// Parses `g1/<monitors>/<pool>[/<namespace>]/csi-group-<32 hex digits>` or `g2/<clusterID>/...`.
    ///
    /// # Errors
    /// A message saying what is malformed.
    pub fn parse(id: &str) -> Result<Self, String> {
        crate::id::split(GROUP_ID_PREFIXES.0, GROUP_ID_PREFIXES.1, id)
            .filter(|(_, _, _, group)| is_group_name(group))
            .map(|(cluster, pool, namespace, group)| Self::located(cluster, pool, namespace, group))
            .ok_or_else(|| {
                format!(
                    "malformed group snapshot id {id:?} (expected g1/<monitors>/<pool>[/<namespace>]/csi-group-<32 hex digits> \
                     or g2/<clusterID>/<pool>[/<namespace>]/csi-group-<32 hex digits>)"
                )
            })
    }

    /// The pool spec the `ceph_rbd` calls take: `pool` or `pool/namespace`.
    #[must_use]
    pub fn pool_spec(&self) -> String {
        ceph_rbd::pool_spec(&self.pool, &self.namespace)
    }

    /// The ID, checked against the length limit.
    ///
    /// # Errors
    /// When the ID would exceed [`crate::MAX_VOLUME_ID_LEN`].
    pub fn encode(&self) -> Result<String, String> {
        crate::id::within_limit("group snapshot", self.to_string())
    }
}

impl fmt::Display for GroupSnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::id::join(
            f,
            GROUP_ID_PREFIXES,
            &self.cluster,
            &self.pool,
            &self.namespace,
            &self.group,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_round_trip_and_reject_other_ids() {
        let group = group_name("groupsnapshot-1");
        assert!(is_group_name(&group) && group.len() == GROUP_PREFIX.len() + 32);
        assert_eq!(group, group_name("groupsnapshot-1"));
        assert_ne!(group, group_name("groupsnapshot-2"));
        let id = GroupSnapshotId::new("10.0.0.1:6789", "rbd", &group);
        let text = id.encode().unwrap();
        assert_eq!(GroupSnapshotId::parse(&text).unwrap(), id);
        for bad in [
            "",
            "g1/m/p/pvc-1",
            "s1/m/p/csi-group-00000000000000000000000000000000",
            "g1//p/csi-group-00000000000000000000000000000000",
            "g1/m/p/csi-group-0000000000000000000000000000000G",
        ] {
            assert!(GroupSnapshotId::parse(bad).is_err(), "{bad}");
        }
    }
}
