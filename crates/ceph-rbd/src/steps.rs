//! Named points between the RADOS writes of the operations made without librbd, for fault
//! injection: the binary turns them into its crash points (`RBD_PROVISIONER_CRASH_AT`), tests
//! into a crash (a panic in the call, which skips every undo, as a killed process would) or a
//! pause. Without a hook installed, [`hit`] is one relaxed atomic load.
//!
//! | step | what exists when it is reached |
//! | --- | --- |
//! | [`CREATE_AFTER_HEADER`] | a plain image's directory entry, ID object and header; no object map yet |
//! | [`CLONE_AFTER_HEADER`] | a clone's header (and object map); no parent yet |
//! | [`CLONE_AFTER_PARENT_ATTACH`] | the clone's parent recorded; the parent snapshot does not count it as a child |
//! | [`CLONE_AFTER_CHILD_ATTACH`] | the clone listed as a child; the parent's metadata not copied yet |
//! | [`CLONE_V1_MADE`] | a clone v1 made by librbd (clone format 1): its parent snapshot protected, the clone whole |
//! | [`SNAPSHOT_LOCKED`] | a source's exclusive lock held for its temporary snapshot; no snapshot yet |
//! | [`SNAPSHOT_UNLOCKED`] | that snapshot taken, its watchers told, the lock released |
//! | [`REMOVE_PROBED`] | a plain image to remove: its exclusive lock held (with exclusive-lock), nobody else watching; nothing removed |
//! | [`REMOVE_AFTER_DATA`] | its data objects removed; header, object map, ID object and directory entry left |
//! | [`REMOVE_AFTER_HEADER`] | its header removed; object map, ID object and directory entry left (a partial image) |

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// [`crate::Cluster::create_image`] of a plain image, after its header.
pub const CREATE_AFTER_HEADER: &str = "ceph-create-after-header";
/// A clone made without librbd, after its header.
pub const CLONE_AFTER_HEADER: &str = "ceph-clone-after-header";
/// A clone made without librbd, after `parent_attach` on its header.
pub const CLONE_AFTER_PARENT_ATTACH: &str = "ceph-clone-after-parent-attach";
/// A clone made without librbd, after `child_attach` on its parent's header.
pub const CLONE_AFTER_CHILD_ATTACH: &str = "ceph-clone-after-child-attach";
/// A clone v1 made by librbd ([`crate::CloneFormat::V1`]): its parent snapshot protected.
pub const CLONE_V1_MADE: &str = "ceph-clone-v1-made";
/// A source's temporary snapshot taken without librbd: its exclusive lock is held and the
/// watchers were checked again under it; the snapshot is not written yet.
pub const SNAPSHOT_LOCKED: &str = "ceph-snapshot-locked";
/// That snapshot taken (or not: an error), the watchers told, the lock released.
pub const SNAPSHOT_UNLOCKED: &str = "ceph-snapshot-unlocked";

/// A plain removal without librbd: locked and probed, nothing removed yet.
pub const REMOVE_PROBED: &str = "ceph-remove-probed";
/// A plain removal without librbd, after the data objects.
pub const REMOVE_AFTER_DATA: &str = "ceph-remove-after-data";
/// A plain removal without librbd, after the header.
pub const REMOVE_AFTER_HEADER: &str = "ceph-remove-after-header";

/// Every step, for documentation and for checking a configured step name.
pub const ALL: [&str; 10] = [
    CREATE_AFTER_HEADER,
    CLONE_AFTER_HEADER,
    CLONE_AFTER_PARENT_ATTACH,
    CLONE_AFTER_CHILD_ATTACH,
    CLONE_V1_MADE,
    SNAPSHOT_LOCKED,
    SNAPSHOT_UNLOCKED,
    REMOVE_PROBED,
    REMOVE_AFTER_DATA,
    REMOVE_AFTER_HEADER,
];

/// A hook: called with the step and the image it is reached for (`pool/image`).
pub type Hook = Arc<dyn Fn(&'static str, &str) + Send + Sync>;

static ANY: AtomicBool = AtomicBool::new(false);
static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());
static NEXT: Mutex<u64> = Mutex::new(0);

/// Removes its hook when dropped.
#[must_use = "the hook is removed when this is dropped"]
pub struct Installed(u64);

impl Drop for Installed {
    fn drop(&mut self) {
        let mut hooks = HOOKS.lock().unwrap_or_else(PoisonError::into_inner);
        hooks.retain(|(id, _)| *id != self.0);
        ANY.store(!hooks.is_empty(), Ordering::Relaxed);
    }
}

/// Installs `hook`, called at every step (on the blocking thread making the Ceph calls) until
/// the returned guard is dropped. Several may be installed (tests running side by side each
/// filter by their own image).
pub fn install(hook: Hook) -> Installed {
    let id = {
        let mut next = NEXT.lock().unwrap_or_else(PoisonError::into_inner);
        *next += 1;
        *next
    };
    let mut hooks = HOOKS.lock().unwrap_or_else(PoisonError::into_inner);
    hooks.push((id, hook));
    ANY.store(true, Ordering::Relaxed);
    Installed(id)
}

/// Reached `step` for `target` (`pool/image`).
pub(crate) fn hit(step: &'static str, target: &str) {
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    // called outside the lock: a hook may block (a pause) or panic (a crash)
    let hooks: Vec<Hook> = HOOKS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(_, hook)| Arc::clone(hook))
        .collect();
    for hook in hooks {
        hook(step, target);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn installed_hooks_see_every_step_until_dropped() {
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&seen);
        let guard = install(Arc::new(move |step, target| {
            if target == "steps-test/image" {
                assert!(ALL.contains(&step));
                counter.fetch_add(1, Ordering::SeqCst);
            }
        }));
        hit(CLONE_AFTER_HEADER, "steps-test/image");
        hit(CLONE_AFTER_HEADER, "other/image");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        drop(guard);
        hit(CLONE_AFTER_HEADER, "steps-test/image");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }
}
