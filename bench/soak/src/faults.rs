//! The fault schedule (seeded, so a run can be repeated), which failures each kind of fault can
//! explain, and the injector that opens and closes each window.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::echo::Echo;
use crate::origin::{Mode, Origin};
use crate::players::{enc, Ctx, Rng};
use crate::record::Front;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    OriginReset,
    OriginStall,
    OriginGarbage,
    ServerKilled,
    ClientsStopReading,
    DiskFull,
    DiskReadOnly,
    FdsNearLimit,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::OriginReset,
        Kind::OriginStall,
        Kind::OriginGarbage,
        Kind::ServerKilled,
        Kind::ClientsStopReading,
        Kind::DiskFull,
        Kind::DiskReadOnly,
        Kind::FdsNearLimit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::OriginReset => "origins reset mid-body",
            Kind::OriginStall => "origins stall mid-body",
            Kind::OriginGarbage => "origins answer garbage",
            Kind::ServerKilled => "a server of each group killed",
            Kind::ClientsStopReading => "clients stop reading",
            Kind::DiskFull => "disk tier full",
            Kind::DiskReadOnly => "disk tier read-only",
            Kind::FdsNearLimit => "descriptors near the limit",
        }
    }

    /// Whether this fault can make an operation on `front` fail while it lasts. Clients that stop
    /// reading, the killed server (its group has another, and GETs and TCP connects move on; see
    /// [`Window::explains`] for what was in flight at the kill) and the disk tier (the cache must
    /// fall back to the origin) explain nothing for anyone else: a failure then is a finding.
    pub fn explains(self, front: Front) -> bool {
        use Front::*;
        match self {
            Kind::OriginReset | Kind::OriginStall | Kind::OriginGarbage => {
                matches!(front, ReversePlain | ReverseCached | Stream | Hls | Dash)
            }
            Kind::FdsNearLimit => true,
            Kind::ServerKilled | Kind::ClientsStopReading | Kind::DiskFull | Kind::DiskReadOnly => {
                false
            }
        }
    }
}

/// Seconds after a window closes in which failures still count as caused by it (a request that
/// began in a stall fails when sluice's idle timeout fires).
pub const GRACE: f64 = 10.0;

/// Seconds after a kill's scheduled instant in which a new operation may still have reached the
/// victim before its listener closed.
const KILL_SLACK: f64 = 0.5;

#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub kind: Kind,
    pub start: f64,
    pub end: f64,
}

impl Window {
    /// Whether an operation that ran from `a` to `b` and failed on `front` is explained by this
    /// window: it overlapped the window or its grace, on a path the kind can break. A killed
    /// server also breaks what was in flight on it at that instant (a TCP session or a response
    /// body cannot move to the other server), but nothing that began after the kill.
    pub fn explains(&self, front: Front, a: f64, b: f64) -> bool {
        // The kill lands a few milliseconds after the scheduled instant (the injector's own
        // latency), so an operation begun within KILL_SLACK of it may have reached the victim.
        let killed_mid_flight = self.kind == Kind::ServerKilled
            && matches!(front, Front::Tcp | Front::ReversePlain)
            && a <= self.start + KILL_SLACK
            && b >= self.start;
        killed_mid_flight || (self.kind.explains(front) && a <= self.end + GRACE && b >= self.start)
    }
}

/// Every kind once per cycle in a seeded order, 10–15 s each, 8–12 s of calm between windows,
/// from `warmup` until `tail` seconds before the end.
pub fn schedule(seed: u64, warmup: f64, total: f64, tail: f64) -> Vec<Window> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut t = warmup;
    'cycles: loop {
        let mut kinds = Kind::ALL.to_vec();
        for i in (1..kinds.len()).rev() {
            kinds.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for kind in kinds {
            let len = 10.0 + rng.below(6) as f64;
            if t + len > total - tail {
                break 'cycles;
            }
            out.push(Window {
                kind,
                start: t,
                end: t + len,
            });
            t += len + 8.0 + rng.below(5) as f64;
        }
    }
    out
}

/// What the injector acts on.
pub struct Targets {
    pub mode: Arc<AtomicU8>,
    pub victim: Arc<Origin>,
    pub echo_victim: Arc<Echo>,
    pub disk: PathBuf,
    pub sluice_pid: u32,
    pub fd_limit: u64,
}

/// Runs the schedule; each window's effect is undone when it closes. A window that could not be
/// opened or closed is reported (the run fails on it) and the schedule goes on.
pub async fn inject(ctx: Arc<Ctx>, t: Targets, windows: Vec<Window>, t0: Instant) -> Vec<String> {
    let mut errors = Vec::new();
    for w in windows {
        tokio::time::sleep_until((t0 + Duration::from_secs_f64(w.start)).into()).await;
        ctx.faults_open.fetch_add(1, Ordering::Relaxed);
        eprintln!("soak: {:7.1}s fault on: {}", w.start, w.kind.name());
        let end = t0 + Duration::from_secs_f64(w.end);
        let r = run_window(&ctx, &t, w.kind, end).await;
        ctx.faults_open.fetch_sub(1, Ordering::Relaxed);
        eprintln!(
            "soak: {:7.1}s fault off: {}",
            t0.elapsed().as_secs_f64(),
            w.kind.name()
        );
        if let Err(e) = r {
            eprintln!("soak: fault {} at {:.0} s: {e:#}", w.kind.name(), w.start);
            errors.push(format!("{} at {:.0} s: {e:#}", w.kind.name(), w.start));
        }
    }
    errors
}

async fn run_window(ctx: &Ctx, t: &Targets, kind: Kind, end: Instant) -> Result<()> {
    let until = tokio::time::sleep_until(end.into());
    match kind {
        Kind::OriginReset | Kind::OriginStall | Kind::OriginGarbage => {
            let mode = match kind {
                Kind::OriginReset => Mode::Reset,
                Kind::OriginStall => Mode::Stall,
                _ => Mode::Garbage,
            };
            t.mode.store(mode as u8, Ordering::Relaxed);
            until.await;
            t.mode.store(Mode::Healthy as u8, Ordering::Relaxed);
        }
        Kind::ServerKilled => {
            t.victim.kill();
            t.echo_victim.kill();
            until.await;
            t.victim.restart().await?;
            t.echo_victim.restart().await?;
        }
        Kind::ClientsStopReading => {
            let held = stop_reading(ctx).await;
            until.await;
            drop(held);
        }
        Kind::DiskFull => {
            let filler = t.disk.join("soak-filler");
            fill(&filler).await;
            until.await;
            let _ = tokio::fs::remove_file(&filler).await;
        }
        Kind::DiskReadOnly => {
            // A read-only bind mount stacked on the directory: `remount,ro` of the tmpfs itself is
            // refused (EBUSY) while sluice has a slice file open for writing. New opens resolve to
            // the read-only mount; files already open stay as they were, as on a real disk.
            let dir = t.disk.to_string_lossy();
            mount(&["--bind", &dir, &dir]).await?;
            mount(&["-o", "remount,bind,ro", &dir]).await?;
            until.await;
            unmount(&t.disk).await?;
        }
        Kind::FdsNearLimit => {
            let open = std::fs::read_dir(format!("/proc/{}/fd", t.sluice_pid))
                .map(|d| d.count())
                .unwrap_or(0) as u64;
            // Leave sluice about 40 descriptors for everyone else.
            let want = t.fd_limit.saturating_sub(open + 40);
            let mut idle = Vec::new();
            for _ in 0..want {
                match TcpStream::connect(ctx.sluice).await {
                    Ok(s) => idle.push(s),
                    Err(_) => break,
                }
            }
            eprintln!(
                "soak:          {} idle connections held (sluice had {open} fds of {})",
                idle.len(),
                t.fd_limit
            );
            until.await;
            drop(idle);
        }
    }
    Ok(())
}

/// Writes zeros until the disk tier's filesystem is full (bounded by its size).
async fn fill(path: &std::path::Path) {
    let Ok(mut f) = tokio::fs::File::create(path).await else {
        return;
    };
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..4096 {
        if f.write_all(&chunk).await.is_err() {
            break;
        }
    }
    let _ = f.flush().await;
}

async fn mount(args: &[&str]) -> Result<()> {
    let st = tokio::process::Command::new("mount")
        .args(args)
        .status()
        .await?;
    anyhow::ensure!(st.success(), "mount {} failed", args.join(" "));
    Ok(())
}

/// Removes the stacked read-only mount (lazily if a file is still open on it).
async fn unmount(dir: &std::path::Path) -> Result<()> {
    for _ in 0..20 {
        let st = tokio::process::Command::new("umount")
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .await?;
        if st.success() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = tokio::process::Command::new("umount")
        .arg("-l")
        .arg(dir)
        .status()
        .await?;
    anyhow::ensure!(st.success(), "umount -l {} failed", dir.display());
    Ok(())
}

/// Clients that ask for big bodies, read 64 KiB and then stop reading (kept until the window ends).
async fn stop_reading(ctx: &Ctx) -> Vec<TcpStream> {
    let media = ctx.media;
    let pw = format!("api_password={}", ctx.password);
    let mut targets = Vec::new();
    for i in 0..3 {
        let d = enc(&format!("http://{media}/media/gen/67108864/stuck{i}"));
        targets.push(format!("/proxy/stream?d={d}&{pw}"));
        targets.push(format!("/plain/gen/33554432/stuck{i}"));
        targets.push(format!("/cached/gen/8388608/stuck{i}"));
    }
    targets.push(format!("/rtp/{}?{pw}", ctx.group));
    let mut held = Vec::new();
    for target in targets {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_secs(5),
            start_then_stall(ctx.sluice, &target),
        )
        .await
        {
            held.push(s);
        }
    }
    held
}

async fn start_then_stall(addr: SocketAddr, target: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {target} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = vec![0u8; 65_536];
    let mut got = 0;
    while got < 65_536 {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_minutes_hold_every_kind_once_and_windows_do_not_overlap() {
        let w = schedule(7, 20.0, 300.0, 30.0);
        let mut kinds: Vec<Kind> = w.iter().map(|w| w.kind).collect();
        kinds.sort();
        kinds.dedup();
        assert_eq!(kinds.len(), Kind::ALL.len(), "{w:?}");
        assert!(w.windows(2).all(|p| p[0].end + 8.0 <= p[1].start));
        assert!(w.last().unwrap().end <= 270.0);
        assert_eq!(
            format!("{w:?}"),
            format!("{:?}", schedule(7, 20.0, 300.0, 30.0))
        );
    }
}
