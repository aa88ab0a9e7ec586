//! csi-addons' `ReclaimSpaceCronJob` (`csiaddons.openshift.io/v1alpha1`, namespaced): creates a
//! ReclaimSpaceJob from `spec.jobTemplate` at every start time of `spec.schedule`
//! ([`super::cron::Schedule`], UTC), as csi-addons' controller does.
//!
//! Per cron job, at each change and at each start time:
//! 1. its jobs (ReclaimSpaceJobs it is the controller owner of) are read: `status.active`
//!    (the one without a result), `lastScheduleTime` (the newest `csiaddons.openshift.io/
//!    scheduled-at`), `lastSuccessfulTime` (the newest completion of a succeeded one);
//! 2. finished jobs beyond `successfulJobsHistoryLimit` (default 3) and
//!    `failedJobsHistoryLimit` (default 1) are deleted, oldest first;
//! 3. unless `suspend`: the last start time missed since `lastScheduleTime` (or the creation)
//!    runs, when within `startingDeadlineSeconds` of now (if set); with `concurrencyPolicy:
//!    Forbid` (the default) not while a job is active, with `Replace` the active job is deleted
//!    first. The job is named `<cron job>-<start time, unix seconds>`, so a start time never
//!    runs twice;
//! 4. the cron job is looked at again at the next start time.
//!
//! A schedule that does not parse gets a Warning Event on the cron job naming `spec.schedule`.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::NamespaceResourceScope;
use kube::{Client, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::cron::Schedule;
use super::{ReclaimSpaceJob, ReclaimSpaceJobSpec};
use crate::events::{EventRecorder, EventType};
use crate::network_fence::GROUP;
use crate::queue::{Backoff, WorkQueue};

/// The annotation on a job with the start time it ran for (RFC 3339).
pub const ANN_SCHEDULED_AT: &str = "csiaddons.openshift.io/scheduled-at";
/// `successfulJobsHistoryLimit` when not set.
pub const DEFAULT_SUCCESSFUL_HISTORY: i32 = 3;
/// `failedJobsHistoryLimit` when not set.
pub const DEFAULT_FAILED_HISTORY: i32 = 1;

/// A ReclaimSpaceCronJob.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ReclaimSpaceCronJob {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// When and what to run.
    #[serde(default)]
    pub spec: ReclaimSpaceCronJobSpec,
    /// What ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ReclaimSpaceCronJobStatus>,
}

/// `spec` of a ReclaimSpaceCronJob.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceCronJobSpec {
    /// The schedule ([`Schedule`]).
    #[serde(default)]
    pub schedule: String,
    /// Seconds after a start time within which it may still run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_seconds: Option<i64>,
    /// `Forbid` (default) or `Replace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_policy: Option<String>,
    /// No new jobs while true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// The jobs to create.
    #[serde(default)]
    pub job_template: JobTemplate,
    /// Succeeded jobs kept (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successful_jobs_history_limit: Option<i32>,
    /// Failed jobs kept (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_jobs_history_limit: Option<i32>,
}

/// `spec.jobTemplate`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct JobTemplate {
    /// Labels and annotations of the jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// The jobs' spec.
    #[serde(default)]
    pub spec: ReclaimSpaceJobSpec,
}

/// `status` of a ReclaimSpaceCronJob.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimSpaceCronJobStatus {
    /// The job running, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<ObjectReference>,
    /// The newest start time a job was created for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the newest succeeded job completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
}

custom_resource!(
    ReclaimSpaceCronJob,
    GROUP,
    "v1alpha1",
    "ReclaimSpaceCronJob",
    "reclaimspacecronjobs",
    NamespaceResourceScope
);

struct Context {
    client: Client,
    recorder: EventRecorder,
}

/// Runs the ReclaimSpaceCronJob controller until dropped (see the module doc).
pub async fn run(client: Client, component: String) {
    let queue: Arc<WorkQueue<(String, String)>> = Arc::new(WorkQueue::new(Backoff::default()));
    let context = Arc::new(Context {
        client: client.clone(),
        recorder: EventRecorder::new(client.clone(), &component, &component),
    });
    tracing::info!("watching ReclaimSpaceCronJobs");
    let worker = {
        let (queue, context) = (Arc::clone(&queue), Arc::clone(&context));
        async move {
            while let Some(key) = queue.get().await {
                match sync(&context, &key.0, &key.1).await {
                    Ok(Some(next)) => {
                        queue.forget(&key);
                        queue.add_after(key.clone(), next);
                    }
                    Ok(None) => queue.forget(&key),
                    Err(error) => {
                        tracing::warn!(reclaimspacecronjob = %format!("{}/{}", key.0, key.1), %error, "ReclaimSpaceCronJob; retrying");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        }
    };
    let cron_jobs: Api<ReclaimSpaceCronJob> = Api::all(client.clone());
    let jobs: Api<ReclaimSpaceJob> = Api::all(client);
    let watch_cron_jobs = crate::custom_watch::watch(
        cron_jobs,
        "ReclaimSpaceCronJob",
        |cron_job: ReclaimSpaceCronJob, _| {
            queue.add((
                cron_job.namespace().unwrap_or_default(),
                cron_job.name_any(),
            ));
        },
    );
    // a job of a cron job that finishes or goes: its cron job's status and history change
    let watch_jobs =
        crate::custom_watch::watch(jobs, "ReclaimSpaceJob", |job: ReclaimSpaceJob, _| {
            if let Some(owner) = controller_of(&job.metadata, "ReclaimSpaceCronJob") {
                queue.add((job.namespace().unwrap_or_default(), owner.name.clone()));
            }
        });
    tokio::select! {
        () = async { tokio::join!(watch_cron_jobs, watch_jobs); } => {}
        () = worker => {}
    }
    queue.shut_down();
}

fn controller_of<'a>(meta: &'a ObjectMeta, kind: &str) -> Option<&'a OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
}

fn scheduled_at(job: &ReclaimSpaceJob) -> Option<DateTime<Utc>> {
    job.annotations()
        .get(ANN_SCHEDULED_AT)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn to_chrono(time: &Time) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(time.0.as_second(), 0)
}

fn to_time(time: DateTime<Utc>) -> Option<Time> {
    k8s_openapi::jiff::Timestamp::from_second(time.timestamp())
        .ok()
        .map(Time)
}

fn result_of(job: &ReclaimSpaceJob) -> Option<&str> {
    job.status.as_ref().and_then(|s| s.result.as_deref())
}

/// Writes the cron job's status from its jobs; returns its last schedule time.
async fn write_status(
    api: &Api<ReclaimSpaceCronJob>,
    namespace: &str,
    name: &str,
    jobs: &[ReclaimSpaceJob],
) -> Result<Option<DateTime<Utc>>, String> {
    let active = jobs.iter().find(|j| result_of(j).is_none());
    let last_schedule = jobs.iter().filter_map(scheduled_at).max();
    let last_success = jobs
        .iter()
        .filter(|j| result_of(j) == Some("Succeeded"))
        .filter_map(|j| {
            j.status
                .as_ref()?
                .completion_time
                .as_ref()
                .and_then(to_chrono)
        })
        .max();
    let status = json!({"status": {
        "active": active.map(|j| j.object_ref(&())),
        "lastScheduleTime": last_schedule.and_then(to_time),
        "lastSuccessfulTime": last_success.and_then(to_time),
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| {
            format!("updating the status of ReclaimSpaceCronJob {namespace}/{name}: {e}")
        })?;
    Ok(last_schedule)
}

/// One pass over a cron job; the delay until it is looked at again, if any.
async fn sync(context: &Context, namespace: &str, name: &str) -> Result<Option<Duration>, String> {
    let api: Api<ReclaimSpaceCronJob> = Api::namespaced(context.client.clone(), namespace);
    let Some(cron_job) = api
        .get_opt(name)
        .await
        .map_err(|e| format!("reading ReclaimSpaceCronJob {namespace}/{name}: {e}"))?
    else {
        return Ok(None);
    };
    if cron_job.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let uid = cron_job.metadata.uid.clone().unwrap_or_default();
    let jobs_api: Api<ReclaimSpaceJob> = Api::namespaced(context.client.clone(), namespace);
    let mut jobs: Vec<ReclaimSpaceJob> = jobs_api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing ReclaimSpaceJobs in {namespace}: {e}"))?
        .items
        .into_iter()
        .filter(|j| controller_of(&j.metadata, "ReclaimSpaceCronJob").is_some_and(|o| o.uid == uid))
        .collect();
    jobs.sort_by_key(|j| {
        j.status
            .as_ref()
            .and_then(|s| s.start_time.clone())
            .map(|t| t.0)
    });

    let active = jobs.iter().find(|j| result_of(j).is_none());
    let last_schedule = write_status(&api, namespace, name, &jobs).await?;

    prune_history(&jobs_api, &cron_job, &jobs).await;

    if cron_job.spec.suspend == Some(true) {
        return Ok(None);
    }
    let schedule = match Schedule::parse(&cron_job.spec.schedule) {
        Ok(schedule) => schedule,
        Err(problem) => {
            context.recorder.publish(
                &cron_job,
                EventType::Warning,
                "InvalidSchedule",
                &format!("spec.schedule: {problem}"),
            );
            return Ok(None);
        }
    };
    let now = Utc::now();
    let created = cron_job
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(to_chrono)
        .unwrap_or(now);
    let mut earliest = last_schedule.unwrap_or(created);
    if let Some(deadline) = cron_job.spec.starting_deadline_seconds {
        let floor = now - chrono::Duration::seconds(deadline.max(0));
        earliest = earliest.max(floor);
    }
    let (missed, next) = match schedule.missed(earliest, now) {
        Ok(found) => found,
        Err(problem) => {
            context.recorder.publish(
                &cron_job,
                EventType::Warning,
                "TooManyMissedTimes",
                &problem,
            );
            (None, schedule.next_after(now))
        }
    };
    let wait = next.map(|next| (next - now).to_std().unwrap_or_default() + Duration::from_secs(1));
    let Some(start) = missed else {
        return Ok(wait);
    };
    if let Some(active) = active {
        if cron_job.spec.concurrency_policy.as_deref() == Some("Replace") {
            jobs_api
                .delete(&active.name_any(), &DeleteParams::background())
                .await
                .map_err(|e| {
                    format!(
                        "deleting the active ReclaimSpaceJob {}: {e}",
                        active.name_any()
                    )
                })?;
        } else {
            tracing::info!(reclaimspacecronjob = %format!("{namespace}/{name}"), active = %active.name_any(), "a job is still running: this start time is skipped (concurrencyPolicy Forbid)");
            return Ok(wait);
        }
    }
    create_job(&jobs_api, &cron_job, start).await?;
    Ok(wait)
}

async fn create_job(
    api: &Api<ReclaimSpaceJob>,
    cron_job: &ReclaimSpaceCronJob,
    start: DateTime<Utc>,
) -> Result<(), String> {
    let template = &cron_job.spec.job_template;
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut annotations = template_meta.annotations.unwrap_or_default();
    annotations.insert(
        ANN_SCHEDULED_AT.to_owned(),
        start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    );
    let name = format!("{}-{}", cron_job.name_any(), start.timestamp());
    let job = ReclaimSpaceJob {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: cron_job.namespace(),
            labels: template_meta.labels,
            annotations: Some(annotations),
            owner_references: cron_job.controller_owner_ref(&()).map(|r| vec![r]),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    };
    match api.create(&PostParams::default(), &job).await {
        Ok(_) => {
            tracing::info!(reclaimspacejob = %name, "created ReclaimSpaceJob on schedule");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(format!("creating ReclaimSpaceJob {name}: {e}")),
    }
}

/// Deletes finished jobs beyond the history limits, oldest first (`jobs` sorted by start time).
async fn prune_history(
    api: &Api<ReclaimSpaceJob>,
    cron_job: &ReclaimSpaceCronJob,
    jobs: &[ReclaimSpaceJob],
) {
    let limits = [
        (
            "Succeeded",
            cron_job
                .spec
                .successful_jobs_history_limit
                .unwrap_or(DEFAULT_SUCCESSFUL_HISTORY),
        ),
        (
            "Failed",
            cron_job
                .spec
                .failed_jobs_history_limit
                .unwrap_or(DEFAULT_FAILED_HISTORY),
        ),
    ];
    for (result, limit) in limits {
        let finished: Vec<&ReclaimSpaceJob> = jobs
            .iter()
            .filter(|j| result_of(j) == Some(result))
            .collect();
        let excess = finished
            .len()
            .saturating_sub(usize::try_from(limit.max(0)).unwrap_or(0));
        for job in finished.into_iter().take(excess) {
            match api
                .delete(&job.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(reclaimspacejob = %job.name_any(), error = %e, "deleting a ReclaimSpaceJob beyond the history limit");
                }
            }
        }
    }
}
