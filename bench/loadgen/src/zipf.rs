//! Zipf mode: GETs over a catalogue of generated objects whose popularity follows a Zipf law
//! (rank k asked with probability proportional to 1/k^s), spread over several targets the way
//! an L4 balancer spreads keep-alive connections (connection i goes to target i mod n). Each
//! connection asks a fixed, seeded sequence, so every setup under test gets the same requests.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

#[derive(Debug, Clone)]
pub struct Config {
    pub targets: Vec<SocketAddr>,
    pub objects: u64,
    pub size: u64,
    pub s: f64,
    /// Requests in all, split evenly over the connections.
    pub requests: u64,
    pub c: usize,
    pub seed: u64,
    /// Object names are `<prefix>-<rank>` (`/gen/<size>/<prefix>-<rank>`).
    pub prefix: String,
    /// The `Host` every request names (caches key on it: one name for every node).
    pub host: String,
    pub max_secs: Duration,
    pub timeout: Duration,
    /// Hash one body in this many against the generated content (0: none).
    pub hash_every: u64,
    /// The generated content's SHA-256 (hex), set by `run`.
    pub digest: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub targets: Vec<String>,
    pub objects: u64,
    pub size: u64,
    pub s: f64,
    pub c: usize,
    pub requested: u64,
    pub ok: u64,
    pub errors: u64,
    pub error_kinds: BTreeMap<String, u64>,
    pub hashed: u64,
    /// Distinct objects the run asked for.
    pub distinct: usize,
    pub bytes: u64,
    pub elapsed_s: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// The inverse of the Zipf CDF over ranks 1..=n.
struct Sampler {
    cdf: Vec<f64>,
}

impl Sampler {
    fn new(n: u64, s: f64) -> Sampler {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(s);
                acc
            })
            .collect();
        for v in &mut cdf {
            *v /= acc;
        }
        Sampler { cdf }
    }

    /// The rank for a uniform `u` in [0, 1).
    fn rank(&self, u: f64) -> u64 {
        (self.cdf.partition_point(|&c| c <= u) as u64 + 1).min(self.cdf.len() as u64)
    }
}

/// splitmix64: the next well-mixed word of a seeded sequence.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether this process runs in a named network namespace (one `ip netns add` made, not the
/// host's): there, and only there, targets other than loopback are the bench's own private
/// addresses.
pub fn in_private_netns() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(me) = std::fs::metadata("/proc/self/ns/net") else {
        return false;
    };
    let Ok(named) = std::fs::read_dir("/run/netns") else {
        return false;
    };
    named.flatten().any(|e| {
        std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == me.dev() && m.ino() == me.ino())
    })
}

/// Refuses an address the suite may not send load to.
pub fn check_addr(addr: &SocketAddr) -> Result<()> {
    if addr.ip().is_loopback() || in_private_netns() {
        return Ok(());
    }
    bail!("refusing {addr}: only loopback, or any address inside a private network namespace")
}

#[derive(Default)]
struct Tally {
    ok: u64,
    bytes: u64,
    hashed: u64,
    errors: BTreeMap<String, u64>,
    asked: HashSet<u64>,
}

type Sender = http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> Result<Sender> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (send, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// One GET; the body's length (and hash) checked.
async fn get(send: &mut Sender, path: &str, cfg: &Config, hash: bool) -> Result<u64> {
    send.ready().await?;
    let req = http::Request::get(path)
        .header(http::header::HOST, cfg.host.as_str())
        .body(Empty::new())?;
    let resp = send.send_request(req).await?;
    if resp.status() != http::StatusCode::OK {
        bail!("status {}", resp.status().as_u16());
    }
    let mut body = resp.into_body();
    let mut n = 0u64;
    let mut h = hash.then(Sha256::new);
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame?.into_data() {
            n += d.len() as u64;
            if let Some(h) = h.as_mut() {
                h.update(&d);
            }
        }
    }
    if n != cfg.size {
        bail!("length {n}");
    }
    if let Some(h) = h {
        let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if got != cfg.digest {
            bail!("sha256");
        }
    }
    Ok(n)
}

async fn connection(
    i: usize,
    cfg: Arc<Config>,
    sampler: Arc<Sampler>,
    until: Instant,
) -> (Tally, Histogram<u64>) {
    let addr = cfg.targets[i % cfg.targets.len()];
    let share = cfg.requests / cfg.c as u64 + u64::from((i as u64) < cfg.requests % cfg.c as u64);
    let mut state = cfg.seed ^ (i as u64).wrapping_mul(0xA076_1D64_78BD_642F);
    let mut t = Tally::default();
    let mut hist = Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let mut send: Option<Sender> = None;
    for k in 0..share {
        if Instant::now() >= until {
            *t.errors.entry("deadline".into()).or_default() += share - k;
            break;
        }
        let u = (next(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
        let rank = sampler.rank(u);
        t.asked.insert(rank);
        let path = format!("/gen/{}/{}-{rank}", cfg.size, cfg.prefix);
        let hash = cfg.hash_every > 0 && k % cfg.hash_every == 0;
        let start = Instant::now();
        let once = async {
            if send.as_ref().is_none_or(|s| s.is_closed()) {
                send = Some(connect(addr).await?);
            }
            get(send.as_mut().expect("connected"), &path, &cfg, hash).await
        };
        let res = tokio::time::timeout(cfg.timeout, once).await;
        match res {
            Ok(Ok(n)) => {
                t.ok += 1;
                t.bytes += n;
                t.hashed += u64::from(hash);
                hist.saturating_record(start.elapsed().as_micros().max(1) as u64);
            }
            Ok(Err(e)) => {
                send = None;
                let label: String = e.to_string().chars().take(60).collect();
                *t.errors.entry(label).or_default() += 1;
            }
            Err(_) => {
                send = None;
                *t.errors.entry("timeout".into()).or_default() += 1;
            }
        }
    }
    (t, hist)
}

pub async fn run(cfg: Config) -> Result<Report> {
    if cfg.targets.is_empty() || cfg.objects == 0 || cfg.c == 0 {
        bail!("need targets, objects and connections");
    }
    for a in &cfg.targets {
        check_addr(a)?;
    }
    let sampler = Arc::new(Sampler::new(cfg.objects, cfg.s));
    let mut cfg = cfg;
    cfg.digest = crate::gen::digest(cfg.size, 0, cfg.size);
    let cfg = Arc::new(cfg);
    let started = Instant::now();
    let until = started + cfg.max_secs;
    let tasks: Vec<_> = (0..cfg.c)
        .map(|i| tokio::spawn(connection(i, cfg.clone(), sampler.clone(), until)))
        .collect();
    let mut all = Tally::default();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    for task in tasks {
        let (t, h) = task.await.context("connection task")?;
        all.ok += t.ok;
        all.bytes += t.bytes;
        all.hashed += t.hashed;
        all.asked.extend(t.asked);
        for (k, v) in t.errors {
            *all.errors.entry(k).or_default() += v;
        }
        hist.add(h).context("merge histograms")?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(Report {
        mode: "zipf",
        targets: cfg.targets.iter().map(|a| a.to_string()).collect(),
        objects: cfg.objects,
        size: cfg.size,
        s: cfg.s,
        c: cfg.c,
        requested: cfg.requests,
        ok: all.ok,
        errors: all.errors.values().sum(),
        error_kinds: all.errors,
        hashed: all.hashed,
        distinct: all.asked.len(),
        bytes: all.bytes,
        elapsed_s: elapsed,
        rps: all.ok as f64 / elapsed.max(1e-9),
        p50_ms: ms(hist.value_at_quantile(0.50)),
        p99_ms: ms(hist.value_at_quantile(0.99)),
        p999_ms: ms(hist.value_at_quantile(0.999)),
        max_ms: ms(hist.max()),
    })
}

#[cfg(test)]
mod tests {
    use super::Sampler;

    #[test]
    fn ranks_follow_the_law() {
        let z = Sampler::new(1000, 1.0);
        assert_eq!(z.rank(0.0), 1);
        assert_eq!(z.rank(0.999_999), 1000);
        // Rank 1 takes 1/H(1000) ≈ 13.4 % of requests; rank 2 half as many.
        let h: f64 = (1..=1000).map(|k| 1.0 / k as f64).sum();
        assert_eq!(z.rank(0.99 / h), 1);
        assert_eq!(z.rank(1.01 / h), 2);
        assert_eq!(z.rank(1.49 / h), 2);
        assert_eq!(z.rank(1.51 / h), 3);
    }
}
