//! An image's group snapshots on a private Ceph 16 cluster: the group an image is in, the
//! snapshots it carries for group snapshots (group namespace, which `snap_list` leaves out), and
//! a full copy of the image as of a group snapshot, compared with the `rbd` CLI's export (not our
//! code) while the image itself has moved on.

mod common;

use std::io::Write;
use std::process::Stdio;

use ceph_rbd::{CreateOptions, Features};
use common::{connect, pool_name, unique};

const MIB: usize = 1 << 20;

fn rbd_cli(args: &[&str], input: Option<&[u8]>) -> Vec<u8> {
    let mut child = micro_ceph::cluster()
        .cli("rbd")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    if let Some(data) = input {
        stdin.write_all(data).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "rbd {args:?}");
    out.stdout
}

#[tokio::test]
async fn an_image_is_copied_as_of_its_group_snapshot() {
    let cluster = connect().await;
    let pool = pool_name();
    let (image, copy, group) = (unique("gsrc"), unique("gcopy"), unique("grp"));
    let data: Vec<u8> = (0..2 * MIB).map(|i| (i % 253) as u8).collect();
    rbd_cli(
        &["import", "--no-progress", "-", &format!("{pool}/{image}")],
        Some(&data),
    );
    assert_eq!(cluster.image_group(&pool, &image).await.unwrap(), None);
    cluster.group_create(&pool, &group).await.unwrap();
    cluster
        .group_image(&pool, &group, &pool, &image, true)
        .await
        .unwrap();
    let (_, in_group) = cluster.image_group(&pool, &image).await.unwrap().unwrap();
    assert_eq!(in_group, group);
    cluster.group_snap(&pool, &group, "gs", true).await.unwrap();
    let snaps = cluster.image_group_snaps(&pool, &image).await.unwrap();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    assert_eq!(
        (snaps[0].group.as_str(), snaps[0].group_snap.as_str()),
        (group.as_str(), "gs")
    );
    assert!(cluster.snap_list(&pool, &image).await.unwrap().is_empty());

    // the image moves on after the group snapshot
    rbd_cli(
        &[
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "65536",
            "--io-total",
            "65536",
            "--io-pattern",
            "seq",
            &format!("{pool}/{image}"),
        ],
        None,
    );
    let options = CreateOptions {
        features: Some(Features::LAYERING | Features::EXCLUSIVE_LOCK | Features::DEEP_FLATTEN),
        ..CreateOptions::default()
    };
    // an unknown group snapshot is not found, and nothing is created
    let err = cluster
        .copy_group_snapshot(&pool, &image, &group, "nope", &pool, &copy, &options)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    assert!(!cluster.image_exists(&pool, &copy).await.unwrap());
    cluster
        .copy_group_snapshot(&pool, &image, &group, "gs", &pool, &copy, &options)
        .await
        .unwrap();
    let exported = rbd_cli(
        &["export", "--no-progress", &format!("{pool}/{copy}"), "-"],
        None,
    );
    assert!(
        exported == data,
        "the copy is not the image as of the group snapshot"
    );
    let now = rbd_cli(
        &["export", "--no-progress", &format!("{pool}/{image}"), "-"],
        None,
    );
    assert!(
        now != data,
        "the image was not written after the group snapshot"
    );
    // a full copy: no parent, no snapshots
    assert_eq!(cluster.parent(&pool, &copy).await.unwrap(), None);
    assert!(cluster.snap_list(&pool, &copy).await.unwrap().is_empty());
    assert!(
        cluster
            .image_group_snaps(&pool, &copy)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        cluster.image_info(&pool, &copy).await.unwrap().size,
        data.len() as u64
    );

    // removing the group takes its snapshot and leaves the image in no group
    cluster.group_remove(&pool, &group).await.unwrap();
    assert_eq!(cluster.image_group(&pool, &image).await.unwrap(), None);
    assert!(
        cluster
            .image_group_snaps(&pool, &image)
            .await
            .unwrap()
            .is_empty()
    );
    cluster.remove_image(&pool, &copy).await.unwrap();
    cluster.remove_image(&pool, &image).await.unwrap();
}
