//! The table of emulated resources: names, scope, kinds and discovery facts (as served by 1.36).

/// Which representation an API endpoint serves for a stored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    /// The stored object as is.
    Native,
    /// `events.k8s.io/v1` view of a stored core/v1 Event.
    EventsV1,
}

/// One REST resource the emulator serves.
#[derive(Debug)]
pub(crate) struct ResourceInfo {
    /// API group, "" for core.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural resource name used in URLs.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Whether `<plural>/status` exists (main-resource writes then ignore status).
    pub has_status: bool,
    /// Storage key shared by views of the same objects (core and events.k8s.io events).
    pub storage: &'static str,
    pub view: View,
    pub storage_version_hash: &'static str,
    /// PUT without `metadata.resourceVersion` is allowed (unconditional update).
    pub allow_unconditional_update: bool,
    /// The CRD facts of a custom resource (`None` for built-ins).
    pub custom: Option<&'static crate::crd::Custom>,
}

impl ResourceInfo {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`: the name used in Status messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn verbs(&self) -> &'static [&'static str] {
        if self.plural == "namespaces" {
            &[
                "create", "delete", "get", "list", "patch", "update", "watch",
            ]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

macro_rules! res {
    ($group:expr, $plural:expr, $singular:expr, $kind:expr, $ns:expr, $short:expr, $status:expr, $hash:expr) => {
        ResourceInfo {
            group: $group,
            version: "v1",
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $ns,
            short_names: $short,
            categories: &[],
            has_status: $status,
            storage: $plural,
            view: View::Native,
            storage_version_hash: $hash,
            allow_unconditional_update: true,
            custom: None,
        }
    };
}

/// Every served resource. Order is discovery order within a group.
pub(crate) static RESOURCES: &[ResourceInfo] = &[
    res!(
        "",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        false,
        "qFsyl6wFWjQ="
    ),
    res!(
        "",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
        "r2yiGXH7wu8="
    ),
    res!(
        "",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        &["ns"],
        true,
        "Q3oi5N2YM8M="
    ),
    res!(
        "",
        "nodes",
        "node",
        "Node",
        false,
        &["no"],
        true,
        "XwShjMxG9Fs="
    ),
    res!(
        "",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
        "QWTyNDq0dC4="
    ),
    res!(
        "",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        true,
        "HN/zwEC+JgM="
    ),
    ResourceInfo {
        categories: &["all"],
        ..res!(
            "",
            "pods",
            "pod",
            "Pod",
            true,
            &["po"],
            true,
            "xPOwRZ+Yhw8="
        )
    },
    res!(
        "",
        "secrets",
        "secret",
        "Secret",
        true,
        &[],
        false,
        "S6u1pOWzb84="
    ),
    ResourceInfo {
        allow_unconditional_update: false,
        ..res!(
            "coordination.k8s.io",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            false,
            "gqkMMb/YqFM="
        )
    },
    ResourceInfo {
        storage: "events",
        view: View::EventsV1,
        ..res!(
            "events.k8s.io",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            false,
            "r2yiGXH7wu8="
        )
    },
    ResourceInfo {
        categories: &["api-extensions"],
        allow_unconditional_update: false,
        ..res!(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            "jfWCUB31mvA="
        )
    },
    res!(
        "storage.k8s.io",
        "csidrivers",
        "csidriver",
        "CSIDriver",
        false,
        &[],
        false,
        "hL6j/rwBV5w="
    ),
    res!(
        "storage.k8s.io",
        "csinodes",
        "csinode",
        "CSINode",
        false,
        &[],
        false,
        "Pe62DkZtjuo="
    ),
    res!(
        "storage.k8s.io",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        false,
        "K+m6uJwbjGY="
    ),
    res!(
        "storage.k8s.io",
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        &[],
        true,
        "tJx/ezt6UDU="
    ),
    // GA in 1.34; the hash is of its storage version storage.k8s.io/v1 (see crate::vac)
    res!(
        "storage.k8s.io",
        "volumeattributesclasses",
        "volumeattributesclass",
        "VolumeAttributesClass",
        false,
        &["vac"],
        false,
        "tIjydgKBC5w="
    ),
];

/// The API groups (other than core) in `/apis` order.
pub(crate) const GROUPS: &[&str] = &[
    "events.k8s.io",
    "storage.k8s.io",
    "apiextensions.k8s.io",
    "coordination.k8s.io",
];

pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The native (storage) resource for a storage key.
pub(crate) fn by_storage(storage: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.storage == storage && r.view == View::Native)
}

pub(crate) fn core(plural: &str) -> &'static ResourceInfo {
    // The table above always contains the core resources asked for by the crate itself.
    RESOURCES
        .iter()
        .find(|r| r.group.is_empty() && r.plural == plural)
        .unwrap_or(&RESOURCES[0])
}

pub(crate) fn group_resources(group: &str) -> impl Iterator<Item = &'static ResourceInfo> + '_ {
    RESOURCES.iter().filter(move |r| r.group == group)
}
