//! sluice-soak: holds every sluice front end under mixed load while faults are injected on a seeded
//! schedule, verifies every byte delivered, attributes every failure to a fault window, samples the
//! process every 10 s, and writes a Markdown report. Run it through `scripts/soak` (as root: it
//! mounts a small tmpfs for the cache's disk tier and remounts it read-only).
//!
//! # Layout
//! - `gen`: deterministic object bytes and the streaming verifier
//! - `origin`, `echo`, `mcast`: the upstreams (HTTP with fault modes, TCP echo, multicast RTP on lo)
//! - `sluice`: config, child process, reloads
//! - `players`: the simulated clients of each front end
//! - `faults`: schedule, what each fault explains, injection
//! - `record`, `sampler`, `report`: outcomes, resource samples, the report

mod client;
mod echo;
mod faults;
mod gen;
mod mcast;
mod origin;
mod players;
mod record;
mod report;
mod sampler;
mod sluice;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::players::Ctx;
use crate::record::Log;

#[derive(Parser)]
#[command(
    about = "Soak-and-fault run of sluice: mixed load on every front end, seeded faults, a report.",
    args_override_self = true
)]
struct Args {
    /// Length of the run (load and faults), in minutes.
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// Seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The sluice binary to run.
    #[arg(long)]
    sluice: PathBuf,
    /// The ClearKey DASH fixtures (scripts/make-drm-fixtures.sh).
    #[arg(long)]
    fixtures: PathBuf,
    /// Markdown report written here (and printed).
    #[arg(long)]
    report: PathBuf,
    /// Scratch directory: config, sluice's log, and the disk tier's tmpfs (default
    /// /tmp/sluice-soak-PID, so runs side by side do not share it).
    #[arg(long)]
    work: Option<PathBuf>,
    /// RLIMIT_NOFILE of the sluice process (soft and hard).
    #[arg(long, default_value_t = 1024)]
    nofile: u64,
    /// Multicast channel rate, kbit/s.
    #[arg(long, default_value_t = 2000)]
    iptv_kbit: u64,
    /// Seconds between reloads.
    #[arg(long, default_value_t = 30)]
    reload_secs: u64,
    /// Text for the report's header line (machine, commit).
    #[arg(long, default_value = "")]
    label: String,
}

/// The tmpfs under the disk tier; unmounted when dropped.
struct Disk(PathBuf);

impl Disk {
    fn mount(dir: &Path) -> Result<Disk> {
        std::fs::create_dir_all(dir)?;
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=48m", "sluice-soak"])
            .arg(dir)
            .status()?;
        anyhow::ensure!(st.success(), "mounting a tmpfs at {}", dir.display());
        Ok(Disk(dir.to_path_buf()))
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Counters that show the faults reached sluice, copied into the report at the end.
const EVIDENCE: &[&str] = &[
    "sluice_cache_disk_",
    "sluice_cache_tier_bytes",
    "sluice_cache_origin_errors",
    "sluice_downstream_accept_paused_total",
    "sluice_downstream_connections_total",
    "sluice_upstream_",
];

fn free_port() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn load_drm(dir: &Path) -> Result<(HashMap<String, Vec<u8>>, players::Drm)> {
    let mut files = HashMap::new();
    origin::load_dir(&dir.join("cenc"), "/drm/cenc", &mut files)?;
    // The packager wrote a live MPD whose window has long passed; serve it as the 2 s VOD it is.
    let mpd = files
        .get_mut("/drm/cenc/manifest.mpd")
        .context("cenc/manifest.mpd")?;
    *mpd = as_vod(&String::from_utf8_lossy(mpd)).into_bytes();
    let keys = std::fs::read_to_string(dir.join("keys.txt"))?;
    let (mut kids, mut ks) = (Vec::new(), Vec::new());
    for l in keys.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() == 3 {
            kids.push(w[1].to_string());
            ks.push(w[2].to_string());
        }
    }
    let video_md5 = std::fs::read_to_string(dir.join("source-video.md5"))?
        .lines()
        .map(str::to_string)
        .collect();
    let keys = format!("key_id={}&key={}", kids.join(","), ks.join(","));
    Ok((files, players::Drm { keys, video_md5 }))
}

/// A dynamic MPD as a static one of 2 s (the fixture's length), without its live timing attributes.
fn as_vod(mpd: &str) -> String {
    let mut out = mpd.replace(
        "type=\"dynamic\"",
        "type=\"static\" mediaPresentationDuration=\"PT2S\"",
    );
    for attr in [
        "publishTime",
        "availabilityStartTime",
        "minimumUpdatePeriod",
        "timeShiftBufferDepth",
    ] {
        let key = format!(" {attr}=\"");
        if let Some(a) = out.find(&key) {
            if let Some(len) = out[a + key.len()..].find('"') {
                out.replace_range(a..a + key.len() + len + 1, "");
            }
        }
    }
    out
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "run as root: the disk tier is a tmpfs this run mounts, fills and remounts read-only"
        );
    }
    let ok = run(args).await?;
    std::process::exit(if ok { 0 } else { 1 });
}

async fn run(args: Args) -> Result<bool> {
    let total = args.minutes * 60.0;
    let work = args
        .work
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/sluice-soak-{}", std::process::id())));
    std::fs::create_dir_all(&work)?;
    let disk_dir = work.join("disk");
    // A mount left by an interrupted run.
    let _ = std::process::Command::new("umount")
        .arg(&disk_dir)
        .stderr(std::process::Stdio::null())
        .status();
    let disk = Disk::mount(&disk_dir)?;

    let (files, drm) = load_drm(&args.fixtures).context("loading the DASH fixtures")?;
    let files = Arc::new(files);
    let mode = Arc::new(AtomicU8::new(0));
    let app0 = origin::Origin::start(files.clone(), mode.clone()).await?;
    let app1 = origin::Origin::start(files.clone(), mode.clone()).await?;
    let store = origin::Origin::start(files.clone(), mode.clone()).await?;
    let media = origin::Origin::start(files.clone(), mode.clone()).await?;
    let echo0 = echo::Echo::start().await?;
    let echo1 = echo::Echo::start().await?;
    // A port of its own per run: two runs side by side must not hear each other's channel.
    let group = SocketAddrV4::new(
        Ipv4Addr::new(239, 255, 77, 1),
        20_000 + (std::process::id() % 20_000) as u16,
    );
    let addrs = Arc::new(sluice::Addrs {
        http: free_port()?,
        tcp: free_port()?,
        app: [app0.addr, app1.addr],
        store: store.addr,
        echo: [echo0.addr, echo1.addr],
    });
    let config_file = work.join("sluice.toml");
    std::fs::write(&config_file, sluice::config(&addrs, &disk_dir, 0))?;
    let log_file = work.join("sluice.log");
    let mut proc = sluice::start(
        &args.sluice,
        &config_file,
        &log_file,
        args.nofile,
        addrs.http,
    )
    .await?;
    let pid = proc.pid;
    let task_metric = "sluice_downstream_open_connections";
    let baseline = sampler::sample(pid, 0.0, addrs.http, task_metric)
        .await
        .context("first sample")?;
    eprintln!(
        "soak: sluice pid {pid} on {}, {} fds at start; {} minutes, seed {}; its log: {}",
        addrs.http,
        baseline.fds,
        args.minutes,
        args.seed,
        log_file.display()
    );

    let t0 = Instant::now();
    let log = Arc::new(Log::new(t0));
    let load_end = t0 + Duration::from_secs_f64((total - 15.0).max(30.0));
    let ctx = Arc::new(Ctx {
        log: log.clone(),
        sluice: addrs.http,
        tcp: addrs.tcp,
        media: media.addr,
        password: sluice::PASSWORD.to_string(),
        group,
        iptv_kbit_s: args.iptv_kbit,
        drm,
        until: load_end,
        faults_open: Default::default(),
        work_dir: work.clone(),
    });

    // The channel runs until after the recovery probes.
    let sender_until = t0 + Duration::from_secs_f64(total + 120.0);
    let kbit = args.iptv_kbit;
    let sender = std::thread::spawn(move || mcast::send(group, kbit, sender_until));

    let mut load = tokio::task::JoinSet::new();
    for id in 0..2 {
        load.spawn(players::reverse(ctx.clone(), false, id));
        load.spawn(players::reverse(ctx.clone(), true, id));
        load.spawn(players::tcp(ctx.clone(), id));
        load.spawn(players::iptv(ctx.clone(), id));
    }
    load.spawn(players::stream(ctx.clone(), 0));
    load.spawn(players::hls(ctx.clone(), 0));
    load.spawn(players::dash(ctx.clone(), 0));

    let windows = faults::schedule(args.seed, 20.0, total, 30.0);
    let targets = faults::Targets {
        mode: mode.clone(),
        victim: app1.clone(),
        echo_victim: echo1.clone(),
        disk: disk_dir.clone(),
        sluice_pid: pid,
        fd_limit: args.nofile,
    };
    let injector = tokio::spawn(faults::inject(ctx.clone(), targets, windows.clone(), t0));
    let reloader = tokio::spawn(sluice::reloads(
        ctx.clone(),
        addrs.clone(),
        config_file.clone(),
        disk_dir.clone(),
        Duration::from_secs(args.reload_secs),
    ));

    let mut samples = vec![];
    let mut alive = true;
    let mut next = t0;
    while Instant::now() < load_end {
        match sampler::sample(pid, log.now(), addrs.http, task_metric).await {
            Some(s) => {
                eprintln!(
                    "soak: {:7.1}s rss {} MiB uss {} MiB fds {} threads {} client connections {:?}",
                    s.t,
                    report::mib(s.rss_kib * 1024),
                    report::mib(s.uss_kib * 1024),
                    s.fds,
                    s.threads,
                    s.tasks,
                );
                samples.push(s);
            }
            None => {
                alive = false;
                break;
            }
        }
        next += Duration::from_secs(10);
        tokio::time::sleep_until(next.into()).await;
    }
    while load.join_next().await.is_some() {}
    let injected = injector.await?;
    let reloads = reloader.await.unwrap_or((0, 0));

    // Recovery: the load has stopped; sluice must serve every kind again and give back descriptors.
    let mut checks = vec![(
        "every fault window opened and closed as scheduled".to_string(),
        injected.is_empty(),
    )];
    for e in &injected {
        checks.push((format!("fault window failed: {e}"), false));
    }
    alive &= proc.child.try_wait()?.is_none();
    let mut metrics = Vec::new();
    checks.push(("sluice ran the whole time".into(), alive));
    if alive {
        checks.extend(players::probe_all(&ctx).await);
        let mut fds = u64::MAX;
        for _ in 0..40 {
            fds = sampler::sample(pid, log.now(), addrs.http, "")
                .await
                .map_or(u64::MAX, |s| s.fds);
            if fds <= baseline.fds + 16 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        metrics = sampler::metric_lines(addrs.http, EVIDENCE).await;
        checks.push((
            format!(
                "descriptors back to the start ({} → {fds}, within 16)",
                baseline.fds
            ),
            fds <= baseline.fds + 16,
        ));
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let exit = tokio::time::timeout(Duration::from_secs(20), proc.child.wait()).await;
        let clean = matches!(exit, Ok(Ok(s)) if s.success());
        if !clean {
            let _ = proc.child.kill().await;
        }
        checks.push(("SIGTERM: sluice exits 0 within 20 s".into(), clean));
    }
    let _ = sender.join();
    drop(disk);

    let outcomes = log.take();
    let trends = sampler::trends(&samples, 60.0_f64.min(total / 5.0));
    let header = format!(
        "Soak run: {} min, seed {}, {}. Load: 2 reverse (no cache) + 2 reverse+cache + 2 TCP + 2 IPTV viewers \
         ({} kbit/s channel) + 1 /proxy/stream + 1 HLS + 1 DASH-ClearKey player, each sequential; sluice with \
         RLIMIT_NOFILE {}; reload every {} s.",
        args.minutes, args.seed, args.label, args.iptv_kbit, args.nofile, args.reload_secs
    );
    let summary = report::Summary {
        header,
        outcomes: &outcomes,
        windows: &windows,
        samples: &samples,
        trends: &trends,
        reloads,
        checks: &checks,
        metrics: &metrics,
    };
    let text = summary.markdown(true);
    if let Some(parent) = args.report.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.report, &text)?;
    println!("{text}");
    Ok(summary.passed())
}
