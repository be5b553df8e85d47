//! Resource samples of the sluice process every 10 s: RSS and USS (`/proc/PID/smaps_rollup`), open
//! descriptors, threads, and the tasks sluice reports in `/metrics` when it has such a gauge; and
//! the flatness verdict over a run.

use std::net::SocketAddr;
use std::time::Duration;

use crate::client;

#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub t: f64,
    pub rss_kib: u64,
    pub uss_kib: u64,
    pub fds: u64,
    pub threads: u64,
    /// Open client connections from `/metrics` (sluice exports no task count; each connection is a task).
    pub tasks: Option<u64>,
}

fn field_kib(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One sample of process `pid`; None once it is gone.
pub async fn sample(pid: u32, t: f64, metrics: SocketAddr, task_metric: &str) -> Option<Sample> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    let tasks = if task_metric.is_empty() {
        None
    } else {
        metric_sum(metrics, task_metric).await
    };
    Some(Sample {
        t,
        rss_kib: field_kib(&smaps, "Rss:"),
        uss_kib: field_kib(&smaps, "Private_Clean:") + field_kib(&smaps, "Private_Dirty:"),
        fds,
        threads: field_kib(&status, "Threads:"),
        tasks,
    })
}

/// The lines of `/metrics` whose names start with one of `prefixes` (the report's evidence that the
/// faults reached sluice: dropped disk writes, accept pauses, ejections).
pub async fn metric_lines(addr: SocketAddr, prefixes: &[&str]) -> Vec<String> {
    let target = format!("/metrics?api_password={}", crate::sluice::PASSWORD);
    let Ok((200, body)) = client::get_body(addr, &target, Duration::from_secs(5)).await else {
        return vec!["(/metrics unavailable)".into()];
    };
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| prefixes.iter().any(|p| l.starts_with(p)))
        .map(str::to_string)
        .collect()
}

/// The sum of every series of one metric family in `/metrics`.
async fn metric_sum(addr: SocketAddr, name: &str) -> Option<u64> {
    let target = format!("/metrics?api_password={}", crate::sluice::PASSWORD);
    let (status, body) = client::get_body(addr, &target, Duration::from_secs(5))
        .await
        .ok()?;
    if status != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(&body);
    let mut sum = 0f64;
    let mut seen = false;
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            sum += v;
            seen = true;
        }
    }
    seen.then_some(sum as u64)
}

/// One resource's trend: the median of the first and last thirds after warm-up.
pub struct Trend {
    pub name: &'static str,
    pub first: u64,
    pub last: u64,
    pub max: u64,
    pub flat: bool,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Flat: the last third's median within `rel` (fraction) or `abs` of the first third's.
fn trend(
    name: &'static str,
    s: &[Sample],
    get: impl Fn(&Sample) -> Option<u64>,
    rel: f64,
    abs: u64,
) -> Option<Trend> {
    let v: Vec<u64> = s.iter().filter_map(&get).collect();
    if v.len() < 6 {
        return None;
    }
    let third = v.len() / 3;
    let first = median(v[..third].to_vec());
    let last = median(v[v.len() - third..].to_vec());
    let bound = ((first as f64 * rel) as u64).max(abs);
    Some(Trend {
        name,
        first,
        last,
        max: *v.iter().max().unwrap(),
        flat: last <= first + bound,
    })
}

/// Trends of every resource over the samples taken after `warmup` seconds.
pub fn trends(samples: &[Sample], warmup: f64) -> Vec<Trend> {
    let s: Vec<Sample> = samples.iter().copied().filter(|s| s.t >= warmup).collect();
    [
        trend("RSS (KiB)", &s, |x| Some(x.rss_kib), 0.25, 24 * 1024),
        trend("USS (KiB)", &s, |x| Some(x.uss_kib), 0.25, 24 * 1024),
        trend("open fds", &s, |x| Some(x.fds), 0.0, 48),
        // Tokio's blocking pool (disk-tier file I/O) starts threads on demand and ends them after
        // 10 s idle, so the count follows the disk work of the moment.
        trend("threads", &s, |x| Some(x.threads), 0.0, 12),
        trend("open client connections", &s, |x| x.tasks, 0.0, 64),
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(rss: impl Fn(u64) -> u64) -> Vec<Sample> {
        (0..30)
            .map(|i| Sample {
                t: i as f64 * 10.0,
                rss_kib: rss(i),
                fds: 30,
                threads: 8,
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn steady_growth_is_a_leak_and_noise_is_not() {
        let leak = trends(&run(|i| 100_000 + i * 4_000), 0.0);
        assert!(!leak.iter().find(|t| t.name == "RSS (KiB)").unwrap().flat);
        let noisy = trends(&run(|i| 100_000 + (i % 3) * 5_000), 0.0);
        assert!(noisy.iter().all(|t| t.flat));
    }
}
