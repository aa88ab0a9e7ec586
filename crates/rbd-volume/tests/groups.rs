//! Volume group snapshots against a private Ceph cluster, data compared with the `rbd` CLI's
//! import/export (not our code): members hold their sources as of the RBD group snapshot even
//! when the sources were written after it, a create that crashed after the group snapshot (and
//! mid-copy) completes from that same snapshot, the group is gone afterwards, a member deleted
//! on its own cannot be remade, a source in another group is refused without leaving a group,
//! and the delete removes every member.

use std::io::Write;
use std::process::Stdio;
use std::sync::Arc;

use ceph_rbd::{ClusterConfig, ConnectionPool, CreateOptions, PoolOptions, Secret};
use rbd_volume::group::{
    self, GroupError, Member, NewGroupSnapshot, group_name, member_image_name,
};

const MIB: usize = 1 << 20;

async fn cluster() -> Arc<ceph_rbd::Cluster> {
    let ceph = micro_ceph::cluster();
    ConnectionPool::new(PoolOptions::default())
        .get(&ClusterConfig::new(
            &ceph.monitors,
            "admin",
            Secret::new(ceph.admin_key.clone()),
        ))
        .await
        .unwrap()
}

fn pool() -> &'static str {
    &micro_ceph::cluster().pool
}

/// A new image `name` holding `data` (`rbd import` from stdin).
fn import(name: &str, data: &[u8]) {
    let mut child = micro_ceph::cluster()
        .cli("rbd")
        .args([
            "import",
            "--no-progress",
            "-",
            &format!("{}/{name}", pool()),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    assert!(child.wait().unwrap().success(), "rbd import {name}");
}

/// The whole content of `spec` (`pool/image[@snap]`, `rbd export`).
fn export(spec: &str) -> Vec<u8> {
    let ceph = micro_ceph::cluster();
    let out = ceph
        .cli("rbd")
        .args(["export", "--no-progress", spec, "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Overwrites the first 64 KiB of `image` (`rbd bench`: data that is not the imported pattern).
fn overwrite(image: &str) {
    let status = micro_ceph::cluster()
        .cli("rbd")
        .args([
            "bench",
            "--io-type",
            "write",
            "--io-size",
            "65536",
            "--io-total",
            "65536",
            "--io-pattern",
            "seq",
            &format!("{}/{image}", pool()),
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

/// The pool's RBD groups (`rbd group ls`).
fn groups() -> Vec<String> {
    micro_ceph::cluster()
        .rbd(&["group", "ls", pool()])
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn pattern(byte: u8) -> Vec<u8> {
    (0..4 * MIB)
        .map(|i| byte.wrapping_add((i % 251) as u8))
        .collect()
}

fn volume_id(image: &str) -> String {
    format!("v1/mons/{}/{image}", pool())
}

#[tokio::test]
async fn members_hold_the_group_snapshot_instant_and_a_crashed_create_completes() {
    let cluster = cluster().await;
    let pool = pool();
    let (a, b) = ("grp-crash-a", "grp-crash-b");
    let (data_a, data_b) = (pattern(1), pattern(7));
    import(a, &data_a);
    import(b, &data_b);
    let (id_a, id_b) = (volume_id(a), volume_id(b));
    let group = group_name("crash-1");
    let members = [
        Member {
            image: a,
            source_id: &id_a,
        },
        Member {
            image: b,
            source_id: &id_b,
        },
    ];
    let new = NewGroupSnapshot {
        pool,
        group: &group,
        name: "crash-1",
        members: &members,
        driver: "rbd.csi.test",
        kube_cluster: "",
    };

    // A create that died after the group snapshot, mid-way through copying b's member.
    cluster.group_create(pool, &group).await.unwrap();
    for image in [a, b] {
        cluster
            .group_image(pool, &group, pool, image, true)
            .await
            .unwrap();
    }
    cluster
        .group_snap(pool, &group, &group, true)
        .await
        .unwrap();
    let partial = member_image_name(&group, &id_b);
    cluster
        .create_image(pool, &partial, MIB as u64, &CreateOptions::default())
        .await
        .unwrap();
    // the sources move on after the instant
    overwrite(a);
    overwrite(b);
    assert_ne!(export(&format!("{pool}/{a}")), data_a);

    let made = group::create_group_snapshot(&cluster, &new).await.unwrap();
    assert!(made.is_complete() && made.members.len() == 2, "{made:?}");
    for (id, data) in [(&id_a, &data_a), (&id_b, &data_b)] {
        let member = made.members.iter().find(|m| &m.owner.source == id).unwrap();
        assert_eq!(member.image, member_image_name(&group, id));
        assert_eq!(member.size, data.len() as u64);
        assert!(
            export(&format!("{pool}/{0}@{0}", member.image)) == *data,
            "member of {id} is not its source at the group snapshot"
        );
    }
    // no group left; the sources are in none
    for image in [a, b] {
        assert_eq!(cluster.image_group(pool, image).await.unwrap(), None);
        assert!(
            cluster
                .image_group_snaps(pool, image)
                .await
                .unwrap()
                .is_empty()
        );
    }
    assert!(!groups().contains(&group));

    // a retry finds it as it is
    let again = group::create_group_snapshot(&cluster, &new).await.unwrap();
    assert_eq!(again, made);

    // a member deleted on its own cannot be made again at the group's instant
    rbd_volume::delete_snapshot(&cluster, pool, &made.members[0].image)
        .await
        .unwrap();
    let found = group::find_group_snapshot(&cluster, pool, &group)
        .await
        .unwrap()
        .unwrap();
    assert!(!found.is_complete() && found.members.len() == 1);
    assert!(matches!(
        group::create_group_snapshot(&cluster, &new).await,
        Err(GroupError::MemberDeleted { .. })
    ));

    let deleted = group::delete_group_snapshot(&cluster, pool, &group)
        .await
        .unwrap();
    assert_eq!(deleted, vec![made.members[1].image.clone()]);
    assert_eq!(
        group::find_group_snapshot(&cluster, pool, &group)
            .await
            .unwrap(),
        None
    );
    assert!(
        group::delete_group_snapshot(&cluster, pool, &group)
            .await
            .unwrap()
            .is_empty()
    );
    for image in [a, b] {
        cluster.remove_image(pool, image).await.unwrap();
    }
}

#[tokio::test]
async fn a_source_in_another_group_is_refused_and_no_group_is_left() {
    let cluster = cluster().await;
    let pool = pool();
    let (a, b) = ("grp-other-a", "grp-other-b");
    import(a, &pattern(3));
    import(b, &pattern(5));
    cluster.group_create(pool, "someone-elses").await.unwrap();
    cluster
        .group_image(pool, "someone-elses", pool, b, true)
        .await
        .unwrap();
    let (id_a, id_b) = (volume_id(a), volume_id(b));
    let group = group_name("other-1");
    let members = [
        Member {
            image: a,
            source_id: &id_a,
        },
        Member {
            image: b,
            source_id: &id_b,
        },
    ];
    let new = NewGroupSnapshot {
        pool,
        group: &group,
        name: "other-1",
        members: &members,
        driver: "rbd.csi.test",
        kube_cluster: "",
    };
    match group::create_group_snapshot(&cluster, &new).await {
        Err(GroupError::InOtherGroup { image, other, .. }) => {
            assert_eq!((image.as_str(), other.as_str()), (b, "someone-elses"));
        }
        other => panic!("{other:?}"),
    }
    assert!(!groups().contains(&group));
    assert_eq!(cluster.image_group(pool, a).await.unwrap(), None);
    assert!(
        group::member_images(&cluster, pool, &group)
            .await
            .unwrap()
            .is_empty()
    );

    cluster.group_remove(pool, "someone-elses").await.unwrap();
    for image in [a, b] {
        cluster.remove_image(pool, image).await.unwrap();
    }
}
