//! The run's report: outcomes per front end and per fault, bytes verified, resource trends and
//! every 10 s sample, as Markdown; and the verdict (unexplained failures or a leak fail the run).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::faults::Window;
use crate::record::{Front, Outcome};
use crate::sampler::{Sample, Trend};

pub struct Summary<'a> {
    pub header: String,
    pub outcomes: &'a [Outcome],
    pub windows: &'a [Window],
    pub samples: &'a [Sample],
    pub trends: &'a [Trend],
    pub reloads: (u32, u32),
    pub checks: &'a [(String, bool)],
    pub metrics: &'a [String],
}

/// The window that explains a failure, if any.
pub fn explain<'w>(o: &Outcome, windows: &'w [Window]) -> Option<&'w Window> {
    windows.iter().find(|w| w.explains(o.front, o.start, o.end))
}

pub fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / 1048576.0)
}

impl Summary<'_> {
    pub fn unexplained(&self) -> Vec<&Outcome> {
        self.outcomes
            .iter()
            .filter(|o| o.error.is_some() && explain(o, self.windows).is_none())
            .collect()
    }

    pub fn passed(&self) -> bool {
        self.unexplained().is_empty()
            && self.trends.iter().all(|t| t.flat)
            && self.checks.iter().all(|c| c.1)
    }

    pub fn markdown(&self, all_samples: bool) -> String {
        let mut m = String::new();
        let _ = writeln!(m, "{}\n", self.header);
        let _ = writeln!(
            m,
            "Verdict: **{}**\n",
            if self.passed() { "pass" } else { "FAIL" }
        );
        self.outcome_table(&mut m);
        self.fault_table(&mut m);
        self.resource_table(&mut m);
        let _ = writeln!(m, "| check | result |\n|---|---|");
        let _ = writeln!(
            m,
            "| reloads: valid applied / invalid refused (with the old config still serving) | {} / {} |",
            self.reloads.0, self.reloads.1
        );
        for (name, ok) in self.checks {
            let _ = writeln!(m, "| {name} | {} |", if *ok { "yes" } else { "**no**" });
        }
        let un = self.unexplained();
        if !un.is_empty() {
            let _ = writeln!(m, "\nUnexplained failures (first 40 of {}):\n", un.len());
            for o in un.iter().take(40) {
                let _ = writeln!(
                    m,
                    "- {:.1}–{:.1} s {}: {}",
                    o.start,
                    o.end,
                    o.front.name(),
                    o.error.as_deref().unwrap_or("")
                );
            }
        }
        if !self.metrics.is_empty() {
            let _ = writeln!(
                m,
                "\nsluice's own counters at the end (evidence that the faults reached it):\n\n```"
            );
            for l in self.metrics {
                let _ = writeln!(m, "{l}");
            }
            let _ = writeln!(m, "```");
        }
        if all_samples {
            let _ = writeln!(m, "\nSamples every 10 s:\n\n| t (s) | RSS MiB | USS MiB | fds | threads | client connections |\n|---:|---:|---:|---:|---:|---:|");
            for s in self.samples {
                let _ = writeln!(
                    m,
                    "| {:.0} | {} | {} | {} | {} | {} |",
                    s.t,
                    mib(s.rss_kib * 1024),
                    mib(s.uss_kib * 1024),
                    s.fds,
                    s.threads,
                    s.tasks.map_or("–".into(), |t| t.to_string())
                );
            }
        }
        m
    }

    fn outcome_table(&self, m: &mut String) {
        let _ = writeln!(
            m,
            "| front end | operations | ok | failed, explained | failed, unexplained | MiB verified | failure kinds |\n|---|---:|---:|---:|---:|---:|---|"
        );
        for f in Front::ALL {
            let os: Vec<&Outcome> = self.outcomes.iter().filter(|o| o.front == f).collect();
            let ok = os.iter().filter(|o| o.error.is_none()).count();
            let expl = os
                .iter()
                .filter(|o| o.error.is_some() && explain(o, self.windows).is_some())
                .count();
            let bytes: u64 = os
                .iter()
                .filter(|o| o.error.is_none())
                .map(|o| o.bytes)
                .sum();
            let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
            for o in &os {
                if let Some(e) = &o.error {
                    *kinds.entry(short(e)).or_default() += 1;
                }
            }
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            let _ = writeln!(
                m,
                "| {} | {} | {ok} | {expl} | {} | {} | {} |",
                f.name(),
                os.len(),
                os.len() - ok - expl,
                mib(bytes),
                kinds.join(", ")
            );
        }
        m.push('\n');
    }

    fn fault_table(&self, m: &mut String) {
        let mut by_kind: BTreeMap<&str, (usize, f64, BTreeMap<&str, usize>)> = BTreeMap::new();
        for w in self.windows {
            let e = by_kind.entry(w.kind.name()).or_default();
            e.0 += 1;
            e.1 += w.end - w.start;
        }
        for o in self.outcomes.iter().filter(|o| o.error.is_some()) {
            if let Some(w) = explain(o, self.windows) {
                *by_kind
                    .entry(w.kind.name())
                    .or_default()
                    .2
                    .entry(o.front.name())
                    .or_default() += 1;
            }
        }
        let _ = writeln!(m, "| fault | windows | seconds | failures it explains, by front end |\n|---|---:|---:|---|");
        for (k, (n, secs, fronts)) in by_kind {
            let f: Vec<String> = fronts.iter().map(|(f, n)| format!("{f} {n}")).collect();
            let _ = writeln!(
                m,
                "| {k} | {n} | {secs:.0} | {} |",
                if f.is_empty() {
                    "none".into()
                } else {
                    f.join(", ")
                }
            );
        }
        m.push('\n');
    }

    fn resource_table(&self, m: &mut String) {
        let _ = writeln!(
            m,
            "| resource (after warm-up) | first third, median | last third, median | max | flat |\n|---|---:|---:|---:|---|"
        );
        for t in self.trends {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} |",
                t.name,
                t.first,
                t.last,
                t.max,
                if t.flat { "yes" } else { "**no**" }
            );
        }
        m.push('\n');
    }
}

/// A failure kind without the counts that make each one unique (status codes are kept).
fn short(e: &str) -> String {
    let mut out = Vec::new();
    let mut keep_next = false;
    for w in e.split(' ') {
        if keep_next || !w.chars().any(|c| c.is_ascii_digit()) {
            out.push(w.to_string());
        } else {
            out.push("N".to_string());
        }
        keep_next = w == "status";
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::Kind;

    fn fail(front: Front, start: f64, end: f64) -> Outcome {
        Outcome {
            front,
            start,
            end,
            bytes: 0,
            error: Some("status 502".into()),
        }
    }

    #[test]
    fn a_failure_counts_as_explained_only_inside_a_window_of_a_kind_that_causes_it() {
        let windows = [
            Window {
                kind: Kind::OriginReset,
                start: 100.0,
                end: 110.0,
            },
            Window {
                kind: Kind::ServerKilled,
                start: 200.0,
                end: 210.0,
            },
        ];
        // In the window, in its grace, and a long request that began before it.
        for o in [
            fail(Front::Stream, 105.0, 105.5),
            fail(Front::Hls, 119.0, 119.5),
            fail(Front::Dash, 90.0, 101.0),
        ] {
            assert!(explain(&o, &windows).is_some(), "{o:?}");
        }
        // A TCP session cut when its server was killed.
        assert!(explain(&fail(Front::Tcp, 199.5, 200.0), &windows).is_some());
        assert!(explain(&fail(Front::Tcp, 200.1, 200.1), &windows).is_some());
        // After the grace; a path the fault cannot reach; a request begun after the kill.
        for o in [
            fail(Front::Stream, 121.0, 121.5),
            fail(Front::Tcp, 105.0, 106.0),
            fail(Front::ReversePlain, 205.0, 205.1),
        ] {
            assert!(explain(&o, &windows).is_none(), "{o:?}");
        }
        let outcomes = [
            fail(Front::Stream, 105.0, 105.5),
            fail(Front::Tcp, 105.0, 106.0),
        ];
        let s = Summary {
            header: String::new(),
            outcomes: &outcomes,
            windows: &windows,
            samples: &[],
            trends: &[],
            reloads: (0, 0),
            checks: &[],
            metrics: &[],
        };
        assert_eq!(s.unexplained().len(), 1);
        assert!(!s.passed());
        assert!(s
            .markdown(false)
            .contains("| [[tcp]] relay | 1 | 0 | 0 | 1 |"));
        assert_eq!(short("length 17 of 4096"), "length N of N");
        assert_eq!(short("playlist: status 502"), "playlist: status 502");
    }
}
