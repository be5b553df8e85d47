//! The purges a node took from clients, kept (bounded) so that a peer that was away when one was
//! fanned out applies it when it is back: each node pulls every peer's log after the last entry
//! it applied, with each active check (docs/decisions/cache-cluster-purge.md).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One purge as it travels between nodes (fan-out and log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeOrder {
    /// `url`, `prefix` or `tag`.
    pub mode: String,
    /// The cache key the `PURGE` was sent to (url, prefix; tag purges carry it too).
    #[serde(default)]
    pub key: String,
    /// The route and host part of `key` (`purge::key_scope`): a tag purge stays within it. An
    /// order from a node that predates it has none, and is scoped by its `key` instead.
    #[serde(default)]
    pub scope: String,
    /// At most `purge::MAX_TAGS` (a client's purge naming more is refused), each within the
    /// request head's bound: with the entry count, what bounds the log's size.
    #[serde(default)]
    pub tags: Vec<String>,
    pub soft: bool,
    /// When the node that took it from a client did (Unix milliseconds).
    pub at_ms: u64,
}

/// A logged purge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogEntry {
    pub seq: u64,
    #[serde(flatten)]
    pub order: PurgeOrder,
}

/// What a peer's log holds after a point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogPage {
    /// Changes when the process restarts: sequence numbers start over.
    pub boot: u64,
    /// The oldest sequence number still held (a reader behind it missed some).
    pub first: u64,
    pub entries: Vec<LogEntry>,
    /// How long the answering node's cluster part has run (milliseconds), so every node ramps
    /// it up from the same moment it ramps itself (`ring`); 0 from a node that does not say.
    #[serde(default)]
    pub up_ms: u64,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The bounded log.
pub struct PurgeLog {
    boot: u64,
    cap: usize,
    inner: Mutex<(u64, VecDeque<LogEntry>)>,
}

/// Entries one pull returns at most.
const PAGE: usize = 1000;

/// Bytes of JSON one page's entries take at most (past one entry): a quarter of what a puller
/// takes (`peer::MAX_CONTROL_ANSWER`). A thousand tag purges each near the head's bound (JSON
/// doubles a backslash) would otherwise make a page every pull refuses, keeping this node out
/// of every ring until they leave the log.
const PAGE_BYTES: usize = 16 << 20;

/// Counts the bytes written to it (an entry's JSON size without keeping the text).
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How many bytes `entry` takes in a page's JSON (and the comma after it).
fn json_size(entry: &LogEntry) -> usize {
    let mut n = Counter(1);
    // Writing to a counter cannot fail, nor can serialising plain strings and numbers.
    let _ = serde_json::to_writer(&mut n, entry);
    n.0
}

impl PurgeLog {
    pub fn new(cap: usize) -> PurgeLog {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        PurgeLog {
            boot: u64::from_le_bytes(b) >> 1 | 1,
            cap,
            inner: Mutex::new((1, VecDeque::new())),
        }
    }

    /// Adds an order, dropping the oldest past the cap. Entries are bounded in number here and
    /// each in size by what it may hold (`PurgeOrder::tags`), so the log's memory is bounded.
    pub fn append(&self, order: PurgeOrder) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seq = g.0;
        g.0 += 1;
        g.1.push_back(LogEntry { seq, order });
        while g.1.len() > self.cap {
            g.1.pop_front();
        }
    }

    /// The entries after `after` of boot `boot` (all held ones for another boot), at most a page:
    /// [`PAGE`] entries, and no more than [`PAGE_BYTES`] of them unless the first is larger
    /// (the puller asks again after the last one it got).
    pub fn page(&self, boot: u64, after: u64) -> LogPage {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let after = if boot == self.boot { after } else { 0 };
        LogPage {
            boot: self.boot,
            first: g.1.front().map_or(g.0, |e| e.seq),
            entries: {
                let mut bytes = 0;
                g.1.iter()
                    .filter(|e| e.seq > after)
                    .take(PAGE)
                    .take_while(|e| {
                        let first = bytes == 0;
                        bytes += json_size(e);
                        first || bytes <= PAGE_BYTES
                    })
                    .cloned()
                    .collect()
            },
            up_ms: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(key: &str) -> PurgeOrder {
        PurgeOrder {
            mode: "url".into(),
            key: key.into(),
            scope: String::new(),
            tags: vec![],
            soft: false,
            at_ms: 1,
        }
    }

    #[test]
    fn pages_follow_sequence_and_boot() {
        let log = PurgeLog::new(3);
        for k in ["a", "b", "c", "d"] {
            log.append(order(k));
        }
        let all = log.page(0, 0);
        assert_eq!(all.first, 2, "the oldest went over the cap");
        let keys: Vec<&str> = all.entries.iter().map(|e| e.order.key.as_str()).collect();
        assert_eq!(keys, ["b", "c", "d"]);
        let rest = log.page(all.boot, 3);
        assert_eq!(rest.entries.len(), 1);
        assert_eq!(rest.entries[0].order.key, "d");
        // A reader that knew another boot gets everything held.
        assert_eq!(log.page(all.boot ^ 2, 3).entries.len(), 3);
        let json = serde_json::to_string(&rest).unwrap();
        let back: LogPage = serde_json::from_str(&json).unwrap();
        assert_eq!(back.entries[0].order, order("d"));
    }

    /// An order from a node that predates scopes still parses (with none); a node that predates
    /// them reads a new one, ignoring the scope.
    #[test]
    fn orders_without_a_scope_parse() {
        let old = r#"{"mode":"tag","key":"3:web1:a|/","tags":["t"],"soft":false,"at_ms":5}"#;
        let order: PurgeOrder = serde_json::from_str(old).unwrap();
        assert_eq!(order.scope, "");
        assert_eq!(order.key, "3:web1:a|/");
        let json = serde_json::to_value(PurgeOrder {
            scope: "3:web1:a|".into(),
            ..order
        })
        .unwrap();
        assert_eq!(json["scope"], "3:web1:a|");
    }

    /// A page of tag purges full of backslashes (JSON doubles them) stays within what a puller
    /// takes, and the next pull goes on after it: every entry arrives, in order.
    #[test]
    fn a_page_is_bounded_in_bytes() {
        let log = PurgeLog::new(1000);
        // 63 KiB of backslashes, 126 KiB of JSON: a thousand made a 125 MiB page.
        let tag = "\\".repeat(63 << 10);
        for i in 0..1000 {
            log.append(PurgeOrder {
                mode: "tag".into(),
                tags: vec![tag.clone()],
                ..order(&format!("k{i}"))
            });
        }
        let mut after = 0;
        let mut got = Vec::new();
        let mut boot = 0;
        while got.len() < 1000 {
            let page = log.page(boot, after);
            let json = serde_json::to_vec(&page).unwrap();
            assert!(json.len() <= PAGE_BYTES + 4096, "{} bytes", json.len());
            assert!(json.len() < super::super::peer::MAX_CONTROL_ANSWER);
            assert!(!page.entries.is_empty());
            boot = page.boot;
            after = page.entries.last().unwrap().seq;
            got.extend(page.entries.into_iter().map(|e| e.order.key));
        }
        let want: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
        assert_eq!(got, want);
        assert!(log.page(boot, after).entries.is_empty());
        // One entry larger than the bound still goes, alone.
        let big = PurgeLog::new(4);
        for _ in 0..2 {
            big.append(PurgeOrder {
                mode: "tag".into(),
                tags: vec!["\\".repeat(PAGE_BYTES / 2 + 1)],
                ..order("k")
            });
        }
        assert_eq!(big.page(0, 0).entries.len(), 1);
    }
}
