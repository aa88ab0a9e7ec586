//! Volume IDs: where an image lives, in at most 128 bytes, without a journal.
//!
//! | form | cluster given by | namespace |
//! |---|---|---|
//! | `v1/<monitors>/<pool>/<image>` | monitors | default |
//! | `v1/<monitors>/<pool>/<namespace>/<image>` | monitors | `<namespace>` |
//! | `v2/<clusterID>/<pool>/<image>` | name in the cluster config | default |
//! | `v2/<clusterID>/<pool>/<namespace>/<image>` | name in the cluster config | `<namespace>` |
//!
//! e.g. `v1/10.0.0.1:6789,10.0.0.2:6789/kube/pvc-2f1c...` (every ID made before namespaces and
//! cluster names existed has the first form and keeps parsing as it did) or
//! `v2/site-a/kube/tenant-1/pvc-2f1c...`. A `v2` ID names the cluster, not its monitors: the
//! monitors are looked up in the cluster config when the ID is used
//! ([`ClusterRef::monitors`]), so monitors that move later never strand a volume.
//!
//! `/` cannot occur in monitor addresses, cluster names, pool, namespace or image names, so the
//! split is unambiguous (four parts after the prefix: a namespace; three: the default one). The ID
//! plus the credentials of the call is enough to find the image. It must stay within the 128 bytes
//! Kubernetes allows for a CSI volume handle ([`VolumeId::encode`] checks).

use std::fmt;

pub use crate::clusters::ClusterRef;

/// Longest volume ID Kubernetes accepts as a CSI volume handle.
pub const MAX_VOLUME_ID_LEN: usize = 128;

const MONITORS_PREFIX: &str = "v1";
const NAMED_PREFIX: &str = "v2";

/// A parsed volume ID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct VolumeId {
    /// The cluster: its monitors (`v1`) or its name in the cluster config (`v2`).
    pub cluster: ClusterRef,
    pub pool: String,
    /// RADOS namespace; empty for the default one.
    pub namespace: String,
    pub image: String,
}

impl VolumeId {
    /// A volume in the default namespace of the cluster at `monitors` (a `v1` ID).
    #[must_use]
    pub fn new(monitors: &str, pool: &str, image: &str) -> Self {
        Self::located(ClusterRef::Monitors(monitors.to_owned()), pool, "", image)
    }

    /// A volume in `pool`'s namespace `namespace` (empty: the default one) of `cluster`.
    #[must_use]
    pub fn located(cluster: ClusterRef, pool: &str, namespace: &str, image: &str) -> Self {
        Self {
            cluster,
            pool: pool.to_owned(),
            namespace: namespace.to_owned(),
            image: image.to_owned(),
        }
    }

    /// Parses any of the forms in the module table.
    ///
    /// # Errors
    /// A message saying what is malformed.
    pub fn parse(id: &str) -> Result<Self, String> {
        split(MONITORS_PREFIX, NAMED_PREFIX, id)
            .map(|(cluster, pool, namespace, image)| {
                Self::located(cluster, pool, namespace, image)
            })
            .ok_or_else(|| {
                format!(
                    "malformed volume id {id:?} (expected v1/<monitors>/<pool>[/<namespace>]/<image> \
                     or v2/<clusterID>/<pool>[/<namespace>]/<image>)"
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
    /// When the ID would exceed [`MAX_VOLUME_ID_LEN`].
    pub fn encode(&self) -> Result<String, String> {
        within_limit("volume", self.to_string())
    }
}

/// One part of an ID: non-empty, no `/`.
fn part(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// `<prefix>/<cluster>/<pool>[/<namespace>]/<image>` split into its parts: the shape of volume
/// and snapshot IDs. `monitors_prefix` marks a cluster given by monitors, `named_prefix` one given
/// by name.
pub(crate) fn split<'a>(
    monitors_prefix: &str,
    named_prefix: &str,
    id: &'a str,
) -> Option<(ClusterRef, &'a str, &'a str, &'a str)> {
    let parts: Vec<&str> = id.split('/').collect();
    let (prefix, cluster, pool, namespace, image) = match parts.as_slice() {
        [p, c, pool, image] => (*p, *c, *pool, "", *image),
        [p, c, pool, ns, image] => (*p, *c, *pool, part(ns)?, *image),
        _ => return None,
    };
    let (cluster, pool, image) = (part(cluster)?, part(pool)?, part(image)?);
    let cluster = if prefix == monitors_prefix {
        ClusterRef::Monitors(cluster.to_owned())
    } else if prefix == named_prefix {
        ClusterRef::Named(cluster.to_owned())
    } else {
        return None;
    };
    Some((cluster, pool, namespace, image))
}

/// `<prefix>/<cluster>/<pool>[/<namespace>]/<image>`, the prefix chosen by how the cluster is given.
pub(crate) fn join(
    f: &mut fmt::Formatter<'_>,
    (monitors_prefix, named_prefix): (&str, &str),
    cluster: &ClusterRef,
    pool: &str,
    namespace: &str,
    image: &str,
) -> fmt::Result {
    match cluster {
        ClusterRef::Monitors(m) => write!(f, "{monitors_prefix}/{m}/{pool}/")?,
        ClusterRef::Named(n) => write!(f, "{named_prefix}/{n}/{pool}/")?,
    }
    if !namespace.is_empty() {
        write!(f, "{namespace}/")?;
    }
    f.write_str(image)
}

/// `id` if it fits the 128 bytes Kubernetes allows for CSI volume handles and snapshot handles.
pub(crate) fn within_limit(kind: &str, id: String) -> Result<String, String> {
    if id.len() > MAX_VOLUME_ID_LEN {
        return Err(format!(
            "{kind} id {id:?} would be {} bytes, more than the {MAX_VOLUME_ID_LEN} Kubernetes \
             allows; list fewer monitors (or use a clusterID), or use shorter pool or namespace names",
            id.len()
        ));
    }
    Ok(id)
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        join(
            f,
            (MONITORS_PREFIX, NAMED_PREFIX),
            &self.cluster,
            &self.pool,
            &self.namespace,
            &self.image,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_id_round_trips() {
        let id = VolumeId::new("10.0.0.1:6789,10.0.0.2:6789", "kube", "pvc-1");
        let text = id.encode().unwrap();
        assert_eq!(text, "v1/10.0.0.1:6789,10.0.0.2:6789/kube/pvc-1");
        assert_eq!(VolumeId::parse(&text).unwrap(), id);
        assert_eq!(id.pool_spec(), "kube");
    }

    #[test]
    fn namespaced_and_named_ids_round_trip() {
        let cases = [
            (
                VolumeId::located(
                    ClusterRef::Monitors("10.0.0.1:6789".into()),
                    "kube",
                    "t1",
                    "pvc-1",
                ),
                "v1/10.0.0.1:6789/kube/t1/pvc-1",
            ),
            (
                VolumeId::located(ClusterRef::Named("site-a".into()), "kube", "", "pvc-1"),
                "v2/site-a/kube/pvc-1",
            ),
            (
                VolumeId::located(ClusterRef::Named("site-a".into()), "kube", "t1", "pvc-1"),
                "v2/site-a/kube/t1/pvc-1",
            ),
        ];
        for (id, text) in cases {
            assert_eq!(id.encode().unwrap(), text);
            assert_eq!(VolumeId::parse(text).unwrap(), id);
        }
        assert_eq!(
            VolumeId::parse("v2/site-a/kube/t1/pvc-1")
                .unwrap()
                .pool_spec(),
            "kube/t1"
        );
    }

    #[test]
    fn malformed_volume_ids_are_rejected() {
        for bad in [
            "",
            "pvc-1",
            "v1/m/pool",
            "v3/m/p/i",
            "v1//p/i",
            "v1/m/p//i",
            "v2/c/p/n/i/x",
            "v1/m/p/n/i/x",
        ] {
            assert!(VolumeId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn over_long_volume_ids_are_refused() {
        let monitors = ["192.168.100.100:6789"; 8].join(",");
        assert!(VolumeId::new(&monitors, "rbd", "pvc-1").encode().is_err());
    }
}
