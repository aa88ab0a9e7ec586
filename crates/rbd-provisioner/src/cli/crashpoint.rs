//! Fault injection for crash-consistency tests: the process aborts at a named step.
//!
//! `RBD_PROVISIONER_CRASH_AT=<step>[:<n>]` makes the process abort (no cleanup, no unwinding,
//! like a SIGKILL) the `n`-th time (default: the first) it reaches `<step>`. A later hit of the
//! same step in the same process never aborts again.
//!
//! Steps: the volume core's (`rbd_volume::Step`, `rbd_volume::Hooks`), reached through the hooks
//! `backend/rbd.rs` passes to it:
//! - `after-image-create`: the image exists, its owner metadata does not, no PV yet;
//! - `after-image-owner-key`: once per key of the owner record, after the record was written
//!   (in one call on the image header, so the record is complete at each hit);
//! - `after-image-metadata`: image and owner record exist, the PV is not saved yet
//!   (the last moment before the library's PV save);
//! - `after-image-remove`: the image is gone, the PV (and its finalizer) still exist;
//! - `after-image-resize`: the image is larger, the PV capacity is not updated yet.
//!
//! the snapshot steps of the RBD backend's snapshots (`backend/snapshots.rs`, called by the
//! library's VolumeSnapshotContent controller) and of
//! restores and clones (`backend/rbd.rs`):
//! - `before-snapshot-create`: the content is annotated being-created, no Ceph snapshot yet;
//! - `after-snapshot-create`: the Ceph snapshot exists, the content's status is not written;
//! - `before-snapshot-delete`: the content is being deleted, its snapshot still exists;
//! - `after-snapshot-delete`: the Ceph snapshot is gone, the content still has its status and
//!   finalizer;
//! - `after-volume-clone`: a restored or cloned image exists, the source's protection
//!   finalizer is still on and no PV is saved;
//!
//! the Ceph layer's steps between the RADOS writes it makes without librbd (`ceph_rbd::steps`,
//! installed by [`install_ceph_steps`]): `ceph-create-after-header`, `ceph-clone-after-header`,
//! `ceph-clone-after-parent-attach`, `ceph-clone-after-child-attach`, `ceph-snapshot-locked`,
//! `ceph-snapshot-unlocked`;
//!
//! and the provisioning library's steps (`provisioner::Config::step_hook`): `before-pv-save`,
//! `after-pv-save`, `before-pv-delete`, `after-pv-delete`, `before-pv-resize`, `after-pv-resize`,
//! `before-modify` (the claim's modification is `InProgress`, the backend not called) and
//! `after-modify` (the image has the class's limits, the PV and claim do not name it yet).
//!
//! Unset or empty: every `hit` is a relaxed atomic load of an initialised `OnceLock`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct CrashAt {
    step: String,
    nth: u64,
    hits: AtomicU64,
}

/// Parses `<step>[:<n>]`; `n` must be a positive integer (else the whole value names the step,
/// which then never matches a real step: a typo must not crash a production process).
fn parse(value: &str) -> Option<(String, u64)> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    match value.rsplit_once(':') {
        Some((step, n)) => match n.parse::<u64>() {
            Ok(n) if n > 0 => Some((step.to_string(), n)),
            _ => Some((value.to_string(), 1)),
        },
        None => Some((value.to_string(), 1)),
    }
}

fn configured() -> Option<&'static CrashAt> {
    static AT: OnceLock<Option<CrashAt>> = OnceLock::new();
    AT.get_or_init(|| {
        let (step, nth) = parse(&std::env::var("RBD_PROVISIONER_CRASH_AT").ok()?)?;
        Some(CrashAt {
            step,
            nth,
            hits: AtomicU64::new(0),
        })
    })
    .as_ref()
}

/// Makes the Ceph layer's steps (`ceph_rbd::steps`: between the RADOS writes of a create,
/// clone or snapshot made without librbd) crash points too, when a crash point is configured.
pub fn install_ceph_steps() {
    static INSTALLED: OnceLock<ceph_rbd::steps::Installed> = OnceLock::new();
    if configured().is_some() {
        INSTALLED
            .get_or_init(|| ceph_rbd::steps::install(std::sync::Arc::new(|step, _| hit(step))));
    }
}

/// Aborts the process if the crash point `step` is configured and this is its `n`-th hit.
pub fn hit(step: &str) {
    let Some(at) = configured() else {
        return;
    };
    if at.step != step {
        return;
    }
    let hits = at.hits.fetch_add(1, Ordering::SeqCst) + 1;
    if hits == at.nth {
        eprintln!("crash point {step} reached (hit {hits}): aborting (RBD_PROVISIONER_CRASH_AT)");
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn step_and_optional_hit_number() {
        assert_eq!(
            parse("after-image-create"),
            Some(("after-image-create".into(), 1))
        );
        assert_eq!(
            parse("after-image-remove:3"),
            Some(("after-image-remove".into(), 3))
        );
        assert_eq!(parse(" "), None);
        // not a positive number: the value stays one (unknown) step name
        assert_eq!(parse("x:0"), Some(("x:0".into(), 1)));
        assert_eq!(parse("x:y"), Some(("x:y".into(), 1)));
    }
}
