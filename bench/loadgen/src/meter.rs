//! Window meters for budget runs: a CPU cgroup's own accounting (`cpuacct.usage` in nanoseconds
//! under cgroup v1, `usage_usec` of `cpu.stat` under v2) and how busy one core was, from its line
//! of /proc/stat.

use serde::Serialize;
use std::fs;

/// What the meters read over one window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Window {
    /// CPU the cgroup used in the window, in microseconds (None without `--cgroup-usage`).
    pub cgroup_cpu_us: Option<f64>,
    /// Busy share (0–100) of the client's core in the window (None without `--client-core`).
    pub client_core_busy_pct: Option<f64>,
}

/// Readings at the start of a window.
pub struct Meter {
    cgroup: Option<String>,
    core: Option<usize>,
    cgroup_start: Option<u64>,
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

impl Meter {
    pub fn start(cgroup: Option<String>, core: Option<usize>) -> Self {
        Meter {
            cgroup_start: cgroup.as_deref().and_then(cgroup_ns),
            core_start: core.and_then(core_ticks),
            cgroup,
            core,
        }
    }

    pub fn finish(self) -> Window {
        let cgroup_cpu_us = match (
            self.cgroup.as_deref().and_then(cgroup_ns),
            self.cgroup_start,
        ) {
            (Some(end), Some(start)) => Some(end.saturating_sub(start) as f64 / 1e3),
            _ => None,
        };
        let client_core_busy_pct = match (self.core.and_then(core_ticks), self.core_start) {
            (Some((b1, t1)), Some((b0, t0))) if t1 > t0 => {
                Some((b1 - b0) as f64 * 100.0 / (t1 - t0) as f64)
            }
            _ => None,
        };
        Window {
            cgroup_cpu_us,
            client_core_busy_pct,
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
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn core_zero_is_read() {
        let (busy, total) = core_ticks(0).unwrap();
        assert!(busy <= total && total > 0);
    }
}
