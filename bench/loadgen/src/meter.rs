//! Window meters for budget runs: CPU cgroups' own accounting (`cpuacct.usage` in nanoseconds
//! under cgroup v1, `usage_usec` of `cpu.stat` under v2) for the proxy, the load client and the
//! origin, the proxy's kernel share (`cpuacct.usage_sys` / `usage_user` beside v1's
//! `cpuacct.usage`, `system_usec` / `user_usec` of v2's `cpu.stat`), and how busy one core was,
//! from its line of /proc/stat.

use serde::Serialize;
use std::fs;
use std::time::Instant;

/// What to meter over a window: usage files of the proxy's, the client's and the origin's CPU
/// cgroups, and the client's core.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    pub cgroup: Option<String>,
    pub client_cgroup: Option<String>,
    pub origin_cgroup: Option<String>,
    pub core: Option<usize>,
}

/// What the meters read over one window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    /// CPU the cgroup used in the window, in microseconds (None without `--cgroup-usage`).
    pub cgroup_cpu_us: Option<f64>,
    /// The kernel's share (0–100) of the proxy cgroup's CPU in the window: system time over
    /// system + user time, as the cgroup splits them (tick-sampled, so coarse for short windows).
    pub cgroup_sys_pct: Option<f64>,
    /// Busy share (0–100) of the client's core in the window (None without `--client-core`).
    pub client_core_busy_pct: Option<f64>,
    /// CPU the load client's own cgroup used, in % of one core over the window (None without
    /// `--client-cgroup-usage`): unlike the core's busy share, other work on the core is not in it.
    pub client_cpu_pct: Option<f64>,
    /// The same for the origin's cgroup (`--origin-cgroup-usage`).
    pub origin_cpu_pct: Option<f64>,
}

/// Readings at the start of a window.
pub struct Meter {
    spec: Spec,
    started: Instant,
    cgroup_start: Option<u64>,
    split_start: Option<(u64, u64)>,
    client_start: Option<u64>,
    origin_start: Option<u64>,
    core_start: Option<(u64, u64)>,
}

/// The cgroup's CPU use so far in nanoseconds: a bare number (v1 `cpuacct.usage`) or the
/// `usage_usec` line of a v2 `cpu.stat`.
fn cgroup_ns(path: &str) -> Option<u64> {
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim();
    if let Ok(ns) = text.parse::<u64>() {
        return Some(ns);
    }
    text.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|us| us * 1000)
}

/// The cgroup's `(system, user)` time so far in nanoseconds, from the files beside its usage
/// file: v1 `cpuacct.usage_sys` and `cpuacct.usage_user`, or v2 `cpu.stat`'s `system_usec` and
/// `user_usec`.
fn cgroup_split_ns(path: &str) -> Option<(u64, u64)> {
    let file = std::path::Path::new(path);
    if file.file_name()? == "cpu.stat" {
        let text = fs::read_to_string(file).ok()?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us * 1000)
        };
        return Some((field("system_usec ")?, field("user_usec ")?));
    }
    let read = |name: &str| -> Option<u64> {
        fs::read_to_string(file.with_file_name(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("cpuacct.usage_sys")?, read("cpuacct.usage_user")?))
}

/// `(busy, total)` ticks of one core from /proc/stat.
fn core_ticks(core: usize) -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/stat").ok()?;
    let name = format!("cpu{core}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// Nanoseconds a cgroup used since `start` (its reading at the window's start).
fn used_ns(path: Option<&str>, start: Option<u64>) -> Option<u64> {
    match (path.and_then(cgroup_ns), start) {
        (Some(end), Some(start)) => Some(end.saturating_sub(start)),
        _ => None,
    }
}

impl Meter {
    pub fn start(spec: &Spec) -> Self {
        let read = |p: &Option<String>| p.as_deref().and_then(cgroup_ns);
        Meter {
            cgroup_start: read(&spec.cgroup),
            split_start: spec.cgroup.as_deref().and_then(cgroup_split_ns),
            client_start: read(&spec.client_cgroup),
            origin_start: read(&spec.origin_cgroup),
            core_start: spec.core.and_then(core_ticks),
            started: Instant::now(),
            spec: spec.clone(),
        }
    }

    pub fn finish(self) -> Window {
        let wall_ns = self.started.elapsed().as_nanos().max(1) as f64;
        let pct = |used: Option<u64>| used.map(|ns| ns as f64 * 100.0 / wall_ns);
        let cgroup_cpu_us =
            used_ns(self.spec.cgroup.as_deref(), self.cgroup_start).map(|ns| ns as f64 / 1e3);
        let split_end = self.spec.cgroup.as_deref().and_then(cgroup_split_ns);
        let cgroup_sys_pct = match (self.split_start, split_end) {
            (Some((s0, u0)), Some((s1, u1))) => {
                let (sys, user) = (s1.saturating_sub(s0), u1.saturating_sub(u0));
                (sys + user > 0).then(|| sys as f64 * 100.0 / (sys + user) as f64)
            }
            _ => None,
        };
        let client_cpu_pct = pct(used_ns(
            self.spec.client_cgroup.as_deref(),
            self.client_start,
        ));
        let origin_cpu_pct = pct(used_ns(
            self.spec.origin_cgroup.as_deref(),
            self.origin_start,
        ));
        let client_core_busy_pct = match (self.spec.core.and_then(core_ticks), self.core_start) {
            (Some((b1, t1)), Some((b0, t0))) if t1 > t0 => {
                Some((b1 - b0) as f64 * 100.0 / (t1 - t0) as f64)
            }
            _ => None,
        };
        Window {
            cgroup_cpu_us,
            cgroup_sys_pct,
            client_core_busy_pct,
            client_cpu_pct,
            origin_cpu_pct,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_cgroup_formats() {
        let dir = std::env::temp_dir().join(format!("meter-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let v1 = dir.join("cpuacct.usage");
        fs::write(&v1, "123456789\n").unwrap();
        assert_eq!(cgroup_ns(v1.to_str().unwrap()), Some(123_456_789));
        let v2 = dir.join("cpu.stat");
        fs::write(&v2, "usage_usec 42\nuser_usec 40\nsystem_usec 2\n").unwrap();
        assert_eq!(cgroup_ns(v2.to_str().unwrap()), Some(42_000));
        assert_eq!(cgroup_split_ns(v2.to_str().unwrap()), Some((2_000, 40_000)));
        fs::write(dir.join("cpuacct.usage_sys"), "7\n").unwrap();
        fs::write(dir.join("cpuacct.usage_user"), "9\n").unwrap();
        assert_eq!(cgroup_split_ns(v1.to_str().unwrap()), Some((7, 9)));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn helper_groups_are_reported_in_percent_of_a_core() {
        let dir = std::env::temp_dir().join(format!("meter-pct-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let client = dir.join("client.usage");
        fs::write(&client, "1000\n").unwrap();
        let spec = Spec {
            client_cgroup: Some(client.to_str().unwrap().to_string()),
            ..Spec::default()
        };
        let meter = Meter::start(&spec);
        // 50 ms of CPU in a window of at least 100 ms: at most half a core.
        fs::write(&client, "50001000\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let w = meter.finish();
        let pct = w.client_cpu_pct.unwrap();
        assert!(pct > 0.0 && pct <= 50.0, "{pct}");
        assert!(w.origin_cpu_pct.is_none() && w.cgroup_cpu_us.is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn core_zero_is_read() {
        let (busy, total) = core_ticks(0).unwrap();
        assert!(busy <= total && total > 0);
    }
}
