//! End to end: snapshots, restores and clones of a volume made through a `clusterID` class in a
//! RADOS namespace, with the built-in snapshot controller: everything stays in the namespace and
//! the handles name the cluster; `gc` takes the namespace's live snapshot images and clone
//! intermediates for live.

#[path = "support/snapshots.rs"]
mod snapshots;
mod support;

use serde_json::json;
use support::Harness;

fn ls(h: &Harness, spec: &str) -> Vec<String> {
    h.ceph
        .rbd(&["ls", spec])
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn claim_from(h: &Harness, name: &str, kind: &str, source: &str) {
    snapshots::create_claim_of_class_from(h, name, "tenant", "16Mi", kind, source).await;
}

fn handle(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .unwrap()
        .volume_handle
        .clone()
}

/// `rbd-provisioner gc --min-age=0s` (with `--delete` when `delete`) at the provisioner's
/// defaults and the cluster config; whether it succeeded, and its output.
fn gc(h: &Harness, config: &std::path::Path, delete: bool) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"));
    cmd.args(["gc", "--min-age=0s", "--kubeconfig"])
        .arg(&h.kubeconfig)
        .arg("--cluster-config")
        .arg(config)
        .env_remove("RUST_LOG")
        .env_remove("PROVISIONER_NAME");
    if delete {
        cmd.arg("--delete");
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_restores_and_clones_stay_in_the_namespace_and_name_the_cluster() {
    let h = snapshots::harness().await;
    let pool = h.ceph.pool.clone();
    let ns = format!("{pool}/tenant-1");
    h.ceph.rbd(&["namespace", "create", &ns]).unwrap();
    let config = h.dir.path().join("config.json");
    std::fs::write(
        &config,
        json!([{"clusterID": "site-a", "monitors": [h.ceph.monitors]}]).to_string(),
    )
    .unwrap();
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
            "--cluster-config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let mut params: Vec<(String, String)> = h
        .params()
        .into_iter()
        .filter(|(k, _)| k != "monitors")
        .collect();
    params.push(("clusterID".into(), "site-a".into()));
    params.push(("radosNamespace".into(), "tenant-1".into()));
    params.push(("pvSource".into(), "csi".into()));
    h.create_class("tenant", &params, "Delete").await;
    let default_before = ls(&h, &pool);

    h.create_claim("src", "tenant", "16Mi", false).await;
    let (_, src) = h.wait_bound("src").await;
    let src_image = Harness::image_name(&src);
    assert_eq!(handle(&src), format!("v2/site-a/{ns}/{src_image}"));

    snapshots::create_snapshot(&h, "snap", "src").await;
    let vs = snapshots::wait_ready(&h, "snap").await;
    let content_name = vs
        .data
        .pointer("/status/boundVolumeSnapshotContentName")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    let content = snapshots::contents(&h).get(&content_name).await.unwrap();
    let snapshot_handle = content
        .data
        .pointer("/status/snapshotHandle")
        .and_then(|v| v.as_str())
        .unwrap()
        .to_string();
    let snap_image = snapshot_handle.rsplit('/').next().unwrap().to_string();
    assert_eq!(snapshot_handle, format!("s2/site-a/{ns}/{snap_image}"));
    assert!(ls(&h, &ns).contains(&snap_image));

    claim_from(&h, "cloned", "PersistentVolumeClaim", "src").await;
    let (_, cloned) = h.wait_bound("cloned").await;
    let intermediate =
        rbd_volume::snapshot::clone_intermediate_name(&ns, &Harness::image_name(&cloned));
    let live = ls(&h, &ns);
    assert!(
        live.contains(&intermediate),
        "{intermediate} not in {live:?}"
    );

    // gc sees the ready snapshot's image and the live clone's intermediate in the namespace as
    // live: nothing listed, nothing removed, with no minimum age
    let (ok, text) = gc(&h, &config, false);
    assert!(ok, "{text}");
    assert!(text.contains("no orphaned images"), "gc dry run:\n{text}");
    let (ok, text) = gc(&h, &config, true);
    assert!(ok, "{text}");
    assert_eq!(
        ls(&h, &ns),
        live,
        "gc --delete removed live images:\n{text}"
    );

    claim_from(&h, "restored", "VolumeSnapshot", "snap").await;
    let (_, restored) = h.wait_bound("restored").await;
    for pv in [&restored, &cloned] {
        let image = Harness::image_name(pv);
        assert_eq!(handle(pv), format!("v2/site-a/{ns}/{image}"));
        assert!(ls(&h, &ns).contains(&image), "{image} not in {ns}");
    }
    // nothing of it in the pool's default namespace
    assert_eq!(ls(&h, &pool), default_before);

    for claim in ["restored", "cloned"] {
        snapshots::delete_claim(&h, claim).await;
    }
    snapshots::snapshots(&h)
        .delete("snap", &Default::default())
        .await
        .unwrap();
    snapshots::wait_gone(&h, &snapshots::contents(&h), &content_name).await;
    snapshots::delete_claim(&h, "src").await;
    let left: Vec<String> = ls(&h, &ns);
    assert!(left.is_empty(), "left in {ns}: {left:?}");
}
