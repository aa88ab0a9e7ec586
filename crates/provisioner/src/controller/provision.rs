//! Provisioning: claim -> backend volume -> saved PersistentVolume.
//!
//! # Flow
//! 1. The claim must pass [`ownership::decide`] (refusals become a Warning, no retry).
//! 2. If PV `pvc-<uid>` exists (cache, then API), there is nothing to do.
//! 3. `Provisioning` event, then the backend's `provision`.
//! 4. The PV is finished ([`pv::finish_volume`]) and created, retrying
//!    `volume_save_attempts` times; AlreadyExists counts as saved. If saving still fails, the
//!    finished PV is kept and its save retried with the claim's backoff until it succeeds,
//!    also after the claim was deleted (the PV then goes the normal Released -> delete way).
//!    The backend volume is never deleted on a save failure: a create that timed out may have
//!    been committed by the API server, and a Bound PV would then name a deleted image
//!    (upstream external-provisioner's behaviour since its volume store).
//!
//! # Guarantees
//! - A restart at any step converges: the backend is asked again for the same deterministic
//!   `pv_name` and must find its volume; an existing PV stops the flow.
//! - Failures are retried forever by default; every failure emits `ProvisioningFailed` (same
//!   text aggregates into one Event's count), and at attempts 2, 4, 8, ... a Warning says it is
//!   still failing, how often, when next and why.
//! - An `InBackground` failure is retried even after the claim is deleted; a volume that
//!   appears then is deleted again.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};

use super::{Retry, Shared, Work, error_chain, lock};
use crate::events::EventType;
use crate::metrics::ProvisionLabels;
use crate::ownership::{self, ANN_SELECTED_NODE, ClaimDecision};
use crate::pv;
use crate::volume::{ProvisionError, ProvisionOptions};

/// Event reasons (upstream's).
pub(crate) const PROVISIONING: &str = "Provisioning";
pub(crate) const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
pub(crate) const PROVISIONING_FAILED: &str = "ProvisioningFailed";

pub(super) async fn sync_claim(shared: &Shared, uid: &str) -> Result<(), Retry> {
    let unsaved = lock(&shared.unsaved).get(uid).cloned();
    if let Some(volume) = unsaved {
        return retry_save(shared, uid, &volume).await;
    }
    let Some(claim) = shared.claim_by_uid(uid) else {
        return finish_in_background(shared, uid).await;
    };
    if !ownership::claims_our_provisioner(&claim, &shared.names) {
        return Ok(());
    }
    let Some(class_name) = ownership::storage_class_name(&claim) else {
        return Ok(());
    };
    let Some(class) = shared.class(class_name) else {
        if ownership::decide(&claim, &StorageClass::default(), &shared.names, true)
            == ClaimDecision::Provision
        {
            let message = format!(
                "StorageClass {class_name:?} not found: create it or fix spec.storageClassName"
            );
            shared.event(&*claim, EventType::Warning, PROVISIONING_FAILED, &message);
            return Err(Retry);
        }
        return Ok(());
    };
    if !shared.names.contains(&class.provisioner) {
        return Ok(());
    }
    match ownership::decide(
        &claim,
        &class,
        &shared.names,
        shared.provisioner.supports_block(),
    ) {
        ClaimDecision::Provision => {}
        ClaimDecision::Skip(reason) => {
            tracing::trace!(claim = %claim_key(&claim), ?reason, "skipping claim");
            return Ok(());
        }
        ClaimDecision::Refuse(message) => {
            shared.event(&*claim, EventType::Warning, PROVISIONING_FAILED, &message);
            return Ok(());
        }
    }
    if !shared.provisioner.should_provision(&claim, &class) {
        return Ok(());
    }
    let pv_name = pv::volume_name_for(uid);
    if volume_exists(shared, &pv_name).await? {
        return Ok(());
    }
    let selected_node = match selected_node(shared, &claim, &class).await {
        Ok(node) => node,
        Err(message) => {
            report_failure(shared, &claim, uid, &message);
            return Err(Retry);
        }
    };
    let options = ProvisionOptions {
        storage_class: (*class).clone(),
        pv_name,
        claim: (*claim).clone(),
        selected_node,
    };
    Box::pin(provision(shared, options, uid)).await
}

async fn provision(shared: &Shared, options: ProvisionOptions, uid: &str) -> Result<(), Retry> {
    let claim = options.claim.clone();
    let labels = labels(&options);
    shared.event(
        &claim,
        EventType::Normal,
        PROVISIONING,
        &format!(
            "External provisioner is provisioning volume for claim {:?}",
            claim_key(&claim)
        ),
    );
    let started = Instant::now();
    match shared.provisioner.provision(options.clone()).await {
        Ok(provisioned) => {
            lock(&shared.in_background).remove(uid);
            let volume = pv::finish_volume(
                provisioned,
                &options,
                &shared.config.provisioner_name,
                shared.config.add_finalizer,
            );
            save_or_clean_up(shared, &claim, &volume, &labels, started).await
        }
        Err(error) => {
            shared.metrics.provision_failed(&labels);
            let why = error_chain(&error);
            tracing::warn!(claim = %claim_key(&claim), error = %why, "provisioning failed");
            match error {
                ProvisionError::Ignored(_) => {
                    lock(&shared.in_background).remove(uid);
                    Ok(())
                }
                ProvisionError::Reschedule(_) => {
                    lock(&shared.in_background).remove(uid);
                    let message = format!(
                        "failed to provision volume with StorageClass {:?} on node {:?}: {why}; asking the scheduler to pick another node",
                        class_name(&options),
                        ownership::selected_node(&claim).unwrap_or_default()
                    );
                    shared.event(&claim, EventType::Warning, PROVISIONING_FAILED, &message);
                    clear_selected_node(shared, &claim).await
                }
                ProvisionError::InBackground(_) => {
                    lock(&shared.in_background).insert(uid.to_owned(), options.clone());
                    report_failure(
                        shared,
                        &claim,
                        uid,
                        &provision_failed_message(&options, &why),
                    );
                    Err(Retry)
                }
                ProvisionError::Final(_) => {
                    lock(&shared.in_background).remove(uid);
                    if give_up(shared, &claim, uid, &why) {
                        return Ok(());
                    }
                    report_failure(
                        shared,
                        &claim,
                        uid,
                        &provision_failed_message(&options, &why),
                    );
                    Err(Retry)
                }
            }
        }
    }
}

async fn save_or_clean_up(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    labels: &ProvisionLabels,
    started: Instant,
) -> Result<(), Retry> {
    let name = volume.name_any();
    shared.config.step("before-pv-save");
    match save_volume(shared, volume).await {
        Ok(()) => {
            shared.config.step("after-pv-save");
            shared.metrics.provisioned(labels, started.elapsed());
            tracing::info!(claim = %claim_key(claim), volume = %name, "provisioned");
            shared.event(
                claim,
                EventType::Normal,
                PROVISIONING_SUCCEEDED,
                &format!("Successfully provisioned volume {name}"),
            );
            Ok(())
        }
        Err(error) => {
            shared.metrics.provision_failed(labels);
            let why = error_chain(&error);
            tracing::error!(claim = %claim_key(claim), volume = %name, error = %why, "could not save PV; keeping the volume and retrying the save");
            let uid = claim.metadata.uid.clone().unwrap_or_default();
            lock(&shared.unsaved).insert(uid.clone(), volume.clone());
            report_failure(
                shared,
                claim,
                &uid,
                &format!(
                    "failed to save PersistentVolume {name}: {why}; the volume is kept and the save retried"
                ),
            );
            Err(Retry)
        }
    }
}

/// Saves a PV whose earlier saves failed, whether or not its claim still exists.
async fn retry_save(shared: &Shared, uid: &str, volume: &PersistentVolume) -> Result<(), Retry> {
    let name = volume.name_any();
    let claim = shared.claim_by_uid(uid);
    match save_volume(shared, volume).await {
        Ok(()) => {
            lock(&shared.unsaved).remove(uid);
            tracing::info!(volume = %name, claim_exists = claim.is_some(), "saved PV after earlier failures");
            if let Some(claim) = claim {
                shared.event(
                    &*claim,
                    EventType::Normal,
                    PROVISIONING_SUCCEEDED,
                    &format!("Successfully provisioned volume {name}"),
                );
            }
            Ok(())
        }
        Err(error) => {
            let why = error_chain(&error);
            tracing::warn!(volume = %name, error = %why, "saving PV failed again; retrying");
            if let Some(claim) = claim {
                report_failure(
                    shared,
                    &claim,
                    uid,
                    &format!(
                        "failed to save PersistentVolume {name}: {why}; the volume is kept and the save retried"
                    ),
                );
            }
            Err(Retry)
        }
    }
}

/// Creates the PV, retrying with doubling delays; AlreadyExists counts as success.
async fn save_volume(shared: &Shared, volume: &PersistentVolume) -> Result<(), kube::Error> {
    let api: Api<PersistentVolume> = Api::all(shared.client.clone());
    let attempts = shared.config.volume_save_attempts.max(1);
    let mut delay = shared.config.volume_save_interval;
    let mut attempt = 1;
    loop {
        match api.create(&PostParams::default(), volume).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status))
                if status.code == 409 && status.reason == "AlreadyExists" =>
            {
                return Ok(());
            }
            Err(error) if attempt >= attempts => return Err(error),
            Err(error) => {
                tracing::warn!(volume = %volume.name_any(), attempt, %error, "saving PV failed, retrying");
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
                attempt += 1;
            }
        }
    }
}

/// The claim is gone: keep driving an in-background provisioning to its end and delete the
/// volume it produced.
async fn finish_in_background(shared: &Shared, uid: &str) -> Result<(), Retry> {
    let Some(options) = lock(&shared.in_background).get(uid).cloned() else {
        return Ok(());
    };
    match shared.provisioner.provision(options.clone()).await {
        Ok(provisioned) => {
            let volume = pv::finish_volume(
                provisioned,
                &options,
                &shared.config.provisioner_name,
                false,
            );
            match shared.provisioner.delete(&volume).await {
                Ok(()) => {
                    tracing::info!(volume = %options.pv_name, "deleted volume of a claim deleted while provisioning");
                    lock(&shared.in_background).remove(uid);
                    Ok(())
                }
                Err(error) => {
                    tracing::warn!(volume = %options.pv_name, error = %error_chain(&error), "cleanup of orphaned volume failed");
                    Err(Retry)
                }
            }
        }
        Err(ProvisionError::InBackground(_)) => Err(Retry),
        Err(_) => {
            lock(&shared.in_background).remove(uid);
            Ok(())
        }
    }
}

async fn volume_exists(shared: &Shared, name: &str) -> Result<bool, Retry> {
    if shared
        .volumes
        .get(&kube::runtime::reflector::ObjectRef::new(name))
        .is_some()
    {
        return Ok(true);
    }
    // The cache may lag behind a PV we (or a previous leader) just created.
    let api: Api<PersistentVolume> = Api::all(shared.client.clone());
    match api.get_opt(name).await {
        Ok(found) => Ok(found.is_some()),
        Err(error) => {
            tracing::warn!(volume = name, %error, "could not check whether the PV exists");
            Err(Retry)
        }
    }
}

async fn selected_node(
    shared: &Shared,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Option<Node>, String> {
    if !ownership::is_wait_for_first_consumer(class) {
        return Ok(None);
    }
    let Some(name) = ownership::selected_node(claim) else {
        return Ok(None);
    };
    let api: Api<Node> = Api::all(shared.client.clone());
    match api.get_opt(name).await {
        Ok(Some(node)) => Ok(Some(node)),
        Ok(None) => Err(format!("selected node {name:?} not found")),
        Err(error) => Err(format!("could not get selected node {name:?}: {error}")),
    }
}

async fn clear_selected_node(shared: &Shared, claim: &PersistentVolumeClaim) -> Result<(), Retry> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(
        shared.client.clone(),
        claim.namespace().as_deref().unwrap_or("default"),
    );
    let patch = serde_json::json!({ "metadata": { "annotations": { ANN_SELECTED_NODE: null } } });
    match api
        .patch(
            &claim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => {
            tracing::warn!(claim = %claim_key(claim), %error, "could not clear the selected node");
            Err(Retry)
        }
    }
}

/// Emits the failure event for the current attempt (see the module doc).
fn report_failure(shared: &Shared, claim: &PersistentVolumeClaim, uid: &str, message: &str) {
    let work = Work::Claim(uid.to_owned());
    let attempt = shared.queue.failures(&work).saturating_add(1);
    let message = if attempt >= 2 && attempt.is_power_of_two() {
        let next = shared.queue.next_delay(&work);
        still_failing_message(attempt, next, message)
    } else {
        message.to_owned()
    };
    shared.event(claim, EventType::Warning, PROVISIONING_FAILED, &message);
}

/// `true` (and a final Warning) when the optional failure threshold is reached.
fn give_up(shared: &Shared, claim: &PersistentVolumeClaim, uid: &str, why: &str) -> bool {
    let Some(threshold) = shared.config.failure_threshold else {
        return false;
    };
    let attempt = shared
        .queue
        .failures(&Work::Claim(uid.to_owned()))
        .saturating_add(1);
    if attempt < threshold {
        return false;
    }
    let message = format!(
        "giving up after {attempt} failed attempts: {why}; edit the claim or restart the provisioner to try again"
    );
    shared.event(claim, EventType::Warning, PROVISIONING_FAILED, &message);
    true
}

pub(crate) fn provision_failed_message(options: &ProvisionOptions, why: &str) -> String {
    format!(
        "failed to provision volume with StorageClass {:?}: {why}",
        class_name(options)
    )
}

pub(crate) fn still_failing_message(attempt: u32, next: Duration, message: &str) -> String {
    format!(
        "still failing after {attempt} attempts, retrying in {}s: {message}",
        next.as_secs_f64().ceil()
    )
}

fn class_name(options: &ProvisionOptions) -> String {
    options
        .storage_class
        .metadata
        .name
        .clone()
        .unwrap_or_default()
}

fn labels(options: &ProvisionOptions) -> ProvisionLabels {
    let source = options
        .claim
        .spec
        .as_ref()
        .and_then(|spec| spec.data_source.as_ref())
        .map(|source| source.kind.clone())
        .unwrap_or_default();
    ProvisionLabels {
        class: class_name(options),
        source,
    }
}

fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.meta().namespace.as_deref().unwrap_or_default(),
        claim.name_any()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn still_failing_message_says_attempts_when_and_why() {
        let message = still_failing_message(4, Duration::from_millis(7500), "pool full");
        assert_eq!(
            message,
            "still failing after 4 attempts, retrying in 8s: pool full"
        );
    }

    #[test]
    fn failure_message_names_the_class() {
        let mut options = ProvisionOptions {
            storage_class: StorageClass::default(),
            pv_name: "pvc-1".to_owned(),
            claim: PersistentVolumeClaim::default(),
            selected_node: None,
        };
        options.storage_class.metadata.name = Some("fast".to_owned());
        assert_eq!(
            provision_failed_message(&options, "pool full"),
            "failed to provision volume with StorageClass \"fast\": pool full"
        );
    }
}
