//! An existing mapping is reused only for the caller it belongs to: the caller's key is checked
//! with the cluster first (a wrong key never gets the device of an image mapped on the node
//! already), and a krbd mapping only for the same cluster (sysfs `cluster_fsid`), so an image of
//! the same pool and name in a second cluster is mapped on its own and unmapped on its own.
//! Real clusters (micro-ceph, a second one started here); krbd on a fake kernel (a stand-in
//! `rbd` that creates the sysfs tree the kernel would, with the fsid of the cluster named by
//! `-m`). Runs as root.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::volume::{Volume, assert_nothing_left};
use common::{TestImage, TestServer, block_cap, mount_cap, strings};
use micro_ceph::MicroCeph;
use rbd_csi::mapper::Mapper;
use rbd_csi::mapper::krbd::KrbdMapper;
use rbd_csi::node::{NodeConfig, NodeService};
use rbd_csi::proto::csi::{self, node_server::Node};
use rbd_csi::{MounterKind, Services, mount};
use tonic::Request;

#[tokio::test]
async fn a_wrong_key_does_not_get_the_device_of_an_image_mapped_already() {
    let server = TestServer::start(Services::Node, |_| {}).await;
    let image = TestImage::create("csi-reuse-wrong-key", 32);
    let mut owner = Volume::new(&server, &image, mount_cap("ext4")).await;
    owner.stage().await.unwrap();

    // The same image at another staging path, with a key Ceph refuses.
    let key = micro_ceph::cluster().admin_key.clone();
    let len = key.trim_end_matches('=').len();
    let wrong: String = key
        .chars()
        .enumerate()
        .map(|(i, c)| match (i >= len - 8 && i < len - 1, c) {
            (false, c) => c,
            (true, 'A') => 'B',
            (true, _) => 'A',
        })
        .collect();
    let staging = server.dir.path().join("intruder/globalmount");
    let err = server
        .node()
        .await
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: image.volume_id(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_cap("ext4")),
            secrets: strings(&[("userID", "admin"), ("userKey", &wrong)]),
            volume_context: image.context(),
            publish_context: HashMap::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(!err.message().contains(&wrong));
    assert!(
        !mount::is_mount_point(&staging).unwrap(),
        "staged with a wrong key"
    );
    assert!(rbd_csi::node::record::read(&staging).unwrap().is_none());

    // The owner's staging is untouched.
    assert!(mount::is_mount_point(&owner.staging).unwrap());
    owner.unstage().await.unwrap();
    assert_nothing_left(&server);
}

/// A fake kernel under `root` whose `rbd map` records the fsid of the cluster it was given:
/// `<root>/fsid/<monitors with : . , as _>` holds it.
fn krbd_node(root: &Path) -> NodeService {
    let script = root.join("fake-rbd");
    micro_ceph::write_executable(
        &script,
        &format!(
            r#"#!/bin/sh
root={root}
echo "$1 $2" >> "$root/calls"
case "$1" in
map)
  spec="$2"; mon=""; prev=""
  for a in "$@"; do [ "$prev" = "-m" ] && mon="$a"; prev="$a"; done
  fsid=$(cat "$root/fsid/$(echo "$mon" | tr ':.,' '___')") || exit 1
  n=0; while [ -e "$root/sys/bus/rbd/devices/$n" ]; do n=$((n+1)); done
  d="$root/sys/bus/rbd/devices/$n"; mkdir -p "$d"
  echo "${{spec%%/*}}" > "$d/pool"; echo "${{spec#*/}}" > "$d/name"; echo > "$d/pool_ns"
  echo - > "$d/current_snap"; echo "$fsid" > "$d/cluster_fsid"
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
    for dir in ["sys/bus/rbd/devices", "dev", "fsid"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
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
}

/// Tells the fake kernel the fsid of `cluster`.
fn register_fsid(root: &Path, cluster: &MicroCeph) -> String {
    let out = cluster
        .cli("ceph")
        .args(["fsid"])
        .output()
        .expect("ceph fsid");
    assert!(out.status.success(), "{out:?}");
    let fsid = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let name = cluster.monitors.replace([':', '.', ','], "_");
    std::fs::write(root.join("fsid").join(name), &fsid).unwrap();
    fsid
}

fn stage_request(cluster: &MicroCeph, image: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: rbd_csi::volume::VolumeId::new(&cluster.monitors, &cluster.pool, image)
            .encode()
            .unwrap(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(block_cap()),
        volume_context: strings(&[
            ("monitors", &cluster.monitors),
            ("pool", &cluster.pool),
            ("imageName", image),
            ("userID", "admin"),
            ("mounter", "krbd"),
        ]),
        secrets: strings(&[("userID", "admin"), ("userKey", &cluster.admin_key)]),
        publish_context: HashMap::new(),
    }
}

fn unstage_request(
    cluster: &MicroCeph,
    image: &str,
    staging: &Path,
) -> csi::NodeUnstageVolumeRequest {
    let stage = stage_request(cluster, image, staging);
    csi::NodeUnstageVolumeRequest {
        volume_id: stage.volume_id,
        staging_target_path: stage.staging_target_path,
    }
}

/// The fsid the fake kernel shows for the device staged at `staging`.
fn staged_fsid(root: &Path, staging: &Path) -> String {
    let record = rbd_csi::node::record::read(staging).unwrap().unwrap();
    let name = record
        .mapped
        .device
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let id = name.trim_start_matches("rbd");
    std::fs::read_to_string(
        root.join("sys/bus/rbd/devices")
            .join(id)
            .join("cluster_fsid"),
    )
    .unwrap()
    .trim()
    .to_owned()
}

/// Unmounts anything left under the fake root when a test fails.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for m in common::mounts_under(&self.0) {
            let _ = mount::unmount_all(&m);
        }
    }
}

#[tokio::test]
async fn a_krbd_mapping_is_reused_only_for_its_own_cluster() {
    const IMAGE: &str = "csi-reuse-two-clusters";
    let a = micro_ceph::cluster();
    let b = MicroCeph::start().expect("starting a second micro-ceph cluster");
    for cluster in [a, &b] {
        let spec = format!("{}/{IMAGE}", cluster.pool);
        let _ = cluster.rbd(&["rm", "--no-progress", &spec]);
        cluster.rbd(&["create", "--size", "16M", &spec]).unwrap();
    }
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = tmp.path();
    let _cleanup = Cleanup(root.to_path_buf());
    let node = krbd_node(root);
    let fsid_a = register_fsid(root, a);
    let fsid_b = register_fsid(root, &b);
    assert_ne!(fsid_a, fsid_b);
    let (staging_a, staging_b) = (root.join("a/globalmount"), root.join("b/globalmount"));

    node.node_stage_volume(Request::new(stage_request(a, IMAGE, &staging_a)))
        .await
        .unwrap();
    // Same pool and image name, other cluster: a mapping of its own, not cluster A's device.
    node.node_stage_volume(Request::new(stage_request(&b, IMAGE, &staging_b)))
        .await
        .unwrap();
    assert_eq!(staged_fsid(root, &staging_a), fsid_a);
    assert_eq!(
        staged_fsid(root, &staging_b),
        fsid_b,
        "cluster A's device reused for B"
    );
    let devices = std::fs::read_dir(root.join("sys/bus/rbd/devices"))
        .unwrap()
        .count();
    assert_eq!(devices, 2);

    // A restage of B (record kept, mount lost) reuses B's own mapping.
    mount::unmount_all(&staging_b.join("device")).unwrap();
    node.node_stage_volume(Request::new(stage_request(&b, IMAGE, &staging_b)))
        .await
        .unwrap();
    assert_eq!(staged_fsid(root, &staging_b), fsid_b);
    let maps = std::fs::read_to_string(root.join("calls")).unwrap();
    assert_eq!(
        maps.lines().filter(|l| l.starts_with("map ")).count(),
        2,
        "{maps}"
    );

    // Unstaging B unmaps B's device only.
    let record_b = rbd_csi::node::record::read(&staging_b).unwrap().unwrap();
    node.node_unstage_volume(Request::new(unstage_request(&b, IMAGE, &staging_b)))
        .await
        .unwrap();
    assert!(!record_b.mapped.device.exists());
    assert_eq!(staged_fsid(root, &staging_a), fsid_a);
    assert!(mount::is_mount_point(&staging_a.join("device")).unwrap());
    node.node_unstage_volume(Request::new(unstage_request(a, IMAGE, &staging_a)))
        .await
        .unwrap();
    let devices = std::fs::read_dir(root.join("sys/bus/rbd/devices"))
        .unwrap()
        .count();
    assert_eq!(devices, 0);
    let _ = a.rbd(&["rm", "--no-progress", &format!("{}/{IMAGE}", a.pool)]);
}
