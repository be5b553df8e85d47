//! Logging to stderr: the `RUST_LOG` filter (`level` and `target=level` directives), the
//! subscriber that formats one line per event, and the writer thread that takes the lines to
//! stderr so a stalled reader (journald, a paused pipe) never blocks the thread that logs.
//!
//! Hand-written rather than `tracing-subscriber`: sluice logs events and no spans, and its
//! registry, span storage and formatting layers were ~40 KB of the router build for that
//! (docs/decisions/footprint.md).

use std::fmt::{self, Write as _};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

use crate::atomic::AtomicU64;

/// The level used when `RUST_LOG` is unset, empty or invalid.
pub const DEFAULT: &str = "info";

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Which events are logged: a level per target prefix (the longest matching prefix decides) and
/// a level for everything else (off unless a bare level is given, as `target=level` alone means
/// "only this target").
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    default: LevelFilter,
    /// Longest prefix first.
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// Whether an event of `level` from `target` is logged.
    pub fn would_enable(&self, target: &str, level: &Level) -> bool {
        let max = self
            .targets
            .iter()
            .find(|(prefix, _)| target.starts_with(prefix.as_str()))
            .map_or(self.default, |(_, l)| *l);
        *level <= max
    }

    /// The most verbose level any directive lets through.
    pub fn max_level(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, LevelFilter::max)
    }
}

fn level(word: &str) -> Option<LevelFilter> {
    let i = LEVELS.iter().position(|l| l.eq_ignore_ascii_case(word))?;
    Some(
        [
            LevelFilter::TRACE,
            LevelFilter::DEBUG,
            LevelFilter::INFO,
            LevelFilter::WARN,
            LevelFilter::ERROR,
            LevelFilter::OFF,
        ][i],
    )
}

/// Parses a `RUST_LOG` value such as `info` or `warn,sluice::upstream=debug`. Spaces around
/// directives are ignored; an empty value means the default. A directive without `=` must be a
/// level: a bare word would otherwise be read as a target name and silence everything else (so
/// `warning` is an error, not a filter that prints nothing). The last directive for the same
/// target wins.
pub fn parse_filter(spec: &str) -> Result<Filter, String> {
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Ok(default_filter());
    }
    let mut filter = Filter {
        default: LevelFilter::OFF,
        targets: Vec::new(),
    };
    for d in directives {
        let bad = |why: &str| format!("invalid RUST_LOG {spec:?}: {d:?} {why}");
        match d.split_once('=') {
            None => {
                filter.default = level(d).ok_or_else(|| {
                    bad(&format!("is not a level (one of {})", LEVELS.join(", ")))
                })?;
            }
            Some((target, word)) => {
                let target = target.trim();
                if target.is_empty() || target.contains(|c: char| c.is_whitespace() || c == '[') {
                    return Err(bad(
                        "names no target (span and field filters are not supported)",
                    ));
                }
                let l = level(word.trim()).ok_or_else(|| {
                    bad(&format!(
                        "does not end in a level (one of {})",
                        LEVELS.join(", ")
                    ))
                })?;
                filter.targets.retain(|(t, _)| t != target);
                filter.targets.push((target.to_string(), l));
            }
        }
    }
    // Targets are unique (a repeated one replaced the earlier), and two of the same length
    // cannot both prefix one name: the order among equal lengths never matters, so the
    // smaller unstable sort does.
    filter
        .targets
        .sort_unstable_by_key(|(target, _)| std::cmp::Reverse(target.len()));
    Ok(filter)
}

/// The filter for `RUST_LOG` (`None` when unset), or the default and a warning to log.
pub fn filter_from(value: Option<&str>) -> (Filter, Option<String>) {
    match value.map(parse_filter) {
        None => (default_filter(), None),
        Some(Ok(filter)) => (filter, None),
        Some(Err(msg)) => (
            default_filter(),
            Some(format!("{msg}; using \"{DEFAULT}\"")),
        ),
    }
}

fn default_filter() -> Filter {
    Filter {
        default: LevelFilter::INFO,
        targets: Vec::new(),
    }
}

/// Writes each enabled event to stderr as one line:
/// `2026-11-23T07:20:00.123456Z  WARN sluice::server: message key=value`.
pub struct Logger {
    filter: Filter,
    /// Colour the level (stderr is a terminal).
    ansi: bool,
    /// Where the lines go; `None`: the process's stderr queue, started on the first event.
    out: Option<LineQueue>,
}

impl Logger {
    pub fn new(filter: Filter, ansi: bool) -> Self {
        Logger {
            filter,
            ansi,
            out: None,
        }
    }
}

impl Subscriber for Logger {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // The filter never changes, so each callsite's answer is cached by tracing.
        if self.enabled(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        meta.is_event() && self.filter.would_enable(meta.target(), meta.level())
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.filter.max_level())
    }

    // Spans are not recorded (sluice creates none; a dependency's would only add context).
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let line = format_line(SystemTime::now(), event, self.ansi);
        match &self.out {
            Some(queue) => queue.push(&line),
            None => to_stderr(&line),
        }
    }
}

/// Bytes of lines queued or being written before new ones are dropped: minutes of ordinary
/// logging, and a bound on what a stalled stderr can make the process hold.
const QUEUE_BYTES: usize = 1 << 20;

/// How long [`flush`] waits by default at exit; see its caller in `main.rs`.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The process's stderr queue: `None` once the writer thread could not be started.
static STDERR: OnceLock<Option<LineQueue>> = OnceLock::new();

/// Queues `line` for stderr, starting the writer on the first line. Without a writer thread
/// (the process is out of threads), written here as before: late is better than lost.
fn to_stderr(line: &str) {
    let queue = STDERR.get_or_init(|| LineQueue::start(Box::new(std::io::stderr())).ok());
    match queue {
        Some(queue) => queue.push(line),
        // One write per line, so concurrent events never interleave within a line; a failed
        // write (stderr closed) has nowhere to be reported.
        None => {
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
}

/// Waits until every line logged so far is written to stderr, at most `timeout`; false if some
/// were still waiting (stderr stalled). Call before the process exits: the lines logged just
/// before are what an operator reads when a start fails.
pub fn flush(timeout: Duration) -> bool {
    match STDERR.get() {
        Some(Some(queue)) => queue.flush(timeout),
        _ => true,
    }
}

/// Makes a panic write the lines queued before it first (at most [`PANIC_FLUSH`]), then the
/// panic's message through the hook installed before: with `panic = "abort"` (the router
/// build) nothing runs after the hook, and the lines just before a crash are the ones that
/// explain it. Waits by looking, never by blocking on the queue's lock, which the panicking
/// thread may hold.
pub fn flush_on_panic() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Only where a panic ends the process: unwinding, the runtime catches a task's panic
        // and goes on (a busy queue would hold that worker the whole wait), and an exit after
        // it flushes in `main`.
        if cfg!(panic = "abort") {
            if let Some(Some(queue)) = STDERR.get() {
                queue.drain_by_looking(PANIC_FLUSH);
            }
        }
        previous(info);
    }));
}

/// How long a panic waits for queued lines; see [`flush_on_panic`].
const PANIC_FLUSH: Duration = Duration::from_millis(500);

/// Lines waiting for a writer thread of their own, bounded in bytes. Logging is called on the
/// runtime's workers, and stderr under systemd is a pipe to journald: a write there blocks as
/// long as the reader does, and with it every worker that logs. Here a full queue drops the line
/// and counts it, and the writer says how many it lost where they were lost.
#[derive(Clone)]
struct LineQueue(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// Lines queued (or dropped) while the writer was idle.
    work: Condvar,
    /// A batch written: for [`LineQueue::flush`].
    written: Condvar,
}

#[derive(Default)]
struct State {
    /// The lines waiting, in order; the writer takes all of them as one write.
    lines: Vec<u8>,
    /// Bytes of the batch being written: they are held until written, so they count.
    writing: usize,
    /// Lines dropped since the writer last took a batch. While nonzero every line is dropped,
    /// so the count line the writer adds sits exactly where the lines are missing.
    dropped: u64,
    /// The writer is waiting for lines (so a push must wake it).
    idle: bool,
}

impl LineQueue {
    /// Starts the writer thread, writing to `out` (for the process: stderr). It lives as long as
    /// the process.
    fn start(out: Box<dyn Write + Send>) -> std::io::Result<LineQueue> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            written: Condvar::new(),
        });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name("sluice-log".into())
            .spawn(move || write_lines(&writer, out))?;
        Ok(LineQueue(shared))
    }

    /// Queues `line` (newline included); never waits for the writer.
    fn push(&self, line: &str) {
        let mut state = lock(&self.0.state);
        let room = QUEUE_BYTES.saturating_sub(state.lines.len() + state.writing);
        if state.dropped > 0 || line.len() > room {
            state.dropped += 1;
        } else {
            // Grown by doubling, but never past the bound: the bytes held are what was counted.
            let lines = &mut state.lines;
            if lines.capacity() - lines.len() < line.len() {
                let want = (lines.len() + line.len()).max(2 * lines.capacity());
                lines.reserve_exact(want.min(QUEUE_BYTES) - lines.len());
            }
            lines.extend_from_slice(line.as_bytes());
        }
        if state.idle {
            state.idle = false;
            self.0.work.notify_one();
        }
    }

    /// Waits until everything queued is written, at most `timeout`; false if not.
    /// [`LineQueue::flush`] for a panic hook: polls with `try_lock` every millisecond instead
    /// of waiting on the lock and the condition, so a thread that panicked holding the lock
    /// gives up after `timeout` instead of waiting for itself.
    fn drain_by_looking(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(state) = self.0.state.try_lock() {
                if state.lines.is_empty() && state.writing == 0 && state.dropped == 0 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = lock(&self.0.state);
        while !state.lines.is_empty() || state.writing > 0 || state.dropped > 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            state = self
                .0
                .written
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// The writer thread: takes everything queued as one batch (the count line appended when lines
/// were dropped) and writes it with one `write_all`, so lines keep their order and never mix.
fn write_lines(shared: &Shared, mut out: Box<dyn Write + Send>) {
    let mut batch = Vec::new();
    loop {
        {
            let mut state = lock(&shared.state);
            state.writing = 0;
            shared.written.notify_all();
            while state.lines.is_empty() && state.dropped == 0 {
                state.idle = true;
                state = shared
                    .work
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.idle = false;
            std::mem::swap(&mut state.lines, &mut batch);
            if state.dropped > 0 {
                batch.extend_from_slice(dropped_line(SystemTime::now(), state.dropped).as_bytes());
                state.dropped = 0;
            }
            state.writing = batch.len();
        }
        // A failed write (stderr closed) has nowhere to be reported.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        // A burst's buffer is not kept for good.
        if batch.capacity() > 64 * 1024 {
            batch = Vec::new();
        }
    }
}

/// The line that stands for `n` lines dropped, shaped as an event's.
fn dropped_line(now: SystemTime, n: u64) -> String {
    let mut line = String::with_capacity(128);
    timestamp(&mut line, now);
    let _ = writeln!(
        line,
        "  WARN sluice::logging: {n} log lines dropped: stderr was not read fast enough"
    );
    line
}

/// The queue's lock; a panic while it was held (none can: it guards appends) leaves the bytes
/// as they were, so a poisoned lock is used as it is.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The line for `event` at `now`, newline included.
pub fn format_line(now: SystemTime, event: &Event<'_>, ansi: bool) -> String {
    let mut line = String::with_capacity(128);
    timestamp(&mut line, now);
    let meta = event.metadata();
    let (name, colour) = match *meta.level() {
        Level::TRACE => ("TRACE", "35"),
        Level::DEBUG => ("DEBUG", "34"),
        Level::INFO => (" INFO", "32"),
        Level::WARN => (" WARN", "33"),
        Level::ERROR => ("ERROR", "31"),
    };
    if ansi {
        let _ = write!(line, " \x1b[{colour}m{name}\x1b[0m ");
    } else {
        let _ = write!(line, " {name} ");
    }
    line.push_str(meta.target());
    line.push(':');
    let mut fields = Fields {
        message: String::new(),
        rest: String::new(),
    };
    event.record(&mut fields);
    if !fields.message.is_empty() {
        line.push(' ');
        line.push_str(&fields.message);
    }
    line.push_str(&fields.rest);
    line.push('\n');
    line
}

/// RFC 3339 in UTC with microseconds, as `tracing-subscriber` wrote it.
fn timestamp(out: &mut String, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (y, m, d) = sluice_media::civil::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let _ = write!(
        out,
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        since.subsec_micros()
    );
}

struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // A `%` field (and the message) is written as its `Display` gives it: a CR or LF from a
        // client (a header, a path) would otherwise end the line and start a forged one.
        if field.name() == "message" {
            let _ = write!(Escaped(&mut self.message), "{value:?}");
        } else {
            let _ = write!(Escaped(&mut self.rest), " {}={value:?}", field.name());
        }
    }
}

/// Writes through to a line, control characters (C0 but tab, DEL, and C1 such as the 8-bit CSI
/// U+009B and NEL U+0085, which some terminals act on) escaped as `\r`, `\n`, `\x1b` or
/// `\u{9b}`, so one event is always one line and sends no terminal escape. The line and
/// paragraph separators and the bidi controls are escaped as C1 is (see [`is_unsafe`]).
struct Escaped<'a>(&'a mut String);

/// Whether `c` must not reach a log line as itself. Beyond the controls, U+2028 and U+2029 end a
/// line in some viewers (so a client's value could look like a second line), and the bidi marks,
/// embeddings, overrides and isolates reorder the text after them (Trojan Source), so a viewer
/// would show a line other than the bytes written.
fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

impl fmt::Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(i) = rest.find(is_unsafe) {
            self.0.push_str(&rest[..i]);
            let c = rest[i..].chars().next().unwrap_or('\0');
            match c {
                '\r' => self.0.push_str("\\r"),
                '\n' => self.0.push_str("\\n"),
                c if c.is_ascii() => {
                    let _ = write!(self.0, "\\x{:02x}", c as u32);
                }
                c => {
                    let _ = write!(self.0, "\\u{{{:x}}}", c as u32);
                }
            }
            rest = &rest[i + c.len_utf8()..];
        }
        self.0.push_str(rest);
        Ok(())
    }
}

/// Milliseconds since the first call: a monotonic clock for [`WarnLimit`].
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A lock-free limit of one event per `every_ms`: for warnings a client can cause at will (a
/// failing RTSP session, a reverse route with no server up), so they cannot fill the log.
pub struct WarnLimit {
    every_ms: u64,
    /// When the next event may be logged (`now_ms` time).
    next_ms: AtomicU64,
    /// Events refused since the last one allowed.
    suppressed: AtomicU64,
}

impl WarnLimit {
    pub const fn new(every_ms: u64) -> Self {
        Self {
            every_ms,
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether an event now may be logged: if so, how many were refused since the last.
    pub fn allow_now(&self) -> Option<u64> {
        self.allow(now_ms())
    }

    /// Whether an event at `now` may be logged: if so, how many were refused since the last.
    fn allow(&self, now: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Acquire);
        let won = now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now.saturating_add(self.every_ms),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok();
        if won {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_warnings_are_one_a_second_with_the_count_left_out() {
        let limit = WarnLimit::new(1000);
        assert_eq!(limit.allow(5), Some(0));
        assert_eq!(limit.allow(6), None);
        assert_eq!(limit.allow(1004), None);
        assert_eq!(limit.allow(1005), Some(2));
        assert_eq!(limit.allow(1500), None);
        assert_eq!(limit.allow(9000), Some(1));
        assert_eq!(limit.allow(9001), None);
    }
    use std::sync::{Arc, Mutex};

    #[test]
    fn bare_level_sets_the_default() {
        let f = parse_filter("debug").unwrap();
        assert!(f.would_enable("anything", &Level::DEBUG));
        assert!(!f.would_enable("anything", &Level::TRACE));
        assert_eq!(f.max_level(), LevelFilter::DEBUG);
    }

    #[test]
    fn target_directives_override_the_default() {
        let f = parse_filter(" warn , sluice::upstream=trace ").unwrap();
        assert!(f.would_enable("sluice::upstream::connector", &Level::TRACE));
        assert!(!f.would_enable("sluice::server", &Level::INFO));
        assert!(f.would_enable("hyper", &Level::WARN));
        assert_eq!(f.max_level(), LevelFilter::TRACE);
    }

    #[test]
    fn the_longest_prefix_decides_and_the_last_directive_wins() {
        let f = parse_filter("sluice=debug,sluice::iptv=error,sluice=info").unwrap();
        assert!(f.would_enable("sluice::server", &Level::INFO));
        assert!(!f.would_enable("sluice::server", &Level::DEBUG));
        assert!(!f.would_enable("sluice::iptv::hub", &Level::WARN));
        assert!(f.would_enable("sluice::iptv::hub", &Level::ERROR));
        // Without a bare level, other targets are off.
        assert!(!f.would_enable("hyper", &Level::ERROR));
        let off = parse_filter("info,hyper=off").unwrap();
        assert!(!off.would_enable("hyper::proto", &Level::ERROR));
    }

    #[test]
    fn empty_or_unset_means_info() {
        for value in [None, Some(""), Some(" , ")] {
            let (f, warning) = filter_from(value);
            assert!(warning.is_none());
            assert!(f.would_enable("sluice", &Level::INFO));
            assert!(!f.would_enable("sluice", &Level::DEBUG));
        }
    }

    #[test]
    fn invalid_value_warns_and_falls_back() {
        let (f, warning) = filter_from(Some("sluice=loud"));
        let warning = warning.unwrap();
        assert!(warning.contains("sluice=loud"), "{warning}");
        assert!(warning.contains("using \"info\""), "{warning}");
        assert!(f.would_enable("sluice", &Level::INFO));
        for bad in ["=info", "sluice[span]=debug", "a b=info"] {
            assert!(parse_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_bare_level_warns_and_keeps_info() {
        for value in ["warning", "verbose", "info,loud"] {
            let (f, warning) = filter_from(Some(value));
            let warning = warning.unwrap();
            assert!(warning.contains("is not a level"), "{warning}");
            assert!(f.would_enable("sluice::server", &Level::INFO), "{value}");
            assert!(f.would_enable("hyper", &Level::WARN), "{value}");
        }
        assert!(filter_from(Some("WARN")).1.is_none());
    }

    #[test]
    fn timestamps_are_utc_with_microseconds() {
        let mut s = String::new();
        // 2026-11-23T07:20:05.000042Z
        let t = UNIX_EPOCH + std::time::Duration::new(1_795_418_405, 42_000);
        timestamp(&mut s, t);
        assert_eq!(s, "2026-11-23T07:20:05.000042Z");
        s.clear();
        timestamp(&mut s, UNIX_EPOCH);
        assert_eq!(s, "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn control_characters_in_fields_cannot_forge_a_line() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let logger = Logger::new(parse_filter("info").unwrap(), false);
        tracing::subscriber::with_default(Capture(logger, lines.clone()), || {
            let path = "/x\r\n2026-01-01T00:00:00.000000Z ERROR sluice::auth: forged";
            let host = "a\x1b[31m\tb\u{7f}\u{9b}2J\u{85}é";
            tracing::warn!(target: "sluice::server", %path, %host, "refused {}", "c\nd");
        });
        let lines = lines.lock().unwrap();
        assert_eq!(
            *lines,
            [
                "1970-01-01T00:00:00.000000Z  WARN sluice::server: refused c\\nd \
                 path=/x\\r\\n2026-01-01T00:00:00.000000Z ERROR sluice::auth: forged \
                 host=a\\x1b[31m\tb\\x7f\\u{9b}2J\\u{85}é\n",
            ]
        );
    }

    #[test]
    fn separators_and_bidi_controls_are_escaped() {
        let mut out = String::new();
        let value = "a\u{2028}b\u{2029}c\u{202a}\u{202b}\u{202c}\u{202d}\u{202e}\
                     \u{2066}\u{2067}\u{2068}\u{2069}\u{200e}\u{200f}\u{61c}d é 中";
        write!(Escaped(&mut out), "{value}").unwrap();
        assert_eq!(
            out,
            "a\\u{2028}b\\u{2029}c\\u{202a}\\u{202b}\\u{202c}\\u{202d}\\u{202e}\
             \\u{2066}\\u{2067}\\u{2068}\\u{2069}\\u{200e}\\u{200f}\\u{61c}d é 中"
        );
        // Their neighbours, and other format characters, are text.
        out.clear();
        write!(
            Escaped(&mut out),
            "\u{2027}\u{202f}\u{2065}\u{206a}\u{200d}"
        )
        .unwrap();
        assert_eq!(out, "\u{2027}\u{202f}\u{2065}\u{206a}\u{200d}");
    }

    /// A sink whose writes wait until `open` says go (or is dropped), then keep the bytes.
    struct Gate {
        open: std::sync::mpsc::Receiver<()>,
        opened: bool,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.opened {
                let _ = self.open.recv();
                self.opened = true;
            }
            self.out.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_stderr_neither_blocks_logging_nor_holds_more_than_the_bound() {
        use std::sync::mpsc::channel;
        let (open, gate) = channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let queue = LineQueue::start(Box::new(Gate {
            open: gate,
            opened: false,
            out: out.clone(),
        }))
        .unwrap();
        let logger = Logger {
            filter: parse_filter("info").unwrap(),
            ansi: false,
            out: Some(queue.clone()),
        };
        // 3,000 lines of about 1 KiB: three times the bound, logged while the sink is stuck on
        // the first write. On a thread, so a logging call that blocks fails the test instead of
        // hanging it.
        const LINES: usize = 3000;
        let pad = "x".repeat(1000);
        let (done, finished) = channel();
        std::thread::spawn(move || {
            tracing::subscriber::with_default(logger, || {
                for i in 0..LINES {
                    tracing::info!(target: "sluice::test", "line {i} {pad}");
                }
            });
            let _ = done.send(());
        });
        assert!(
            finished.recv_timeout(Duration::from_secs(10)).is_ok(),
            "logging blocked on the stalled sink"
        );
        {
            let state = lock(&queue.0.state);
            assert!(state.lines.len() + state.writing <= QUEUE_BYTES);
            assert!(state.lines.capacity() <= QUEUE_BYTES);
            assert!(state.dropped > 0);
        }
        assert!(
            !queue.flush(Duration::from_millis(50)),
            "nothing is written yet"
        );

        open.send(()).unwrap();
        assert!(queue.flush(Duration::from_secs(10)));
        // A line logged after the writer caught up comes after the count.
        queue.push("after\n");
        assert!(queue.flush(Duration::from_secs(10)));

        let out = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        let (after, rest) = lines.split_last().unwrap();
        let (count, kept) = rest.split_last().unwrap();
        assert_eq!(*after, "after");
        assert!(!kept.is_empty());
        for (i, line) in kept.iter().enumerate() {
            let want = format!(" INFO sluice::test: line {i} {}", "x".repeat(1000));
            assert!(line.ends_with(&want), "line {i}: {line}");
        }
        let kept_bytes: usize = kept.iter().map(|l| l.len() + 1).sum();
        assert!(kept_bytes <= QUEUE_BYTES, "{kept_bytes}");
        let dropped = LINES - kept.len();
        assert!(
            count.ends_with(&format!(
                "  WARN sluice::logging: {dropped} log lines dropped: stderr was not read fast \
                 enough"
            )),
            "{count}"
        );
    }

    /// `Logger`'s filtering and formatting, with the lines kept instead of written.
    struct Capture(Logger, Arc<Mutex<Vec<String>>>);

    impl Subscriber for Capture {
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            self.0.enabled(meta)
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let line = format_line(UNIX_EPOCH, event, false);
            self.1.lock().unwrap().push(line);
        }
    }

    #[test]
    fn lines_carry_level_target_message_and_fields() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let filter = parse_filter("info,quiet=off").unwrap();
        let logger = Logger::new(filter, false);
        tracing::subscriber::with_default(Capture(logger, lines.clone()), || {
            let addr = "127.0.0.1:80";
            tracing::warn!(target: "sluice::server", %addr, n = 3, name = "x", "cannot {}", "bind");
            tracing::info!(target: "sluice::iptv", "plain");
            tracing::debug!(target: "sluice::iptv", "too verbose");
            tracing::error!(target: "quiet::x", "silenced");
        });
        let lines = lines.lock().unwrap();
        assert_eq!(
            *lines,
            [
                "1970-01-01T00:00:00.000000Z  WARN sluice::server: cannot bind addr=127.0.0.1:80 n=3 name=\"x\"\n",
                "1970-01-01T00:00:00.000000Z  INFO sluice::iptv: plain\n",
            ]
        );
    }

    #[test]
    fn a_panics_flush_writes_what_was_queued_and_never_waits_for_its_own_lock() {
        use std::sync::mpsc::channel;
        let (open, gate) = channel();
        let out = Arc::new(Mutex::new(Vec::new()));
        let queue = LineQueue::start(Box::new(Gate {
            open: gate,
            opened: false,
            out: out.clone(),
        }))
        .unwrap();
        queue.push("before the crash\n");
        // The sink opens a moment later: the drain waits for it, by looking.
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            open.send(()).unwrap();
        });
        queue.drain_by_looking(Duration::from_secs(5));
        assert_eq!(out.lock().unwrap().as_slice(), b"before the crash\n");
        opener.join().unwrap();
        // A thread that panicked holding the queue's lock gives up after its time instead of
        // waiting for itself (`flush` would block on the lock for good).
        queue.push("held\n");
        let held = queue.0.state.lock().unwrap();
        let started = Instant::now();
        queue.drain_by_looking(Duration::from_millis(50));
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(held);
    }
}
