//! Reclaiming space on a schedule: the annotation `reclaimspace.csiaddons.openshift.io/schedule`
//! on a claim, its namespace or its StorageClass (the first found, in that order) gives each
//! bound claim of a volume the backend serves a ReclaimSpaceCronJob with that schedule, as
//! csi-addons' claim controller does.
//!
//! - The cron job is named `<claim>-<unix seconds of its creation>`, owned by the claim (it
//!   goes with it), marked `csiaddons.openshift.io/state: managed`, and recorded on the claim
//!   in `reclaimspace.csiaddons.openshift.io/cronjob`; its jobs target the claim with
//!   csi-addons' defaults (`backOffLimit` 6, `retryDeadlineSeconds` 600).
//! - A changed schedule changes the cron job's; a schedule removed from everywhere deletes the
//!   cron job and the record. A cron job whose state is not `managed` is left as it is.
//! - A schedule that does not parse ([`super::cron::Schedule`]) gets a Warning Event
//!   `ReclaimSpaceScheduleInvalid` on the claim naming where it was set; the claim's cron job,
//!   if any, is left as it was.
//!
//! Unlike csi-addons, the schedule found is not copied onto the claim: a schedule set on a
//! namespace or a StorageClass stays that object's to change or remove.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::cron::Schedule;
use super::cronjob::{JobTemplate, ReclaimSpaceCronJob, ReclaimSpaceCronJobSpec};
use super::{
    DEFAULT_BACKOFF_LIMIT, DEFAULT_RETRY_DEADLINE_SECONDS, ReclaimSpaceJobSpec, SpaceReclaimer,
    Target,
};
use crate::events::{EventRecorder, EventType};
use crate::queue::{Backoff, WorkQueue};

/// The schedule annotation (claim, namespace or StorageClass).
pub const ANN_SCHEDULE: &str = "reclaimspace.csiaddons.openshift.io/schedule";
/// The claim's record of its cron job's name.
pub const ANN_CRONJOB: &str = "reclaimspace.csiaddons.openshift.io/cronjob";
/// The state annotation of a cron job this controller manages.
pub const ANN_STATE: &str = "csiaddons.openshift.io/state";
/// [`ANN_STATE`]'s value for a managed cron job.
pub const STATE_MANAGED: &str = "managed";

type Key = (String, String);

/// What the schedule of a claim depends on, kept per claim (claims come from the provisioning
/// controller's own watch: a claim observer, so the process watches claims once).
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClaimFacts {
    uid: String,
    class: Option<String>,
    volume: Option<String>,
    bound: bool,
    schedule: Option<String>,
    cron_job: Option<String>,
}

impl ClaimFacts {
    fn of(claim: &PersistentVolumeClaim) -> ClaimFacts {
        let spec = claim.spec.as_ref();
        ClaimFacts {
            uid: claim.uid().unwrap_or_default(),
            class: spec
                .and_then(|s| s.storage_class_name.clone())
                .filter(|c| !c.is_empty()),
            volume: spec
                .and_then(|s| s.volume_name.clone())
                .filter(|v| !v.is_empty()),
            bound: claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
            schedule: claim.annotations().get(ANN_SCHEDULE).cloned(),
            cron_job: claim.annotations().get(ANN_CRONJOB).cloned(),
        }
    }

    /// A claim object with just enough to refer to it (events, owner references).
    fn object(&self, namespace: &str, name: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: Some(self.uid.clone()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        }
    }
}

type Claims = Arc<Mutex<HashMap<Key, ClaimFacts>>>;

struct Context {
    client: Client,
    backend: Arc<dyn SpaceReclaimer>,
    recorder: EventRecorder,
    claims: Claims,
    namespaces: Store<Namespace>,
    classes: Store<StorageClass>,
}

/// The controller: the observer to give [`crate::Controller::with_claim_observer`] and the task
/// for [`crate::Controller::with_companion`] (see the module doc).
#[must_use]
pub fn controller(
    client: Client,
    backend: Arc<dyn SpaceReclaimer>,
    component: String,
) -> (crate::ClaimObserver, crate::Companion) {
    let queue: WorkQueue<Key> = WorkQueue::new(Backoff::default());
    let claims: Claims = Arc::default();
    let observer: crate::ClaimObserver = {
        let (queue, claims) = (queue.clone(), Arc::clone(&claims));
        Arc::new(move |claim: &PersistentVolumeClaim| claim_seen(&queue, &claims, claim))
    };
    (
        observer,
        Box::pin(run(client, backend, component, queue, claims)),
    )
}

/// A claim was listed, changed or went: kept, and queued when what its schedule depends on
/// changed.
fn claim_seen(queue: &WorkQueue<Key>, claims: &Claims, claim: &PersistentVolumeClaim) {
    let key = (claim.namespace().unwrap_or_default(), claim.name_any());
    let Ok(mut claims) = claims.lock() else {
        return;
    };
    if claim.metadata.deletion_timestamp.is_some() {
        claims.remove(&key);
        return;
    }
    let facts = ClaimFacts::of(claim);
    if claims.get(&key) != Some(&facts) {
        claims.insert(key.clone(), facts);
        queue.add(key);
    }
}

/// The claims (keys) for which `matches` holds.
fn claims_where(claims: &Claims, matches: impl Fn(&Key, &ClaimFacts) -> bool) -> Vec<Key> {
    claims
        .lock()
        .map(|c| {
            c.iter()
                .filter(|(k, f)| matches(k, f))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The watch of every `K`, kept in `writer`'s store; the objects applied.
fn watched<K>(
    client: &Client,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = Result<K, watcher::Error>>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
}

async fn run(
    client: Client,
    backend: Arc<dyn SpaceReclaimer>,
    component: String,
    queue: WorkQueue<Key>,
    claims: Claims,
) {
    let (namespaces, namespaces_w) = reflector::store();
    let (classes, classes_w) = reflector::store();
    let context = Arc::new(Context {
        client: client.clone(),
        backend,
        recorder: EventRecorder::new(client.clone(), &component, &component),
        claims: Arc::clone(&claims),
        namespaces,
        classes,
    });
    tracing::info!("watching the reclaim-space schedules of claims, namespaces and StorageClasses");
    // a namespace or class whose annotation changed: its claims are looked at again (a deleted
    // one is not seen, which leaves its claims' cron jobs until they change, as in csi-addons)
    let namespace_events = watched::<Namespace>(&client, namespaces_w).for_each(|namespace| {
        if let Ok(namespace) = namespace {
            let name = namespace.name_any();
            for key in claims_where(&claims, |k, _| k.0 == name) {
                queue.add(key);
            }
        }
        async {}
    });
    let class_events = watched::<StorageClass>(&client, classes_w).for_each(|class| {
        if let Ok(class) = class {
            let name = class.name_any();
            for key in claims_where(&claims, |_, f| f.class.as_deref() == Some(name.as_str())) {
                queue.add(key);
            }
        }
        async {}
    });
    let worker = {
        let (queue, context) = (queue.clone(), Arc::clone(&context));
        async move {
            // the stores first: a decision on a half-listed cache could delete a cron job
            let _ = context.namespaces.wait_until_ready().await;
            let _ = context.classes.wait_until_ready().await;
            while let Some(key) = queue.get().await {
                match sync(&context, &key.0, &key.1).await {
                    Ok(()) => queue.forget(&key),
                    Err(error) => {
                        tracing::warn!(claim = %format!("{}/{}", key.0, key.1), %error, "reclaim-space schedule; retrying");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        }
    };
    tokio::select! {
        () = async { tokio::join!(namespace_events, class_events); } => {}
        () = worker => {}
    }
    queue.shut_down();
}

/// The schedule that applies to a claim and where it was set.
fn schedule_of(context: &Context, namespace: &str, facts: &ClaimFacts) -> Option<(String, String)> {
    if let Some(s) = &facts.schedule {
        return Some((s.clone(), "the claim".to_owned()));
    }
    if let Some(ns) = context.namespaces.get(&ObjectRef::new(namespace))
        && let Some(s) = ns.annotations().get(ANN_SCHEDULE)
    {
        return Some((s.clone(), format!("namespace {namespace}")));
    }
    let class = facts.class.as_deref()?;
    let sc = context.classes.get(&ObjectRef::new(class))?;
    sc.annotations()
        .get(ANN_SCHEDULE)
        .map(|s| (s.clone(), format!("StorageClass {class}")))
}

async fn sync(context: &Context, namespace: &str, name: &str) -> Result<(), String> {
    let key = (namespace.to_owned(), name.to_owned());
    let Some(facts) = context
        .claims
        .lock()
        .ok()
        .and_then(|c| c.get(&key).cloned())
    else {
        return Ok(());
    };
    let schedule = schedule_of(context, namespace, &facts);
    if !facts.bound || (schedule.is_none() && facts.cron_job.is_none()) {
        return Ok(());
    }
    // only now is the volume read: most claims have no schedule
    let Some(volume) = &facts.volume else {
        return Ok(());
    };
    let volumes: Api<PersistentVolume> = Api::all(context.client.clone());
    let ours = volumes
        .get_opt(volume)
        .await
        .map_err(|e| format!("reading PersistentVolume {volume}: {e}"))?
        .is_some_and(|v| context.backend.serves(&v));
    if !ours {
        return Ok(());
    }
    let cron_jobs: Api<ReclaimSpaceCronJob> = Api::namespaced(context.client.clone(), namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), namespace);
    let claim = facts.object(namespace, name);

    let Some((text, source)) = schedule else {
        if let Some(cron_job) = &facts.cron_job {
            remove(&cron_jobs, &claims, name, cron_job).await?;
        }
        return Ok(());
    };
    if let Err(problem) = Schedule::parse(&text) {
        context.recorder.publish(
            &claim,
            EventType::Warning,
            "ReclaimSpaceScheduleInvalid",
            &format!("{ANN_SCHEDULE} on {source}: {problem}"),
        );
        return Ok(());
    }
    let cron_job_name = if let Some(recorded) = &facts.cron_job {
        recorded.clone()
    } else {
        let cron_job_name = cron_job_name(name, Utc::now().timestamp());
        let patch = json!({"metadata": {"annotations": {ANN_CRONJOB: cron_job_name}}});
        claims
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("recording the cron job on claim {namespace}/{name}: {e}"))?;
        cron_job_name
    };
    ensure(&cron_jobs, &claim, &cron_job_name, &text, &source).await
}

/// Creates the claim's cron job `cron_job_name` with `schedule`, or sets the schedule of the
/// one there when it is managed.
async fn ensure(
    cron_jobs: &Api<ReclaimSpaceCronJob>,
    claim: &PersistentVolumeClaim,
    cron_job_name: &str,
    text: &str,
    source: &str,
) -> Result<(), String> {
    let (namespace, name) = (claim.namespace().unwrap_or_default(), claim.name_any());
    let existing = cron_jobs
        .get_opt(cron_job_name)
        .await
        .map_err(|e| format!("reading ReclaimSpaceCronJob {namespace}/{cron_job_name}: {e}"))?;
    let Some(existing) = existing else {
        let cron_job = new_cron_job(claim, cron_job_name, text);
        return match cron_jobs.create(&PostParams::default(), &cron_job).await {
            Ok(_) => {
                tracing::info!(claim = %format!("{namespace}/{name}"), schedule = %text, %source, cronjob = %cron_job_name, "reclaiming space on a schedule");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(format!(
                "creating ReclaimSpaceCronJob {namespace}/{cron_job_name}: {e}"
            )),
        };
    };
    let managed = existing.annotations().get(ANN_STATE).map(String::as_str) == Some(STATE_MANAGED);
    if managed && existing.spec.schedule != text {
        let patch = json!({"spec": {"schedule": text}});
        cron_jobs
            .patch(
                cron_job_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| {
                format!("updating ReclaimSpaceCronJob {namespace}/{cron_job_name}: {e}")
            })?;
        tracing::info!(claim = %format!("{namespace}/{name}"), schedule = %text, %source, "reclaim-space schedule changed");
    }
    Ok(())
}

/// `<claim>-<unix seconds>`, the claim's name cut so the whole stays a valid object name.
fn cron_job_name(claim: &str, now: i64) -> String {
    let suffix = format!("-{now}");
    let room = 253 - suffix.len();
    let mut base: String = claim.chars().take(room).collect();
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    format!("{base}{suffix}")
}

fn new_cron_job(claim: &PersistentVolumeClaim, name: &str, schedule: &str) -> ReclaimSpaceCronJob {
    ReclaimSpaceCronJob {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: claim.namespace(),
            annotations: Some([(ANN_STATE.to_owned(), STATE_MANAGED.to_owned())].into()),
            owner_references: claim.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: ReclaimSpaceCronJobSpec {
            schedule: schedule.to_owned(),
            concurrency_policy: Some("Forbid".into()),
            job_template: JobTemplate {
                metadata: None,
                spec: ReclaimSpaceJobSpec {
                    target: Target {
                        persistent_volume_claim: claim.name_any(),
                    },
                    back_off_limit: Some(DEFAULT_BACKOFF_LIMIT),
                    retry_deadline_seconds: Some(DEFAULT_RETRY_DEADLINE_SECONDS),
                    timeout: None,
                },
            },
            successful_jobs_history_limit: Some(super::cronjob::DEFAULT_SUCCESSFUL_HISTORY),
            failed_jobs_history_limit: Some(super::cronjob::DEFAULT_FAILED_HISTORY),
            ..ReclaimSpaceCronJobSpec::default()
        },
        status: None,
    }
}

async fn remove(
    cron_jobs: &Api<ReclaimSpaceCronJob>,
    claims: &Api<PersistentVolumeClaim>,
    claim: &str,
    cron_job: &str,
) -> Result<(), String> {
    match cron_jobs.get_opt(cron_job).await {
        Ok(Some(existing))
            if existing.annotations().get(ANN_STATE).map(String::as_str) == Some(STATE_MANAGED) =>
        {
            match cron_jobs
                .delete(cron_job, &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(format!("deleting ReclaimSpaceCronJob {cron_job}: {e}")),
            }
            tracing::info!(
                claim,
                cronjob = cron_job,
                "reclaim-space schedule removed: cron job deleted"
            );
        }
        Ok(_) => {}
        Err(e) => return Err(format!("reading ReclaimSpaceCronJob {cron_job}: {e}")),
    }
    let patch = json!({"metadata": {"annotations": {ANN_CRONJOB: null}}});
    claims
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("removing the cron job record of claim {claim}: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_job_names_stay_valid_object_names() {
        assert_eq!(cron_job_name("data", 1_765_000_000), "data-1765000000");
        let long = "a".repeat(253);
        let name = cron_job_name(&long, 1_765_000_000);
        assert_eq!(name.len(), 253);
        assert!(name.ends_with("a-1765000000"));
    }
}
