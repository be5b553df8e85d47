//! Duration mode: requests/s over c keep-alive connections for T seconds, bounded in count too.

use crate::client::{self, Conn, Expect, Target};
use crate::meter::{Meter, Window};
use crate::procstat::{Background, TreeSampler, Usage};
use crate::stats::Latency;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Config {
    pub c: usize,
    pub secs: Duration,
    pub warmup_secs: Duration,
    /// Hard cap on timed requests, whatever the duration.
    pub max_requests: u64,
    pub hash_every: u64,
    pub timeout: Duration,
    pub pid: Option<u32>,
    pub sample_interval: Duration,
    pub meter: crate::meter::Spec,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub url: String,
    pub c: usize,
    pub target_s: f64,
    pub elapsed_s: f64,
    pub ok: usize,
    pub errors: usize,
    pub warmup_errors: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub rps: f64,
    pub throughput_mb_s: f64,
    pub latency: Latency,
    pub ttfb: Latency,
    pub hashed: usize,
    pub reconnects: u64,
    /// TLS handshakes over the whole run (warm-up included), by kind.
    pub tls_full_handshakes: u64,
    pub tls_resumed_handshakes: u64,
    /// Of those, the handshakes that settled on TLS 1.2 (the others were TLS 1.3).
    pub tls12_handshakes: u64,
    pub usage: Option<Usage>,
    /// The proxy's cgroup CPU and the client core's busy share over the timed window.
    pub window: Window,
    /// `window.cgroup_cpu_us` per successful request.
    pub cpu_us_per_request: Option<f64>,
}

#[derive(Default)]
struct TaskResult {
    totals: Vec<Duration>,
    ttfbs: Vec<Duration>,
    bytes: u64,
    hashed: usize,
    errors: BTreeMap<String, usize>,
}

/// Runs every connection in a closed loop until `until` or until `budget` requests were issued.
async fn run_phase(
    pool: &mut Vec<Conn>,
    expect: &Arc<Expect>,
    cfg: &Config,
    until: Instant,
    budget: u64,
) -> Vec<TaskResult> {
    let issued = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(pool.len());
    for mut conn in pool.drain(..) {
        let (expect, issued) = (expect.clone(), issued.clone());
        let (timeout, hash_every) = (cfg.timeout, cfg.hash_every);
        tasks.push(tokio::spawn(async move {
            let mut r = TaskResult::default();
            while Instant::now() < until {
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= budget {
                    break;
                }
                let hash = hash_every > 0 && n % hash_every == 0;
                let o = conn.get(&expect, hash, timeout).await;
                match o.error {
                    Some(e) => *r.errors.entry(e).or_default() += 1,
                    None => {
                        r.totals.push(o.total);
                        r.ttfbs.push(o.ttfb);
                        r.bytes += o.bytes;
                        r.hashed += usize::from(o.hashed);
                    }
                }
            }
            (conn, r)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        if let Ok((conn, r)) = t.await {
            pool.push(conn);
            results.push(r);
        }
    }
    results
}

pub async fn run(url: &str, target: Arc<Target>, expect: Expect, cfg: Config) -> Report {
    let expect = Arc::new(expect);
    let mut pool = client::pool(&target, cfg.c);
    for conn in pool.iter_mut() {
        let _ = conn.ready().await;
    }
    let warm = run_phase(
        &mut pool,
        &expect,
        &cfg,
        Instant::now() + cfg.warmup_secs,
        cfg.max_requests,
    )
    .await;
    let warmup_errors = warm.iter().flat_map(|r| r.errors.values()).sum();

    let meter = Meter::start(&cfg.meter);
    let sampler = cfg
        .pid
        .map(|pid| Background::run(TreeSampler::start(pid), cfg.sample_interval));
    let start = Instant::now();
    let results = run_phase(&mut pool, &expect, &cfg, start + cfg.secs, cfg.max_requests).await;
    let elapsed = start.elapsed().as_secs_f64();
    let window = meter.finish();
    let usage = sampler.map(Background::stop);

    let mut totals = Vec::new();
    let mut ttfbs = Vec::new();
    let mut error_kinds = BTreeMap::new();
    let (mut bytes, mut hashed) = (0u64, 0usize);
    for r in results {
        totals.extend(r.totals);
        ttfbs.extend(r.ttfbs);
        bytes += r.bytes;
        hashed += r.hashed;
        for (k, v) in r.errors {
            *error_kinds.entry(k).or_default() += v;
        }
    }
    let ok = totals.len();
    let per_s = |x: f64| if elapsed > 0.0 { x / elapsed } else { 0.0 };
    Report {
        mode: "duration",
        url: url.to_string(),
        c: cfg.c,
        target_s: cfg.secs.as_secs_f64(),
        elapsed_s: elapsed,
        ok,
        errors: error_kinds.values().sum(),
        warmup_errors,
        error_kinds,
        rps: per_s(ok as f64),
        throughput_mb_s: per_s(bytes as f64) / 1e6,
        latency: Latency::from_samples(&totals),
        ttfb: Latency::from_samples(&ttfbs),
        hashed,
        reconnects: pool.iter().map(|c| c.reconnects).sum(),
        tls_full_handshakes: pool.iter().map(|c| c.tls_full).sum(),
        tls_resumed_handshakes: pool.iter().map(|c| c.tls_resumed).sum(),
        tls12_handshakes: pool.iter().map(|c| c.tls12).sum(),
        usage,
        cpu_us_per_request: window
            .cgroup_cpu_us
            .filter(|_| ok > 0)
            .map(|us| us / ok as f64),
        window,
    }
}
