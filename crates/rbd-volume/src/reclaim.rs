//! Reclaiming space: giving the RADOS space of a volume's freed blocks back to the pool.
//!
//! A thin-provisioned image only grows: blocks a filesystem frees stay allocated in RADOS
//! until something discards them. Two ways give them back:
//!
//! - **on the node** that has the volume staged: `FITRIM` on the filesystem (what `fstrim`
//!   does), whose discards the mapping passes on to the OSDs (the node plugin does this);
//! - **here, on the controller side**, for a volume staged nowhere: librbd's sparsify
//!   ([`ceph_rbd::Cluster::sparsify`]), which turns extents that read as zeros into holes and
//!   removes objects of zeros. It frees zeroed space, not space a filesystem merely marked
//!   free (that needs the trim).
//!
//! **Flow of [`reclaim_space`]:**
//! 1. the publication record ([`crate::publish`]) names no node and nobody watches the image
//!    (no mapping, no open handle): else [`ReclaimError::InUse`], nothing changed;
//! 2. the used size is read ([`ceph_rbd::Cluster::used_bytes_exact`], as `rbd du --exact`
//!    counts it: allocated extents, so a hole punched into an object counts);
//! 3. the image is sparsified;
//! 4. the used size is read again: [`Reclaimed`] has both.
//!
//! **Guarantees**: the data the image reads back is unchanged (sparsify only deallocates what
//! reads as zeros). **Caveats**: a node that maps the image between step 1 and 3 is not
//! refused; librbd's sparsify takes the image's exclusive lock and checks each object's
//! version before it removes it, so a write that lands meanwhile is kept.

use ceph_rbd::Cluster;

use crate::publish::{PublishError, publications};

/// The used size of a volume's image before and after a reclaim, in bytes as `rbd du --exact`
/// counts them (allocated extents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reclaimed {
    pub before: u64,
    pub after: u64,
}

impl Reclaimed {
    /// Bytes given back to the pool (0 when the image grew meanwhile).
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.before.saturating_sub(self.after)
    }
}

/// Why a controller-side reclaim did not run or failed.
#[derive(Debug, thiserror::Error)]
pub enum ReclaimError {
    /// A Ceph call failed (a missing image is `ceph_rbd::Error::NotFound`; `Timeout`: the
    /// sparsify may still be running).
    #[error(transparent)]
    Ceph(#[from] ceph_rbd::Error),
    /// The image is published to a node or watched by a client: its space is reclaimed by the
    /// node that has it staged, not here. Nothing was changed.
    #[error(
        "image {pool}/{image} is in use ({}): its space is reclaimed on the node that has it \
         staged, not by the controller",
        in_use_by(nodes, watchers)
    )]
    InUse {
        pool: String,
        image: String,
        /// The nodes the volume is published to.
        nodes: Vec<String>,
        /// Addresses of the clients that watch the image.
        watchers: Vec<String>,
    },
    /// The publication record does not parse.
    #[error(transparent)]
    Record(PublishError),
}

fn in_use_by(nodes: &[String], watchers: &[String]) -> String {
    let mut parts = Vec::new();
    if !nodes.is_empty() {
        parts.push(format!("published to {}", nodes.join(", ")));
    }
    if !watchers.is_empty() {
        parts.push(format!("watched by {}", watchers.join(", ")));
    }
    parts.join("; ")
}

impl From<PublishError> for ReclaimError {
    fn from(e: PublishError) -> Self {
        match e {
            PublishError::Ceph(e) => ReclaimError::Ceph(e),
            e => ReclaimError::Record(e),
        }
    }
}

/// Sparsifies `pool/image` when it is staged nowhere, and reports its used size before and
/// after (see the module doc).
///
/// # Errors
/// [`ReclaimError::InUse`] (nothing changed), Ceph errors.
pub async fn reclaim_space(
    cluster: &Cluster,
    pool: &str,
    image: &str,
) -> Result<Reclaimed, ReclaimError> {
    let nodes: Vec<String> = publications(cluster, pool, image)
        .await?
        .into_iter()
        .map(|p| p.node)
        .collect();
    let watchers: Vec<String> = cluster
        .watchers(pool, image)
        .await?
        .into_iter()
        .map(|w| w.address)
        .collect();
    if !nodes.is_empty() || !watchers.is_empty() {
        return Err(ReclaimError::InUse {
            pool: pool.to_string(),
            image: image.to_string(),
            nodes,
            watchers,
        });
    }
    let before = cluster.used_bytes_exact(pool, image).await?;
    cluster.sparsify(pool, image).await?;
    let after = cluster.used_bytes_exact(pool, image).await?;
    tracing::info!(
        image = %format!("{pool}/{image}"),
        before,
        after,
        "sparsified"
    );
    Ok(Reclaimed { before, after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclaimed_bytes_never_go_negative() {
        assert_eq!(
            Reclaimed {
                before: 10,
                after: 4
            }
            .bytes(),
            6
        );
        assert_eq!(
            Reclaimed {
                before: 4,
                after: 10
            }
            .bytes(),
            0
        );
    }

    #[test]
    fn in_use_names_the_nodes_and_the_watchers() {
        let e = ReclaimError::InUse {
            pool: "rbd".into(),
            image: "img".into(),
            nodes: vec!["node-a".into()],
            watchers: vec!["10.0.0.1:0/1".into()],
        };
        assert_eq!(
            e.to_string(),
            "image rbd/img is in use (published to node-a; watched by 10.0.0.1:0/1): its space \
             is reclaimed on the node that has it staged, not by the controller"
        );
    }
}
