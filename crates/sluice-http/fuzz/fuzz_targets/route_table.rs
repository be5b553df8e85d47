//! A route table built from fuzzer-chosen patterns, then looked up with a fuzzer-chosen host and
//! path. Input lines: the host (empty: none), the path, then one route per line,
//! `host-pattern prefix`. The table is built exactly when every prefix passes `check_prefix`; its
//! answer is one of the routes added, whose host pattern and prefix match, and the one a plain
//! linear reading of the precedence rules picks: the exact host, then each matching wildcard
//! from the longest, then any host; in a tier the longest matching prefix, then the first
//! declared. `serves_host` and `entries` agree with the routes added.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_http::path::normalize_path;
use sluice_http::route::{check_prefix, normalize_host, HostPattern, RouteTable};

/// `prefix` matches `path` at a segment boundary.
fn under(prefix: &str, path: &str) -> bool {
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

/// The precedence rules, read route by route.
fn reference(routes: &[(HostPattern, String)], host: Option<&str>, path: &str) -> Option<usize> {
    let mut tiers: Vec<Vec<usize>> = Vec::new();
    if let Some(h) = host.map(normalize_host) {
        tiers.push(
            (0..routes.len())
                .filter(|&i| matches!(&routes[i].0, HostPattern::Exact(e) if *e == *h))
                .collect(),
        );
        let mut suffixes: Vec<&str> = routes
            .iter()
            .filter_map(|(p, _)| match p {
                HostPattern::Wildcard(s) if h.len() > s.len() && h.ends_with(s.as_str()) => {
                    Some(s.as_str())
                }
                _ => None,
            })
            .collect();
        suffixes.sort_by_key(|s| std::cmp::Reverse(s.len()));
        suffixes.dedup();
        for s in suffixes {
            tiers.push(
                (0..routes.len())
                    .filter(|&i| matches!(&routes[i].0, HostPattern::Wildcard(w) if w == s))
                    .collect(),
            );
        }
    }
    tiers.push(
        (0..routes.len())
            .filter(|&i| routes[i].0 == HostPattern::Any)
            .collect(),
    );
    for tier in tiers {
        let mut best: Option<usize> = None;
        for i in tier {
            if under(&routes[i].1, path)
                && best.is_none_or(|b| routes[i].1.len() > routes[b].1.len())
            {
                best = Some(i);
            }
        }
        if best.is_some() {
            return best;
        }
    }
    None
}

fn check(
    table: &RouteTable<usize>,
    routes: &[(HostPattern, String)],
    host: Option<&str>,
    path: &str,
) {
    let got = table.lookup(host, path).copied();
    assert_eq!(
        got,
        reference(routes, host, path),
        "{host:?} {path:?} {routes:?}"
    );
    assert_eq!(got, table.lookup(host, path).copied());
    if let Some(i) = got {
        assert!(i < routes.len());
        assert!(under(&routes[i].1, path));
        let h = host.map(normalize_host);
        match (&routes[i].0, h.as_deref()) {
            (HostPattern::Any, _) => {}
            (pattern, Some(h)) => assert!(pattern.matches(h), "{pattern:?} for {h:?}"),
            (pattern, None) => panic!("{pattern:?} answered a request without a host"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let (Some(host), Some(path)) = (lines.next(), lines.next()) else {
        return;
    };
    let host = (!host.is_empty()).then_some(host);
    let mut routes = Vec::new();
    let mut all_prefixes_ok = true;
    for line in lines.take(16) {
        let (pattern, prefix) = line.split_once(' ').unwrap_or(("", line));
        let Ok(pattern) = HostPattern::parse(pattern) else {
            continue;
        };
        all_prefixes_ok &= check_prefix(prefix).is_ok();
        routes.push((pattern, prefix.to_string()));
    }
    let built = RouteTable::build(
        routes
            .iter()
            .enumerate()
            .map(|(i, (h, p))| (h.clone(), p.clone(), i)),
    );
    assert_eq!(built.is_ok(), all_prefixes_ok, "{routes:?}");
    let routes: Vec<(HostPattern, String)> = routes
        .into_iter()
        .filter(|(_, p)| check_prefix(p).is_ok())
        .collect();
    let table = RouteTable::build(
        routes
            .iter()
            .enumerate()
            .map(|(i, (h, p))| (h.clone(), p.clone(), i)),
    )
    .expect("checked prefixes build");
    // Every route is in the table once.
    let mut listed: Vec<usize> = table.entries().into_iter().map(|(_, _, &i)| i).collect();
    listed.sort_unstable();
    assert_eq!(listed, (0..routes.len()).collect::<Vec<_>>());
    for (pattern, prefix, &i) in table.entries() {
        assert_eq!((&pattern, prefix), (&routes[i].0, routes[i].1.as_str()));
    }
    if let Some(h) = host {
        let n = normalize_host(h);
        let named = routes
            .iter()
            .any(|(p, _)| *p != HostPattern::Any && p.matches(&n));
        assert_eq!(table.serves_host(h), named, "{h:?}");
    }
    check(&table, &routes, host, path);
    check(&table, &routes, None, path);
    if let Ok(p) = normalize_path(path) {
        check(&table, &routes, host, &p);
    }
});
