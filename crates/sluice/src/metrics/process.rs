//! The standard `process_*` metrics (CPU, memory, file descriptors, start time), read from /proc at
//! scrape time; a few lines of parsing instead of a crate that would pull a process-inspection stack.

use std::fmt::Write;

/// Appends the `process_*` families in OpenMetrics text. Families whose source cannot be read
/// (not Linux, /proc hidden) are left out rather than reported as zero.
pub fn render(out: &mut String) {
    let ticks = clock_ticks();
    if let Some(stat) = read_stat() {
        if let Some(ticks) = ticks {
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            family(
                out,
                "process_cpu_seconds",
                "counter",
                "User and system CPU time spent in seconds.",
                "process_cpu_seconds_total",
                cpu,
            );
            if let Some(boot) = boot_time() {
                let start = boot as f64 + stat.starttime as f64 / ticks;
                family(
                    out,
                    "process_start_time_seconds",
                    "gauge",
                    "Start time of the process since unix epoch in seconds.",
                    "process_start_time_seconds",
                    start,
                );
            }
        }
        let page = page_size();
        family(
            out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            "process_resident_memory_bytes",
            (stat.rss * page) as f64,
        );
        family(
            out,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            "process_virtual_memory_bytes",
            stat.vsize as f64,
        );
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries; it is gone once counting is done.
        let open = dir.count().saturating_sub(1);
        family(
            out,
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            "process_open_fds",
            open as f64,
        );
    }
    if let Some(max) = max_fds() {
        family(
            out,
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            "process_max_fds",
            max as f64,
        );
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, sample: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{sample} {value}");
}

#[derive(Debug, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    starttime: u64,
    vsize: u64,
    rss: u64,
}

fn read_stat() -> Option<Stat> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// `/proc/<pid>/stat`: the command name is in parentheses and may hold spaces or parentheses, so
/// fields are counted from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0 here.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: num(14)?,
        stime: num(15)?,
        starttime: num(22)?,
        vsize: num(23)?,
        rss: num(24)?,
    })
}

fn boot_time() -> Option<u64> {
    std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf only reads a system constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (t > 0).then_some(t as f64)
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

fn max_fds() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some(lim.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_a_hostile_command_name() {
        let line = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 \
                    12345 1000000 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                utime: 250,
                stime: 50,
                starttime: 12345,
                vsize: 1_000_000,
                rss: 300
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn renders_this_process() {
        let mut out = String::new();
        render(&mut out);
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(out.contains(name), "{name} in {out}");
        }
    }
}
