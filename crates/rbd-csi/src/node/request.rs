//! Reading what a node call asks for out of its request (pure: no I/O).

use std::collections::HashMap;

use tonic::Status;

use crate::fs::FsType;
use crate::mapper::{ImageSpec, Key, MounterKind, options};
use crate::proto::csi::VolumeCapability;
use crate::proto::csi::volume_capability::AccessType;
use crate::proto::csi::volume_capability::access_mode::Mode;
use crate::status::require_some;
use crate::validate;
use crate::volume::{VolumeId, context};
use rbd_volume::clusters::{ClusterConfigFile, ClusterRef};

/// How the workload accesses the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A filesystem mounted with these options.
    Mount { fs: FsType, flags: Vec<String> },
    /// The raw block device.
    Block,
}

impl Access {
    #[must_use]
    pub fn is_block(&self) -> bool {
        matches!(self, Self::Block)
    }
}

/// The access a volume capability asks for.
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing access type/mode, an unsupported filesystem, or a
/// multi-node-writer filesystem (ext4/xfs cannot be shared).
pub fn access(capability: Option<&VolumeCapability>, field: &str) -> Result<Access, Status> {
    let capability = require_some(capability, field)?;
    let mode = require_some(
        capability.access_mode.as_ref(),
        &format!("{field}.access_mode"),
    )?;
    let mode = Mode::try_from(mode.mode).unwrap_or(Mode::Unknown);
    if mode == Mode::Unknown {
        return Err(Status::invalid_argument(format!(
            "{field}.access_mode.mode is required"
        )));
    }
    match require_some(
        capability.access_type.as_ref(),
        &format!("{field}.access_type"),
    )? {
        AccessType::Block(_) => Ok(Access::Block),
        AccessType::Mount(mount) => {
            if matches!(
                mode,
                Mode::MultiNodeMultiWriter | Mode::MultiNodeSingleWriter
            ) {
                return Err(Status::invalid_argument(format!(
                    "access mode {} is not supported for filesystem volumes",
                    mode.as_str_name()
                )));
            }
            let fs = FsType::parse(&mount.fs_type).map_err(Status::invalid_argument)?;
            Ok(Access::Mount {
                fs,
                flags: mount.mount_flags.clone(),
            })
        }
    }
}

/// The access mode a volume capability asks for (after [`access`] accepted it).
#[must_use]
pub fn mode(capability: Option<&VolumeCapability>) -> Mode {
    capability
        .and_then(|c| c.access_mode.as_ref())
        .and_then(|m| Mode::try_from(m.mode).ok())
        .unwrap_or(Mode::Unknown)
}

/// Whether `mode` only reads: such a volume is mapped and mounted read-only, never checked,
/// grown or formatted.
#[must_use]
pub fn reader_only(mode: Mode) -> bool {
    matches!(mode, Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)
}

/// Whether `mode` lets one node only write: such a volume is not staged while a client that is
/// not this node's own has the image open.
#[must_use]
pub fn single_node_writer(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::SingleNodeWriter | Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter
    )
}

/// What `NodeStageVolume` needs to map an image.
#[derive(Debug, Clone)]
pub struct StageParams {
    pub image: ImageSpec,
    pub mounter: MounterKind,
    pub key: Key,
}

fn first<'a>(map: &'a HashMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    first_entry(map, keys).map(|(_, v)| v)
}

/// The first of `keys` with a non-empty value, and that value.
fn first_entry<'a, 'k>(
    map: &'a HashMap<String, String>,
    keys: &[&'k str],
) -> Option<(&'k str, &'a str)> {
    keys.iter()
        .filter_map(|k| map.get(*k).map(|v| (*k, v.as_str())))
        .find(|(_, v)| !v.is_empty())
}

/// The monitors to stage with and where they came from. A cluster named by the context's
/// `clusterID` (or the `v2` volume ID) is looked up in `clusters` now, so monitors that moved
/// since the volume was made are followed; the context's `monitors` (which the built-in
/// provisioner also records for `clusterID` volumes, for older nodes) are used when the volume
/// names no cluster, and as a fallback when this node has no cluster config or the config cannot
/// resolve the name (with a warning).
fn stage_monitors(
    volume_id: &str,
    volume_context: &HashMap<String, String>,
    parsed: Option<&VolumeId>,
    clusters: Option<&ClusterConfigFile>,
) -> Result<(String, String), Status> {
    let given = first(volume_context, &[context::MONITORS]);
    let cluster = match (first(volume_context, &[context::CLUSTER_ID]), parsed) {
        (Some(name), _) => {
            validate::cluster_id("volume_context.clusterID", name)
                .map_err(Status::invalid_argument)?;
            ClusterRef::Named(name.to_owned())
        }
        (None, Some(parsed)) => parsed.cluster.clone(),
        (None, None) => match given {
            Some(monitors) => ClusterRef::Monitors(monitors.to_owned()),
            None => {
                return Err(Status::invalid_argument(format!(
                    "volume_context.monitors (or clusterID) is required (volume id {volume_id:?} \
                     does not carry it)"
                )));
            }
        },
    };
    match (&cluster, given) {
        (ClusterRef::Monitors(_), Some(monitors)) => {
            Ok((monitors.to_owned(), "volume_context.monitors".to_owned()))
        }
        (ClusterRef::Monitors(monitors), None) => Ok((
            monitors.clone(),
            format!("volume_id {volume_id:?} (monitors)"),
        )),
        (ClusterRef::Named(_), _) => match (cluster.monitors(clusters), given) {
            (Ok(monitors), _) => Ok((monitors, format!("monitors of {cluster}"))),
            (Err(e), Some(monitors)) => {
                tracing::warn!(volume_id, error = %e, "using the monitors recorded in the volume context");
                Ok((monitors.to_owned(), "volume_context.monitors".to_owned()))
            }
            (Err(e), None) => Err(Status::invalid_argument(e.to_string())),
        },
    }
}

/// The RADOS namespace: the context's `radosNamespace`, else the volume ID's (default: none).
fn stage_namespace(
    volume_id: &str,
    volume_context: &HashMap<String, String>,
    parsed: Option<&VolumeId>,
) -> Result<String, Status> {
    let (namespace, field) = match first(volume_context, &[context::NAMESPACE]) {
        Some(namespace) => (namespace, "volume_context.radosNamespace".to_owned()),
        None => (
            parsed.map_or("", |p| p.namespace.as_str()),
            format!("volume_id {volume_id:?} (namespace)"),
        ),
    };
    validate::namespace(&field, namespace).map_err(Status::invalid_argument)?;
    Ok(namespace.to_owned())
}

/// Image, mapper and key of a `NodeStageVolume` call: location from `volume_context` (falling back
/// to the volume ID), user from the context or the secret (`userID`, `adminId`; default `admin`),
/// key from the secret (`userKey`, or `key` as in the in-tree plugin's secrets). Every value is
/// checked against its safe character set ([`crate::validate`]) wherever it came from.
///
/// The monitors are the context's `monitors`; else those of its `clusterID` (or the `v2` volume
/// ID's), looked up in `clusters` now, so a volume of a cluster whose monitors moved stages with
/// the new ones. The namespace is the context's `radosNamespace`, else the volume ID's.
///
/// # Errors
/// `INVALID_ARGUMENT` naming what is missing or malformed.
pub fn stage_params(
    volume_id: &str,
    volume_context: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
    default_mounter: MounterKind,
    clusters: Option<&ClusterConfigFile>,
) -> Result<StageParams, Status> {
    let parsed = VolumeId::parse(volume_id).ok();
    // The value and the field it came from (for the message if it is malformed).
    let pick = |key: &str, from_id: Option<&str>| -> Result<(String, String), Status> {
        if let Some(value) = first(volume_context, &[key]) {
            return Ok((value.to_owned(), format!("volume_context.{key}")));
        }
        from_id
            .map(|value| (value.to_owned(), format!("volume_id {volume_id:?} ({key})")))
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "volume_context.{key} is required (volume id {volume_id:?} does not carry it)"
                ))
            })
    };
    let check = |result: Result<(), String>| result.map_err(Status::invalid_argument);
    let (monitors, field) = stage_monitors(volume_id, volume_context, parsed.as_ref(), clusters)?;
    check(validate::monitors(&field, &monitors))?;
    let namespace = stage_namespace(volume_id, volume_context, parsed.as_ref())?;
    let (pool, field) = pick(context::POOL, parsed.as_ref().map(|p| p.pool.as_str()))?;
    check(validate::pool(&field, &pool))?;
    let (image, field) = pick(context::IMAGE, parsed.as_ref().map(|p| p.image.as_str()))?;
    check(validate::image(&field, &image))?;
    let user = match first(volume_context, &[context::USER]) {
        Some(user) => {
            check(validate::user("volume_context.userID", user))?;
            user
        }
        None => match first_entry(secrets, &["userID", "adminId", "adminID"]) {
            Some((key, user)) => {
                check(validate::user(&format!("secrets.{key}"), user))?;
                user
            }
            None => "admin",
        },
    }
    .to_owned();
    let (key_field, key) = first_entry(secrets, &["userKey", "key"])
        .ok_or_else(|| Status::invalid_argument("secrets.userKey (or secrets.key) is required"))?;
    check(validate::key(&format!("secrets.{key_field}"), key))?;
    let mounter = match first(volume_context, &[context::MOUNTER]) {
        Some(value) => MounterKind::parse(value)
            .map_err(|e| Status::invalid_argument(format!("volume_context.mounter: {e}")))?,
        None => default_mounter,
    };
    let options = |which, key| {
        options::for_volume(which, first(volume_context, &[key]), mounter)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    };
    let map_options = options(options::Which::Map, context::MAP_OPTIONS)?;
    let unmap_options = options(options::Which::Unmap, context::UNMAP_OPTIONS)?;
    Ok(StageParams {
        image: ImageSpec {
            monitors,
            pool,
            namespace,
            image,
            user,
            map_options,
            unmap_options,
        },
        mounter,
        key: Key::new(key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::csi::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn cap(access_type: AccessType, mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn context_wins_over_volume_id_and_secret_supplies_key() {
        let params = stage_params(
            "v1/m1:6789/idpool/idimage",
            &map(&[("pool", "ctxpool"), ("userID", "kube"), ("mounter", "fuse")]),
            &map(&[("userKey", "AQB==")]),
            MounterKind::Krbd,
            None,
        )
        .unwrap();
        assert_eq!(params.image.pool, "ctxpool");
        assert_eq!(params.image.image, "idimage");
        assert_eq!(params.image.monitors, "m1:6789");
        assert_eq!(params.image.user, "kube");
        assert_eq!(params.mounter, MounterKind::FuseLoop);
        assert_eq!(params.key.expose(), "AQB==");
    }

    #[test]
    fn in_tree_style_secret_and_defaults() {
        let params = stage_params(
            "v1/m1:6789/rbd/img",
            &HashMap::new(),
            &map(&[("key", "AQC==")]),
            MounterKind::Nbd,
            None,
        )
        .unwrap();
        assert_eq!(params.image.user, "admin");
        assert_eq!(params.mounter, MounterKind::Nbd);
        assert_eq!(params.key.expose(), "AQC==");
    }

    #[test]
    fn namespaced_and_named_volume_ids_stage_from_the_id_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"[{"clusterID": "site-a", "monitors": ["10.0.0.9:6789"]}]"#,
        )
        .unwrap();
        let clusters = ClusterConfigFile::open(&path).unwrap();
        let secrets = map(&[("userKey", "AQB==")]);
        let params = stage_params(
            "v2/site-a/kube/tenant-1/pvc-1",
            &HashMap::new(),
            &secrets,
            MounterKind::Krbd,
            Some(&clusters),
        )
        .unwrap();
        assert_eq!(params.image.monitors, "10.0.0.9:6789");
        assert_eq!(params.image.spec(), "kube/tenant-1/pvc-1");
        // the context's clusterID and namespace win; monitors are looked up now
        std::fs::write(
            &path,
            r#"[{"clusterID": "site-a", "monitors": ["10.0.0.10:6789"]}]"#,
        )
        .unwrap();
        let params = stage_params(
            "v2/site-a/kube/tenant-1/pvc-1",
            &map(&[("clusterID", "site-a"), ("radosNamespace", "tenant-2")]),
            &secrets,
            MounterKind::Krbd,
            Some(&clusters),
        )
        .unwrap();
        assert_eq!(params.image.monitors, "10.0.0.10:6789");
        assert_eq!(params.image.namespace, "tenant-2");
        // monitors recorded at provisioning (the built-in provisioner writes both): the config's
        // current ones win; without a config (or a name it lacks) the recorded ones are used
        let recorded = map(&[("clusterID", "site-a"), ("monitors", "10.0.0.1:6789")]);
        let params = stage_params(
            "v2/site-a/kube/pvc-1",
            &recorded,
            &secrets,
            MounterKind::Krbd,
            Some(&clusters),
        )
        .unwrap();
        assert_eq!(params.image.monitors, "10.0.0.10:6789");
        let params = stage_params(
            "v2/site-a/kube/pvc-1",
            &recorded,
            &secrets,
            MounterKind::Krbd,
            None,
        )
        .unwrap();
        assert_eq!(params.image.monitors, "10.0.0.1:6789");
        // a monitors ID with monitors in the context: the context's, as before
        let params = stage_params(
            "v1/10.0.0.5:6789/kube/pvc-1",
            &map(&[("monitors", "10.0.0.6:6789")]),
            &secrets,
            MounterKind::Krbd,
            Some(&clusters),
        )
        .unwrap();
        assert_eq!(params.image.monitors, "10.0.0.6:6789");
        let err = stage_params(
            "v2/site-b/kube/pvc-1",
            &HashMap::new(),
            &secrets,
            MounterKind::Krbd,
            Some(&clusters),
        )
        .unwrap_err();
        assert!(err.message().contains("site-b"), "{}", err.message());
        let err = stage_params(
            "v2/site-a/kube/pvc-1",
            &HashMap::new(),
            &secrets,
            MounterKind::Krbd,
            None,
        )
        .unwrap_err();
        assert!(
            err.message().contains("--cluster-config"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn missing_key_or_location_names_the_field() {
        let err = stage_params(
            "v1/m/p/i",
            &HashMap::new(),
            &HashMap::new(),
            MounterKind::Krbd,
            None,
        )
        .unwrap_err();
        assert!(err.message().contains("userKey"));
        let err = stage_params(
            "opaque",
            &HashMap::new(),
            &map(&[("key", "k")]),
            MounterKind::Krbd,
            None,
        )
        .unwrap_err();
        assert!(err.message().contains("volume_context.monitors"));
    }

    #[test]
    fn unsafe_locations_users_monitors_and_keys_name_their_field() {
        type Pairs = &'static [(&'static str, &'static str)];
        let key = map(&[("userKey", "AQB==")]);
        let cases: [(&str, Pairs, Pairs, &str); 9] = [
            (
                "v1/m:1/p/i",
                &[("imageName", "../../etc/shadow")],
                &[],
                "volume_context.imageName",
            ),
            ("v1/m:1/p/..", &[], &[], "volume_id"),
            ("v1/m:1/p/i", &[("pool", "-o")], &[], "volume_context.pool"),
            (
                "v1/m:1/p/i",
                &[("userID", "admin]\n[x")],
                &[],
                "volume_context.userID",
            ),
            ("v1/m:1/p/i", &[], &[("userID", "a b")], "secrets.userID"),
            ("v1/m:1/p/i", &[], &[("adminId", "../a")], "secrets.adminId"),
            (
                "v1/m:1/p/i",
                &[("monitors", "m:1\nkeyring = /etc/ceph/other")],
                &[],
                "volume_context.monitors",
            ),
            (
                "v1/m:1/p/i",
                &[],
                &[("userKey", "AQB==\n[client.x]")],
                "secrets.userKey",
            ),
            (
                "v1/m:1/p/i",
                &[("mounter", "iscsi")],
                &[],
                "volume_context.mounter",
            ),
        ];
        for (id, ctx, secrets, field) in cases {
            let mut secrets = map(secrets);
            if !secrets.contains_key("userKey") {
                secrets.extend(key.clone());
            }
            let err = stage_params(id, &map(ctx), &secrets, MounterKind::Krbd, None).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}");
            assert!(err.message().contains(field), "{field}: {}", err.message());
            assert!(!err.message().contains("AQB"), "{}", err.message());
        }
    }

    #[test]
    fn access_parses_block_mount_and_rejects_bad_ones() {
        let block = cap(
            AccessType::Block(BlockVolume {}),
            Mode::MultiNodeMultiWriter,
        );
        assert_eq!(
            access(Some(&block), "volume_capability").unwrap(),
            Access::Block
        );
        let xfs = cap(
            AccessType::Mount(MountVolume {
                fs_type: "xfs".into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            }),
            Mode::SingleNodeWriter,
        );
        assert_eq!(
            access(Some(&xfs), "volume_capability").unwrap(),
            Access::Mount {
                fs: FsType::Xfs,
                flags: vec!["noatime".into()]
            }
        );
        let err = access(None, "volume_capability").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("volume_capability"));
        let shared = cap(
            AccessType::Mount(MountVolume::default()),
            Mode::MultiNodeMultiWriter,
        );
        assert!(access(Some(&shared), "c").is_err());
    }
}
