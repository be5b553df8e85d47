//! One extractor run: the configured program started directly (no shell) with the page URL as its
//! last argument, a cleared environment, a deadline and a cap on what it may print; killed when
//! either is passed or the request goes away.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// Why a run gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the extractor could not be started: {0}")]
    Spawn(std::io::Error),
    #[error("the extractor gave no answer within {0} s")]
    Timeout(u64),
    #[error("the extractor printed more than {0} bytes")]
    TooMuch(usize),
    #[error("the extractor failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
}

/// What the program is given.
pub struct Invocation<'a> {
    pub argv: &'a [String],
    pub page: &'a str,
    pub host: &'a str,
    pub extra_params: &'a str,
    pub timeout: Duration,
    pub max_output: usize,
}

/// Bytes of the program's standard error kept for the error message.
const STDERR_KEPT: usize = 2048;

/// Kills a run's whole process group unless the run was waited for.
struct Group(Option<i32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            // SAFETY: kill(2) with a negative pid signals that process group; no memory is touched.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

/// Runs the program and returns what it printed on standard output.
pub async fn run(inv: Invocation<'_>) -> Result<Vec<u8>, RunError> {
    let (program, args) = inv
        .argv
        .split_first()
        .ok_or_else(|| RunError::Spawn(std::io::Error::other("empty command")))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .arg(inv.page)
        // Nothing of sluice's environment (its password among it) reaches the program.
        .env_clear()
        .env("SLUICE_EXTRACTOR_HOST", inv.host)
        .env("SLUICE_EXTRACTOR_URL", inv.page)
        .env("SLUICE_EXTRA_PARAMS", inv.extra_params)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout kills what it started too (a shell's children).
        .process_group(0)
        .kill_on_drop(true);
    for key in ["PATH", "HOME", "LANG", "TMPDIR"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    let mut child = cmd.spawn().map_err(RunError::Spawn)?;
    let mut group = Group(child.id().and_then(|id| i32::try_from(id).ok()));
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let secs = inv.timeout.as_secs();
    let work = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            let mut buf = [0u8; 16 * 1024];
            loop {
                let n = stdout.read(&mut buf).await.map_err(RunError::Spawn)?;
                if n == 0 {
                    return Ok(());
                }
                if out.len() + n > inv.max_output {
                    return Err(RunError::TooMuch(inv.max_output));
                }
                out.extend_from_slice(&buf[..n]);
            }
        };
        let read_err = async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                err.extend_from_slice(&buf[..n]);
                if err.len() > STDERR_KEPT {
                    err.drain(..err.len() - STDERR_KEPT);
                }
            }
        };
        // Too much output ends the run at once, whatever standard error is doing.
        tokio::try_join!(read_out, async {
            read_err.await;
            Ok(())
        })?;
        let status = child.wait().await.map_err(RunError::Spawn)?;
        group.0 = None;
        if !status.success() {
            return Err(RunError::Failed {
                status: status.to_string(),
                stderr: String::from_utf8_lossy(&err).trim().to_string(),
            });
        }
        Ok(out)
    };
    // On timeout or too much output the future is dropped, and with it the child (killed).
    tokio::time::timeout(inv.timeout, work)
        .await
        .map_err(|_| RunError::Timeout(secs))?
}
