//! End to end: `radosNamespace`. Two classes on the same pool with different RADOS namespaces;
//! images, owner records, delete and gc stay inside each namespace.

mod support;

use kube::api::DeleteParams;
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

fn ns_params(h: &Harness, namespace: &str) -> Vec<(String, String)> {
    let mut params = h.params();
    params.push(("radosNamespace".into(), namespace.into()));
    params.push(("pvSource".into(), "csi".into()));
    params
}

fn gc(h: &Harness, config: &std::path::Path, delete: bool) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rbd-provisioner"));
    cmd.args(["gc", "--min-age=0s", "--kubeconfig"])
        .arg(&h.kubeconfig)
        .arg("--cluster-config")
        .arg(config)
        .env_remove("RUST_LOG");
    if delete {
        cmd.arg("--delete");
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

/// A line of gc's output naming both `pool_spec` and `image`.
fn lists(text: &str, pool_spec: &str, image: &str) -> bool {
    text.lines().any(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        words.contains(&pool_spec) && words.contains(&image)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_classes_on_one_pool_keep_their_volumes_in_their_namespaces() {
    let h = Harness::start().await;
    let pool = h.ceph.pool.clone();
    let (t1, t2, t3) = (
        format!("{pool}/tenant-1"),
        format!("{pool}/tenant-2"),
        format!("{pool}/tenant-3"),
    );
    for ns in [&t1, &t2, &t3] {
        h.ceph.rbd(&["namespace", "create", ns]).unwrap();
    }
    let config = h.dir.path().join("config.json");
    std::fs::write(
        &config,
        json!([{"clusterID": "site-a", "monitors": [h.ceph.monitors], "rbd": {"radosNamespace": "tenant-2"}}])
            .to_string(),
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
    h.create_class("tenant-1", &ns_params(&h, "tenant-1"), "Delete")
        .await;
    h.create_class("tenant-2", &ns_params(&h, "tenant-2"), "Delete")
        .await;
    // a clusterID class without radosNamespace: the config's rbd.radosNamespace (tenant-2)
    let mut by_config: Vec<(String, String)> = h
        .params()
        .into_iter()
        .filter(|(k, _)| k != "monitors")
        .collect();
    by_config.push(("clusterID".into(), "site-a".into()));
    by_config.push(("pvSource".into(), "csi".into()));
    h.create_class("by-config", &by_config, "Delete").await;
    h.create_class("missing", &ns_params(&h, "no-such-namespace"), "Delete")
        .await;

    h.create_claim("c1", "tenant-1", "16Mi", false).await;
    h.create_claim("c2", "tenant-2", "16Mi", false).await;
    h.create_claim("c3", "by-config", "16Mi", false).await;
    h.create_claim("bad", "missing", "16Mi", false).await;
    let (_, pv1) = h.wait_bound("c1").await;
    let (_, pv2) = h.wait_bound("c2").await;
    let (_, pv3) = h.wait_bound("c3").await;
    let (img1, img2, img3) = (
        Harness::image_name(&pv1),
        Harness::image_name(&pv2),
        Harness::image_name(&pv3),
    );
    let handle = |pv: &k8s_openapi::api::core::v1::PersistentVolume| {
        let csi = pv.spec.as_ref().and_then(|s| s.csi.clone()).unwrap();
        (csi.volume_handle, csi.volume_attributes.unwrap())
    };
    let (h1, attrs1) = handle(&pv1);
    assert_eq!(h1, format!("v1/{}/{t1}/{img1}", h.ceph.monitors));
    assert_eq!(attrs1["radosNamespace"], "tenant-1");
    assert_eq!(handle(&pv3).0, format!("v2/site-a/{t2}/{img3}"));

    // each image is in its namespace only, with its owner record there
    assert_eq!(ls(&h, &t1), std::slice::from_ref(&img1));
    let mut in_t2 = ls(&h, &t2);
    in_t2.sort();
    let mut expect = vec![img2.clone(), img3.clone()];
    expect.sort();
    assert_eq!(in_t2, expect);
    let default_ns = ls(&h, &pool);
    assert!(
        !default_ns
            .iter()
            .any(|i| [&img1, &img2, &img3].contains(&i))
    );
    let owner = h
        .ceph
        .rbd(&[
            "image-meta",
            "get",
            &format!("{t1}/{img1}"),
            "provisioner.ceph.com/pv",
        ])
        .unwrap();
    assert_eq!(owner.trim(), pv1.metadata.name.as_deref().unwrap());

    // a namespace that does not exist: an event naming the parameter, nothing created
    h.wait_event_containing(
        "bad",
        "ProvisioningFailed",
        &["radosNamespace", "no-such-namespace"],
    )
    .await;
    assert!(
        h.ceph
            .rbd(&["ls", &format!("{pool}/no-such-namespace")])
            .is_err()
    );

    // an image of the same name as c1's in tenant-2, recorded as an orphan of ours, and one in
    // tenant-3 that no class uses
    let kube_cluster = h.kube_cluster_id().await;
    for spec in [format!("{t2}/{img1}"), format!("{t3}/{img1}")] {
        h.ceph.rbd(&["create", &spec, "--size", "8M"]).unwrap();
        for (key, value) in [
            ("provisioner.ceph.com/pv", "pvc-gone"),
            ("provisioner.ceph.com/claim", "default/gone"),
            ("provisioner.ceph.com/provisioner", "ceph.com/rbd"),
            ("provisioner.ceph.com/kube-cluster", kube_cluster.as_str()),
        ] {
            h.ceph
                .rbd(&["image-meta", "set", &spec, key, value])
                .unwrap();
        }
    }
    // expanding c1 grows its image in tenant-1, not the same-named one in tenant-2
    h.resize_claims(&["c1".to_string()], "32Mi").await;
    let size_of = |spec: String| {
        let info = h.ceph.rbd(&["info", "--format", "json", &spec]).ok()?;
        serde_json::from_str::<serde_json::Value>(&info).ok()?["size"].as_u64()
    };
    h.until(
        "c1 grown to 32Mi in tenant-1",
        std::time::Duration::from_secs(30),
        || {
            let size = size_of(format!("{t1}/{img1}"));
            async move { (size == Some(32 << 20)).then_some(()) }
        },
    )
    .await;
    assert_eq!(size_of(format!("{t2}/{img1}")), Some(8 << 20));

    // deleting c1 removes tenant-1's image only
    h.claims()
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv1.metadata.name.as_deref().unwrap()).await;
    assert!(ls(&h, &t1).is_empty());
    assert!(ls(&h, &t2).contains(&img1) && ls(&h, &t3).contains(&img1));

    // gc lists the orphan in tenant-2 under its namespace, not c2/c3's images, and never looks
    // into tenant-3 (no class of ours uses it)
    let listed = gc(&h, &config, false);
    // the clusterID class is scanned too (through --cluster-config), and its namespace, the
    // same as the tenant-2 class's, once: the orphan is listed once
    assert!(!listed.contains("skipping"), "{listed}");
    assert_eq!(
        listed.lines().filter(|l| lists(l, &t2, &img1)).count(),
        1,
        "{listed}"
    );
    assert!(lists(&listed, &t2, &img1), "{listed}");
    assert!(!listed.contains(&t3), "{listed}");
    assert!(
        !listed.contains(&img2) && !listed.contains(&img3),
        "{listed}"
    );
    let deleted = gc(&h, &config, true);
    assert!(!deleted.contains("not removed"), "{deleted}");
    assert!(!ls(&h, &t2).contains(&img1));
    assert!(ls(&h, &t2).contains(&img2) && ls(&h, &t2).contains(&img3));
    assert!(
        ls(&h, &t3).contains(&img1),
        "another namespace is never touched"
    );

    for (claim, pv) in [("c2", &pv2), ("c3", &pv3)] {
        h.claims()
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
        h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    }
    assert!(ls(&h, &t2).is_empty());
}
