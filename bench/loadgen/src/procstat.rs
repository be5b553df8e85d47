//! /proc sampler: CPU time and memory of a process tree, plus machine-wide CPU, over a window.
//!
//! CPU is measured as the delta of utime+stime (per-process counters that include every thread)
//! between the first and last sample of each process in the tree, so the figure is work done in
//! the window, not a lifetime average like `ps pcpu`. Memory is the peak over samples of the
//! tree's summed RSS and USS (Private_Clean + Private_Dirty from smaps_rollup), and of its
//! anonymous memory (heap, stacks: what cannot be dropped and re-read from the binary).

use serde::Serialize;
use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the tree and the machine used during one window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    pub root_pid: u32,
    pub wall_s: f64,
    /// CPU seconds (user + system) of the process tree.
    pub cpu_s: f64,
    /// `cpu_s / wall_s * 100`: 100 means one core busy for the whole window.
    pub cpu_pct: f64,
    pub peak_rss_mb: f64,
    pub peak_uss_mb: f64,
    /// Peak of `Anonymous` from smaps_rollup: USS minus the program's own file pages.
    pub peak_anon_mb: f64,
    /// Largest number of processes seen in the tree.
    pub procs: usize,
    pub samples: usize,
    /// Machine-wide busy CPU seconds (everything but idle and iowait), softirq included.
    pub sys_busy_s: f64,
    pub sys_softirq_s: f64,
    /// Busy share of the whole machine's capacity, 0–100.
    pub sys_busy_pct: f64,
}

/// Machine-wide CPU counters from the first line of /proc/stat, in clock ticks.
#[derive(Debug, Clone, Copy, Default)]
struct CpuTotals {
    busy: u64,
    softirq: u64,
}

fn read_cpu_totals() -> CpuTotals {
    let text = fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = text.lines().next().unwrap_or_default();
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
    // counted in user, so only the first eight fields are summed.
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    CpuTotals {
        busy: total.saturating_sub(idle),
        softirq: v.get(6).copied().unwrap_or(0),
    }
}

/// `(ppid, utime + stime)` of one process, from /proc/PID/stat.
fn read_stat(pid: u32) -> Option<(u32, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// `(rss_kb, uss_kb, anon_kb)` of one process, from /proc/PID/smaps_rollup.
fn read_memory(pid: u32) -> Option<(u64, u64, u64)> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let (mut rss, mut uss, mut anon) = (0, 0, 0);
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let key = parts.next().unwrap_or_default();
        let kb: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match key {
            "Rss:" => rss = kb,
            "Private_Clean:" | "Private_Dirty:" => uss += kb,
            "Anonymous:" => anon = kb,
            _ => {}
        }
    }
    Some((rss, uss, anon))
}

/// USS (KiB) of the process tree of `root` now: its own and every live descendant's.
pub fn tree_uss_kb(root: u32) -> u64 {
    tree_ticks(root)
        .iter()
        .filter_map(|(pid, _)| read_memory(*pid))
        .map(|(_, uss, _)| uss)
        .sum()
}

/// The root and all its live descendants, found by walking ppid links over /proc/*/stat.
/// Returns each member with its CPU ticks.
fn tree_ticks(root: u32) -> Vec<(u32, u64)> {
    let mut all: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, ticks)) = read_stat(pid) {
                all.push((pid, ppid, ticks));
            }
        }
    }
    let mut members: Vec<(u32, u64)> = all
        .iter()
        .filter(|(pid, _, _)| *pid == root)
        .map(|(pid, _, t)| (*pid, *t))
        .collect();
    let mut i = 0;
    while i < members.len() {
        let parent = members[i].0;
        for (pid, ppid, ticks) in &all {
            if *ppid == parent && !members.iter().any(|(m, _)| m == pid) {
                members.push((*pid, *ticks));
            }
        }
        i += 1;
    }
    members
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPUs of the whole machine, from the per-CPU lines of /proc/stat (not this process's affinity
/// mask, which is one core when the load client is pinned).
fn machine_cpus() -> f64 {
    let text = fs::read_to_string("/proc/stat").unwrap_or_default();
    let n = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count();
    n.max(1) as f64
}

/// Accumulates samples of one process tree over a window.
pub struct TreeSampler {
    root: u32,
    started: Instant,
    sys_start: CpuTotals,
    first_ticks: HashMap<u32, u64>,
    last_ticks: HashMap<u32, u64>,
    peak_rss_kb: u64,
    peak_uss_kb: u64,
    peak_anon_kb: u64,
    procs: usize,
    samples: usize,
}

impl TreeSampler {
    /// Starts the window: the first sample is the baseline for every process alive now.
    pub fn start(root: u32) -> Self {
        let mut s = TreeSampler {
            root,
            started: Instant::now(),
            sys_start: read_cpu_totals(),
            first_ticks: HashMap::new(),
            last_ticks: HashMap::new(),
            peak_rss_kb: 0,
            peak_uss_kb: 0,
            peak_anon_kb: 0,
            procs: 0,
            samples: 0,
        };
        s.sample();
        s
    }

    /// Takes one sample. A process first seen after the start began inside the window, so its
    /// whole CPU time counts; a process that exits between samples loses its last interval.
    pub fn sample(&mut self) {
        let members = tree_ticks(self.root);
        let first_sample = self.samples == 0;
        let (mut rss, mut uss, mut anon) = (0, 0, 0);
        for (pid, ticks) in &members {
            let base = if first_sample { *ticks } else { 0 };
            self.first_ticks.entry(*pid).or_insert(base);
            self.last_ticks.insert(*pid, *ticks);
            if let Some((r, u, a)) = read_memory(*pid) {
                rss += r;
                uss += u;
                anon += a;
            }
        }
        self.peak_rss_kb = self.peak_rss_kb.max(rss);
        self.peak_uss_kb = self.peak_uss_kb.max(uss);
        self.peak_anon_kb = self.peak_anon_kb.max(anon);
        self.procs = self.procs.max(members.len());
        self.samples += 1;
    }

    /// Ends the window with a final sample.
    pub fn finish(mut self) -> Usage {
        self.sample();
        let wall = self.started.elapsed().as_secs_f64();
        let sys_end = read_cpu_totals();
        let hz = clock_ticks_per_sec();
        let ticks: u64 = self
            .last_ticks
            .iter()
            .map(|(pid, last)| last.saturating_sub(self.first_ticks[pid]))
            .sum();
        let cpu_s = ticks as f64 / hz;
        let sys_busy_s = sys_end.busy.saturating_sub(self.sys_start.busy) as f64 / hz;
        let pct = |x: f64, of: f64| if of > 0.0 { x / of * 100.0 } else { 0.0 };
        Usage {
            root_pid: self.root,
            wall_s: wall,
            cpu_s,
            cpu_pct: pct(cpu_s, wall),
            peak_rss_mb: self.peak_rss_kb as f64 / 1024.0,
            peak_uss_mb: self.peak_uss_kb as f64 / 1024.0,
            peak_anon_mb: self.peak_anon_kb as f64 / 1024.0,
            procs: self.procs,
            samples: self.samples,
            sys_busy_s,
            sys_softirq_s: sys_end.softirq.saturating_sub(self.sys_start.softirq) as f64 / hz,
            sys_busy_pct: pct(sys_busy_s, wall * machine_cpus()),
        }
    }
}

/// A sampler running on its own thread until `stop`.
pub struct Background {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Usage>,
}

impl Background {
    /// Keeps sampling an already started window every `interval` until `stop`.
    pub fn run(mut s: TreeSampler, interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::park_timeout(interval);
                if !flag.load(Ordering::Relaxed) {
                    s.sample();
                }
            }
            s.finish()
        });
        Background { stop, handle }
    }

    pub fn stop(self) -> Usage {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the sampler now so the window closes when the measured work does.
        self.handle.thread().unpark();
        self.handle.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_own_process() {
        let me = std::process::id();
        let s = TreeSampler::start(me);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let u = s.finish();
        assert!(u.procs >= 1);
        assert!(u.peak_rss_mb > 0.0);
        assert!(u.peak_uss_mb > 0.0 && u.peak_uss_mb <= u.peak_rss_mb);
        assert!(u.cpu_s >= 0.0 && u.wall_s > 0.0);
    }

    #[test]
    fn stat_line_with_spaces_in_name() {
        let me = std::process::id();
        let (ppid, _) = read_stat(me).expect("own stat");
        assert!(ppid > 0);
    }
}
