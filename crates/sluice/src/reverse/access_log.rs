//! The optional access log: one line per finished request, formatted on the request path but written
//! by a background task, so a slow disk never delays a response (lines are dropped and counted when
//! the writer falls behind).

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::atomic::Counter;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::config::AccessLogFormat;

/// Lines waiting for the writer before new ones are dropped.
const QUEUE: usize = 8192;

/// Bytes of lines queued or being written before new ones are dropped. The line count alone let
/// a client whose requests carry headers near `server.max_header_bytes` queue up to `QUEUE`
/// lines of a hundred KiB each (escaping doubles a `"`), half a GiB or more, while a slow disk
/// or a stalled stderr pipe held the writer back.
const QUEUE_BYTES: usize = 8 << 20;

/// Bytes kept of each of the target, `Referer` and `User-Agent`; the rest is cut and marked.
/// Enough for any real URL or agent, and a line stays a few KiB whatever a client sends.
const FIELD_BYTES: usize = 2048;

/// Bytes kept of the method (an extension method is any token a client likes).
const METHOD_BYTES: usize = 32;

/// One finished request.
#[derive(Debug, Clone)]
pub struct Entry {
    pub client: IpAddr,
    pub method: String,
    pub target: String,
    pub version: &'static str,
    pub status: u16,
    pub bytes: u64,
    pub duration: Duration,
    pub route: String,
    pub server: Option<String>,
    pub referer: Option<String>,
    pub user_agent: Option<String>,
}

/// The sending side of the log.
#[derive(Clone)]
pub struct AccessLog {
    tx: mpsc::Sender<String>,
    format: AccessLogFormat,
    dropped: Counter,
    /// Bytes of the lines sent and not yet written (`QUEUE_BYTES`), the writer's batch included.
    queued: Arc<AtomicUsize>,
}

impl AccessLog {
    /// Opens `dest` (`stderr` or a file path, appended) and starts the writer task.
    /// Needs a running tokio runtime (the writer is a task on it).
    pub fn open(
        dest: &str,
        format: AccessLogFormat,
        dropped: Counter,
    ) -> anyhow::Result<AccessLog> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("the access log needs the server's runtime"))?;
        let out: Box<dyn tokio::io::AsyncWrite + Send + Unpin> = if dest == "stderr" {
            Box::new(tokio::io::stderr())
        } else {
            use std::os::unix::fs::OpenOptionsExt;
            // It holds client addresses and full query strings (which can carry tokens): the
            // server's user and group only, never everyone.
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o640)
                .open(dest)
                .map_err(|e| anyhow::anyhow!("cannot open access log {dest}: {e}"))?;
            Box::new(tokio::fs::File::from_std(file))
        };
        Ok(AccessLog::start(&runtime, out, format, dropped))
    }

    /// Starts the writer task on `runtime`, writing to `out`.
    fn start(
        runtime: &tokio::runtime::Handle,
        mut out: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
        format: AccessLogFormat,
        dropped: Counter,
    ) -> AccessLog {
        let (tx, mut rx) = mpsc::channel::<String>(QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let written = queued.clone();
        runtime.spawn(async move {
            let mut buf = Vec::with_capacity(64 * 1024);
            while let Some(line) = rx.recv().await {
                buf.extend_from_slice(line.as_bytes());
                // Batch whatever is already queued into one write.
                while buf.len() < 60 * 1024 {
                    match rx.try_recv() {
                        Ok(more) => buf.extend_from_slice(more.as_bytes()),
                        Err(_) => break,
                    }
                }
                if out.write_all(&buf).await.is_err() || out.flush().await.is_err() {
                    tracing::warn!("access log write failed; lines are being lost");
                }
                // Counted until written, not until taken off the queue: a stalled write holds
                // its batch in memory just the same.
                written.fetch_sub(buf.len(), Ordering::AcqRel);
                buf.clear();
            }
        });
        AccessLog {
            tx,
            format,
            dropped,
            queued,
        }
    }

    /// Queues one line; never waits.
    pub fn record(&self, e: &Entry) {
        let line = self.line(e);
        let len = line.len();
        if self.queued.fetch_add(len, Ordering::AcqRel) + len > QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.dropped.inc();
            return;
        }
        if self.tx.try_send(line).is_err() {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.dropped.inc();
        }
    }

    /// `e` as a line of this log's format, holding no more memory than its bytes: a formatted
    /// `String` grows by doubling, so one waiting in the queue could hold up to twice what
    /// `QUEUE_BYTES` charged for it.
    fn line(&self, e: &Entry) -> String {
        let mut line = match self.format {
            AccessLogFormat::Json => json_line(e),
            AccessLogFormat::Combined => combined_line(e, SystemTime::now()),
        };
        line.shrink_to_fit();
        line
    }
}

/// `s`, or its first `max` bytes (at a character boundary) marked as cut, with the length it had.
fn cut(s: &str, max: usize) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}...[cut from {} bytes]", &s[..end], s.len()))
}

fn json_line(e: &Entry) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut line = serde_json::json!({
        "ts": now,
        "client": e.client.to_string(),
        "method": cut(&e.method, METHOD_BYTES),
        "target": cut(&e.target, FIELD_BYTES),
        "proto": e.version,
        "status": e.status,
        "bytes": e.bytes,
        "duration_ms": (e.duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0,
        "route": e.route,
        "server": e.server,
        "referer": e.referer.as_deref().map(|r| cut(r, FIELD_BYTES)),
        "user_agent": e.user_agent.as_deref().map(|a| cut(a, FIELD_BYTES)),
    })
    .to_string();
    line.push('\n');
    line
}

/// `client - - [date] "METHOD target PROTO" status bytes "referer" "agent"` (Apache/nginx combined).
pub fn combined_line(e: &Entry, at: SystemTime) -> String {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\"\n",
        e.client,
        clf_date(secs),
        escape(&cut(&e.method, METHOD_BYTES)),
        escape(&cut(&e.target, FIELD_BYTES)),
        e.version,
        e.status,
        e.bytes,
        escape(&cut(e.referer.as_deref().unwrap_or("-"), FIELD_BYTES)),
        escape(&cut(e.user_agent.as_deref().unwrap_or("-"), FIELD_BYTES)),
    )
}

/// Quotes and control bytes cannot break a combined line.
fn escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' => vec!['\\', '"'],
            '\\' => vec!['\\', '\\'],
            c if c.is_control() => vec!['?'],
            c => vec![c],
        })
        .collect()
}

/// `10/Oct/2000:13:55:36 +0000` for a UNIX time (UTC).
fn clf_date(secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{:02}/{}/{}:{:02}:{:02}:{:02} +0000",
        day,
        MONTHS[(month - 1) as usize],
        year,
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_format() {
        let e = Entry {
            client: "10.0.0.1".parse().unwrap(),
            method: "GET".into(),
            target: "/a?b=\"c\"".into(),
            version: "HTTP/1.1",
            status: 200,
            bytes: 1234,
            duration: Duration::from_millis(5),
            route: "*/".into(),
            server: Some("127.0.0.1:9000".into()),
            referer: None,
            user_agent: Some("curl/8".into()),
        };
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(971_186_136);
        assert_eq!(
            combined_line(&e, at),
            "10.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /a?b=\\\"c\\\" HTTP/1.1\" 200 1234 \"-\" \"curl/8\"\n"
        );
        let j: serde_json::Value = serde_json::from_str(&json_line(&e)).unwrap();
        assert_eq!(j["status"], 200);
        assert_eq!(j["server"], "127.0.0.1:9000");
    }

    /// A request whose target, `Referer` and `User-Agent` each fill most of a 64 KiB header
    /// block, all `"` (each escaped to two bytes in a combined line).
    fn huge() -> Entry {
        let quotes = "\"".repeat(60 * 1024);
        Entry {
            client: "10.0.0.1".parse().unwrap(),
            method: "GET".into(),
            target: format!("/{quotes}"),
            version: "HTTP/1.1",
            status: 200,
            bytes: 1,
            duration: Duration::from_millis(1),
            route: "*/".into(),
            server: None,
            referer: Some(quotes.clone()),
            user_agent: Some(quotes),
        }
    }

    /// Each client-chosen field is cut to `FIELD_BYTES`, marked with the length it had, so a
    /// line stays a few KiB. Before, this entry's combined line was 360 KiB.
    #[test]
    fn long_fields_are_cut_and_marked() {
        let e = huge();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(971_186_136);
        let line = combined_line(&e, at);
        assert!(
            line.len() < 16 * 1024,
            "combined line of {} bytes",
            line.len()
        );
        assert_eq!(
            line.matches("...[cut from 61440 bytes]").count(),
            2,
            "{line}"
        );
        assert_eq!(
            line.matches("...[cut from 61441 bytes]").count(),
            1,
            "{line}"
        );
        let json = json_line(&e);
        assert!(json.len() < 16 * 1024, "JSON line of {} bytes", json.len());
        let j: serde_json::Value = serde_json::from_str(&json).unwrap();
        let target = j["target"].as_str().unwrap();
        assert!(target.starts_with("/\"\""), "{target}");
        assert!(target.ends_with("...[cut from 61441 bytes]"), "{target}");
        assert_eq!(
            target.len(),
            FIELD_BYTES + "...[cut from 61441 bytes]".len()
        );
        // A short field is left as it was, and a cut never splits a character.
        assert_eq!(cut("/a?b", 8), "/a?b");
        assert_eq!(cut("\u{e9}\u{e9}", 3), "\u{e9}...[cut from 4 bytes]");
    }

    /// A FIFO nobody reads: the writer's first write fills the pipe and then waits for good, as
    /// on a stalled stderr pipe. Returns the log and the reading end (dropped to end the wait).
    fn stalled_log(dir: &std::path::Path, dropped: &Counter) -> (AccessLog, std::fs::File) {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        let fifo = dir.join("stalled");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // Opened first, without blocking, so that the log's (blocking) open for writing returns.
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let log = AccessLog::open(
            fifo.to_str().unwrap(),
            AccessLogFormat::Combined,
            dropped.clone(),
        )
        .unwrap();
        (log, reader)
    }

    /// While the writer is stuck, the lines waiting for it hold at most `QUEUE_BYTES` (plus the
    /// one batch written into the pipe); the rest are dropped and counted. Before, all 3200 of
    /// these lines (360 KiB each) waited: over a GiB.
    #[tokio::test]
    async fn a_stalled_writer_holds_a_bounded_number_of_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let dropped = Counter::default();
        let (log, reader) = stalled_log(dir.path(), &dropped);
        let e = huge();
        // Every line has the same length (the date is fixed-width).
        let len = combined_line(&e, SystemTime::now()).len();
        let sent = 3200;
        for i in 0..sent {
            log.record(&e);
            if i % 200 == 0 {
                // The writer takes its batch and blocks on the full pipe.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let accepted = (sent - dropped.get()) as usize;
        assert!(dropped.get() > 0, "nothing dropped");
        // At most the cap is waiting, and at most a pipe's and a batch's worth went out.
        assert!(
            accepted * len <= QUEUE_BYTES + 256 * 1024,
            "{accepted} lines of {len} bytes taken"
        );
        // The cap, not something smaller, is what stopped them.
        assert!(
            accepted * len > QUEUE_BYTES - 256 * 1024,
            "{accepted} lines taken"
        );
        // The reader gone, the stuck write fails and the writer goes on.
        drop(reader);
    }

    /// A queued line holds no spare capacity, so the bytes charged to `QUEUE_BYTES` are the
    /// bytes it holds. Before, the formatted `String` kept what its doubling growth left (up to
    /// twice its length) while the cap counted its length.
    #[tokio::test]
    async fn a_queued_line_holds_only_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let e = huge();
        for format in [AccessLogFormat::Combined, AccessLogFormat::Json] {
            let path = dir.path().join(format!("{format:?}.log"));
            let log = AccessLog::open(path.to_str().unwrap(), format, Counter::default()).unwrap();
            let line = log.line(&e);
            assert!(line.len() > 4 * FIELD_BYTES, "{} bytes", line.len());
            assert_eq!(line.capacity(), line.len(), "{format:?}");
        }
    }

    /// Written lines give their bytes back: far more than `QUEUE_BYTES` goes through a writer
    /// that keeps up, none dropped.
    #[tokio::test]
    async fn written_lines_free_their_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let dropped = Counter::default();
        let log = AccessLog::open(
            path.to_str().unwrap(),
            AccessLogFormat::Combined,
            dropped.clone(),
        )
        .unwrap();
        let e = huge();
        let len = combined_line(&e, SystemTime::now()).len() as u64;
        let rounds = 3 * QUEUE_BYTES as u64 / len / 100 + 1;
        for round in 1..=rounds {
            for _ in 0..100 {
                log.record(&e);
            }
            let want = round * 100 * len;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while std::fs::metadata(&path).unwrap().len() < want {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "round {round} not written"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        assert_eq!(dropped.get(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), rounds * 100 * len);
        assert_eq!(log.queued.load(Ordering::Acquire), 0);
    }

    /// Sets the process's umask while it lives, then puts the old one back (also on a panic).
    struct Umask(libc::mode_t);

    impl Umask {
        fn set(mask: libc::mode_t) -> Umask {
            // SAFETY: umask has no preconditions; it only swaps the process's file mode mask.
            Umask(unsafe { libc::umask(mask) })
        }
    }

    impl Drop for Umask {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe { libc::umask(self.0) };
        }
    }

    /// A new log file is not readable by other users, whatever the umask lets through: under the
    /// usual 022 (which lets "others" read) it is still 0640. The umask is the whole process's,
    /// so it is set only around the one `open`: a file another test thread creates in that
    /// window gets 022 too, which is the common default anyway.
    #[tokio::test]
    async fn a_new_log_file_is_closed_to_other_users() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let dest = path.to_str().unwrap();
        let opened = {
            let _umask = Umask::set(0o022);
            AccessLog::open(dest, AccessLogFormat::Combined, Counter::default())
        };
        opened.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077 & !0o040, 0, "mode {mode:o}");
    }
}
