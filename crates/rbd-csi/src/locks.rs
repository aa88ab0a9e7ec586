//! Per-volume operation locks.
//!
//! The CSI specification recommends that a plugin receiving a call for a volume that already has
//! an operation in flight answer `ABORTED` ("operation pending for volume") and let the CO retry,
//! rather than queueing. [`VolumeLocks::try_lock`] does exactly that; calls on other volumes are
//! never blocked.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The set of volumes with an operation in flight.
#[derive(Debug, Clone, Default)]
pub struct VolumeLocks {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation on one volume runs; releases the volume on drop.
#[derive(Debug)]
pub struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    volume_id: String,
}

impl VolumeLocks {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Claims `volume_id`, or `None` when another operation holds it.
    #[must_use]
    pub fn try_lock(&self, volume_id: &str) -> Option<VolumeGuard> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        busy.insert(volume_id.to_owned()).then(|| VolumeGuard {
            busy: Arc::clone(&self.busy),
            volume_id: volume_id.to_owned(),
        })
    }

    /// Claims `volume_id` or returns the spec's `ABORTED` status.
    ///
    /// # Errors
    /// `ABORTED` when an operation on the volume is already in flight.
    pub fn lock_or_abort(&self, volume_id: &str) -> Result<VolumeGuard, tonic::Status> {
        self.try_lock(volume_id).ok_or_else(|| {
            tonic::Status::aborted(format!(
                "an operation for volume {volume_id} is already pending"
            ))
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.volume_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_same_volume_fails_until_first_is_dropped() {
        let locks = VolumeLocks::new();
        let first = locks.try_lock("a").unwrap();
        assert!(locks.try_lock("a").is_none());
        assert!(
            locks.try_lock("b").is_some(),
            "other volumes are not blocked"
        );
        assert_eq!(
            locks.lock_or_abort("a").unwrap_err().code(),
            tonic::Code::Aborted
        );
        drop(first);
        assert!(locks.try_lock("a").is_some());
    }
}
