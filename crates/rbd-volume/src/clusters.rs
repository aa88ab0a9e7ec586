//! The cluster config: cluster names mapped to monitors (and a default RADOS namespace), read from
//! a file that is usually a mounted ConfigMap, so a StorageClass can say `clusterID: site-a`
//! instead of listing monitor addresses.
//!
//! The format is ceph-csi's `config.json`, accepted as it is, so an operator can point us at the
//! ConfigMap they already have:
//!
//! ```json
//! [
//!   {"clusterID": "site-a", "monitors": ["10.0.0.1:6789", "10.0.0.2:6789"],
//!    "rbd": {"radosNamespace": "tenant-1"}},
//!   {"clusterID": "site-b", "monitors": ["mon.b.example:3300"]}
//! ]
//! ```
//!
//! Fields this product does not use (`cephFS`, `nfs`, `readAffinity`, ...) are ignored. The file
//! is looked at again on every lookup (one `stat`) and re-read when it changed, so edited
//! monitors take effect without a restart; a ConfigMap volume's atomic symlink swap counts as a
//! change. A file that becomes unreadable or malformed does not take down volumes that worked:
//! the last good contents stay in use and every lookup of a name they lack names the file's
//! problem.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::Deserialize;

/// Where ceph-csi's deployments mount the config, and so our default.
pub const DEFAULT_PATH: &str = "/etc/ceph-csi-config/config.json";

/// One cluster of the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// Monitor addresses, as a StorageClass's `monitors` parameter would list them.
    pub monitors: Vec<String>,
    /// The RADOS namespace volumes of this cluster go to when the class names none.
    pub rados_namespace: Option<String>,
}

impl ClusterInfo {
    /// The monitors joined with `,`, the form the rest of the product takes.
    #[must_use]
    pub fn monitor_list(&self) -> String {
        self.monitors.join(",")
    }
}

/// A parsed config: cluster names to their monitors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    clusters: BTreeMap<String, ClusterInfo>,
}

/// Why a config file's contents were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

#[derive(Deserialize)]
struct RawEntry {
    #[serde(rename = "clusterID")]
    cluster_id: Option<serde_json::Value>,
    monitors: Option<serde_json::Value>,
    rbd: Option<RawRbd>,
}

#[derive(Deserialize)]
struct RawRbd {
    #[serde(rename = "radosNamespace")]
    rados_namespace: Option<String>,
}

impl ClusterConfig {
    /// Parses ceph-csi's `config.json` format.
    ///
    /// # Errors
    /// A message naming the entry (by index and, when it has one, `clusterID`) and the field.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let entries: Vec<RawEntry> = serde_json::from_str(text).map_err(|e| {
            ParseError(format!(
                "not a JSON list of clusters ([{{\"clusterID\": ..., \"monitors\": [...]}}]): {e}"
            ))
        })?;
        let mut clusters = BTreeMap::new();
        for (index, entry) in entries.into_iter().enumerate() {
            let id = match entry.cluster_id {
                Some(serde_json::Value::String(id)) if !id.trim().is_empty() => id,
                Some(serde_json::Value::String(_)) | None => {
                    return Err(ParseError(format!(
                        "entry {index}: \"clusterID\" is missing or empty"
                    )));
                }
                Some(other) => {
                    return Err(ParseError(format!(
                        "entry {index}: \"clusterID\" must be a string, not {other}"
                    )));
                }
            };
            let monitors = match entry.monitors {
                None => Vec::new(),
                Some(serde_json::Value::Array(items)) => items
                    .into_iter()
                    .map(|item| match item {
                        serde_json::Value::String(m) if !m.trim().is_empty() => {
                            Ok(m.trim().to_owned())
                        }
                        other => Err(ParseError(format!(
                            "cluster {id:?}: \"monitors\" holds {other}, expected non-empty address strings"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
                Some(other) => {
                    return Err(ParseError(format!(
                        "cluster {id:?}: \"monitors\" must be a list of addresses, not {other}"
                    )));
                }
            };
            let rados_namespace = entry
                .rbd
                .and_then(|rbd| rbd.rados_namespace)
                .filter(|ns| !ns.is_empty());
            let info = ClusterInfo {
                monitors,
                rados_namespace,
            };
            if clusters.insert(id.clone(), info).is_some() {
                return Err(ParseError(format!(
                    "cluster {id:?} is listed more than once"
                )));
            }
        }
        Ok(Self { clusters })
    }

    /// The cluster named `id`.
    ///
    /// # Errors
    /// An unknown name, or a cluster listed without monitors.
    pub fn lookup(&self, id: &str) -> Result<&ClusterInfo, LookupError> {
        let info = self.clusters.get(id).ok_or_else(|| LookupError::Unknown {
            cluster: id.to_owned(),
            known: self.clusters.keys().cloned().collect(),
            problem: None,
        })?;
        if info.monitors.is_empty() {
            return Err(LookupError::NoMonitors {
                cluster: id.to_owned(),
            });
        }
        Ok(info)
    }

    /// The cluster names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.clusters.keys().map(String::as_str)
    }
}

/// Why a cluster name could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// No cluster of that name (`problem`: why the file could not be read, if it could not).
    Unknown {
        cluster: String,
        known: Vec<String>,
        problem: Option<String>,
    },
    /// The cluster is listed with an empty `monitors` list.
    NoMonitors { cluster: String },
    /// No config file was given at all.
    NoConfig { cluster: String },
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown {
                cluster,
                known,
                problem,
            } => {
                write!(f, "clusterID {cluster:?} is not in the cluster config")?;
                if known.is_empty() {
                    f.write_str(" (it lists no clusters)")?;
                } else {
                    write!(f, " (it lists {})", known.join(", "))?;
                }
                if let Some(problem) = problem {
                    write!(f, "; {problem}")?;
                }
                Ok(())
            }
            Self::NoMonitors { cluster } => write!(
                f,
                "clusterID {cluster:?} has an empty \"monitors\" list in the cluster config"
            ),
            Self::NoConfig { cluster } => write!(
                f,
                "clusterID {cluster:?} given but no cluster config file is configured \
                 (--cluster-config)"
            ),
        }
    }
}

impl std::error::Error for LookupError {}

/// What identifies one version of the file, so a change is noticed without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

#[derive(Debug)]
struct Loaded {
    stamp: Option<Stamp>,
    /// The last contents that parsed.
    good: Arc<ClusterConfig>,
    /// Why the file as it is now could not be used, if it could not.
    problem: Option<String>,
}

/// The cluster config file, re-read when it changes.
#[derive(Debug)]
pub struct ClusterConfigFile {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

impl ClusterConfigFile {
    /// Opens the file at `path` and parses it.
    ///
    /// # Errors
    /// The file cannot be read or does not parse: a message naming the path. (At startup a bad
    /// file is an error; later changes that break it keep the last good contents.)
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, String> {
        let path = path.into();
        let stamp = stamp(&path).map_err(|e| format!("cluster config {}: {e}", path.display()))?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cluster config {}: {e}", path.display()))?;
        let config = ClusterConfig::parse(&text)
            .map_err(|e| format!("cluster config {}: {e}", path.display()))?;
        Ok(Self {
            path,
            loaded: Mutex::new(Loaded {
                stamp: Some(stamp),
                good: Arc::new(config),
                problem: None,
            }),
        })
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The config as the file says now (re-read if it changed since the last call), or the last
    /// good contents and why the current file is not used.
    pub fn current(&self) -> (Arc<ClusterConfig>, Option<String>) {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        let now = stamp(&self.path);
        match now {
            Ok(now) if loaded.stamp.as_ref() == Some(&now) => {}
            Ok(now) => {
                match std::fs::read_to_string(&self.path)
                    .map_err(|e| e.to_string())
                    .and_then(|text| ClusterConfig::parse(&text).map_err(|e| e.to_string()))
                {
                    Ok(config) => {
                        tracing::info!(path = %self.path.display(), "cluster config re-read");
                        loaded.good = Arc::new(config);
                        loaded.problem = None;
                    }
                    Err(e) => {
                        let problem = format!(
                            "cluster config {} could not be used ({e}); still using its last good contents",
                            self.path.display()
                        );
                        tracing::warn!("{problem}");
                        loaded.problem = Some(problem);
                    }
                }
                loaded.stamp = Some(now);
            }
            Err(e) => {
                if loaded.stamp.is_some() {
                    let problem = format!(
                        "cluster config {} could not be read ({e}); still using its last good contents",
                        self.path.display()
                    );
                    tracing::warn!("{problem}");
                    loaded.problem = Some(problem);
                    loaded.stamp = None;
                }
            }
        }
        (Arc::clone(&loaded.good), loaded.problem.clone())
    }

    /// The cluster named `id`, as the file says now.
    ///
    /// # Errors
    /// See [`ClusterConfig::lookup`]; an unknown name also carries the file's current problem.
    pub fn lookup(&self, id: &str) -> Result<ClusterInfo, LookupError> {
        let (config, problem) = self.current();
        config.lookup(id).cloned().map_err(|e| match e {
            LookupError::Unknown { cluster, known, .. } => LookupError::Unknown {
                cluster,
                known,
                problem,
            },
            other => other,
        })
    }
}

/// Where a class's volumes live: monitors given directly, or a cluster of the config.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClusterRef {
    /// Comma-separated monitor addresses.
    Monitors(String),
    /// A `clusterID` of the cluster config.
    Named(String),
}

impl ClusterRef {
    /// The monitors to connect to: given, or looked up in `config` now (so edited monitors take
    /// effect on the next call).
    ///
    /// # Errors
    /// A name unknown to the config, a cluster without monitors, or a name with no config given
    /// ([`LookupError::NoConfig`]).
    pub fn monitors(&self, config: Option<&ClusterConfigFile>) -> Result<String, LookupError> {
        match (self, config) {
            (Self::Monitors(m), _) => Ok(m.clone()),
            (Self::Named(name), Some(config)) => config.lookup(name).map(|c| c.monitor_list()),
            (Self::Named(name), None) => Err(LookupError::NoConfig {
                cluster: name.clone(),
            }),
        }
    }
}

impl fmt::Display for ClusterRef {
    /// The monitors, or `clusterID <name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Monitors(m) => f.write_str(m),
            Self::Named(name) => write!(f, "clusterID {name}"),
        }
    }
}

/// The StorageClass parameters `monitors` and `clusterID`: exactly one of them.
///
/// # Errors
/// Both given, neither given, or an empty value, each naming the parameter.
pub fn cluster_ref(monitors: Option<&str>, cluster_id: Option<&str>) -> Result<ClusterRef, String> {
    match (
        monitors.map(str::trim).filter(|m| !m.is_empty()),
        cluster_id.map(str::trim),
    ) {
        (Some(_), Some(_)) => Err(
            "give either \"monitors\" or \"clusterID\", not both (clusterID looks the monitors up \
             in the cluster config)"
                .to_owned(),
        ),
        (None, Some("")) => Err("\"clusterID\" is empty".to_owned()),
        (None, Some(id)) if id.contains('/') || id.contains(',') => {
            Err(format!("\"clusterID\" {id:?} may not contain '/' or ','"))
        }
        (None, Some(id)) => Ok(ClusterRef::Named(id.to_owned())),
        (Some(m), None) => Ok(ClusterRef::Monitors(m.to_owned())),
        (None, None) => Err("\"monitors\" or \"clusterID\" is required".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEPH_CSI_STYLE: &str = r#"[
      {"clusterID": "site-a", "monitors": ["10.0.0.1:6789", " 10.0.0.2:6789 "],
       "rbd": {"radosNamespace": "tenant-1", "mirrorDaemonCount": 1},
       "cephFS": {"subvolumeGroup": "csi"}, "readAffinity": {"enabled": false}},
      {"clusterID": "site-b", "monitors": ["mon.b.example:3300"]},
      {"clusterID": "empty", "monitors": []}
    ]"#;

    #[test]
    fn ceph_csi_configs_are_accepted_as_they_are() {
        let config = ClusterConfig::parse(CEPH_CSI_STYLE).unwrap();
        let a = config.lookup("site-a").unwrap();
        assert_eq!(a.monitor_list(), "10.0.0.1:6789,10.0.0.2:6789");
        assert_eq!(a.rados_namespace.as_deref(), Some("tenant-1"));
        let b = config.lookup("site-b").unwrap();
        assert_eq!(b.monitors, ["mon.b.example:3300"]);
        assert_eq!(b.rados_namespace, None);
        assert_eq!(
            config.names().collect::<Vec<_>>(),
            ["empty", "site-a", "site-b"]
        );
    }

    #[test]
    fn lookups_name_the_cluster_and_the_problem() {
        let config = ClusterConfig::parse(CEPH_CSI_STYLE).unwrap();
        let unknown = config.lookup("site-c").unwrap_err().to_string();
        assert!(unknown.contains("\"site-c\""), "{unknown}");
        assert!(unknown.contains("site-a, site-b"), "{unknown}");
        let empty = config.lookup("empty").unwrap_err().to_string();
        assert!(
            empty.contains("\"empty\"") && empty.contains("empty \"monitors\""),
            "{empty}"
        );
    }

    #[test]
    fn malformed_configs_name_the_entry_and_field() {
        for (text, expect) in [
            ("{}", "not a JSON list"),
            (
                "[{\"monitors\": [\"a:1\"]}]",
                "entry 0: \"clusterID\" is missing",
            ),
            ("[{\"clusterID\": 7}]", "\"clusterID\" must be a string"),
            (
                "[{\"clusterID\": \"a\", \"monitors\": \"a:1\"}]",
                "must be a list",
            ),
            (
                "[{\"clusterID\": \"a\", \"monitors\": [\"\"]}]",
                "non-empty address",
            ),
            (
                "[{\"clusterID\": \"a\"}, {\"clusterID\": \"a\"}]",
                "listed more than once",
            ),
        ] {
            let err = ClusterConfig::parse(text).unwrap_err().to_string();
            assert!(err.contains(expect), "{text}: {err}");
        }
    }

    #[test]
    fn a_class_names_monitors_or_a_cluster_but_not_both() {
        assert_eq!(
            cluster_ref(Some("1.2.3.4:6789"), None).unwrap(),
            ClusterRef::Monitors("1.2.3.4:6789".into())
        );
        assert_eq!(
            cluster_ref(None, Some("site-a")).unwrap(),
            ClusterRef::Named("site-a".into())
        );
        assert!(
            cluster_ref(Some("m:1"), Some("a"))
                .unwrap_err()
                .contains("not both")
        );
        assert!(cluster_ref(None, None).unwrap_err().contains("required"));
        assert!(cluster_ref(None, Some(" ")).unwrap_err().contains("empty"));
        assert!(cluster_ref(None, Some("a/b")).unwrap_err().contains("'/'"));
    }

    #[test]
    fn the_file_is_re_read_when_it_changes_and_a_broken_edit_keeps_the_last_good_contents() {
        let dir = std::env::temp_dir().join(format!("clusters-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"[{"clusterID": "a", "monitors": ["1.1.1.1:6789"]}]"#,
        )
        .unwrap();
        let file = ClusterConfigFile::open(&path).unwrap();
        assert_eq!(file.lookup("a").unwrap().monitor_list(), "1.1.1.1:6789");

        // A ConfigMap update: new file renamed over the old one (a new inode).
        let next = dir.join("config.json.new");
        std::fs::write(
            &next,
            r#"[{"clusterID": "a", "monitors": ["2.2.2.2:6789"]}]"#,
        )
        .unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(file.lookup("a").unwrap().monitor_list(), "2.2.2.2:6789");

        std::fs::write(&next, "[{").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(file.lookup("a").unwrap().monitor_list(), "2.2.2.2:6789");
        let err = file.lookup("b").unwrap_err().to_string();
        assert!(err.contains("could not be used"), "{err}");

        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.lookup("a").unwrap().monitor_list(), "2.2.2.2:6789");
        let err = file.lookup("b").unwrap_err().to_string();
        assert!(err.contains("could not be read"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cluster_ref_resolves_to_monitors_given_or_looked_up_now() {
        let dir = std::env::temp_dir().join(format!("clusters-ref-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        std::fs::write(
            &path,
            r#"[{"clusterID": "a", "monitors": ["1.1.1.1:6789"]}]"#,
        )
        .unwrap();
        let file = ClusterConfigFile::open(&path).unwrap();
        let given = ClusterRef::Monitors("9.9.9.9:6789".into());
        assert_eq!(given.monitors(None).unwrap(), "9.9.9.9:6789");
        assert_eq!(given.to_string(), "9.9.9.9:6789");
        let named = ClusterRef::Named("a".into());
        assert_eq!(named.monitors(Some(&file)).unwrap(), "1.1.1.1:6789");
        assert_eq!(named.to_string(), "clusterID a");
        let err = named.monitors(None).unwrap_err();
        assert!(matches!(err, LookupError::NoConfig { .. }), "{err:?}");
        let err = ClusterRef::Named("b".into())
            .monitors(Some(&file))
            .unwrap_err();
        assert!(err.to_string().contains("\"b\""), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_or_broken_file_at_startup_is_an_error_naming_it() {
        let err = ClusterConfigFile::open("/nonexistent/config.json").unwrap_err();
        assert!(err.contains("/nonexistent/config.json"), "{err}");
    }
}
