//! What the node asks the cluster before it maps an image: it connects as the caller (which
//! authenticates the caller's key: a wrong or revoked key fails here, also when the image is
//! already mapped on this node), reads the cluster's fsid (an existing mapping is reused only if
//! it is of that cluster) and lists the image's watchers (opening it, so a key without access to
//! the image fails too): a single-node-writer volume watched by a client that is not this node's
//! own is not staged.

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

use ceph_rbd::{Cluster, ClusterConfig, Secret};
use rbd_volume::encryption::{Dek, Kms};
use tonic::Status;

use crate::mapper::{ImageSpec, Key};

/// How long the node waits to connect to the cluster.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one query may take.
const OP_TIMEOUT: Duration = Duration::from_secs(20);

/// A client watching an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watcher {
    /// `ip:port/nonce` (possibly with a `v1:`/`v2:` prefix).
    pub address: String,
    /// The client's global id (`client.<id>`).
    pub id: u64,
}

impl Watcher {
    /// The watcher's IP address, when its address parses.
    #[must_use]
    pub fn ip(&self) -> Option<IpAddr> {
        let addr = self
            .address
            .strip_prefix("v1:")
            .or_else(|| self.address.strip_prefix("v2:"))
            .unwrap_or(&self.address);
        let addr = addr.split('/').next().unwrap_or(addr);
        if let Some(rest) = addr.strip_prefix('[') {
            return rest.split(']').next()?.parse().ok();
        }
        addr.rsplit_once(':')
            .map_or(addr, |(ip, _)| ip)
            .parse()
            .ok()
    }
}

impl std::fmt::Display for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client.{} at {}", self.id, self.address)
    }
}

/// What the cluster says about an image, read with the caller's key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// The cluster's fsid; `None` where a test stand-in cannot tell.
    pub fsid: Option<String>,
    /// Clients watching the image (mapped devices, open handles).
    pub watchers: Vec<Watcher>,
}

/// What a KMS may need to know of the volume besides its image.
#[derive(Debug, Clone, Copy)]
pub struct VolumeKeyRef<'a> {
    /// The CSI volume ID.
    pub volume_id: &'a str,
    /// The namespace of the volume's claim, when the volume context has it.
    pub tenant: Option<&'a str>,
}

/// Reads a [`ClusterView`] with the caller's key; replaceable in tests that have no cluster.
#[async_trait::async_trait]
pub trait ClusterCheck: Send + Sync {
    /// # Errors
    /// `PERMISSION_DENIED` for a key the cluster refuses, `NOT_FOUND` for a missing image,
    /// `UNAVAILABLE` when the cluster does not answer.
    async fn inspect(&self, image: &ImageSpec, key: &Key) -> Result<ClusterView, Status>;

    /// An encrypted volume's DEK from `kms`, read with the caller's key (`None`: none stored).
    ///
    /// # Errors
    /// As [`ClusterCheck::inspect`]; the KMS's errors name its entry.
    async fn fetch_dek(
        &self,
        image: &ImageSpec,
        _key: &Key,
        kms: &dyn Kms,
        _volume: &VolumeKeyRef<'_>,
    ) -> Result<Option<Dek>, Status> {
        Err(Status::failed_precondition(format!(
            "KMS entry {:?}: no cluster to read the key of image {image} from",
            kms.id()
        )))
    }
}

/// The real check, through librados/librbd with a connection of its own for the call.
#[derive(Debug, Default)]
pub struct CephCheck;

#[async_trait::async_trait]
impl ClusterCheck for CephCheck {
    async fn inspect(&self, image: &ImageSpec, key: &Key) -> Result<ClusterView, Status> {
        let cfg = ClusterConfig::new(&image.monitors, &image.user, Secret::new(key.expose()))
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_op_timeout(OP_TIMEOUT);
        let cluster = Cluster::connect(&cfg).await.map_err(ceph_status)?;
        let fsid = cluster.fsid().await.map_err(ceph_status)?;
        let pool = ceph_rbd::pool_spec(&image.pool, &image.namespace);
        let watchers = cluster
            .watchers(&pool, &image.image)
            .await
            .map_err(ceph_status)?
            .into_iter()
            .map(|w| Watcher {
                address: w.address,
                id: w.id,
            })
            .collect();
        Ok(ClusterView {
            fsid: Some(fsid),
            watchers,
        })
    }

    async fn fetch_dek(
        &self,
        image: &ImageSpec,
        key: &Key,
        kms: &dyn Kms,
        volume: &VolumeKeyRef<'_>,
    ) -> Result<Option<Dek>, Status> {
        let cfg = ClusterConfig::new(&image.monitors, &image.user, Secret::new(key.expose()))
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_op_timeout(OP_TIMEOUT);
        let cluster = Cluster::connect(&cfg).await.map_err(ceph_status)?;
        let pool = ceph_rbd::pool_spec(&image.pool, &image.namespace);
        let target = rbd_volume::encryption::kms::Target {
            cluster: &cluster,
            pool: &pool,
            image: &image.image,
            volume_id: volume.volume_id,
            tenant: volume.tenant,
        };
        kms.fetch_dek(&target)
            .await
            .map_err(|e| Status::failed_precondition(format!("reading the volume's key: {e}")))
    }
}

/// The CSI status of a Ceph error, saying what the node was doing.
fn ceph_status(e: ceph_rbd::Error) -> Status {
    let status = crate::controller::ceph_status(e);
    Status::new(
        status.code(),
        format!(
            "checking the caller's key and the image with the cluster: {}",
            status.message()
        ),
    )
}

/// Watchers that are not this node's own: those whose IP address is not one of this node's
/// (`local`). Every client on this node (a krbd or rbd-nbd mapping, an `rbd-fuse` instance, also
/// one that has just exited and whose watch the OSD has not dropped yet) watches from one of its
/// addresses; another node never does, as no two nodes share an address.
#[must_use]
pub fn foreign_watchers<'a>(watchers: &'a [Watcher], local: &HashSet<IpAddr>) -> Vec<&'a Watcher> {
    watchers
        .iter()
        .filter(|w| !w.ip().is_some_and(|ip| local.contains(&ip)))
        .collect()
}

/// This host's IP addresses (`getifaddrs(3)`), loopback included.
///
/// # Errors
/// The system call's error.
pub fn local_addresses() -> std::io::Result<HashSet<IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut found = HashSet::new();
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs returned, not yet freed.
        let entry = unsafe { &*cursor };
        if !entry.ifa_addr.is_null() {
            // SAFETY: `ifa_addr` points to a sockaddr whose family says which struct it is.
            let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { entry.ifa_addr.cast::<libc::sockaddr_in>().read_unaligned() };
                found.insert(IpAddr::from(
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                ));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { entry.ifa_addr.cast::<libc::sockaddr_in6>().read_unaligned() };
                found.insert(IpAddr::from(sin6.sin6_addr.s6_addr));
            }
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watcher(address: &str) -> Watcher {
        Watcher {
            address: address.into(),
            id: 4157,
        }
    }

    #[test]
    fn watcher_addresses_parse_to_ips() {
        assert_eq!(
            watcher("10.0.0.7:0/3360436473").ip(),
            Some("10.0.0.7".parse().unwrap())
        );
        assert_eq!(
            watcher("v1:10.0.0.7:0/1").ip(),
            Some("10.0.0.7".parse().unwrap())
        );
        assert_eq!(
            watcher("[fd00::7]:0/1").ip(),
            Some("fd00::7".parse().unwrap())
        );
        assert_eq!(watcher("garbage").ip(), None);
    }

    #[test]
    fn watchers_from_other_addresses_are_foreign() {
        let local: HashSet<IpAddr> = ["127.0.0.1".parse().unwrap()].into();
        let watchers = [
            watcher("127.0.0.1:0/1"),
            watcher("10.9.9.9:0/2"),
            watcher("unparsable"),
        ];
        assert_eq!(
            foreign_watchers(&watchers, &local),
            [&watchers[1], &watchers[2]]
        );
        assert!(foreign_watchers(&watchers, &HashSet::new()).len() == 3);
    }

    #[test]
    fn loopback_is_a_local_address() {
        assert!(
            local_addresses()
                .unwrap()
                .contains(&"127.0.0.1".parse().unwrap())
        );
    }
}
