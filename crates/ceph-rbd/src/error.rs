//! Typed errors. Each names the operation and its target (pool, image), never a key.

use std::time::Duration;

/// What an operation acted on, for error messages: `pool`, `pool/image` or `pool/image@snap`.
pub type Target = String;

/// A failed Ceph operation.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The pool, image, snapshot or trash entry does not exist (`ENOENT`).
    #[error("{op} {target}: not found")]
    NotFound { op: &'static str, target: Target },
    /// The image or snapshot already exists (`EEXIST`).
    #[error("{op} {target}: already exists")]
    AlreadyExists { op: &'static str, target: Target },
    /// The image is open elsewhere: mapped on a node or held by another client.
    #[error("{op} {target}: image is in use by {} watcher(s): {}", watchers.len(), watchers.join(", "))]
    InUse {
        op: &'static str,
        target: Target,
        /// Addresses of the clients watching the image (`ip:port/nonce`).
        watchers: Vec<String>,
    },
    /// The resource is busy for another reason (`EBUSY` without watchers, e.g. a protected snapshot).
    #[error("{op} {target}: busy (EBUSY)")]
    Busy { op: &'static str, target: Target },
    /// Ceph refused the credentials or the caps (`EACCES`/`EPERM`).
    #[error(
        "{op} {target}: permission denied (the monitors are reachable but refused the user id, key or its caps)"
    )]
    PermissionDenied { op: &'static str, target: Target },
    /// The cluster did not answer in time (`ETIMEDOUT`, or our own deadline).
    #[error("{op} {target}: timed out after {after:?} (Ceph unreachable or overloaded)")]
    Timeout {
        op: &'static str,
        target: Target,
        after: Duration,
    },
    /// An argument was refused, by us or by Ceph (`EINVAL`, `EDOM`, ...).
    #[error("{op} {target}: invalid argument: {reason}")]
    InvalidArgument {
        op: &'static str,
        target: Target,
        reason: String,
    },
    /// The image still has snapshots (`ENOTEMPTY`) or children.
    #[error("{op} {target}: image has snapshots or clones; remove them first")]
    HasDependents { op: &'static str, target: Target },
    /// An earlier changing operation on this image, in this process, has not returned yet
    /// (it outlived its deadline: Ceph is slow, or the image's lock holder died and its watch
    /// has not expired). Retry later.
    #[error("{op} {target}: another operation on this image is in progress: {why}; retry later")]
    InProgress {
        op: &'static str,
        target: Target,
        /// Why this one did not get its turn.
        why: String,
    },
    /// Any other failure, with the raw errno.
    #[error("{op} {target}: {} (errno {errno})", errno_text(*errno))]
    Other {
        op: &'static str,
        target: Target,
        errno: i32,
    },
}

impl Error {
    /// Maps a negative (or positive) errno returned by librados/librbd.
    pub(crate) fn from_errno(rc: i32, op: &'static str, target: impl Into<Target>) -> Error {
        let target = target.into();
        match rc.abs() {
            libc::ENOENT => Error::NotFound { op, target },
            libc::EEXIST => Error::AlreadyExists { op, target },
            libc::EBUSY => Error::Busy { op, target },
            libc::EACCES | libc::EPERM => Error::PermissionDenied { op, target },
            libc::ETIMEDOUT => Error::Timeout {
                op,
                target,
                after: Duration::ZERO,
            },
            libc::ENOTEMPTY => Error::HasDependents { op, target },
            errno @ (libc::EINVAL | libc::EDOM | libc::ERANGE | libc::ENAMETOOLONG) => {
                Error::InvalidArgument {
                    op,
                    target,
                    reason: errno_text(errno),
                }
            }
            errno => Error::Other { op, target, errno },
        }
    }

    pub(crate) fn invalid(
        op: &'static str,
        target: impl Into<Target>,
        reason: impl Into<String>,
    ) -> Error {
        Error::InvalidArgument {
            op,
            target: target.into(),
            reason: reason.into(),
        }
    }

    /// True for [`Error::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// True for [`Error::AlreadyExists`].
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::AlreadyExists { .. })
    }

    /// True when Ceph could not be reached or the connection itself is broken (timeouts,
    /// shutdown, refused). Only the latter make the pool reconnect (see `Cluster::is_healthy`).
    pub fn is_connection_failure(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Other { errno, .. } => {
                matches!(
                    *errno,
                    libc::ESHUTDOWN | libc::ENOTCONN | libc::ECONNREFUSED
                )
            }
            _ => false,
        }
    }

    /// The operation that failed.
    pub fn op(&self) -> &'static str {
        match self {
            Error::NotFound { op, .. }
            | Error::AlreadyExists { op, .. }
            | Error::InUse { op, .. }
            | Error::Busy { op, .. }
            | Error::PermissionDenied { op, .. }
            | Error::Timeout { op, .. }
            | Error::InvalidArgument { op, .. }
            | Error::HasDependents { op, .. }
            | Error::InProgress { op, .. }
            | Error::Other { op, .. } => op,
        }
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_kinds_and_name_the_target() {
        let e = Error::from_errno(-libc::ENOENT, "open image", "rbd/vol1");
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "open image rbd/vol1: not found");
        assert!(Error::from_errno(-libc::EEXIST, "create image", "rbd/x").is_already_exists());
        assert!(matches!(
            Error::from_errno(-libc::EACCES, "connect", "mon"),
            Error::PermissionDenied { .. }
        ));
        assert!(matches!(
            Error::from_errno(-libc::ETIMEDOUT, "connect", "mon"),
            Error::Timeout { .. }
        ));
        let other = Error::from_errno(-libc::EIO, "resize image", "rbd/x");
        assert_eq!(
            other,
            Error::Other {
                op: "resize image",
                target: "rbd/x".into(),
                errno: libc::EIO
            }
        );
        assert!(other.to_string().contains("errno 5"), "{other}");
    }

    #[test]
    fn in_use_lists_the_watchers() {
        let e = Error::InUse {
            op: "remove image",
            target: "rbd/x".into(),
            watchers: vec!["127.0.0.1:0/123".into()],
        };
        assert_eq!(
            e.to_string(),
            "remove image rbd/x: image is in use by 1 watcher(s): 127.0.0.1:0/123"
        );
    }
}
