//! End to end: real Ceph (micro-ceph), the emulated API, and the binary as a process.

mod support;

use std::time::Duration;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use micro_ceph::ImageHolder;
use serde_json::json;
use support::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisions_binds_and_deletes_filesystem_and_block_claims() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    let mut params = h.params();
    params.push(("fsType".into(), "xfs".into()));
    h.create_class("rbd", &params, "Delete").await;
    h.create_claim("fs", "rbd", "1Gi", false).await;
    h.create_claim("blk", "rbd", "100Mi", true).await;

    let (fs_claim, fs_pv) = h.wait_bound("fs").await;
    let (_, blk_pv) = h.wait_bound("blk").await;
    let fs_image = Harness::image_name(&fs_pv);
    let blk_image = Harness::image_name(&blk_pv);
    let uid = fs_claim.metadata.uid.clone().unwrap();
    assert_eq!(
        fs_pv.metadata.name.as_deref(),
        Some(format!("pvc-{uid}").as_str())
    );
    assert_eq!(fs_image, format!("kubernetes-dynamic-pvc-{uid}"));
    let spec = fs_pv.spec.clone().unwrap();
    // the API server stores quantities in canonical form (1024Mi -> 1Gi)
    assert_eq!(
        provisioner::quantity::parse_bytes(&spec.capacity.unwrap()["storage"].0),
        Some(1 << 30)
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    let rbd = spec.rbd.expect("no CSIDriver object: in-tree rbd source");
    assert_eq!(rbd.fs_type.as_deref(), Some("xfs"));
    assert_eq!(rbd.monitors, vec![h.ceph.monitors.clone()]);
    assert_eq!(
        blk_pv.spec.as_ref().unwrap().volume_mode.as_deref(),
        Some("Block")
    );
    assert_eq!(
        fs_pv.metadata.annotations.as_ref().unwrap()["pv.kubernetes.io/provisioned-by"],
        "ceph.com/rbd"
    );

    // images exist with their owner record and the requested size
    assert!(h.images().contains(&fs_image) && h.images().contains(&blk_image));
    assert_eq!(h.image_size(&fs_image), 1 << 30);
    assert_eq!(h.image_size(&blk_image), 100 << 20);
    assert_eq!(
        h.image_meta(&fs_image, "provisioner.ceph.com/pv"),
        fs_pv.metadata.name.clone()
    );
    assert_eq!(
        h.image_meta(&fs_image, "provisioner.ceph.com/claim")
            .as_deref(),
        Some("default/fs")
    );
    assert!(
        h.wait_event("fs", "ProvisioningSucceeded")
            .await
            .contains(fs_pv.metadata.name.as_deref().unwrap())
    );

    for (claim, pv, image) in [("fs", &fs_pv, &fs_image), ("blk", &blk_pv, &blk_image)] {
        h.claims()
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
        h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
        assert!(
            !h.images().contains(image),
            "{image} still in Ceph after its PV was deleted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_keeps_the_image_and_the_pv() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_class("keep", &h.params(), "Retain").await;
    h.create_claim("kept", "keep", "16Mi", false).await;
    let (_, pv) = h.wait_bound("kept").await;
    let image = Harness::image_name(&pv);
    h.claims()
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    let name = pv.metadata.name.clone().unwrap();
    let volumes = h.volumes();
    h.until("PV Released", Duration::from_secs(20), || {
        let v = volumes.clone();
        let n = name.clone();
        async move {
            let pv = v.get(&n).await.ok()?;
            (pv.status?.phase.as_deref() == Some("Released")).then_some(())
        }
    })
    .await;
    // a marker: a Delete-policy claim released after the retained one; once its PV is gone the
    // provisioner has had the retained PV's release in its queue for as long
    h.create_class("marker", &h.params(), "Delete").await;
    h.create_claim("marker", "marker", "8Mi", false).await;
    let (_, marker) = h.wait_bound("marker").await;
    h.claims()
        .delete("marker", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(marker.metadata.name.as_deref().unwrap())
        .await;
    assert!(h.volumes().get_opt(&name).await.unwrap().is_some());
    assert!(h.images().contains(&image));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_parameters_and_secrets_are_reported_as_provisioning_failed() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_secret("kube-system", "no-key", &[("password", "x")])
        .await;
    // Ceph 20.2's default key type (cipher 2, 32-byte secret): a Pacific client cannot parse it
    h.create_secret(
        "kube-system",
        "aes256k-key",
        &[(
            "key",
            "AgBgxqZmAAAAACAACzBVep/E6Q4zWH2ix+wRNluApcrvFDleg6jN8hc8YYY=",
        )],
    )
    .await;
    let with = |key: &str, value: &str| {
        let mut p: Vec<(String, String)> =
            h.params().into_iter().filter(|(k, _)| k != key).collect();
        if !value.is_empty() {
            p.push((key.to_string(), value.to_string()));
        }
        p
    };
    // (claim and class name, class parameters, expected text of the event)
    type Case<'a> = (&'a str, Vec<(String, String)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "unknown-key",
            {
                let mut p = h.params();
                p.push(("imageFeaturez".into(), "layering".into()));
                p
            },
            "\"imageFeaturez\": unknown parameter",
        ),
        (
            "no-monitors",
            with("monitors", ""),
            "\"monitors\": is required",
        ),
        (
            "bad-features",
            with("imageFeatures", "layering,fast-diff"),
            "fast-diff requires object-map",
        ),
        (
            "bad-format",
            with("imageFormat", "3"),
            "\"imageFormat\": \"3\" is not 1 or 2",
        ),
        (
            "missing-secret",
            with("adminSecretName", "nope"),
            "secret kube-system/nope not found",
        ),
        (
            "keyless-secret",
            with("adminSecretName", "no-key"),
            "secret kube-system/no-key has no non-empty \"key\"",
        ),
        (
            "aes256k-key",
            with("adminSecretName", "aes256k-key"),
            if ceph_rbd::key::client_version().starts_with("16.") {
                "secret kube-system/aes256k-key: the key is of type aes256k, which this Ceph client"
            } else {
                "permission denied"
            },
        ),
        (
            "bad-monitor",
            with("monitors", "mon.invalid:6789"),
            "cannot resolve \"mon.invalid\"",
        ),
    ];
    for (name, params, _) in &cases {
        h.create_class(name, params, "Delete").await;
        h.create_claim(name, name, "8Mi", false).await;
    }
    for (name, _, expected) in &cases {
        let message = h.wait_event(name, "ProvisioningFailed").await;
        assert!(
            message.contains(expected),
            "claim {name}: event {message:?} lacks {expected:?}"
        );
        assert!(!message.contains(&h.ceph.admin_key));
    }
    assert!(
        h.volumes()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_watched_image_is_refused_then_succeeds_after_release() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_class("rbd", &h.params(), "Delete").await;
    h.create_claim("busy", "rbd", "16Mi", false).await;
    let (_, pv) = h.wait_bound("busy").await;
    let (name, image) = (pv.metadata.name.clone().unwrap(), Harness::image_name(&pv));
    let holder = ImageHolder::open(h.ceph, &h.ceph.pool, &image).unwrap();
    h.claims()
        .delete("busy", &DeleteParams::default())
        .await
        .unwrap();
    let message = h.wait_event(&name, "VolumeFailedDelete").await;
    assert!(
        message.contains("in use by 1 watcher(s): 127.0.0.1:"),
        "{message}"
    );
    assert!(h.volumes().get_opt(&name).await.unwrap().is_some());
    assert!(h.images().contains(&image));
    drop(holder);
    h.wait_pv_gone(&name).await;
    assert!(!h.images().contains(&image));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expansion_grows_the_image_and_the_pv() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_class("rbd", &h.params(), "Delete").await;
    h.create_claim("grow", "rbd", "64Mi", false).await;
    let (_, pv) = h.wait_bound("grow").await;
    let (name, image) = (pv.metadata.name.clone().unwrap(), Harness::image_name(&pv));
    let patch = json!({"spec": {"resources": {"requests": {"storage": "200Mi"}}}});
    h.claims()
        .patch("grow", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let volumes = h.volumes();
    h.until("PV capacity 200Mi", Duration::from_secs(30), || {
        let v = volumes.clone();
        let n = name.clone();
        async move {
            let pv = v.get(&n).await.ok()?;
            let cap = pv.spec?.capacity?.get("storage")?.0.clone();
            (provisioner::quantity::parse_bytes(&cap)? == 200 << 20).then_some(())
        }
    })
    .await;
    assert_eq!(h.image_size(&image), 200 << 20);
    // a shrink request is refused by the API server (status.capacity), the image stays
    let shrink = json!({"spec": {"resources": {"requests": {"storage": "32Mi"}}}});
    assert!(
        h.claims()
            .patch("grow", &PatchParams::default(), &Patch::Merge(&shrink))
            .await
            .is_err()
    );
    assert_eq!(h.image_size(&image), 200 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_storage_class_first_does_not_block_deletion() {
    let h = Harness::start().await;
    let _p = h.spawn_default();
    h.create_class("gone-class", &h.params(), "Delete").await;
    h.create_claim("orphan", "gone-class", "16Mi", false).await;
    let (_, pv) = h.wait_bound("orphan").await;
    let image = Harness::image_name(&pv);
    let classes: Api<StorageClass> = Api::all(h.client.clone());
    classes
        .delete("gone-class", &DeleteParams::default())
        .await
        .unwrap();
    h.claims()
        .delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    assert!(!h.images().contains(&image));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_image_create_and_pv_save_leaks_nothing() {
    let h = Harness::start().await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let claim = h.create_claim("crashy", "rbd", "16Mi", false).await;
    let uid = claim.metadata.uid.clone().unwrap();
    let image = format!("kubernetes-dynamic-pvc-{uid}");
    for step in ["after-image-create", "after-image-metadata"] {
        let mut p = h.spawn(
            &["--leader-elect=false"],
            &[("RBD_PROVISIONER_CRASH_AT", step)],
        );
        let status = p
            .wait_exit(Duration::from_secs(30))
            .expect("the crash point was never reached");
        assert!(!status.success());
        assert!(
            h.images().contains(&image),
            "{step}: the image was not created before the crash"
        );
        assert!(
            h.volumes()
                .get_opt(&format!("pvc-{uid}"))
                .await
                .unwrap()
                .is_none()
        );
    }
    let _p = h.spawn_default();
    let (_, pv) = h.wait_bound("crashy").await;
    assert_eq!(Harness::image_name(&pv), image);
    let ours: Vec<String> = h
        .images()
        .into_iter()
        .filter(|i| i.contains(&uid))
        .collect();
    assert_eq!(ours, vec![image.clone()], "exactly one image for the claim");
    assert_eq!(
        h.image_meta(&image, "provisioner.ceph.com/pv").as_deref(),
        Some(format!("pvc-{uid}").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_mode_volumes_carry_the_handle_and_secrets_the_node_needs() {
    let h = Harness::start().await;
    let _p = h.spawn(&["--leader-elect=false", "--pv-source=csi"], &[]);
    let mut params = h.params();
    params.push(("csi.storage.k8s.io/fstype".into(), "ext4".into()));
    h.create_class("rbd-csi", &params, "Delete").await;
    h.create_claim("c", "rbd-csi", "32Mi", false).await;
    let (_, pv) = h.wait_bound("c").await;
    let csi = pv.spec.as_ref().unwrap().csi.clone().expect("csi source");
    let image = Harness::image_name(&pv);
    assert_eq!(csi.driver, "rbd.provisioner.ceph.io");
    assert_eq!(
        csi.volume_handle,
        format!("v1/{}/{}/{image}", h.ceph.monitors, h.ceph.pool)
    );
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    assert_eq!(
        csi.node_stage_secret_ref.unwrap().name.as_deref(),
        Some(support::ADMIN_SECRET)
    );
    h.claims()
        .delete("c", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    assert!(!h.images().contains(&image));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_never_appears_in_logs_events_objects_or_argv() {
    let h = Harness::start().await;
    let p = h.spawn(&["--leader-elect=false", "--log-level", "trace"], &[]);
    h.create_class("rbd", &h.params(), "Delete").await;
    h.create_claim("secret-test", "rbd", "16Mi", false).await;
    let (claim, pv) = h.wait_bound("secret-test").await;
    let key = &h.ceph.admin_key;
    let argv = std::fs::read(format!("/proc/{}/cmdline", p.pid())).unwrap();
    assert!(!String::from_utf8_lossy(&argv).contains(key.as_str()));
    assert!(!serde_json::to_string(&pv).unwrap().contains(key.as_str()));
    assert!(
        !serde_json::to_string(&claim)
            .unwrap()
            .contains(key.as_str())
    );
    for e in h.events_for("secret-test").await {
        assert!(!serde_json::to_string(&e).unwrap().contains(key.as_str()));
    }
    h.claims()
        .delete("secret-test", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    let log = p.log_text();
    assert!(log.contains("image created"), "trace log is empty?");
    assert!(!log.contains(key.as_str()), "the key leaked into the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_endpoints_report_the_leader_and_metrics() {
    let h = Harness::start().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let port_arg = format!("--metrics-port={port}");
    let _p = h.spawn(
        &[
            &port_arg,
            "--metrics-address=127.0.0.1",
            "--leader-election-retry-period=200ms",
        ],
        &[],
    );
    h.create_class("rbd", &h.params(), "Delete").await;
    h.create_claim("m", "rbd", "8Mi", false).await;
    h.wait_bound("m").await;
    let get = |path: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    let ready = get("/readyz").await.unwrap();
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    assert!(
        ready.contains("\"role\":\"leader\",\"cephReachable\":true"),
        "{ready}"
    );
    assert!(get("/healthz").await.unwrap().starts_with("HTTP/1.1 200"));
    let metrics = get("/metrics").await.unwrap();
    assert!(
        metrics.contains(
            "controller_persistentvolumeclaim_provision_total{class=\"rbd\",source=\"\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("leader_election_master_status{name=\"ceph.com-rbd\"} 1"),
        "{metrics}"
    );
}

/// `--id` keeps the old provisioner's meaning: a PV annotated `rbdProvisionerIdentity` is
/// deleted only by the provisioner with that identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_deletes_only_the_pvs_of_its_own_id() {
    let h = Harness::start().await;
    h.create_class("rbd", &h.params(), "Delete").await;
    let fast = ["--leader-elect=false", "--retry-interval-start=200ms"];
    let with_id = |id: &'static str| -> Vec<&'static str> {
        let mut a = fast.to_vec();
        a.extend(["--id", id]);
        a
    };
    let a = h.spawn(&with_id("team-a"), &[]);
    h.create_claim("a-data", "rbd", "8Mi", false).await;
    let (_, a_pv) = h.wait_bound("a-data").await;
    let a_name = a_pv.metadata.name.clone().unwrap();
    let a_image = Harness::image_name(&a_pv);
    assert_eq!(
        a_pv.metadata.annotations.as_ref().unwrap()["rbdProvisionerIdentity"],
        "team-a"
    );
    drop(a);

    let b = h.spawn(&with_id("team-b"), &[]);
    h.create_claim("marker", "rbd", "8Mi", false).await;
    let (_, marker) = h.wait_bound("marker").await;
    h.claims()
        .delete("a-data", &DeleteParams::default())
        .await
        .unwrap();
    h.claims()
        .delete("marker", &DeleteParams::default())
        .await
        .unwrap();
    // team-b deletes its own PV, released after team-a's, and leaves team-a's
    h.wait_pv_gone(marker.metadata.name.as_deref().unwrap())
        .await;
    h.until(
        "team-b passed team-a's PV by",
        Duration::from_secs(20),
        || {
            let seen = b
                .log_text()
                .contains("leaving the PV to the provisioner with its identity");
            async move { seen.then_some(()) }
        },
    )
    .await;
    assert!(h.volumes().get_opt(&a_name).await.unwrap().is_some());
    assert!(h.images().contains(&a_image));
    drop(b);

    let _a = h.spawn(&with_id("team-a"), &[]);
    h.wait_pv_gone(&a_name).await;
    assert!(!h.images().contains(&a_image));
}

/// RBAC of an older release cannot read `kube-system`: the provisioner still provisions (its
/// images then name no Kubernetes cluster) and says why in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_cluster_identity_the_provisioner_still_provisions() {
    let h = Harness::start().await;
    h.create_class("rbd", &h.params(), "Delete").await;
    h.emu.faults().fail_next("get", "namespaces", 1, 403);
    let p = h.spawn_default();
    h.create_claim("no-identity", "rbd", "8Mi", false).await;
    let (_, pv) = h.wait_bound("no-identity").await;
    let image = Harness::image_name(&pv);
    assert_eq!(
        h.image_meta(&image, "provisioner.ceph.com/kube-cluster"),
        None
    );
    assert!(
        p.log_text().contains("no Kubernetes cluster identity"),
        "{}",
        p.log_text()
    );
    h.claims()
        .delete("no-identity", &Default::default())
        .await
        .unwrap();
    h.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    assert!(!h.images().contains(&image));
}
