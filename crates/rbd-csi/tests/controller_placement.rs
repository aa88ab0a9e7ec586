//! Where `CreateVolume` puts volumes, against a private Ceph cluster: RADOS namespaces (images in
//! each, deletes and listings never crossing), `clusterID` through a cluster config file edited
//! while the driver runs, and `topologyConstrainedPools` picking the pool from
//! `accessibility_requirements`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::controller::{MIB, create_request, secrets};
use common::{TestServer, strings};
use rbd_csi::proto::csi::{self, controller_client::ControllerClient};
use rbd_csi::{ProbeCluster, Services};
use rbd_volume::clusters::ClusterConfigFile;
use tonic::Code;
use tonic::transport::Channel;

const DRIVER: &str = "rbd.provisioner.ceph.io";

fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn create_namespace(namespace: &str) {
    let cluster = micro_ceph::cluster();
    cluster
        .rbd(&[
            "namespace",
            "create",
            &format!("{}/{namespace}", cluster.pool),
        ])
        .unwrap();
}

fn create_pool(pool: &str) {
    let cluster = micro_ceph::cluster();
    let out = cluster
        .cli("ceph")
        .args(["osd", "pool", "create", pool, "8"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster.rbd(&["pool", "init", pool]).unwrap();
}

/// The images of `spec` (`pool` or `pool/namespace`).
fn images(spec: &str) -> Vec<String> {
    micro_ceph::cluster()
        .rbd(&["ls", spec])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn server_with(config: Option<&std::path::Path>) -> TestServer {
    let cluster = micro_ceph::cluster();
    let file = config.map(|p| std::sync::Arc::new(ClusterConfigFile::open(p).unwrap()));
    TestServer::start(Services::All, |c| {
        c.probe = Some(ProbeCluster {
            monitors: cluster.monitors.clone(),
            user: "admin".into(),
            key: cluster.admin_key.clone(),
        });
        c.cluster_config = file;
    })
    .await
}

fn request(name: &str, params: &[(&str, &str)]) -> csi::CreateVolumeRequest {
    let mut req = create_request(name, 8 * MIB);
    req.parameters.remove("monitors");
    req.parameters.extend(strings(params));
    req
}

async fn create(
    client: &mut ControllerClient<Channel>,
    req: csi::CreateVolumeRequest,
) -> Result<csi::Volume, tonic::Status> {
    client
        .create_volume(req)
        .await
        .map(|r| r.into_inner().volume.unwrap())
}

async fn delete(
    client: &mut ControllerClient<Channel>,
    volume_id: &str,
) -> Result<(), tonic::Status> {
    client
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            secrets: secrets(),
        })
        .await
        .map(drop)
}

async fn listed_ids(client: &mut ControllerClient<Channel>) -> Vec<String> {
    client
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.volume.map(|v| v.volume_id))
        .collect()
}

#[tokio::test]
async fn volumes_of_two_namespaces_never_cross() {
    let ceph = micro_ceph::cluster();
    let (a, b) = (unique("tenant-a"), unique("tenant-b"));
    create_namespace(&a);
    create_namespace(&b);
    let server = server_with(None).await;
    let mut client = server.controller().await;
    // one request name in both namespaces: the same image name, two images
    let name = unique("pvc-ns");
    let in_a = create(
        &mut client,
        request(
            &name,
            &[("monitors", &ceph.monitors), ("radosNamespace", &a)],
        ),
    )
    .await
    .unwrap();
    let in_b = create(
        &mut client,
        request(
            &name,
            &[("monitors", &ceph.monitors), ("radosNamespace", &b)],
        ),
    )
    .await
    .unwrap();
    let (spec_a, spec_b) = (format!("{}/{a}", ceph.pool), format!("{}/{b}", ceph.pool));
    assert_eq!(
        in_a.volume_id,
        format!("v1/{}/{spec_a}/{name}", ceph.monitors)
    );
    assert_eq!(in_a.volume_context["radosNamespace"], a);
    assert_eq!(images(&spec_a), vec![name.clone()]);
    assert_eq!(images(&spec_b), vec![name.clone()]);
    assert!(
        !images(&ceph.pool).contains(&name),
        "nothing in the default namespace"
    );

    // listing: each volume under its own namespace's ID, never the other's image
    let listed = listed_ids(&mut client).await;
    assert!(
        listed.contains(&in_a.volume_id) && listed.contains(&in_b.volume_id),
        "{listed:?}"
    );
    assert!(
        !listed.contains(&format!("v1/{}/{}/{name}", ceph.monitors, ceph.pool)),
        "{listed:?}"
    );

    // deleting a's volume leaves b's image of the same name
    delete(&mut client, &in_a.volume_id).await.unwrap();
    assert!(images(&spec_a).is_empty());
    assert_eq!(images(&spec_b), vec![name.clone()]);
    // an ID naming the default namespace finds nothing there and deletes nothing elsewhere
    delete(
        &mut client,
        &format!("v1/{}/{}/{name}", ceph.monitors, ceph.pool),
    )
    .await
    .unwrap();
    assert_eq!(images(&spec_b), vec![name.clone()]);
    delete(&mut client, &in_b.volume_id).await.unwrap();
    assert!(images(&spec_b).is_empty());
}

#[tokio::test]
async fn a_namespace_that_does_not_exist_is_refused_naming_rados_namespace() {
    let ceph = micro_ceph::cluster();
    let server = server_with(None).await;
    let mut client = server.controller().await;
    let missing = unique("never-created");
    let name = unique("pvc-missing-ns");
    let e = create(
        &mut client,
        request(
            &name,
            &[("monitors", &ceph.monitors), ("radosNamespace", &missing)],
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("radosNamespace") && e.message().contains(&missing),
        "{}",
        e.message()
    );
    assert!(!images(&ceph.pool).contains(&name), "nothing created");
}

/// Replaces the file's contents the way a ConfigMap volume does: a new file swapped in (a new
/// inode, so the change is seen even within one timestamp tick).
fn rewrite(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn cluster_id_volumes_follow_edited_monitors_without_a_restart() {
    let ceph = micro_ceph::cluster();
    let namespace = unique("from-config");
    create_namespace(&namespace);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let config = |monitors: &str| {
        serde_json::json!([{"clusterID": "micro", "monitors": [monitors],
            "rbd": {"radosNamespace": namespace}}])
        .to_string()
    };
    std::fs::write(&path, config(&ceph.monitors)).unwrap();
    let server = server_with(Some(&path)).await;
    let mut client = server.controller().await;

    let name = unique("pvc-named");
    let volume = create(&mut client, request(&name, &[("clusterID", "micro")]))
        .await
        .unwrap();
    // the ID names the cluster, not its monitors; the namespace is the config entry's
    let spec = format!("{}/{namespace}", ceph.pool);
    assert_eq!(volume.volume_id, format!("v2/micro/{spec}/{name}"));
    assert_eq!(volume.volume_context["clusterID"], "micro");
    assert!(!volume.volume_context.contains_key("monitors"));
    assert_eq!(images(&spec), vec![name.clone()]);

    // monitors and clusterID together, and an unknown cluster, are refused naming the parameter
    let e = create(
        &mut client,
        request(
            &unique("pvc"),
            &[("clusterID", "micro"), ("monitors", &ceph.monitors)],
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("clusterID") && e.message().contains("monitors"),
        "{}",
        e.message()
    );
    let e = create(
        &mut client,
        request(&unique("pvc"), &[("clusterID", "elsewhere")]),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("\"elsewhere\"") && e.message().contains("micro"),
        "{}",
        e.message()
    );

    // the monitors move (here: to an address where nothing answers): the next call uses them
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    rewrite(&path, &config(&dead));
    let expand = |bytes: i64| csi::ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        secrets: secrets(),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let e = client
        .controller_expand_volume(expand(16 * MIB))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(
        e.message().contains(&dead),
        "the edited monitors were used: {}",
        e.message()
    );
    // and back at the right address, the same volume ID works again, no restart
    rewrite(&path, &config(&ceph.monitors));
    let grown = client
        .controller_expand_volume(expand(16 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 16 * MIB);
    delete(&mut client, &volume.volume_id).await.unwrap();
    assert!(images(&spec).is_empty());
}

fn topology(zone: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(format!("topology.{DRIVER}/zone"), zone.to_owned())]),
    }
}

#[tokio::test]
async fn topology_constrained_pools_pick_the_pool_of_the_requested_zone() {
    let ceph = micro_ceph::cluster();
    let zone_b_pool = unique("zone-b");
    create_pool(&zone_b_pool);
    let pools = serde_json::json!([
        {"poolName": ceph.pool, "domainSegments": [{"domainLabel": "zone", "value": "a"}]},
        {"poolName": zone_b_pool, "domainSegments": [{"domainLabel": "zone", "value": "b"}]}
    ])
    .to_string();
    let server = server_with(None).await;
    let mut client = server.controller().await;
    let params = [
        ("monitors", ceph.monitors.as_str()),
        ("topologyConstrainedPools", pools.as_str()),
    ];

    // preferred b (the selected node's zone), requisite a and b: b's pool
    let name = unique("pvc-zone-b");
    let mut req = request(&name, &params);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![topology("a"), topology("b")],
        preferred: vec![topology("b")],
    });
    let volume = create(&mut client, req).await.unwrap();
    assert_eq!(volume.accessible_topology, vec![topology("b")]);
    assert_eq!(volume.volume_context["pool"], zone_b_pool);
    assert_eq!(images(&zone_b_pool), vec![name.clone()]);
    assert!(!images(&ceph.pool).contains(&name));

    // only requisite c then a: a's pool
    let name_a = unique("pvc-zone-a");
    let mut req = request(&name_a, &params);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![topology("c"), topology("a")],
        preferred: Vec::new(),
    });
    let volume_a = create(&mut client, req).await.unwrap();
    assert_eq!(volume_a.accessible_topology, vec![topology("a")]);
    assert!(images(&ceph.pool).contains(&name_a));

    // a zone no pool serves: RESOURCE_EXHAUSTED (the external-provisioner reschedules), nothing made
    let name_c = unique("pvc-zone-c");
    let mut req = request(&name_c, &params);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![topology("c")],
        preferred: vec![topology("c")],
    });
    let e = create(&mut client, req).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("zone=c"), "{}", e.message());
    assert!(!images(&ceph.pool).contains(&name_c) && !images(&zone_b_pool).contains(&name_c));

    delete(&mut client, &volume.volume_id).await.unwrap();
    delete(&mut client, &volume_a.volume_id).await.unwrap();
    assert!(images(&zone_b_pool).is_empty());
}

#[tokio::test]
async fn a_namespaced_cluster_id_volume_stages_from_its_id_and_context() {
    let ceph = micro_ceph::cluster();
    let namespace = unique("staged");
    create_namespace(&namespace);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        serde_json::json!([{"clusterID": "micro", "monitors": [ceph.monitors]}]).to_string(),
    )
    .unwrap();
    let server = server_with(Some(&path)).await;
    let mut client = server.controller().await;
    let mut node = server.node().await;
    // the same image name in the default namespace, smaller: staging must not pick it
    let name = unique("pvc-staged");
    ceph.rbd(&["create", "--size", "8M", &format!("{}/{name}", ceph.pool)])
        .unwrap();
    let mut req = request(
        &name,
        &[("clusterID", "micro"), ("radosNamespace", &namespace)],
    );
    req.capacity_range = Some(csi::CapacityRange {
        required_bytes: 64 * MIB,
        limit_bytes: 0,
    });
    let volume = create(&mut client, req).await.unwrap();
    assert_eq!(
        volume.volume_id,
        format!("v2/micro/{}/{namespace}/{name}", ceph.pool)
    );
    // rbd-fuse serves the namespace (-s); the volume context carries no monitors
    let staging = server.dir.path().join("ns/globalmount");
    let stage = |context: HashMap<String, String>| csi::NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(common::mount_cap("ext4")),
        secrets: secrets(),
        volume_context: context,
        publish_context: HashMap::new(),
    };
    node.node_stage_volume(stage(volume.volume_context.clone()))
        .await
        .unwrap();
    let total = rbd_csi::fs::usage(&staging).unwrap().total_bytes;
    assert!(
        total > 40 * 1024 * 1024,
        "the 64 MiB image is staged, not the 8 MiB one: {total}"
    );
    std::fs::write(staging.join("f"), "in the namespace").unwrap();
    let unstage = csi::NodeUnstageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        staging_target_path: staging.display().to_string(),
    };
    node.node_unstage_volume(unstage.clone()).await.unwrap();
    // from the ID alone (no context, as after a migration): the same filesystem
    node.node_stage_volume(stage(HashMap::from([(
        "mounter".to_owned(),
        "fuse".to_owned(),
    )])))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(staging.join("f")).unwrap(),
        "in the namespace"
    );
    node.node_unstage_volume(unstage).await.unwrap();
    common::volume::assert_nothing_left(&server);
    delete(&mut client, &volume.volume_id).await.unwrap();
    assert!(images(&format!("{}/{namespace}", ceph.pool)).is_empty());
    // the default namespace's image of that name is untouched
    assert!(images(&ceph.pool).contains(&name));
    ceph.rbd(&["rm", "--no-progress", &format!("{}/{name}", ceph.pool)])
        .unwrap();
}

#[tokio::test]
async fn snapshots_restores_and_group_snapshots_of_a_namespaced_cluster_id_volume_stay_in_it() {
    use rbd_csi::proto::csi::group_controller_client::GroupControllerClient;
    let ceph = micro_ceph::cluster();
    let namespace = unique("snaps");
    create_namespace(&namespace);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(
        &path,
        serde_json::json!([{"clusterID": "micro", "monitors": [ceph.monitors],
            "rbd": {"radosNamespace": namespace}}])
        .to_string(),
    )
    .unwrap();
    let server = server_with(Some(&path)).await;
    let mut client = server.controller().await;
    let params = [("clusterID", "micro")];
    let source = create(&mut client, request(&unique("pvc-src"), &params))
        .await
        .unwrap();
    let spec = format!("{}/{namespace}", ceph.pool);

    // a snapshot: s2 ID with the namespace, its image in the namespace
    let snapshot = client
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: source.volume_id.clone(),
            name: unique("snap"),
            secrets: secrets(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let prefix = format!("s2/micro/{spec}/csi-snap-");
    assert!(
        snapshot.snapshot_id.starts_with(&prefix),
        "{}",
        snapshot.snapshot_id
    );
    assert!(images(&spec).iter().any(|i| i.starts_with("csi-snap-")));
    assert!(
        !images(&ceph.pool)
            .iter()
            .any(|i| snapshot.snapshot_id.ends_with(i.as_str()))
    );
    let listed = client
        .list_snapshots(csi::ListSnapshotsRequest {
            source_volume_id: source.volume_id.clone(),
            secrets: secrets(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].snapshot.as_ref().unwrap().snapshot_id,
        snapshot.snapshot_id
    );

    // a restore and a clone of the same class land in the namespace
    let mut restore = request(&unique("pvc-restore"), &params);
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot.snapshot_id.clone(),
            },
        )),
    });
    let restored = create(&mut client, restore).await.unwrap();
    assert!(restored.volume_id.starts_with(&format!("v2/micro/{spec}/")));
    let mut clone = request(&unique("pvc-clone"), &params);
    clone.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: source.volume_id.clone(),
            },
        )),
    });
    let cloned = create(&mut client, clone).await.unwrap();
    // a class of another cluster cannot clone it
    let mut foreign = request(&unique("pvc-foreign"), &[("monitors", &ceph.monitors)]);
    foreign.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: source.volume_id.clone(),
            },
        )),
    });
    let e = create(&mut client, foreign).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("clusterID micro"), "{}", e.message());

    // a group snapshot: g2 ID, members s2 in the namespace
    let mut groups = GroupControllerClient::new(server.channel().await);
    let group = groups
        .create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest {
            name: unique("group"),
            source_volume_ids: vec![source.volume_id.clone(), cloned.volume_id.clone()],
            secrets: secrets(),
            parameters: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert!(
        group
            .group_snapshot_id
            .starts_with(&format!("g2/micro/{spec}/csi-group-")),
        "{}",
        group.group_snapshot_id
    );
    assert!(
        group
            .snapshots
            .iter()
            .all(|s| s.snapshot_id.starts_with(&prefix))
    );
    groups
        .delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            snapshot_ids: group
                .snapshots
                .iter()
                .map(|s| s.snapshot_id.clone())
                .collect(),
            secrets: secrets(),
        })
        .await
        .unwrap();

    client
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            secrets: secrets(),
        })
        .await
        .unwrap();
    for volume in [&cloned, &restored, &source] {
        delete(&mut client, &volume.volume_id).await.unwrap();
    }
    // everything, snapshot images and clone intermediates included, was in the namespace
    assert_eq!(images(&spec), Vec::<String>::new());
    let trash = ceph.rbd(&["trash", "ls", &spec]).unwrap();
    assert_eq!(trash.trim(), "", "trash left in the namespace");
}

#[tokio::test]
async fn topology_is_reported_and_advertised_only_when_configured() {
    use rbd_csi::proto::csi::plugin_capability::{Type, service};
    let key = format!("topology.{DRIVER}/zone");
    let accessibility = |caps: Vec<csi::PluginCapability>| {
        caps.into_iter().any(|c| {
            matches!(c.r#type, Some(Type::Service(s))
                if s.r#type == service::Type::VolumeAccessibilityConstraints as i32)
        })
    };
    let plain = TestServer::start(Services::Node, |_| {}).await;
    let info = plain
        .node()
        .await
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.accessible_topology, None);
    let caps = plain
        .identity()
        .await
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(!accessibility(caps));

    let zoned = TestServer::start(Services::Node, |c| {
        c.topology_labels = vec!["topology.kubernetes.io/zone".into()];
        c.node_topology = [(key.clone(), "b".to_owned())].into();
    })
    .await;
    let info = zoned
        .node()
        .await
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.accessible_topology, Some(topology("b")));
    let caps = zoned
        .identity()
        .await
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(accessibility(caps));
}
