//! `rbd_move_to_trash_on_remove`: with the option set for the pool (`rbd config pool set`) or for
//! the client (`ceph config set client`), a deleted claim's image is in the RBD trash with
//! librbd's expiry, plain images and images with snapshots alike; a deleted VolumeSnapshot's
//! image that the option put in the trash is not purged by the volume core's trash handling
//! (gc's and the snapshot deletion's); without the option an image is removed at once.
//! Own test binary: the options are cluster-wide for its micro-ceph.
//!
//! `cargo test -p rbd-provisioner --test trash`

#[path = "support/snapshots.rs"]
mod snapshots;
mod support;

use serde_json::Value;
use support::{Harness, Process};

const TRASH_ON_REMOVE: &str = "rbd_move_to_trash_on_remove";
const EXPIRE: &str = "rbd_move_to_trash_on_remove_expire_seconds";

/// `rbd trash ls -l` of the pool: name -> (source, status).
fn trash(h: &Harness) -> Vec<(String, String, String, String)> {
    let out = h
        .ceph
        .rbd(&["trash", "ls", "--long", "--format", "json", &h.ceph.pool])
        .unwrap();
    let entries: Vec<Value> = serde_json::from_str(&out).unwrap();
    entries
        .iter()
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (field("id"), field("name"), field("source"), field("status"))
        })
        .collect()
}

fn in_trash(h: &Harness, image: &str) -> Option<(String, String)> {
    trash(h)
        .into_iter()
        .find(|(_, name, _, _)| name == image)
        .map(|(_, _, source, status)| (source, status))
}

fn pool_option(h: &Harness, key: &str, value: Option<&str>) {
    let pool = h.ceph.pool.as_str();
    match value {
        Some(v) => h
            .ceph
            .rbd(&["config", "pool", "set", pool, key, v])
            .unwrap(),
        None => h
            .ceph
            .rbd(&["config", "pool", "remove", pool, key])
            .unwrap_or_default(),
    };
}

fn client_option(h: &Harness, value: Option<&str>) {
    let mut cmd = h.ceph.cli("ceph");
    match value {
        Some(v) => cmd.args(["config", "set", "client", TRASH_ON_REMOVE, v]),
        None => cmd.args(["config", "rm", "client", TRASH_ON_REMOVE]),
    };
    assert!(cmd.status().unwrap().success());
}

/// Undoes the options and empties the trash (children before parents), also when the test
/// failed.
struct Cleanup<'a>(&'a Harness);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let h = self.0;
        pool_option(h, TRASH_ON_REMOVE, None);
        pool_option(h, EXPIRE, None);
        client_option(h, None);
        for _ in 0..5 {
            for (id, _, _, _) in trash(h) {
                let _ = h
                    .ceph
                    .rbd(&["trash", "rm", "--force", "--image-id", &id, &h.ceph.pool]);
            }
        }
    }
}

/// The provisioner, started afresh so that its Ceph connection reads the options as they are.
fn restart(h: &Harness, old: &mut Process) -> Process {
    old.kill();
    h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=2s",
        ],
        &[],
    )
}

/// Creates claim `name`, waits for it to bind, and returns its image.
async fn bound_image(h: &Harness, name: &str) -> String {
    h.create_claim(name, "csi", "16Mi", false).await;
    let (_, pv) = h.wait_bound(name).await;
    Harness::image_name(&pv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_claims_go_to_the_trash_when_the_operator_asks_for_it() {
    let (h, mut p) = snapshots::setup().await;
    let _cleanup = Cleanup(&h);
    let pool = h.ceph.pool.clone();

    // the pool option, with an expiry: a plain image and one with a snapshot
    pool_option(&h, TRASH_ON_REMOVE, Some("true"));
    pool_option(&h, EXPIRE, Some("3600"));
    let plain = bound_image(&h, "plain").await;
    let snapped = bound_image(&h, "snapped").await;
    h.ceph
        .rbd(&["snap", "create", &format!("{pool}/{snapped}@kept")])
        .unwrap();
    for claim in ["plain", "snapped"] {
        snapshots::delete_claim(&h, claim).await;
    }
    for image in [&plain, &snapped] {
        let (source, status) = in_trash(&h, image)
            .unwrap_or_else(|| panic!("{image} not in the trash: {:?}", trash(&h)));
        assert_eq!(source, "USER", "{image}");
        assert!(
            status.starts_with("protected until"),
            "{image}: librbd's expiry not applied: {status}"
        );
        assert!(!h.images().contains(image));
    }

    // a snapshot image the option put in the trash (expiry 0: removable at once) stays there
    pool_option(&h, EXPIRE, None);
    let source = bound_image(&h, "source").await;
    snapshots::create_snapshot(&h, "snap", "source").await;
    let vs = snapshots::wait_ready(&h, "snap").await;
    let content = vs
        .data
        .pointer("/status/boundVolumeSnapshotContentName")
        .and_then(Value::as_str)
        .unwrap()
        .to_string();
    let handle = snapshots::contents(&h).get(&content).await.unwrap();
    let handle = handle
        .data
        .pointer("/status/snapshotHandle")
        .and_then(Value::as_str)
        .unwrap();
    let snap_image = rbd_volume::SnapshotId::parse(handle).unwrap().image;
    snapshots::snapshots(&h)
        .delete("snap", &Default::default())
        .await
        .unwrap();
    snapshots::wait_gone(&h, &snapshots::contents(&h), &content).await;
    assert!(
        in_trash(&h, &snap_image).is_some_and(|(source, _)| source == "USER"),
        "the trashed snapshot image was purged: {:?}",
        trash(&h)
    );
    snapshots::delete_claim(&h, "source").await;
    assert!(in_trash(&h, &source).is_some());

    // the client option (the monitors' configuration for clients)
    pool_option(&h, TRASH_ON_REMOVE, None);
    client_option(&h, Some("true"));
    p = restart(&h, &mut p);
    let by_client = bound_image(&h, "by-client").await;
    snapshots::delete_claim(&h, "by-client").await;
    assert!(
        in_trash(&h, &by_client).is_some_and(|(source, _)| source == "USER"),
        "{by_client} not in the trash: {:?}",
        trash(&h)
    );

    // without the option: removed at once, not in the trash
    client_option(&h, None);
    let _p = restart(&h, &mut p);
    let removed = bound_image(&h, "removed").await;
    snapshots::delete_claim(&h, "removed").await;
    assert!(in_trash(&h, &removed).is_none(), "{:?}", trash(&h));
    assert!(!h.images().contains(&removed));
}
