//! Helper processes for idle mode: each holds part of the idle connections, so that no client
//! process needs more descriptors than its open-file limit (a container without
//! `CAP_SYS_RESOURCE` cannot raise the hard limit, and the server under test needs one
//! descriptor per connection as well). A helper is this program run again with `--worker`; the
//! measuring process sends it one command per line on its stdin and reads one answer line per
//! command from its stdout.
//!
//! Commands: `open N` (open connections until N were attempted, then answer) and `count`
//! (answer at once). The answer is `attempted open failed stopped`, `stopped` being 1 when the
//! helper's time budget ran out. End of input closes every connection and ends the helper, so a
//! helper never outlives the process that drives it.

use crate::idle::{self, Config, Holder};
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the helpers hold between them.
#[derive(Debug, Default)]
pub struct Counts {
    pub attempted: usize,
    pub open: u64,
    pub failed: u64,
    /// A helper stopped opening because its time budget ran out.
    pub stopped: bool,
}

struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// The helpers of one idle run; the measuring process itself is share 0.
#[derive(Default)]
pub struct Workers {
    list: Vec<Worker>,
}

impl Workers {
    /// Starts `n` helpers: this program with `args` (the measuring process's own arguments)
    /// and `--worker`.
    pub fn spawn(n: usize, args: &[String]) -> Result<Self> {
        let exe = std::env::current_exe().context("own path")?;
        let mut list = Vec::with_capacity(n);
        for _ in 0..n {
            let mut child = Command::new(&exe)
                .args(args)
                .arg("--worker")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("starting an idle helper")?;
            let stdin = child.stdin.take().context("helper stdin")?;
            let stdout = BufReader::new(child.stdout.take().context("helper stdout")?);
            list.push(Worker {
                child,
                stdin: Some(stdin),
                stdout,
            });
        }
        Ok(Workers { list })
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    fn send(&mut self, line: impl Fn(usize) -> String) -> Result<()> {
        for (i, w) in self.list.iter_mut().enumerate() {
            let stdin = w.stdin.as_mut().context("helper input closed")?;
            writeln!(stdin, "{}", line(i + 1))
                .and_then(|()| stdin.flush())
                .context("idle helper exited")?;
        }
        Ok(())
    }

    /// Asks each helper to open its share of `level` connections (answered by `replies`).
    pub fn open_to(&mut self, level: usize) -> Result<()> {
        let procs = self.list.len() + 1;
        self.send(|i| format!("open {}", idle::share(level, i, procs)))
    }

    /// One answer from every helper, summed.
    pub async fn replies(&mut self) -> Result<Counts> {
        let mut list = std::mem::take(&mut self.list);
        let (list, lines) = tokio::task::spawn_blocking(move || {
            let lines: Vec<std::io::Result<String>> = list
                .iter_mut()
                .map(|w| {
                    let mut line = String::new();
                    w.stdout.read_line(&mut line).map(|_| line)
                })
                .collect();
            (list, lines)
        })
        .await?;
        self.list = list;
        let mut sum = Counts::default();
        for line in lines {
            let line = line.context("reading an idle helper")?;
            let f: Vec<u64> = line
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            let [attempted, open, failed, stopped] = f[..] else {
                bail!("idle helper answered {line:?}");
            };
            sum.attempted += attempted as usize;
            sum.open += open;
            sum.failed += failed;
            sum.stopped |= stopped != 0;
        }
        Ok(sum)
    }

    /// What the helpers hold now.
    pub async fn counts(&mut self) -> Result<Counts> {
        self.send(|_| "count".to_string())?;
        self.replies().await
    }
}

impl Drop for Workers {
    /// Closes every helper's input (each then closes its connections and exits), waits up to
    /// 10 s for them, and kills what is left.
    fn drop(&mut self) {
        for w in &mut self.list {
            w.stdin = None;
        }
        let until = Instant::now() + Duration::from_secs(10);
        for w in &mut self.list {
            while Instant::now() < until && matches!(w.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(w.child.try_wait(), Ok(None)) {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

/// The helper's side (`idle --worker`): answers commands until its input ends.
pub async fn serve(cfg: Config) -> Result<()> {
    idle::raise_nofile(u64::from(u32::MAX));
    let deadline = Instant::now() + cfg.max_secs;
    let mut holder = Holder::new(Arc::new(cfg));
    let mut stopped = false;
    loop {
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|n| (n, line))
        })
        .await??;
        if line.0 == 0 {
            return Ok(());
        }
        let cmd = line.1.trim();
        if let Some(n) = cmd.strip_prefix("open ") {
            let n: usize = n.parse().with_context(|| format!("bad command {cmd:?}"))?;
            stopped |= !holder.open_to(n, deadline).await;
        } else if cmd != "count" {
            bail!("bad command {cmd:?}");
        }
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{} {} {} {}",
            holder.attempted(),
            holder.open(),
            holder.failed(),
            u8::from(stopped)
        )?;
        out.flush()?;
    }
}
