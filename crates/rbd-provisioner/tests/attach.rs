//! The built-in attach controller against the Kubernetes emulator and this test binary's
//! micro-ceph: VolumeAttachment objects of our driver (as kube-controller-manager makes them for
//! pods on nodes) are attached and detached as external-attacher does, with its finalizers and
//! status fields, and a ReadWriteOnce volume is never published to two nodes.

mod support;

use std::time::Duration;

use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::Harness;

const DRIVER: &str = "rbd.provisioner.ceph.io";
const FINALIZER: &str = "external-attacher/rbd-provisioner-ceph-io";
const WAIT: Duration = Duration::from_secs(30);

/// Removes the test's image at the end, also when an assertion failed.
struct ImageGuard(Option<String>);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        if let Some(image) = &self.0 {
            let ceph = micro_ceph::cluster();
            let _ = ceph.rbd(&["rm", "--no-progress", &format!("{}/{image}", ceph.pool)]);
        }
    }
}

async fn create_csi_node(h: &Harness, node: &str) {
    let api: Api<CSINode> = Api::all(h.client.clone());
    let csi_node = serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": node}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &csi_node).await.unwrap();
}

async fn create_attachment(h: &Harness, name: &str, node: &str, pv: &str) {
    let api: Api<VolumeAttachment> = Api::all(h.client.clone());
    let va = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &va).await.unwrap();
}

fn published_nodes(h: &Harness, image: &str) -> Vec<String> {
    let value = h
        .image_meta(image, "provisioner.ceph.com/published-nodes")
        .unwrap_or_default();
    if value.trim().is_empty() {
        return Vec::new();
    }
    let list: Vec<serde_json::Value> = serde_json::from_str(value.trim()).unwrap();
    list.iter()
        .map(|p| p["node"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_rwo_volume_is_attached_to_one_node_at_a_time_and_detached_when_released() {
    let h = Harness::start().await;
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
        &[],
    );
    h.create_class("attach", &h.params(), "Delete").await;
    h.create_claim("attach-data", "attach", "8Mi", false).await;
    let (_, pv) = h.wait_bound("attach-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    let _guard = ImageGuard(Some(image.clone()));
    for node in ["node-a", "node-b"] {
        create_csi_node(&h, node).await;
    }
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());

    // node-a: attached, with external-attacher's finalizers and status
    create_attachment(&h, "va-a", "node-a", &pv_name).await;
    let va = h
        .until("va-a attached", WAIT, || async {
            let va = vas.get("va-a").await.unwrap();
            va.status.as_ref().is_some_and(|s| s.attached).then_some(va)
        })
        .await;
    assert!(
        va.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_owned())
    );
    assert_eq!(
        va.metadata.annotations.unwrap_or_default()["csi.alpha.kubernetes.io/node-id"],
        "node-a"
    );
    let pv_now = h.volumes().get(&pv_name).await.unwrap();
    assert!(
        pv_now
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_owned())
    );
    assert_eq!(published_nodes(&h, &image), ["node-a"]);

    // node-b while node-a has it: attachError naming node-a, never published there
    create_attachment(&h, "va-b", "node-b", &pv_name).await;
    let error = h
        .until("va-b attachError", WAIT, || async {
            let va = vas.get("va-b").await.unwrap();
            va.status
                .and_then(|s| s.attach_error)
                .and_then(|e| e.message)
        })
        .await;
    assert!(error.contains("node-a"), "{error}");
    assert!(
        !vas.get("va-b")
            .await
            .unwrap()
            .status
            .is_some_and(|s| s.attached),
        "va-b attached while node-a has the volume"
    );
    assert_eq!(published_nodes(&h, &image), ["node-a"]);

    // node-a lets go: va-a detached and gone, then node-b gets the volume
    vas.delete("va-a", &DeleteParams::default()).await.unwrap();
    h.until("va-a gone", WAIT, || async {
        vas.get_opt("va-a").await.unwrap().is_none().then_some(())
    })
    .await;
    h.until("va-b attached", WAIT, || async {
        let va = vas.get("va-b").await.unwrap();
        va.status.as_ref().is_some_and(|s| s.attached).then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), ["node-b"]);

    // the claim deleted while attached: the PV waits for its VolumeAttachment
    vas.delete("va-b", &DeleteParams::default()).await.unwrap();
    h.until("va-b gone", WAIT, || async {
        vas.get_opt("va-b").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), Vec::<String>::new());
    h.claims()
        .delete("attach-data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv_name).await;
}

async fn create_pod(h: &Harness, name: &str, node: &str, claim: &str) {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client.clone(), "default");
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
}

/// The VolumeAttachments of `pv`: (node, attached).
async fn attachments_of(h: &Harness, pv: &str) -> Vec<(String, bool)> {
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());
    let mut found: Vec<(String, bool)> = vas
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
        .map(|va| {
            let attached = va.status.is_some_and(|s| s.attached);
            (va.spec.node_name, attached)
        })
        .collect();
    found.sort();
    found
}

/// Kubernetes' side emulated: pods on two nodes using one ReadWriteOnce claim. The second pod
/// gets the Multi-Attach error (no VolumeAttachment for its node), the image is never published
/// to two nodes, and the volume moves to the second node once the first pod is gone.
#[tokio::test]
async fn a_second_node_gets_the_multi_attach_error_until_the_first_pod_goes() {
    let h = Harness::start().await;
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
        &[],
    );
    let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(h.client.clone());
    let driver = serde_json::from_value(json!({
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": true, "volumeLifecycleModes": ["Persistent"]},
    }))
    .unwrap();
    drivers
        .create(&PostParams::default(), &driver)
        .await
        .unwrap();
    h.create_class("shared", &h.params(), "Delete").await;
    h.create_claim("shared-data", "shared", "8Mi", false).await;
    let (_, pv) = h.wait_bound("shared-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    let _guard = ImageGuard(Some(image.clone()));
    for node in ["node-a", "node-b"] {
        create_csi_node(&h, node).await;
    }

    create_pod(&h, "app-a", "node-a", "shared-data").await;
    h.until("attached to node-a", WAIT, || async {
        (attachments_of(&h, &pv_name).await == [("node-a".to_owned(), true)]).then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), ["node-a"]);

    create_pod(&h, "app-b", "node-b", "shared-data").await;
    let message = h
        .wait_event_containing("app-b", "FailedAttachVolume", &["Multi-Attach error"])
        .await;
    assert_eq!(
        message,
        format!(
            "Multi-Attach error for volume \"{pv_name}\" Volume is already used by pod(s) app-a"
        )
    );
    assert_eq!(
        attachments_of(&h, &pv_name).await,
        [("node-a".to_owned(), true)],
        "no VolumeAttachment for node-b"
    );
    assert_eq!(published_nodes(&h, &image), ["node-a"]);

    // the first pod goes: detached from node-a, then attached to node-b
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client.clone(), "default");
    pods.delete("app-a", &DeleteParams::default())
        .await
        .unwrap();
    h.until("moved to node-b", WAIT, || async {
        (attachments_of(&h, &pv_name).await == [("node-b".to_owned(), true)]).then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), ["node-b"]);

    pods.delete("app-b", &DeleteParams::default())
        .await
        .unwrap();
    h.until("detached", WAIT, || async {
        attachments_of(&h, &pv_name).await.is_empty().then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), Vec::<String>::new());
    h.claims()
        .delete("shared-data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv_name).await;
}

/// Migration: a volume in use while the CSIDriver said `attachRequired: false` has no
/// VolumeAttachment; after the operator deletes and recreates the CSIDriver with
/// `attachRequired: true`, the running pod's volume gets one, is published to its node, and a
/// pod on another node is refused.
#[tokio::test]
async fn a_volume_in_use_before_attach_was_required_is_attached_after_the_csidriver_is_recreated() {
    let h = Harness::start().await;
    let _p = h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
        &[],
    );
    let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(h.client.clone());
    let driver = |attach: bool| {
        serde_json::from_value(json!({
            "metadata": {"name": DRIVER},
            "spec": {"attachRequired": attach, "volumeLifecycleModes": ["Persistent"]},
        }))
        .unwrap()
    };
    drivers
        .create(&PostParams::default(), &driver(false))
        .await
        .unwrap();
    h.create_class("old", &h.params(), "Delete").await;
    h.create_claim("old-data", "old", "8Mi", false).await;
    let (_, pv) = h.wait_bound("old-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    let _guard = ImageGuard(Some(image.clone()));
    for node in ["node-a", "node-b"] {
        create_csi_node(&h, node).await;
    }
    create_pod(&h, "old-app", "node-a", "old-data").await;
    assert_eq!(attachments_of(&h, &pv_name).await, []);
    assert_eq!(published_nodes(&h, &image), Vec::<String>::new());

    // the operator's step: attachRequired is immutable, so delete and recreate
    drivers
        .delete(DRIVER, &DeleteParams::default())
        .await
        .unwrap();
    drivers
        .create(&PostParams::default(), &driver(true))
        .await
        .unwrap();
    h.until("the running pod's volume attached", WAIT, || async {
        (attachments_of(&h, &pv_name).await == [("node-a".to_owned(), true)]).then_some(())
    })
    .await;
    assert_eq!(published_nodes(&h, &image), ["node-a"]);
    create_pod(&h, "new-app", "node-b", "old-data").await;
    h.wait_event_containing("new-app", "FailedAttachVolume", &["Multi-Attach error"])
        .await;
    assert_eq!(published_nodes(&h, &image), ["node-a"]);

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client.clone(), "default");
    for pod in ["old-app", "new-app"] {
        pods.delete(pod, &DeleteParams::default()).await.unwrap();
    }
    h.until("detached", WAIT, || async {
        attachments_of(&h, &pv_name).await.is_empty().then_some(())
    })
    .await;
    h.claims()
        .delete("old-data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv_name).await;
}

/// The provisioner with fast retries (the attach controller and the deletion retry alike).
fn spawn_fast(h: &Harness) -> support::Process {
    h.spawn(
        &[
            "--leader-elect=false",
            "--pv-source=csi",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
        &[],
    )
}

/// kubelet unstages before the attach/detach controller detaches: a claim deleted with its pod
/// is released while its VolumeAttachment still exists. The image must outlive the
/// VolumeAttachment (external-provisioner's rule), with an event saying what it waits for.
#[tokio::test]
async fn a_released_volume_is_not_deleted_while_a_volume_attachment_names_it() {
    let h = Harness::start().await;
    let _p = spawn_fast(&h);
    h.create_class("held", &h.params(), "Delete").await;
    h.create_claim("held-data", "held", "8Mi", false).await;
    let (_, pv) = h.wait_bound("held-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    let _guard = ImageGuard(Some(image.clone()));
    create_csi_node(&h, "node-a").await;
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());
    create_attachment(&h, "va-held", "node-a", &pv_name).await;
    h.until("va-held attached", WAIT, || async {
        let va = vas.get("va-held").await.unwrap();
        va.status.as_ref().is_some_and(|s| s.attached).then_some(())
    })
    .await;

    h.claims()
        .delete("held-data", &DeleteParams::default())
        .await
        .unwrap();
    let message = h
        .wait_event_containing(&pv_name, "VolumeFailedDelete", &["still attached"])
        .await;
    assert!(
        message.starts_with(&format!(
            "persistentvolume {pv_name} is still attached to node node-a"
        )),
        "{message}"
    );
    // the deletion is retried (every 200 ms to 1 s) and keeps waiting
    h.until("a retry of the deletion", WAIT, || async {
        let events = h.events_for(&pv_name).await;
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("VolumeFailedDelete") && e.count.unwrap_or(1) > 1)
            .then_some(())
    })
    .await;
    assert!(
        h.images().contains(&image),
        "the image was removed while its VolumeAttachment exists"
    );
    assert!(h.volumes().get_opt(&pv_name).await.unwrap().is_some());
    assert_eq!(published_nodes(&h, &image), ["node-a"]);

    // the detach: then the volume goes
    vas.delete("va-held", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv_name).await;
    assert!(!h.images().contains(&image), "the image outlived its PV");
}

/// A PV with `ReadWriteOnce` and `ReadOnlyMany` (made elsewhere or by an older version):
/// Kubernetes would attach it to several nodes; no node gets it read-write, as external-attacher
/// refuses it outright.
#[tokio::test]
async fn a_pv_with_read_write_once_and_read_only_many_is_attached_to_no_node() {
    let h = Harness::start().await;
    let _p = spawn_fast(&h);
    h.create_class("mixed", &h.params(), "Delete").await;
    h.create_claim("mixed-data", "mixed", "8Mi", false).await;
    let (_, pv) = h.wait_bound("mixed-data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let image = Harness::image_name(&pv);
    let _guard = ImageGuard(Some(image.clone()));
    let modes = json!({"spec": {"accessModes": ["ReadWriteOnce", "ReadOnlyMany"]}});
    h.volumes()
        .patch(
            &pv_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&modes),
        )
        .await
        .unwrap();
    let vas: Api<VolumeAttachment> = Api::all(h.client.clone());
    for node in ["node-a", "node-b"] {
        create_csi_node(&h, node).await;
        create_attachment(&h, &format!("va-{node}"), node, &pv_name).await;
    }
    for node in ["node-a", "node-b"] {
        let name = format!("va-{node}");
        let error = h
            .until(&format!("{name} attachError"), WAIT, || async {
                let va = vas.get(&name).await.unwrap();
                va.status
                    .and_then(|s| s.attach_error)
                    .and_then(|e| e.message)
            })
            .await;
        assert!(
            error.contains(&format!("PersistentVolume {pv_name}"))
                && error.contains("spec.accessModes")
                && error.contains("CSI does not support ReadOnlyMany and ReadWriteOnce"),
            "{error}"
        );
        let va = vas.get(&name).await.unwrap();
        assert!(!va.status.is_some_and(|s| s.attached), "{name} attached");
    }
    assert_eq!(published_nodes(&h, &image), Vec::<String>::new());

    for node in ["node-a", "node-b"] {
        vas.delete(&format!("va-{node}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    h.until("VolumeAttachments gone", WAIT, || async {
        attachments_of(&h, &pv_name).await.is_empty().then_some(())
    })
    .await;
    h.claims()
        .delete("mixed-data", &DeleteParams::default())
        .await
        .unwrap();
    h.wait_pv_gone(&pv_name).await;
}

/// Such a claim is refused at provisioning, with the field and the reason.
#[tokio::test]
async fn a_claim_asking_read_write_once_and_read_only_many_is_refused_naming_access_modes() {
    let h = Harness::start().await;
    let _p = spawn_fast(&h);
    h.create_class("mixed-claim", &h.params(), "Delete").await;
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "mixed-claim", "namespace": "default"},
        "spec": {
            "storageClassName": "mixed-claim",
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "resources": {"requests": {"storage": "8Mi"}},
        }
    }))
    .unwrap();
    h.claims()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let message = h
        .wait_event_containing("mixed-claim", "ProvisioningFailed", &["spec.accessModes"])
        .await;
    assert!(
        message.contains(r#"["ReadWriteOnce", "ReadOnlyMany"]"#)
            && message.contains("CSI does not support ReadOnlyMany and ReadWriteOnce")
            && message.contains("several nodes"),
        "{message}"
    );
    let claim = h.claims().get("mixed-claim").await.unwrap();
    assert_eq!(
        claim.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    assert!(
        h.volumes()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a PV was made"
    );
}
