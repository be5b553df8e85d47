//! Rate mode: an open loop at a fixed offered rate, latency taken from each request's scheduled
//! send time, so a stalled server is charged for every request it delayed (no coordinated
//! omission).
//!
//! Request k of connection i (of c) is due at `start + (i + k·c) / rate`: the connections share
//! one evenly spaced schedule. A connection that is still busy when its next request is due sends
//! it as soon as it is free; the wait counts in that request's latency. Latencies go into an
//! HdrHistogram (1 µs to 60 s, 3 significant digits).

use crate::client::{Conn, Expect, Target};
use crate::meter::{Meter, Window};
use crate::procstat::{Background, TreeSampler, Usage};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Config {
    /// Offered requests per second over all connections.
    pub rate: f64,
    pub c: usize,
    pub secs: Duration,
    pub warmup_secs: Duration,
    pub timeout: Duration,
    pub pid: Option<u32>,
    pub sample_interval: Duration,
    pub meter: crate::meter::Spec,
}

/// Latency percentiles from the histogram, in milliseconds.
#[derive(Debug, Default, Serialize)]
pub struct OpenLatency {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub url: String,
    pub c: usize,
    pub offered_rps: f64,
    pub achieved_rps: f64,
    pub elapsed_s: f64,
    /// Requests scheduled in the window.
    pub scheduled: u64,
    pub ok: u64,
    pub errors: u64,
    pub error_kinds: BTreeMap<String, u64>,
    /// Requests sent more than 1 ms after their scheduled time (the client or server fell behind).
    pub late_sends: u64,
    /// Latency from the scheduled send time to the last body byte.
    pub latency: OpenLatency,
    pub usage: Option<Usage>,
    /// The proxy's cgroup CPU and the client core's busy share over the timed window.
    pub window: Window,
    /// `window.cgroup_cpu_us` per successful request.
    pub cpu_us_per_request: Option<f64>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

struct ConnResult {
    hist: Histogram<u64>,
    scheduled: u64,
    late: u64,
    errors: BTreeMap<String, u64>,
}

/// Runs one connection's share of the schedule from `start` until `end`.
async fn run_conn(
    mut conn: Conn,
    expect: Arc<Expect>,
    (i, c, interval): (u64, u64, Duration),
    (start, end): (Instant, Instant),
    timeout: Duration,
) -> (Conn, ConnResult) {
    let mut r = ConnResult {
        hist: new_histogram(),
        scheduled: 0,
        late: 0,
        errors: BTreeMap::new(),
    };
    let mut k: u64 = 0;
    loop {
        let due = start + interval.mul_f64((i + k * c) as f64);
        if due >= end {
            break;
        }
        k += 1;
        r.scheduled += 1;
        let now = Instant::now();
        if now < due {
            tokio::time::sleep_until(due.into()).await;
        } else if now - due > Duration::from_millis(1) {
            r.late += 1;
        }
        let o = conn.get(&expect, false, timeout).await;
        match o.error {
            Some(e) => *r.errors.entry(e).or_default() += 1,
            None => {
                let from_due = (o.started + o.total).saturating_duration_since(due);
                let us = u64::try_from(from_due.as_micros()).unwrap_or(u64::MAX);
                r.hist.saturating_record(us.max(1));
            }
        }
    }
    (conn, r)
}

async fn phase(
    pool: &mut Vec<Conn>,
    expect: &Arc<Expect>,
    cfg: &Config,
    length: Duration,
) -> (Vec<ConnResult>, f64) {
    let c = pool.len() as u64;
    let interval = Duration::from_secs_f64(1.0 / cfg.rate.max(0.001));
    let start = Instant::now() + Duration::from_millis(5);
    let end = start + length;
    let mut tasks = Vec::new();
    for (i, conn) in pool.drain(..).enumerate() {
        tasks.push(tokio::spawn(run_conn(
            conn,
            expect.clone(),
            (i as u64, c, interval),
            (start, end),
            cfg.timeout,
        )));
    }
    let mut out = Vec::new();
    for t in tasks {
        if let Ok((conn, r)) = t.await {
            pool.push(conn);
            out.push(r);
        }
    }
    (out, start.elapsed().as_secs_f64())
}

pub async fn run(url: &str, target: Arc<Target>, expect: Expect, cfg: Config) -> Report {
    let expect = Arc::new(expect);
    let mut pool: Vec<Conn> = (0..cfg.c.max(1))
        .map(|i| Conn::with_index(target.clone(), i))
        .collect();
    for conn in pool.iter_mut() {
        let _ = conn.ready().await;
    }
    if !cfg.warmup_secs.is_zero() {
        phase(&mut pool, &expect, &cfg, cfg.warmup_secs).await;
    }
    let meter = Meter::start(&cfg.meter);
    let sampler = cfg
        .pid
        .map(|pid| Background::run(TreeSampler::start(pid), cfg.sample_interval));
    let (results, elapsed) = phase(&mut pool, &expect, &cfg, cfg.secs).await;
    let window = meter.finish();
    let usage = sampler.map(Background::stop);

    let mut hist = new_histogram();
    let (mut scheduled, mut late) = (0, 0);
    let mut error_kinds = BTreeMap::new();
    for r in results {
        let _ = hist.add(&r.hist);
        scheduled += r.scheduled;
        late += r.late;
        for (k, v) in r.errors {
            *error_kinds.entry(k).or_default() += v;
        }
    }
    let ms = |us: u64| us as f64 / 1e3;
    let latency = if hist.is_empty() {
        OpenLatency::default()
    } else {
        OpenLatency {
            count: hist.len(),
            p50_ms: ms(hist.value_at_quantile(0.50)),
            p90_ms: ms(hist.value_at_quantile(0.90)),
            p99_ms: ms(hist.value_at_quantile(0.99)),
            p999_ms: ms(hist.value_at_quantile(0.999)),
            max_ms: ms(hist.max()),
            mean_ms: hist.mean() / 1e3,
        }
    };
    let ok = hist.len();
    Report {
        mode: "rate",
        url: url.to_string(),
        c: pool.len(),
        offered_rps: cfg.rate,
        achieved_rps: if elapsed > 0.0 {
            ok as f64 / elapsed
        } else {
            0.0
        },
        elapsed_s: elapsed,
        scheduled,
        ok,
        errors: error_kinds.values().sum(),
        error_kinds,
        late_sends: late,
        latency,
        usage,
        cpu_us_per_request: window
            .cgroup_cpu_us
            .filter(|_| ok > 0)
            .map(|us| us / ok as f64),
        window,
    }
}
