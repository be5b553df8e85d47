//! sluice-loadgen: HTTP load client (batch and duration modes) and /proc sampler; prints JSON.
//!
//! # Layout
//! - `client`: one keep-alive connection, one measured and verified GET
//! - `quic`: an HTTP/3 connection (quinn + h3) that request streams share, one GET on it
//! - `batch`: c requests released together, warm-ups, median of timed rounds
//! - `duration`: closed-loop requests/s over c connections for T seconds
//! - `rate`: an open loop at a fixed offered rate, latency from each scheduled send time
//! - `idle`: memory per idle keep-alive connection (HTTP/1.1 or h2c), many source addresses
//! - `idle_workers`: helper processes that hold part of the idle connections
//! - `procstat`: CPU time and memory of a process tree over a window
//! - `meter`: a CPU cgroup's own accounting and one core's busy share over a window
//! - `stats`: latency percentiles
//! - `tsgen`: the seeded RTP/MPEG-TS stream, and its byte-exact verifier
//! - `mcast`: paced multicast sender, loopback interfaces only
//! - `iptv`: HTTP clients on an IPTV gateway, verifying every delivered byte
//! - `hls`: players that fetch a playlist (following a master) through a proxy, then every segment in order
//! - `gen`: generated object bytes, computable at any offset
//! - `origin`: an origin serving generated objects of any size, counting the bytes it sends
//! - `zipf`: a Zipf-distributed workload over a catalogue of generated objects, several targets

mod batch;
mod client;
mod duration;
mod gen;
mod hls;
mod idle;
mod idle_workers;
mod iptv;
mod mcast;
mod meter;
mod origin;
mod procstat;
mod quic;
mod rate;
mod stats;
mod tls;
mod tsgen;
mod zipf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "sluice-loadgen",
    about = "Load client and resource sampler for bench/"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Release c requests together; warm-ups; median of timed rounds per level.
    Batch(BatchArgs),
    /// Closed-loop requests/s over c keep-alive connections for a fixed time.
    Duration(DurationArgs),
    /// Open loop: a fixed offered rate over c connections, latency from scheduled send times.
    Rate(RateArgs),
    /// Memory per idle keep-alive connection: N clients, one request each, then silent.
    Idle(IdleArgs),
    /// Sample a process tree's CPU and memory for a fixed time.
    Sample(SampleArgs),
    /// Send paced RTP/MPEG-TS to multicast groups on a loopback interface.
    McastSend(McastSendArgs),
    /// N HTTP clients on an IPTV gateway's channel URLs, every byte verified.
    IptvRecv(IptvRecvArgs),
    /// N players: a playlist through a proxy, then every segment in order.
    Hls(HlsArgs),
    /// Serve generated objects (`/gen/<size>/<name>`, `/swr/<size>/<name>`) with Range,
    /// validators and byte counters (`/__stats`) on 127.0.0.1.
    Origin(OriginArgs),
    /// SHA-256 of bytes [start, end) of the generated object of `size` bytes.
    GenDigest(GenDigestArgs),
    /// GETs of generated objects whose popularity follows a Zipf law, spread over targets.
    Zipf(ZipfArgs),
}

#[derive(Args)]
struct ZipfArgs {
    /// `ip:port` of each node; connection i goes to target i mod n.
    #[arg(long, value_delimiter = ',', required = true)]
    targets: Vec<std::net::SocketAddr>,
    /// Objects in the catalogue.
    #[arg(long)]
    objects: u64,
    /// Bytes per object.
    #[arg(long)]
    size: u64,
    /// The Zipf exponent.
    #[arg(long, default_value_t = 1.0)]
    s: f64,
    /// Requests in all (split evenly over the connections).
    #[arg(long)]
    requests: u64,
    #[arg(long, default_value_t = 8)]
    c: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "z")]
    prefix: String,
    /// The `Host` of every request (the same for every node: caches key on it).
    #[arg(long, default_value = "s7.test")]
    host: String,
    #[arg(long, default_value_t = 120.0)]
    max_secs: f64,
    #[arg(long, default_value_t = 30.0)]
    timeout_secs: f64,
    #[arg(long, default_value_t = 16)]
    hash_every: u64,
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
struct OriginArgs {
    /// Loopback, or an address of a private network namespace (S7).
    #[arg(long, default_value = "127.0.0.1")]
    bind: std::net::IpAddr,
    #[arg(long)]
    port: u16,
    /// Delay before every answer under /swr/ (a slow revalidation).
    #[arg(long, default_value_t = 200)]
    swr_delay_ms: u64,
    /// Send each body at this many MB/s after its first chunk (0: unpaced).
    #[arg(long, default_value_t = 0.0)]
    pace_mbps: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

#[derive(Args)]
struct GenDigestArgs {
    #[arg(long)]
    size: u64,
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Exclusive end (default: the object's size).
    #[arg(long)]
    end: Option<u64>,
}

#[derive(Args)]
struct McastSendArgs {
    /// Multicast groups, comma separated; group index = position.
    #[arg(long, value_delimiter = ',', required = true)]
    groups: Vec<std::net::Ipv4Addr>,
    #[arg(long, default_value_t = 4056)]
    port: u16,
    /// Loopback interface to send on (anything else is refused).
    #[arg(long, default_value = "lo")]
    interface: String,
    /// Rate per group in Mbit/s of RTP datagrams.
    #[arg(long, default_value_t = 40.0)]
    mbps: f64,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
struct IptvRecvArgs {
    /// Channel URLs, one per sender group in the sender's order; must be on loopback.
    #[arg(long, value_delimiter = ',', required = true)]
    urls: Vec<String>,
    /// Clients, spread over the URLs round-robin.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 2.0)]
    warmup_secs: f64,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    #[arg(long, default_value_t = 1.5)]
    idle_end_secs: f64,
    #[arg(long, default_value_t = 15.0)]
    max_drain_secs: f64,
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, default_value_t = 100)]
    sample_ms: u64,
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
struct HlsArgs {
    /// The proxied playlist URL; must be http:// on loopback.
    #[arg(long)]
    url: String,
    /// Concurrency levels, comma separated: players at once.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    levels: Vec<usize>,
    /// Segments every player must get (the followed playlists must list exactly this many).
    #[arg(long)]
    expect_segments: usize,
    /// Check that init sections and each track's first segment are clear fragmented MP4.
    #[arg(long)]
    check_fmp4: bool,
    #[arg(long, default_value_t = 30.0)]
    timeout_secs: f64,
    /// Time budget per level.
    #[arg(long, default_value_t = 120.0)]
    max_secs: f64,
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, default_value_t = 50)]
    sample_ms: u64,
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Args)]
struct Common {
    /// Target URL; must be http:// or https:// on a loopback address.
    #[arg(long)]
    url: String,
    #[arg(long, default_value_t = 200)]
    expect_status: u16,
    /// Exact body length every response must have.
    #[arg(long)]
    expect_len: Option<u64>,
    /// SHA-256 (hex) that hashed bodies must match.
    #[arg(long)]
    expect_sha256: Option<String>,
    /// Per-request timeout.
    #[arg(long, default_value_t = 120.0)]
    timeout_secs: f64,
    /// Root PID of the server under test; its process tree is sampled in timed windows.
    #[arg(long)]
    pid: Option<u32>,
    #[arg(long, default_value_t = 50)]
    sample_ms: u64,
    /// Runtime worker threads (default: number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Extra request header `Name: value`, repeatable (e.g. `Range: bytes=0-99`).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// A CPU cgroup's usage file (`cpuacct.usage`, or a v2 `cpu.stat`), read at the start and
    /// end of the timed window.
    #[arg(long)]
    cgroup_usage: Option<String>,
    /// The core the client runs on: its busy share in the timed window is reported.
    #[arg(long)]
    client_core: Option<usize>,
    /// The load client's own CPU cgroup usage file: its CPU in % of a core over the timed
    /// window is reported (what "client-bound" is judged on, whatever else runs on its core).
    #[arg(long)]
    client_cgroup_usage: Option<String>,
    /// The origin's CPU cgroup usage file, reported the same way.
    #[arg(long)]
    origin_cgroup_usage: Option<String>,
    /// PEM file of the CA an https:// target's certificate must chain to.
    #[arg(long)]
    ca: Option<std::path::PathBuf>,
    /// TLS handshakes (HTTP/1.1): `keep` (keep-alive), `full` (a new connection and a full
    /// handshake per request), `resume` (a new connection per request, resuming the last session).
    #[arg(long, value_enum, default_value = "keep")]
    handshake: tls::Handshake,
    /// HTTP/2 over TLS (ALPN h2) with this many concurrent streams per connection.
    #[arg(long)]
    h2_streams: Option<usize>,
    /// HTTP/3 (QUIC over UDP to the same port) with this many concurrent streams per
    /// connection.
    #[arg(long)]
    h3_streams: Option<usize>,
}

impl Common {
    fn meter(&self) -> meter::Spec {
        meter::Spec {
            cgroup: self.cgroup_usage.clone(),
            client_cgroup: self.client_cgroup_usage.clone(),
            origin_cgroup: self.origin_cgroup_usage.clone(),
            core: self.client_core,
        }
    }

    fn target(&self) -> Result<client::Target> {
        client::Target::parse(&self.url)?
            .with_headers(&self.headers)?
            .with_tls(
                self.ca.as_deref(),
                self.handshake,
                self.h2_streams,
                self.h3_streams,
            )
    }
}

#[derive(Args)]
struct BatchArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrency levels, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    levels: Vec<usize>,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Warm-up rounds before each level.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Warm-up rounds before all levels, at --global-warmup-c.
    #[arg(long, default_value_t = 5)]
    global_warmup: usize,
    #[arg(long, default_value_t = 50)]
    global_warmup_c: usize,
    /// Hash every n-th body in timed rounds (0: none; warm-up bodies are all hashed).
    #[arg(long, default_value_t = 0)]
    hash_every: usize,
    /// Time budget for the whole run; levels not started in time are skipped.
    #[arg(long, default_value_t = 600.0)]
    max_secs: f64,
}

#[derive(Args)]
struct DurationArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 10)]
    c: usize,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    #[arg(long, default_value_t = 2.0)]
    warmup_secs: f64,
    #[arg(long, default_value_t = 5_000_000)]
    max_requests: u64,
    /// Hash every n-th body (0: none).
    #[arg(long, default_value_t = 100)]
    hash_every: u64,
}

#[derive(Args)]
struct RateArgs {
    #[command(flatten)]
    common: Common,
    /// Offered requests per second, over all connections.
    #[arg(long)]
    rate: f64,
    #[arg(long, default_value_t = 50)]
    c: usize,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
}

#[derive(Args)]
struct IdleArgs {
    /// Target URL; must be http:// on a loopback address.
    #[arg(long)]
    url: String,
    /// Body length of the one answer each connection reads.
    #[arg(long)]
    expect_len: u64,
    /// Cumulative connection counts to measure at, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "5000,50000")]
    levels: Vec<usize>,
    /// Speak HTTP/2 by prior knowledge (h2c) instead of HTTP/1.1.
    #[arg(long)]
    h2: bool,
    /// Source addresses 127.0.0.2 onwards.
    #[arg(long, default_value_t = 8)]
    sources: u8,
    #[arg(long, default_value_t = 200)]
    parallel: usize,
    #[arg(long, default_value_t = 2.0)]
    settle_secs: f64,
    /// Root PID of the server whose tree USS is read.
    #[arg(long)]
    pid: u32,
    #[arg(long, default_value_t = 300.0)]
    max_secs: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Client processes to spread the connections over (this one measures; the others are
    /// helpers it starts), so that none needs more descriptors than its open-file limit.
    #[arg(long, default_value_t = 1)]
    procs: usize,
    /// Run as one of those helpers (started by the measuring process; commands on stdin).
    #[arg(long, hide = true)]
    worker: bool,
}

#[derive(Args)]
struct SampleArgs {
    #[arg(long)]
    pid: u32,
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    #[arg(long, default_value_t = 100)]
    sample_ms: u64,
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n.max(1));
    }
    Ok(b.enable_all().build()?)
}

fn expect_of(c: &Common) -> Result<client::Expect> {
    Ok(client::Expect {
        status: c.expect_status,
        len: c.expect_len,
        sha256: c
            .expect_sha256
            .as_deref()
            .map(client::parse_sha256)
            .transpose()?,
    })
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn main() -> Result<()> {
    let json = match Cli::parse().cmd {
        Cmd::Batch(a) => {
            let c = &a.common;
            let target = Arc::new(c.target()?);
            let cfg = batch::Config {
                levels: a.levels.clone(),
                rounds: a.rounds,
                warmup: a.warmup,
                global_warmup: a.global_warmup,
                global_warmup_c: a.global_warmup_c,
                hash_every: a.hash_every,
                timeout: secs(c.timeout_secs),
                max_secs: secs(a.max_secs),
                pid: c.pid,
                sample_interval: Duration::from_millis(c.sample_ms.max(1)),
            };
            let expect = expect_of(c)?;
            let report = runtime(c.threads)?.block_on(batch::run(&c.url, target, expect, cfg));
            serde_json::to_string_pretty(&report)?
        }
        Cmd::Duration(a) => {
            let c = &a.common;
            let target = Arc::new(c.target()?);
            let cfg = duration::Config {
                c: a.c.max(1),
                secs: secs(a.secs),
                warmup_secs: secs(a.warmup_secs),
                max_requests: a.max_requests,
                hash_every: a.hash_every,
                timeout: secs(c.timeout_secs),
                pid: c.pid,
                sample_interval: Duration::from_millis(c.sample_ms.max(1)),
                meter: c.meter(),
            };
            let expect = expect_of(c)?;
            let report = runtime(c.threads)?.block_on(duration::run(&c.url, target, expect, cfg));
            serde_json::to_string_pretty(&report)?
        }
        Cmd::Rate(a) => {
            let c = &a.common;
            let target = Arc::new(c.target()?);
            let cfg = rate::Config {
                rate: a.rate,
                c: a.c.max(1),
                secs: secs(a.secs),
                warmup_secs: secs(a.warmup_secs),
                timeout: secs(c.timeout_secs),
                pid: c.pid,
                sample_interval: Duration::from_millis(c.sample_ms.max(1)),
                meter: c.meter(),
            };
            let expect = expect_of(c)?;
            let report = runtime(c.threads)?.block_on(rate::run(&c.url, target, expect, cfg));
            serde_json::to_string_pretty(&report)?
        }
        Cmd::Idle(a) => {
            let target = client::Target::parse(&a.url)?;
            let cfg = idle::Config {
                addr: target.addr,
                host: target.host.clone(),
                path: target.path_and_query.clone(),
                expect_len: a.expect_len,
                levels: a.levels,
                h2: a.h2,
                sources: a.sources.max(1),
                parallel: a.parallel,
                settle: secs(a.settle_secs),
                pid: a.pid,
                max_secs: secs(a.max_secs),
            };
            let rt = runtime(Some(a.threads))?;
            if a.worker {
                rt.block_on(idle_workers::serve(cfg))?;
                return Ok(());
            }
            let args: Vec<String> = std::env::args().skip(1).collect();
            let workers = idle_workers::Workers::spawn(a.procs.max(1) - 1, &args)?;
            let report = rt.block_on(idle::run(cfg, workers))?;
            serde_json::to_string_pretty(&report)?
        }
        Cmd::Sample(a) => {
            let sampler = procstat::TreeSampler::start(a.pid);
            let bg = procstat::Background::run(sampler, Duration::from_millis(a.sample_ms.max(1)));
            std::thread::sleep(secs(a.secs));
            serde_json::to_string_pretty(&bg.stop()).context("encode usage")?
        }
        Cmd::McastSend(a) => {
            let report = mcast::run(mcast::Config {
                groups: a.groups,
                port: a.port,
                interface: a.interface,
                mbit_per_s: a.mbps,
                secs: secs(a.secs),
                seed: a.seed,
            })?;
            serde_json::to_string_pretty(&report)?
        }
        Cmd::IptvRecv(a) => {
            for u in &a.urls {
                client::Target::parse(u)?;
            }
            let cfg = iptv::Config {
                urls: a.urls,
                clients: a.clients.max(1),
                seed: a.seed,
                warmup: secs(a.warmup_secs),
                secs: secs(a.secs),
                idle_end: secs(a.idle_end_secs),
                max_drain: secs(a.max_drain_secs),
                pid: a.pid,
                sample_interval: Duration::from_millis(a.sample_ms.max(1)),
            };
            let report = runtime(a.threads)?.block_on(iptv::run(cfg));
            serde_json::to_string_pretty(&report)?
        }
        Cmd::Hls(a) => {
            client::Target::parse(&a.url)?;
            let cfg = hls::Config {
                url: a.url,
                levels: a.levels,
                expect_segments: a.expect_segments,
                check_fmp4: a.check_fmp4,
                timeout: secs(a.timeout_secs),
                max_secs: secs(a.max_secs),
                pid: a.pid,
                sample_interval: Duration::from_millis(a.sample_ms.max(1)),
            };
            let report = runtime(a.threads)?.block_on(hls::run(cfg));
            serde_json::to_string_pretty(&report)?
        }
        Cmd::Origin(a) => {
            let cfg = origin::Config {
                bind: a.bind,
                port: a.port,
                swr_delay: Duration::from_millis(a.swr_delay_ms),
                pace: (a.pace_mbps > 0.0).then_some(a.pace_mbps * 1e6),
            };
            runtime(Some(a.threads))?.block_on(origin::run(cfg))?;
            return Ok(());
        }
        Cmd::Zipf(a) => {
            let cfg = zipf::Config {
                targets: a.targets,
                objects: a.objects,
                size: a.size,
                s: a.s,
                requests: a.requests,
                c: a.c.max(1),
                seed: a.seed,
                prefix: a.prefix,
                host: a.host,
                max_secs: secs(a.max_secs),
                timeout: secs(a.timeout_secs),
                hash_every: a.hash_every,
                digest: String::new(),
            };
            let report = runtime(a.threads)?.block_on(zipf::run(cfg))?;
            serde_json::to_string_pretty(&report)?
        }
        Cmd::GenDigest(a) => {
            let end = a.end.unwrap_or(a.size).min(a.size);
            serde_json::to_string(&gen::digest(a.size, a.start.min(end), end))?
        }
    };
    println!("{json}");
    Ok(())
}
