//! Topology-aware placement: which pool a volume goes to, from where its pod will run.
//!
//! A node's topology is read from node labels the operator names (`--topology-labels
//! topology.kubernetes.io/zone,...`), each reported as a *domain* (the label's name without its
//! prefix: `zone`) and the node's value. A class lists its pools per domain in ceph-csi's
//! `topologyConstrainedPools` format:
//!
//! ```json
//! [{"poolName": "rbd-a", "dataPool": "ec-a", "domainSegments": [{"domainLabel": "zone", "value": "a"}]},
//!  {"poolName": "rbd-b", "domainSegments": [{"domainLabel": "zone", "value": "b"}]}]
//! ```
//!
//! (`dataPool` is the key ceph-csi reads; `dataPoolName` is accepted as well.) A pool fits a
//! topology when every one of its segments is present there with the same value; the first
//! fitting pool wins, trying the preferred topologies first, then the requisite ones, as ceph-csi
//! does.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The class parameter naming the per-domain pools.
pub const PARAMETER: &str = "topologyConstrainedPools";

/// One pool and the domain values it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstrainedPool {
    pub pool: String,
    pub data_pool: Option<String>,
    /// Domain (`zone`) to value (`a`); all must match.
    pub segments: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    #[serde(rename = "poolName")]
    pool_name: Option<String>,
    #[serde(rename = "dataPool", alias = "dataPoolName")]
    data_pool: Option<String>,
    #[serde(rename = "domainSegments")]
    domain_segments: Option<Vec<RawSegment>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSegment {
    #[serde(rename = "domainLabel")]
    domain_label: Option<String>,
    value: Option<String>,
}

/// Parses `topologyConstrainedPools`.
///
/// # Errors
/// A message naming the parameter, the entry and the field.
pub fn parse_constrained_pools(text: &str) -> Result<Vec<ConstrainedPool>, String> {
    let raw: Vec<RawPool> = serde_json::from_str(text).map_err(|e| {
        format!(
            "{PARAMETER}: not a JSON list of pools ([{{\"poolName\": ..., \"domainSegments\": \
             [{{\"domainLabel\": ..., \"value\": ...}}]}}]): {e}"
        )
    })?;
    if raw.is_empty() {
        return Err(format!("{PARAMETER}: the list is empty"));
    }
    raw.into_iter()
        .enumerate()
        .map(|(index, entry)| {
            let pool = entry
                .pool_name
                .filter(|p| !p.trim().is_empty())
                .ok_or_else(|| format!("{PARAMETER}[{index}]: \"poolName\" is missing or empty"))?;
            let segments_in = entry.domain_segments.unwrap_or_default();
            if segments_in.is_empty() {
                return Err(format!(
                    "{PARAMETER}[{index}] (pool {pool:?}): \"domainSegments\" is missing or empty"
                ));
            }
            let mut segments = BTreeMap::new();
            for (s, segment) in segments_in.into_iter().enumerate() {
                let label = segment.domain_label.filter(|l| !l.trim().is_empty()).ok_or_else(
                    || {
                        format!(
                            "{PARAMETER}[{index}].domainSegments[{s}]: \"domainLabel\" is missing or empty"
                        )
                    },
                )?;
                let value = segment.value.ok_or_else(|| {
                    format!("{PARAMETER}[{index}].domainSegments[{s}]: \"value\" is missing")
                })?;
                if segments.insert(label.clone(), value).is_some() {
                    return Err(format!(
                        "{PARAMETER}[{index}] (pool {pool:?}): domain {label:?} is listed twice"
                    ));
                }
            }
            Ok(ConstrainedPool {
                pool,
                data_pool: entry.data_pool.filter(|d| !d.is_empty()),
                segments,
            })
        })
        .collect()
}

/// The domain a topology key or node label names: its name without the prefix
/// (`topology.kubernetes.io/zone` -> `zone`).
#[must_use]
pub fn domain_of(key: &str) -> &str {
    key.rsplit_once('/').map_or(key, |(_, name)| name)
}

/// Checks `--topology-labels`: label keys, none twice, no two with the same domain.
///
/// # Errors
/// A message naming the offending label.
pub fn parse_topology_labels(text: &str) -> Result<Vec<String>, String> {
    let mut labels: Vec<String> = Vec::new();
    for label in text.split(',').map(str::trim).filter(|l| !l.is_empty()) {
        if domain_of(label).is_empty() {
            return Err(format!("--topology-labels: {label:?} has an empty name"));
        }
        if let Some(clash) = labels.iter().find(|l| domain_of(l) == domain_of(label)) {
            return Err(format!(
                "--topology-labels: {label:?} and {clash:?} both name the domain {:?}",
                domain_of(label)
            ));
        }
        labels.push(label.to_owned());
    }
    Ok(labels)
}

/// A node's topology from its labels: `topology_prefix/<domain>` -> value for each of `labels`.
///
/// # Errors
/// The labels the node lacks, named with the node.
pub fn node_topology(
    node: &str,
    labels: &[String],
    node_labels: &BTreeMap<String, String>,
    topology_prefix: &str,
) -> Result<BTreeMap<String, String>, String> {
    let missing: Vec<&str> = labels
        .iter()
        .filter(|l| !node_labels.contains_key(l.as_str()))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "node {node:?} lacks the topology label(s) {}",
            missing.join(", ")
        ));
    }
    Ok(labels
        .iter()
        .filter_map(|l| {
            node_labels
                .get(l)
                .map(|v| (format!("{topology_prefix}/{}", domain_of(l)), v.clone()))
        })
        .collect())
}

/// The first pool that fits one of `topologies` (each a map of topology keys or label keys to
/// values, in order of preference), with the topology it fits.
#[must_use]
pub fn select_pool<'a, 'b>(
    pools: &'a [ConstrainedPool],
    topologies: &'b [BTreeMap<String, String>],
) -> Option<(&'a ConstrainedPool, &'b BTreeMap<String, String>)> {
    topologies.iter().find_map(|topology| {
        let domains: BTreeMap<&str, &str> = topology
            .iter()
            .map(|(k, v)| (domain_of(k), v.as_str()))
            .collect();
        pools
            .iter()
            .find(|pool| {
                pool.segments
                    .iter()
                    .all(|(domain, value)| domains.get(domain.as_str()) == Some(&value.as_str()))
            })
            .map(|pool| (pool, topology))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOLS: &str = r#"[
      {"poolName": "rbd-a", "dataPool": "ec-a",
       "domainSegments": [{"domainLabel": "zone", "value": "a"}]},
      {"poolName": "rbd-b1", "dataPoolName": "ec-b",
       "domainSegments": [{"domainLabel": "zone", "value": "b"}, {"domainLabel": "rack", "value": "1"}]},
      {"poolName": "rbd-b", "domainSegments": [{"domainLabel": "zone", "value": "b"}]}
    ]"#;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn ceph_csi_pool_lists_parse() {
        let pools = parse_constrained_pools(POOLS).unwrap();
        assert_eq!(pools.len(), 3);
        assert_eq!(pools[0].pool, "rbd-a");
        assert_eq!(pools[0].data_pool.as_deref(), Some("ec-a"));
        assert_eq!(pools[1].data_pool.as_deref(), Some("ec-b"));
        assert_eq!(pools[1].segments, map(&[("rack", "1"), ("zone", "b")]));
        assert_eq!(pools[2].data_pool, None);
    }

    #[test]
    fn the_first_pool_whose_every_segment_fits_wins_preferred_first() {
        let pools = parse_constrained_pools(POOLS).unwrap();
        let b_rack2 = map(&[
            ("topology.rbd.csi.ceph.com/zone", "b"),
            ("topology.rbd.csi.ceph.com/rack", "2"),
        ]);
        let (pool, _) = select_pool(&pools, std::slice::from_ref(&b_rack2)).unwrap();
        assert_eq!(pool.pool, "rbd-b");
        let b_rack1 = map(&[("topology.kubernetes.io/zone", "b"), ("rack", "1")]);
        let (pool, _) = select_pool(&pools, std::slice::from_ref(&b_rack1)).unwrap();
        assert_eq!(pool.pool, "rbd-b1");
        let c = map(&[("topology.kubernetes.io/zone", "c")]);
        assert!(select_pool(&pools, std::slice::from_ref(&c)).is_none());
        let a = map(&[("topology.kubernetes.io/zone", "a")]);
        let both = [c, a.clone()];
        let (pool, topology) = select_pool(&pools, &both).unwrap();
        assert_eq!((pool.pool.as_str(), topology), ("rbd-a", &a));
    }

    #[test]
    fn malformed_pool_lists_name_the_parameter_entry_and_field() {
        for (text, expect) in [
            ("nope", "not a JSON list"),
            ("[]", "the list is empty"),
            (
                r#"[{"domainSegments": [{"domainLabel": "zone", "value": "a"}]}]"#,
                "[0]: \"poolName\"",
            ),
            (r#"[{"poolName": "p"}]"#, "\"domainSegments\" is missing"),
            (
                r#"[{"poolName": "p", "domainSegments": [{"value": "a"}]}]"#,
                "domainSegments[0]: \"domainLabel\"",
            ),
            (
                r#"[{"poolName": "p", "domainSegments": [{"domainLabel": "zone"}]}]"#,
                "\"value\" is missing",
            ),
            (
                r#"[{"poolName": "p", "pool": "x", "domainSegments": []}]"#,
                "unknown field `pool`",
            ),
            (
                r#"[{"poolName": "p", "domainSegments": [{"domainLabel": "zone", "value": "a"}, {"domainLabel": "zone", "value": "b"}]}]"#,
                "listed twice",
            ),
        ] {
            let err = parse_constrained_pools(text).unwrap_err();
            assert!(err.starts_with(PARAMETER), "{text}: {err}");
            assert!(err.contains(expect), "{text}: {err}");
        }
    }

    #[test]
    fn node_topology_comes_from_the_named_labels() {
        let labels =
            parse_topology_labels("topology.kubernetes.io/zone, example.com/rack").unwrap();
        let node = map(&[
            ("topology.kubernetes.io/zone", "b"),
            ("example.com/rack", "7"),
            ("kubernetes.io/hostname", "n1"),
        ]);
        assert_eq!(
            node_topology("n1", &labels, &node, "topology.rbd.example").unwrap(),
            map(&[
                ("topology.rbd.example/rack", "7"),
                ("topology.rbd.example/zone", "b")
            ])
        );
        let bare = map(&[("topology.kubernetes.io/zone", "b")]);
        let err = node_topology("n2", &labels, &bare, "t").unwrap_err();
        assert!(
            err.contains("\"n2\"") && err.contains("example.com/rack"),
            "{err}"
        );
    }

    #[test]
    fn topology_labels_may_not_name_a_domain_twice() {
        assert!(
            parse_topology_labels("a/zone,b/zone")
                .unwrap_err()
                .contains("\"zone\"")
        );
        assert!(
            parse_topology_labels("a/")
                .unwrap_err()
                .contains("empty name")
        );
        assert_eq!(parse_topology_labels("").unwrap(), Vec::<String>::new());
    }
}
