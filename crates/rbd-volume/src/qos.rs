//! Per-volume QoS limits: librbd's `rbd_qos_*` options, set as image configuration.
//!
//! The user-facing keys (a VolumeAttributesClass's `parameters`, CSI `mutable_parameters`) are
//! the librbd option names themselves, so what an operator writes is what `rbd config image
//! get` shows and what Ceph's documentation describes. Ceph 16.2 (Pacific) has 18 such
//! per-image options ([`OPTIONS`]); `rbd_qos_schedule_tick_min` is a scheduler tuning knob,
//! not a limit, and is not accepted.
//!
//! | key | unit | `0` |
//! |---|---|---|
//! | `rbd_qos_{,read_,write_}iops_limit` | I/O operations per second | no limit |
//! | `rbd_qos_{,read_,write_}bps_limit` | bytes per second | no limit |
//! | `rbd_qos_{,read_,write_}{iops,bps}_burst` | operations / bytes per second during a burst | no burst above the limit |
//! | `rbd_qos_{,read_,write_}{iops,bps}_burst_seconds` | seconds a burst may last | not allowed (librbd's minimum is 1) |
//!
//! Values are whole, non-negative numbers written as Kubernetes quantities: `1000`, `1k`,
//! `1e3`, `100Mi` (= 104857600) are accepted; `1.5`, `100m`, `-1` are not. They are stored as
//! plain decimal integers, below 2^63-1 (Kubernetes quantities are int64).
//!
//! # Where the limits apply
//! [`apply`] writes image metadata `conf_<option>` (what `rbd config image set` does). librbd
//! reads it when it opens the image and again when the header changes, so **librbd-based
//! mappings enforce the limits** (rbd-nbd, rbd-fuse, QEMU), including images already open.
//! **krbd (the kernel's `rbd map`) does not read librbd configuration and does not enforce
//! them.**
//!
//! # Semantics
//! Only keys that are given change (the CSI rule for `ControllerModifyVolume`: "SPs MUST NOT
//! modify volumes based on the absence of keys"); `0` removes a limit. [`apply`] is idempotent:
//! keys whose stored value is already the wanted one are not written. A burst must not be below
//! its limit (librbd's token bucket refuses such a pair); this is checked on the image's whole
//! resulting configuration, so a new limit above a burst stored earlier is refused too.

use std::collections::BTreeMap;

use ceph_rbd::Cluster;

/// Image-metadata key prefix of librbd's per-image configuration overrides.
pub const CONF_PREFIX: &str = "conf_";

/// What a QoS option's value counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Operations per second.
    Iops,
    /// Bytes per second.
    Bps,
    /// Seconds a burst may last (at least 1).
    Seconds,
}

/// Every accepted key (librbd 16.2's per-image QoS options) and its unit.
pub const OPTIONS: [(&str, Unit); 18] = [
    ("rbd_qos_iops_limit", Unit::Iops),
    ("rbd_qos_read_iops_limit", Unit::Iops),
    ("rbd_qos_write_iops_limit", Unit::Iops),
    ("rbd_qos_bps_limit", Unit::Bps),
    ("rbd_qos_read_bps_limit", Unit::Bps),
    ("rbd_qos_write_bps_limit", Unit::Bps),
    ("rbd_qos_iops_burst", Unit::Iops),
    ("rbd_qos_read_iops_burst", Unit::Iops),
    ("rbd_qos_write_iops_burst", Unit::Iops),
    ("rbd_qos_bps_burst", Unit::Bps),
    ("rbd_qos_read_bps_burst", Unit::Bps),
    ("rbd_qos_write_bps_burst", Unit::Bps),
    ("rbd_qos_iops_burst_seconds", Unit::Seconds),
    ("rbd_qos_read_iops_burst_seconds", Unit::Seconds),
    ("rbd_qos_write_iops_burst_seconds", Unit::Seconds),
    ("rbd_qos_bps_burst_seconds", Unit::Seconds),
    ("rbd_qos_read_bps_burst_seconds", Unit::Seconds),
    ("rbd_qos_write_bps_burst_seconds", Unit::Seconds),
];

/// Why QoS parameters were refused or could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum QosError {
    /// A key that is not one of [`OPTIONS`].
    #[error(
        "unknown QoS parameter {key:?}; accepted: rbd_qos_{{,read_,write_}}{{iops,bps}}_{{limit,burst,burst_seconds}}"
    )]
    UnknownKey { key: String },
    /// A value that is not a whole number in range for its key.
    #[error("QoS parameter {key}={value:?}: {problem}")]
    InvalidValue {
        key: String,
        value: String,
        problem: &'static str,
    },
    /// A burst below its limit (in the image's resulting configuration).
    #[error(
        "QoS parameter {burst}={burst_value} is below {limit}={limit_value}; a burst must be 0 or at least its limit"
    )]
    BurstBelowLimit {
        burst: &'static str,
        burst_value: u64,
        limit: &'static str,
        limit_value: u64,
    },
    /// A Ceph call failed.
    #[error(transparent)]
    Ceph(#[from] ceph_rbd::Error),
}

impl QosError {
    /// Whether the parameters themselves are wrong (retrying them cannot succeed): the CSI
    /// `INVALID_ARGUMENT` / Kubernetes "Infeasible" case. Ceph errors are not.
    #[must_use]
    pub fn is_invalid(&self) -> bool {
        !matches!(self, QosError::Ceph(_))
    }
}

/// Validated QoS settings: option name -> value. Only the options given are present.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qos(BTreeMap<&'static str, u64>);

impl Qos {
    /// The settings, by option name.
    #[must_use]
    pub fn options(&self) -> &BTreeMap<&'static str, u64> {
        &self.0
    }

    /// One option's value, when set.
    #[must_use]
    pub fn get(&self, option: &str) -> Option<u64> {
        self.0.get(option).copied()
    }

    /// Whether no option is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refuses a burst below its limit (both non-zero).
    ///
    /// # Errors
    /// [`QosError::BurstBelowLimit`] naming both keys.
    pub fn check(&self) -> Result<(), QosError> {
        for (burst, _) in OPTIONS.iter().filter(|(name, _)| name.ends_with("_burst")) {
            let Some(limit) = OPTIONS
                .iter()
                .map(|(name, _)| *name)
                .find(|name| name.strip_suffix("_limit") == burst.strip_suffix("_burst"))
            else {
                continue;
            };
            let (b, l) = (self.get(burst).unwrap_or(0), self.get(limit).unwrap_or(0));
            if b != 0 && l != 0 && b < l {
                return Err(QosError::BurstBelowLimit {
                    burst,
                    burst_value: b,
                    limit,
                    limit_value: l,
                });
            }
        }
        Ok(())
    }
}

/// The accepted option of that name.
fn option(key: &str) -> Option<(&'static str, Unit)> {
    OPTIONS.iter().copied().find(|(name, _)| *name == key)
}

/// Parses one value: a whole, non-negative Kubernetes quantity.
fn parse_value(key: &str, unit: Unit, value: &str) -> Result<u64, QosError> {
    let invalid = |problem| QosError::InvalidValue {
        key: key.to_owned(),
        value: value.to_owned(),
        problem,
    };
    let quantity = kube_quantity::parse(value.trim())
        .map_err(|_| invalid("not a number or Kubernetes quantity (e.g. 1000, 10k, 100Mi)"))?;
    if quantity.is_negative() {
        return Err(invalid("must not be negative"));
    }
    // Kubernetes quantities are int64s: the API server (and our parser) caps larger values
    // at 2^63-1, so that value may stand for a larger one and is refused too.
    let whole = quantity
        .to_u64_ceil()
        .filter(|v| i64::try_from(*v).is_ok_and(|v| v < i64::MAX))
        .ok_or_else(|| invalid("too large (must be below 2^63-1)"))?;
    if kube_quantity::Quantity::from_bytes(whole) != quantity {
        return Err(invalid("must be a whole number"));
    }
    if unit == Unit::Seconds && whole == 0 {
        return Err(invalid("must be at least 1 (seconds)"));
    }
    Ok(whole)
}

/// Parses and validates user-facing QoS parameters. Keys are checked in sorted order, so the
/// error names the same key whatever the map's iteration order.
///
/// # Errors
/// [`QosError::UnknownKey`], [`QosError::InvalidValue`] or [`QosError::BurstBelowLimit`],
/// each naming the key.
pub fn parse<K, V>(params: impl IntoIterator<Item = (K, V)>) -> Result<Qos, QosError>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    let sorted: BTreeMap<String, String> = params
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
        .collect();
    let mut qos = Qos::default();
    for (key, value) in &sorted {
        let (name, unit) = option(key).ok_or_else(|| QosError::UnknownKey { key: key.clone() })?;
        qos.0.insert(name, parse_value(name, unit, value)?);
    }
    qos.check()?;
    Ok(qos)
}

/// The QoS settings stored on an image (its `conf_rbd_qos_*` metadata), as librbd will read
/// them. Values that do not parse are left out (librbd would refuse them too).
fn from_metadata(meta: &BTreeMap<String, String>) -> Qos {
    let mut qos = Qos::default();
    for (key, value) in meta {
        let Some(key) = key.strip_prefix(CONF_PREFIX) else {
            continue;
        };
        if let Some((name, unit)) = option(key)
            && let Ok(v) = parse_value(name, unit, value)
        {
            qos.0.insert(name, v);
        }
    }
    qos
}

/// The image's QoS settings (image-level configuration only; pool and client defaults are not
/// included).
///
/// # Errors
/// Ceph errors (`NotFound` for a missing image).
pub async fn read(cluster: &Cluster, pool: &str, image: &str) -> Result<Qos, QosError> {
    Ok(from_metadata(&cluster.metadata_list(pool, image).await?))
}

/// What [`apply`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The options written (their stored value differed), with their new value.
    pub changed: BTreeMap<&'static str, u64>,
    /// The image's QoS settings afterwards.
    pub now: Qos,
}

/// Sets `qos` as the image's configuration (metadata `conf_<option>`, one image open for all
/// keys). Options not in `qos` are left as they are. Idempotent: nothing is written when every
/// value is already stored.
///
/// Enforced by librbd-based mappings (rbd-nbd, rbd-fuse), also on images they have open; krbd
/// does not enforce these limits.
///
/// # Errors
/// [`QosError::BurstBelowLimit`] when the image's resulting settings pair a burst with a higher
/// limit (nothing is written then); Ceph errors (`NotFound` for a missing image).
pub async fn apply(
    cluster: &Cluster,
    pool: &str,
    image: &str,
    qos: &Qos,
) -> Result<Applied, QosError> {
    let current = read(cluster, pool, image).await?;
    let mut now = current.clone();
    let mut changed = BTreeMap::new();
    for (&name, &value) in qos.options() {
        if current.get(name) != Some(value) {
            changed.insert(name, value);
            now.0.insert(name, value);
        }
    }
    now.check()?;
    if !changed.is_empty() {
        let entries = changed
            .iter()
            .map(|(name, value)| (format!("{CONF_PREFIX}{name}"), value.to_string()))
            .collect();
        cluster
            .metadata_set_many(pool, image, entries, None)
            .await?;
        tracing::info!(pool, image, changed = ?changed, "QoS limits set");
    }
    Ok(Applied { changed, now })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(pairs: &[(&str, &str)]) -> Result<Qos, QosError> {
        parse(pairs.iter().copied())
    }

    #[test]
    fn accepts_every_librbd_option_with_plain_and_quantity_values() {
        let qos = parsed(&[
            ("rbd_qos_iops_limit", "1000"),
            ("rbd_qos_bps_limit", "100Mi"),
            ("rbd_qos_read_iops_limit", "2k"),
            ("rbd_qos_write_bps_burst", "1e9"),
            ("rbd_qos_iops_burst_seconds", "5"),
        ])
        .unwrap();
        assert_eq!(qos.get("rbd_qos_iops_limit"), Some(1000));
        assert_eq!(qos.get("rbd_qos_bps_limit"), Some(100 << 20));
        assert_eq!(qos.get("rbd_qos_read_iops_limit"), Some(2000));
        assert_eq!(qos.get("rbd_qos_write_bps_burst"), Some(1_000_000_000));
        assert_eq!(qos.get("rbd_qos_iops_burst_seconds"), Some(5));
        assert_eq!(qos.options().len(), 5);
        for (name, _) in OPTIONS {
            assert!(parsed(&[(name, "1")]).is_ok(), "{name}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parsed(&[("rbd_qos_iops_limit", "1"), ("iops", "5")]).unwrap_err();
        assert!(matches!(&err, QosError::UnknownKey { key } if key == "iops"));
        assert!(err.to_string().contains("\"iops\""), "{err}");
        assert!(err.is_invalid());
        let err = parsed(&[("rbd_qos_schedule_tick_min", "50")]).unwrap_err();
        assert!(
            err.to_string().contains("rbd_qos_schedule_tick_min"),
            "{err}"
        );
    }

    #[test]
    fn bad_values_name_the_key_and_the_problem() {
        for (value, problem) in [
            ("fast", "not a number"),
            ("-1", "negative"),
            ("1.5", "whole"),
            ("100m", "whole"),
            ("20Ei", "too large"),
        ] {
            let err = parsed(&[("rbd_qos_bps_limit", value)]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("rbd_qos_bps_limit"), "{text}");
            assert!(text.contains(problem), "{value}: {text}");
        }
        let err = parsed(&[("rbd_qos_bps_burst_seconds", "0")]).unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
    }

    #[test]
    fn zero_means_no_limit_and_is_accepted() {
        let qos = parsed(&[("rbd_qos_iops_limit", "0"), ("rbd_qos_iops_burst", "0")]).unwrap();
        assert_eq!(qos.get("rbd_qos_iops_limit"), Some(0));
    }

    #[test]
    fn burst_below_its_limit_is_refused_naming_both_keys() {
        let err =
            parsed(&[("rbd_qos_iops_limit", "100"), ("rbd_qos_iops_burst", "50")]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("rbd_qos_iops_burst=50"), "{text}");
        assert!(text.contains("rbd_qos_iops_limit=100"), "{text}");
        assert!(parsed(&[("rbd_qos_iops_limit", "100"), ("rbd_qos_iops_burst", "100")]).is_ok());
        // Different families do not constrain each other.
        assert!(
            parsed(&[
                ("rbd_qos_read_iops_limit", "100"),
                ("rbd_qos_iops_burst", "5")
            ])
            .is_ok()
        );
    }

    #[test]
    fn metadata_is_read_back_ignoring_other_keys() {
        let meta: BTreeMap<String, String> = [
            ("conf_rbd_qos_iops_limit", "10"),
            ("conf_rbd_cache", "false"),
            ("provisioner.ceph.com/pv", "pv"),
            ("rbd_qos_bps_limit", "5"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let qos = from_metadata(&meta);
        assert_eq!(qos.options().len(), 1);
        assert_eq!(qos.get("rbd_qos_iops_limit"), Some(10));
    }
}
