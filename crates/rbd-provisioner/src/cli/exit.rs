//! How the process ends, whichever way it ends.
//!
//! Lease lost, SIGTERM/SIGINT, a fatal error, any subcommand: the same way out.
//!
//! Returning from `main` or calling `std::process::exit` runs `atexit` handlers and the C++
//! static destructors of libceph-common while Ceph's own threads (messenger, timers, librbd's
//! work queues) still use them: the process then dies of SIGABRT (`boost::bad_get`) or SIGSEGV
//! instead of exiting with its status, and Kubernetes reads a crash. So the end is always:
//! close the Ceph connections and wait, up to [`CEPH_SHUTDOWN_BOUND`], for in-flight librbd
//! calls and `rados_shutdown`s; flush what we wrote; then `_exit` with the intended status,
//! running no destructors, the way a Go program's `os.Exit` ends.

use std::io::Write;
use std::time::Duration;

/// How long the end waits for in-flight Ceph calls (a stuck OSD may hold one forever).
pub const CEPH_SHUTDOWN_BOUND: Duration = Duration::from_secs(5);

/// Ends the process with `code` (0 after a requested stop, 1 after a lost lease or an error).
pub fn exit(code: i32) -> ! {
    let report = ceph_rbd::shutdown(CEPH_SHUTDOWN_BOUND);
    if report.is_clean() {
        tracing::debug!(code, "Ceph connections closed; exiting");
    } else {
        tracing::warn!(
            code,
            calls_running = report.calls_running,
            handles_open = report.handles_open,
            bound = ?CEPH_SHUTDOWN_BOUND,
            "Ceph calls still running (Ceph slow or unreachable); exiting without waiting for them"
        );
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once and runs nothing; all we wrote is flushed above
    // (the log writer writes to stderr unbuffered).
    unsafe { libc::_exit(code) }
}
