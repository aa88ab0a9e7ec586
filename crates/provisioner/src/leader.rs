//! Lease-based leader election (`coordination.k8s.io/v1` Lease), the client-go algorithm.
//!
//! # Flow
//!
//! 1. [`LeaderElector::acquire`] reads the Lease every `retry_period`. It takes the lease when
//!    nobody holds it, when it is ours, or when the holder has not renewed it for
//!    `leaseDurationSeconds` **as observed locally** (we time how long the record stayed
//!    unchanged on our own clock, so clock skew between instances does not matter).
//! 2. Every write is a compare-and-swap: a create (fails with 409 if someone was faster) or a
//!    replace carrying the `resourceVersion` we read (fails with 409 if the Lease changed).
//!    Two candidates therefore can never both believe they lead.
//! 3. The returned [`Leadership`] renews every `retry_period` in a background task. If no
//!    renewal succeeds for `renew_deadline`, or someone else holds the lease, leadership is
//!    lost: [`Leadership::lost`] resolves and the caller must stop all work at once (the
//!    binary exits).
//! 4. [`Leadership::release`] (graceful shutdown) clears the holder so a successor need not
//!    wait for the lease to expire.
//!
//! # Assumptions
//! `renew_deadline < lease_duration`, so a leader gives up before others may take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Lease name. Default: the provisioner name with `/` replaced by `-`.
    pub lease_name: String,
    /// Our identity in `holderIdentity` (unique per instance, e.g. the pod name).
    pub identity: String,
    /// How long a lease is valid without renewal. Default 15 s.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long gives up. Default 10 s.
    pub renew_deadline: Duration,
    /// Interval between acquisition and renewal attempts. Default 2 s.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// Defaults for `provisioner_name`, with the Lease in `namespace` held as `identity`.
    #[must_use]
    pub fn new(provisioner_name: &str, namespace: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            lease_name: lease_name_for(provisioner_name),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The Lease name for a provisioner: `/` becomes `-` (`ceph.com/rbd` -> `ceph.com-rbd`).
#[must_use]
pub fn lease_name_for(provisioner_name: &str) -> String {
    provisioner_name.replace('/', "-")
}

/// A timestamp truncated to microseconds, as Lease `MicroTime` fields are.
#[must_use]
pub fn micro_time_now() -> MicroTime {
    let now = Timestamp::now();
    let micros = now.as_microsecond();
    MicroTime(Timestamp::from_microsecond(micros).unwrap_or(now))
}

/// Leader election errors.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// Reading or writing the Lease failed with something other than a lost race.
    #[error("lease {lease}: {source}")]
    Api {
        /// Lease name.
        lease: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What we last saw of the Lease, and when (on our clock).
#[derive(Clone, Debug)]
struct Observed {
    resource_version: Option<String>,
    holder: Option<String>,
    lease_duration: Duration,
    since: Instant,
}

/// Result of one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempt {
    /// We hold the lease now.
    Leading,
    /// Someone else holds a valid lease.
    HeldByOther,
    /// We lost a compare-and-swap race; try again later.
    Conflict,
}

/// Runs leader election for one identity.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
}

impl LeaderElector {
    /// An elector using `client`.
    #[must_use]
    pub fn new(client: Client, config: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// Waits until we hold the lease, then keeps renewing it in the background.
    ///
    /// # Errors
    /// Never returns an error for API failures (they are retried every `retry_period`);
    /// the `Result` is for future use and for callers' `?`.
    pub async fn acquire(&self) -> Result<Leadership, LeaderError> {
        let mut observed = None;
        let renewed_at = loop {
            let started = Instant::now();
            match self.try_acquire_or_renew(&mut observed).await {
                Ok(Attempt::Leading) => break started,
                Ok(Attempt::HeldByOther | Attempt::Conflict) => {}
                Err(error) => {
                    tracing::warn!(lease = %self.config.lease_name, %error, "leader election attempt failed");
                }
            }
            tokio::time::sleep(jittered(self.config.retry_period)).await;
        };
        tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "became leader");
        let (lost_tx, lost_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(
            self.clone()
                .renew_loop(observed, renewed_at, lost_tx, stop_rx),
        );
        Ok(Leadership {
            lost: lost_rx,
            stop: Some(stop_tx),
            task: Some(task),
            elector: self.clone(),
        })
    }

    /// Renews every `retry_period` until stopped or lost.
    ///
    /// The renew deadline is one deadline, counted from the start of the last successful
    /// renewal (when the `renewTime` others judge us by was taken): whatever the API does, the
    /// lease is declared lost by then, so with `renew_deadline < lease_duration` this leader
    /// stops before any other instance may take over. An attempt still hanging at the deadline
    /// is abandoned (client-go's semantics).
    async fn renew_loop(
        self,
        mut observed: Option<Observed>,
        mut renewed_at: Instant,
        lost: watch::Sender<bool>,
        mut stop: oneshot::Receiver<()>,
    ) -> Option<Observed> {
        let lease = &self.config.lease_name;
        loop {
            let deadline = renewed_at + self.config.renew_deadline;
            let next = (Instant::now() + self.config.retry_period).min(deadline);
            tokio::select! {
                _ = &mut stop => return observed,
                () = tokio::time::sleep_until(next) => {}
            }
            let started = Instant::now();
            if started >= deadline {
                tracing::error!(%lease, "could not renew the lease within the renew deadline");
                break;
            }
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew(&mut observed)).await
            {
                Ok(Ok(Attempt::Leading)) => renewed_at = started,
                Ok(Ok(Attempt::HeldByOther)) => {
                    tracing::error!(%lease, "lease taken by another instance");
                    break;
                }
                Ok(Ok(Attempt::Conflict)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(%lease, %error, "lease renewal failed");
                }
                Err(_) => {
                    tracing::error!(%lease, "lease renewal still unanswered at the renew deadline");
                    break;
                }
            }
        }
        let _ = lost.send(true);
        None
    }

    /// One read-then-CAS round.
    async fn try_acquire_or_renew(
        &self,
        observed: &mut Option<Observed>,
    ) -> Result<Attempt, LeaderError> {
        let name = &self.config.lease_name;
        let now = micro_time_now();
        let Some(mut lease) = self
            .api
            .get_opt(name)
            .await
            .map_err(|source| self.api_error(source))?
        else {
            let lease = self.new_lease(now);
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    *observed = Some(self.observe(&created, None));
                    Ok(Attempt::Leading)
                }
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Conflict),
                Err(source) => Err(self.api_error(source)),
            };
        };
        let seen = self.observe(&lease, observed.take());
        *observed = Some(seen.clone());
        let ours = seen.holder.as_deref() == Some(self.config.identity.as_str());
        let vacant = seen.holder.as_deref().is_none_or(str::is_empty);
        let expired = seen.since.elapsed() >= seen.lease_duration;
        if !ours && !vacant && !expired {
            return Ok(Attempt::HeldByOther);
        }
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.config.identity.clone());
        spec.lease_duration_seconds = Some(duration_seconds(self.config.lease_duration));
        spec.renew_time = Some(now);
        // `lease` still carries the resourceVersion we read: the replace is a compare-and-swap.
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(updated) => {
                *observed = Some(self.observe(&updated, observed.take()));
                Ok(Attempt::Leading)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::Conflict),
            Err(source) => Err(self.api_error(source)),
        }
    }

    /// Clears the holder if we still hold the lease.
    async fn release(&self) -> Result<(), LeaderError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.config.lease_name)
            .await
            .map_err(|e| self.api_error(e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro_time_now());
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(source) => Err(self.api_error(source)),
        }
    }

    fn new_lease(&self, now: MicroTime) -> Lease {
        let mut lease = Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(self.config.identity.clone()),
                lease_duration_seconds: Some(duration_seconds(self.config.lease_duration)),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        lease.metadata.name = Some(self.config.lease_name.clone());
        lease.metadata.namespace = Some(self.config.namespace.clone());
        lease
    }

    /// Records `lease`, keeping the previous observation time if the record did not change.
    fn observe(&self, lease: &Lease, previous: Option<Observed>) -> Observed {
        let spec = lease.spec.clone().unwrap_or_default();
        let resource_version = lease.metadata.resource_version.clone();
        let since = match previous {
            Some(prev) if prev.resource_version == resource_version => prev.since,
            _ => Instant::now(),
        };
        Observed {
            resource_version,
            holder: spec.holder_identity,
            lease_duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.config.lease_duration, Duration::from_secs),
            since,
        }
    }

    fn api_error(&self, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            lease: self.config.lease_name.clone(),
            source,
        }
    }
}

/// Holding the lease. Dropping it stops renewing (without releasing).
pub struct Leadership {
    lost: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Option<Observed>>>,
    elector: LeaderElector,
}

impl Leadership {
    /// Resolves once the lease is lost (never, while renewals succeed).
    pub async fn lost(&mut self) {
        // An error means the renewal task ended without saying so: treat as lost.
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Whether we still hold the lease.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        !*self.lost.borrow()
    }

    /// Stops renewing and clears the holder so a successor can take over at once.
    ///
    /// # Errors
    /// If the Lease could not be read or written (the lease then simply expires).
    pub async fn release(mut self) -> Result<(), LeaderError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.elector.release().await
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn duration_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// `period` plus up to 20 % random jitter, so candidates do not move in lock-step.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + rand::random::<f64>() * 0.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_name_replaces_slashes() {
        assert_eq!(lease_name_for("ceph.com/rbd"), "ceph.com-rbd");
        assert_eq!(lease_name_for("a/b/c"), "a-b-c");
    }

    #[test]
    fn defaults_are_upstreams() {
        let config = LeaderElectionConfig::new("ceph.com/rbd", "kube-system", "pod-1");
        assert_eq!(config.lease_name, "ceph.com-rbd");
        assert_eq!(config.lease_duration, Duration::from_secs(15));
        assert_eq!(config.renew_deadline, Duration::from_secs(10));
        assert_eq!(config.retry_period, Duration::from_secs(2));
    }

    #[test]
    fn micro_time_serializes_with_exactly_six_fraction_digits() {
        for time in [
            micro_time_now(),
            MicroTime(Timestamp::UNIX_EPOCH),
            MicroTime(Timestamp::new(1_700_000_000, 123_456_789).unwrap()),
        ] {
            let text = serde_json::to_value(&time).unwrap();
            let text = text.as_str().unwrap();
            let fraction = text.split('.').nth(1).unwrap();
            assert_eq!(fraction.len(), 7, "{text}"); // 6 digits + 'Z'
            assert!(fraction.ends_with('Z'), "{text}");
        }
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..100 {
            let delay = jittered(Duration::from_secs(2));
            assert!(delay >= Duration::from_secs(2) && delay <= Duration::from_millis(2400));
        }
    }
}
