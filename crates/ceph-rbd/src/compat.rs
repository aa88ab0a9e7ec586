//! What the cluster supports, probed once per connection, and the guard that leaves an
//! operation to librbd where the RADOS-level paths ([`crate::create`], [`crate::remove`],
//! [`crate::first_snapshot`], [`crate::plain_clone`]) would need more than the cluster offers.
//!
//! **Clone format.** The client's `rbd_default_clone_format` decides: `1` makes clone v1 (the
//! parent snapshot protected, the clone listed in the pool's `rbd_children` object), `2` and
//! `auto` (Ceph's default) clone v2. librbd's own `auto` picks v1 on a cluster that does not
//! require Mimic or later clients (which `cephadm` bootstraps leave at Luminous); like ceph-csi,
//! which asks librbd for clone v2 whatever the setting, this crate takes `auto` as v2, so that
//! snapshots and restores stay instant on such clusters: clients older than Mimic cannot open
//! a v2 clone (its `clone-child` operation feature), and an operator who has such clients sets
//! `1`. Every clone this crate asks librbd for says the format explicitly
//! ([`CloneFormat::number`]), and a v1 clone is never made with RADOS calls:
//! [`crate::plain_clone`] writes v2 clones only.
//!
//! **OSD release.** The `rbd` object-class methods the RADOS-level paths call, and the release
//! whose OSDs first have them (`src/cls/rbd/cls_rbd.cc`; an OSD without a method answers
//! `EOPNOTSUPP`):
//!
//! | path | newest methods it calls | first release |
//! | --- | --- | --- |
//! | create, remove | `create` with a data pool, `set_id`, `dir_add_image`, `dir_remove_image`, `object_map_resize`, `mirror_mode_get`, `mirror_image_get`, `metadata_list` | Luminous (12) |
//! | temporary snapshot | `parent_get` (ceph/ceph#23662), `snapshot_add` with a snapshot namespace, `object_map_snap_add` | Nautilus (14) |
//! | clone | `parent_attach`, `parent_get` (ceph/ceph#23662); `child_attach`, `children_list`, `op_features_set`, `snapshot_trash_add` (clone v2, Mimic) | Nautilus (14) |
//!
//! The cluster's `require_osd_release` (from `osd dump`) is the oldest release an OSD may run:
//! a path whose release is newer is left to librbd, which speaks to older OSDs with the older
//! methods. When it cannot be read (the user's caps lack `osd` read on the monitors), every
//! path is left to librbd. Each decision is logged once per connection, with its reason.

use crate::raw::Rados;

/// librados' release numbers (`ceph_release_t`).
const RELEASES: [(&str, u8); 11] = [
    ("jewel", 10),
    ("kraken", 11),
    ("luminous", 12),
    ("mimic", 13),
    ("nautilus", 14),
    ("octopus", 15),
    ("pacific", 16),
    ("quincy", 17),
    ("reef", 18),
    ("squid", 19),
    ("tentacle", 20),
];
const LUMINOUS: u8 = 12;
const NAUTILUS: u8 = 14;

/// How librbd tracks a clone's parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneFormat {
    /// The parent snapshot protected, the clone in the pool's `rbd_children`.
    V1,
    /// No protection; the parent snapshot counts its children, and a removed one waits in the
    /// snapshot trash until its last clone goes.
    V2,
}

impl CloneFormat {
    /// librbd's `RBD_IMAGE_OPTION_CLONE_FORMAT` value.
    pub(crate) fn number(self) -> u64 {
        match self {
            CloneFormat::V1 => 1,
            CloneFormat::V2 => 2,
        }
    }
}

/// A RADOS-level path, for [`Compat::allows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FastPath {
    Create,
    Remove,
    Snapshot,
    Clone,
}

/// What one connection found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Compat {
    pub(crate) clone_format: CloneFormat,
    /// The cluster's `require_osd_release`; `None` when it could not be read.
    pub(crate) osd_release: Option<u8>,
}

/// The release number of `name` (`osd dump`'s spelling); a name this table does not know is
/// taken as newer than all of it (a later release).
fn release_number(name: &str) -> u8 {
    RELEASES
        .iter()
        .find(|(known, _)| *known == name)
        .map_or(u8::MAX, |(_, number)| *number)
}

/// The clone format `setting` (`rbd_default_clone_format`) gives: `1` v1, anything else (`2`,
/// `auto`) v2 (see the module's text for why `auto` is v2 whatever the cluster's
/// `require_min_compat_client`).
pub(crate) fn clone_format(setting: &str) -> CloneFormat {
    match setting.trim() {
        "1" => CloneFormat::V1,
        _ => CloneFormat::V2,
    }
}

impl Compat {
    /// Why `path` is left to librbd on this connection; `None`: it may run.
    pub(crate) fn refuses(&self, path: FastPath) -> Option<&'static str> {
        let needed = match path {
            FastPath::Create | FastPath::Remove => LUMINOUS,
            FastPath::Snapshot | FastPath::Clone => NAUTILUS,
        };
        match self.osd_release {
            None => Some("the cluster's require_osd_release could not be read"),
            Some(release) if release < needed && needed == NAUTILUS => {
                Some("the OSDs may be older than Nautilus (require_osd_release)")
            }
            Some(release) if release < needed => {
                Some("the OSDs may be older than Luminous (require_osd_release)")
            }
            Some(_) if path == FastPath::Clone && self.clone_format == CloneFormat::V1 => {
                Some("clones are v1 (rbd_default_clone_format)")
            }
            Some(_) => None,
        }
    }
}

/// Reads the client's clone format setting and the cluster's `require_osd_release` (one `osd
/// dump`), and logs what follows.
/// The answer is settled (`true`) unless the monitors did not answer the `osd dump` (a
/// timeout, a lost connection): then the next operation probes again, and this one takes
/// librbd.
pub(crate) fn probe(rados: &Rados) -> (Compat, bool) {
    let op = "probe cluster";
    let setting = rados
        .conf_get(op, "rbd_default_clone_format")
        .unwrap_or_else(|e| {
            tracing::info!(error = %e, "rbd_default_clone_format not readable; taken as auto");
            "auto".to_owned()
        });
    let (osd_release, settled) = match rados
        .mon_command_answer(op, r#"{"prefix": "osd dump", "format": "json"}"#)
    {
        Ok(answer) => (
            serde_json::from_slice::<serde_json::Value>(&answer)
                .ok()
                .and_then(|dump| {
                    dump.get("require_osd_release")
                        .and_then(serde_json::Value::as_str)
                        .map(release_number)
                }),
            true,
        ),
        Err(e) if e.is_connection_failure() => {
            tracing::debug!(error = %e, "osd dump unanswered; probing again at the next operation");
            return (
                Compat {
                    clone_format: clone_format(&setting),
                    osd_release: None,
                },
                false,
            );
        }
        Err(e) => {
            tracing::info!(error = %e, "osd dump refused: the cluster's require_osd_release is unknown");
            (None, true)
        }
    };
    let compat = Compat {
        clone_format: clone_format(&setting),
        osd_release,
    };
    let off: Vec<String> = [
        ("create", FastPath::Create),
        ("remove", FastPath::Remove),
        ("snapshot", FastPath::Snapshot),
        ("clone", FastPath::Clone),
    ]
    .iter()
    .filter_map(|(name, path)| compat.refuses(*path).map(|why| format!("{name}: {why}")))
    .collect();
    if off.is_empty() {
        tracing::debug!(
            clone_format = compat.clone_format.number(),
            osd_release,
            "cluster probed: every RADOS-level path may run"
        );
    } else {
        tracing::info!(
            clone_format = compat.clone_format.number(),
            clone_format_setting = %setting,
            osd_release,
            left_to_librbd = %off.join("; "),
            "cluster probed: some operations go through librbd on this connection"
        );
    }
    (compat, settled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clone_format_follows_the_setting_and_auto_the_compat_level() {
        assert_eq!(clone_format("1"), CloneFormat::V1);
        assert_eq!(clone_format(" 1\n"), CloneFormat::V1);
        assert_eq!(clone_format("2"), CloneFormat::V2);
        assert_eq!(clone_format("auto"), CloneFormat::V2);
    }

    #[test]
    fn each_path_needs_the_release_of_its_class_calls() {
        let at = |release: Option<u8>, format| Compat {
            clone_format: format,
            osd_release: release,
        };
        let all = [
            FastPath::Create,
            FastPath::Remove,
            FastPath::Snapshot,
            FastPath::Clone,
        ];
        for release in [NAUTILUS, 16, 20, u8::MAX] {
            let compat = at(Some(release), CloneFormat::V2);
            assert!(
                all.iter().all(|p| compat.refuses(*p).is_none()),
                "{release}"
            );
        }
        let mimic = at(Some(13), CloneFormat::V2);
        assert!(mimic.refuses(FastPath::Create).is_none());
        assert!(mimic.refuses(FastPath::Remove).is_none());
        assert!(mimic.refuses(FastPath::Snapshot).is_some());
        assert!(mimic.refuses(FastPath::Clone).is_some());
        let jewel = at(Some(10), CloneFormat::V2);
        assert!(all.iter().all(|p| jewel.refuses(*p).is_some()));
        let unknown = at(None, CloneFormat::V2);
        assert!(all.iter().all(|p| unknown.refuses(*p).is_some()));
        let v1 = at(Some(16), CloneFormat::V1);
        assert!(v1.refuses(FastPath::Clone).is_some());
        assert!(v1.refuses(FastPath::Snapshot).is_none());
        assert_eq!(release_number("pacific"), 16);
        assert_eq!(release_number("tentacle"), 20);
        assert_eq!(release_number("some-later-one"), u8::MAX);
    }

    /// `auto` (Ceph's default) on a cluster that does not require Mimic clients (cephadm's
    /// bootstrap leaves Luminous) still clones v2, as ceph-csi does; `rbd_default_clone_format
    /// = 1` clones v1 with a protected parent snapshot, as librbd's own clone makes them, never
    /// the RADOS-level clone v2. A cluster of its own: the settings are cluster-wide, and the
    /// other tests clone v2.
    #[tokio::test]
    async fn auto_clones_v2_below_mimic_and_format_1_clones_v1_with_a_protected_parent_snapshot() {
        let ceph = micro_ceph::MicroCeph::start().unwrap();
        let ceph_cli = |args: &[&str]| {
            let out = ceph.cli("ceph").args(args).output().unwrap();
            assert!(
                out.status.success(),
                "ceph {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ceph_cli(&["osd", "set-require-min-compat-client", "luminous"]);
        let config = crate::ClusterConfig::new(
            ceph.monitors.clone(),
            "admin",
            crate::Secret::new(ceph.admin_key.clone()),
        );
        let auto = crate::Cluster::connect(&config).await.unwrap();
        let compat = auto.compat().await.unwrap();
        assert_eq!(compat.clone_format, CloneFormat::V2, "{compat:?}");
        assert!(compat.refuses(FastPath::Clone).is_none());
        drop(auto);

        ceph_cli(&["config", "set", "client", "rbd_default_clone_format", "1"]);
        let cluster = crate::Cluster::connect(&config).await.unwrap();
        let compat = cluster.compat().await.unwrap();
        assert_eq!(compat.clone_format, CloneFormat::V1, "{compat:?}");
        assert!(compat.refuses(FastPath::Clone).is_some());
        assert!(compat.refuses(FastPath::Create).is_none());

        let pool = ceph.pool.clone();
        let opts = crate::CreateOptions {
            features: Some(
                crate::Features::parse("layering,exclusive-lock,object-map,fast-diff").unwrap(),
            ),
            ..crate::CreateOptions::default()
        };
        cluster
            .create_image(&pool, "src", 4 << 20, &opts)
            .await
            .unwrap();
        cluster.snap_create(&pool, "src", "s").await.unwrap();
        cluster
            .clone_image(&pool, "src", "s", &pool, "clone", &opts)
            .await
            .unwrap();
        let job = crate::CloneJob {
            parent_pool: pool.clone(),
            parent: "src".into(),
            snap: "s".into(),
            temporary: false,
            pool: pool.clone(),
            image: "recorded".into(),
            options: opts.clone(),
            snapshot: None,
        };
        cluster
            .clone_recorded(job, |_| crate::CloneRecord::default())
            .await
            .unwrap();
        for clone in ["clone", "recorded"] {
            let info = ceph
                .rbd(&["info", "--format", "json", &format!("{pool}/{clone}")])
                .unwrap();
            let info: serde_json::Value = serde_json::from_str(&info).unwrap();
            assert_eq!(info["parent"]["snapshot"], "s", "{clone}: {info}");
            assert_eq!(
                info["op_features"],
                serde_json::json!([]),
                "{clone}: {info}"
            );
        }
        let snap = ceph
            .rbd(&["info", "--format", "json", &format!("{pool}/src@s")])
            .unwrap();
        assert!(snap.contains("\"protected\":\"true\""), "{snap}");
        // a temporary snapshot cannot be removed under a clone v1: refused, nothing made
        let job = crate::CloneJob {
            parent_pool: pool.clone(),
            parent: "src".into(),
            snap: "tmp".into(),
            temporary: true,
            pool: pool.clone(),
            image: "temporary".into(),
            options: opts,
            snapshot: None,
        };
        let refused = cluster
            .clone_recorded(job, |_| crate::CloneRecord::default())
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("clone v1"), "{refused}");
        assert!(!cluster.image_exists(&pool, "temporary").await.unwrap());
        // the protected snapshot goes once its clones do
        for clone in ["clone", "recorded"] {
            cluster.remove_image(&pool, clone).await.unwrap();
        }
        cluster.snap_remove(&pool, "src", "s").await.unwrap();
        assert!(cluster.snap_list(&pool, "src").await.unwrap().is_empty());
    }

    /// The probe reads the test cluster as it is: its OSDs' release, and clone v2
    /// (micro-ceph requires Mimic clients), so every path may run.
    #[tokio::test]
    async fn the_probe_reads_the_clusters_release_and_compat_level() {
        let cluster = crate::cluster::test_cluster().await;
        let compat = cluster.compat().await.unwrap();
        assert!(compat.osd_release.is_some_and(|r| r >= 16), "{compat:?}");
        assert_eq!(compat.clone_format, CloneFormat::V2);
    }
}
