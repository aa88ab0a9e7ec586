//! RADOS namespaces (RBD namespaces): every `pool` argument of [`Cluster`] is a *pool spec*,
//! `pool` or `pool/namespace`, the way the `rbd` CLI writes `pool/namespace/image`.
//!
//! The I/O context of a call on `pool/namespace` is set to that namespace
//! (`rados_ioctx_set_namespace`), so images, snapshots, groups, trash entries and image metadata
//! of one namespace are invisible to calls on another (or on the default one). A plain `pool`
//! is the default namespace, so every existing call site keeps its meaning. A clone's
//! [`ParentSpec`](crate::ParentSpec) reports the parent's namespace; [`pool_spec`] joins the two.
//!
//! Namespaces are not created implicitly: librbd refuses to create an image in a namespace that
//! does not exist, and [`Cluster::namespace_exists`] lets a caller say so first, in its own words.

use crate::{Cluster, Error};

/// `pool` for the default namespace (`namespace` empty), else `pool/namespace`.
#[must_use]
pub fn pool_spec(pool: &str, namespace: &str) -> String {
    if namespace.is_empty() {
        pool.to_owned()
    } else {
        format!("{pool}/{namespace}")
    }
}

/// A pool spec split into pool and namespace (empty: the default namespace).
///
/// # Errors
/// An empty pool, an empty namespace after `/`, or more than one `/`.
pub fn split_pool_spec(spec: &str) -> Result<(&str, &str), String> {
    let (pool, namespace) = spec.split_once('/').unwrap_or((spec, ""));
    if pool.is_empty() {
        return Err("pool name is empty".to_owned());
    }
    if spec.contains('/') && namespace.is_empty() {
        return Err("namespace after '/' is empty".to_owned());
    }
    if namespace.contains('/') {
        return Err("expected pool or pool/namespace, found more than one '/'".to_owned());
    }
    Ok((pool, namespace))
}

impl Cluster {
    /// Whether the RBD namespace `namespace` exists in `pool` (`true` for the default one).
    pub async fn namespace_exists(&self, pool: &str, namespace: &str) -> Result<bool, Error> {
        if namespace.is_empty() {
            return Ok(true);
        }
        let name = namespace.to_owned();
        self.with_pool(
            "check namespace",
            pool,
            pool_spec(pool, namespace),
            move |io| io.namespace_exists(&name),
        )
        .await
    }

    /// Creates the RBD namespace `namespace` in `pool` (`rbd namespace create`; an operator's
    /// step, which tests and tools use: the volume paths never create one).
    pub async fn namespace_create(&self, pool: &str, namespace: &str) -> Result<(), Error> {
        let name = namespace.to_owned();
        self.with_pool(
            "create namespace",
            pool,
            pool_spec(pool, namespace),
            move |io| io.namespace_create(&name),
        )
        .await
    }

    /// The RBD namespaces of `pool` (the default one not included).
    pub async fn namespace_list(&self, pool: &str) -> Result<Vec<String>, Error> {
        self.with_pool("list namespaces", pool, pool.to_owned(), |io| {
            io.namespace_list()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_specs_split_into_pool_and_namespace() {
        assert_eq!(split_pool_spec("rbd"), Ok(("rbd", "")));
        assert_eq!(split_pool_spec("rbd/tenant-1"), Ok(("rbd", "tenant-1")));
        assert_eq!(pool_spec("rbd", ""), "rbd");
        assert_eq!(pool_spec("rbd", "tenant-1"), "rbd/tenant-1");
        for bad in ["", "/ns", "rbd/", "rbd/a/b"] {
            assert!(split_pool_spec(bad).is_err(), "{bad}");
        }
    }
}
