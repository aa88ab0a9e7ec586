//! Running the few node-side helper programs (`losetup`, `blkid`, `mkfs.*`, `rbd`, ...).
//!
//! Every call has a deadline and keeps the program's stderr for the error message, so a hung or
//! failing helper is visible instead of silent. Arguments never carry secrets (keys travel in
//! private files, see [`crate::mapper::secret_file`]), so they are safe to log and to put in errors.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Default deadline of one helper program.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_mins(2);

/// Why a helper program failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program could not be started (usually: not installed).
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// The program did not finish in time (it is killed).
    #[error("{command} did not finish within {timeout:?}")]
    Timeout { command: String, timeout: Duration },
    /// The program exited unsuccessfully.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        /// Exit code, when the program exited normally.
        code: Option<i32>,
        stderr: String,
    },
}

impl ExecError {
    /// The exit code of a program that ran and failed.
    #[must_use]
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Self::Failed { code, .. } => *code,
            _ => None,
        }
    }
}

/// Output of a successful run.
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program args...` with the default timeout.
///
/// # Errors
/// [`ExecError`] when the program cannot start, times out or exits non-zero.
pub async fn run(program: &str, args: &[&str]) -> Result<Output, ExecError> {
    run_with_timeout(program, args, DEFAULT_TIMEOUT).await
}

/// Runs `program args...`, killing it after `timeout`.
///
/// # Errors
/// [`ExecError`] when the program cannot start, times out or exits non-zero.
pub async fn run_with_timeout(
    program: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<Output, ExecError> {
    run_command(Command::new(program), program, args, timeout).await
}

/// Runs `command` (made for `program`, for instance with
/// [`crate::mapper::daemon::DaemonPlacement::command`]) with `args`, killing it after `timeout`.
///
/// # Errors
/// [`ExecError`] when the program cannot start, times out or exits non-zero.
pub async fn run_command(
    mut command: Command,
    program: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<Output, ExecError> {
    let description = describe(program, args);
    tracing::debug!(command = %description, "running helper");
    let child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ExecError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    let command = description;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(result) => result.map_err(|source| ExecError::Spawn {
            program: program.to_owned(),
            source,
        })?,
        Err(_) => return Err(ExecError::Timeout { command, timeout }),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    if output.status.success() {
        Ok(Output { stdout, stderr })
    } else {
        Err(ExecError::Failed {
            command,
            status: output.status.to_string(),
            code: output.status.code(),
            stderr: if stderr.is_empty() {
                stdout.trim().to_owned()
            } else {
                stderr
            },
        })
    }
}

/// `program arg1 arg2` for logs and errors.
#[must_use]
pub fn describe(program: &str, args: &[&str]) -> String {
    let mut s = program.to_owned();
    for arg in args {
        s.push(' ');
        s.push_str(arg);
    }
    s
}
