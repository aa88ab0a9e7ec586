//! The one switch that sends every image operation through librbd: no create, clone, snapshot
//! or removal made with RADOS calls ([`crate::create`], [`crate::plain_clone`],
//! [`crate::first_snapshot`], [`crate::remove`]), for an operator who would rather pay librbd's
//! cost than trust them (a Ceph release that changes an on-disk detail those writes know).
//! Image metadata is still written through the `rbd` object class's `metadata_set` on the
//! header, the call librbd itself makes, and read the same way.
//!
//! Set by [`set_librbd_only`] (the binary's `--librbd-only`) or by the environment variable
//! `RBD_LIBRBD_ONLY=true` (or `1`), read once; either turns it on.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

static SET: AtomicBool = AtomicBool::new(false);

/// The environment variable that turns the switch on for a whole process (tests included).
pub const ENV: &str = "RBD_LIBRBD_ONLY";

fn from_env() -> bool {
    static ENV_ON: OnceLock<bool> = OnceLock::new();
    *ENV_ON.get_or_init(|| {
        std::env::var(ENV)
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
    })
}

/// Sends every image operation of this process through librbd from now on (`true`), or lets
/// plain images take the RADOS-level paths (`false`, the default; [`ENV`] still turns it on).
pub fn set_librbd_only(on: bool) {
    SET.store(on, Ordering::Relaxed);
}

/// Whether every image operation goes through librbd.
#[must_use]
pub fn librbd_only() -> bool {
    SET.load(Ordering::Relaxed) || from_env()
}

/// Why an operation is left to librbd when the switch is on.
pub(crate) const WHY: &str = "every operation goes through librbd (--librbd-only)";
