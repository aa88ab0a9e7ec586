//! Safe character sets for what a request names: pools, images, RADOS namespaces, Ceph users and
//! monitor lists. One implementation for every service: the node checks `volume_context` and
//! volume IDs with it before any of it reaches a path (`<rbd-fuse mount>/<image>`), a command line
//! (`rbd map POOL/IMAGE --id USER -m MONITORS`) or a file (the private keyring and `ceph.conf` of
//! an `rbd-fuse` instance).
//!
//! Names (pool, image, namespace, user) follow the controller's image-name rule
//! ([`crate::volume::is_safe_image_name`]: `[A-Za-z0-9._-]`, not starting with `.` or `-`, at most
//! 100 bytes), so nothing can climb out of a directory (`..`), start an option (`-`) or break a
//! line of a Ceph config file. Monitors: comma-separated `host[:port]` entries (IPv6 in brackets,
//! Ceph's `v1:`/`v2:` prefixes and `/nonce` suffixes allowed), each `[A-Za-z0-9.:_/\[\]-]`, not
//! starting with `-`; spaces only around the commas.
//!
//! Every check returns a message that names the field it was given, for an `INVALID_ARGUMENT`.

use crate::volume::is_safe_image_name;

/// What a name is, for the message.
const NAME_RULE: &str =
    "letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 100 bytes";

fn name(field: &str, value: &str) -> Result<(), String> {
    if is_safe_image_name(value) {
        Ok(())
    } else {
        Err(format!(
            "{field} {value:?} is not a valid name ({NAME_RULE})"
        ))
    }
}

/// A pool name.
///
/// # Errors
/// A message naming `field`.
pub fn pool(field: &str, value: &str) -> Result<(), String> {
    name(field, value)
}

/// An RBD image name.
///
/// # Errors
/// A message naming `field`.
pub fn image(field: &str, value: &str) -> Result<(), String> {
    name(field, value)
}

/// A RADOS namespace: empty (the pool's default namespace) or a name.
///
/// # Errors
/// A message naming `field`.
pub fn namespace(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        Ok(())
    } else {
        name(field, value)
    }
}

/// A `clusterID` of the cluster config (it becomes part of volume IDs).
///
/// # Errors
/// A message naming `field`.
pub fn cluster_id(field: &str, value: &str) -> Result<(), String> {
    name(field, value)
}

/// A Ceph user id without the `client.` prefix.
///
/// # Errors
/// A message naming `field`.
pub fn user(field: &str, value: &str) -> Result<(), String> {
    name(field, value)
}

/// A comma-separated monitor list.
///
/// # Errors
/// A message naming `field` and the offending entry.
pub fn monitors(field: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{field} is empty"));
    }
    for entry in value.split(',') {
        let entry = entry.trim_matches(' ');
        let safe = !entry.is_empty()
            && entry.len() <= 255
            && !entry.starts_with('-')
            && entry.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(b, b'.' | b':' | b'_' | b'-' | b'/' | b'[' | b']')
            });
        if !safe {
            return Err(format!(
                "{field} {value:?} has an invalid entry {entry:?} (expected comma-separated \
                 host[:port] addresses)"
            ));
        }
    }
    Ok(())
}

/// A cephx key (base64). The message never quotes it.
///
/// # Errors
/// A message naming `field`.
pub fn key(field: &str, value: &str) -> Result<(), String> {
    let safe = !value.is_empty()
        && value.len() <= 1024
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    if safe {
        Ok(())
    } else {
        Err(format!(
            "{field} is not a valid cephx key (base64: letters, digits, '+', '/', '=')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_refuse_paths_options_and_config_syntax() {
        for good in ["rbd", "kube-pool", "pvc-0a1b", "csi.vol_1", "a"] {
            assert_eq!(pool("p", good), Ok(()));
            assert_eq!(image("i", good), Ok(()));
            assert_eq!(user("u", good), Ok(()));
            assert_eq!(namespace("n", good), Ok(()));
        }
        for bad in [
            "",
            "..",
            "../etc",
            "a/b",
            "-o",
            ".hidden",
            "img\n[client.admin]",
            "a]b",
            "x y",
            "a=b",
            "é",
            &"a".repeat(101),
        ] {
            let err = image("volume_context.imageName", bad).unwrap_err();
            assert!(err.starts_with("volume_context.imageName "), "{err}");
            assert!(pool("p", bad).is_err(), "{bad:?}");
            assert!(user("u", bad).is_err(), "{bad:?}");
        }
        assert_eq!(namespace("n", ""), Ok(()));
        assert!(namespace("n", "../x").is_err());
    }

    #[test]
    fn monitors_allow_ceph_address_forms_and_nothing_else() {
        for good in [
            "127.0.0.1:6789",
            "10.0.0.1:6789,10.0.0.2:6789",
            "a:1, b",
            "mon-a.example.org",
            "[::1]:6789",
            "[v2:10.0.0.1:3300/0,v1:10.0.0.1:6789/0]",
        ] {
            assert_eq!(monitors("m", good), Ok(()), "{good}");
        }
        for bad in [
            "",
            " ",
            "a:1,,b:2",
            "a:1\nkeyring = /etc/shadow",
            "a:1;b",
            "-m",
            "a:1 b:2",
            "a#b",
            "a=b",
        ] {
            let err = monitors("volume_context.monitors", bad).unwrap_err();
            assert!(err.starts_with("volume_context.monitors "), "{err}");
        }
    }

    #[test]
    fn keys_are_base64_and_never_quoted() {
        assert_eq!(key("secrets.userKey", "AQBsecret+/a=="), Ok(()));
        for bad in ["", "AQB secret", "AQBsecret\n[client.x]", "AQB;x"] {
            let err = key("secrets.userKey", bad).unwrap_err();
            assert!(err.starts_with("secrets.userKey "), "{err}");
            assert!(bad.is_empty() || !err.contains(bad), "{err}");
        }
    }
}
