//! NodeStageVolume / NodeUnstageVolume with the krbd mapper, through the node service, on a fake
//! kernel: this machine has no rbd module, so a stand-in `rbd` maps by creating what the kernel
//! would (`sys/bus/rbd/devices/<n>/{pool,name,pool_ns,current_snap}` and `dev/rbd<n>`, a plain
//! file) under a private root the mapper reads instead of `/` (in /dev/shm: the mapper accepts
//! only a `/dev/...` path from `rbd map`). Block access, so staging is a
//! real bind mount of that "device". Runs as root.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{block_cap, strings};
use rbd_csi::mapper::Mapper;
use rbd_csi::mapper::krbd::KrbdMapper;
use rbd_csi::node::{NodeConfig, NodeService};
use rbd_csi::proto::csi::{self, node_server::Node};
use rbd_csi::{MounterKind, mount};
use tonic::Request;

const VOLUME: &str = "v1/127.0.0.1:6789/kube/pvc-1";

/// A node service whose krbd mapper sees the fake kernel under `root`.
fn node(root: &Path) -> NodeService {
    let script = root.join("fake-rbd");
    micro_ceph::write_executable(
        &script,
        &format!(
            r#"#!/bin/sh
root={root}
echo "$1 $2" >> "$root/calls"
case "$1" in
map)
  n=0; while [ -e "$root/sys/bus/rbd/devices/$n" ]; do n=$((n+1)); done
  d="$root/sys/bus/rbd/devices/$n"; mkdir -p "$d"
  echo "${{2%%/*}}" > "$d/pool"; echo "${{2#*/}}" > "$d/name"; echo > "$d/pool_ns"; echo - > "$d/current_snap"
  : > "$root/dev/rbd$n"
  ro=0; for a in "$@"; do [ "$a" = --read-only ] && ro=1; done
  mkdir -p "$root/sys/block/rbd$n"; echo $ro > "$root/sys/block/rbd$n/ro"
  echo "$root/dev/rbd$n" ;;
unmap)
  n="${{2##*/rbd}}"; rm -r "$root/sys/bus/rbd/devices/$n" "$root/sys/block/rbd$n"; rm -f "$2" ;;
esac
"#,
            root = root.display()
        ),
    );
    std::fs::create_dir_all(root.join("sys/bus/rbd/devices")).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    let krbd: Arc<dyn Mapper> = Arc::new(
        KrbdMapper::new(root.join("run/keys"), None)
            .with_program(script.display().to_string())
            .with_root(root),
    );
    NodeService::with_mappers(
        NodeConfig {
            node_id: "n".into(),
            default_mounter: MounterKind::Krbd,
            runtime_dir: root.join("run"),
            krbd_map_options: None,
            max_volumes_per_node: 0,
            cluster_config: None,
            topology: Default::default(),
            daemons: Default::default(),
            kms_config: Default::default(),
            secrets: None,
        },
        vec![krbd],
    )
    .with_cluster_check(Arc::new(common::NoCluster))
}

/// The fake `/`: under /dev/shm, because `rbd map` must print a `/dev/...` path.
fn fake_root() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").unwrap()
}

fn stage_request(staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: VOLUME.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(block_cap()),
        volume_context: strings(&[("mounter", "krbd")]),
        secrets: strings(&[("userKey", "AQBfake==")]),
        publish_context: HashMap::new(),
    }
}

fn unstage_request(staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: VOLUME.into(),
        staging_target_path: staging.display().to_string(),
    }
}

fn calls(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Unmounts anything left under the root when a test fails.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for m in common::mounts_under(&self.0) {
            let _ = mount::unmount_all(&m);
        }
    }
}

#[tokio::test]
async fn restage_with_a_record_but_no_mount_reuses_the_mapping_and_unstage_unmaps_it() {
    let tmp = fake_root();
    let root = tmp.path();
    let _cleanup = Cleanup(root.to_path_buf());
    let node = node(root);
    let staging = root.join("staging");
    let device_file = staging.join("device");

    node.node_stage_volume(Request::new(stage_request(&staging)))
        .await
        .unwrap();
    assert_eq!(calls(root), ["map kube/pvc-1"]);
    assert!(mount::is_mount_point(&device_file).unwrap());
    // The mount is lost while the staging record stays (a crash between map and mount, a node
    // plugin restart in a fresh mount namespace): staging again must not map a second device.
    mount::unmount_all(&device_file).unwrap();
    node.node_stage_volume(Request::new(stage_request(&staging)))
        .await
        .unwrap();
    assert_eq!(calls(root), ["map kube/pvc-1"], "mapped a second time");
    assert!(mount::is_mount_point(&device_file).unwrap());
    let devices = std::fs::read_dir(root.join("sys/bus/rbd/devices"))
        .unwrap()
        .count();
    assert_eq!(devices, 1, "a leaked /dev/rbdN");

    node.node_unstage_volume(Request::new(unstage_request(&staging)))
        .await
        .unwrap();
    assert_eq!(
        calls(root),
        [
            "map kube/pvc-1".to_owned(),
            format!("unmap {}", root.join("dev/rbd0").display())
        ]
    );
    assert!(!mount::is_mount_point(&device_file).unwrap());
    assert!(
        rbd_csi::node::record::read(&staging).unwrap().is_none(),
        "record removed"
    );
}

#[tokio::test]
async fn unstage_after_a_reboot_leaves_another_volumes_device_mapped() {
    let tmp = fake_root();
    let root = tmp.path();
    let _cleanup = Cleanup(root.to_path_buf());
    let node = node(root);
    let staging = root.join("staging");

    node.node_stage_volume(Request::new(stage_request(&staging)))
        .await
        .unwrap();
    // "Reboot": the mount is gone and /dev/rbd0 now maps another volume's image.
    mount::unmount_all(&staging.join("device")).unwrap();
    std::fs::write(root.join("sys/bus/rbd/devices/0/name"), "pvc-other\n").unwrap();

    node.node_unstage_volume(Request::new(unstage_request(&staging)))
        .await
        .unwrap();
    assert_eq!(
        calls(root),
        ["map kube/pvc-1"],
        "unstage unmapped another volume's device"
    );
    assert!(root.join("sys/bus/rbd/devices/0").exists());
    assert!(rbd_csi::node::record::read(&staging).unwrap().is_none());
}

#[tokio::test]
async fn unsafe_names_never_reach_the_mapper() {
    let tmp = fake_root();
    let root = tmp.path();
    let node = node(root);
    let staging = root.join("staging");
    for (key, value, field) in [
        ("imageName", "../../etc/passwd", "volume_context.imageName"),
        ("pool", "-o", "volume_context.pool"),
        ("userID", "admin]\n[x", "volume_context.userID"),
        ("monitors", "m:1\nkeyring = /x", "volume_context.monitors"),
    ] {
        let mut req = stage_request(&staging);
        req.volume_context.insert(key.into(), value.into());
        let err = node.node_stage_volume(Request::new(req)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let mut req = stage_request(&staging);
    req.volume_id = "v1/m:1/kube/..".into();
    let err = node.node_stage_volume(Request::new(req)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("volume_id"), "{}", err.message());
    assert!(calls(root).is_empty(), "the mapper ran");
    assert!(!staging.exists(), "the staging path was created");
}
