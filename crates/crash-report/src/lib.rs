//! A report on stderr when the process dies of a fatal signal: which signal, in which thread, and
//! that thread's stack (glibc's `backtrace`: librados' and librbd's frames by name, the program's
//! own by offset, for `addr2line`). librados and librbd run threads of their own inside our
//! processes; when one of them crashes, the process would otherwise end with nothing but "signal:
//! 11" (a container restart, a test binary cargo reports as died). After the report, the signal
//! takes its course: the handler that was there before (Rust's stack-overflow check) or the
//! default action, so the exit status and any core dump are as without it.
//!
//! The report starts with `=== PROGRAM: fatal signal NAME in thread 'THREAD'` and ends with
//! `=== end of the report`.

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
/// The name the report starts with.
static PROGRAM: OnceLock<&'static str> = OnceLock::new();

/// Installs the report for SIGSEGV, SIGBUS, SIGABRT, SIGILL and SIGFPE, naming `program` in it.
/// Once per process: later calls change nothing.
pub fn install(program: &'static str) {
    PROGRAM.get_or_init(|| program);
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
    say(b"\n=== ");
    say(PROGRAM.get().map_or(&b"process"[..], |p| p.as_bytes()));
    say(b": fatal signal ");
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
    // Let the signal take its course. A fault (si_code > 0, from the kernel) re-occurs when the
    // handler returns, now met by the earlier action (Rust's stack-overflow check for SIGSEGV,
    // which falls back to the default). A signal sent by a process (abort, kill, raise) is sent
    // again with the default action: an earlier handler could take it as a harmless one (Rust's
    // returns, and the process would go on).
    let sent = info.is_null() || {
        // SAFETY: the kernel's siginfo for this signal.
        unsafe { (*info).si_code <= 0 }
    };
    if sent {
        // SAFETY: a zeroed sigaction is SIG_DFL with no flags; raise(3) is async-signal-safe.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &default, std::ptr::null_mut());
            libc::raise(sig);
        }
    } else if let Some((_, old)) = PREVIOUS
        .get()
        .and_then(|p| p.iter().find(|(s, _)| *s == sig))
    {
        // SAFETY: restoring the action sigaction returned at install.
        unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
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
        if std::env::var_os("CRASH_REPORT_CRASH_HERE").is_some() {
            install("crash-report test");
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
            .args(["--ignored", "--exact", "tests::crash_here", "--nocapture"])
            .env("CRASH_REPORT_CRASH_HERE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{stderr}");
        assert!(
            stderr.contains(
                "=== crash-report test: fatal signal SIGSEGV in thread 'doomed', \
                 address 0x0000000000000000"
            ),
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
