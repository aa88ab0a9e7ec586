//! ceph-csi's RBD layout (releases 3.x; read from its `internal/util/volid.go`,
//! `internal/journal/voljournal.go` and `internal/rbd`), so its volumes can be taken over in
//! place: the volume handle, the omap journal, image names and image metadata.
//!
//! - **Volume handle** (and snapshot handle): `<version>-<len>-<clusterID>-<pool ID>-<uuid>`:
//!   version `0001` (4 hex digits), the cluster ID's length as 4 hex digits, the cluster ID, the
//!   image pool's ID as 16 hex digits, and a 36-character UUID; e.g.
//!   `0001-0009-rook-ceph-0000000000000002-50d53503-9da1-11ed-847e-bacf8f2f1297`. The RADOS
//!   namespace is not in it: it is the cluster's `radosNamespace` in the cluster config.
//! - **Journal**: per volume the object `csi.volume.<uuid>` (per snapshot `csi.snap.<uuid>`)
//!   in the image pool and namespace, whose omap holds `csi.imagename` (`csi-vol-<uuid>`, or the
//!   class's `volumeNamePrefix` + uuid), `csi.volname` (the request name, `pvc-...`),
//!   `csi.imageid`, `csi.volume.owner` (the claim's namespace), `csi.volume.encryptKMS` and
//!   `csi.volume.encryptionType` for encrypted volumes, and for snapshots `csi.source` (the
//!   source image's name); the directory objects `csi.volumes.default` / `csi.snaps.default`
//!   map `csi.volume.<request name>` to the uuid. Nothing here writes them.
//! - **Images**: `csi-vol-<uuid>`; a snapshot is the image `csi-snap-<uuid>` (a clone of a
//!   temporary snapshot of its source) with the snapshot `csi-snap-<uuid>` on it.

use std::collections::BTreeMap;

use ceph_rbd::Cluster;

/// ceph-csi's RBD driver name.
pub const DRIVER: &str = "rbd.csi.ceph.com";
/// The version field of the handles ceph-csi 3.x writes.
const VERSION: u16 = 1;
/// Length of the UUID part.
const UUID_LEN: usize = 36;

/// Journal object of a volume: `csi.volume.<uuid>`.
pub const VOLUME_OBJECT_PREFIX: &str = "csi.volume.";
/// Journal object of a snapshot: `csi.snap.<uuid>`.
pub const SNAPSHOT_OBJECT_PREFIX: &str = "csi.snap.";
/// Journal key: the image's name.
pub const KEY_IMAGE_NAME: &str = "csi.imagename";
/// Journal key: the request (PV or VolumeSnapshotContent) name of a volume.
pub const KEY_VOLUME_NAME: &str = "csi.volname";
/// Journal key: the request name of a snapshot.
pub const KEY_SNAPSHOT_NAME: &str = "csi.snapname";
/// Journal key: the image's ID.
pub const KEY_IMAGE_ID: &str = "csi.imageid";
/// Journal key: the claim's namespace.
pub const KEY_OWNER: &str = "csi.volume.owner";
/// Journal key: the KMS of an encrypted volume.
pub const KEY_ENCRYPT_KMS: &str = "csi.volume.encryptKMS";
/// Journal key: the encryption type (`block`, `file`).
pub const KEY_ENCRYPTION_TYPE: &str = "csi.volume.encryptionType";
/// Journal key: a snapshot's source image name.
pub const KEY_SOURCE: &str = "csi.source";
/// Image name prefix of volumes (the default `volumeNamePrefix`).
pub const VOLUME_IMAGE_PREFIX: &str = "csi-vol-";
/// Image name prefix of snapshots (the default `snapshotNamePrefix`).
pub const SNAPSHOT_IMAGE_PREFIX: &str = "csi-snap-";

/// A parsed ceph-csi volume or snapshot handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handle {
    /// The cluster ID (a key of the cluster config).
    pub cluster_id: String,
    /// The image pool's ID.
    pub pool_id: i64,
    /// The UUID naming the journal object and, by default, the image.
    pub uuid: String,
}

impl Handle {
    /// Parses `handle`.
    ///
    /// # Errors
    /// What does not match ceph-csi's format, as a sentence.
    pub fn parse(handle: &str) -> Result<Handle, String> {
        let bad = |why: &str| format!("{handle:?} is not a ceph-csi volume handle: {why}");
        let hex4 = |s: &str| -> Option<u16> {
            (s.len() == 4 && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u16::from_str_radix(s, 16).ok())
                .flatten()
        };
        let version = handle
            .get(..4)
            .and_then(hex4)
            .ok_or_else(|| bad("no version"))?;
        if version != VERSION {
            return Err(bad(&format!("version {version}, not {VERSION}")));
        }
        if handle.get(4..5) != Some("-") {
            return Err(bad("no '-' after the version"));
        }
        let len = handle
            .get(5..9)
            .and_then(hex4)
            .map(usize::from)
            .ok_or_else(|| bad("no cluster ID length"))?;
        if handle.get(9..10) != Some("-") {
            return Err(bad("no '-' after the cluster ID length"));
        }
        let cluster_end = 10 + len;
        let cluster_id = handle
            .get(10..cluster_end)
            .ok_or_else(|| bad("shorter than its cluster ID length says"))?;
        let rest = handle
            .get(cluster_end..)
            .and_then(|r| r.strip_prefix('-'))
            .ok_or_else(|| {
                bad(&format!(
                    "no '-' after a cluster ID of the length the handle gives ({len} characters)"
                ))
            })?;
        // 16 hex digits, '-', 36 characters
        if rest.len() != 16 + 1 + UUID_LEN || rest.as_bytes()[16] != b'-' {
            return Err(bad(
                "the pool ID and UUID do not have their lengths (16 and 36)",
            ));
        }
        let pool_hex = &rest[..16];
        if !pool_hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the pool ID is not hexadecimal"));
        }
        let pool_id = u64::from_str_radix(pool_hex, 16)
            .ok()
            .and_then(|id| i64::try_from(id).ok())
            .ok_or_else(|| bad("the pool ID is out of range"))?;
        let uuid = &rest[17..];
        if !is_uuid(uuid) {
            return Err(bad("the last part is not a UUID"));
        }
        if cluster_id.is_empty() {
            return Err(bad("the cluster ID is empty"));
        }
        Ok(Handle {
            cluster_id: cluster_id.to_owned(),
            pool_id,
            uuid: uuid.to_owned(),
        })
    }

    /// The handle as ceph-csi writes it.
    #[must_use]
    pub fn encode(&self) -> String {
        format!(
            "{VERSION:04x}-{:04x}-{}-{:016x}-{}",
            self.cluster_id.len(),
            self.cluster_id,
            self.pool_id,
            self.uuid
        )
    }
}

/// A volume's journal entry (`csi.volume.<uuid>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeEntry {
    /// `csi.imagename` (ceph-csi's default when the entry predates the key).
    pub image: String,
    /// `csi.volname`: the request (PV) name.
    pub request: Option<String>,
    /// `csi.imageid`.
    pub image_id: Option<String>,
    /// `csi.volume.owner`: the claim's namespace.
    pub owner: Option<String>,
    /// `csi.volume.encryptKMS`: set for an encrypted volume.
    pub encrypt_kms: Option<String>,
    /// `csi.volume.encryptionType`.
    pub encryption_type: Option<String>,
}

/// A snapshot's journal entry (`csi.snap.<uuid>`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// `csi.imagename`: the snapshot image (its snapshot has the same name).
    pub image: String,
    /// `csi.snapname`: the request (VolumeSnapshotContent's CSI) name, `snapshot-<uid>`.
    pub request: Option<String>,
    /// `csi.source`: the source volume's image name.
    pub source: Option<String>,
    /// `csi.imageid`.
    pub image_id: Option<String>,
    /// `csi.volume.encryptKMS`: set for a snapshot of an encrypted volume.
    pub encrypt_kms: Option<String>,
}

/// Whether `name` is an image name ceph-csi gives a snapshot with its default prefix:
/// `csi-snap-` and a UUID.
#[must_use]
pub fn is_snapshot_image(name: &str) -> bool {
    name.strip_prefix(SNAPSHOT_IMAGE_PREFIX)
        .is_some_and(is_uuid)
}

fn is_uuid(s: &str) -> bool {
    s.len() == UUID_LEN
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

fn text(values: &BTreeMap<String, Vec<u8>>, key: &str) -> Option<String> {
    values
        .get(key)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| !v.is_empty())
}

/// The journal entry of the volume `uuid` in `pool` (`pool/namespace`), `None` when there is
/// none.
///
/// # Errors
/// Ceph errors other than a missing object.
pub async fn volume_entry(
    cluster: &Cluster,
    pool: &str,
    uuid: &str,
) -> Result<Option<VolumeEntry>, ceph_rbd::Error> {
    let keys = [
        KEY_IMAGE_NAME,
        KEY_VOLUME_NAME,
        KEY_IMAGE_ID,
        KEY_OWNER,
        KEY_ENCRYPT_KMS,
        KEY_ENCRYPTION_TYPE,
    ];
    let oid = format!("{VOLUME_OBJECT_PREFIX}{uuid}");
    let Some(values) = entry_values(cluster, pool, &oid, &keys).await? else {
        return Ok(None);
    };
    Ok(Some(VolumeEntry {
        image: text(&values, KEY_IMAGE_NAME)
            .unwrap_or_else(|| format!("{VOLUME_IMAGE_PREFIX}{uuid}")),
        request: text(&values, KEY_VOLUME_NAME),
        image_id: text(&values, KEY_IMAGE_ID),
        owner: text(&values, KEY_OWNER),
        encrypt_kms: text(&values, KEY_ENCRYPT_KMS),
        encryption_type: text(&values, KEY_ENCRYPTION_TYPE),
    }))
}

/// The journal entry of the snapshot `uuid` in `pool` (`pool/namespace`), `None` when there is
/// none.
///
/// # Errors
/// Ceph errors other than a missing object.
pub async fn snapshot_entry(
    cluster: &Cluster,
    pool: &str,
    uuid: &str,
) -> Result<Option<SnapshotEntry>, ceph_rbd::Error> {
    let keys = [
        KEY_IMAGE_NAME,
        KEY_SNAPSHOT_NAME,
        KEY_SOURCE,
        KEY_IMAGE_ID,
        KEY_ENCRYPT_KMS,
    ];
    let oid = format!("{SNAPSHOT_OBJECT_PREFIX}{uuid}");
    let Some(values) = entry_values(cluster, pool, &oid, &keys).await? else {
        return Ok(None);
    };
    Ok(Some(SnapshotEntry {
        image: text(&values, KEY_IMAGE_NAME)
            .unwrap_or_else(|| format!("{SNAPSHOT_IMAGE_PREFIX}{uuid}")),
        request: text(&values, KEY_SNAPSHOT_NAME),
        source: text(&values, KEY_SOURCE),
        image_id: text(&values, KEY_IMAGE_ID),
        encrypt_kms: text(&values, KEY_ENCRYPT_KMS),
    }))
}

/// The values of `keys` in the omap of `oid`; `None` when the object is missing or has none.
async fn entry_values(
    cluster: &Cluster,
    pool: &str,
    oid: &str,
    keys: &[&str],
) -> Result<Option<BTreeMap<String, Vec<u8>>>, ceph_rbd::Error> {
    match cluster.omap_get(pool, oid, keys).await {
        Ok(values) if values.is_empty() => Ok(None),
        Ok(values) => Ok(Some(values)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_parse_as_ceph_csi_writes_them() {
        let h = Handle::parse(
            "0001-0009-rook-ceph-0000000000000002-50d53503-9da1-11ed-847e-bacf8f2f1297",
        )
        .unwrap();
        assert_eq!(h.cluster_id, "rook-ceph");
        assert_eq!(h.pool_id, 2);
        assert_eq!(h.uuid, "50d53503-9da1-11ed-847e-bacf8f2f1297");
        assert_eq!(
            h.encode(),
            "0001-0009-rook-ceph-0000000000000002-50d53503-9da1-11ed-847e-bacf8f2f1297"
        );
        // a cluster ID with dashes, 36 characters long (a UUID, as many deployments use)
        let id = "f6a55ffc-8bc6-4a6b-8f0f-6d5e6b1b2c3d";
        let handle =
            format!("0001-0024-{id}-000000000000000a-11111111-2222-3333-4444-555555555555");
        let h = Handle::parse(&handle).unwrap();
        assert_eq!((h.cluster_id.as_str(), h.pool_id), (id, 10));
        assert_eq!(h.encode(), handle);
    }

    #[test]
    fn snapshot_image_names_are_the_prefix_and_a_uuid() {
        assert!(is_snapshot_image(
            "csi-snap-50d53503-9da1-11ed-847e-bacf8f2f1297"
        ));
        assert!(!is_snapshot_image(
            "csi-vol-50d53503-9da1-11ed-847e-bacf8f2f1297"
        ));
        assert!(!is_snapshot_image(
            "csi-snap-50d53503x9da1-11ed-847e-bacf8f2f1297"
        ));
        assert!(!is_snapshot_image(
            "csi-snap-0123456789abcdef0123456789abcdef"
        ));
    }

    #[test]
    fn bad_handles_say_what_is_wrong() {
        for (handle, why) in [
            ("v2/site-a/kube/pvc-1", "no version"),
            (
                "0002-0009-rook-ceph-0000000000000002-50d53503-9da1-11ed-847e-bacf8f2f1297",
                "version 2",
            ),
            (
                "0001-0020-rook-ceph-0000000000000002-50d53503-9da1-11ed-847e-bacf8f2f1297",
                "length the handle gives (32",
            ),
            (
                "0001-0009-rook-ceph-00000000000000zz-50d53503-9da1-11ed-847e-bacf8f2f1297",
                "not hexadecimal",
            ),
            (
                "0001-0009-rook-ceph-0000000000000002-50d53503x9da1-11ed-847e-bacf8f2f1297",
                "not a UUID",
            ),
        ] {
            let err = Handle::parse(handle).unwrap_err();
            assert!(err.contains(why), "{handle}: {err}");
        }
    }
}
