//! `ControllerPublishVolume` / `ControllerUnpublishVolume` over a real unix socket against a
//! private Ceph cluster: the node recorded on the image, a single-node volume refused on a second
//! node (FAILED_PRECONDITION) and never recorded for two, idempotent repeats, an incompatible
//! republish (ALREADY_EXISTS), unpublish of unknown or deleted volumes succeeding, a publish
//! without credentials saying in its context that it wrote no record.

mod common;

use common::controller::{MIB, create_volume, remove_image, secrets};
use common::{TestServer, mount_cap};
use rbd_csi::proto::csi;
use rbd_csi::proto::csi::controller_client::ControllerClient;
use rbd_csi::proto::csi::volume_capability::access_mode::Mode;
use rbd_csi::{ProbeCluster, Services};
use tonic::Code;
use tonic::transport::Channel;

/// Removes the test's images at the end, also when an assertion failed.
struct Images(&'static [&'static str]);

impl Images {
    fn fresh(names: &'static [&'static str]) -> Self {
        for name in names {
            remove_image(name);
        }
        Images(names)
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        for name in self.0 {
            remove_image(name);
        }
    }
}

/// A plugin serving `services`, with the cluster's admin key as its probe key.
async fn server(services: Services) -> TestServer {
    let cluster = micro_ceph::cluster();
    TestServer::start(services, |c| {
        c.probe = Some(ProbeCluster {
            monitors: cluster.monitors.clone(),
            user: "admin".into(),
            key: cluster.admin_key.clone(),
        });
    })
    .await
}

fn cap(mode: Mode) -> csi::VolumeCapability {
    let mut cap = mount_cap("ext4");
    if let Some(access) = cap.access_mode.as_mut() {
        access.mode = mode as i32;
    }
    cap
}

fn publish_request(
    volume_id: &str,
    node: &str,
    mode: Mode,
    readonly: bool,
) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        volume_capability: Some(cap(mode)),
        readonly,
        secrets: secrets(),
        ..Default::default()
    }
}

fn unpublish_request(volume_id: &str, node: &str) -> csi::ControllerUnpublishVolumeRequest {
    csi::ControllerUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        node_id: node.into(),
        secrets: secrets(),
    }
}

/// The nodes the image's publication record names, read with the `rbd` CLI.
fn published_nodes(image: &str) -> Vec<String> {
    let cluster = micro_ceph::cluster();
    let value = cluster
        .rbd(&[
            "image-meta",
            "get",
            &format!("{}/{image}", cluster.pool),
            "provisioner.ceph.com/published-nodes",
        ])
        .unwrap_or_default();
    if value.trim().is_empty() {
        return Vec::new();
    }
    let list: Vec<serde_json::Value> = serde_json::from_str(value.trim()).unwrap();
    list.iter()
        .map(|p| p["node"].as_str().unwrap().to_owned())
        .collect()
}

async fn create(ctl: &mut ControllerClient<Channel>, name: &str) -> String {
    create_volume(ctl, name, 8 * MIB).await.volume_id
}

#[tokio::test]
async fn a_single_node_volume_is_published_to_one_node_at_a_time() {
    let _images = Images::fresh(&["pvc-pub-single"]);
    let server = server(Services::Controller).await;
    let mut ctl = server.controller().await;
    let id = create(&mut ctl, "pvc-pub-single").await;

    let first = publish_request(&id, "node-a", Mode::SingleNodeWriter, false);
    ctl.controller_publish_volume(first.clone()).await.unwrap();
    assert_eq!(published_nodes("pvc-pub-single"), ["node-a"]);
    // the same publish again: OK, nothing changes
    ctl.controller_publish_volume(first.clone()).await.unwrap();
    assert_eq!(published_nodes("pvc-pub-single"), ["node-a"]);
    // the same node read-only: incompatible
    let err = ctl
        .controller_publish_volume(publish_request(&id, "node-a", Mode::SingleNodeWriter, true))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // another node while node-a has it: refused, and not recorded
    let second = publish_request(&id, "node-b", Mode::SingleNodeWriter, false);
    let err = ctl
        .controller_publish_volume(second.clone())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("node-a"), "{}", err.message());
    assert_eq!(published_nodes("pvc-pub-single"), ["node-a"]);
    // a multi-node reader does not join a single-node writer either
    let err = ctl
        .controller_publish_volume(publish_request(
            &id,
            "node-b",
            Mode::MultiNodeReaderOnly,
            true,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // node-a lets go: node-b gets it
    ctl.controller_unpublish_volume(unpublish_request(&id, "node-a"))
        .await
        .unwrap();
    assert_eq!(published_nodes("pvc-pub-single"), Vec::<String>::new());
    // unpublish again (not published there any more): OK
    ctl.controller_unpublish_volume(unpublish_request(&id, "node-a"))
        .await
        .unwrap();
    ctl.controller_publish_volume(second).await.unwrap();
    assert_eq!(published_nodes("pvc-pub-single"), ["node-b"]);

    // a publish without secrets uses the probe key: the record is still checked
    let mut no_secrets = publish_request(&id, "node-c", Mode::SingleNodeWriter, false);
    no_secrets.secrets.clear();
    let err = ctl.controller_publish_volume(no_secrets).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");

    // the volume deleted: unpublish succeeds, publish is NOT_FOUND
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id: id.clone(),
        secrets: secrets(),
    })
    .await
    .unwrap();
    ctl.controller_unpublish_volume(unpublish_request(&id, "node-b"))
        .await
        .unwrap();
    let err = ctl.controller_publish_volume(first).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // an ID that is none of ours: not published anywhere
    ctl.controller_unpublish_volume(unpublish_request("not-a-volume-id", "node-a"))
        .await
        .unwrap();
}

#[tokio::test]
async fn multi_node_readers_share_a_volume_and_a_writer_is_refused() {
    let _images = Images::fresh(&["pvc-pub-readers"]);
    let server = server(Services::Controller).await;
    let mut ctl = server.controller().await;
    let id = create(&mut ctl, "pvc-pub-readers").await;

    for node in ["node-a", "node-b"] {
        ctl.controller_publish_volume(publish_request(&id, node, Mode::MultiNodeReaderOnly, true))
            .await
            .unwrap();
    }
    assert_eq!(published_nodes("pvc-pub-readers"), ["node-a", "node-b"]);
    let err = ctl
        .controller_publish_volume(publish_request(
            &id,
            "node-c",
            Mode::SingleNodeWriter,
            false,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    // no node given: unpublished from every node
    ctl.controller_unpublish_volume(unpublish_request(&id, ""))
        .await
        .unwrap();
    assert_eq!(published_nodes("pvc-pub-readers"), Vec::<String>::new());
}

#[tokio::test]
async fn a_plugin_serving_one_node_refuses_other_nodes() {
    let _images = Images::fresh(&["pvc-pub-local"]);
    let server = server(Services::All).await;
    let mut ctl = server.controller().await;
    let id = create(&mut ctl, "pvc-pub-local").await;
    let err = ctl
        .controller_publish_volume(publish_request(
            &id,
            "elsewhere",
            Mode::SingleNodeWriter,
            false,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let local = server.config.node_id.clone();
    ctl.controller_publish_volume(publish_request(&id, &local, Mode::SingleNodeWriter, false))
        .await
        .unwrap();
    assert_eq!(published_nodes("pvc-pub-local"), vec![local.clone()]);
    ctl.controller_unpublish_volume(unpublish_request(&id, &local))
        .await
        .unwrap();
    // missing arguments name the field
    let err = ctl
        .controller_publish_volume(publish_request(&id, "", Mode::SingleNodeWriter, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("node_id"), "{}", err.message());
}

/// No secrets and no probe key: nothing can be recorded. The publish succeeds (PVs made before
/// publishing existed stay attachable) and its publish context, which external-attacher copies
/// to the VolumeAttachment's `status.attachmentMetadata`, says the record was not written.
#[tokio::test]
async fn a_publish_without_credentials_says_in_its_context_that_no_record_was_written() {
    let _images = Images::fresh(&["pvc-pub-nocreds"]);
    let server = TestServer::start(Services::Controller, |_| {}).await;
    let mut ctl = server.controller().await;
    let id = create(&mut ctl, "pvc-pub-nocreds").await;

    let mut bare = publish_request(&id, "node-a", Mode::SingleNodeWriter, false);
    bare.secrets.clear();
    let context = ctl
        .controller_publish_volume(bare)
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert_eq!(
        context
            .get("provisioner.ceph.com/single-writer-record")
            .map(String::as_str),
        Some("not written: no controllerPublishSecretRef secrets and no --probe-key-file")
    );
    assert_eq!(published_nodes("pvc-pub-nocreds"), Vec::<String>::new());

    // with the PV's secrets: recorded, and the context says nothing
    let context = ctl
        .controller_publish_volume(publish_request(
            &id,
            "node-a",
            Mode::SingleNodeWriter,
            false,
        ))
        .await
        .unwrap()
        .into_inner()
        .publish_context;
    assert!(context.is_empty(), "{context:?}");
    assert_eq!(published_nodes("pvc-pub-nocreds"), ["node-a"]);
}
