//! The controller on the volume core (`rbd-volume`), against a private Ceph cluster: what a
//! crash of an earlier create leaves is repaired by the next CreateVolume, and DeleteVolume
//! checks the owner record as the built-in provisioner does.

mod common;

use std::collections::HashMap;

use common::controller::{MIB, create_request, image_size, remove_image, secrets, server};
use rbd_csi::proto::csi::{self, controller_client::ControllerClient};
use tonic::Code;
use tonic::transport::Channel;

fn image_spec(image: &str) -> String {
    format!("{}/{image}", micro_ceph::cluster().pool)
}

fn owner_record(image: &str) -> HashMap<String, String> {
    let out = micro_ceph::cluster()
        .rbd(&["image-meta", "list", "--format", "json", &image_spec(image)])
        .unwrap();
    // `rbd image-meta list` prints nothing at all for an image without metadata
    if out.trim().is_empty() {
        return HashMap::new();
    }
    serde_json::from_str(&out).unwrap()
}

fn set_meta(image: &str, key: &str, value: &str) {
    micro_ceph::cluster()
        .rbd(&["image-meta", "set", &image_spec(image), key, value])
        .unwrap();
}

fn volume_id(image: &str) -> String {
    let cluster = micro_ceph::cluster();
    format!("v1/{}/{}/{image}", cluster.monitors, cluster.pool)
}

/// What a create killed after writing `rbd_id.<image>` but before `rbd_header.<id>` leaves: a
/// name that exists (create says EEXIST) but cannot be opened (ENOENT).
fn make_half_created(image: &str) {
    let cluster = micro_ceph::cluster();
    remove_image(image);
    cluster
        .rbd(&["create", "--size", "8M", &image_spec(image)])
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(
        &cluster
            .rbd(&["info", "--format", "json", &image_spec(image)])
            .unwrap(),
    )
    .unwrap();
    let id = info["id"].as_str().unwrap();
    let out = cluster
        .cli("rados")
        .args(["-p", &cluster.pool, "rm", &format!("rbd_header.{id}")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        image_size(image),
        None,
        "the half-created image still opens"
    );
}

fn assert_full_record(image: &str, name: &str) {
    let meta = owner_record(image);
    assert_eq!(meta["provisioner.ceph.com/pv"], name, "{meta:?}");
    assert_eq!(meta["provisioner.ceph.com/claim"], "apps/data", "{meta:?}");
    assert_eq!(
        meta["provisioner.ceph.com/provisioner"], "rbd.provisioner.ceph.io",
        "{meta:?}"
    );
}

async fn delete(
    ctl: &mut ControllerClient<Channel>,
    volume_id: String,
) -> Result<(), tonic::Status> {
    ctl.delete_volume(csi::DeleteVolumeRequest {
        volume_id,
        secrets: secrets(),
    })
    .await
    .map(drop)
}

#[tokio::test]
async fn create_repairs_an_image_whose_create_was_killed_midway() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let name = "pvc-repair-headerless";
    make_half_created(name);

    let vol = ctl
        .create_volume(create_request(name, 16 * MIB))
        .await
        .expect("CreateVolume repairs the half-created image")
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.volume_id, volume_id(name));
    assert_eq!(vol.capacity_bytes, 16 * MIB);
    assert_eq!(
        image_size(name),
        Some(16 << 20),
        "created again at full size"
    );
    assert_full_record(name, name);
    // and it is a normal volume from now on
    let again = ctl
        .create_volume(create_request(name, 16 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, vol.volume_id);
    delete(&mut ctl, vol.volume_id).await.unwrap();
    assert_eq!(image_size(name), None);
}

#[tokio::test]
async fn create_adopts_an_image_whose_owner_record_is_missing_or_cut_short() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let cluster = micro_ceph::cluster();
    // no record at all (a crash right after the create), and a record cut before its PV key
    // (the keys are written in one open, the PV key last)
    let bare = "pvc-repair-unrecorded";
    let cut = "pvc-repair-cut-record";
    for image in [bare, cut] {
        remove_image(image);
        cluster
            .rbd(&["create", "--size", "16M", &image_spec(image)])
            .unwrap();
    }
    set_meta(
        cut,
        "provisioner.ceph.com/provisioner",
        "rbd.provisioner.ceph.io",
    );
    set_meta(cut, "provisioner.ceph.com/claim", "apps/data");

    for name in [bare, cut] {
        let vol = ctl
            .create_volume(create_request(name, 16 * MIB))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"))
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(vol.capacity_bytes, 16 * MIB, "{name}");
        assert_full_record(name, name);
        delete(&mut ctl, vol.volume_id).await.unwrap();
        assert_eq!(image_size(name), None, "{name}");
    }
}

#[tokio::test]
async fn delete_refuses_an_image_recorded_for_another_volume() {
    let server = server().await;
    let mut ctl = server.controller().await;
    let cluster = micro_ceph::cluster();
    let image = "pvc-repair-victim";
    remove_image(image);
    cluster
        .rbd(&["create", "--size", "4M", &image_spec(image)])
        .unwrap();
    set_meta(image, "provisioner.ceph.com/claim", "apps/other");
    set_meta(image, "provisioner.ceph.com/pv", "someone-else");

    let err = delete(&mut ctl, volume_id(image)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    // the provisioner's wording: whose image it is, and that it is left alone
    assert_eq!(
        err.message(),
        format!(
            "image {} belongs to PV someone-else (claim apps/other), not {image}; refusing to delete it",
            image_spec(image)
        )
    );
    assert_eq!(image_size(image), Some(4 << 20), "the image must survive");

    // An image without a record (nothing says it is another volume's) is deleted.
    let bare = "pvc-repair-bare-delete";
    remove_image(bare);
    cluster
        .rbd(&["create", "--size", "4M", &image_spec(bare)])
        .unwrap();
    delete(&mut ctl, volume_id(bare)).await.unwrap();
    assert_eq!(image_size(bare), None);
    remove_image(image);
}

#[tokio::test]
async fn with_a_kube_cluster_id_images_record_it_and_another_clusters_are_not_deleted() {
    let cluster = micro_ceph::cluster();
    let server = common::TestServer::start(rbd_csi::Services::All, |c| {
        c.probe = Some(rbd_csi::config::ProbeCluster {
            monitors: cluster.monitors.clone(),
            user: "admin".into(),
            key: cluster.admin_key.clone(),
        });
        c.kube_cluster = "uid-of-this-cluster".into();
    })
    .await;
    let mut ctl = server.controller().await;
    // a volume made here records the cluster
    let name = "pvc-kube-cluster-ours";
    remove_image(name);
    let vol = ctl
        .create_volume(create_request(name, 16 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        owner_record(name)
            .get("provisioner.ceph.com/kube-cluster")
            .map(String::as_str),
        Some("uid-of-this-cluster")
    );
    delete(&mut ctl, vol.volume_id).await.unwrap();
    assert_eq!(image_size(name), None);

    // the same name recorded by another Kubernetes cluster sharing the pool is left alone
    let theirs = "pvc-kube-cluster-theirs";
    remove_image(theirs);
    cluster
        .rbd(&["create", "--size", "4M", &image_spec(theirs)])
        .unwrap();
    set_meta(theirs, "provisioner.ceph.com/pv", theirs);
    set_meta(
        theirs,
        "provisioner.ceph.com/kube-cluster",
        "uid-of-another",
    );
    let err = delete(&mut ctl, volume_id(theirs)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("uid-of-another"),
        "{}",
        err.message()
    );
    assert_eq!(image_size(theirs), Some(4 << 20), "the image must survive");
    // one recorded before the cluster was kept is judged by its name alone
    cluster
        .rbd(&[
            "image-meta",
            "remove",
            &image_spec(theirs),
            "provisioner.ceph.com/kube-cluster",
        ])
        .unwrap();
    delete(&mut ctl, volume_id(theirs)).await.unwrap();
    assert_eq!(image_size(theirs), None);
}
