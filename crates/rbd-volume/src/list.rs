//! Listing the volumes of a pool, with their condition: what CSI `ListVolumes` reports.
//!
//! A volume is an image whose owner record names the given provisioner (driver); snapshot
//! images and clone intermediates ([`crate::snapshot::is_internal_image`]) never are, whatever
//! they inherited. An image that the pool lists but that cannot be read (its header missing or
//! unreadable) is listed as **abnormal** with the error: its record cannot be read, so it may be
//! one of ours, and a health monitor asking about it should learn that it is broken rather than
//! that it is gone. An image removed while the listing runs is left out.

use std::collections::BTreeMap;

use ceph_rbd::Cluster;

use crate::lifecycle::Error;
use crate::owner::Owner;
use crate::snapshot::{META_CONTENT_SOURCE, is_internal_image};

/// A volume's condition, as the storage system sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The image opens and its record reads.
    Normal,
    /// Why it is not usable.
    Abnormal(String),
}

/// A volume found in a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedVolume {
    pub image: String,
    /// Bytes; `None` when the image could not be read.
    pub size: Option<u64>,
    /// The snapshot or volume ID it was created from (empty: none).
    pub content_source: String,
    pub condition: Condition,
}

/// Whether an owner record makes the image a volume of `provisioner`.
fn is_volume_of(meta: &BTreeMap<String, String>, provisioner: &str) -> bool {
    Owner::from_metadata(meta).is_some_and(|o| o.provisioner == provisioner && !o.pv.is_empty())
}

/// Whether the pool still lists `image` (an image that does not open but is listed has lost its
/// header: broken, not deleted).
async fn still_listed(cluster: &Cluster, pool: &str, image: &str) -> Result<bool, Error> {
    match cluster.list_images(pool).await {
        Ok(images) => Ok(images.iter().any(|i| i == image)),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The volumes of `provisioner` in `pool`, ordered by image name. A missing pool has none.
///
/// # Errors
/// Ceph errors listing the pool (errors reading one image make that image abnormal).
pub async fn list_volumes(
    cluster: &Cluster,
    pool: &str,
    provisioner: &str,
) -> Result<Vec<ListedVolume>, Error> {
    let mut images = match cluster.list_images(pool).await {
        Ok(images) => images,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    images.retain(|i| !is_internal_image(i));
    images.sort();
    let mut volumes = Vec::new();
    for image in images {
        let abnormal = |e: ceph_rbd::Error| ListedVolume {
            image: image.clone(),
            size: None,
            content_source: String::new(),
            condition: Condition::Abnormal(format!("the image cannot be read: {e}")),
        };
        let meta = match cluster.metadata_list(pool, &image).await {
            Ok(meta) => meta,
            // removed meanwhile, or still in the pool's directory without its header
            Err(e) if e.is_not_found() => {
                if still_listed(cluster, pool, &image).await? {
                    volumes.push(abnormal(e));
                }
                continue;
            }
            Err(e) => {
                volumes.push(abnormal(e));
                continue;
            }
        };
        if !is_volume_of(&meta, provisioner) {
            continue;
        }
        let info = match cluster.image_info(pool, &image).await {
            Ok(info) => info,
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                volumes.push(abnormal(e));
                continue;
            }
        };
        let condition = match cluster.parent(pool, &image).await {
            Ok(_) => Condition::Normal,
            Err(e) => Condition::Abnormal(format!("the image's parent cannot be read: {e}")),
        };
        volumes.push(ListedVolume {
            size: Some(info.size),
            content_source: meta.get(META_CONTENT_SOURCE).cloned().unwrap_or_default(),
            image,
            condition,
        });
    }
    Ok(volumes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_records_of_this_provisioner_make_volumes() {
        let record = |provisioner: &str, pv: &str| -> BTreeMap<String, String> {
            Owner {
                pv: pv.into(),
                claim: String::new(),
                provisioner: provisioner.into(),
                kube_cluster: String::new(),
            }
            .entries()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
        };
        assert!(is_volume_of(&record("rbd.csi", "pvc-1"), "rbd.csi"));
        assert!(!is_volume_of(&record("other", "pvc-1"), "rbd.csi"));
        // what internal images carry over an inherited record
        assert!(!is_volume_of(&record("-", ""), "rbd.csi"));
        assert!(!is_volume_of(&BTreeMap::new(), "rbd.csi"));
    }
}
