//! Modification by VolumeAttributesClass, with a scripted modifier: a retryable failure keeps
//! the claim `InProgress` ("Still modifying") and is retried until it succeeds; an infeasible
//! class is `Infeasible` (condition and Warning say why) until a valid one is named; success
//! names the class on the PV and as the claim's current class and clears the status.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_emulator::Emulator;
use provisioner::{Controller, Modifier, ModifyError};
use tokio::sync::oneshot;

use crate::common::backend::FakeBackend;
use crate::common::*;

/// Answers `modify` from a script (then success), refuses the class `infeasible` always, and
/// records the classes it was called with.
#[derive(Default)]
struct ScriptedModifier {
    script: Mutex<VecDeque<ModifyError>>,
    infeasible: Option<&'static str>,
    calls: Mutex<Vec<String>>,
}

#[async_trait]
impl Modifier for ScriptedModifier {
    async fn modify(
        &self,
        _volume: &PersistentVolume,
        class: &VolumeAttributesClass,
    ) -> Result<(), ModifyError> {
        let name = class.metadata.name.clone().unwrap_or_default();
        self.calls.lock().unwrap().push(name.clone());
        if self.infeasible == Some(name.as_str()) {
            return Err(ModifyError::infeasible("unknown parameter \"speed\""));
        }
        match self.script.lock().unwrap().pop_front() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

fn start_modifying(client: Client, modifier: Arc<ScriptedModifier>) -> oneshot::Sender<()> {
    let controller = Controller::new(client, config(), FakeBackend::new()).with_modifier(modifier);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));
    stop
}

async fn create_vac(client: &Client, name: &str) {
    let class = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "driverName": PROVISIONER,
        "parameters": {"iops": "100"},
    }))
    .unwrap();
    Api::<VolumeAttributesClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("create VolumeAttributesClass");
}

async fn name_class(client: &Client, claim: &str, class: &str) {
    let patch = serde_json::json!({"spec": {"volumeAttributesClassName": class}});
    claims(client)
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("name a class");
}

fn modify_status(claim: &PersistentVolumeClaim) -> Option<(String, String)> {
    let m = claim.status.as_ref()?.modify_volume_status.as_ref()?;
    Some((
        m.target_volume_attributes_class_name
            .clone()
            .unwrap_or_default(),
        m.status.clone(),
    ))
}

fn current(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .status
        .as_ref()?
        .current_volume_attributes_class_name
        .as_deref()
}

fn modifying_condition(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "ModifyingVolume")
        .map(|c| c.message.clone().unwrap_or_default())
}

#[tokio::test]
async fn a_failed_modification_stays_in_progress_and_is_retried_until_done() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let modifier = Arc::new(ScriptedModifier::default());
    modifier.script.lock().unwrap().extend([
        ModifyError::failed("storage busy"),
        ModifyError::failed("storage busy"),
    ]);
    let _stop = start_modifying(client.clone(), modifier.clone());
    let (_, volume) = provisioned_claim(&client, "data", "fast").await;
    let pv_name = volume.metadata.name.clone().unwrap();
    create_vac(&client, "gold").await;
    name_class(&client, "data", "gold").await;

    wait_for_event(
        &client,
        "data",
        "VolumeModifyFailed",
        "storage busy. Still modifying to VAC gold",
    )
    .await;
    let claim = wait_for(&claims(&client), "data", "current class gold", |c| {
        current(c) == Some("gold") && modify_status(c).is_none()
    })
    .await;
    assert_eq!(modifying_condition(&claim), None, "conditions cleared");
    let volume = volumes(&client).get(&pv_name).await.unwrap();
    assert_eq!(
        volume.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    assert_eq!(*modifier.calls.lock().unwrap(), ["gold", "gold", "gold"]);
    wait_for_event(&client, "data", "VolumeModify", "gold").await;
    wait_for_event(&client, "data", "VolumeModifySuccessful", &pv_name).await;
}

#[tokio::test]
async fn an_infeasible_class_waits_for_a_valid_one() {
    init_tracing();
    let emu = Emulator::new();
    let client = emu.client();
    create_class(&client, "fast", ClassSpec::default()).await;
    let modifier = Arc::new(ScriptedModifier {
        infeasible: Some("broken"),
        ..Default::default()
    });
    let _stop = start_modifying(client.clone(), modifier.clone());
    provisioned_claim(&client, "data", "fast").await;
    create_vac(&client, "broken").await;
    name_class(&client, "data", "broken").await;
    let claim = wait_for(&claims(&client), "data", "Infeasible", |c| {
        modify_status(c) == Some(("broken".into(), "Infeasible".into()))
    })
    .await;
    let why = modifying_condition(&claim).unwrap_or_default();
    assert!(why.contains("unknown parameter \"speed\""), "{why}");
    assert_eq!(current(&claim), None);
    wait_for_event(&client, "data", "VolumeModifyFailed", "unknown parameter").await;

    create_vac(&client, "good").await;
    name_class(&client, "data", "good").await;
    let claim = wait_for(&claims(&client), "data", "current class good", |c| {
        current(c) == Some("good") && modify_status(c).is_none()
    })
    .await;
    assert_eq!(modifying_condition(&claim), None);
}
