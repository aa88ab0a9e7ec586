//! Controller configuration; every default is documented next to its field.

use std::time::Duration;

use crate::queue::Backoff;

/// Configuration of a [`crate::Controller`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The provisioner name claims and classes refer to (e.g. `ceph.com/rbd`). Required.
    pub provisioner_name: String,
    /// Further names we answer to (e.g. an old name during a migration). Default: none.
    pub additional_provisioner_names: Vec<String>,
    /// This instance's identity (leader election holder, event `reportingInstance`).
    /// Default: the provisioner name.
    pub identity: String,
    /// Concurrent workers. Default 16: operations are I/O-bound (API writes and backend calls),
    /// so more workers than cores pay off, and 16 keeps a busy API server (or Ceph cluster)
    /// from being flooded. Upstream's 4 is one reason bulk provisioning is slow there.
    pub workers: usize,
    /// Per-key retry backoff. Default 1 s doubling up to 5 min.
    pub backoff: Backoff,
    /// Every key is re-examined this often even without a change. Default 15 min.
    pub resync_period: Duration,
    /// Give up on a claim after this many failed attempts (until it changes). Default `None`:
    /// retry forever, with a Warning event saying it is still failing and why.
    pub failure_threshold: Option<u32>,
    /// Attempts to save a provisioned PV before the backend volume is deleted again. Default 5.
    pub volume_save_attempts: u32,
    /// Delay between PV save attempts (doubling each time). Default 1 s.
    pub volume_save_interval: Duration,
    /// Put `external-provisioner.volume.kubernetes.io/finalizer` on PVs so a PV cannot disappear
    /// before its backend volume is deleted. Default `false` (as upstream).
    pub add_finalizer: bool,
    /// How long graceful shutdown waits for in-flight operations. Default 30 s.
    pub shutdown_grace_period: Duration,
    /// Keep a released PV's volume while a VolumeAttachment (`storage.k8s.io/v1`, any attacher)
    /// names the PV, as external-provisioner does: a `VolumeFailedDelete` Warning says which
    /// node it waits for, and the deletion runs once the last one is gone. Needs `list` and
    /// `watch` on `volumeattachments`. Default `true`.
    pub wait_for_detach: bool,
    /// Called with the name of each step the controller reaches, for fault-injection tests
    /// (crash-consistency tests abort the process in it). Steps: `before-pv-save`,
    /// `after-pv-save`, `before-pv-delete`, `after-pv-delete`, `before-pv-resize` (the backend
    /// grew the volume, the PV is not updated yet), `after-pv-resize` (PV updated, claim status
    /// not yet), `before-modify` (the claim's modification marked `InProgress`, the backend not
    /// called), `after-modify` (the backend applied the class, the PV and claim not updated yet).
    /// Default: none.
    pub step_hook: Option<fn(&str)>,
}

impl Config {
    /// A configuration with every default and the given provisioner name.
    #[must_use]
    pub fn new(provisioner_name: impl Into<String>) -> Self {
        let provisioner_name = provisioner_name.into();
        Self {
            identity: provisioner_name.clone(),
            provisioner_name,
            additional_provisioner_names: Vec::new(),
            workers: 16,
            backoff: Backoff::default(),
            resync_period: Duration::from_mins(15),
            failure_threshold: None,
            volume_save_attempts: 5,
            volume_save_interval: Duration::from_secs(1),
            add_finalizer: false,
            shutdown_grace_period: Duration::from_secs(30),
            wait_for_detach: true,
            step_hook: None,
        }
    }

    /// Reports reaching `step` to the [`Config::step_hook`], if any.
    pub(crate) fn step(&self, step: &str) {
        if let Some(hook) = self.step_hook {
            hook(step);
        }
    }

    /// The provisioner name followed by the additional names.
    #[must_use]
    pub fn all_names(&self) -> Vec<String> {
        std::iter::once(self.provisioner_name.clone())
            .chain(self.additional_provisioner_names.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_retry_forever_with_documented_values() {
        let config = Config::new("ceph.com/rbd");
        assert_eq!(config.identity, "ceph.com/rbd");
        assert_eq!(config.workers, 16);
        assert_eq!(config.failure_threshold, None);
        assert_eq!(config.backoff.base_delay, Duration::from_secs(1));
        assert_eq!(config.backoff.max_delay, Duration::from_mins(5));
        assert_eq!(config.resync_period, Duration::from_mins(15));
    }

    #[test]
    fn steps_reach_the_hook() {
        static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        fn hook(step: &str) {
            SEEN.lock().unwrap().push(step.to_owned());
        }
        let mut config = Config::new("a/b");
        config.step("ignored without a hook");
        config.step_hook = Some(hook);
        config.step("before-pv-save");
        assert_eq!(*SEEN.lock().unwrap(), vec!["before-pv-save".to_owned()]);
    }

    #[test]
    fn all_names_starts_with_the_main_name() {
        let mut config = Config::new("a/b");
        config.additional_provisioner_names = vec!["c/d".to_owned()];
        assert_eq!(config.all_names(), vec!["a/b".to_owned(), "c/d".to_owned()]);
    }
}
