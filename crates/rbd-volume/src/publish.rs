//! Publishing a volume to nodes (CSI `ControllerPublishVolume` / `ControllerUnpublishVolume`):
//! which nodes a volume is attached to, recorded on the image, and the refusal of a second node
//! for a single-node volume.
//!
//! **The record.** The image metadata key [`META_PUBLISHED`] holds a JSON list of
//! [`Publication`]s (node, single- or multi-node access, read-only), one per node
//! (`rbd image-meta get POOL/IMAGE provisioner.ceph.com/published-nodes` shows it). Publishing
//! adds the node's entry, unpublishing removes it (an empty list is left, not the key).
//!
//! **The rules** ([`decide`]), as the CSI spec words them:
//! - the same node with the same access and read-only flag again: nothing to do (idempotent);
//! - the same node with another access or read-only flag: [`PublishError::Incompatible`]
//!   (`ALREADY_EXISTS`);
//! - another node while the volume is published anywhere else and either side is single-node
//!   (`SINGLE_NODE_*`, or a `ReadWriteOnce` claim): [`PublishError::PublishedElsewhere`]
//!   (`FAILED_PRECONDITION`). A single-node volume is thus never published to two nodes, and a
//!   multi-node reader set is never joined by a single-node writer;
//! - otherwise the node is added.
//!
//! **Unpublish** of an image that does not exist, or from a node it is not published to,
//! succeeds (the spec's idempotency); with no node given it unpublishes from every node.
//!
//! **Atomicity.** Every change is a compare-and-swap on the image's header object
//! ([`ceph_rbd::Cluster::metadata_compare_and_set`]): the record is read, decided on, and
//! written only if it still holds what was read, in one RADOS operation; when another writer
//! changed it meanwhile (another process, connection or leader, external-attacher and the
//! built-in attacher both running), the record is read and decided on again, up to
//! [`SWAP_ATTEMPTS`] times ([`PublishError::Contended`] after). So two publishes of a
//! single-node volume to two nodes never both succeed, and concurrent publishes of a
//! multi-node volume never lose an entry, whoever the callers are.
//!
//! **Caveats.** Kubernetes' own attach/detach controller refuses a second attachment of a
//! `ReadWriteOnce` volume before this is ever asked; the record is the storage side's second
//! line, and the node's watcher check the third. The write goes to the header as librbd's
//! `metadata_set` class call, without librbd's notification of clients that have the image
//! open (none of them reads this key). Format-1 images are compared and set by opening them,
//! without atomicity across processes.

use std::collections::BTreeMap;

use ceph_rbd::Cluster;
use serde::{Deserialize, Serialize};

/// Image metadata key: the nodes the volume is published to (a JSON list of [`Publication`]).
pub const META_PUBLISHED: &str = "provisioner.ceph.com/published-nodes";

/// Whether a publication lets other nodes use the volume at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// `SINGLE_NODE_WRITER`, `SINGLE_NODE_READER_ONLY`, `SINGLE_NODE_*_WRITER`: one node only.
    SingleNode,
    /// `MULTI_NODE_*`: several nodes may have it.
    MultiNode,
}

/// One node's publication of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    /// The CSI node ID (the Kubernetes node name).
    pub node: String,
    pub sharing: Sharing,
    pub readonly: bool,
}

/// What [`decide`] says about a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The node already has this publication: nothing to write.
    AlreadyPublished,
    /// Record the node: the full new list.
    Record(Vec<Publication>),
}

/// Why a publish or unpublish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Ceph failed (a missing image is `ceph_rbd::Error::NotFound`).
    #[error(transparent)]
    Ceph(#[from] ceph_rbd::Error),
    /// A single-node volume (or a request for one) while the volume is published to other nodes.
    #[error(
        "volume {image} is published to node(s) {} and cannot also be published to {node}: \
         {reason}",
        others.join(", ")
    )]
    PublishedElsewhere {
        image: String,
        node: String,
        others: Vec<String>,
        reason: &'static str,
    },
    /// The node has the volume with another access mode or read-only flag.
    #[error(
        "volume {image} is already published to node {node} as {existing}; a publish as \
         {wanted} is incompatible (unpublish it first)"
    )]
    Incompatible {
        image: String,
        node: String,
        existing: String,
        wanted: String,
    },
    /// The image's publication record is not one this code wrote.
    #[error("volume {image}: metadata {META_PUBLISHED} cannot be read: {message}")]
    BadRecord { image: String, message: String },
    /// A node ID that cannot be recorded.
    #[error("node_id: {0}")]
    InvalidNode(String),
    /// Other writers changed the record every time between our read and our write.
    #[error(
        "volume {image}: metadata {META_PUBLISHED} changed under {attempts} attempts in a row \
         (concurrent publishes of this volume); retry"
    )]
    Contended { image: String, attempts: u32 },
}

/// How many times [`publish`] and [`unpublish`] read, decide and try to swap the record before
/// giving up with [`PublishError::Contended`]. Each lost race means another writer's change went
/// in, so this bounds how many concurrent writers of one volume are served in one call.
pub const SWAP_ATTEMPTS: u32 = 32;

impl Publication {
    fn describe(&self) -> String {
        format!(
            "{}{}",
            match self.sharing {
                Sharing::SingleNode => "single-node",
                Sharing::MultiNode => "multi-node",
            },
            if self.readonly { " read-only" } else { "" }
        )
    }
}

/// Parses a publication record; a missing or empty value is no publication.
///
/// # Errors
/// [`PublishError::BadRecord`] for a value that is not such a list.
pub fn parse_record(image: &str, value: Option<&str>) -> Result<Vec<Publication>, PublishError> {
    match value.map(str::trim) {
        None | Some("") => Ok(Vec::new()),
        Some(text) => serde_json::from_str(text).map_err(|e| PublishError::BadRecord {
            image: image.to_owned(),
            message: e.to_string(),
        }),
    }
}

/// The record's text for `publications`.
#[must_use]
pub fn record(publications: &[Publication]) -> String {
    // a Vec of plain structs of strings and enums serialises without failure
    serde_json::to_string(publications).unwrap_or_else(|_| "[]".to_owned())
}

/// Decides a publish of `image` as `wanted` given the current publications (the rules in the
/// module doc).
///
/// # Errors
/// [`PublishError::Incompatible`] or [`PublishError::PublishedElsewhere`].
pub fn decide(
    image: &str,
    current: &[Publication],
    wanted: &Publication,
) -> Result<Decision, PublishError> {
    if let Some(existing) = current.iter().find(|p| p.node == wanted.node) {
        if existing == wanted {
            return Ok(Decision::AlreadyPublished);
        }
        return Err(PublishError::Incompatible {
            image: image.to_owned(),
            node: wanted.node.clone(),
            existing: existing.describe(),
            wanted: wanted.describe(),
        });
    }
    if !current.is_empty() {
        let reason = if wanted.sharing == Sharing::SingleNode {
            "the request is for single-node access"
        } else if current.iter().any(|p| p.sharing == Sharing::SingleNode) {
            "it is published there for single-node access"
        } else {
            ""
        };
        if !reason.is_empty() {
            return Err(PublishError::PublishedElsewhere {
                image: image.to_owned(),
                node: wanted.node.clone(),
                others: current.iter().map(|p| p.node.clone()).collect(),
                reason,
            });
        }
    }
    let mut next = current.to_vec();
    next.push(wanted.clone());
    Ok(Decision::Record(next))
}

/// What [`publish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// The node was recorded.
    Recorded,
    /// The node already had this publication.
    AlreadyPublished,
}

/// Publishes `image` of `pool` (a pool spec) to `wanted.node`: records it, or refuses.
///
/// # Errors
/// `Ceph(NotFound)` for a missing image; the refusals of [`decide`]; an unreadable record.
pub async fn publish(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    wanted: &Publication,
) -> Result<Published, PublishError> {
    if wanted.node.trim().is_empty() {
        return Err(PublishError::InvalidNode("must not be empty".to_owned()));
    }
    for _ in 0..SWAP_ATTEMPTS {
        let value = cluster.metadata_get(pool, image, META_PUBLISHED).await?;
        let current = parse_record(image, value.as_deref())?;
        let next = match decide(image, &current, wanted)? {
            Decision::AlreadyPublished => return Ok(Published::AlreadyPublished),
            Decision::Record(next) => next,
        };
        if cluster
            .metadata_compare_and_set(
                pool,
                image,
                META_PUBLISHED,
                value.as_deref(),
                &record(&next),
            )
            .await?
        {
            tracing::info!(pool, image, node = %wanted.node, "volume published to node");
            return Ok(Published::Recorded);
        }
        tracing::debug!(pool, image, node = %wanted.node, "publication record changed meanwhile; deciding again");
    }
    Err(PublishError::Contended {
        image: image.to_owned(),
        attempts: SWAP_ATTEMPTS,
    })
}

/// What [`unpublish`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unpublished {
    /// The node's publication (or, for no node, every publication) was removed.
    Removed,
    /// The image is not published to the node.
    NotPublished,
    /// The image does not exist.
    NoImage,
}

/// Unpublishes `image` of `pool` from `node` (`None`: from every node).
///
/// # Errors
/// Ceph errors other than a missing image; an unreadable record.
pub async fn unpublish(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    node: Option<&str>,
) -> Result<Unpublished, PublishError> {
    for _ in 0..SWAP_ATTEMPTS {
        let value = match cluster.metadata_get(pool, image, META_PUBLISHED).await {
            Ok(value) => value,
            Err(e) if e.is_not_found() => return Ok(Unpublished::NoImage),
            Err(e) => return Err(e.into()),
        };
        let current = parse_record(image, value.as_deref())?;
        let next: Vec<Publication> = match node {
            Some(node) => current.iter().filter(|p| p.node != node).cloned().collect(),
            None => Vec::new(),
        };
        if next.len() == current.len() {
            return Ok(Unpublished::NotPublished);
        }
        match cluster
            .metadata_compare_and_set(
                pool,
                image,
                META_PUBLISHED,
                value.as_deref(),
                &record(&next),
            )
            .await
        {
            Ok(true) => {
                tracing::info!(
                    pool,
                    image,
                    node = node.unwrap_or("<all>"),
                    "volume unpublished"
                );
                return Ok(Unpublished::Removed);
            }
            Ok(false) => {}
            Err(e) if e.is_not_found() => return Ok(Unpublished::NoImage),
            Err(e) => return Err(e.into()),
        }
    }
    Err(PublishError::Contended {
        image: image.to_owned(),
        attempts: SWAP_ATTEMPTS,
    })
}

/// The nodes `image` is published to (empty for none).
///
/// # Errors
/// Ceph errors (a missing image is `NotFound`); an unreadable record.
pub async fn publications(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Vec<Publication>, PublishError> {
    let value = cluster.metadata_get(pool, image, META_PUBLISHED).await?;
    parse_record(image, value.as_deref())
}

/// How many of the images in `metadata` (image name to its metadata, e.g. a pool's listing) are
/// published to `node`.
#[must_use]
pub fn count_on_node(metadata: &BTreeMap<String, BTreeMap<String, String>>, node: &str) -> usize {
    metadata
        .iter()
        .filter(|(image, meta)| {
            parse_record(image, meta.get(META_PUBLISHED).map(String::as_str))
                .is_ok_and(|list| list.iter().any(|p| p.node == node))
        })
        .count()
}

/// How many images of `pool` are published to `node` (a scan of the pool: one metadata read per
/// image; images removed while it runs are left out).
///
/// # Errors
/// Ceph errors listing the pool or reading an image's record.
pub async fn count_published_on_node(
    cluster: &Cluster,
    pool: &str,
    node: &str,
) -> Result<usize, PublishError> {
    let mut records = BTreeMap::new();
    for image in cluster.list_images(pool).await? {
        match cluster.metadata_get(pool, &image, META_PUBLISHED).await {
            Ok(Some(value)) => {
                records.insert(image, BTreeMap::from([(META_PUBLISHED.to_owned(), value)]));
            }
            Ok(None) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(count_on_node(&records, node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(node: &str, sharing: Sharing, readonly: bool) -> Publication {
        Publication {
            node: node.to_owned(),
            sharing,
            readonly,
        }
    }

    #[test]
    fn first_publish_records_the_node() {
        let wanted = p("a", Sharing::SingleNode, false);
        assert_eq!(
            decide("img", &[], &wanted).unwrap(),
            Decision::Record(vec![wanted])
        );
    }

    #[test]
    fn the_same_publish_again_is_idempotent() {
        let wanted = p("a", Sharing::SingleNode, false);
        assert_eq!(
            decide("img", std::slice::from_ref(&wanted), &wanted).unwrap(),
            Decision::AlreadyPublished
        );
    }

    #[test]
    fn the_same_node_with_another_readonly_flag_is_incompatible() {
        let current = [p("a", Sharing::SingleNode, false)];
        let err = decide("img", &current, &p("a", Sharing::SingleNode, true)).unwrap_err();
        assert!(matches!(err, PublishError::Incompatible { .. }), "{err}");
        assert!(err.to_string().contains("single-node read-only"), "{err}");
    }

    #[test]
    fn a_single_node_volume_is_refused_on_a_second_node() {
        let current = [p("a", Sharing::SingleNode, false)];
        let err = decide("img", &current, &p("b", Sharing::SingleNode, false)).unwrap_err();
        assert!(
            matches!(&err, PublishError::PublishedElsewhere { others, .. } if others == &["a"]),
            "{err}"
        );
        // a multi-node reader does not join a single-node writer either
        let err = decide("img", &current, &p("b", Sharing::MultiNode, true)).unwrap_err();
        assert!(
            matches!(err, PublishError::PublishedElsewhere { .. }),
            "{err}"
        );
        // and a single-node request does not join multi-node readers
        let readers = [p("a", Sharing::MultiNode, true)];
        let err = decide("img", &readers, &p("b", Sharing::SingleNode, false)).unwrap_err();
        assert!(
            matches!(err, PublishError::PublishedElsewhere { .. }),
            "{err}"
        );
    }

    #[test]
    fn multi_node_publications_accumulate() {
        let current = [p("a", Sharing::MultiNode, true)];
        let wanted = p("b", Sharing::MultiNode, true);
        assert_eq!(
            decide("img", &current, &wanted).unwrap(),
            Decision::Record(vec![current[0].clone(), wanted])
        );
    }

    #[test]
    fn records_round_trip_and_garbage_is_reported() {
        let list = vec![
            p("node-1", Sharing::SingleNode, false),
            p("n2", Sharing::MultiNode, true),
        ];
        let text = record(&list);
        assert_eq!(
            text,
            r#"[{"node":"node-1","sharing":"single-node","readonly":false},{"node":"n2","sharing":"multi-node","readonly":true}]"#
        );
        assert_eq!(parse_record("img", Some(&text)).unwrap(), list);
        assert_eq!(parse_record("img", None).unwrap(), vec![]);
        assert_eq!(parse_record("img", Some(" ")).unwrap(), vec![]);
        let err = parse_record("img", Some("node-1")).unwrap_err();
        assert!(err.to_string().contains(META_PUBLISHED), "{err}");
    }

    #[test]
    fn count_on_node_counts_images_published_there() {
        let meta =
            |list: &[Publication]| BTreeMap::from([(META_PUBLISHED.to_owned(), record(list))]);
        let images = BTreeMap::from([
            ("i1".to_owned(), meta(&[p("a", Sharing::SingleNode, false)])),
            ("i2".to_owned(), meta(&[p("b", Sharing::SingleNode, false)])),
            (
                "i3".to_owned(),
                meta(&[
                    p("b", Sharing::MultiNode, true),
                    p("a", Sharing::MultiNode, true),
                ]),
            ),
            ("i4".to_owned(), BTreeMap::new()),
        ]);
        assert_eq!(count_on_node(&images, "a"), 2);
        assert_eq!(count_on_node(&images, "b"), 2);
        assert_eq!(count_on_node(&images, "c"), 0);
    }
}
