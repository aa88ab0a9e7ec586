//! End to end: classes that name a cluster of the cluster config (`clusterID`, `--cluster-config`)
//! instead of monitors. Two micro-ceph clusters side by side, one config file; the file is edited
//! while the provisioner runs and later operations follow it without a restart.

mod support;

use std::path::Path;
use std::time::Duration;

use kube::api::DeleteParams;
use micro_ceph::MicroCeph;
use serde_json::json;
use support::{ADMIN_SECRET, ADMIN_SECRET_NS, Harness, Process};

/// Writes the cluster config as a mounted ConfigMap changes: a new file renamed into place.
fn write_config(path: &Path, clusters: &[(&str, &[&str])]) {
    let entries: Vec<_> = clusters
        .iter()
        .map(|(id, monitors)| {
            json!({"clusterID": id, "monitors": monitors, "rbd": {}, "cephFS": {"subvolumeGroup": ""}})
        })
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&entries).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `localhost:<port>`: the same monitor as `127.0.0.1:<port>`, written another way.
fn by_name(ceph: &MicroCeph) -> String {
    format!("localhost:{}", ceph.mon_port)
}

fn spawn(h: &Harness, config: &Path) -> Process {
    h.spawn(
        &[
            "--leader-elect=false",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
            "--cluster-config",
            config.to_str().unwrap(),
        ],
        &[],
    )
}

/// The harness's class parameters with `clusterID` instead of `monitors`, and `secret` as the
/// admin and user secret.
fn cluster_params(h: &Harness, cluster: &str, secret: &str) -> Vec<(String, String)> {
    let mut params: Vec<(String, String)> = h
        .params()
        .into_iter()
        .filter(|(k, _)| k != "monitors")
        .map(|(k, v)| match k.as_str() {
            "adminSecretName" | "userSecretName" => (k, secret.to_string()),
            _ => (k, v),
        })
        .collect();
    params.push(("clusterID".into(), cluster.into()));
    params
}

fn images_of(ceph: &MicroCeph) -> Vec<String> {
    ceph.rbd(&["ls", &ceph.pool])
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn annotation(pv: &k8s_openapi::api::core::v1::PersistentVolume, key: &str) -> Option<String> {
    pv.metadata.annotations.as_ref()?.get(key).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_name_clusters_of_one_config_file_which_is_followed_when_edited() {
    let h = Harness::start().await;
    let a = h.ceph;
    // the second cluster is this test's own: stopped when dropped, also when the test fails
    let b = MicroCeph::start().expect("starting the second micro-ceph cluster");
    assert_ne!(a.monitors, b.monitors);
    h.create_secret(ADMIN_SECRET_NS, "ceph-admin-b", &[("key", &b.admin_key)])
        .await;
    let config = h.dir.path().join("config.json");
    write_config(
        &config,
        &[
            ("site-a", &[a.monitors.as_str()]),
            ("site-b", &[b.monitors.as_str()]),
        ],
    );
    let _p = spawn(&h, &config);
    h.create_class(
        "on-a",
        &cluster_params(&h, "site-a", ADMIN_SECRET),
        "Delete",
    )
    .await;
    h.create_class(
        "on-b",
        &cluster_params(&h, "site-b", "ceph-admin-b"),
        "Delete",
    )
    .await;
    let mut csi = cluster_params(&h, "site-b", "ceph-admin-b");
    csi.push(("pvSource".into(), "csi".into()));
    h.create_class("on-b-csi", &csi, "Delete").await;

    h.create_claim("a1", "on-a", "16Mi", false).await;
    h.create_claim("b1", "on-b", "16Mi", false).await;
    h.create_claim("b-csi", "on-b-csi", "16Mi", false).await;
    let (_, a1) = h.wait_bound("a1").await;
    let (_, b1) = h.wait_bound("b1").await;
    let (_, b_csi) = h.wait_bound("b-csi").await;

    // in-tree PVs carry the monitors the config gave (Kubernetes' rbd plugin needs them) and
    // the cluster name; the images are on the cluster each class names, not the other
    let a1_image = Harness::image_name(&a1);
    let b1_image = Harness::image_name(&b1);
    let csi_image = Harness::image_name(&b_csi);
    assert_eq!(
        a1.spec.as_ref().unwrap().rbd.as_ref().unwrap().monitors,
        std::slice::from_ref(&a.monitors)
    );
    assert_eq!(
        b1.spec.as_ref().unwrap().rbd.as_ref().unwrap().monitors,
        std::slice::from_ref(&b.monitors)
    );
    assert_eq!(
        annotation(&a1, "provisioner.ceph.com/cluster-id").as_deref(),
        Some("site-a")
    );
    assert!(images_of(a).contains(&a1_image) && !images_of(&b).contains(&a1_image));
    assert!(images_of(&b).contains(&b1_image) && !images_of(a).contains(&b1_image));
    // CSI PVs name the cluster, not its monitors
    let csi = b_csi.spec.as_ref().and_then(|s| s.csi.clone()).unwrap();
    assert_eq!(
        csi.volume_handle,
        format!("v2/site-b/{}/{csi_image}", b.pool)
    );
    let attrs = csi.volume_attributes.unwrap();
    assert_eq!(attrs["clusterID"], "site-b");
    assert!(images_of(&b).contains(&csi_image) && !images_of(a).contains(&csi_image));

    // the config is edited: site-b's monitor is written another way, site-a is gone
    let b_by_name = by_name(&b);
    write_config(&config, &[("site-b", &[b_by_name.as_str()])]);
    h.create_claim("b2", "on-b", "16Mi", false).await;
    let (_, b2) = h.wait_bound("b2").await;
    assert_eq!(
        b2.spec.as_ref().unwrap().rbd.as_ref().unwrap().monitors,
        std::slice::from_ref(&b_by_name),
        "a claim after the edit uses the edited monitors, without a restart"
    );
    assert!(images_of(&b).contains(&Harness::image_name(&b2)));
    // a broken edit: the last good contents stay in use, and errors say why the file is not
    std::fs::write(config.with_extension("tmp"), "[{\"clusterID\": ").unwrap();
    std::fs::rename(config.with_extension("tmp"), &config).unwrap();
    h.create_claim("b3", "on-b", "16Mi", false).await;
    let (_, b3) = h.wait_bound("b3").await;
    assert_eq!(
        b3.spec.as_ref().unwrap().rbd.as_ref().unwrap().monitors,
        std::slice::from_ref(&b_by_name)
    );
    h.create_claim("a-while-broken", "on-a", "16Mi", false)
        .await;
    h.wait_event_containing(
        "a-while-broken",
        "ProvisioningFailed",
        &["site-a", "could not be used", "last good contents"],
    )
    .await;
    // expanding the CSI volume (v2/site-b handle) after the edit reaches site-b
    h.resize_claims(&["b-csi".to_string()], "32Mi").await;
    let spec = format!("{}/{csi_image}", b.pool);
    h.until(
        "b-csi grown to 32Mi on site-b",
        Duration::from_secs(30),
        || async {
            let info = b.rbd(&["info", "--format", "json", &spec]).ok()?;
            let size = serde_json::from_str::<serde_json::Value>(&info).ok()?["size"].as_u64()?;
            (size == 32 << 20).then_some(())
        },
    )
    .await;

    // deleting a volume made through site-a looks its monitors up again: site-a is not in the
    // config now, so the deletion fails naming it, and the image stays
    h.claims()
        .delete("a1", &DeleteParams::default())
        .await
        .unwrap();
    let a1_name = a1.metadata.name.clone().unwrap();
    let failed = h.wait_event(&a1_name, "VolumeFailedDelete").await;
    assert!(failed.contains("site-a"), "{failed}");
    assert!(images_of(a).contains(&a1_image));
    // site-a comes back, written as the mon's msgr2 address (as `ceph mon dump` shows it): the
    // retry deletes it, still no restart
    let a_msgr2 = format!("v2:{}", a.monitors);
    write_config(
        &config,
        &[
            ("site-a", &[a_msgr2.as_str()]),
            ("site-b", &[b_by_name.as_str()]),
        ],
    );
    h.wait_pv_gone(&a1_name).await;
    assert!(!images_of(a).contains(&a1_image));

    // the rest (in-tree with the old monitor form, CSI by name, the new one) delete too
    // the claim made while the file was broken is provisioned now, on site-a
    let (_, late_a) = h.wait_bound("a-while-broken").await;
    assert!(images_of(a).contains(&Harness::image_name(&late_a)));
    for (claim, pv) in [
        ("b1", &b1),
        ("b-csi", &b_csi),
        ("b2", &b2),
        ("b3", &b3),
        ("a-while-broken", &late_a),
    ] {
        h.claims()
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
        h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    }
    let left = images_of(&b);
    for image in [
        &b1_image,
        &csi_image,
        &Harness::image_name(&b2),
        &Harness::image_name(&b3),
    ] {
        assert!(!left.contains(image), "{image} left on site-b: {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_parameters_are_events_naming_the_parameter_and_create_nothing() {
    let h = Harness::start().await;
    let config = h.dir.path().join("config.json");
    let monitors = h.ceph.monitors.clone();
    write_config(
        &config,
        &[("site-a", &[monitors.as_str()]), ("no-monitors", &[])],
    );
    let _p = spawn(&h, &config);
    let before = h.images();
    let base = cluster_params(&h, "site-a", ADMIN_SECRET);
    let with = |extra: &[(&str, &str)], drop: &[&str]| {
        let mut p: Vec<(String, String)> = base
            .iter()
            .filter(|(k, _)| !drop.contains(&k.as_str()))
            .cloned()
            .collect();
        p.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        p
    };
    type Case<'a> = (&'a str, Vec<(String, String)>, &'a [&'a str]);
    let cases: Vec<Case<'_>> = vec![
        (
            "unknown",
            with(&[("clusterID", "site-z")], &["clusterID"]),
            &["clusterID", "site-z", "site-a"],
        ),
        (
            "empty-monitors",
            with(&[("clusterID", "no-monitors")], &["clusterID"]),
            &["clusterID", "no-monitors", "empty \"monitors\""],
        ),
        (
            "both",
            with(&[("monitors", monitors.as_str())], &[]),
            &["monitors", "clusterID", "not both"],
        ),
        (
            "neither",
            with(&[], &["clusterID"]),
            &["monitors", "clusterID"],
        ),
        (
            "bad-topology",
            with(&[("topologyConstrainedPools", "[{\"poolName\": ")], &[]),
            &["topologyConstrainedPools"],
        ),
        (
            "namespace-in-tree",
            with(&[("radosNamespace", "tenant-1"), ("pvSource", "rbd")], &[]),
            &["radosNamespace", "in-tree"],
        ),
    ];
    for (name, params, _) in &cases {
        h.create_class(name, params, "Delete").await;
        h.create_claim(name, name, "16Mi", false).await;
    }
    for (name, _, expected) in &cases {
        h.wait_event_containing(name, "ProvisioningFailed", expected)
            .await;
    }
    assert!(
        h.volumes()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no PV for any bad class"
    );
    assert_eq!(h.images(), before, "no image for any bad class");
    // a class with a good clusterID still works on the same provisioner
    h.create_class("good", &base, "Delete").await;
    h.create_claim("good", "good", "16Mi", false).await;
    h.wait_bound("good").await;
}
