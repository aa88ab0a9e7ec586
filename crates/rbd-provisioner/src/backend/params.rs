//! StorageClass parameters of the built-in provisioner, parsed and checked. Pure: no I/O.
//!
//! The old `ceph.com/rbd` provisioner's set, with its defaults and rules, plus documented
//! extensions.
//!
//! Keys are case-insensitive. An unknown key, a duplicate key (in different case), an empty
//! required value or a malformed value is an error naming the parameter.

use std::collections::BTreeMap;

use ceph_rbd::Features;
use rbd_volume::topology::ConstrainedPool;

/// Features used when a class names none: fast deletes and diffs (object map), and mappable by
/// the kernel client since Linux 5.3. Classes for older kernels set `imageFeatures: layering`.
pub const DEFAULT_FEATURES: &str = "layering,exclusive-lock,object-map,fast-diff";

/// Where PVs point nodes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PvSource {
    /// In-tree `spec.rbd` (clusters before Kubernetes 1.31, or with the out-of-tree plugin).
    InTree,
    /// `spec.csi` with our CSI driver.
    Csi,
}

impl PvSource {
    pub fn parse(value: &str) -> Option<PvSource> {
        match value.to_ascii_lowercase().as_str() {
            "rbd" | "intree" | "in-tree" => Some(PvSource::InTree),
            "csi" => Some(PvSource::Csi),
            _ => None,
        }
    }
}

/// Parsed class parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameters {
    /// Monitor addresses as given (`host:port`); empty when the class names `clusterID`.
    pub monitors: Vec<String>,
    /// The cluster of the cluster config (`--cluster-config`) the class names instead of
    /// `monitors`; its monitors are looked up at use time.
    pub cluster_id: Option<String>,
    /// `topologyConstrainedPools`: per-domain pools, chosen from the selected node's labels.
    pub topology_pools: Option<Vec<ConstrainedPool>>,
    /// `radosNamespace`: the RADOS namespace of the pool the images go to (CSI PVs only). `None`:
    /// the cluster config's default for a `clusterID` class, else the pool's default namespace.
    pub rados_namespace: Option<String>,
    pub admin_id: String,
    pub admin_secret_name: String,
    pub admin_secret_namespace: String,
    pub pool: String,
    pub data_pool: Option<String>,
    pub user_id: String,
    pub user_secret_name: Option<String>,
    /// `None` means the claim's namespace (as the old provisioner did).
    pub user_secret_namespace: Option<String>,
    pub fs_type: Option<String>,
    pub image_format: u8,
    pub image_features: Features,
    pub object_size: Option<u64>,
    pub stripe_unit: Option<u64>,
    pub stripe_count: Option<u64>,
    /// `None`: decided by the provisioner's `--pv-source`.
    pub pv_source: Option<PvSource>,
    /// CSI node mapper (`rbd`, `rbd-nbd`, `fuse`), passed to the node in the volume attributes.
    pub mounter: Option<String>,
    /// ceph-csi's `encrypted`, `encryptionType` and `encryptionKMSID` (CSI PVs only; the
    /// claim's namespace becomes the tenant when the volume is made).
    pub encryption: Option<rbd_volume::encryption::Encryption>,
}

/// A parameter problem; the message names the parameter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("StorageClass parameter {key:?}: {problem}")]
pub struct ParameterError {
    pub key: String,
    pub problem: String,
}

fn err(key: &str, problem: impl Into<String>) -> ParameterError {
    ParameterError {
        key: key.to_string(),
        problem: problem.into(),
    }
}

/// Canonical names of every accepted key (lower-case lookup -> canonical).
const KEYS: &[&str] = &[
    "monitors",
    "clusterID",
    "topologyConstrainedPools",
    "radosNamespace",
    "adminId",
    "adminSecretName",
    "adminSecretNamespace",
    "pool",
    "dataPool",
    "userId",
    "userSecretName",
    "userSecretNamespace",
    "fsType",
    "imageFormat",
    "imageFeatures",
    "objectSize",
    "stripeUnit",
    "stripeCount",
    "pvSource",
    "mounter",
    rbd_volume::encryption::PARAM_ENCRYPTED,
    rbd_volume::encryption::PARAM_TYPE,
    rbd_volume::encryption::PARAM_KMS_ID,
    // ceph-csi / external-provisioner spellings, accepted as aliases
    "csi.storage.k8s.io/fstype",
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/node-stage-secret-name",
    "csi.storage.k8s.io/node-stage-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-name",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
];

/// Aliases: (alias, canonical key it stands for).
const ALIASES: &[(&str, &str)] = &[
    ("csi.storage.k8s.io/fstype", "fsType"),
    (
        "csi.storage.k8s.io/provisioner-secret-name",
        "adminSecretName",
    ),
    (
        "csi.storage.k8s.io/provisioner-secret-namespace",
        "adminSecretNamespace",
    ),
    (
        "csi.storage.k8s.io/controller-expand-secret-name",
        "adminSecretName",
    ),
    (
        "csi.storage.k8s.io/controller-expand-secret-namespace",
        "adminSecretNamespace",
    ),
    (
        "csi.storage.k8s.io/node-stage-secret-name",
        "userSecretName",
    ),
    (
        "csi.storage.k8s.io/node-stage-secret-namespace",
        "userSecretNamespace",
    ),
];

/// Whether `key` is a StorageClass parameter of ours (any case, aliases included).
#[must_use]
pub fn is_known(key: &str) -> bool {
    KEYS.iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// Normalises keys: case-insensitive, aliases folded into their canonical key (a conflicting
/// value between a key and its alias is an error), unknown keys refused.
fn normalise(
    raw: &BTreeMap<String, String>,
) -> Result<BTreeMap<&'static str, (String, String)>, ParameterError> {
    let mut out: BTreeMap<&'static str, (String, String)> = BTreeMap::new();
    for (key, value) in raw {
        let Some(known) = KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)) else {
            return Err(err(
                key,
                format!("unknown parameter; supported: {}", KEYS.join(", ")),
            ));
        };
        let canonical = ALIASES
            .iter()
            .find(|(alias, _)| alias == known)
            .map_or(*known, |(_, canonical)| *canonical);
        if let Some((first_key, first_value)) = out.get(canonical) {
            if first_value != value {
                return Err(err(
                    key,
                    format!(
                        "conflicts with {first_key:?} (both set the {canonical} value, differently)"
                    ),
                ));
            }
            continue;
        }
        out.insert(canonical, (key.clone(), value.clone()));
    }
    Ok(out)
}

/// Parses a byte size: a plain number of bytes or a Kubernetes quantity (`4Mi`, `64Ki`).
fn parse_size(key: &str, value: &str) -> Result<u64, ParameterError> {
    provisioner::quantity::parse_bytes(value.trim())
        .filter(|v| *v > 0)
        .ok_or_else(|| {
            err(
                key,
                format!("{value:?} is not a positive size (bytes, or a quantity such as 4Mi)"),
            )
        })
}

/// Splits and checks a monitor list: `host[:port]` entries separated by commas.
pub fn parse_monitors(value: &str) -> Result<Vec<String>, ParameterError> {
    let mut monitors = Vec::new();
    for entry in value.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(err("monitors", format!("{value:?} has an empty entry")));
        }
        let (host, port) = match entry.rsplit_once(':') {
            // a bare IPv6 address has colons but no port
            Some((h, p)) if !h.contains(':') || h.starts_with('[') => (h, Some(p)),
            _ => (entry, None),
        };
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(err(
                "monitors",
                format!("{entry:?} is not a host[:port] address"),
            ));
        }
        if let Some(port) = port
            && port.parse::<u16>().map_or(true, |p| p == 0)
        {
            return Err(err(
                "monitors",
                format!("{entry:?} has an invalid port {port:?}"),
            ));
        }
        monitors.push(entry.to_string());
    }
    Ok(monitors)
}

/// The encryption parameters, read by the volume core's rules (ceph-csi's): `None` for an
/// unencrypted class.
fn encryption(
    p: &BTreeMap<&'static str, (String, String)>,
) -> Result<Option<rbd_volume::encryption::Encryption>, ParameterError> {
    use rbd_volume::encryption::{EncryptionError, PARAM_ENCRYPTED, PARAM_KMS_ID, PARAM_TYPE};
    let given: std::collections::HashMap<String, String> =
        [PARAM_ENCRYPTED, PARAM_TYPE, PARAM_KMS_ID]
            .into_iter()
            .filter_map(|k| p.get(k).map(|(_, v)| (k.to_owned(), v.clone())))
            .collect();
    rbd_volume::encryption::parameters(&given).map_err(|e| match e {
        EncryptionError::Parameter { field, problem } => {
            let key = p
                .get(field.as_str())
                .map_or(field.clone(), |(k, _)| k.clone());
            err(&key, problem)
        }
        other => err(PARAM_ENCRYPTED, other.to_string()),
    })
}

impl Parameters {
    /// Parses a class's `parameters` map.
    pub fn parse(raw: &BTreeMap<String, String>) -> Result<Parameters, ParameterError> {
        let p = normalise(raw)?;
        let get = |k: &str| p.get(k).map(|(_, v)| v.trim().to_string());
        let key_of = |k: &'static str| p.get(k).map_or(k.to_string(), |(orig, _)| orig.clone());
        let non_empty = |k: &str| get(k).filter(|v| !v.is_empty());

        let (monitors, cluster_id) = match (get("monitors"), p.get("clusterID")) {
            (Some(v), None) if !v.is_empty() => (parse_monitors(&v)?, None),
            (None | Some(_), None) => {
                return Err(err(
                    "monitors",
                    "is required (a comma-separated host:port list), or \"clusterID\" naming a \
                     cluster of the provisioner's --cluster-config",
                ));
            }
            (monitors, Some((id_key, id))) => {
                if monitors.is_some_and(|m| !m.is_empty()) {
                    return Err(err(
                        id_key,
                        "give either \"monitors\" or \"clusterID\", not both (clusterID looks \
                         the monitors up in the provisioner's --cluster-config)",
                    ));
                }
                match rbd_volume::clusters::cluster_ref(None, Some(id.as_str())) {
                    Ok(rbd_volume::clusters::ClusterRef::Named(name)) => (Vec::new(), Some(name)),
                    Ok(rbd_volume::clusters::ClusterRef::Monitors(_)) => {
                        return Err(err(id_key, "is empty"));
                    }
                    Err(problem) => return Err(err(id_key, problem)),
                }
            }
        };
        let topology_pools = get(rbd_volume::topology::PARAMETER)
            .map(|v| {
                rbd_volume::topology::parse_constrained_pools(&v)
                    .map_err(|e| err(&key_of(rbd_volume::topology::PARAMETER), e))
            })
            .transpose()?;
        let rados_namespace = non_empty("radosNamespace");
        if let Some(ns) = &rados_namespace
            && ns
                .chars()
                .any(|c| c == '/' || c == ',' || c == '@' || c.is_whitespace())
        {
            return Err(err(
                &key_of("radosNamespace"),
                format!("{ns:?} may not contain '/', ',', '@' or whitespace"),
            ));
        }
        let admin_id = non_empty("adminId").unwrap_or_else(|| "admin".into());
        let Some(admin_secret_name) = non_empty("adminSecretName") else {
            return Err(err(
                &key_of("adminSecretName"),
                "is required (the secret holding the admin key)",
            ));
        };
        let admin_secret_namespace =
            non_empty("adminSecretNamespace").unwrap_or_else(|| "default".into());
        let pool = non_empty("pool").unwrap_or_else(|| "rbd".into());
        let user_id = non_empty("userId").unwrap_or_else(|| admin_id.clone());
        let user_secret_name = match get("userSecretName") {
            Some(v) if v.is_empty() => {
                return Err(err(&key_of("userSecretName"), "is set but empty"));
            }
            other => other,
        };
        let image_format = match get("imageFormat").as_deref() {
            None | Some("" | "2") => 2,
            Some("1") => 1,
            Some(other) => {
                return Err(err(
                    &key_of("imageFormat"),
                    format!("{other:?} is not 1 or 2"),
                ));
            }
        };
        let features_text = get("imageFeatures");
        let image_features = match features_text.as_deref() {
            None => Features::parse(DEFAULT_FEATURES)
                .map_err(|e| err("imageFeatures", e.to_string()))?,
            Some(list) => Features::parse(list).map_err(|e| {
                let reason = match e {
                    ceph_rbd::Error::InvalidArgument { reason, .. } => reason,
                    other => other.to_string(),
                };
                err(&key_of("imageFeatures"), reason)
            })?,
        };
        if image_format == 1
            && features_text
                .as_deref()
                .is_some_and(|f| !f.trim().is_empty())
        {
            return Err(err(
                &key_of("imageFeatures"),
                "image format 1 has no features; remove imageFeatures or use imageFormat 2",
            ));
        }
        let size = |k: &'static str| get(k).map(|v| parse_size(&key_of(k), &v)).transpose();
        let object_size = size("objectSize")?;
        if let Some(s) = object_size
            && (!s.is_power_of_two() || !(4096..=(32 << 20)).contains(&s))
        {
            return Err(err(
                &key_of("objectSize"),
                format!("{s} must be a power of two between 4Ki and 32Mi"),
            ));
        }
        let stripe_unit = size("stripeUnit")?;
        let stripe_count = get("stripeCount")
            .map(|v| {
                v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    err(
                        &key_of("stripeCount"),
                        format!("{v:?} is not a positive integer"),
                    )
                })
            })
            .transpose()?;
        if stripe_unit.is_some() != stripe_count.is_some() {
            return Err(err(
                "stripeUnit",
                "stripeUnit and stripeCount must be set together",
            ));
        }
        let pv_source = get("pvSource")
            .map(|v| {
                PvSource::parse(&v).ok_or_else(|| {
                    err(
                        &key_of("pvSource"),
                        format!("{v:?} is not \"csi\" or \"rbd\""),
                    )
                })
            })
            .transpose()?;
        let mounter = non_empty("mounter");
        if let Some(m) = &mounter
            && !matches!(m.as_str(), "rbd" | "krbd" | "rbd-nbd" | "nbd" | "fuse")
        {
            return Err(err(
                &key_of("mounter"),
                format!("{m:?} is not one of rbd, rbd-nbd, fuse"),
            ));
        }
        let encryption = encryption(&p)?;
        if encryption.is_some() && mounter.as_deref() == Some("fuse") {
            return Err(err(
                &key_of("mounter"),
                "\"fuse\" cannot mount encrypted volumes (it has no block device for dm-crypt); \
                 use rbd (the default) or rbd-nbd",
            ));
        }
        Ok(Parameters {
            monitors,
            cluster_id,
            topology_pools,
            rados_namespace,
            admin_id,
            admin_secret_name,
            admin_secret_namespace,
            pool,
            data_pool: non_empty("dataPool"),
            user_id,
            user_secret_name,
            user_secret_namespace: non_empty("userSecretNamespace"),
            fs_type: non_empty("fsType"),
            image_format,
            image_features: if image_format == 1 {
                Features::empty()
            } else {
                image_features
            },
            object_size,
            stripe_unit,
            stripe_count,
            pv_source,
            mounter,
            encryption,
        })
    }

    /// The monitors as one comma-separated string (what librados and CSI attributes take).
    pub fn monitors_string(&self) -> String {
        self.monitors.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn minimal() -> Vec<(&'static str, &'static str)> {
        vec![
            ("monitors", "10.0.0.1:6789,10.0.0.2:6789"),
            ("adminSecretName", "ceph-admin"),
        ]
    }

    #[test]
    fn a_class_written_for_the_old_provisioner_gets_its_defaults() {
        let p = Parameters::parse(&map(&minimal())).unwrap();
        assert_eq!(p.monitors, vec!["10.0.0.1:6789", "10.0.0.2:6789"]);
        assert_eq!(p.admin_id, "admin");
        assert_eq!(p.admin_secret_namespace, "default");
        assert_eq!(p.pool, "rbd");
        assert_eq!(p.user_id, "admin");
        assert_eq!(p.user_secret_name, None);
        assert_eq!(p.user_secret_namespace, None);
        assert_eq!(p.image_format, 2);
        assert_eq!(p.image_features.to_string(), DEFAULT_FEATURES);
        assert_eq!(p.pv_source, None);
    }

    #[test]
    fn the_old_examples_full_class_parses_unchanged() {
        let p = Parameters::parse(&map(&[
            ("monitors", "172.24.0.6:6789"),
            ("pool", "kube"),
            ("adminId", "admin"),
            ("adminSecretNamespace", "kube-system"),
            ("adminSecretName", "ceph-admin-secret"),
            ("userId", "kube"),
            ("userSecretNamespace", "kube-system"),
            ("userSecretName", "ceph-secret"),
            ("fsType", "ext4"),
            ("imageFormat", "2"),
            ("imageFeatures", "layering"),
        ]))
        .unwrap();
        assert_eq!(p.pool, "kube");
        assert_eq!(p.user_id, "kube");
        assert_eq!(p.user_secret_name.as_deref(), Some("ceph-secret"));
        assert_eq!(p.user_secret_namespace.as_deref(), Some("kube-system"));
        assert_eq!(p.fs_type.as_deref(), Some("ext4"));
        assert_eq!(p.image_features, Features::LAYERING);
    }

    #[test]
    fn keys_are_case_insensitive_and_empty_values_take_defaults() {
        let p = Parameters::parse(&map(&[
            ("MONITORS", "m1:6789"),
            ("adminsecretname", "s"),
            ("AdminId", ""),
            ("POOL", ""),
        ]))
        .unwrap();
        assert_eq!(p.admin_id, "admin");
        assert_eq!(p.pool, "rbd");
    }

    #[test]
    fn encryption_parameters_are_read_as_ceph_csi_names_them_in_any_case() {
        let mut m = map(&minimal());
        m.insert("Encrypted".into(), "true".into());
        m.insert("encryptionkmsid".into(), "vault-less".into());
        let p = Parameters::parse(&m).unwrap();
        assert_eq!(
            p.encryption,
            Some(rbd_volume::encryption::Encryption {
                kms_id: "vault-less".into(),
                tenant: None,
            })
        );
        assert_eq!(
            Parameters::parse(&map(&minimal())).unwrap().encryption,
            None
        );
    }

    #[test]
    fn bad_encryption_parameters_are_named_as_the_class_spells_them() {
        for (extra, key, problem) in [
            (
                vec![("ENCRYPTED", "yes")],
                "ENCRYPTED",
                "is not \"true\" or \"false\"",
            ),
            (
                vec![("encrypted", "true")],
                "encryptionKMSID",
                "is required",
            ),
            (
                vec![
                    ("encrypted", "true"),
                    ("encryptionKMSID", "k"),
                    ("encryptionType", "file"),
                ],
                "encryptionType",
                "fscrypt",
            ),
            (
                vec![
                    ("encrypted", "true"),
                    ("encryptionKMSID", "k"),
                    ("mounter", "fuse"),
                ],
                "mounter",
                "cannot mount encrypted volumes",
            ),
        ] {
            let mut m = map(&minimal());
            m.extend(map(&extra));
            let e = Parameters::parse(&m).unwrap_err();
            assert_eq!(e.key, key, "{e}");
            assert!(e.problem.contains(problem), "{e}");
        }
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let mut m = map(&minimal());
        m.insert("imageFeaturez".into(), "layering".into());
        let e = Parameters::parse(&m).unwrap_err();
        assert_eq!(e.key, "imageFeaturez");
        assert!(
            e.to_string()
                .starts_with("StorageClass parameter \"imageFeaturez\": unknown parameter"),
            "{e}"
        );
    }

    #[test]
    fn required_parameters_are_named_when_missing() {
        let e = Parameters::parse(&map(&[("adminSecretName", "s")])).unwrap_err();
        assert_eq!(e.key, "monitors");
        let e = Parameters::parse(&map(&[("monitors", "m:1")])).unwrap_err();
        assert_eq!(e.key, "adminSecretName");
        let mut m = map(&minimal());
        m.insert("userSecretName".into(), String::new());
        assert_eq!(
            Parameters::parse(&m).unwrap_err().to_string(),
            "StorageClass parameter \"userSecretName\": is set but empty"
        );
    }

    #[test]
    fn monitors_are_validated() {
        assert_eq!(parse_monitors("a:1, b").unwrap(), vec!["a:1", "b"]);
        assert!(parse_monitors("a:1,,b:2").is_err());
        assert!(
            parse_monitors("a:notaport")
                .unwrap_err()
                .problem
                .contains("invalid port")
        );
        assert!(parse_monitors("a:0").is_err());
        assert!(parse_monitors("[::1]:6789").is_ok());
        assert!(parse_monitors("host with space:1").is_err());
    }

    #[test]
    fn image_features_are_validated_with_their_dependencies() {
        let mut m = map(&minimal());
        m.insert("imageFeatures".into(), "layering,fast-diff".into());
        let e = Parameters::parse(&m).unwrap_err();
        assert_eq!(
            e.to_string(),
            "StorageClass parameter \"imageFeatures\": fast-diff requires object-map"
        );
        m.insert(
            "imageFeatures".into(),
            "layering,exclusive-lock,object-map,fast-diff,deep-flatten,journaling".into(),
        );
        assert_eq!(
            Parameters::parse(&m).unwrap().image_features.bits(),
            1 | 4 | 8 | 16 | 32 | 64
        );
        m.insert("imageFeatures".into(), "layring".into());
        assert!(
            Parameters::parse(&m)
                .unwrap_err()
                .problem
                .contains("unknown feature \"layring\"")
        );
    }

    #[test]
    fn image_format_is_one_or_two() {
        let mut m = map(&minimal());
        m.insert("imageFormat".into(), "3".into());
        assert_eq!(Parameters::parse(&m).unwrap_err().key, "imageFormat");
        m.insert("imageFormat".into(), "1".into());
        assert_eq!(
            Parameters::parse(&m).unwrap().image_features,
            Features::empty()
        );
        m.insert("imageFeatures".into(), "layering".into());
        assert_eq!(Parameters::parse(&m).unwrap_err().key, "imageFeatures");
    }

    #[test]
    fn extensions_parse_sizes_sources_and_aliases() {
        let mut m = map(&minimal());
        m.insert("dataPool".into(), "ec-data".into());
        m.insert("objectSize".into(), "1Mi".into());
        m.insert("stripeUnit".into(), "65536".into());
        m.insert("stripeCount".into(), "4".into());
        m.insert("pvSource".into(), "CSI".into());
        m.insert("csi.storage.k8s.io/fstype".into(), "xfs".into());
        m.insert("mounter".into(), "fuse".into());
        let p = Parameters::parse(&m).unwrap();
        assert_eq!(p.data_pool.as_deref(), Some("ec-data"));
        assert_eq!(
            (p.object_size, p.stripe_unit, p.stripe_count),
            (Some(1 << 20), Some(65536), Some(4))
        );
        assert_eq!(p.pv_source, Some(PvSource::Csi));
        assert_eq!(p.fs_type.as_deref(), Some("xfs"));
        assert_eq!(p.mounter.as_deref(), Some("fuse"));

        m.insert("objectSize".into(), "3000".into());
        assert_eq!(Parameters::parse(&m).unwrap_err().key, "objectSize");
        m.insert("objectSize".into(), "4Mi".into());
        m.remove("stripeCount");
        assert!(
            Parameters::parse(&m)
                .unwrap_err()
                .problem
                .contains("set together")
        );
    }

    #[test]
    fn cluster_id_replaces_monitors_and_exactly_one_is_given() {
        let named = map(&[("clusterID", " site-a "), ("adminSecretName", "s")]);
        let p = Parameters::parse(&named).unwrap();
        assert_eq!(p.cluster_id.as_deref(), Some("site-a"));
        assert!(p.monitors.is_empty());
        let mut both = named.clone();
        both.insert("monitors".into(), "m:1".into());
        let e = Parameters::parse(&both).unwrap_err().to_string();
        assert!(
            e.contains("\"monitors\"") && e.contains("\"clusterID\""),
            "{e}"
        );
        let e = Parameters::parse(&map(&[("adminSecretName", "s")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("monitors") && e.contains("clusterID"), "{e}");
        for bad in ["", "a/b"] {
            let m = map(&[("clusterID", bad), ("adminSecretName", "s")]);
            assert_eq!(
                Parameters::parse(&m).unwrap_err().key,
                "clusterID",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn namespaces_and_topology_pools_are_checked() {
        let mut m = map(&minimal());
        m.insert("radosNamespace".into(), "tenant-1".into());
        m.insert(
            "topologyConstrainedPools".into(),
            r#"[{"poolName": "p-a", "domainSegments": [{"domainLabel": "zone", "value": "a"}]}]"#
                .into(),
        );
        let p = Parameters::parse(&m).unwrap();
        assert_eq!(p.rados_namespace.as_deref(), Some("tenant-1"));
        assert_eq!(p.topology_pools.unwrap()[0].pool, "p-a");
        m.insert("radosNamespace".into(), "a/b".into());
        assert_eq!(Parameters::parse(&m).unwrap_err().key, "radosNamespace");
        m.remove("radosNamespace");
        m.insert("topologyConstrainedPools".into(), "[{".into());
        assert_eq!(
            Parameters::parse(&m).unwrap_err().key,
            "topologyConstrainedPools"
        );
    }

    #[test]
    fn an_alias_conflicting_with_its_key_is_an_error() {
        let mut m = map(&minimal());
        m.insert("fsType".into(), "ext4".into());
        m.insert("csi.storage.k8s.io/fstype".into(), "xfs".into());
        let e = Parameters::parse(&m).unwrap_err();
        assert!(e.problem.contains("conflicts with"), "{e}");
        m.insert("csi.storage.k8s.io/fstype".into(), "ext4".into());
        assert!(Parameters::parse(&m).is_ok());
    }
}
