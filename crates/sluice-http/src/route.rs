//! The route table: host pattern + path prefix → a target, built once from config, one lookup per
//! request. No I/O.
//!
//! Precedence (documented in `docs/reverse-proxy.md`):
//! 1. host: an exact host beats the longest matching `*.suffix` wildcard, which beats "any host";
//!    when no route of the more specific host matches the path, the next less specific host is tried;
//! 2. path: the longest matching prefix wins;
//! 3. ties (same host pattern, same prefix): the route declared first wins.
//!
//! A prefix ending in `/` matches every path under it; any other prefix matches itself exactly and
//! every path continuing with `/` (so `/api` serves `/api` and `/api/x` but never `/apix`).

use std::borrow::Cow;
use std::collections::HashMap;

/// Which hosts a route serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Every host (the route names none).
    Any,
    /// Exactly this host (lowercase, no port).
    Exact(String),
    /// `*.example.com`: every subdomain of `example.com` (stored as `.example.com`), not the apex.
    Wildcard(String),
}

/// A host pattern or path prefix that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("host pattern {0:?} is not a host name or `*.domain`")]
    BadHost(String),
    #[error(
        "path prefix {0:?} must start with `/` and contain no `.`/`..` segments or control bytes"
    )]
    BadPrefix(String),
}

impl HostPattern {
    /// Parses `example.com`, `*.example.com` or `*`/empty (any host).
    pub fn parse(text: &str) -> Result<HostPattern, RouteError> {
        let t = text.trim().to_ascii_lowercase();
        if t.is_empty() || t == "*" {
            return Ok(HostPattern::Any);
        }
        let (wild, name) = match t.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, t.clone()),
        };
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(RouteError::BadHost(text.to_string()));
        }
        Ok(if wild {
            HostPattern::Wildcard(format!(".{name}"))
        } else {
            HostPattern::Exact(name)
        })
    }

    /// Whether `host` (any case, no port) is one this pattern names.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => *h == host,
            HostPattern::Wildcard(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Any => f.write_str("*"),
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Wildcard(s) => write!(f, "*{s}"),
        }
    }
}

/// Checks a configured path prefix.
pub fn check_prefix(prefix: &str) -> Result<(), RouteError> {
    let ok = prefix.starts_with('/')
        && !prefix
            .bytes()
            .any(|b| b.is_ascii_control() || b == b' ' || b == b'?' || b == b'#')
        && !prefix.split('/').any(|s| s == "." || s == "..");
    if ok {
        Ok(())
    } else {
        Err(RouteError::BadPrefix(prefix.to_string()))
    }
}

/// Whether `path` (already normalised) lies under `prefix`.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    // A table tries each prefix in turn, and most differ from the path in their second byte
    // (the first segment's first letter): one byte compare rules those out before a slice
    // compare does.
    let (p, s) = (prefix.as_bytes(), path.as_bytes());
    if p.len() > s.len() || (p.len() > 1 && p[1] != s[1]) {
        return false;
    }
    match path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

/// One route as the table stores it.
#[derive(Debug, Clone)]
struct Entry<T> {
    prefix: String,
    order: usize,
    target: T,
}

/// Routes grouped by host pattern; within a host, sorted longest prefix first, then declaration order.
#[derive(Debug, Clone)]
pub struct RouteTable<T> {
    exact: HashMap<String, Vec<Entry<T>>>,
    /// Wildcard suffixes, longest (most specific) first.
    wildcard: Vec<(String, Vec<Entry<T>>)>,
    any: Vec<Entry<T>>,
}

impl<T> Default for RouteTable<T> {
    fn default() -> Self {
        RouteTable {
            exact: HashMap::new(),
            wildcard: Vec::new(),
            any: Vec::new(),
        }
    }
}

impl<T: Clone> RouteTable<T> {
    /// Builds the table from `(host, prefix, target)` in declaration order.
    pub fn build(
        routes: impl IntoIterator<Item = (HostPattern, String, T)>,
    ) -> Result<Self, RouteError> {
        let mut table = RouteTable::default();
        for (order, (host, prefix, target)) in routes.into_iter().enumerate() {
            check_prefix(&prefix)?;
            let entry = Entry {
                prefix,
                order,
                target,
            };
            match host {
                HostPattern::Any => table.any.push(entry),
                HostPattern::Exact(h) => table.exact.entry(h).or_default().push(entry),
                HostPattern::Wildcard(s) => {
                    match table.wildcard.iter_mut().find(|(w, _)| *w == s) {
                        Some((_, list)) => list.push(entry),
                        None => table.wildcard.push((s, vec![entry])),
                    }
                }
            }
        }
        let sort = |list: &mut Vec<Entry<T>>| {
            list.sort_by(|a, b| {
                b.prefix
                    .len()
                    .cmp(&a.prefix.len())
                    .then(a.order.cmp(&b.order))
            })
        };
        table.exact.values_mut().for_each(sort);
        table.wildcard.iter_mut().for_each(|(_, l)| sort(l));
        sort(&mut table.any);
        table.wildcard.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        Ok(table)
    }

    /// The route for `host` (any case, port allowed) and a normalised `path`.
    pub fn lookup(&self, host: Option<&str>, path: &str) -> Option<&T> {
        let host = host.map(normalize_host);
        if let Some(h) = host.as_deref() {
            if let Some(found) = self.exact.get(h).and_then(|l| pick(l, path)) {
                return Some(found);
            }
            for (suffix, list) in &self.wildcard {
                if h.len() > suffix.len() && h.ends_with(suffix.as_str()) {
                    if let Some(found) = pick(list, path) {
                        return Some(found);
                    }
                }
            }
        }
        pick(&self.any, path)
    }

    /// Whether any route names this host (exactly or by wildcard); "any host" routes do not count.
    pub fn serves_host(&self, host: &str) -> bool {
        let h = normalize_host(host);
        self.exact.contains_key(h.as_ref())
            || self
                .wildcard
                .iter()
                .any(|(s, _)| h.len() > s.len() && h.ends_with(s.as_str()))
    }

    /// Every route in precedence order: `(host pattern, prefix, target)`.
    pub fn entries(&self) -> Vec<(HostPattern, &str, &T)> {
        let mut out = Vec::new();
        let mut exact: Vec<_> = self.exact.iter().collect();
        exact.sort_by(|a, b| a.0.cmp(b.0));
        for (h, list) in exact {
            for e in list {
                out.push((HostPattern::Exact(h.clone()), e.prefix.as_str(), &e.target));
            }
        }
        for (s, list) in &self.wildcard {
            for e in list {
                out.push((
                    HostPattern::Wildcard(s.clone()),
                    e.prefix.as_str(),
                    &e.target,
                ));
            }
        }
        for e in &self.any {
            out.push((HostPattern::Any, e.prefix.as_str(), &e.target));
        }
        out
    }
}

/// Lowercases a `Host` value and drops its port and a trailing dot (`Example.COM.:80` → `example.com`);
/// a name already in lower case is borrowed, not copied.
pub fn normalize_host(host: &str) -> Cow<'_, str> {
    let h = host.trim();
    let name = if let Some(rest) = h.strip_prefix('[') {
        // IPv6 literal: keep the brackets' content.
        rest.split(']').next().unwrap_or("")
    } else {
        match h.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => h,
        }
    };
    let name = name.trim_end_matches('.');
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        Cow::Borrowed(name)
    }
}

fn pick<'a, T>(list: &'a [Entry<T>], path: &str) -> Option<&'a T> {
    list.iter()
        .find(|e| prefix_matches(&e.prefix, path))
        .map(|e| &e.target)
}

#[cfg(test)]
mod tests;
