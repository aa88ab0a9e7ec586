//! Deletion flow.

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube_emulator::Emulator;
use provisioner::pv::FINALIZER;

use crate::common::backend::FakeBackend;
use crate::common::*;

#[tokio::test]
async fn deletes_released_volume_with_delete_policy() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let mut config = config();
    config.add_finalizer = true;
    let controller = start(client.clone(), config, backend.clone(), false);

    let (_, volume) = provisioned_claim(&client, "data", "fast").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    assert!(
        volume
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_owned())
    );
    // The class may be gone by the time the volume is released: delete never needs it.
    Api::<StorageClass>::all(client.clone())
        .delete("fast", &Default::default())
        .await
        .unwrap();
    claims(&client)
        .delete("data", &Default::default())
        .await
        .unwrap();

    wait_gone(&volumes(&client), &pv_name).await;
    assert!(!backend.has_volume(&pv_name));
    assert_eq!(backend.deletes(), 1);
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn retain_policy_leaves_volume_and_backend_untouched() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(
        &client,
        "keep",
        ClassSpec {
            reclaim_policy: "Retain",
            ..Default::default()
        },
    )
    .await;
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);

    let (_, kept) = provisioned_claim(&client, "kept", "keep").await;
    let (_, barrier) = provisioned_claim(&client, "barrier", "fast").await;
    let kept_name = kept.metadata.name.clone().unwrap();
    claims(&client)
        .delete("kept", &Default::default())
        .await
        .unwrap();
    wait_for(&volumes(&client), &kept_name, "Released", |v| {
        volume_phase(v) == Some("Released")
    })
    .await;
    // The barrier is released after the retained one; once it is gone, the retained PV was seen.
    claims(&client)
        .delete("barrier", &Default::default())
        .await
        .unwrap();
    wait_gone(&volumes(&client), barrier.metadata.name.as_deref().unwrap()).await;

    let still = volumes(&client).get(&kept_name).await.unwrap();
    assert_eq!(volume_phase(&still), Some("Released"));
    assert!(backend.has_volume(&kept_name));
    assert_eq!(
        backend.deletes(),
        1,
        "only the barrier's volume was deleted"
    );
    controller.stop().await.unwrap();
}

#[tokio::test]
async fn delete_refusal_warns_and_retries() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let backend = FakeBackend::new();
    let controller = start(client.clone(), config(), backend.clone(), false);

    let (_, volume) = provisioned_claim(&client, "data", "fast").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    backend.fail_deletes(3);
    claims(&client)
        .delete("data", &Default::default())
        .await
        .unwrap();

    let event = wait_for_event(&client, &pv_name, "VolumeFailedDelete", "volume is in use").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    wait_gone(&volumes(&client), &pv_name).await;
    assert_eq!(backend.deletes(), 4, "three refusals, then success");
    assert!(!backend.has_volume(&pv_name));
    controller.stop().await.unwrap();
}
