//! How to reach a cluster: monitors, user and key, plus timeouts.

use std::fmt;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// A secret string (a Ceph key). `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself. Call only where it is handed to Ceph.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A short fingerprint, safe to compare and log.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(self.0.as_bytes());
        digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Default bound for establishing a connection (mon session + cephx).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on waiting for one operation (also librados' monitor command timeout; OSD ops
/// get no librados timeout, see `Cluster::run`).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything needed to talk to a cluster; no ceph.conf and no keyring file are read or written.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Comma-separated `host:port` monitor list, as in a StorageClass `monitors` parameter.
    pub monitors: String,
    /// The Ceph user id without the `client.` prefix (e.g. `admin`, `kube`).
    pub user: String,
    /// The user's key.
    pub key: Secret,
    /// Bound for connecting (default 10 s).
    pub connect_timeout: Duration,
    /// Bound for each operation (default 30 s).
    pub op_timeout: Duration,
}

impl ClusterConfig {
    pub fn new(monitors: impl Into<String>, user: impl Into<String>, key: Secret) -> ClusterConfig {
        let user = user.into();
        let user = user
            .strip_prefix("client.")
            .map(str::to_string)
            .unwrap_or(user);
        ClusterConfig {
            monitors: monitors.into(),
            user,
            key,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            op_timeout: DEFAULT_OP_TIMEOUT,
        }
    }

    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> ClusterConfig {
        self.connect_timeout = timeout;
        self
    }

    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> ClusterConfig {
        self.op_timeout = timeout;
        self
    }

    /// The key under which the pool shares a connection: monitors, user and a key hash.
    pub(crate) fn pool_key(&self) -> (String, String, String) {
        (
            self.monitors.clone(),
            self.user.clone(),
            self.key.fingerprint(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let cfg = ClusterConfig::new("m:1", "client.kube", Secret::new("AQBsecret=="));
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("AQBsecret"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert_eq!(cfg.user, "kube");
        assert_eq!(cfg.key.fingerprint().len(), 12);
    }
}
