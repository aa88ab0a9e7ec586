//! Which node staged a single-node volume read-write, and with which Ceph client: recorded on the
//! image by the node plugin, read by the node plugin of any other node (one writer per volume)
//! and by fencing (whose client instances to blocklist when a node is declared lost).
//!
//! **The record.** The image metadata key [`META_STAGED_BY`] holds a JSON [`StagedBy`]: the CSI
//! node ID, and, when the node's mapper gives each mapping a client instance of its own that
//! watches only the images it maps (krbd, rbd-nbd), that client's global ID and address
//! (`rbd image-meta get POOL/IMAGE provisioner.ceph.com/staged-by` shows it). A mapper whose
//! one client opens every image of its pool (rbd-fuse) is recorded as [`StagedBy::pool_wide`]:
//! its watch says nothing about which images that node has staged, but it is the client that
//! writes them.
//!
//! **Lifetime.** Written under the node's stage lock after the image is mapped read-write;
//! never removed (unstage carries no credentials): a record whose client no longer watches the
//! image names a writer that has gone.

use serde::{Deserialize, Serialize};

/// Image metadata key of the [`StagedBy`] record.
pub const META_STAGED_BY: &str = "provisioner.ceph.com/staged-by";

/// The value of [`META_STAGED_BY`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedBy {
    /// The CSI node ID (the Kubernetes node name).
    pub node: String,
    /// The global ID (`client.<id>`) of the client instance that mapped the image, when the
    /// mapping has a client of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<u64>,
    /// That client instance's address, `ip:port/nonce`, as the OSDs list its watch (what an
    /// `osd blocklist add` of exactly that instance names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The client opens every image of its pool (rbd-fuse), so its watch of this image does not
    /// say the image is mapped on that node; it still writes what the node writes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pool_wide: bool,
}

impl StagedBy {
    /// Parses a [`META_STAGED_BY`] value; one that does not parse names no node.
    #[must_use]
    pub fn parse(value: &str) -> Option<StagedBy> {
        serde_json::from_str(value).ok()
    }

    /// The metadata value.
    #[must_use]
    pub fn value(&self) -> String {
        // a struct of strings and a number serialises without failure
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_older_records_without_a_client_still_parse() {
        let full = StagedBy {
            node: "node-a".into(),
            client: Some(4157),
            address: Some("10.0.0.1:0/3360436473".into()),
            pool_wide: false,
        };
        assert_eq!(StagedBy::parse(&full.value()), Some(full));
        assert_eq!(
            StagedBy::parse(r#"{"node":"node-b"}"#),
            Some(StagedBy {
                node: "node-b".into(),
                client: None,
                address: None,
                pool_wide: false,
            })
        );
        assert_eq!(StagedBy::parse("node-b"), None);
        assert_eq!(
            StagedBy {
                node: "n".into(),
                client: None,
                address: None,
                pool_wide: false,
            }
            .value(),
            r#"{"node":"n"}"#
        );
    }
}
