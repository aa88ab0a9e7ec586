//! Process-wide accounting of Ceph work, for an orderly end of the process.
//!
//! librados and librbd run threads of their own (messenger, timers, librbd's work queues) that
//! keep using libceph-common's static objects. A process that returns from `main` or calls
//! `exit` runs C++ static destructors and `atexit` handlers while those threads still run, and
//! may die of SIGABRT or SIGSEGV instead of exiting with its status. Hence:
//!
//! * every blocking librados/librbd call is counted while it runs ([`busy_calls`]), also after
//!   the async caller stopped waiting for it;
//! * cluster handles are shut down (`rados_shutdown`, which joins Ceph's threads and may block)
//!   on one dedicated thread, never on an async worker or under a lock;
//! * [`shutdown`] closes every pooled connection and waits, up to a bound, until no call runs
//!   and every handle is shut down. Whatever it reports, the process should then end with
//!   `_exit` (no destructors), as a Go program's `os.Exit` does.
//! * a program that ends without that (returns from `main`, calls `exit`: every test binary)
//!   still gets the wait: the first `rados_connect` of the process, once it returns,
//!   registers an `atexit` handler that runs [`shutdown`] with [`AT_EXIT_BOUND`]. Handlers
//!   run in reverse order of registration, so it runs before libceph-common's static
//!   destructors (registered when the libraries were loaded) and before OpenSSL's cleanup
//!   (registered when the first connection initialised it). Registered earlier, OpenSSL's
//!   cleanup ran first and the messenger threads of the handles dropped last died in it
//!   (SIGSEGV in `EVP_CipherInit_ex`, every run of a test that dropped connections as it
//!   ended); without any handler, libceph-common's destructors ran under those threads
//!   (SIGABRT or SIGSEGV: `tests/exit.rs`).

use std::sync::mpsc;
use std::sync::{Condvar, Mutex, Once, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Counters guarded by one mutex, so waiters can sleep on [`changed`].
#[derive(Default)]
struct Counts {
    /// Blocking Ceph calls running now.
    calls: usize,
    /// Cluster handles handed to the reaper and not yet shut down.
    closing: usize,
    /// A `rados_shutdown` is running: calls wait before entering librados ([`Call::enter`]).
    shutting_down: bool,
}

fn counts() -> &'static (Mutex<Counts>, Condvar) {
    static COUNTS: OnceLock<(Mutex<Counts>, Condvar)> = OnceLock::new();
    COUNTS.get_or_init(Default::default)
}

fn update(f: impl FnOnce(&mut Counts)) {
    let (lock, changed) = counts();
    let mut c = lock.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut c);
    changed.notify_all();
}

/// Marks one blocking Ceph call as running until dropped.
pub(crate) struct Call(());

impl Call {
    pub(crate) fn start() -> Call {
        update(|c| c.calls += 1);
        Call(())
    }

    /// Waits, on the blocking thread about to call into librados/librbd, while a cluster handle
    /// is being shut down (at most [`QUIET_BOUND`]).
    pub(crate) fn enter(&self) {
        let (lock, changed) = counts();
        let c = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = changed
            .wait_timeout_while(c, QUIET_BOUND, |c| c.shutting_down)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// How long a `rados_shutdown` waits for the process's running Ceph calls to return, and a call
/// for a running `rados_shutdown`, before going ahead anyway (a call stuck on an unreachable OSD
/// must not stop every other).
///
/// Why they wait at all: a `rados_shutdown` frees what librados's own threads of that handle
/// may still touch, and librados can crash a process in those threads (SIGABRT with
/// `std::system_error` "Invalid argument" or "Owner died" in an `io_context_pool` thread:
/// RELIABILITY.md, bug 37, open and rare). Shutting a handle down while no call runs keeps
/// that window as small as we can make it.
pub const QUIET_BOUND: Duration = Duration::from_secs(10);

/// Runs `close` (a `rados_shutdown`) when no Ceph call runs in the process (or
/// [`QUIET_BOUND`] passed), with calls held back from entering librados meanwhile.
fn shut_down_quietly(close: Closer) {
    let (lock, changed) = counts();
    {
        let c = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let mut c = changed
            .wait_timeout_while(c, QUIET_BOUND, |c| c.calls > 0)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
        c.shutting_down = true;
    }
    close();
    update(|c| {
        c.shutting_down = false;
        c.closing = c.closing.saturating_sub(1);
    });
}

impl Drop for Call {
    fn drop(&mut self) {
        update(|c| c.calls = c.calls.saturating_sub(1));
    }
}

/// Blocking librados/librbd calls running in this process now (including ones whose caller
/// gave up waiting at its deadline).
#[must_use]
pub fn busy_calls() -> usize {
    let (lock, _) = counts();
    lock.lock().unwrap_or_else(PoisonError::into_inner).calls
}

/// How long the `atexit` handler waits for running calls and closing handles.
pub const AT_EXIT_BOUND: Duration = Duration::from_secs(10);

/// Registers, once per process, the `atexit` handler that runs [`shutdown`]; called after a
/// `rados_connect` returned, so that it runs before the exit handlers Ceph's libraries
/// registered while connecting (the module's text says why).
pub(crate) fn shutdown_at_exit() {
    static REGISTERED: Once = Once::new();
    extern "C" fn at_exit() {
        // nothing to report to: the process is ending with the status it chose
        let _ = shutdown(AT_EXIT_BOUND);
    }
    REGISTERED.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured state; it does not
        // unwind (`shutdown` recovers poisoned locks instead of panicking).
        unsafe { libc::atexit(at_exit) };
    });
}

/// A handle to shut down, sent to the reaper thread.
pub(crate) type Closer = Box<dyn FnOnce() + Send>;

/// Hands `close` (a `rados_shutdown`) to the reaper thread; runs it inline if the thread cannot
/// be started.
pub(crate) fn close_later(close: Closer) {
    static REAPER: OnceLock<Option<Mutex<mpsc::Sender<Closer>>>> = OnceLock::new();
    let reaper = REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Closer>();
        std::thread::Builder::new()
            .name("rados-reaper".into())
            .spawn(move || {
                for close in rx {
                    shut_down_quietly(close);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    update(|c| c.closing += 1);
    let close = match reaper {
        Some(tx) => match tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(close)
        {
            Ok(()) => return,
            Err(mpsc::SendError(close)) => close,
        },
        None => close,
    };
    shut_down_quietly(close);
}

/// Pools to close at shutdown (weakly held: a dropped pool just disappears).
pub(crate) fn register_pool(pool: std::sync::Weak<crate::pool::Inner>) {
    let mut pools = pools().lock().unwrap_or_else(PoisonError::into_inner);
    pools.retain(|p| p.strong_count() > 0);
    pools.push(pool);
}

fn pools() -> &'static Mutex<Vec<std::sync::Weak<crate::pool::Inner>>> {
    static POOLS: OnceLock<Mutex<Vec<std::sync::Weak<crate::pool::Inner>>>> = OnceLock::new();
    POOLS.get_or_init(Default::default)
}

/// What [`shutdown`] achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Blocking calls still running at the bound (stuck on an unreachable OSD or monitor).
    pub calls_running: usize,
    /// Cluster handles whose `rados_shutdown` had not returned at the bound.
    pub handles_open: usize,
}

impl ShutdownReport {
    /// Every call returned and every handle was shut down.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.calls_running == 0 && self.handles_open == 0
    }
}

/// Closes every pooled connection and waits up to `bound` for running calls to return and for
/// every cluster handle to be shut down. Blocking: call it outside async code (e.g. after the
/// runtime's `block_on` returned), then end the process with `_exit`.
///
/// Connections a caller still holds are shut down when the caller drops them; a call stuck at
/// the bound is left running (the report says how many).
pub fn shutdown(bound: Duration) -> ShutdownReport {
    let pools: Vec<_> = pools()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain(..)
        .filter_map(|p| p.upgrade())
        .collect();
    for pool in pools {
        pool.close_all();
    }
    let end = Instant::now() + bound;
    let (lock, changed) = counts();
    let mut c = lock.lock().unwrap_or_else(PoisonError::into_inner);
    while c.calls > 0 || c.closing > 0 {
        let now = Instant::now();
        if now >= end {
            break;
        }
        c = changed
            .wait_timeout(c, end - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    ShutdownReport {
        calls_running: c.calls,
        handles_open: c.closing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_waits_for_running_calls_and_closing_handles() {
        let call = Call::start();
        let (tx, rx) = mpsc::channel::<()>();
        close_later(Box::new(move || {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }));
        // both still busy: the bound is reached
        let report = shutdown(Duration::from_millis(50));
        assert!(
            report.calls_running >= 1 && report.handles_open >= 1,
            "{report:?}"
        );
        drop(call);
        let _ = tx.send(());
        let report = shutdown(Duration::from_secs(10));
        assert!(report.is_clean(), "{report:?}");
    }
}
