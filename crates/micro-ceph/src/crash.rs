//! A report on stderr when a test process dies of a fatal signal: which signal, in which thread,
//! and that thread's stack (glibc's `backtrace`: librados and librbd frames by name, the test
//! binary's by offset). Ceph's client threads can crash a test binary in ways cargo only reports
//! as "signal: 11"; a CI log then shows where. After the report, the signal takes its course (the
//! handler that was there before, Rust's stack-overflow check included, or the default action).

use std::ffi::c_int;
use std::sync::OnceLock;

const SIGNALS: [c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGABRT,
    libc::SIGILL,
    libc::SIGFPE,
];
const FRAMES: usize = 64;

unsafe extern "C" {
    fn backtrace(buffer: *mut *mut libc::c_void, size: c_int) -> c_int;
    fn backtrace_symbols_fd(buffer: *const *mut libc::c_void, size: c_int, fd: c_int);
}

/// The actions in place before ours, restored before the signal is delivered again.
static PREVIOUS: OnceLock<Vec<(c_int, libc::sigaction)>> = OnceLock::new();

/// Installs the report for [`SIGNALS`] once per process.
pub(crate) fn install() {
    PREVIOUS.get_or_init(|| {
        // glibc's first backtrace loads libgcc_s (allocates): do it now, not in the handler
        let mut warm = [std::ptr::null_mut(); 2];
        // SAFETY: a valid buffer of the given length.
        unsafe { backtrace(warm.as_mut_ptr(), 2) };
        SIGNALS
            .iter()
            .filter_map(|&sig| {
                // SAFETY: zeroed sigaction structs are valid; a plain extern "C" handler with
                // SA_SIGINFO's signature; `old` receives the previous action.
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = report as *const () as usize;
                    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                    libc::sigemptyset(&mut action.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    (libc::sigaction(sig, &action, &mut old) == 0).then_some((sig, old))
                }
            })
            .collect()
    });
}

/// Writes `bytes` to stderr (async-signal-safe).
fn say(bytes: &[u8]) {
    // SAFETY: a valid buffer; write(2) is async-signal-safe.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

extern "C" fn report(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    say(b"\n=== micro-ceph test support: fatal signal ");
    say(signal_name(sig));
    say(b" in thread '");
    let mut name = [0u8; 32];
    // SAFETY: the calling thread; a buffer of the given length.
    if unsafe { libc::pthread_getname_np(libc::pthread_self(), name.as_mut_ptr().cast(), 32) } == 0
    {
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        say(&name[..end]);
    }
    say(b"'");
    if !info.is_null() && matches!(sig, libc::SIGSEGV | libc::SIGBUS) {
        say(b", address 0x");
        // SAFETY: the kernel's siginfo for this signal.
        let addr = unsafe { (*info).si_addr() } as usize;
        say(&hex(addr));
    }
    say(b"; its stack:\n");
    let mut frames = [std::ptr::null_mut(); FRAMES];
    // SAFETY: a valid buffer; backtrace was warmed up at install (no allocation here).
    unsafe {
        let n = backtrace(frames.as_mut_ptr(), FRAMES as c_int);
        backtrace_symbols_fd(frames.as_ptr(), n, 2);
    }
    say(b"=== end of the report\n");
    // Let the signal take its course: the earlier action (Rust's stack-overflow check for
    // SIGSEGV) or the default. A fault re-occurs on return; an abort or a raise is re-raised.
    if let Some(previous) = PREVIOUS.get() {
        for (s, old) in previous {
            if *s == sig {
                // SAFETY: restoring the action sigaction returned at install.
                unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
            }
        }
    }
    // SAFETY: a signal sent by a process (abort, kill, raise): send it again, now handled as
    // before; a fault (si_code > 0 from the kernel) re-occurs when the handler returns.
    unsafe {
        if info.is_null() || (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}

fn signal_name(sig: c_int) -> &'static [u8] {
    match sig {
        libc::SIGSEGV => b"SIGSEGV",
        libc::SIGBUS => b"SIGBUS",
        libc::SIGABRT => b"SIGABRT",
        libc::SIGILL => b"SIGILL",
        libc::SIGFPE => b"SIGFPE",
        _ => b"(another)",
    }
}

fn hex(mut n: usize) -> [u8; 16] {
    let mut out = [b'0'; 16];
    for slot in out.iter_mut().rev() {
        *slot = b"0123456789abcdef"[n & 0xf];
        n >>= 4;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Run only by the test below, in a child process.
    #[test]
    #[ignore = "crashes its process on purpose"]
    fn crash_here() {
        if std::env::var_os("MICRO_CEPH_CRASH_HERE").is_some() {
            install();
            std::thread::Builder::new()
                .name("doomed".into())
                .spawn(|| {
                    // SAFETY: none: a deliberate write through a null pointer.
                    unsafe { std::ptr::write_volatile(std::ptr::null_mut::<u8>(), 1) };
                })
                .unwrap()
                .join()
                .unwrap();
        }
    }

    #[test]
    fn a_fatal_signal_is_reported_with_its_thread_and_stack_and_still_kills() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "crash::tests::crash_here",
                "--nocapture",
            ])
            .env("MICRO_CEPH_CRASH_HERE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{stderr}");
        assert!(
            stderr.contains("fatal signal SIGSEGV in thread 'doomed', address 0x0000000000000000"),
            "{stderr}"
        );
        // frames follow, the C library's among them
        let report = &stderr[stderr.find("its stack:").unwrap()..];
        assert!(report.contains("libc.so"), "{report}");
        assert!(report.contains("=== end of the report"), "{report}");
    }

    #[test]
    fn addresses_are_written_as_sixteen_hex_digits() {
        assert_eq!(&hex(0xdead_beef), b"00000000deadbeef");
        assert_eq!(&hex(0), b"0000000000000000");
    }
}
