//! Fault injection for crash-consistency tests: `RBD_PROVISIONER_CRASH_AT=<step>` makes the
//! process abort (no cleanup, no unwinding, like a SIGKILL) the first time it reaches `<step>`.
//! Steps: `after-image-create`, `after-image-metadata`, `after-image-remove`, `after-image-resize`.

use std::sync::OnceLock;

fn configured() -> Option<&'static str> {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    AT.get_or_init(|| {
        std::env::var("RBD_PROVISIONER_CRASH_AT")
            .ok()
            .filter(|v| !v.is_empty())
    })
    .as_deref()
}

/// Aborts the process if the crash point `step` is configured.
pub fn hit(step: &str) {
    if configured() == Some(step) {
        eprintln!("crash point {step} reached: aborting (RBD_PROVISIONER_CRASH_AT)");
        std::process::abort();
    }
}
