//! Batch mode: c requests released together, warm-ups, then the median of N timed rounds per level.

use crate::client::{Conn, Expect, Outcome, Target};
use crate::procstat::{Background, TreeSampler, Usage};
use crate::stats::Latency;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

#[derive(Debug, Clone)]
pub struct Config {
    pub levels: Vec<usize>,
    pub rounds: usize,
    pub warmup: usize,
    pub global_warmup: usize,
    pub global_warmup_c: usize,
    /// Hash every n-th body of a timed round (0: none). Warm-up bodies are always hashed.
    pub hash_every: usize,
    pub timeout: Duration,
    /// Budget for the whole run; levels not started in time are skipped and reported.
    pub max_secs: Duration,
    pub pid: Option<u32>,
    pub sample_interval: Duration,
}

#[derive(Debug, Serialize)]
pub struct RoundSummary {
    pub wall_s: f64,
    pub ok: usize,
    pub errors: usize,
    pub bytes: u64,
    pub throughput_mb_s: f64,
}

#[derive(Debug, Serialize)]
pub struct LevelReport {
    pub c: usize,
    pub rounds: Vec<RoundSummary>,
    /// Index into `rounds` of the round with the median wall time; latency and CPU come from it.
    pub median_round: usize,
    pub wall_min_s: f64,
    pub wall_max_s: f64,
    pub throughput_mb_s: f64,
    pub latency: Latency,
    pub ttfb: Latency,
    /// First byte measured from the round's release (the earliest request start), not from each
    /// request's own start: for clients released together, when each of them had its first byte.
    /// A client task scheduled late thus cannot look faster than the origin.
    pub ttfb_from_release: Latency,
    /// Errors over all timed rounds, not only the median one.
    pub errors: usize,
    pub warmup_errors: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub hashed: usize,
    pub reconnects: u64,
    /// Resources of the median round.
    pub usage: Option<Usage>,
    /// Peaks over every timed round.
    pub peak_rss_mb: Option<f64>,
    pub peak_uss_mb: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub url: String,
    pub expect_len: Option<u64>,
    pub global_warmup_errors: usize,
    pub levels: Vec<LevelReport>,
    pub skipped_levels: Vec<usize>,
    pub elapsed_s: f64,
}

struct RoundResult {
    outcomes: Vec<Outcome>,
    /// The release instant: the earliest of the requests' starts and the round's own clock.
    released: Instant,
    wall: Duration,
    usage: Option<Usage>,
}

/// Releases one request on each connection at the same instant and waits for all of them.
async fn run_round(
    pool: &mut Vec<Conn>,
    expect: &Arc<Expect>,
    hash_every: usize,
    cfg: &Config,
    sample: bool,
) -> RoundResult {
    let c = pool.len();
    let barrier = Arc::new(Barrier::new(c + 1));
    let mut tasks = Vec::with_capacity(c);
    for (i, mut conn) in pool.drain(..).enumerate() {
        let barrier = barrier.clone();
        let expect = expect.clone();
        let hash = hash_every > 0 && i % hash_every == 0;
        let timeout = cfg.timeout;
        tasks.push(tokio::spawn(async move {
            // Connect (or confirm keep-alive) before the release so the round times requests only.
            let _ = conn.ready().await;
            barrier.wait().await;
            let outcome = conn.get(&expect, hash, timeout).await;
            (conn, outcome)
        }));
    }
    let sampler = match (sample, cfg.pid) {
        (true, Some(pid)) => Some(Background::run(
            TreeSampler::start(pid),
            cfg.sample_interval,
        )),
        _ => None,
    };
    barrier.wait().await;
    let start = Instant::now();
    let mut outcomes = Vec::with_capacity(c);
    for t in tasks {
        if let Ok((conn, outcome)) = t.await {
            pool.push(conn);
            outcomes.push(outcome);
        }
    }
    let wall = start.elapsed();
    let released = outcomes.iter().map(|o| o.started).fold(start, Instant::min);
    RoundResult {
        outcomes,
        released,
        wall,
        usage: sampler.map(Background::stop),
    }
}

fn resize(pool: &mut Vec<Conn>, c: usize, target: &Arc<Target>) {
    pool.truncate(c);
    while pool.len() < c {
        pool.push(Conn::with_index(target.clone(), pool.len()));
    }
}

fn count_errors(outcomes: &[Outcome], kinds: &mut BTreeMap<String, usize>) -> usize {
    let mut n = 0;
    for e in outcomes.iter().filter_map(|o| o.error.as_ref()) {
        *kinds.entry(e.clone()).or_default() += 1;
        n += 1;
    }
    n
}

pub async fn run(url: &str, target: Arc<Target>, expect: Expect, cfg: Config) -> Report {
    let started = Instant::now();
    let expect = Arc::new(expect);
    let mut pool: Vec<Conn> = Vec::new();
    let mut global_kinds = BTreeMap::new();
    let mut global_warmup_errors = 0;
    resize(&mut pool, cfg.global_warmup_c, &target);
    for _ in 0..cfg.global_warmup {
        let r = run_round(&mut pool, &expect, 1, &cfg, false).await;
        global_warmup_errors += count_errors(&r.outcomes, &mut global_kinds);
    }

    let mut levels = Vec::new();
    let mut skipped_levels = Vec::new();
    for &c in &cfg.levels {
        if started.elapsed() > cfg.max_secs {
            skipped_levels.push(c);
            continue;
        }
        resize(&mut pool, c, &target);
        let mut kinds = BTreeMap::new();
        let mut warmup_errors = 0;
        let mut hashed = 0;
        for _ in 0..cfg.warmup {
            let r = run_round(&mut pool, &expect, 1, &cfg, false).await;
            warmup_errors += count_errors(&r.outcomes, &mut kinds);
            hashed += r.outcomes.iter().filter(|o| o.hashed).count();
        }
        let mut timed = Vec::with_capacity(cfg.rounds);
        for _ in 0..cfg.rounds.max(1) {
            timed.push(run_round(&mut pool, &expect, cfg.hash_every, &cfg, true).await);
        }
        levels.push(summarise_level(
            c,
            timed,
            kinds,
            warmup_errors,
            hashed,
            &pool,
        ));
    }
    Report {
        mode: "batch",
        url: url.to_string(),
        expect_len: expect.len,
        global_warmup_errors,
        levels,
        skipped_levels,
        elapsed_s: started.elapsed().as_secs_f64(),
    }
}

fn summarise_level(
    c: usize,
    timed: Vec<RoundResult>,
    mut kinds: BTreeMap<String, usize>,
    warmup_errors: usize,
    mut hashed: usize,
    pool: &[Conn],
) -> LevelReport {
    let mut errors = 0;
    let mut rounds = Vec::with_capacity(timed.len());
    for r in &timed {
        let e = count_errors(&r.outcomes, &mut kinds);
        errors += e;
        hashed += r.outcomes.iter().filter(|o| o.hashed).count();
        let bytes: u64 = r.outcomes.iter().filter(|o| o.ok()).map(|o| o.bytes).sum();
        let wall_s = r.wall.as_secs_f64();
        rounds.push(RoundSummary {
            wall_s,
            ok: r.outcomes.len() - e,
            errors: e,
            bytes,
            throughput_mb_s: if wall_s > 0.0 {
                bytes as f64 / wall_s / 1e6
            } else {
                0.0
            },
        });
    }
    let mut order: Vec<usize> = (0..timed.len()).collect();
    order.sort_by(|a, b| timed[*a].wall.cmp(&timed[*b].wall));
    let median = order[order.len() / 2];
    let med = &timed[median];
    let ok: Vec<&Outcome> = med.outcomes.iter().filter(|o| o.ok()).collect();
    let totals: Vec<Duration> = ok.iter().map(|o| o.total).collect();
    let ttfbs: Vec<Duration> = ok.iter().map(|o| o.ttfb).collect();
    let from_release: Vec<Duration> = ok
        .iter()
        .map(|o| (o.started + o.ttfb).saturating_duration_since(med.released))
        .collect();
    let peak = |f: fn(&Usage) -> f64| {
        timed
            .iter()
            .filter_map(|r| r.usage.as_ref().map(f))
            .reduce(f64::max)
    };
    LevelReport {
        c,
        median_round: median,
        wall_min_s: timed[order[0]].wall.as_secs_f64(),
        wall_max_s: timed[order[order.len() - 1]].wall.as_secs_f64(),
        throughput_mb_s: rounds[median].throughput_mb_s,
        latency: Latency::from_samples(&totals),
        ttfb: Latency::from_samples(&ttfbs),
        ttfb_from_release: Latency::from_samples(&from_release),
        errors,
        warmup_errors,
        error_kinds: kinds,
        hashed,
        reconnects: pool.iter().map(|c| c.reconnects).sum(),
        usage: med.usage.clone(),
        peak_rss_mb: peak(|u| u.peak_rss_mb),
        peak_uss_mb: peak(|u| u.peak_uss_mb),
        rounds,
    }
}
